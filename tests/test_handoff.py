"""Arc hand-off between two nodes over a fake link layer, under MockClock.

The rings use one point per node so that arcs are wide: with node "b0" joining "a", the arc that moves wraps
through position 0, so every test here also exercises the wrapping arc.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
import trio

from peer.cluster.replicas.queuereplicas import QueueAlone, QueueReplicas
from peer.cluster.handoff.handoff import Alone, Handoff, HandoffConfig, handoff_arcs, plan_view
from peer.cluster.net.peerlinks import PeerLinks
from peer.cluster.net.memtransport import MemoryNetwork
from peer.cluster.core.termination import LEFT_GRACE, Termination
from protocol import HandoffAck, HandoffAsk, HandoffChunk, Limits, Message, QueueReplica, decode_body, encode_body
from ring import RING_SPACE, ArcMove, MemberState, Ring, View, diff, host_position
from storage import HostState, NodeStore, QueuedUrl, in_arc, queued_url_keys, url_key

OLD = Ring({"a": 1}, points_per_weight=1)
NEW = Ring({"a": 1, "b0": 1}, points_per_weight=1)
WALL0 = 1_700_000_000.0
CONFIG = HandoffConfig(keys_per_chunk=50, urls_per_chunk=40, hosts_per_chunk=30, resend_after=5.0, interval=0.2)


def wall() -> float:
    return WALL0 + trio.current_time()


class Net:
    """Delivers messages between Handoffs after `delay`, dropping those `drop(sender, peer, message)` picks."""

    def __init__(self, nursery: trio.Nursery, delay: float = 0.01) -> None:
        self.nursery = nursery
        self.delay = delay
        self.nodes: dict[str, Handoff] = {}
        self.drop = lambda sender, peer, message: False
        self.log: list[tuple[str, str, Message]] = []

    def links(self, me: str) -> _Link:
        return _Link(self, me)

    def send(self, sender: str, peer: str, message: Message) -> bool:
        self.log.append((sender, peer, message))
        if not self.drop(sender, peer, message):
            self.nursery.start_soon(self._deliver, sender, peer, message)
        return True

    async def _deliver(self, sender: str, peer: str, message: Message) -> None:
        await trio.sleep(self.delay)
        node = self.nodes.get(peer)
        if node is not None:
            await node.on_message(sender, message)


class _Link:
    def __init__(self, net: Net, me: str) -> None:
        self.net, self.me = net, me

    def send_nowait(self, peer_id: str, message: Message) -> bool:
        return self.net.send(self.me, peer_id, message)


def fill(store: NodeStore, hosts: int = 120, per_host: int = 3) -> tuple[list[QueuedUrl], list[bytes]]:
    """Queue `per_host` URLs per host, mark two fetched URLs per host seen, and give every host a state."""
    items = [
        QueuedUrl(url=f"http://h{i}.example/p{j}", host=f"h{i}.example", depth=1, hops=0,
                  found_on=f"http://h{i}.example/")
        for i in range(hosts) for j in range(per_host)
    ]
    assert len(store.admit(items)) == len(items)
    fetched = [url_key(host_position(f"h{i}.example"), f"http://h{i}.example/done{j}") for i in range(hosts) for j in range(2)]
    store.dedup.insert(fetched)
    store.frontier.put_states(
        [HostState(host=f"h{i}.example", next_allowed=WALL0 + 7.0, crawl_delay=2.0, failures=i % 3) for i in range(hosts)]
    )
    store.sync()
    return items, fetched


def moved_arc() -> tuple[int, int]:
    (arc,) = handoff_arcs(diff(OLD, NEW))
    return arc.start, arc.end


def moves(position: int) -> bool:
    return in_arc(position, *moved_arc())


def queued(store: NodeStore) -> Counter[tuple[str, str, int, int, str | None]]:
    items, _ = store.frontier.export_arc(0, 0)
    return Counter((i.url, i.host, i.depth, i.hops, i.found_on) for i in items)


@pytest.fixture
def stores(tmp_path):
    a = NodeStore.open(tmp_path / "a", map_size=1 << 24)
    b = NodeStore.open(tmp_path / "b", map_size=1 << 24)
    yield a, b
    a.close()
    b.close()


def test_handoff_arcs_joins_the_two_ends_of_a_wrapping_move() -> None:
    moves_ = [
        ArcMove(start=0, end=10, previous="a", next="b"),
        ArcMove(start=50, end=60, previous="a", next="c"),
        ArcMove(start=100, end=RING_SPACE, previous="a", next="b"),
    ]
    assert handoff_arcs(moves_) == [
        ArcMove(start=100, end=10, previous="a", next="b"),
        ArcMove(start=50, end=60, previous="a", next="c"),
    ]
    whole = [ArcMove(start=0, end=RING_SPACE, previous="a", next="b")]
    assert handoff_arcs(whole) == [ArcMove(start=0, end=0, previous="a", next="b")]
    start, end = moved_arc()
    assert end < start  # the arc these tests move wraps through zero


async def test_every_url_and_key_arrives_once_and_leaves_the_old_owner_after_the_ack(stores, autojump_clock):
    store_a, store_b = stores
    items, fetched = fill(store_a)
    moving = Counter((i.url, i.host, i.depth, i.hops, i.found_on) for i in items if moves(host_position(i.host)))
    staying = Counter((i.url, i.host, i.depth, i.hops, i.found_on) for i in items if not moves(host_position(i.host)))
    assert moving and staying
    moving_keys = {k for k in set(store_a.dedup.scan(0, 0)) if moves(int.from_bytes(k[:8], "big"))}
    async with trio.open_nursery() as nursery:
        net = Net(nursery)
        a = net.nodes["a"] = Handoff("a", store_a, net.links("a"), config=CONFIG, wall_clock=wall)
        b = net.nodes["b0"] = Handoff("b0", store_b, net.links("b0"), config=CONFIG, wall_clock=wall)
        lost = a.view_changed(1, OLD, NEW)
        assert [(m.start, m.end) for m in lost] == [moved_arc()] == a.lost_arcs()
        assert all(a.lost(host_position(i.host)) == moves(host_position(i.host)) for i in items)
        assert list(b.view_changed(1, OLD, NEW)) == []
        assert b.pending_arcs() == [moved_arc()]
        host_in = next(i.host for i in items if moves(host_position(i.host)))
        host_out = next(i.host for i in items if not moves(host_position(i.host)))
        assert b.blocked(host_position(host_in)) and not b.blocked(host_position(host_out))
        # Acks are held back: the old owner keeps everything until they arrive.
        net.drop = lambda sender, peer, message: isinstance(message, HandoffAck)
        a.pump()
        await trio.sleep(1.0)
        assert a.outstanding() > 0
        assert queued(store_a) == moving + staying
        assert queued(store_b) == moving
        assert b.pending_arcs() == []  # every chunk is applied: the new owner may fetch
        net.drop = lambda sender, peer, message: False
        await nursery.start(a.run)
        await trio.sleep(CONFIG.resend_after + 1.0)
        assert a.outstanding() == 0 and a.transfers_completed == 1
        assert a.chunks_resent > 0  # the unacked chunks went again; the receiver applied them only once
        assert queued(store_b) == moving
        assert queued(store_a) == staying
        assert set(store_b.dedup.scan(0, 0)) == moving_keys
        # the keys of the moved queued URLs left with them; those of fetched pages stay, deciding nothing here
        # while the arc is elsewhere (and sparing a fetch if it comes back before they do)
        left_here = {k for k in store_a.dedup.scan(0, 0) if moves(int.from_bytes(k[:8], "big"))}
        assert left_here == {k for k in fetched if moves(int.from_bytes(k[:8], "big"))} and left_here
        nursery.cancel_scope.cancel()
    sent = [m for _, _, m in net.log if isinstance(m, HandoffChunk)]
    assert all(len(m.seen_keys) <= CONFIG.keys_per_chunk and len(m.urls) <= CONFIG.urls_per_chunk for m in sent)
    assert sum(1 for m in sent if m.last) >= 1


async def test_host_states_travel_as_durations(stores, autojump_clock):
    store_a, store_b = stores
    fill(store_a, hosts=40)
    async with trio.open_nursery() as nursery:
        net = Net(nursery, delay=3.0)
        a = net.nodes["a"] = Handoff("a", store_a, net.links("a"), config=CONFIG, wall_clock=wall)
        net.nodes["b0"] = Handoff("b0", store_b, net.links("b0"), config=CONFIG, wall_clock=wall)
        a.view_changed(1, OLD, NEW)
        a.pump()
        chunk = next(m for _, _, m in net.log if isinstance(m, HandoffChunk) and m.hosts)
        assert {h.ready_in for h in chunk.hosts} == {7.0} and {h.crawl_delay for h in chunk.hosts} == {2.0}
        await trio.sleep(4.0)
        nursery.cancel_scope.cancel()
    states = list(store_b.frontier.states())
    assert states and all(moves(host_position(s.host)) for s in states)
    # sent at wall 0 with 7 s to wait and applied 3 s later: the transit time only makes it later (safe)
    assert {s.next_allowed for s in states} == {WALL0 + 3.0 + 7.0}
    assert {s.crawl_delay for s in states} == {2.0}
    assert {s.failures for s in states} <= {0, 1, 2}


async def test_a_lost_chunk_is_resent_after_the_timeout(stores, autojump_clock):
    store_a, store_b = stores
    items, _ = fill(store_a)
    moving = Counter((i.url, i.host, i.depth, i.hops, i.found_on) for i in items if moves(host_position(i.host)))
    staying = Counter((i.url, i.host, i.depth, i.hops, i.found_on) for i in items if not moves(host_position(i.host)))
    dropped: list[int] = []

    def drop_seq_one_once(sender: str, peer: str, message: Message) -> bool:
        if isinstance(message, HandoffChunk) and message.chunk_seq == 1 and not dropped:
            dropped.append(1)
            return True
        return False

    async with trio.open_nursery() as nursery:
        net = Net(nursery)
        net.drop = drop_seq_one_once
        a = net.nodes["a"] = Handoff("a", store_a, net.links("a"), config=CONFIG, wall_clock=wall)
        b = net.nodes["b0"] = Handoff("b0", store_b, net.links("b0"), config=CONFIG, wall_clock=wall)
        a.view_changed(1, OLD, NEW)
        b.view_changed(1, OLD, NEW)
        await nursery.start(a.run)
        await trio.sleep(CONFIG.resend_after - 0.5)
        assert dropped and a.outstanding() == 1 and a.chunks_resent == 0
        assert queued(store_a) == moving + staying  # the last chunk was acked, chunk 1 not: nothing is dropped
        assert b.pending_arcs() == [moved_arc()]  # chunk 1 is missing: the arc stays blocked
        await trio.sleep(1.0)
        assert a.chunks_resent == 1 and a.outstanding() == 0 and a.transfers_completed == 1
        assert b.pending_arcs() == []
        nursery.cancel_scope.cancel()
    assert queued(store_b) == moving


async def test_a_restarted_receiver_keeps_applied_chunks(tmp_path, autojump_clock):
    store_a = NodeStore.open(tmp_path / "a", map_size=1 << 24)
    store_b = NodeStore.open(tmp_path / "b", map_size=1 << 24)
    items, _ = fill(store_a)
    moving = Counter((i.url, i.host, i.depth, i.hops, i.found_on) for i in items if moves(host_position(i.host)))
    try:
        async with trio.open_nursery() as nursery:
            net = Net(nursery)
            net.drop = lambda sender, peer, message: isinstance(message, HandoffAck)  # every ack lost
            a = net.nodes["a"] = Handoff("a", store_a, net.links("a"), config=CONFIG, wall_clock=wall)
            net.nodes["b0"] = Handoff("b0", store_b, net.links("b0"), config=CONFIG, wall_clock=wall)
            a.view_changed(1, OLD, NEW)
            await nursery.start(a.run)
            await trio.sleep(1.0)
            applied = net.nodes["b0"].chunks_applied
            assert applied > 0 and a.outstanding() == applied
            # the receiver dies and comes back from its store
            del net.nodes["b0"]
            store_b.close()
            store_b = NodeStore.open(tmp_path / "b", map_size=1 << 24)
            assert queued(store_b) == moving
            net.drop = lambda sender, peer, message: False
            b = net.nodes["b0"] = Handoff("b0", store_b, net.links("b0"), config=CONFIG, wall_clock=wall)
            await trio.sleep(CONFIG.resend_after + 1.0)
            assert a.outstanding() == 0 and a.transfers_completed == 1
            assert b.chunks_applied == applied  # re-applied after the restart, idempotently
            nursery.cancel_scope.cancel()
        assert queued(store_b) == moving
        assert not any(moves(host_position(h)) for h, _ in store_a.frontier.hosts())
    finally:
        store_a.close()
        store_b.close()


async def test_a_refused_send_is_tried_at_the_next_tick(stores, autojump_clock):
    store_a, _ = stores
    fill(store_a, hosts=20)

    class Full:
        def __init__(self) -> None:
            self.accept = False
            self.sent: list[Message] = []

        def send_nowait(self, peer_id: str, message: Message) -> bool:
            if self.accept:
                self.sent.append(message)
            return self.accept

    links = Full()
    a = Handoff("a", store_a, links, config=CONFIG, wall_clock=wall)
    a.view_changed(1, OLD, NEW)
    a.pump()
    assert links.sent == [] and a.chunks_sent == 0
    links.accept = True
    a.pump()
    assert [m.chunk_seq for m in links.sent] == list(range(len(links.sent))) and a.chunks_sent == len(links.sent)


def test_a_dead_previous_owner_blocks_nothing_and_abandon_unblocks(stores) -> None:
    _, store_b = stores
    b = Handoff("b0", store_b, _Link.__new__(_Link))
    b.view_changed(1, OLD, NEW, gone=["a"])
    assert b.pending_arcs() == []
    b.view_changed(2, OLD, NEW)
    assert b.pending_arcs() == [moved_arc()]
    b.abandon("a")
    assert b.pending_arcs() == [] and not b.blocked(moved_arc()[0])


class _Acks:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []

    def send_nowait(self, peer_id: str, message: Message) -> bool:
        self.sent.append((peer_id, message))
        return True


async def test_a_transfer_to_a_ring_adopted_later_releases_what_older_rings_still_wait_for(stores) -> None:
    """A joiner's first ring still holds a leaving node (c), so it waits for arcs from a; a's empty transfer
    labelled with the ring without c arrived first. Adopting that ring must release the wait on a at once,
    although a hands the joiner nothing in it."""
    _, store_e = stores
    links = _Acks()
    e = Handoff("e", store_e, links)
    before = Ring({"a": 1, "c": 1}, points_per_weight=8)
    with_c = Ring({"a": 1, "c": 1, "e": 1}, points_per_weight=8)
    without_c = Ring({"a": 1, "e": 1}, points_per_weight=8)
    # a: "nothing more from me up to the ring without c" (an empty, complete transfer labelled 2)
    await e.on_message("a", HandoffChunk(transfer_id=1, chunk_seq=0, epoch=2, arc_start=0, arc_end=0, urls=(),
                                         seen_keys=(), hosts=(), last=True))
    assert links.sent == [("a", HandoffAck(transfer_id=1, chunk_seq=0))]
    e.view_changed(1, Ring({"e": 1}, points_per_weight=8), with_c, gains_from=before)
    from_a = [p for p in range(0, RING_SPACE, RING_SPACE // 256)
              if with_c.owner_at(p) == "e" and before.owner_at(p) == "a"]
    assert from_a and all(e.blocked(p) for p in from_a)  # the first ring waits for a
    e.view_changed(2, with_c, without_c)
    assert not any(e.blocked(p) for p in from_a)


async def test_a_node_that_saw_other_rings_is_asked_and_releases_the_waiter_with_an_empty_transfer(
        stores, autojump_clock) -> None:
    """e went from ring X straight to Z and waits for arcs from a; a went X, Y, Z and handed them to e under Y
    (a ring e never adopted). a sends nobody anything at Z (its arcs stay where Y put them); e asks a after
    `ask_after`, and a's answer, an empty transfer labelled Z, releases e long before `wait` runs out."""
    store_a, store_e = stores
    x = Ring({"a": 1, "c": 1}, points_per_weight=8)
    y = Ring({"a": 1, "c": 1, "e": 1}, points_per_weight=8)
    z = Ring({"a": 1, "e": 1, "f": 1}, points_per_weight=8)
    from_a = [p for p in range(0, RING_SPACE, RING_SPACE // 256) if z.owner_at(p) == "e" and x.owner_at(p) == "a"]
    a_out, e_out = Recorder(), Recorder()
    config = HandoffConfig(ask_after=0.25, wait=30.0)
    a = Handoff("a", store_a, a_out, config=config)
    e = Handoff("e", store_e, e_out, config=config)
    a.view_changed(2, x, y)
    a.view_changed(3, y, z)
    e.view_changed(3, x, z)
    assert from_a and all(e.blocked(p) for p in from_a)
    a.pump()
    # a's transfers: only to the owners that gain arcs from it (e under y, f under z), none to "every owner"
    assert {peer for peer, m in a_out.sent if isinstance(m, HandoffChunk)} <= {"e", "f"}
    for peer, m in a_out.sent:  # e applies what a labelled y (a ring it never adopted); everything is acked
        if peer == "e":
            await e.on_message("a", m)
        await a.on_message(peer, HandoffAck(transfer_id=m.transfer_id, chunk_seq=m.chunk_seq))
    a_out.sent.clear()
    e_out.sent.clear()
    assert all(e.blocked(p) for p in from_a)  # labelled y, they release nothing e waits for under z
    for _ in range(4):  # e's waits start at its first pump; it asks once ask_after has passed
        e.pump()
        await trio.sleep(0.1)
    asks = [(peer, m) for peer, m in e_out.sent if isinstance(m, HandoffAsk)]
    # e waits for a and for c (c left between x and z, and nobody declared it dead): it asks each once
    assert sorted(asks) == [("a", HandoffAsk(ring=3)), ("c", HandoffAsk(ring=3))] and e.asks_sent == 2
    await a.on_message("e", HandoffAsk(ring=3))
    a.pump()
    answer = [m for peer, m in a_out.sent if peer == "e" and isinstance(m, HandoffChunk) and m.epoch == 3]
    assert a.asks_answered == 1 and len(answer) == 1 and answer[0].last and not answer[0].urls
    await e.on_message("a", answer[0])
    assert not any(e.blocked(p) for p in from_a) and not e.waits_for("a") and e.waits_expired == 0
    assert trio.current_time() < 1.0  # not the 30 s wait


class Departing(Alone):
    """A delegate whose view holds the nodes `leaving` LEAVING."""

    def __init__(self, node_id: str, leaving: set[str]) -> None:
        super().__init__(node_id)
        self.leaving = leaving

    def departing(self, peer_id: str) -> bool:
        return peer_id in self.leaving


async def test_a_leaving_node_that_still_waits_for_arcs_is_answered_and_hands_off_at_once(stores, autojump_clock):
    """l joined (it waits for its arcs from a, which never adopted the ring with l and so sends it nothing) and
    leaves at once: its transfers wait for the arcs it awaits. It asks a, whose ring no longer holds l; a answers
    the leaving node all the same, so l hands off within a second instead of after `wait` (30 s)."""
    store_a, store_l = stores
    before = Ring({"a": 1}, points_per_weight=8)
    with_l = Ring({"a": 1, "l": 1}, points_per_weight=8)
    config = HandoffConfig(ask_after=0.25, wait=30.0, resend_after=5.0, interval=0.2)
    async with trio.open_nursery() as nursery:
        net = Net(nursery)
        a = net.nodes["a"] = Handoff("a", store_a, net.links("a"), config=config, wall_clock=wall,
                                     delegate=Departing("a", {"l"}))
        l = net.nodes["l"] = Handoff("l", store_l, net.links("l"), config=config, wall_clock=wall)
        a.view_changed(3, before, before)  # a saw l's leave before its join: its ring is the one without l
        l.view_changed(2, Ring({"l": 1}, points_per_weight=8), with_l, gains_from=before)
        assert l.waits_for("a")
        l.view_changed(3, with_l, before)  # l leaves
        assert l.outstanding()  # its transfers to a wait for the arcs l awaits from a
        await nursery.start(a.run)
        await nursery.start(l.run)
        while l.outstanding():
            await trio.sleep(0.1)
        assert trio.current_time() < 1.0  # not the 30 s wait
        assert a.asks_answered == 1 and l.waits_expired == 0 and not l.waits_for("a")
        # l's leave handed its arcs to a; its join's transfer to a (the arcs of its lone first ring) found nothing
        # to send, and a, which gained nothing from l, waited for none: it was not sent
        assert a.transfers_received == 1 and l.transfers_completed == 1 and l.transfers_unneeded == 1
        nursery.cancel_scope.cancel()


async def test_an_answer_a_departed_leaver_never_acknowledged_is_cancelled(stores, autojump_clock) -> None:
    """a answers the ask of l, which is leaving, and l goes before acknowledging it. A node that left causes no
    view change, so the cancel at view changes never comes: the termination's check for departed nodes cancels the
    transfer, and a is idle again (`outstanding` 0) instead of never."""
    store_a, _ = stores
    ring = Ring({"a": 1, "b": 1}, points_per_weight=8)
    a = Handoff("a", store_a, Recorder(), delegate=Departing("a", {"l"}))
    a.view_changed(3, ring, ring)
    await a.on_message("l", HandoffAsk(ring=3))
    a.pump()
    assert a.asks_answered == 1 and a.outstanding() == 1
    view = View().join("a", "10.0.0.1:7400", 1).join("b", "10.0.0.2:7400", 1).join("l", "10.0.0.3:7400", 1)
    view = view.with_member(replace(view.member("l"), incarnation=1, state=MemberState.LEAVING))

    class Links:
        def send_nowait(self, peer_id: str, message: Message, *, address: str | None = None) -> bool:
            return True

        def connected_peers(self) -> list[str]:
            return ["b"]  # l is gone

    class Work:
        stats = None

        def outstanding(self) -> int:
            return 0

    termination = Termination("a", view=lambda: view, members=lambda: (3, ("a", "b")), links=Links(),
                              dispatcher=Work(), handoff=a, crawler=lambda: None, stats=None, queued=lambda: 0,
                              ready=trio.Event())
    termination.release_departed()  # first seen leaving now
    assert a.outstanding() == 1
    await trio.sleep(LEFT_GRACE)
    termination.release_departed()
    assert a.outstanding() == 0


async def test_a_joiner_sends_only_what_it_holds_to_owners_that_gained_nothing_from_it(stores) -> None:
    """A joiner's lone first ring gave it every arc: it "loses" them to their owners at its first real ring, but
    those owners gained nothing from it (the cluster's ring before it had no such node). Its transfers go only
    where it holds something; an owner that asks all the same gets its empty transfer."""
    store_a, store_e = stores
    before = Ring({"a": 1, "b": 1}, points_per_weight=8)
    after = Ring({"a": 1, "b": 1, "e": 1}, points_per_weight=8)
    host = next(f"s{i}.test" for i in range(1000) if after.owner_at(host_position(f"s{i}.test")) == "a")
    store_e.admit([QueuedUrl(url=f"http://{host}/", host=host, depth=0)])  # a seed e was started with
    out = Recorder()
    e = Handoff("e", store_e, out)
    plan = plan_view("e", Ring({"e": 1}, points_per_weight=8), after, gains_from=before)
    assert set(plan.by_peer) == {"a", "b"} and plan.quiet == {"a", "b"} and set(plan.gained) == {"a", "b"}
    assert plan_view("a", before, after).quiet == frozenset()  # a's transfer to e is awaited: never quiet
    e.view_changed(2, Ring({"e": 1}, points_per_weight=8), after, gains_from=before)
    e.pump()
    to = {peer for peer, m in out.sent if isinstance(m, HandoffChunk)}
    assert to == {"a"} and e.transfers_unneeded == 1  # the seed went to a; b heard nothing
    urls = [u.url for peer, m in out.sent if isinstance(m, HandoffChunk) for u in m.urls]
    assert urls == [f"http://{host}/"]
    # b, in a view of its own, waits for e after all and asks: it hears "nothing more from me" (e holds nothing)
    await e.on_message("b", HandoffAsk(ring=2))
    e.pump()
    answer = [m for peer, m in out.sent if peer == "b" and isinstance(m, HandoffChunk)]
    assert len(answer) == 1 and answer[0].last and not answer[0].urls and answer[0].epoch == 2
    assert e.asks_answered == 1


async def test_an_ask_for_a_ring_not_adopted_yet_is_answered_when_it_is(stores) -> None:
    store_a, _ = stores
    out = Recorder()
    a = Handoff("a", store_a, out)
    x = Ring({"a": 1, "c": 1}, points_per_weight=8)
    z = Ring({"a": 1, "c": 1, "e": 1}, points_per_weight=8)
    a.view_changed(1, x, x)  # a holds ring x (nothing moved)
    await a.on_message("e", HandoffAsk(ring=9))  # e is on ring 9 (z), a is not yet
    a.pump()
    assert not [m for peer, m in out.sent if peer == "e"] and a.asks_answered == 0
    a.view_changed(9, x, z)
    a.pump()
    to_e = [m for peer, m in out.sent if peer == "e" and isinstance(m, HandoffChunk)]
    assert to_e and all(m.epoch == 9 for m in to_e) and to_e[-1].last
    assert a.asks_answered == 0  # z gives e arcs of a's: that transfer is the answer, no empty one besides


# -- over PeerLinks and MemoryNetwork ---------------------------------------------------------------------------

SECRET = b"handoff-test-secret-0123456789ab"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
async def test_join_and_leave_over_peer_links_with_link_breaks(tmp_path, seed, autojump_clock):
    """a, b, c (150/80/200) become a, b, d (d joins with 40, c leaves): every host's queue, seen keys and state
    end at its new owner only, through connections that break on 3% of writes."""
    ids = ["a:1", "b:1", "c:1", "d:1"]
    old = Ring({"a:1": 150, "b:1": 80, "c:1": 200}, points_per_weight=20)
    new = Ring({"a:1": 150, "b:1": 80, "d:1": 40}, points_per_weight=20)
    rng = random.Random(seed)
    net = MemoryNetwork(random.Random(seed), delay=0.002, jitter=0.003, break_probability=0.03)
    hosts = [f"s{i}.test" for i in range(300)]
    stores = {i: NodeStore.open(tmp_path / i.replace(":", "_"), map_size=1 << 24) for i in ids}
    expect: dict[str, Counter] = {i: Counter() for i in ids}
    for host in hosts:
        items = [QueuedUrl(url=f"http://{host}/p{j}", host=host, depth=2, hops=0) for j in range(rng.randrange(1, 4))]
        stores[old.owner(host)].admit(items)
        stores[old.owner(host)].dedup.insert([url_key(host_position(host), f"http://{host}/old")])
        stores[old.owner(host)].frontier.put_state(HostState(host=host, next_allowed=WALL0 + 30.0, crawl_delay=1.0))
        expect[new.owner(host)].update((i.url, i.host, i.depth, i.hops, i.found_on) for i in items)
    try:
        async with trio.open_nursery() as nursery:
            handoffs: dict[str, Handoff] = {}
            for k, node_id in enumerate(ids):
                handoff_holder: list[Handoff] = []

                async def on_message(peer_id, message, holder=handoff_holder):
                    await holder[0].on_message(peer_id, message)

                links = PeerLinks(node_id=node_id, secret=SECRET, transport=net.transport(node_id),
                                  on_message=on_message, rng=random.Random(seed * 10 + k))
                handoff = Handoff(node_id, stores[node_id], links, config=HandoffConfig(resend_after=2.0, urls_per_chunk=4, keys_per_chunk=8, hosts_per_chunk=8), wall_clock=wall)
                handoff_holder.append(handoff)
                handoffs[node_id] = handoff
                await nursery.start(links.run)
                for peer in ids:
                    if peer != node_id:
                        links.link(peer, peer)
            for handoff in handoffs.values():
                handoff.view_changed(2, old, new)
                await nursery.start(handoff.run)
            assert handoffs["d:1"].pending_arcs() and all(handoffs["d:1"].blocked(host_position(h))
                                                       for h in hosts if new.owner(h) == "d:1")
            with trio.fail_after(120):
                while any(h.outstanding() or h.pending_arcs() for h in handoffs.values()):
                    await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
        for node_id in ids:
            assert queued(stores[node_id]) == expect[node_id]
            owned = {h for h in hosts if new.owner(h) == node_id}
            keys = list(stores[node_id].dedup.scan(0, 0))
            assert len(keys) == len(set(keys))
            expected_keys = {url_key(host_position(h), u) for u, h, *_ in expect[node_id]}
            expected_keys |= {url_key(host_position(h), f"http://{h}/old") for h in owned}
            # a previous owner keeps the keys of pages it fetched (only the queued URLs' keys left with them)
            expected_keys |= {url_key(host_position(h), f"http://{h}/old") for h in hosts if old.owner(h) == node_id}
            assert set(keys) == expected_keys
            states = list(stores[node_id].frontier.states())
            assert {st.host for st in states} == owned
            assert all(WALL0 + 30.0 <= st.next_allowed <= WALL0 + 31.0 for st in states if old.owner(st.host) != node_id)
        assert net.breaks > 0  # connections did break under the transfers (what they cut off went again)
        pairs = {(m.previous, m.next) for m in handoff_arcs(diff(old, new))}
        # one transfer per (previous, next) owner pair, and no other: nobody waited for a node that owed it nothing
        # (every node saw the same two rings), so nobody asked one for an empty transfer
        assert sum(h.transfers_completed for h in handoffs.values()) == len(pairs)
        assert sum(h.asks_answered for h in handoffs.values()) == 0
    finally:
        for store in stores.values():
            store.close()


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []

    def send_nowait(self, peer_id: str, message: Message) -> bool:
        self.sent.append((peer_id, message))
        return True


async def test_chunks_applied_in_any_order_and_twice_queue_each_url_once(stores, autojump_clock):
    store_a, store_b = stores
    items, _ = fill(store_a)
    moving = Counter((i.url, i.host, i.depth, i.hops, i.found_on) for i in items if moves(host_position(i.host)))
    out, back = Recorder(), Recorder()
    a = Handoff("a", store_a, out, config=HandoffConfig(keys_per_chunk=50, urls_per_chunk=40, window=1000),
                wall_clock=wall)
    b = Handoff("b0", store_b, back, wall_clock=wall)
    a.view_changed(1, OLD, NEW)
    b.view_changed(1, OLD, NEW)
    host_in = next(i.host for i in items if moves(host_position(i.host)))
    store_b.frontier.put_state(HostState(host=host_in, next_allowed=WALL0 + 100.0, crawl_delay=1.0, pages=5))
    a.pump()
    chunks = [m for _, m in out.sent]
    assert {bool(m.urls) for m in chunks} == {True, False} and chunks[-1].last
    for message in [*reversed(chunks), *chunks]:
        await b.on_message("a", message)
    assert queued(store_b) == moving
    assert b.chunks_applied == len(chunks) and b.pending_arcs() == []
    # a state already here with a later next_allowed is kept (the later of the two wins), and so is its count
    kept = store_b.frontier.get_state(host_in)
    assert (kept.next_allowed, kept.crawl_delay, kept.pages) == (WALL0 + 100.0, 2.0, 5)
    assert sorted({m.chunk_seq for _, m in back.sent}) == list(range(len(chunks)))
    for _, ack in back.sent:
        await a.on_message("b0", ack)
    assert a.outstanding() == 0 and a.transfers_completed == 1
    assert queued(store_a) == Counter((i.url, i.host, i.depth, i.hops, i.found_on) for i in items) - moving
    # an ack from the wrong peer, or for a finished transfer, changes nothing
    await a.on_message("x", HandoffAck(transfer_id=1 << 32, chunk_seq=0))
    assert a.transfers_completed == 1


async def test_default_chunks_fit_the_frame_limit_in_both_codecs(stores, autojump_clock):
    store_a, _ = stores
    long_items = []
    for i in range(60):
        host = f"{'x' * 60}.{'y' * 60}.{'z' * 60}.h{i}.example"
        long_items += [
            QueuedUrl(url=f"http://{host}/{'p' * 1600}{j}", host=host, depth=3, found_on=f"http://{host}/{'q' * 1750}")
            for j in range(5)
        ]
    store_a.admit(long_items)
    store_a.frontier.put_states([HostState(host=item.host, next_allowed=WALL0) for item in long_items])
    store_a.dedup.insert([i.to_bytes(8, "big") * 2 for i in range(0, RING_SPACE, RING_SPACE // 30_000)])
    out = Recorder()
    a = Handoff("a", store_a, out, config=HandoffConfig(window=10_000), wall_clock=wall)
    a.view_changed(1, OLD, NEW)
    a.pump()
    chunks = [m for _, m in out.sent]
    assert any(len(m.urls) for m in chunks) and any(len(m.seen_keys) == HandoffConfig().keys_per_chunk for m in chunks)
    limits = Limits()
    for codec in ("msgpack", "json"):
        for message in chunks:
            code, body = encode_body(message, codec, limits)
            assert len(body) + 2 <= limits.max_frame
            assert decode_body(code, body, codec, limits) == message


class Fetching(Alone):
    """A delegate with fetches in flight at `positions` (the test's list, changed as fetches end), and pages
    fetched whose release waits for their links, by key (`held`, the test's set)."""

    def __init__(self, node_id: str, positions: list[int] | None = None, held: set[bytes] | None = None) -> None:
        super().__init__(node_id)
        self.positions = positions if positions is not None else []
        self.held = held if held is not None else set()

    def busy_positions(self) -> list[int]:
        return list(self.positions)

    def held_keys(self) -> set[bytes]:
        return set(self.held)


async def test_a_transfer_waits_for_the_fetches_in_flight_in_its_arcs(stores, autojump_clock):
    store_a, store_b = stores
    items, _ = fill(store_a, hosts=30)
    host_in = next(i.host for i in items if moves(host_position(i.host)))
    host_out = next(i.host for i in items if not moves(host_position(i.host)))
    fetching = [host_position(host_in), host_position(host_out)]
    async with trio.open_nursery() as nursery:
        net = Net(nursery)
        a = net.nodes["a"] = Handoff("a", store_a, net.links("a"), config=CONFIG, wall_clock=wall,
                                     delegate=Fetching("a", fetching))
        b = net.nodes["b0"] = Handoff("b0", store_b, net.links("b0"), config=CONFIG, wall_clock=wall)
        a.view_changed(1, OLD, NEW)
        b.view_changed(1, OLD, NEW)
        await nursery.start(a.run)
        await trio.sleep(3.0)
        assert net.log == [] and a.outstanding() == 1 and b.blocked(host_position(host_in))
        # the fetch in the lost arc ends and moves the host's next_allowed; a fetch outside it does not matter
        store_a.frontier.put_state(HostState(host=host_in, next_allowed=WALL0 + 50.0, crawl_delay=2.0))
        fetching.remove(host_position(host_in))
        await trio.sleep(1.0)
        assert a.outstanding() == 0 and not b.blocked(host_position(host_in))
        nursery.cancel_scope.cancel()
    assert store_b.frontier.get_state(host_in).next_allowed >= WALL0 + 50.0


async def test_pages_the_new_owner_released_here_stay_seen_after_the_drop(stores, autojump_clock):
    """The old owner of an arc is often the new owner's backup, and its heir. The new owner fetches URLs it got
    queued in the transfer and releases them to its backups, which marks them seen here; the drop at the last
    ack took those marks with the keys of the queued URLs sent, and at the new owner's death the heir fetched
    the pages again though none was under way (the replica simulation, seeds 4 and 7). Marks that come while
    the transfer waits to start or waits for its acks stay; the keys of URLs still queued there go."""
    store_a, store_b = stores
    items, _ = fill(store_a, hosts=40)
    moving = [i for i in items if moves(host_position(i.host))]
    early, late, queued_there = queued_url_keys(moving[:3])
    fetching = [host_position(moving[0].host)]
    async with trio.open_nursery() as nursery:
        net = Net(nursery)
        a = net.nodes["a"] = Handoff("a", store_a, net.links("a"), config=CONFIG, wall_clock=wall,
                                     delegate=Fetching("a", fetching))
        b = net.nodes["b0"] = Handoff("b0", store_b, net.links("b0"), config=CONFIG, wall_clock=wall)
        # "a" backs "b0": the releases "b0" sends land in its store (and its replicas' acks go nowhere here)
        class Marks(QueueAlone):  # the cluster's part of the replicas' delegate: their seen marks to the hand-off
            def marked_seen(self, keys) -> None:
                a.marked_seen(keys)

        backup = QueueReplicas("a", store_a, net.links("a"), ring_of=lambda: (1, NEW), copies=1, wall_clock=wall,
                               delegate=Marks())

        def release(seq: int, key: bytes) -> None:
            assert backup.on_message("b0", QueueReplica(seq=seq, epoch=1, urls=(), released=(key,), hosts=()))
            store_a.replicas.fold()  # as any read of the replicas does: the key is marked seen now
            assert key in store_a.dedup

        a.view_changed(1, OLD, NEW)
        b.view_changed(1, OLD, NEW)
        net.drop = lambda sender, peer, message: isinstance(message, HandoffAck)
        await nursery.start(a.run)
        await trio.sleep(1.0)
        assert net.log == [] and a.outstanding() == 1  # waiting for the fetch in flight in its arcs
        release(1, early)
        fetching.clear()
        await trio.sleep(1.0)
        assert b.pending_arcs() == [] and {early, late, queued_there} <= set(store_b.dedup.scan(0, 0))
        release(2, late)  # chunks applied, their acks not here yet
        net.drop = lambda sender, peer, message: False
        await trio.sleep(CONFIG.resend_after + 1.0)
        assert a.outstanding() == 0 and a.transfers_completed == 1
        assert queued(store_a) == Counter((i.url, i.host, i.depth, i.hops, i.found_on) for i in items
                                          if not moves(host_position(i.host)))
        assert early in store_a.dedup and late in store_a.dedup
        assert queued_there not in store_a.dedup  # a URL still queued at the new owner: its key left with it
        nursery.cancel_scope.cancel()


def _held_page(store_b: NodeStore) -> tuple[QueuedUrl, bytes]:
    """A page of a moving host that "a" fetched (a seen key of `fill`), queued at "b0" too, as a third node's
    link to it would have queued it there after the ring change."""
    i = next(i for i in range(40) if moves(host_position(f"h{i}.example")))
    page = QueuedUrl(url=f"http://h{i}.example/done0", host=f"h{i}.example", depth=2, hops=0, found_on=None)
    assert store_b.admit([page]) == [page]
    return page, url_key(host_position(page.host), page.url)


@pytest.mark.parametrize("released", [True, False])
async def test_a_page_whose_release_is_held_is_sent_as_seen_only_once_its_links_are_safe(
        stores, autojump_clock, released: bool) -> None:
    """The old owner fetched a page of a moving arc just before the transfer; the link it found waits in its
    outbox (the batch lost, re-sent seconds later), so the page's release is held: if the old owner dies now,
    only fetching the page again finds the link. Sent as seen, the new owner discarded its own queued copy and
    the link was lost (the replica simulation, seed 25). Now the transfer's last chunk waits: the key goes, in a
    chunk of its own, once the release is, or past `withhold_limit` all the same (a lossy network holds releases
    for many seconds; not seen, every such page would be fetched twice)."""
    store_a, store_b = stores
    fill(store_a, hosts=40)
    page, key = _held_page(store_b)
    held = {key}
    config = replace(CONFIG, withhold_limit=10.0)
    async with trio.open_nursery() as nursery:
        net = Net(nursery)
        a = net.nodes["a"] = Handoff("a", store_a, net.links("a"), config=config, wall_clock=wall,
                                     delegate=Fetching("a", held=held))
        b = net.nodes["b0"] = Handoff("b0", store_b, net.links("b0"), config=config, wall_clock=wall)
        a.view_changed(1, OLD, NEW)
        b.view_changed(1, OLD, NEW)
        await nursery.start(a.run)
        await trio.sleep(3.0)
        # everything else has arrived; the last chunk waits, so "b0" still holds the arc's hosts
        assert net.log and a.outstanding() >= 1 and b.blocked(host_position(page.host))
        assert page.url in {k[0] for k in queued(store_b)}  # its copy there was not discarded
        if released:
            held.clear()  # the link's owner acknowledged it: the page's release is staged
            await trio.sleep(1.0)
        else:
            await trio.sleep(config.withhold_limit - 3.0)
            assert a.outstanding() >= 1 and b.blocked(host_position(page.host))  # still waiting
            await trio.sleep(4.0)
        assert a.outstanding() == 0 and a.transfers_completed == 1 and not b.blocked(host_position(page.host))
        nursery.cancel_scope.cancel()
    # sent as seen, in the end: the new owner's queued copy is discarded, no page is fetched twice
    assert key in set(store_b.dedup.scan(0, 0))
    assert page.url not in {k[0] for k in queued(store_b)}
    assert a.keys_withheld == 1 and a.withheld_expired == (0 if released else 1)


async def test_a_transfer_to_a_newer_ring_waits_for_older_transfers_to_any_peer(stores) -> None:
    """The older transfer may carry timers of hosts the newer ring gives the newer transfer's peer (to a node
    that owned them in between and passes them on): "nothing more up to this ring" must not overtake it."""
    store_a, _ = stores
    fill(store_a, hosts=40)
    links = _Acks()
    a = Handoff("a", store_a, links, config=CONFIG, wall_clock=wall)
    r0 = Ring({"a": 1}, points_per_weight=8)
    r1 = Ring({"a": 1, "x": 1}, points_per_weight=8)
    r2 = Ring({"a": 1, "x": 1, "y": 1}, points_per_weight=8)
    a.view_changed(1, r0, r1)
    a.view_changed(2, r1, r2)
    a.pump()
    to = lambda peer: [m for p, m in links.sent if p == peer and isinstance(m, HandoffChunk)]  # noqa: E731
    assert to("x") and not to("y")  # y waits, although its transfer (ring 2) is ready
    for chunk in list(to("x")):
        await a.on_message("x", HandoffAck(transfer_id=chunk.transfer_id, chunk_seq=chunk.chunk_seq))
    a.pump()
    assert to("y") and to("y")[-1].last


async def test_a_transfer_remembered_for_a_ring_this_node_left_releases_nothing_when_the_ring_comes_back(
        stores) -> None:
    """e held ring z (a and e) and a's transfer to z was complete. A partition longer than the suspicion timeout:
    e's ring becomes e alone, while a, holding e dead, takes e's arcs and crawls them. At the heal e is back on z,
    the same ring, and waits for those arcs from a (the cluster reckons them against a's side of the split). What
    a said under z before the split ("nothing more from me up to z") is stale: only a transfer a makes now says
    so again, and carries the timers of its last requests there (the partition simulation, seed 42: the heir's
    old transfer released the arcs at once, and e broke a 2 s Crawl-delay 1.5 s after the heir's request)."""
    _, store_e = stores
    links = _Acks()
    e = Handoff("e", store_e, links)
    z = Ring({"a": 1, "e": 1}, points_per_weight=8)
    alone = Ring({"e": 1}, points_per_weight=8)
    a_side = Ring({"a": 1}, points_per_weight=8)
    e.view_changed(5, alone, z)
    await e.on_message("a", HandoffChunk(transfer_id=1, chunk_seq=0, epoch=5, arc_start=0, arc_end=0, urls=(),
                                         seen_keys=(), hosts=(), last=True))
    mine = [p for p in range(0, RING_SPACE, RING_SPACE // 256) if z.owner_at(p) == "e"]
    assert mine and not any(e.blocked(p) for p in mine)
    e.view_changed(6, z, alone, gone=["a"])  # the split: a is dead here
    e.view_changed(5, alone, z, gains_from=a_side)  # the heal: e's arcs come from a's side
    assert all(e.blocked(p) for p in mine)
    await e.on_message("a", HandoffChunk(transfer_id=2, chunk_seq=0, epoch=5, arc_start=0, arc_end=0, urls=(),
                                         seen_keys=(), hosts=(), last=True))
    assert not any(e.blocked(p) for p in mine) and not e.waits_for("a")


class Parking(Alone):
    """A delegate whose crawler holds `parked` URLs taken from the queue (waiting for robots.txt, a retry or a
    hand-off), not being fetched; `unpark` puts those of the arc back, as the cluster has the crawler do."""

    def __init__(self, node_id: str, store: NodeStore, parked: list[QueuedUrl]) -> None:
        super().__init__(node_id)
        self.store = store
        self.parked = parked

    def unpark(self, start: int, end: int) -> None:
        back = [item for item in self.parked if in_arc(host_position(item.host), start, end)]
        self.parked = [item for item in self.parked if item not in back]
        self.store.frontier.requeue(back)


async def test_a_page_parked_here_that_the_previous_owner_fetched_is_discarded(stores) -> None:
    """A node back from a partition had taken a host's first page from its queue before the split (parked for
    robots.txt), then held it through the fence and the wait for its arc; meanwhile the other side's heir fetched
    it. The heir's hand-off brings the page's key as seen: the parked URL must go, as a queued one does, or the
    node fetches the page a second time (the partition simulation, seed 42: four pages)."""
    _, store_b = stores
    host = next(f"h{i}.example" for i in range(1000) if moves(host_position(f"h{i}.example")))
    page = QueuedUrl(url=f"http://{host}/", host=host, depth=0, hops=0, found_on=None)
    other = QueuedUrl(url=f"http://{host}/p1", host=host, depth=1, hops=0, found_on=page.url)
    assert len(store_b.admit([page, other])) == 2
    (popped,) = store_b.frontier.pop_many([host])
    assert popped is not None and popped.url == page.url and store_b.frontier.in_flight() == 1
    delegate = Parking("b0", store_b, [popped])
    links = _Acks()
    b = Handoff("b0", store_b, links, delegate=delegate)
    b.view_changed(1, NEW, OLD)  # (any ring: the chunk is applied whatever b waits for)
    start, end = moved_arc()
    key = queued_url_keys([page])[0]
    await b.on_message("a", HandoffChunk(transfer_id=1, chunk_seq=0, epoch=1, arc_start=start, arc_end=end,
                                         urls=(), seen_keys=(key,), hosts=(), last=True))
    assert store_b.frontier.in_flight() == 0 and not delegate.parked
    left, _ = store_b.frontier.export_arc(0, 0)
    assert [item.url for item in left] == [other.url]  # the page the heir fetched is gone, the other stays
    assert b.urls_discarded == 1
