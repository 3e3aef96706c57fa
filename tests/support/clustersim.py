"""Whole-cluster simulations: real `Cluster`s (membership, dispatch, hand-off, progress rounds) over a
`MemoryNetwork`, each node with a real LMDB `NodeStore` and the real `Crawler` (peer/crawl/crawler.py), crawling a synthetic link
graph served in memory by `SimFetcher`, all in one `trio.run` under `MockClock`.

- `Web`: a seeded link graph of hosts and pages, with per-host minimum gaps, per-page fetch times and a few
  flaky pages (the first request fails with a retryable error, as a 503 would).
- `Ledger`: every request any node made (node, URL, start, end), shared by the whole simulation, and the checks
  run on it (overlapping requests to one host, broken gaps, duplicates, what was never fetched).
- `SimFetcher`: the crawler's `PageFetcher` seam (peer/crawl/seams.py) over the `Web`: pages as HTML after their
  fetch time, each host's robots.txt with `Crawl-delay` set to its gap, a 503 for a flaky page's first request.
  The crawler itself is the product's, with the `Cluster` as its `Ownership`: no copy of its rules here.
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

import itertools
import logging
import math
import random
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio.testing

from peer.cluster.core.cluster import Cluster, ring_id
from peer.config import Config, load
from peer.crawl.crawler import Crawler
from peer.fetch.http import Response
from peer.stats import Stats
from peer.cluster.net.memtransport import MemoryNetwork
from peer.crawl.urls import host_of_normalized
from peerlab.experiment.cluster import inline_threads  # the lab's simulated cluster runs the same way
from ring import MemberState
from storage import NodeStore, NullPageStore

__all__ = [
    "ClusterSim",
    "Fetch",
    "FinishSnapshot",
    "Ledger",
    "SimFetcher",
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
#: Every host's robots.txt, and the time it takes to answer.
ROBOTS = "/robots.txt"
ROBOTS_COST = 0.05
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
    robots: bool = False


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

    def in_flight_at(self, moment: float) -> set[str]:
        """Pages whose request was under way at `moment` (started before it, ended after it or cut by it)."""
        return {f.url for f in self.fetches if not f.robots and f.start <= moment
                and (f.end is None or f.end >= moment)}

    def failed_before(self, url: str) -> int:
        return sum(1 for f in self.fetches if f.url == url and f.end is not None and not f.ok and not f.cut)

    def pages(self) -> Counter[str]:
        """URL -> how many times a request for it completed successfully (the page was fetched)."""
        return Counter(f.url for f in self.fetches if f.ok and f.end is not None and not f.robots)

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


# -- the web server: the real crawler's PageFetcher ---------------------------------------------------------------


class SimFetcher:
    """The real `Crawler`'s `PageFetcher` (peer/crawl/seams.py) over a `Web`, in virtual time: a page answers
    after `web.cost[url]` with its links as HTML, a flaky page fails its first request with a 503 (the crawler
    retries it), and every host's robots.txt allows everything with `Crawl-delay: web.gap[host]`, so the
    crawler's own politeness rules keep the per-host gap. Every request, robots.txt included, is written in the
    shared `Ledger` (a request cut by a kill stays open there until `Ledger.cut`)."""

    def __init__(self, node_id: str, web: Web, ledger: Ledger) -> None:
        self.node_id = node_id
        self.web = web
        self.ledger = ledger

    async def fetch(self, url: str, *, headers: Sequence[tuple[str, str]] = (), sink: object = None,
                    address: str | None = None) -> Response:
        host = host_of_normalized(url)
        fetch = self.ledger.begin(self.node_id, url, host)
        if url.endswith(ROBOTS):
            await trio.sleep(ROBOTS_COST)
            fetch.end = trio.current_time()
            fetch.robots = True
            body = f"User-agent: *\nCrawl-delay: {self.web.gap.get(host, 1.0)}\n".encode()
            return _response(url, 200, "text/plain", body)
        await trio.sleep(self.web.cost.get(url, 0.1))
        fetch.end = trio.current_time()
        if url not in self.web.links:
            fetch.ok = False
            return _response(url, 404, "text/plain", b"not found")
        if url in self.web.flaky and self.ledger.failed_before(url) < FLAKY_FAILURES:
            fetch.ok = False
            return _response(url, 503, "text/plain", b"try again")
        links = "".join(f'<a href="{link}">x</a>' for link in self.web.links[url])
        return _response(url, 200, "text/html", f"<html><body>{links}</body></html>".encode())


    async def address(self, host: str) -> str:
        """A server address of its own per host (a label: nothing connects to it); the simulations run with the
        per-address limits off (`ip_connections` 0), as the lab does, so it only answers the seam."""
        return f"sim-address-{host}"


def _response(url: str, status: int, ctype: str, body: bytes) -> Response:
    return Response(url=url, status=status, reason="", headers=[("content-type", ctype)], body=body,
                    ip="127.0.0.1", truncated=False, elapsed=0.0, request_headers=[])


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
    """One node: its store (kept across kills), `Cluster` and the real `Crawler`, under its own cancel scope."""

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
        self.crawler: Crawler | None = None
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
        cluster.termination.finished = _WatchedEvent(lambda: sim.on_finished(self))  # type: ignore[assignment]
        if not sim.replicate:
            cluster.replicas.copies = 0  # no seen-key replicas either (the slow-network run)
        crawler = Crawler(cfg, fetcher=SimFetcher(self.node_id, sim.web, sim.ledger), store=self.store,
                          pages=NullPageStore(), stats=self.stats, ownership=cluster, wallclock=self.wallclock)
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
        replicas: int = 1,
    ) -> None:
        self.nursery = nursery
        # the nodes replicate the seen keys of the pages they fetch (off only for the slow-network run), and
        # every queued URL to `replicas` ring backups (--replicas)
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
            "probe_interval": 1.0, "concurrency": concurrency, "delay": 0.0,
            "replicas": replicas if replicate else 0, "ip_connections": 0, **(settings or {}),
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
            "hosts_let_go": sum(n.stats.skipped["host-moved"] for n in self.nodes.values()),
            "urls_promoted": sum(c.backups.urls_promoted for c in clusters),
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
