"""Cluster mode: the plan's nodes as real ``Cluster``s in one process, over the in-memory network.

Every node is the product's ``peer.cluster.Cluster`` (SWIM membership, dispatch with its durable outbox, hand-off
of moved arcs, seen-key replicas, progress waves) on a real LMDB ``NodeStore`` in a temporary folder, linked to
the others by ``PeerLinks`` over a ``MemoryNetwork`` (1-2 ms per message), all in one ``trio.run`` under
``MockClock``: the experiment's seconds are virtual, so a thousand nodes need no thousand processes. What is
simulated is the network, the clock and the web; the crawl engine is replaced by a page source that does, with
ownership, what the crawler does (``_PageSource``): it takes URLs from the node's own frontier, one per host per
second at most, skips hosts whose hand-off has not arrived and lets go of hosts that moved, "fetches" the page
from the web model and passes its links through the cluster's ``Ownership`` seam (``owns`` / ``route`` /
``take_routed`` / ``fetched``) into ``store.finish``, exactly as the crawler commits a page (``peer/crawl/admission.py``).

The web model is the simulation's: ``web.hosts`` hosts named from the seed, ``web.pages_per_host`` pages each,
``web.links_per_page`` links per page, a share ``web.internal_links`` of them on the page's own host and the
others on a host drawn by Zipf popularity (``web.popularity``). A node fetches ``simulate.pages_per_second`` times
its weight share pages a second; ``cluster.time_scale`` shortens the plan's ``at`` triggers (the design's ten
minutes become 30 s at 0.05).

The cluster starts converged: every node starts with the whole initial view (as n sequential joins would end),
so its first ring is the cluster's and the run measures a running cluster, not n joins in a row. The first node brings the seeds. Changes: ``remove`` is the node's graceful ``leave`` (hand everything off,
then stop), ``kill`` cancels the node (its store stays, nothing handed off), ``add`` starts a node that joins
through a running one. After a change the next phase starts once every running node's ring holds exactly the
new members and no hand-off is under way (the transition is counted in no phase, as in live mode). Per phase,
the URLs sent from node i to node j are the growth of i's ``dispatcher.stats.urls_sent[j]`` (first sends of a
URL to its owner, after the recently-sent filter), and the URLs a change moved are what the new owners received
by hand-off (``handoff.urls_received``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import resource
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing

from peer.cluster.core.cluster import Cluster
from peer.cluster.core.rings import RingCache
from peer.cluster.net.memtransport import MemoryNetwork
from peer.config import load
from peer.crawl.settings import CrawlSettings
from peer.stats import Stats
from protocol import Message
from ring import MemberState, View, random_hosts
from storage import HostState, NodeStore, QueuedUrl

from . import synthweb
from .live import ring_figures
from .loopshare import LoopShare
from .plan import Plan
from .results import ChangeCost, ChangeResult, ExperimentResult, PhaseResult, Sample

__all__ = ["ClusterRunError", "run_cluster"]

log = logging.getLogger(__name__)

SECRET = b"cluster-mode experiment secret!!"
_NOTE = ("cluster: real Cluster nodes (membership, dispatch, hand-off, replicas, progress waves) on LMDB stores "
         "over the in-memory network in virtual time; the crawl engine is a page source over the web model. URLs "
         "are first sends counted by each sender (dispatcher.stats.urls_sent), after its recently-sent filter")
#: Member states that own arcs.
_OWNING = (MemberState.ALIVE, MemberState.SUSPECT)
#: A node's page source takes URLs once a virtual second: the politeness gap of every host.
TICK = 1.0
#: Virtual seconds between a phase's end and its change, in no phase: URLs sent by the end reach their owners
#: (a few dispatch intervals and deliveries) before the receivers' counts are compared with the senders'.
PAUSE = 2.0


class ClusterRunError(RuntimeError):
    """The simulated cluster did not do what the plan asks (it did not settle, a node did not start)."""


class _WebModel:
    """The plan's web: host names from the seed, and each page's links (drawn with the fetching node's rng)."""

    def __init__(self, plan: Plan) -> None:
        web = plan.web
        rng = random.Random(f"{plan.seed}:hosts")
        names: dict[str, None] = {}
        for chunk in random_hosts(rng, web.hosts):
            names.update(dict.fromkeys(chunk))
        self.hosts = list(names)
        self.pages = web.pages_per_host
        self.links_per_page = web.links_per_page
        self.internal = web.internal_links
        self.popularity = web.popularity

    def sampler(self, rng: random.Random) -> Callable[[], int]:
        return synthweb.zipf_sampler(len(self.hosts), self.popularity, rng)

    def url(self, host: str, page: int) -> str:
        return f"http://{host}/" if page == 0 else f"http://{host}/p{page}"

    def links(self, host: str, rng: random.Random, draw: Callable[[], int]) -> list[tuple[str, str]]:
        out = []
        for _ in range(self.links_per_page):
            target = host if rng.random() < self.internal else self.hosts[draw()]
            out.append((self.url(target, rng.randrange(self.pages)), target))
        return out


class _PageSource:
    """The crawler's side of the cluster for one node (what ``Cluster`` calls on its crawler), fetching from the
    web model: one URL per host per tick, ``rate`` pages a second for the whole node."""

    def __init__(self, node_id: str, store: NodeStore, cluster: Cluster, web: _WebModel, rate: float,
                 rng: random.Random) -> None:
        self.node_id = node_id
        self.store = store
        self.cluster = cluster
        self.web = web
        self.rate = rate
        self.rng = rng
        self.draw = web.sampler(rng)
        self.settings = CrawlSettings(version=0, origin=node_id)
        self.active = 0
        self.pages = 0
        self.kept = 0
        self._ready: deque[str] = deque()
        self._queued: set[str] = set()
        self._budget = 0.0

    # -- what Cluster calls --

    def address_ready(self, address: str) -> None:
        """Per-address lanes are off in this mode (``ip_connections = 0``)."""

    def busy_hosts(self) -> list[str]:
        return []  # a page is fetched and committed without an await: no request is ever under way

    def wake_hosts(self, items: Iterable[QueuedUrl]) -> None:
        for item in items:
            if item.host not in self._queued:
                self._queued.add(item.host)
                self._ready.append(item.host)

    def take_over(self, items: Sequence[QueuedUrl], states: Sequence[HostState]) -> None:
        self.wake_hosts(items)

    def release_moved(self) -> int:
        return 0  # nothing is parked: a host's URLs stay in the frontier, which the hand-off exports

    def forget_seen(self) -> None:
        pass  # no memory of answered or routed URLs to forget: every link asks `owns` (the crawler's has one)

    def unpark(self, which: Callable[[str], bool]) -> int:
        return 0  # nothing is parked (`release_moved`)

    def answered(self, url: str) -> bool:
        return False  # no memory: a peer's URLs are all looked up in the store

    def known_elsewhere(self, urls: Sequence[str]) -> int:
        return 0  # no memory: every link to another owner's host is routed, as the design's tables count them

    def rewake(self) -> int:
        self._ready.clear()
        self._queued.clear()
        woken = 0
        for host, _count in self.store.frontier.hosts():
            if self.cluster.owns(host):
                self._queued.add(host)
                self._ready.append(host)
                woken += 1
        return woken

    def is_done(self) -> bool:
        return len(self.store.frontier) == 0 and self.store.frontier.in_flight() == 0

    def adopt(self, settings: CrawlSettings) -> bool:
        if settings.rank() <= self.settings.rank():
            return False
        self.settings = settings
        return True

    # -- the crawl --

    def seed(self, urls: Iterable[tuple[str, str]]) -> None:
        local = []
        for url, host in urls:
            item = QueuedUrl(url=url, host=host, depth=0)
            if self.cluster.owns(host):
                local.append(item)
            else:
                self.cluster.route(item)  # written to the outbox at the dispatcher's next tick
        self.wake_hosts(self.store.admit(local))

    async def run(self) -> None:
        while True:
            await trio.sleep(TICK)
            self._budget = min(self._budget + self.rate * TICK, max(1.0, 2 * self.rate * TICK))
            self.tick()

    def tick(self) -> None:
        cluster, frontier = self.cluster, self.store.frontier
        for _ in range(len(self._ready)):
            if self._budget < 1.0:
                return
            host = self._ready.popleft()
            if not cluster.owns(host):  # moved: its queue goes with the hand-off
                self._queued.discard(host)
                continue
            if cluster.blocked(host):  # gained, its hand-off not arrived yet: look again next tick
                self._ready.append(host)
                continue
            item = frontier.pop(host)
            if item is None:
                self._queued.discard(host)
                continue
            self._budget -= 1.0
            self._fetch(item)
            if frontier.queued(host) > 0:
                self._ready.append(host)
            else:
                self._queued.discard(host)

    def _fetch(self, item: QueuedUrl) -> None:
        cluster = self.cluster
        local = []
        for url, host in self.web.links(item.host, self.rng, self.draw):
            link = QueuedUrl(url=url, host=host, depth=item.depth + 1, found_on=item.url)
            if cluster.owns(host):
                local.append(link)
                self.kept += 1
            else:
                cluster.route(link)
        new = self.store.finish(item, local, routed=cluster.take_routed())
        cluster.fetched(item)
        self.pages += 1
        self.wake_hosts(new)


class _CountedLinks:
    """A node's hand-off links as the hand-off sees them (``HandoffLinks``), counting what it sends to whom: which
    pairs of nodes a view change makes talk, the figure the hand-off keeps flat as the cluster grows."""

    def __init__(self, links: Any, node_id: str, pairs: Counter[tuple[str, str]]) -> None:
        self.links = links
        self.node_id = node_id
        self.pairs = pairs

    def send_nowait(self, peer_id: str, message: Message) -> bool:
        sent = bool(self.links.send_nowait(peer_id, message))
        if sent:
            self.pairs[(self.node_id, peer_id)] += 1
        return sent


def address_of(index: int) -> str:
    """The in-memory network address of the `index`-th node started."""
    return f"10.{index // 62500}.{index // 250 % 250}.{index % 250 + 1}:7400"


class _Node:
    def __init__(self, run: _Run, index: int, node_id: str, weight: int, members: View | None = None) -> None:
        self.node_id = node_id
        self.weight = weight
        self.address = address_of(index)
        self.path = run.workdir / node_id
        self.store = NodeStore.open(self.path, map_size=1 << 26)
        cfg = load(env={}, flags={
            "weight": weight, "batch_size": run.plan.dispatch.batch_size,
            "dispatch_interval": run.plan.dispatch.interval, "codec": run.plan.dispatch.codec,
            "ip_connections": 0, "suspicion_timeout": run.plan.live.suspicion_timeout, "zone": run.zone,
        })
        self.cluster = Cluster(cfg, node_id=node_id, store=self.store, secret=SECRET, stats=Stats(),
                               transport=run.net.transport(self.address),
                               rng=random.Random(f"{run.plan.seed}:{node_id}"),
                               wall_clock=lambda: 1_700_000_000.0 + trio.current_time(),
                               points_per_weight=run.plan.points_per_weight, rings=run.rings, members=members)
        self.source = _PageSource(node_id, self.store, self.cluster, run.web, 0.0,
                                  random.Random(f"{run.plan.seed}:{node_id}:links"))
        self.cluster.attach(self.source)  # type: ignore[arg-type]
        self.cluster.handoff.links = _CountedLinks(self.cluster.handoff.links, node_id, run.handoff_pairs)
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()
        self.running = False
        self._owning_view: View | None = None
        self._owning: set[str] = set()

    def owning(self) -> set[str]:
        """The members owning arcs in this node's view, found again only when its view changed: the run asks every
        node ten times a virtual second while it waits for a change to settle, and a pass over every node's
        members each time made the wait cost n² (the harness's, counted in the change's CPU)."""
        view = self.cluster.view
        if view is not self._owning_view:
            self._owning_view = view
            self._owning = {m.node_id for m in view.members if m.state in _OWNING}
        return self._owning

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.cluster.run)
                    self.running = True
                    nursery.start_soon(self.source.run)
                    task_status.started()
        finally:
            self.running = False
            self.stopped.set()

    async def stop(self) -> None:
        self.scope.cancel()
        await self.stopped.wait()
        self.store.close()


#: What `_Run.traffic` reads: messages received, bytes written, the process's CPU seconds, the hand-off messages per
#: pair, the CPU samples (in trio's run loop, in all), the messages and bytes the nodes' links wrote by kind, and the
#: connections they dialled by the kind of the first message written on them.
Traffic = tuple[int, int, float, Counter[tuple[str, str]], tuple[int, int], Counter[str], Counter[str], Counter[str]]


def _by_kind(kinds: Counter[str], kind_bytes: Counter[str], before: Counter[str],
             before_bytes: Counter[str]) -> dict[str, tuple[int, int]]:
    """kind -> (messages, bytes) sent since `before`, the most bytes first."""
    out = {kind: (kinds[kind] - before[kind], kind_bytes[kind] - before_bytes[kind]) for kind in kind_bytes}
    return dict(sorted(((k, v) for k, v in out.items() if v[0] or v[1]), key=lambda item: -item[1][1]))


class _Run:
    def __init__(self, plan: Plan, workdir: Path, say: Callable[[str], None], share: LoopShare | None = None) -> None:
        self.plan = plan
        self.share = share or LoopShare()  # not started: no samples
        self.workdir = workdir
        self.say = say
        self.web = _WebModel(plan)
        self.net = MemoryNetwork(random.Random(f"{plan.seed}:net"), delay=0.001, jitter=0.001)
        # one copy of each ring and of each view change's moved arcs for every node (peer/cluster/core/rings.py)
        self.rings = RingCache(size=8)
        self.nodes: dict[str, _Node] = {}
        self.index = 0
        self.samples: list[Sample] = []
        self.notes: list[str] = []
        self.handoff_pairs: Counter[tuple[str, str]] = Counter()  # (sender, receiver) -> hand-off messages sent
        self.settle_started = 0.0
        self.views_seconds: float | None = None  # the last settle's virtual seconds until every view agreed
        #: every node's failure zone (the nodes share one machine): the converged view's records must be the ones
        #: each node holds of itself, or every node corrects its own record and each node's view changes n times
        self.zone = load(env={}, flags={}).resolved_zone()

    def traffic(self) -> Traffic:
        """Messages received by every node so far, bytes written to the network, the process's CPU seconds, a
        copy of the hand-off messages sent per pair, and the CPU samples so far (`LoopShare`)."""
        messages = sum(sum(node.cluster.links.received_kinds.values()) for node in self.nodes.values())
        kinds: Counter[str] = Counter()
        kind_bytes: Counter[str] = Counter()
        dialled: Counter[str] = Counter()
        for node in self.nodes.values():
            kinds.update(node.cluster.links.sent_kinds)
            kind_bytes.update(node.cluster.links.sent_kind_bytes)
            dialled.update(node.cluster.links.dialled_for)
        return (messages, sum(self.net.sent_bytes.values()), time.process_time(), Counter(self.handoff_pairs),
                self.share.snapshot(), kinds, kind_bytes, dialled)

    def cost(self, before: Traffic, nodes: int, seconds: float, phase: tuple[Traffic, float],
             moved_pairs: frozenset[tuple[str, str]]) -> ChangeCost:
        """What happened between `before` and now, as a change's cost; `phase` is the traffic at the start of the
        phase before the change and the phase's virtual seconds (its rates per node); `moved_pairs` the (previous,
        new owner) pairs of the change's moved arcs: hand-off messages between any other two nodes are stray."""
        messages, sent, cpu, pairs, samples, kinds, kind_bytes, dialled = self.traffic()
        pairs.subtract(before[3])
        moved = +pairs
        (p_messages, p_bytes, p_cpu, _, p_samples, p_kinds, p_kind_bytes, _), p_seconds = phase
        dialled.subtract(before[7])
        per = max(1, nodes) * max(1e-9, p_seconds)
        stray = sum(n for (a, b), n in moved.items() if (a, b) not in moved_pairs and (b, a) not in moved_pairs)
        return ChangeCost(
            nodes=nodes, seconds=seconds, messages=messages - before[0], bytes=sent - before[1],
            cpu_seconds=cpu - before[2], handoff_messages=sum(moved.values()), handoff_pairs=len(moved),
            changed_nodes=len({node for pair in moved_pairs for node in pair}), handoff_stray=stray,
            handoff_by_pair=dict(moved),
            phase_messages=(before[0] - p_messages) / per, phase_bytes=(before[1] - p_bytes) / per,
            phase_cpu=(before[2] - p_cpu) / per,
            loop_cpu_seconds=(cpu - before[2]) * _share(before[4], samples),
            phase_loop_cpu=(before[2] - p_cpu) * _share(p_samples, before[4]) / per,
            sent_by_kind=_by_kind(kinds, kind_bytes, before[5], before[6]),
            phase_sent_by_kind={kind: (n / per, size / per) for kind, (n, size) in _by_kind(
                before[5], before[6], p_kinds, p_kind_bytes).items()},
            dialled_for=dict((+dialled).most_common()))

    def running(self) -> list[_Node]:
        return [node for node in self.nodes.values() if node.running]

    async def stop_all(self) -> None:
        """Stop every running node at once: stopped one after another, each node's peers would dial it again, and
        the n stops cost n times the cluster's links."""
        live = self.running()
        for node in live:
            node.scope.cancel()
        for node in live:
            await node.stopped.wait()
            node.store.close()

    async def start(self, nursery: trio.Nursery, node_id: str, weight: int, members: View | None = None) -> _Node:
        node = _Node(self, self.index, node_id, weight, members)
        self.index += 1
        self.nodes[node_id] = node
        await nursery.start(node.serve)
        return node

    def cross_check(self, k: int, shares: Mapping[str, float], first: Mapping[str, Any],
                    last: Mapping[str, Any], later: Mapping[str, Any], weights: Mapping[str, int]) -> None:
        """Notes (which the tests require empty) if a running node's own ring gives other key shares than the
        experiment's ring, or if a receiver counted fewer URLs from a sender than the sender counted to it
        (a receiver also counts re-sent batches, so it may count more, never fewer)."""
        checked: dict[int, list[str]] = {}  # id(ring) -> the plan nodes it gives another share (nodes share rings)
        for node in self.running():
            ring = node.cluster.ring
            assert ring is not None
            bad = checked.get(id(ring))
            if bad is None:
                own = ring.shares()
                bad = checked[id(ring)] = [n for n in shares if abs(own.get(n, 0.0) - shares[n]) > 1e-9]
            if bad:
                self.notes.append(f"phase {k + 1}: {node.node_id}'s ring gives other key shares for "
                                  f"{', '.join(bad[:5])} than the experiment's")
        for i in weights:
            for j in weights:
                if i == j or i not in last or j not in later:
                    continue
                sent = last[i]["sent"].get(j, 0) - first.get(i, {}).get("sent", {}).get(j, 0)
                received = later[j]["received"].get(i, 0) - first.get(j, {}).get("received", {}).get(i, 0)
                if received < sent:
                    self.notes.append(f"phase {k + 1}: {j} counted {received:,} URLs received from {i}, which "
                                      f"counted {sent:,} sent")

    def set_rates(self) -> None:
        live = self.running()
        total = sum(node.weight for node in live)
        for node in live:
            node.source.rate = self.plan.simulate.pages_per_second * node.weight / total

    def counters(self) -> dict[str, dict[str, Any]]:
        return {node.node_id: {
            "pages": node.source.pages,
            "kept": node.source.kept,
            "sent": dict(node.cluster.dispatcher.stats.urls_sent),
            "received": dict(node.cluster.dispatcher.stats.urls_received),
            "handoff_received": node.cluster.handoff.urls_received,
            "queued": len(node.store.frontier),
        } for node in self.running()}

    def settled(self, owners: Mapping[str, int]) -> bool:
        want = set(owners)
        if self.views_seconds is None:
            if any(node.owning() != want for node in self.running()):
                return False
            self.views_seconds = trio.current_time() - self.settle_started
        return not any(node.cluster.handoff.outstanding() or node.cluster.handoff.waiting()
                       for node in self.running())

    async def settle(self, owners: Mapping[str, int], limit: float) -> float:
        """Wait until every running node's ring holds exactly `owners` and no hand-off is under way; the virtual
        seconds it took (those until every view held them: `views_seconds`)."""
        start = self.settle_started = trio.current_time()
        self.views_seconds = None
        while not self.settled(owners):
            if trio.current_time() - start > limit:
                why = [node.node_id for node in self.running() if node.owning() != set(owners)]
                raise ClusterRunError(f"the cluster did not settle on {len(owners)} nodes within {limit:g} "
                                      f"virtual s ({len(why)} nodes hold another view)")
            await trio.sleep(0.1)
        return trio.current_time() - start

    async def start_converged(self, nursery: trio.Nursery, weights: Mapping[str, int]) -> None:
        """Start every initial node with the whole view (as n joins would end): its first ring is the cluster's,
        so nothing moves and nothing is handed off. (Starting each alone and merging the whole view afterwards
        made every node hand the whole ring to every other: n² transfers, and at 1,000 nodes each node's plan of
        1.7 million lost arcs, over 20 GB in all.)"""
        whole = View()
        for offset, (node_id, weight) in enumerate(weights.items()):
            whole = whole.join(node_id, address_of(self.index + offset), weight, self.zone)
        for node_id, weight in weights.items():
            node = await self.start(nursery, node_id, weight, members=whole)
            node.cluster.membership._broadcast.clear()  # a converged cluster has nothing left to gossip
        for node in self.nodes.values():
            node.cluster.ready.set()

    def sample(self, k: int, weights: Mapping[str, int], before: Mapping[str, Any], after: Mapping[str, Any],
               elapsed: float) -> None:
        sent_by: dict[str, int] = {}
        received_by: dict[str, int] = {}
        for i in weights:
            for j, n in after.get(i, {}).get("sent", {}).items():
                delta = n - before.get(i, {}).get("sent", {}).get(j, 0)
                if delta > 0 and j in weights and j != i:
                    sent_by[i] = sent_by.get(i, 0) + delta
                    received_by[j] = received_by.get(j, 0) + delta
        self.samples.append(Sample(time=elapsed, phase=k, sent_by=sent_by, received_by=received_by))


def _share(first: tuple[int, int], last: tuple[int, int]) -> float:
    """The share of the CPU samples between two snapshots taken in trio's run loop (0 with no samples)."""
    loop, samples = last[0] - first[0], last[1] - first[1]
    return loop / samples if samples > 0 else 0.0


def _phase(k: int, name: str, weights: Mapping[str, int], start: float, end: float, first: Mapping[str, Any],
           last: Mapping[str, Any], key_shares: dict[str, float], host_shares: dict[str, float]) -> PhaseResult:
    sent: dict[tuple[str, str], int] = {}
    for i in weights:
        for j in weights:
            if i != j and i in last:
                sent[(i, j)] = max(0, last[i]["sent"].get(j, 0) - first.get(i, {}).get("sent", {}).get(j, 0))
    pages = sum(last[n]["pages"] - first.get(n, {}).get("pages", 0) for n in weights if n in last)
    kept = {n: last[n]["kept"] - first.get(n, {}).get("kept", 0) for n in weights if n in last}
    return PhaseResult(index=k, name=name, start=start, end=end, pages=pages, weights=dict(weights),
                       key_shares=key_shares, host_shares=host_shares, popularity_shares=None,
                       sent=PhaseResult.matrix(list(weights), sent), kept=kept)


async def _experiment(plan: Plan, workdir: Path, say: Callable[[str], None], timings: dict[str, float],
                      share: LoopShare | None = None) -> ExperimentResult:
    run = _Run(plan, workdir, say, share)
    stages = plan.stage_weights()
    names = plan.phase_names()
    scale = plan.cluster.time_scale
    settle_limit = plan.cluster.settle_wait
    t = time.perf_counter()
    figures = ring_figures(plan, run.web.hosts)
    timings["rings (the experiment's own)"] = time.perf_counter() - t
    phases: list[PhaseResult] = []
    changes: list[ChangeResult] = []
    async with trio.open_nursery() as nursery:
        t = time.perf_counter()
        await run.start_converged(nursery, stages[0])
        await run.settle(stages[0], settle_limit)
        # The nodes' long-lived objects (stores, views, rings, links) are not garbage: keep the cyclic collector
        # from walking them at every collection (at 1,000 nodes a profile put 46% of the time in the allocation
        # sites that trigger it).
        gc.collect()
        gc.freeze()
        timings["start and converge"] = time.perf_counter() - t
        say(f"{len(stages[0]):,} nodes converged in {timings['start and converge']:.1f} s wall "
            f"({trio.current_time():.1f} virtual s)")
        run.set_rates()
        first = next(iter(run.nodes.values()))
        rng = random.Random(f"{plan.seed}:seeds")
        seeds = [(run.web.url(host, 0), host) for host in rng.sample(run.web.hosts, min(len(run.web.hosts), plan.cluster.seeds))]
        first.source.seed(seeds)
        t0 = trio.current_time()
        offset = 0.0  # virtual seconds spent settling after changes: in no phase
        triggers = [(p.at, p.after_pages) for p in plan.phases] + [(plan.end.at, plan.end.after_pages)]
        boundary = previous = run.counters()
        phase_traffic = (run.traffic(), trio.current_time())  # at the phase's start, in virtual time
        pages_offset = 0
        start_time = 0.0
        t = time.perf_counter()
        for k, weights in enumerate(stages):
            at, after = triggers[k]
            sample_every = max(TICK, ((at * scale if at is not None else 60.0) - start_time)
                               / plan.simulate.samples_per_phase)
            while True:
                await trio.sleep(sample_every if at is None else
                                 max(0.0, min(sample_every, at * scale - (trio.current_time() - t0 - offset))))
                now = run.counters()
                elapsed = trio.current_time() - t0 - offset
                run.sample(k, weights, previous, now, elapsed)
                previous = now
                pages = sum(c["pages"] for c in now.values()) - pages_offset
                if (at is not None and elapsed >= at * scale - 1e-9) or (after is not None and pages >= after):
                    break
            end_time = trio.current_time() - t0 - offset
            await trio.sleep(PAUSE)  # what was sent by the phase's end arrives before the receivers are read
            offset += PAUSE
            run.cross_check(k, figures.key_shares[k], boundary, now, run.counters(), weights)
            phases.append(_phase(k, names[k], weights, start_time, end_time, boundary, now,
                                 figures.key_shares[k], figures.host_shares[k]))
            say(f"phase {k + 1} ({names[k]}) ended at {end_time:.1f} virtual s: {phases[-1].pages:,} pages, "
                f"{phases[-1].total_sent:,} URLs sent [{time.perf_counter() - t:.0f} s wall]")
            if k == len(stages) - 1:
                break
            change = plan.phases[k]
            held = sum(c["queued"] for n, c in now.items() if n in weights)
            handoff_before = {n: c["handoff_received"] for n, c in now.items()}
            lost = sum(now.get(n, {}).get("queued", 0) for n in change.kill)
            changed_at = trio.current_time()
            running_at_change = len(run.running())
            before_change = run.traffic()
            say(f"change {k + 1}: {', '.join(change.actions())}")
            for node_id in change.kill:
                await run.nodes[node_id].stop()
            leavers = [run.nodes[node_id] for node_id in change.remove]
            async with trio.open_nursery() as leaving:
                for node in leavers:
                    leaving.start_soon(_leave, node, plan.live.leave_wait)
                for node_id, weight in change.add:
                    through = run.running()[0]
                    node = await run.start(nursery, node_id, weight)
                    await node.cluster.join([through.address])
                    node.cluster.ready.set()
            await run.settle(stages[k + 1], settle_limit)
            views_seconds = (run.views_seconds or 0.0) + (run.settle_started - changed_at)
            run.set_rates()
            boundary = previous = run.counters()
            settle_seconds = trio.current_time() - changed_at
            cost = run.cost(before_change, running_at_change, settle_seconds,
                            (phase_traffic[0], changed_at - phase_traffic[1]), figures.moved_pairs[k])
            run.notes.append(f"settle of change {k + 1}: every view held the new members {views_seconds:.1f} "
                             f"virtual s after the change, every hand-off done at {settle_seconds:.1f}")
            if cost.handoff_stray:
                run.notes.append(f"change {k + 1}: {cost.handoff_stray:,} hand-off messages between nodes that share "
                                 "no moved arc")
            phase_traffic = (run.traffic(), trio.current_time())
            offset += settle_seconds
            pages_offset += sum(c["pages"] for c in boundary.values()) - sum(c["pages"] for c in now.values())
            transition = sum(max(0, n - now.get(i, {}).get("sent", {}).get(j, 0))
                             for i, c in boundary.items() for j, n in c["sent"].items())
            by_pair = {("", n): c["handoff_received"] - handoff_before.get(n, 0) for n, c in boundary.items()
                       if c["handoff_received"] > handoff_before.get(n, 0)}
            ideal, moved_keyspace, hosts_moved = figures.changes[k]
            changes.append(ChangeResult(
                phase=k + 1, name=change.name, time=end_time, actions=tuple(change.actions()),
                ideal_keyspace=ideal, moved_keyspace=moved_keyspace, hosts_moved=hosts_moved,
                hosts_total=len(run.web.hosts), urls_moved=sum(by_pair.values()), urls_lost=lost, urls_held=held,
                by_pair=by_pair, settle_seconds=settle_seconds, transition_urls=transition, cost=cost))
            say(f"settled in {settle_seconds:.1f} virtual s: {changes[-1].urls_moved:,} URLs handed off, "
                f"{transition:,} sent meanwhile; per node {cost.per_node(cost.handoff_messages):.1f} hand-off "
                f"messages ({cost.handoff_pairs:,} pairs among the {cost.changed_nodes:,} nodes whose arcs changed, "
                f"{cost.handoff_stray:,} messages outside them), {cost.per_node(cost.messages):.0f} messages, "
                f"{cost.per_node(cost.bytes) / 1024:.1f} KiB, {cost.per_node(cost.cpu_seconds) * 1e3:.0f} ms CPU "
                f"[{time.perf_counter() - t:.0f} s wall]")
            start_time = end_time
        timings["phases"] = time.perf_counter() - t
        links = [node.cluster.status()["links"]["live"] for node in run.running()]
        run.notes.append(f"links per node at the end: mean {sum(links) / len(links):.1f}, most {max(links)} "
                         f"(of {len(links) - 1} peers); messages {run.net.connects:,} connections opened in all")
        kinds: Counter[str] = Counter()
        for node in run.nodes.values():
            kinds.update(node.cluster.links.received_kinds)
        total = sum(kinds.values())
        per = total / max(1, len(run.nodes)) / max(1e-9, trio.current_time())
        run.notes.append(f"messages received: {total:,} in {trio.current_time():.1f} virtual s, {per:.1f} per node "
                         "per virtual s; by kind: " + ", ".join(
                             f"{kind} {n:,} ({n / total:.1%})" for kind, n in kinds.most_common()))
        await run.stop_all()
        nursery.cancel_scope.cancel()
    return ExperimentResult(plan=plan, mode="cluster", phases=tuple(phases), samples=tuple(run.samples),
                            changes=tuple(changes), wall_seconds=0.0, peak_rss_bytes=0, timings=timings,
                            notes=(_NOTE, *run.notes))


async def _leave(node: _Node, timeout: float) -> None:
    """Leave as ``peerd`` does on ``peerctl leave``: hand everything off, then stop."""
    handed = await node.cluster.leave(timeout)
    if not handed:
        log.warning("%s did not hand everything off within %g s", node.node_id, timeout)
    node.cluster.dispatcher.flush_staged()
    await node.stop()


@contextlib.contextmanager
def inline_threads() -> Iterator[None]:
    """Run ``trio.to_thread.run_sync(fn)`` as a checkpoint followed by ``fn()`` in the trio thread: under
    ``MockClock(autojump_threshold=0)`` a task waiting for a thread is blocked, so the clock would jump while a
    ring is built (tests/support/clustersim.py measured 74 virtual seconds for one build). Restored on exit."""
    real = trio.to_thread.run_sync

    async def run_sync(fn, *args, **_options):
        await trio.lowlevel.checkpoint()
        return fn(*args)

    trio.to_thread.run_sync = run_sync  # type: ignore[assignment]
    try:
        yield
    finally:
        trio.to_thread.run_sync = real


def run_cluster(plan: Plan, *, progress: Callable[[str], None] | None = None,
                workdir: Path | None = None, loop_share: bool = True) -> ExperimentResult:
    """Run ``plan`` as a simulated cluster; the node stores go to a temporary folder (under ``workdir``).
    ``loop_share``: sample the share of the CPU in trio's run loop (`LoopShare`, with SIGPROF); off for a caller
    that samples SIGPROF itself."""
    say = progress or (lambda line: log.info(line))
    started = time.perf_counter()
    cpu = time.process_time()
    timings: dict[str, float] = {}
    out: list[ExperimentResult] = []
    share = LoopShare()  # how much of the CPU is trio's run loop, for n nodes' timers in one process

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="cluster-", dir=workdir) as tmp:
            out.append(await _experiment(plan, Path(tmp), say, timings, share))

    threshold = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)  # a thousand nodes allocate fast; collect the young generation less often
    if loop_share:
        share.start()
    try:
        with inline_threads():
            trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        share.stop()
        gc.unfreeze()
        gc.set_threshold(*threshold)
    result = out[0]
    timings["CPU"] = time.process_time() - cpu
    return ExperimentResult(
        plan=result.plan, mode=result.mode, phases=result.phases, samples=result.samples, changes=result.changes,
        wall_seconds=time.perf_counter() - started,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, timings=timings,
        notes=result.notes)
