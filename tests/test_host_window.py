"""The crawler with a bounded window of hosts in memory (`max_active_hosts`), the rest on disk in the frontier's
host table: the window holds, every host is crawled (none starves behind deep queues), nothing is fetched twice
or lost, and a host's politeness survives leaving the window and coming back.

The real `Crawler`, scheduler and on-disk LMDB `NodeStore`; the web is simulated (a `PageFetcher` over a dict of
pages) and the clock is trio's MockClock, so Crawl-delays of tens of seconds cost nothing.
"""

from __future__ import annotations

import trio

from peer.config import load
from peer.crawl.crawler import Crawler
from peer.fetch.http import Response
from storage import NodeStore, NullPageStore

_EPOCH = 1_700_000_000.0
_SLOW_DELAY = 30  # the Crawl-delay of the slow hosts


class SimWeb:
    """Hosts h0..h{n-1}: each a chain of `depth` pages (page i links to page i+1, and page 0 of the next host),
    so every host's queue stays non-empty for its whole crawl. Hosts in `slow` ask for Crawl-delay 30."""

    def __init__(self, hosts: int, depth: int, slow: set[int], window: list[int]) -> None:
        self.hosts, self.depth, self.slow = hosts, depth, slow
        self.requests: list[tuple[float, str, str]] = []  # (trio time, host, path)
        self.window = window  # a sample of the crawler's resident host count at each request
        self.crawler: Crawler | None = None

    def pages(self) -> set[str]:
        return {f"http://h{h}.test/p{i}" for h in range(self.hosts) for i in range(self.depth)}

    async def address(self, host: str) -> str:
        return "127.0.0." + str(1 + int(host[1:].split(".")[0]))

    async def fetch(self, url, *, headers=(), sink=None, address=None) -> Response:
        host = url.split("/")[2]
        path = "/" + url.split("/", 3)[3]
        self.requests.append((trio.current_time(), host, path))
        assert self.crawler is not None
        self.window.append(len(self.crawler.sched.turns))
        await trio.sleep(0.05)
        h = int(host[1:].split(".")[0])
        if path == "/robots.txt":
            if h in self.slow:
                return _response(url, 200, "text/plain", f"User-agent: *\nCrawl-delay: {_SLOW_DELAY}\n".encode())
            return _response(url, 404, "text/plain", b"")
        i = int(path[2:])
        links = [f"/p{i + 1}"] if i + 1 < self.depth else []
        links.append(f"http://h{(h + 1) % self.hosts}.test/p0")
        body = "<html><body>" + "".join(f'<a href="{link}">x</a>' for link in links) + "</body></html>"
        return _response(url, 200, "text/html", body.encode())


def _response(url: str, status: int, ctype: str, body: bytes) -> Response:
    return Response(url=url, status=status, reason="OK" if status == 200 else "Not Found",
                    headers=[("content-type", ctype)], body=body, ip="127.0.0.1", truncated=False, elapsed=0.05,
                    request_headers=[])


async def _crawl(tmp_path, *, hosts: int, depth: int, slow: set[int], max_active: int, quantum: int):
    cfg = load(env={}, flags={"node_id": "t", "data_dir": str(tmp_path), "delay": 1.0, "concurrency": 16,
                              "exit_when_done": True, "allow_private": True, "sitemaps": False,
                              "max_active_hosts": max_active, "host_window_turns": quantum})
    window: list[int] = []
    web = SimWeb(hosts, depth, slow, window)
    with NodeStore.open(tmp_path / "store") as store:
        crawler = Crawler(cfg, fetcher=web, store=store, pages=NullPageStore(),
                          wallclock=lambda: _EPOCH + trio.current_time())
        web.crawler = crawler
        crawler.seed([f"http://h{h}.test/p0" for h in range(hosts)])
        with trio.fail_after(100_000):
            await crawler.run()
        assert len(store.frontier) == 0 and store.frontier.in_flight() == 0
    return web, crawler


def _by_host(web: SimWeb) -> dict[str, list[tuple[float, str]]]:
    out: dict[str, list[tuple[float, str]]] = {}
    for t, host, path in web.requests:
        out.setdefault(host, []).append((t, path))
    return out


def _gaps_ok(times: list[float], gap: float) -> bool:
    return all(b - a >= gap - 1e-6 for a, b in zip(times, times[1:]))


async def test_a_window_of_three_crawls_every_page_once_and_keeps_politeness(tmp_path, autojump_clock):
    web, crawler = await _crawl(tmp_path, hosts=12, depth=8, slow={0, 5}, max_active=3, quantum=2)
    fetched = [f"http://{host}{path}" for _t, host, path in web.requests if path != "/robots.txt"]
    assert sorted(fetched) == sorted(web.pages()), "every page once: nothing lost or fetched twice on disk"
    assert max(web.window) <= 3, "the window holds"
    assert crawler.sched.evicted > 0 and crawler.sched.spills > 0, "hosts did leave the window and come back"
    for host, reqs in _by_host(web).items():
        gap = _SLOW_DELAY if host in ("h0.test", "h5.test") else 1.0
        assert _gaps_ok([t for t, _ in reqs], gap), (host, [round(t, 2) for t, _ in reqs])
        robots = [path for _, path in reqs if path == "/robots.txt"]
        assert len(robots) == 1, "robots.txt once per host: the decision outlives the host's place in the window"


async def test_no_host_starves_behind_deep_queues(tmp_path, autojump_clock):
    """A window of 2 over 8 hosts of 12 pages each: with a quantum every host starts before any host has finished;
    without one (Mercator's back queues kept until empty) the last hosts wait for whole hosts to finish."""
    def first_and_last(web):
        pages = {host: [t for t, path in reqs if path != "/robots.txt"] for host, reqs in _by_host(web).items()}
        return max(ts[0] for ts in pages.values()), min(ts[-1] for ts in pages.values())

    web, _ = await _crawl(tmp_path / "fair", hosts=8, depth=12, slow=set(), max_active=2, quantum=2)
    last_start, first_end = first_and_last(web)
    assert last_start < first_end
    web, _ = await _crawl(tmp_path / "mercator", hosts=8, depth=12, slow=set(), max_active=2, quantum=0)
    last_start, first_end = first_and_last(web)
    assert last_start > first_end


async def test_restore_fills_the_window_and_leaves_the_rest_on_disk(tmp_path, autojump_clock):
    cfg = load(env={}, flags={"node_id": "t", "data_dir": str(tmp_path), "max_active_hosts": 4})
    with NodeStore.open(tmp_path / "store") as store:
        first = Crawler(cfg, fetcher=SimWeb(1, 1, set(), []), store=store, pages=NullPageStore())
        first.seed([f"http://h{h}.test/p0" for h in range(10)])
        assert len(first.sched.turns) == 4 and first.sched.spilled
        again = Crawler(cfg, fetcher=SimWeb(1, 1, set(), []), store=store, pages=NullPageStore())
        again.restore()
        assert len(again.sched) == 4 and again.sched.spilled
        assert again._refill(trio.current_time()) == 0  # the window is full: nothing more comes in
