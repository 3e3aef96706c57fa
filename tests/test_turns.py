"""Host turns and the store: the first URLs of turns that start together come out of the frontier in one
transaction, and a drain puts every URL parked for a later turn back in its queue, so a clean stop counts no
crash against a URL that was never being fetched.

The real `Crawler`, scheduler and on-disk LMDB `NodeStore`; the web is simulated (`SimWeb` of
tests/test_host_window.py: a `PageFetcher` over chains of pages) and the clock is trio's MockClock.
"""

from __future__ import annotations

import trio

from peer.config import load
from peer.crawl.crawler import Crawler
from peer.crawl.robots import RobotsTxt
from storage import NodeStore, NullPageStore
from tests.test_host_window import _EPOCH, SimWeb, _response


def _crawler(tmp_path, store: NodeStore, web: SimWeb, **flags) -> Crawler:
    cfg = load(env={}, flags={"node_id": "t", "data_dir": str(tmp_path), "allow_private": True, "sitemaps": False,
                              "max_active_hosts": 1000, **flags})
    crawler = Crawler(cfg, fetcher=web, store=store, pages=NullPageStore(),
                      wallclock=lambda: _EPOCH + trio.current_time())
    web.crawler = crawler
    return crawler


async def test_turns_that_start_together_take_their_first_urls_in_one_transaction(tmp_path, autojump_clock):
    hosts, depth = 40, 4
    web = SimWeb(hosts, depth, set(), [])
    with NodeStore.open(tmp_path / "store") as store:
        frontier = store.frontier
        calls: list[int] = []  # hosts per call: pop_many's list, 1 for a turn's own pop
        pop, pop_many = frontier.pop, frontier.pop_many
        frontier.pop = lambda host: (calls.append(1), pop(host))[1]  # type: ignore[method-assign]
        frontier.pop_many = lambda hs: (calls.append(len(hs)), pop_many(hs))[1]  # type: ignore[method-assign]
        crawler = _crawler(tmp_path, store, web, delay=1.0, concurrency=64, exit_when_done=True)
        crawler.seed([f"http://h{h}.test/p0" for h in range(hosts)])
        with trio.fail_after(10_000):
            await crawler.run()
        assert len(frontier) == 0 and frontier.in_flight() == 0
    fetched = [f"http://{host}{path}" for _t, host, path in web.requests if path != "/robots.txt"]
    assert sorted(fetched) == sorted(web.pages()), "every page once"
    assert max(calls) > 1, "turns that became ready together had their first URLs taken in one call"
    assert len(calls) < len(fetched) / 2, (len(calls), len(fetched))
    assert sum(calls) >= len(fetched)


async def test_a_drain_puts_parked_urls_back_so_a_restart_counts_no_crash(tmp_path, autojump_clock):
    """Each host's first URL waits, parked in flight, for the host's next turn after its robots.txt; a drain
    then puts it back in its queue instead of leaving it in flight (a stop with a URL in flight counts against
    that URL, and ``max_crashes`` such stops in a row drop it unfetched)."""
    hosts = 6
    web = SimWeb(hosts, 3, set(), [])
    with NodeStore.open(tmp_path / "store") as store:
        crawler = _crawler(tmp_path, store, web, delay=30.0, concurrency=16)
        crawler.seed([f"http://h{h}.test/p0" for h in range(hosts)])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(crawler.run)
            await trio.sleep(5.0)  # every robots.txt fetched; each first page waits 30 s for its host's turn
            assert [path for _t, _h, path in web.requests] == ["/robots.txt"] * hosts
            assert store.frontier.in_flight() == hosts, "the first URLs are parked in flight"
            assert await crawler.drain(10.0)
            nursery.cancel_scope.cancel()
        assert store.frontier.in_flight() == 0 and len(store.frontier) == hosts
        assert store.frontier.recover_in_flight(max_crashes=1) == (0, [])
    again_web = SimWeb(hosts, 3, set(), [])
    with NodeStore.open(tmp_path / "store") as store:
        again = _crawler(tmp_path, store, again_web, delay=1.0, concurrency=16, exit_when_done=True)
        again.restore()
        with trio.fail_after(10_000):
            await again.run()
    fetched = sorted(f"http://{host}{path}" for _t, host, path in again_web.requests if path != "/robots.txt")
    assert fetched == sorted(again_web.pages()), "after the restart every page is fetched, once"


class _Steps(trio.abc.Instrument):
    """Counts task steps: two calls in the same step had no checkpoint between them."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


class _DisallowingWeb(SimWeb):
    """h0's robots.txt disallows /x, under thousands of wildcard rules (a robots.txt may make each check slow)."""

    async def fetch(self, url, *, headers=(), sink=None, address=None):
        if url == "http://h0.test/robots.txt":
            self.requests.append((trio.current_time(), "h0.test", "/robots.txt"))
            rules = "".join(f"Disallow: /*q{i}\n" for i in range(2000))
            return _response(url, 200, "text/plain", f"User-agent: *\n{rules}Disallow: /x\n".encode())
        return await super().fetch(url, headers=headers, sink=sink, address=address)


async def test_a_host_turn_lets_other_tasks_run_between_disallowed_urls(tmp_path, autojump_clock, monkeypatch):
    """A host turn skips up to 256 URLs that robots.txt forbids before it yields; a robots.txt of many wildcard
    rules makes each check cost up to 0.1 s on a long path, and the turn held the event loop for half a minute
    (membership probes, peer links, the control endpoint all waiting). Each skip is now a checkpoint."""
    steps = _Steps()
    checks: list[int] = []
    can_fetch = RobotsTxt.can_fetch

    def counted(self, agent: str, path: str) -> bool:
        if path.startswith("/x"):
            checks.append(steps.steps)
        return can_fetch(self, agent, path)

    monkeypatch.setattr(RobotsTxt, "can_fetch", counted)
    web = _DisallowingWeb(2, 2, set(), [])
    trio.lowlevel.add_instrument(steps)
    try:
        with NodeStore.open(tmp_path / "store") as store:
            crawler = _crawler(tmp_path, store, web, delay=1.0, concurrency=4, exit_when_done=True)
            crawler.seed([f"http://h0.test/x{i}" for i in range(300)] + ["http://h0.test/p0"])
            with trio.fail_after(10_000):
                await crawler.run()
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert len(checks) == 300 and crawler.stats.skipped["robots"] == 300
    assert len(set(checks)) == len(checks), "two disallowed URLs were checked in one step of the event loop"
    fetched = {f"http://{host}{path}" for _t, host, path in web.requests if path != "/robots.txt"}
    assert fetched == web.pages()
