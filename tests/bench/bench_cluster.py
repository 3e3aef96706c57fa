"""Cost of the cluster layer, each figure beside a reference measured in the same run.

Run: python -m tests.bench.bench_cluster [--quick]

1. wire: bytes per URL that a sender writes on its socket for URL batches (real PeerLinks over TCP on 127.0.0.1,
   two Dispatchers), msgpack and JSON, batches of 100/500/2000. Reference: a bare newline-joined list of the URLs.
2. cpu: process CPU per 1,000 dispatched URLs, sender and receiver parts, through real TCP links, both nodes in
   this one process. References: `set.add` of the same URLs, a bare LMDB put of their keys.
3. membership: wall time for a join and a leave to reach every node's view, N Membership instances over TCP on
   loopback with the default config. Reference: one Ping/Pong round trip over one link.
4. hand-off: queued URLs (with their seen keys and host states) per second to a newly joined node of equal
   weight over real PeerLinks. Reference: `store.admit` of the same URLs into a fresh store.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import lmdb
import trio

from peer.cluster.core.dispatch import DispatchConfig, Dispatcher
from peer.cluster.handoff.handoff import Handoff, HandoffConfig
from peer.cluster.membership.membership import Membership
from peer.cluster.net.peerlinks import PeerLinks
from peer.cluster.net.transport import TcpTransport
from protocol import Message, Ping, Pong
from ring import MemberState, Ring, View
from storage import HostState, NodeStore, QueuedUrl, queued_url_keys
from tests.bench._cluster_helpers import (
    SECRET,
    CountingTransport,
    CpuMeter,
    distinct_hosts,
    make_queued,
    owned_hosts,
    spread,
    unique_urls,
    wait_for,
)

# Two nodes of equal weight (peerd's default weight, 100) at the default 1,000 points per weight.
WEIGHTS = {"a": 100, "b": 100}
PAGE_LINKS = 30  # routed links per simulated page: about what a page of the crawl benchmark's web has
MAP_SIZE = 1 << 30
LIMIT = 600.0  # no phase of this benchmark may take longer (seconds), so a hang is an error, not a stall


def _connected(links: PeerLinks, peer_id: str) -> bool:
    link = links.get(peer_id)
    return link is not None and link.connected


def _chunks(items: Sequence, size: int) -> list[Sequence]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# == 1 and 2: URL batches between two Dispatchers ==================================================================


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchRun:
    """One run: URLs routed from node a to their owner b over real TCP peer links, every batch acknowledged."""

    codec: str
    batch_size: int
    urls: int
    url_bytes: int  # reference: len("\n".join(urls))
    sent_bytes: int  # a's socket writes after the handshake: the UrlBatch frames
    ack_bytes: int  # b's socket writes after the handshake: the BatchAck frames
    batches: int
    wall: float  # from the first route to the last ack
    cpu: dict[str, float]  # CPU seconds per part, and "process" for the whole process over the run

    def per_url(self, size: int) -> float:
        return size / self.urls

    def ms_per_1000(self, part: str) -> float:
        return self.cpu[part] / self.urls * 1e6


SENDER_ROUTE = "sender: route + take_routed + finish(routed=)"
SENDER_BATCH = "sender: batching (Dispatcher.tick)"
SENDER_ACKS = "sender: ack handling"
RECEIVER = "receiver: accept + sync + ack"


def dispatch_items(count: int, seed: int = 1) -> tuple[Ring, list[QueuedUrl]]:
    """The ring of a and b, and `count` distinct URLs on 400 hosts b owns, each found on a page of a host a owns."""
    rng = random.Random(seed)
    ring = Ring(WEIGHTS)
    b_hosts = owned_hosts(ring, "b", 400, rng)
    a_hosts = owned_hosts(ring, "a", 100, rng)
    referrers = unique_urls(rng, a_hosts, 2_000)
    return ring, make_queued(unique_urls(rng, b_hosts, count), referrers, rng)


def run_dispatch(tmp: Path, ring: Ring, items: Sequence[QueuedUrl], *, codec: str = "msgpack",
                 batch_size: int = 500) -> DispatchRun:
    """Route `items` from a to b as the crawler does (pages of PAGE_LINKS links) and wait for every ack."""
    return trio.run(_dispatch, tmp, ring, items, codec, batch_size)


async def _dispatch(tmp: Path, ring: Ring, items: Sequence[QueuedUrl], codec: str, batch_size: int) -> DispatchRun:
    meter = CpuMeter()
    config = DispatchConfig(batch_size=batch_size)
    transports = {"a": CountingTransport(), "b": CountingTransport()}
    done = trio.Event()
    produced = False
    with (
        NodeStore.open(tmp / "a", map_size=MAP_SIZE) as store_a,
        NodeStore.open(tmp / "b", map_size=MAP_SIZE) as store_b,
    ):

        async def on_a(peer_id: str, message: Message) -> None:
            with meter.section(SENDER_ACKS):  # Dispatcher.on_message never yields: the section is its CPU only
                await sender.on_message(peer_id, message)
            if produced and sender.outstanding() == 0:
                done.set()

        async def on_b(peer_id: str, message: Message) -> None:
            with meter.section(RECEIVER):
                await receiver.on_message(peer_id, message)

        links_a = PeerLinks(node_id="a", secret=SECRET, transport=transports["a"], on_message=on_a,
                            rng=random.Random(1), codecs=(codec,))
        links_b = PeerLinks(node_id="b", secret=SECRET, transport=transports["b"], on_message=on_b,
                            rng=random.Random(2), codecs=(codec,))
        sender = Dispatcher("a", store_a, links_a, ring_of=lambda: (1, ring), config=config)
        receiver = Dispatcher("b", store_b, links_b, ring_of=lambda: (1, ring), config=config)
        sender.tick = meter.wrap(SENDER_BATCH, sender.tick)  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            await nursery.start(links_a.run)
            address_b = await nursery.start(links_b.run)
            await nursery.start(sender.run)
            await nursery.start(receiver.run)
            links_a.link("b", address_b)
            await wait_for(lambda: links_a.get("b").connected and _connected(links_b, "a"), 10.0, "link a-b up")
            written_a, written_b = transports["a"].counter.written, transports["b"].counter.written
            cpu_start, wall_start = time.process_time(), trio.current_time()
            for page in _chunks(items, PAGE_LINKS):
                with meter.section(SENDER_ROUTE):
                    for item in page:
                        sender.route(item)
                    store_a.finish(None, [], routed=sender.take_routed())
                await trio.sleep(0)  # the next page is found after a fetch: let the links and dispatchers run
            produced = True
            if sender.outstanding() == 0:
                done.set()
            with trio.fail_after(LIMIT):
                await done.wait()
            cpu = dict(meter.seconds)
            cpu["process"] = time.process_time() - cpu_start
            wall = trio.current_time() - wall_start
            sent = transports["a"].counter.written - written_a
            acks = transports["b"].counter.written - written_b
            nursery.cancel_scope.cancel()
        if receiver.stats.urls_new != len(items) or len(store_b.frontier) != len(items):
            raise AssertionError(f"b admitted {receiver.stats.urls_new} of {len(items)} URLs")
    return DispatchRun(
        codec=codec, batch_size=batch_size, urls=len(items), url_bytes=len("\n".join(i.url for i in items).encode()),
        sent_bytes=sent, ack_bytes=acks, batches=sender.stats.batches_sent, wall=wall, cpu=cpu,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuReference:
    """CPU seconds for the same URLs without the cluster: a set, and LMDB puts of their dedup keys."""

    urls: int
    set_add: float
    lmdb_put: float  # one write transaction per batch, no fsync
    lmdb_put_sync: float  # the same with an fsync after each transaction, as the receiver does

    def ms_per_1000(self, seconds: float) -> float:
        return seconds / self.urls * 1e6


def cpu_reference(tmp: Path, items: Sequence[QueuedUrl], batch_size: int = 500, repeats: int = 3) -> CpuReference:
    """Best of `repeats` (the least disturbed by other work on the machine) for each reference."""
    urls = [item.url for item in items]
    keys = queued_url_keys(items)

    def set_add() -> None:
        seen: set[str] = set()
        for url in urls:
            seen.add(url)

    def lmdb_put(path: Path, sync: bool) -> None:
        env = lmdb.open(str(path), map_size=MAP_SIZE, sync=False, metasync=False, readahead=False)
        try:
            start = time.process_time()
            for batch in _chunks(keys, batch_size):
                with env.begin(write=True) as txn:
                    for key in batch:
                        txn.put(key, b"")
                if sync:
                    env.sync(True)
            return time.process_time() - start
        finally:
            env.close()

    def best(run: Callable[[int], float]) -> float:
        return min(run(i) for i in range(repeats))

    def time_set(_: int) -> float:
        start = time.process_time()
        set_add()
        return time.process_time() - start

    return CpuReference(
        urls=len(items),
        set_add=best(time_set),
        lmdb_put=best(lambda i: lmdb_put(tmp / f"ref-put-{i}", False)),
        lmdb_put_sync=best(lambda i: lmdb_put(tmp / f"ref-sync-{i}", True)),
    )


# == 3: membership view changes ====================================================================================


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewChangeRun:
    """Seconds from join() / leave() until every node's view shows the change, one value per repetition."""

    nodes: int  # cluster size including the node that joins and leaves
    joins: tuple[float, ...]
    leaves: tuple[float, ...]


class _Member:
    """A Membership over TCP on 127.0.0.1 (port 0), running under its own cancel scope so it can be stopped."""

    def __init__(self, node_id: str, seed: int) -> None:
        self.m = Membership(node_id=node_id, weight=100, secret=SECRET, transport=TcpTransport("127.0.0.1:0"),
                            rng=random.Random(seed))
        self.scope = trio.CancelScope()

    async def start(self, nursery: trio.Nursery) -> None:
        async def host(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with self.scope:
                async with trio.open_nursery() as inner:
                    await inner.start(self.m.run)
                    task_status.started()

        await nursery.start(host)


def _state(view: View, node_id: str) -> MemberState | None:
    member = view.member(node_id)
    return None if member is None else member.state


class _Arrival:
    """Records when each of `observers` first sees `node_id` in `state` (through view callbacks, so no polling)."""

    def __init__(self, observers: Sequence[_Member], node_id: str, state: MemberState) -> None:
        self._count = len(observers)
        self._node_id = node_id
        self._state = state
        self.seen: dict[str, float] = {}
        self._everyone = trio.Event()
        self._unsubscribe = [o.m.subscribe(lambda view, o=o: self._check(o, view)) for o in observers]
        for observer in observers:
            self._check(observer, observer.m.view)

    def _check(self, observer: _Member, view: View) -> None:
        if observer.m.node_id not in self.seen and _state(view, self._node_id) is self._state:
            self.seen[observer.m.node_id] = trio.current_time()
            if len(self.seen) == self._count:
                self._everyone.set()

    async def wait(self, start: float) -> float:
        """Seconds from `start` until the last observer saw it."""
        try:
            with trio.fail_after(60):
                await self._everyone.wait()
        finally:
            for cancel in self._unsubscribe:
                cancel()
        return max(self.seen.values()) - start


def _converged(members: Sequence[_Member]) -> bool:
    first = members[0].m.view
    return all(m.m.view.epoch == first.epoch and m.m.view.members == first.members for m in members)


def run_view_changes(nodes: int, repetitions: int) -> ViewChangeRun:
    return trio.run(_view_changes, nodes, repetitions)


async def _view_changes(nodes: int, repetitions: int) -> ViewChangeRun:
    if nodes < 2:
        raise ValueError("a view change needs at least 2 nodes")
    joins: list[float] = []
    leaves: list[float] = []
    async with trio.open_nursery() as nursery:
        members = [_Member(f"node-{i:02d}", i) for i in range(nodes - 1)]
        for member in members:
            await member.start(nursery)
        for member in members[1:]:
            with trio.fail_after(30):
                await member.m.join(members[0].m.address)
        await wait_for(lambda: _converged(members) and len(members[0].m.view.members) == len(members), 60.0,
                       f"{nodes - 1}-node cluster converged")
        for rep in range(repetitions):
            newcomer = _Member(f"new-{rep}", 1000 + rep)
            await newcomer.start(nursery)
            seed = members[rep % len(members)]
            arrival = _Arrival([*members, newcomer], newcomer.m.node_id, MemberState.ALIVE)
            start = trio.current_time()
            with trio.fail_after(30):
                await newcomer.m.join(seed.m.address)
            joins.append(await arrival.wait(start))
            await wait_for(lambda: _converged([*members, newcomer]), 60.0, "views agree after the join")
            arrival = _Arrival(members, newcomer.m.node_id, MemberState.LEAVING)
            start = trio.current_time()
            await newcomer.m.leave()  # sends LEAVING to everyone, then says Goodbye on every link
            leaves.append(await arrival.wait(start))
            await wait_for(lambda: _converged(members), 60.0, "views agree after the leave")
            await trio.sleep(0.5)  # let the leave's own gossip die down before the next change
            newcomer.scope.cancel()
        nursery.cancel_scope.cancel()
    return ViewChangeRun(nodes=nodes, joins=tuple(joins), leaves=tuple(leaves))


def run_ping_rtt(count: int) -> list[float]:
    """Seconds per Ping/Pong round trip over one PeerLinks link on TCP loopback, `count` of them after a warm-up."""
    return trio.run(_ping_rtt, count)


async def _ping_rtt(count: int) -> list[float]:
    pongs: dict[int, trio.Event] = {}

    async def on_a(peer_id: str, message: Message) -> None:
        if isinstance(message, Pong) and message.seq in pongs:
            pongs[message.seq].set()

    async def on_b(peer_id: str, message: Message) -> None:
        if isinstance(message, Ping):
            links_b.send_nowait(peer_id, Pong(seq=message.seq, epoch=0))

    links_a = PeerLinks(node_id="a", secret=SECRET, transport=TcpTransport("127.0.0.1:0"), on_message=on_a,
                        rng=random.Random(1))
    links_b = PeerLinks(node_id="b", secret=SECRET, transport=TcpTransport("127.0.0.1:0"), on_message=on_b,
                        rng=random.Random(2))
    times: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(links_a.run)
        address_b = await nursery.start(links_b.run)
        links_a.link("b", address_b)
        await wait_for(lambda: links_a.get("b").connected, 10.0, "link a-b up")
        warm_up = 20
        for seq in range(warm_up + count):
            pong = pongs[seq] = trio.Event()
            start = trio.current_time()
            links_a.send_nowait("b", Ping(seq=seq, epoch=0))
            with trio.fail_after(10):
                await pong.wait()
            del pongs[seq]
            if seq >= warm_up:
                times.append(trio.current_time() - start)
        nursery.cancel_scope.cancel()
    return times


# == 4: hand-off to a newly joined node =============================================================================


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffRun:
    """A hand-off from a to b (who joined, equal weight) of what a holds in the arcs b gains."""

    urls: int  # queued URLs on a before the change
    hosts: int
    urls_moved: int
    hosts_moved: int
    keys_sent: int  # seen keys sent besides those of the queued URLs (the queued URLs' keys travel with them)
    chunks: int
    bytes_sent: int  # a's socket writes after the handshake
    view_changed_sender: float  # wall seconds of a's view_changed (diff of the rings, arc scans, chunking)
    view_changed_receiver: float  # wall seconds of b's view_changed (diff of the rings)
    streaming: float  # wall seconds from the end of view_changed to the last ack applied and the arcs dropped at a
    cpu_streaming: float  # process CPU seconds over the streaming (both nodes)
    reference_admit: float  # wall seconds of store.admit of the moved URLs into a fresh store, chunks of 2,000
    released_early: int  # b's waits for a transfer that ran out (HandoffConfig.wait) before the transfer ended

    @property
    def total(self) -> float:
        return self.view_changed_sender + self.view_changed_receiver + self.streaming


def handoff_items(urls: int, hosts: int, seed: int = 3) -> list[QueuedUrl]:
    """`urls` distinct queued URLs spread evenly over `hosts` hosts; each found on an earlier URL of its host."""
    rng = random.Random(seed)
    names = distinct_hosts(rng, hosts)
    found = unique_urls(rng, names, urls)
    return [
        QueuedUrl(url=url, host=names[i % hosts], depth=rng.randint(1, 12),
                  found_on=found[i - hosts] if i >= hosts else f"https://{names[i % hosts]}/")
        for i, url in enumerate(found)
    ]


def run_handoff(tmp: Path, items: Sequence[QueuedUrl]) -> HandoffRun:
    """Fill a with `items`, let b join, and time the hand-off as `Handoff.run` does it with the default config."""
    return trio.run(_handoff, tmp, items)


async def _handoff(tmp: Path, items: Sequence[QueuedUrl]) -> HandoffRun:
    old, new = Ring({"a": WEIGHTS["a"]}), Ring(WEIGHTS)
    moved = [item for item in items if new.owner(item.host) == "b"]
    hosts = sorted({item.host for item in items})
    wall = time.time()
    rng = random.Random(4)
    states = [HostState(host=host, next_allowed=wall + rng.uniform(0, 30), crawl_delay=rng.choice([0.0, 1.0, 5.0]),
                        failures=rng.choice([0, 0, 0, 1])) for host in hosts]
    # the reference: the same URLs admitted into a fresh store, in chunks as big as the hand-off's URL chunks
    with NodeStore.open(tmp / "reference", map_size=MAP_SIZE) as reference:
        start = time.perf_counter()
        for chunk in _chunks(moved, HandoffConfig().urls_per_chunk):
            reference.admit(chunk)
        reference_admit = time.perf_counter() - start
    with (
        NodeStore.open(tmp / "a", map_size=MAP_SIZE) as store_a,
        NodeStore.open(tmp / "b", map_size=MAP_SIZE) as store_b,
    ):
        for chunk in _chunks(items, 5_000):
            store_a.admit(chunk)
        store_a.frontier.put_states(states)
        store_a.sync()
        done = trio.Event()
        transport_a = CountingTransport()

        def finished() -> bool:
            return handoff_a.outstanding() == 0 and not handoff_b.pending_arcs()

        async def on_a(peer_id: str, message: Message) -> None:
            await handoff_a.on_message(peer_id, message)
            if started and finished():
                done.set()

        async def on_b(peer_id: str, message: Message) -> None:
            await handoff_b.on_message(peer_id, message)

        started = False
        links_a = PeerLinks(node_id="a", secret=SECRET, transport=transport_a, on_message=on_a, rng=random.Random(1))
        links_b = PeerLinks(node_id="b", secret=SECRET, transport=TcpTransport("127.0.0.1:0"), on_message=on_b,
                            rng=random.Random(2))
        handoff_a = Handoff("a", store_a, links_a)
        handoff_b = Handoff("b", store_b, links_b)
        async with trio.open_nursery() as nursery:
            await nursery.start(links_a.run)
            address_b = await nursery.start(links_b.run)
            links_a.link("b", address_b)
            await wait_for(lambda: links_a.get("b").connected, 10.0, "link a-b up")
            await nursery.start(handoff_a.run)
            await nursery.start(handoff_b.run)
            written = transport_a.counter.written
            start = time.perf_counter()
            handoff_a.view_changed(1, old, new)
            vc_sender = time.perf_counter() - start
            start = time.perf_counter()
            handoff_b.view_changed(1, old, new)
            vc_receiver = time.perf_counter() - start
            started = True
            cpu_start, start = time.process_time(), time.perf_counter()
            if finished():
                done.set()
            with trio.fail_after(LIMIT):
                await done.wait()
            streaming = time.perf_counter() - start
            cpu_streaming = time.process_time() - cpu_start
            chunks = handoff_a.chunks_sent  # made as the window opens, so counted once all are sent
            bytes_sent = transport_a.counter.written - written
            nursery.cancel_scope.cancel()
        if len(store_b.frontier) != len(moved) or len(store_a.frontier) != len(items) - len(moved):
            raise AssertionError(
                f"b holds {len(store_b.frontier)} queued URLs, a {len(store_a.frontier)}; expected {len(moved)} "
                f"and {len(items) - len(moved)}"
            )
        hosts_moved = sum(1 for _ in store_b.frontier.states())
    return HandoffRun(
        urls=len(items), hosts=len(hosts), urls_moved=len(moved), hosts_moved=hosts_moved,
        keys_sent=handoff_a.keys_sent, chunks=chunks, bytes_sent=bytes_sent, view_changed_sender=vc_sender,
        view_changed_receiver=vc_receiver, streaming=streaming, cpu_streaming=cpu_streaming,
        reference_admit=reference_admit, released_early=handoff_b.waits_expired,
    )


# == printing =======================================================================================================


def print_wire(runs: Sequence[DispatchRun]) -> None:
    first = runs[0]
    ref = first.per_url(first.url_bytes)
    print(f"1. URL batches on the wire: {first.urls:,} URLs a -> b over TCP 127.0.0.1, payload bytes written to "
          "the socket")
    print(f"   reference: newline-joined URLs, {ref:.1f} bytes/URL (each entry also carries depth, hops, found_on)")
    print(f"   {'codec':<8} {'batch':>5} {'batches':>7} {'bytes/URL':>9} {'vs ref':>6} {'ack bytes/URL':>13}")
    for run in runs:
        per = run.per_url(run.sent_bytes)
        print(f"   {run.codec:<8} {run.batch_size:>5} {run.batches:>7} {per:>9.1f} {per / ref:>6.2f} "
              f"{run.per_url(run.ack_bytes):>13.2f}")


def print_cpu(run: DispatchRun, ref: CpuReference) -> None:
    print(f"\n2. CPU per 1,000 dispatched URLs: {run.urls:,} URLs, {run.codec}, batches of {run.batch_size}, "
          f"both nodes in this process (time.process_time)")
    base, put = ref.ms_per_1000(ref.set_add), ref.ms_per_1000(ref.lmdb_put)
    sender = run.cpu.get(SENDER_ROUTE, 0.0) + run.cpu.get(SENDER_BATCH, 0.0) + run.cpu.get(SENDER_ACKS, 0.0)
    parts = sender + run.cpu.get(RECEIVER, 0.0)
    rows = [
        (SENDER_ROUTE, run.ms_per_1000(SENDER_ROUTE)),
        (SENDER_BATCH, run.ms_per_1000(SENDER_BATCH)),
        (SENDER_ACKS, run.ms_per_1000(SENDER_ACKS)),
        ("sender, total of the above", sender / run.urls * 1e6),
        (RECEIVER, run.ms_per_1000(RECEIVER)),
        ("links: encode, decode, sockets, trio (both nodes)", (run.cpu["process"] - parts) / run.urls * 1e6),
        ("whole process (both nodes)", run.ms_per_1000("process")),
        ("reference: set.add", base),
        ("reference: LMDB put of the keys, a txn per batch", put),
        ("  (the same with an fsync per batch)", ref.ms_per_1000(ref.lmdb_put_sync)),
    ]
    print(f"   {'part':<52} {'ms/1000':>8} {'x set.add':>9} {'x LMDB put':>10}")
    for label, ms in rows:
        print(f"   {label:<52} {ms:>8.2f} {ms / base:>9.1f} {ms / put:>10.2f}")
    print(f"   end to end: {run.urls / run.wall:,.0f} URLs/s ({run.wall:.2f} s wall)")


def print_membership(runs: Sequence[ViewChangeRun], rtt: Sequence[float]) -> None:
    ping = statistics.median(rtt)
    print(f"\n3. View changes over TCP loopback, default MembershipConfig, {len(runs[0].joins)} repetitions "
          f"(N includes the node that joins and leaves)")
    print(f"   reference: Ping/Pong round trip over one link, median {ping * 1e6:.0f} us (min {min(rtt) * 1e6:.0f} us, "
          f"{len(rtt)} round trips)")
    print(f"   {'N':>3} {'join median':>11} {'join max':>9} {'x RTT':>7} {'leave median':>12} {'leave max':>9} "
          f"{'x RTT':>7}")
    for run in runs:
        join, join_max = spread(run.joins)
        leave, leave_max = spread(run.leaves)
        print(f"   {run.nodes:>3} {join * 1e3:>9.0f}ms {join_max * 1e3:>7.0f}ms {join / ping:>7.0f} "
              f"{leave * 1e3:>10.1f}ms {leave_max * 1e3:>7.1f}ms {leave / ping:>7.1f}")


def print_handoff(run: HandoffRun) -> None:
    print(f"\n4. Hand-off to a new node of equal weight: {run.urls:,} queued URLs on {run.hosts:,} hosts at a; "
          f"b joins and gains {run.urls_moved:,} URLs on {run.hosts_moved:,} hosts (Handoff.run, default config)")
    ref_rate = run.urls_moved / run.reference_admit
    rate = run.urls_moved / run.streaming
    rows = [
        ("reference: store.admit of the same URLs into a fresh store", f"{run.reference_admit:.2f} s",
         f"{ref_rate:,.0f} URLs/s"),
        ("view_changed at a (ring diff, plan; chunks made while streaming)", f"{run.view_changed_sender:.2f} s", ""),
        ("view_changed at b (ring diff)", f"{run.view_changed_receiver:.2f} s", ""),
        ("streaming: from view_changed to the last ack, arcs dropped", f"{run.streaming:.2f} s",
         f"{rate:,.0f} URLs/s, {rate / ref_rate:.3f} x ref"),
        ("  CPU over the streaming, both nodes", f"{run.cpu_streaming:.2f} s", ""),
        ("view change to done", f"{run.total:.2f} s", f"{run.urls_moved / run.total:,.0f} URLs/s"),
        ("chunks", f"{run.chunks:,}", f"{run.bytes_sent / run.urls_moved:.1f} bytes/URL on a's socket"),
        ("seen keys sent besides the queued URLs' own", f"{run.keys_sent:,}", ""),
    ]
    for label, value, note in rows:
        print(f"   {label:<56} {value:>9}  {note}")
    if run.released_early:
        print(f"   b stopped waiting after HandoffConfig.wait ({HandoffConfig().wait:.0f} s) and released gained arcs "
              "before their last chunk arrived")


# == main ===========================================================================================================


@dataclass(frozen=True, slots=True)
class Sizes:
    wire_urls: int
    cpu_urls: int
    nodes: tuple[int, ...]
    repetitions: int
    rtt_count: int
    handoff_urls: int
    handoff_hosts: int


FULL = Sizes(wire_urls=20_000, cpu_urls=100_000, nodes=(4, 8, 16), repetitions=5, rtt_count=200,
             handoff_urls=100_000, handoff_hosts=2_000)
QUICK = Sizes(wire_urls=6_000, cpu_urls=10_000, nodes=(4, 8, 16), repetitions=3, rtt_count=100,
              handoff_urls=10_000, handoff_hosts=200)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes: 6k URLs on the wire, 10k for CPU, 3 repetitions, 10k URLs on 200 hosts "
                             "for the hand-off")
    parser.add_argument("--only", choices=["wire", "cpu", "membership", "handoff"], action="append",
                        help="run only these parts (repeatable)")
    args = parser.parse_args(argv)
    # the parts' own warnings (a hand-off wait running out, say) belong in the output, marked as such
    logging.basicConfig(level=logging.WARNING, format="   [log %(name)s] %(message)s")
    sizes = QUICK if args.quick else FULL
    parts = args.only or ["wire", "cpu", "membership", "handoff"]
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as where:
        tmp = Path(where)
        if "wire" in parts:
            ring, items = dispatch_items(sizes.wire_urls)
            runs = [run_dispatch(tmp / f"wire-{codec}-{size}", ring, items, codec=codec, batch_size=size)
                    for codec in ("msgpack", "json") for size in (100, 500, 2000)]
            print_wire(runs)
        if "cpu" in parts:
            ring, items = dispatch_items(sizes.cpu_urls, seed=2)
            run = run_dispatch(tmp / "cpu", ring, items)
            print_cpu(run, cpu_reference(tmp, items))
        if "membership" in parts:
            rtt = run_ping_rtt(sizes.rtt_count)
            print_membership([run_view_changes(n, sizes.repetitions) for n in sizes.nodes], rtt)
        if "handoff" in parts:
            items = handoff_items(sizes.handoff_urls, sizes.handoff_hosts)
            print_handoff(run_handoff(tmp / "handoff", items))


if __name__ == "__main__":
    main()
