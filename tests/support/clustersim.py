"""Whole-cluster simulations: real `Cluster`s (membership, dispatch, hand-off, progress rounds) over a
`MemoryNetwork`, each node with a real LMDB `NodeStore`, crawling a synthetic link graph with `SimCrawler`,
all in one `trio.run` under `MockClock`.

- `Web`: a seeded link graph of hosts and pages, with per-host minimum gaps, per-page fetch times and a few
  flaky pages (the first request fails with a retryable error, as a 503 would).
- `Ledger`: every request any node made (node, URL, start, end), shared by the whole simulation, and the checks
  run on it (overlapping requests to one host, broken gaps, duplicates, what was never fetched).
- `SimCrawler`: the crawl engine's cluster contract (`busy_hosts`, `wake_hosts`, `take_over`, `rewake`,
  `release_moved`, `is_done`, `active`) over the real politeness scheduler, doing with ownership what
  `peer/crawl/crawler.py` does: links screened by `owns` (ours into `store.finish` with `routed=take_routed()`, the
  rest to `dispatcher.route`), a host that moved let go, a blocked host looked at again in 0.25 s, a retried URL
  parked until the host's next turn.
- `ClusterSim`: starts, joins, kills (the node's cancel scope; its store stays on disk), restarts (same store,
  same address), and gracefully removes nodes, and records the state of every node at the moment a node
  concludes the crawl is finished.

Time: the `Cluster` builds rings and ring diffs with `trio.to_thread`. Under `MockClock(autojump_threshold=0)` the
clock jumps to the next deadline whenever every task is blocked, and a task waiting for a thread is blocked: a
ring build of 0.12 s real time (8 nodes, 16,800 points) let 74 virtual seconds pass beside a 0.2 s ticker, and
0.07 s let 1.2 virtual seconds pass even with a 1 ms threshold (measured): enough for probes to time out and live
nodes to be declared dead, at random. A threshold long enough to cover a build would cost that much real time
at each of the thousands of idle moments of a run. So the simulations keep the threshold at 0 and run
`trio.to_thread.run_sync` inline (after a checkpoint, so other tasks still interleave there): see
`inline_threads`. With trio's scheduler seeded (`seed_scheduler`) a run is then repeatable: the same requests at
the same virtual times, whatever the hash seed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import random
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio.testing

from peer.cluster.cluster import Cluster, ring_id
from peer.config import Config, load
from peer.crawl.settings import CrawlSettings
from peer.crawl.scheduler import HostScheduler, HostTurn
from peer.stats import Stats
from peer.cluster.transport import MemoryNetwork
from peer.crawl.urls import host_of_normalized
from ring import MemberState
from storage import HostState, NodeStore, QueuedUrl

__all__ = [
    "ClusterSim",
    "Fetch",
    "FinishSnapshot",
    "Ledger",
    "SimCrawler",
    "SimNode",
    "Web",
    "inline_threads",
    "make_web",
    "run_simulation",
    "seed_scheduler",
]

log = logging.getLogger(__name__)

SECRET = b"cluster simulation secret, 32 b!"
#: Wall clocks start here; each node's is skewed by its own offset (the wire carries durations, not times).
WALL0 = 1_700_000_000.0
#: A blocked host (its arc's hand-off has not arrived) is looked at again this often, as in the crawler.
BLOCKED_RECHECK = 0.25
#: A retried URL waits at least this long: the crawler's back-off base (max(delay, 1 s) * 2**failures).
RETRY_BASE = 1.0
#: Requests a flaky page fails before it answers (a 503 the crawler retries).
FLAKY_FAILURES = 1


# -- the web ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Web:
    """A synthetic link graph. `links[url]` are the page's links (normalized URLs); `gap[host]` the minimum
    time between the end of one request to the host and the start of the next; `cost[url]` the time a request
    takes; `flaky` the pages whose first request fails with a retryable error. `island` pages link only to each
    other and nothing else links to them: unreachable from the seeds, for tests that inject URLs."""

    links: dict[str, tuple[str, ...]]
    gap: dict[str, float]
    cost: dict[str, float]
    flaky: frozenset[str]
    seeds: tuple[str, ...]
    island: frozenset[str]

    def reachable(self, starts: Iterable[str]) -> set[str]:
        """Pages reachable from `starts` (included) by following links."""
        seen: set[str] = set()
        todo = [url for url in starts if url in self.links]
        while todo:
            url = todo.pop()
            if url in seen:
                continue
            seen.add(url)
            todo.extend(link for link in self.links[url] if link not in seen)
        return seen

    def hosts(self) -> set[str]:
        return {host_of_normalized(url) for url in self.links}


def make_web(
    seed: int,
    *,
    hosts: int = 300,
    island_hosts: int = 20,
    max_pages: int = 6,
    max_links: int = 5,
    cross_host: float = 0.6,
    flaky: float = 0.04,
    seeds: int = 3,
    time_scale: float = 1.0,
) -> Web:
    """A seeded web of `hosts` hosts (plus `island_hosts` unreachable ones) with 1 to `max_pages` pages each;
    every page links to 1 to `max_links` pages, a share `cross_host` of them on another host. A host's gap is
    1 s (2 s for a fifth of them) and a request takes 0.1-0.6 s, both times `time_scale`."""
    rng = random.Random(seed)

    def site(names: Sequence[str]) -> dict[str, list[str]]:
        return {
            name: [f"http://{name}/"] + [f"http://{name}/p{j}" for j in range(1, rng.randint(1, max_pages))]
            for name in names
        }

    main = site([f"h{i:03d}.sim" for i in range(hosts)])
    isle = site([f"i{i:03d}.sim" for i in range(island_hosts)])
    links: dict[str, tuple[str, ...]] = {}
    for sites in (main, isle):
        names = sorted(sites)
        for name, pages in sites.items():
            for url in pages:
                out: list[str] = []
                for _ in range(rng.randint(1, max_links)):
                    other = rng.choice(names) if rng.random() < cross_host else name
                    out.append(rng.choice(sites[other]))
                links[url] = tuple(dict.fromkeys(out))
    gap = {name: (2.0 if rng.random() < 0.2 else 1.0) * time_scale for sites in (main, isle) for name in sites}
    cost = {url: round(rng.uniform(0.1, 0.6) * time_scale, 3) for url in links}
    flaky_pages = frozenset(url for url in sorted(links) if rng.random() < flaky)
    start = tuple(main[name][0] for name in rng.sample(sorted(main), seeds))
    island = frozenset(url for pages in isle.values() for url in pages)
    return Web(links=links, gap=gap, cost=cost, flaky=flaky_pages, seeds=start, island=island)


# -- the ledger ------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Fetch:
    """One request: `end` is None while it is under way; `cut` if its node was killed during it; `ok` False for
    a request that failed (and will be retried)."""

    node: str
    url: str
    host: str
    start: float
    end: float | None = None
    ok: bool = True
    cut: bool = False


@dataclass(slots=True)
class Ledger:
    """Every request of the simulation, in start order."""

    fetches: list[Fetch] = field(default_factory=list)

    def begin(self, node: str, url: str, host: str) -> Fetch:
        fetch = Fetch(node=node, url=url, host=host, start=trio.current_time())
        self.fetches.append(fetch)
        return fetch

    def cut(self, node: str) -> list[Fetch]:
        """`node` was killed: its requests under way end now, cut."""
        now = trio.current_time()
        cut = [f for f in self.fetches if f.node == node and f.end is None]
        for fetch in cut:
            fetch.end, fetch.cut, fetch.ok = now, True, False
        return cut

    def failed_before(self, url: str) -> int:
        return sum(1 for f in self.fetches if f.url == url and f.end is not None and not f.ok and not f.cut)

    def pages(self) -> Counter[str]:
        """URL -> how many times a request for it completed successfully (the page was fetched)."""
        return Counter(f.url for f in self.fetches if f.ok and f.end is not None)

    def fetched(self) -> set[str]:
        return set(self.pages())

    def duplicates(self) -> dict[str, int]:
        return {url: n for url, n in self.pages().items() if n > 1}

    def last_end(self) -> float:
        return max((f.end for f in self.fetches if f.end is not None), default=0.0)

    def by_host(self, *, include_cut: bool) -> dict[str, list[Fetch]]:
        hosts: dict[str, list[Fetch]] = defaultdict(list)
        for fetch in self.fetches:
            if fetch.end is not None and (include_cut or not fetch.cut):
                hosts[fetch.host].append(fetch)
        for requests in hosts.values():
            requests.sort(key=lambda f: (f.start, f.end))
        return hosts

    def overlaps(self, *, include_cut: bool = False) -> list[tuple[Fetch, Fetch]]:
        """Pairs of requests to one host whose times overlap (any nodes); requests cut by a kill are left out
        unless `include_cut`."""
        found = []
        for requests in self.by_host(include_cut=include_cut).values():
            latest: Fetch | None = None
            for fetch in requests:
                if latest is not None and fetch.start < latest.end:  # type: ignore[operator]
                    found.append((latest, fetch))
                if latest is None or fetch.end > latest.end:  # type: ignore[operator]
                    latest = fetch
        return found

    def gap_breaks(self, gap: dict[str, float], *, slack: float = 1e-6) -> list[tuple[Fetch, Fetch]]:
        """Consecutive requests to one host (any nodes) that started less than the host's gap after the previous
        one ended; requests cut by a kill are left out (the victim's state died with it)."""
        found = []
        for host, requests in self.by_host(include_cut=False).items():
            for before, after in itertools.pairwise(requests):
                if after.start - before.end < gap[host] - slack:  # type: ignore[operator]
                    found.append((before, after))
        return found


# -- the crawler -----------------------------------------------------------------------------------------------


class _Batch:
    __slots__ = ("cands", "seen")

    def __init__(self) -> None:
        self.cands: list[QueuedUrl] = []
        self.seen = 0


class SimCrawler:
    """The crawl engine's contract with `Cluster`, fetching from a `Web` in virtual time.

    One request per host turn, one turn per host at a time (the real `HostScheduler`), `concurrency` workers;
    after a request the host may go again `web.gap[host]` later, and that timer is saved as the host's state (so
    a hand-off carries it). Every request is written in the shared `Ledger`.
    """

    def __init__(
        self,
        node_id: str,
        *,
        store: NodeStore,
        web: Web,
        ledger: Ledger,
        stats: Stats,
        owns: Callable[[str], bool],
        blocked: Callable[[str], bool],
        router: Callable[[QueuedUrl], None],
        take_routed: Callable[[], list],
        wallclock: Callable[[], float],
        fetched: Callable[[QueuedUrl], None] | None = None,
        concurrency: int = 16,
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.frontier = store.frontier
        self.web = web
        self.ledger = ledger
        self.stats = stats
        self.owns = owns
        self.blocked = blocked
        self.router = router
        self.take_routed = take_routed
        self.fetched = fetched  # the cluster's seen-key replicas, as the crawler calls them
        self.wallclock = wallclock
        self.concurrency = concurrency
        self.sched = HostScheduler()
        self.settings = CrawlSettings(version=0, origin=node_id)  # gossiped by the cluster like the crawler's
        self._pending: dict[str, QueuedUrl] = {}  # host -> URL parked for a retry at the host's next turn
        self._wakeup = trio.Event()
        self.active = 0
        self._draining = False
        self.let_go = 0  # host turns dropped because the host moved
        self.blocked_turns = 0  # host turns put off because the host's hand-off had not arrived

    # -- admission (the crawler's _screen / _commit) --

    def _screen(self, batch: _Batch, url: str, depth: int, found_on: str | None) -> None:
        host = host_of_normalized(url)
        item = QueuedUrl(url=url, host=host, depth=depth, hops=0, found_on=found_on)
        if not self.owns(host):
            self.router(item)
            return
        batch.cands.append(item)

    def _commit(self, batch: _Batch, done: QueuedUrl | None = None) -> int:
        cands = batch.cands
        if done is not None:
            routed = self.take_routed()
            items = self.store.finish(done, cands, routed) if routed else self.store.finish(done, cands)
        else:
            items = self.store.admit(cands) if cands else []
        if items:
            now = trio.current_time()
            for item in items:
                self.sched.wake(item.host, now)
            self._wakeup.set()
        self.stats.urls_new += len(items)
        self.stats.urls_seen += len(cands) - len(items)
        return len(items)

    def seed(self, urls: Iterable[str]) -> int:
        batch = _Batch()
        for url in urls:
            self._screen(batch, url, 0, None)
        return self._commit(batch)

    def restore(self) -> int:
        """After a restart, as the crawler's `restore`: in-flight URLs back to their queues, saved timers kept."""
        recovered = self.frontier.recover()
        now, wall = trio.current_time(), self.wallclock()
        for st in self.frontier.states():
            t = self.sched.turn(st.host)
            t.next_allowed = now + max(0.0, st.next_allowed - wall)
            t.crawl_delay, t.backoff, t.failures, t.pages = st.crawl_delay, st.backoff, st.failures, st.pages
        for host, _count in self.frontier.hosts():
            self.sched.wake(host, now)
        self._wakeup.set()
        return recovered

    # -- the cluster's hooks (as in peer/crawl/crawler.py) --

    def wake_hosts(self, items: Iterable[QueuedUrl]) -> None:
        now = trio.current_time()
        woke = False
        for item in items:
            woke = self.sched.wake(item.host, now) or woke
        if woke:
            self._wakeup.set()

    def take_over(self, items: Sequence[QueuedUrl], states: Sequence[HostState]) -> None:
        now, wall = trio.current_time(), self.wallclock()
        for st in states:
            t = self.sched.turn(st.host)
            t.next_allowed = max(t.next_allowed, now + max(0.0, st.next_allowed - wall))
            t.crawl_delay = max(t.crawl_delay, st.crawl_delay)
            t.failures, t.pages = st.failures, max(t.pages, st.pages)
        self.wake_hosts(items)

    def rewake(self) -> int:
        now = trio.current_time()
        self.release_moved()
        n = 0
        for host, _count in self.frontier.hosts():
            if self.owns(host):
                n += self.sched.wake(host, now)
        self._wakeup.set()
        return n

    def release_moved(self) -> int:
        back = []
        for host in list(self._pending):
            t = self.sched.turns.get(host)
            if not self.owns(host) and not (t is not None and t.busy):
                back.append(self._pending.pop(host))
        return self.frontier.requeue(back)

    def busy_hosts(self) -> list[str]:
        return [t.host for t in self.sched.turns.values() if t.busy]

    def is_done(self) -> bool:
        return len(self.frontier) == 0 and self.frontier.in_flight() == 0 and self.active == 0

    def _let_go(self, turn: HostTurn) -> None:
        parked = self._pending.pop(turn.host, None)
        if parked is not None:
            self.frontier.requeue([parked])
        self.sched.release(turn, trio.current_time(), more_work=False)
        self.let_go += 1

    # -- the run loop --

    def adopt(self, settings: CrawlSettings) -> bool:
        """The crawler's rule: a record that outranks ours replaces it (the simulated crawl ignores its rules)."""
        if settings.rank() <= self.settings.rank():
            return False
        self.settings = settings
        return True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        send, recv = trio.open_memory_channel[HostTurn](0)
        async with trio.open_nursery() as nursery:
            for _ in range(self.concurrency):
                nursery.start_soon(self._worker, recv.clone())
            recv.close()
            task_status.started()
            async with send:
                await self._dispatch(send)

    async def drain(self, timeout: float) -> bool:
        """Start no new host turn; wait up to `timeout` for the requests under way."""
        self._draining = True
        self._wakeup.set()
        with trio.move_on_after(timeout):
            while self.active:
                await trio.sleep(0.01)
        return self.active == 0

    async def _dispatch(self, send: trio.MemorySendChannel[HostTurn]) -> None:
        sched = self.sched
        while True:
            if self._draining:
                await trio.sleep_forever()
            now = trio.current_time()
            turn = sched.pop_ready(now)
            if turn is not None:
                if turn.next_allowed > now:  # a hand-off moved its timer after it was queued
                    sched.release(turn, now, more_work=True)
                elif not self.owns(turn.host):
                    self._let_go(turn)
                elif self.blocked(turn.host):
                    self.blocked_turns += 1
                    turn.next_allowed = now + BLOCKED_RECHECK
                    sched.release(turn, now, more_work=True)
                else:
                    await send.send(turn)
                continue
            nxt = sched.next_time()
            self._wakeup = trio.Event()
            with trio.move_on_after(1.0 if nxt is None else max(0.0, nxt - now)):
                await self._wakeup.wait()

    async def _worker(self, recv: trio.MemoryReceiveChannel[HostTurn]) -> None:
        async with recv:
            async for turn in recv:
                self.active += 1
                try:
                    await self._host_turn(turn)
                finally:
                    self.active -= 1
                # Not in `finally`: a killed node writes nothing more, as after kill -9.
                if turn.host in self._pending and not self.owns(turn.host):
                    self.frontier.requeue([self._pending.pop(turn.host)])  # moved: into the hand-off
                more = turn.host in self._pending or self.frontier.queued(turn.host) > 0
                self.sched.release(turn, trio.current_time(), more_work=more)
                self._wakeup.set()

    async def _host_turn(self, turn: HostTurn) -> None:
        host = turn.host
        item = self._pending.pop(host, None) or self.frontier.pop(host)
        if item is None:
            return
        fetch = self.ledger.begin(self.node_id, item.url, host)
        await trio.sleep(self.web.cost.get(item.url, 0.1))
        fetch.end = trio.current_time()
        if item.url in self.web.flaky and self.ledger.failed_before(item.url) < FLAKY_FAILURES:
            fetch.ok = False
            turn.failures += 1
            turn.backoff = RETRY_BASE * 2 ** min(turn.failures, 4)
            self._pending[host] = item  # keeps its in-flight record; fetched again at the host's next turn
            self._after_request(turn)
            return
        self.stats.pages += 1
        turn.pages += 1
        turn.failures = 0
        turn.backoff = 0.0
        batch = _Batch()
        for url in self.web.links.get(item.url, ()):
            self._screen(batch, url, item.depth + 1, item.url)
        self._commit(batch, done=item)
        if self.fetched is not None:
            self.fetched(item)
        self._after_request(turn)

    def _after_request(self, turn: HostTurn) -> None:
        turn.crawl_delay = self.web.gap[turn.host]
        turn.next_allowed = trio.current_time() + max(turn.crawl_delay, turn.backoff)
        wall_next = self.wallclock() + max(0.0, turn.next_allowed - trio.current_time())
        self.frontier.put_state(HostState(
            host=turn.host, next_allowed=wall_next, crawl_delay=turn.crawl_delay, backoff=turn.backoff,
            failures=turn.failures, pages=turn.pages,
        ))


# -- the cluster -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeState:
    """What one node holds at a moment: queued and in-flight URLs, unacknowledged routed URLs and hand-off
    chunks, requests under way."""

    node: str
    queued: int
    in_flight: int
    outbox: int
    chunks: int
    active: int

    @property
    def empty(self) -> bool:
        return not (self.queued or self.in_flight or self.outbox or self.chunks or self.active)


@dataclass(frozen=True, slots=True)
class FinishSnapshot:
    """The moment `node` concluded the crawl is finished, and what every running node held then."""

    node: str
    at: float
    states: tuple[NodeState, ...]


class _WatchedEvent:
    """Stands in for `Cluster.finished`: calls `on_set` at the very moment the cluster sets it."""

    def __init__(self, on_set: Callable[[], None]) -> None:
        self._event = trio.Event()
        self._on_set = on_set

    def set(self) -> None:
        if not self._event.is_set():
            self._on_set()
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


class SimNode:
    """One node: its store (kept across kills), `Cluster` and `SimCrawler`, under its own cancel scope."""

    def __init__(self, sim: ClusterSim, index: int, weight: int) -> None:
        self.sim = sim
        self.index = index
        self.node_id = f"n{index}"
        self.weight = weight
        self.address = f"10.0.0.{index + 1}:7400"
        self.path = sim.tmp_path / self.node_id
        self.skew = sim.rng.uniform(-300.0, 300.0)  # this node's wall clock is off by this much
        self.store: NodeStore | None = None
        self.cluster: Cluster | None = None
        self.crawler: SimCrawler | None = None
        self.stats = Stats()
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()
        self.starts = 0
        self.recovered = 0

    def wallclock(self) -> float:
        return WALL0 + self.skew + trio.current_time()

    def state(self) -> NodeState:
        assert self.store is not None and self.cluster is not None and self.crawler is not None
        return NodeState(
            node=self.node_id, queued=len(self.store.frontier), in_flight=self.store.frontier.in_flight(),
            outbox=self.cluster.dispatcher.outstanding(), chunks=self.cluster.handoff.outstanding(),
            active=self.crawler.active,
        )

    def build(self) -> None:
        sim = self.sim
        self.starts += 1
        self.store = NodeStore.open(self.path, map_size=1 << 24)
        self.stats = Stats()
        cfg = sim.config(self.weight)
        cluster = Cluster(
            cfg, node_id=self.node_id, store=self.store, secret=SECRET, stats=self.stats,
            transport=sim.net.transport(self.address),
            rng=random.Random(sim.seed * 1000 + self.index * 10 + self.starts),
            wall_clock=self.wallclock, points_per_weight=sim.points_per_weight,
        )
        cluster.finished = _WatchedEvent(lambda: sim.on_finished(self))  # type: ignore[assignment]
        crawler = SimCrawler(
            self.node_id, store=self.store, web=sim.web, ledger=sim.ledger, stats=self.stats,
            owns=cluster.owns, blocked=cluster.blocked, router=cluster.dispatcher.route,
            take_routed=cluster.dispatcher.take_routed, wallclock=self.wallclock, fetched=cluster.replicas.fetched if sim.replicate else None, concurrency=sim.concurrency,
        )
        cluster.attach(crawler)  # type: ignore[arg-type]
        self.cluster, self.crawler = cluster, crawler

    async def serve(self, join: str | None, seeds: Sequence[str],
                    before_join: Callable[[], Awaitable[None]] | None = None, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the node as `peer/node.py` does: restore, cluster, join, seed, ready, crawl. `before_join` runs
        while the node already serves peers but has not joined (a slow `--join-srv` look-up, say)."""
        assert self.cluster is not None and self.crawler is not None
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()
        try:
            with self.scope:
                self.recovered = self.crawler.restore()
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.cluster.run)
                    if before_join is not None:
                        await before_join()
                    if join is not None:
                        await self.cluster.join([join])
                    self.crawler.seed(seeds)
                    self.cluster.ready.set()
                    await nursery.start(self.crawler.run)
                    task_status.started()
        finally:
            self.stopped.set()

    @property
    def running(self) -> bool:
        return not self.stopped.is_set()


class ClusterSim:
    """A cluster of `SimNode`s on one `MemoryNetwork`, crawling `web`, every request in `ledger`."""

    def __init__(
        self,
        nursery: trio.Nursery,
        tmp_path: Path,
        web: Web,
        *,
        seed: int,
        delay: float = 0.01,
        jitter: float = 0.02,
        break_probability: float = 0.0,
        loss_probability: float = 0.0,
        duplicate_probability: float = 0.0,
        points_per_weight: int = 10,
        concurrency: int = 16,
        settings: dict | None = None,
        replicate: bool = True,
    ) -> None:
        self.nursery = nursery
        # the crawlers replicate the seen keys of the pages they fetch, as peer/crawl/crawler.py does in a cluster
        self.replicate = replicate
        self.tmp_path = tmp_path
        self.web = web
        self.seed = seed
        self.rng = random.Random(seed)
        self.net = MemoryNetwork(random.Random(seed + 1), delay=delay, jitter=jitter,
                                 break_probability=break_probability, loss_probability=loss_probability,
                                 duplicate_probability=duplicate_probability, secret=SECRET)
        self.points_per_weight = points_per_weight
        self.concurrency = concurrency
        self.settings = {
            "batch_size": 50, "dispatch_interval": 0.2, "handoff_wait": 30.0, "suspicion_timeout": 3.0,
            "probe_interval": 1.0, **(settings or {}),
        }
        self.ledger = Ledger()
        self.nodes: dict[str, SimNode] = {}  # every node ever started, by id
        self.gone: set[str] = set()  # killed and not restarted, or left
        self.finishes: list[FinishSnapshot] = []
        self.events: list[tuple[float, str]] = []

    def config(self, weight: int) -> Config:
        return load(env={}, flags={"weight": weight, **self.settings})

    def note(self, what: str) -> None:
        self.events.append((trio.current_time(), what))
        log.info("sim: %s", what)

    def running(self) -> list[SimNode]:
        return [node for node in self.nodes.values() if node.running]

    # -- lifetime --

    async def start(self, index: int, weight: int, *, join: SimNode | None = None,
                    seeds: Sequence[str] = ()) -> SimNode:
        node = SimNode(self, index, weight)
        self.nodes[node.node_id] = node
        node.build()
        await self.nursery.start(node.serve, join.address if join else None, tuple(seeds))
        self.note(f"{node.node_id} started (weight {weight})" + (f", joined through {join.node_id}" if join else ""))
        return node

    async def kill(self, node: SimNode) -> list[Fetch]:
        """Cancel the node's scope (no clean-up runs in the crawler); its store stays on disk, closed."""
        node.scope.cancel()
        await node.stopped.wait()
        cut = self.ledger.cut(node.node_id)
        assert node.store is not None
        node.store.close()
        self.gone.add(node.node_id)
        self.note(f"{node.node_id} killed ({len(cut)} requests cut)")
        return cut

    async def restart(self, node: SimNode, join: SimNode,
                      before_join: Callable[[], Awaitable[None]] | None = None) -> None:
        """Start a killed node again on its store and address, joining through `join`."""
        assert not node.running
        node.build()
        await self.nursery.start(node.serve, join.address, (), before_join)
        self.gone.discard(node.node_id)
        self.note(f"{node.node_id} restarted ({node.recovered} in-flight URLs recovered)")

    async def leave(self, node: SimNode, timeout: float = 60.0) -> bool:
        """Leave gracefully as `peerd` does on `peerctl leave`: hand everything off, drain, stop."""
        assert node.cluster is not None and node.crawler is not None
        self.note(f"{node.node_id} leaving")
        handed = await node.cluster.leave(timeout)
        await node.crawler.drain(10.0)
        node.cluster.dispatcher.flush_staged()
        node.scope.cancel()
        await node.stopped.wait()
        assert node.store is not None
        node.store.close()
        self.gone.add(node.node_id)
        self.note(f"{node.node_id} left (handed off: {handed})")
        return handed

    async def stop_all(self) -> None:
        for node in self.running():
            node.scope.cancel()
            await node.stopped.wait()
        for node in self.nodes.values():
            if node.store is not None:
                node.store.close()  # idempotent

    # -- observations --

    def on_finished(self, node: SimNode) -> None:
        states = tuple(n.state() for n in self.running())
        self.finishes.append(FinishSnapshot(node=node.node_id, at=trio.current_time(), states=states))

    def views(self) -> dict[str, tuple]:
        """Each running node's (epoch, members, ring id)."""
        out = {}
        for node in self.running():
            cluster = node.cluster
            assert cluster is not None and cluster.ring is not None
            out[node.node_id] = (cluster.view.epoch, cluster.view.members, ring_id(cluster.ring))
        return out

    def converged(self) -> bool:
        """Every running node holds the same view and ring, every running node ALIVE in it, every node that is
        gone not owning arcs."""
        views = self.views()
        if len(set(views.values())) != 1:
            return False
        _epoch, members, _ring = next(iter(views.values()))
        states = {m.node_id: m.state for m in members}
        live = {n.node_id for n in self.running()}
        if any(states.get(node) is not MemberState.ALIVE for node in live):
            return False
        return all(states.get(node) in (MemberState.DEAD, MemberState.LEAVING) for node in self.gone)

    def owners_agree(self) -> bool:
        return len({ring_id(n.cluster.ring) for n in self.running() if n.cluster and n.cluster.ring}) == 1

    async def until(self, condition: Callable[[], bool], limit: float, step: float = 0.1) -> float:
        """Virtual seconds until `condition` holds, checked every `step`; AssertionError past `limit`."""
        start = trio.current_time()
        for _ in range(int(limit / step) + 2):
            if condition():
                return trio.current_time() - start
            await trio.sleep(step)
        raise AssertionError(f"condition not met within {limit} virtual seconds")

    async def at_pages(self, share: float, total: int, limit: float = 600.0) -> None:
        """Wait until `share` of `total` pages were fetched."""
        await self.until(lambda: len(self.ledger.fetched()) >= share * total, limit, step=0.05)

    def settled(self) -> bool:
        """Every running node holds the same ring and no hand-off is outstanding or awaited anywhere."""
        return self.owners_agree() and all(
            n.cluster is not None and not n.cluster.handoff.outstanding() and not n.cluster.handoff.waiting()
            for n in self.running()
        )

    def figures(self, expected: set[str]) -> dict[str, float]:
        """What the run did, for the report: pages, duplicates, overlaps, broken gaps, forwards, waits."""
        ledger = self.ledger
        fetched = ledger.fetched()
        dups = ledger.duplicates()
        first_death = min((t for t, what in self.events if "killed" in what), default=math.inf)
        starts: dict[str, list[float]] = defaultdict(list)
        for f in ledger.fetches:
            if f.ok and f.end is not None and f.url in dups:
                starts[f.url].append(f.start)
        before = sum(1 for times in starts.values() if sorted(times)[1] < first_death)
        clusters = [n.cluster for n in self.nodes.values() if n.cluster is not None]
        return {
            "expected": len(expected),
            "fetched": len(fetched & expected),
            "unexpected": len(fetched - expected),
            "lost": len(expected - fetched),
            "duplicated_pages": len(dups),
            "extra_fetches": sum(dups.values()) - len(dups),
            "requests": len(ledger.fetches),
            "requests_cut": sum(1 for f in ledger.fetches if f.cut),
            "duplicated_before_first_kill": before,
            "overlaps": len(ledger.overlaps()),
            "overlaps_with_cut": len(ledger.overlaps(include_cut=True)),
            "gap_breaks": len(ledger.gap_breaks(self.web.gap)),
            "urls_forwarded": sum(c.dispatcher.stats.urls_forwarded for c in clusters),
            "handoff_urls_forwarded": sum(c.handoff.urls_forwarded for c in clusters),
            "handoff_waits_expired": sum(c.handoff.waits_expired for c in clusters),
            "link_breaks": self.net.breaks,
            "messages_lost": self.net.lost,
            "messages_duplicated": self.net.duplicated,
            "blocked_turns": sum(n.crawler.blocked_turns for n in self.nodes.values() if n.crawler),
            "hosts_let_go": sum(n.crawler.let_go for n in self.nodes.values() if n.crawler),
            "last_fetch_end": ledger.last_end(),
        }

    def held(self, node: SimNode) -> set[str]:
        """URLs a (stopped) node's store still holds: queued, in flight, or routed and not acknowledged."""
        store = NodeStore.open(node.path, map_size=1 << 24)
        try:
            queued, _ = store.frontier.export_arc(0, 0)
            urls = {item.url for item in queued}
            urls |= {item.url for item in store.frontier.in_flight_items()}
            for owner in store.outbox.counts():
                urls |= {item.url for _, item in store.outbox.take(owner, 1 << 30)}
        finally:
            store.close()
        return urls


# -- determinism -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def inline_threads() -> Iterator[None]:
    """Run `trio.to_thread.run_sync(fn)` as a checkpoint followed by `fn()` in the trio thread, so the virtual
    clock cannot jump while a ring is built (see the module docstring). Restores the real one on exit."""
    real = trio.to_thread.run_sync

    async def run_sync(fn, *args, **_options):  # type: ignore[no-untyped-def]
        await trio.lowlevel.checkpoint()
        return fn(*args)

    trio.to_thread.run_sync = run_sync  # type: ignore[assignment]
    try:
        yield
    finally:
        trio.to_thread.run_sync = real  # type: ignore[assignment]


def seed_scheduler(seed: int) -> None:
    """Seed trio's scheduler, so a simulation is repeatable for a given seed (the same requests at the same
    virtual times, whatever the hash seed). Importing Hypothesis puts trio in its deterministic mode (each batch
    of runnable tasks sorted, then shuffled with trio's own `random.Random`); that generator is what we seed.
    Private to trio: if it moves, this says so rather than running unrepeatable simulations."""
    import hypothesis  # noqa: F401  (its trio plugin switches the scheduler to deterministic mode)
    from trio._core import _run

    if not getattr(_run, "_ALLOW_DETERMINISTIC_SCHEDULING", False) or not hasattr(_run, "_r"):
        raise RuntimeError("trio's deterministic scheduling is not available: simulations would not repeat")
    _run._r.seed(seed)


def run_simulation(body: Callable[[trio.Nursery], object], *, seed: int) -> None:
    """`trio.run(body(nursery))` under `MockClock(autojump_threshold=0)` with threads inline and the scheduler
    seeded; the nursery is cancelled when `body` returns."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await body(nursery)  # type: ignore[misc]
            nursery.cancel_scope.cancel()

    seed_scheduler(seed)
    with inline_threads():
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
