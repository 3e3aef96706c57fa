"""The hand-off of a view change that moves thousands of small arcs: real LMDB stores, MockClock.

At a thousand points per weight a join moves one arc per point of the joiner. The hand-off takes the moved arcs
as arrays (`ring.diff_moves`), finds the arcs holding a host here in one pass over the hosts, reads their content a
few dozen arcs at a time as the window opens, and drops them after the last ack a few dozen arcs per transaction
with a checkpoint between: every URL still arrives once, in few chunks, and the event loop runs between steps.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.cluster.handoff.handoff import ArcSet, Handoff, HandoffConfig, handoff_arcs, plan_view
from protocol import HandoffAck, HandoffChunk, Message
from ring import Ring, diff, diff_moves, host_position, wire_moves
from storage import HostState, NodeStore, QueuedUrl, in_arc, url_key

WALL0 = 1_700_000_000.0
WEIGHTS = {"a": 3, "b": 2, "c": 2}
OLD = Ring(WEIGHTS, points_per_weight=1000)
NEW = OLD.with_weights({**WEIGHTS, "j": 2})


def wall() -> float:
    return WALL0 + trio.current_time()


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []

    def send_nowait(self, peer_id: str, message: Message) -> bool:
        self.sent.append((peer_id, message))
        return True


LOST_TO_J = sorted((m.start, m.end) for m in handoff_arcs(diff(OLD, NEW)) if m.previous == "a" and m.next == "j")
STARTS = [start for start, _ in LOST_TO_J]


def lost_to_j() -> list[tuple[int, int]]:
    return LOST_TO_J


def moving(position: int) -> bool:
    index = bisect_right(STARTS, position) - 1  # -1: the last arc, the one that may wrap
    return bool(LOST_TO_J) and in_arc(position, *LOST_TO_J[index])


def fill(store: NodeStore, hosts: int = 1500) -> tuple[list[QueuedUrl], list[bytes]]:
    """Hosts that "a" owns in OLD: two queued URLs, a state and a fetched page's key each."""
    names = [f"h{i}.example" for i in range(hosts * 4)]
    mine = [n for n, owner in zip(names, OLD.owners_at([host_position(n) for n in names])) if owner == "a"][:hosts]
    items = [QueuedUrl(url=f"http://{h}/p{k}", host=h, depth=1) for h in mine for k in range(2)]
    assert len(store.admit(items)) == len(items)
    fetched = [url_key(host_position(h), f"http://{h}/done") for h in mine]
    store.dedup.insert(fetched)
    store.frontier.put_states([HostState(host=h, next_allowed=WALL0 + 5.0, crawl_delay=1.0) for h in mine])
    store.sync()
    return items, fetched


def rows(store: NodeStore) -> Counter[tuple[str, str]]:
    items, _ = store.frontier.export_arc(0, 0)
    return Counter((i.url, i.host) for i in items)


@pytest.fixture
def stores(tmp_path):
    a = NodeStore.open(tmp_path / "a", map_size=1 << 26)
    j = NodeStore.open(tmp_path / "j", map_size=1 << 26)
    yield a, j
    a.close()
    j.close()


def test_the_moves_of_a_join_are_thousands_of_small_arcs() -> None:
    moves = wire_moves(diff_moves(OLD, NEW))
    assert len(moves) > 1500 and len(lost_to_j()) > 500
    assert [(m.start, m.end, m.previous, m.next) for m in moves] == [
        (m.start, m.end, m.previous, m.next) for m in handoff_arcs(diff(OLD, NEW))]


async def test_a_join_of_thousands_of_arcs_moves_every_url_once_in_a_few_chunks(stores, autojump_clock):
    store_a, store_j = stores
    items, fetched = fill(store_a)
    going = Counter((i.url, i.host) for i in items if moving(host_position(i.host)))
    staying = Counter((i.url, i.host) for i in items if not moving(host_position(i.host)))
    occupied = {LOST_TO_J[bisect_right(STARTS, host_position(h)) - 1] for _, h in going}
    assert len(going) > 100 and staying and len(occupied) > 50
    out, back = Recorder(), Recorder()
    config = HandoffConfig(urls_per_chunk=200, keys_per_chunk=1000, window=2, arcs_per_read=8, arcs_per_drop=16)
    a = Handoff("a", store_a, out, config=config, wall_clock=wall)
    j = Handoff("j", store_j, back, wall_clock=wall)
    lost = a.view_changed(1, OLD, NEW, arcs=wire_moves(diff_moves(OLD, NEW)))
    assert len(lost) == len([m for m in handoff_arcs(diff(OLD, NEW)) if m.previous == "a"])
    j.view_changed(1, OLD, NEW, arcs=handoff_arcs(diff(OLD, NEW)))  # the list form is still taken
    assert j.waits_for("a") and j.blocked(host_position(next(iter(going))[1]))
    # nothing is read before the window asks for it: one pump makes the window's chunks, not the whole transfer
    assert a.urls_sent == 0
    a.pump()
    first = [m for _, m in out.sent if isinstance(m, HandoffChunk)]
    assert len([m for m in first if m.urls]) <= config.window and a.urls_sent < sum(going.values())
    sent: list[HandoffChunk] = []
    for _ in range(10_000):  # deliver, ack, pump until done (bounded)
        batch, out.sent = out.sent, []
        for peer, message in batch:
            if peer == "j" and isinstance(message, HandoffChunk):
                sent.append(message)
                await j.on_message("a", message)
        acks, back.sent = back.sent, []
        for _, ack in acks:
            await a.on_message("j", ack)
        a.pump()
        if not out.sent and not a.outstanding():
            break
    assert a.transfers_completed == 1 and a.outstanding() == 0  # to j only: b and c gain nothing from a
    assert rows(store_j) == going and rows(store_a) == staying
    assert not j.waits_for("a") and j.waits_for("b") and j.transfers_received == 1  # b's arcs come from b
    # grouped: far fewer chunks than arcs with content, and only the last is marked so
    assert len(sent) < len(occupied) / 3 and [m.last for m in sent].count(True) == 1 and sent[-1].last
    # the fetched pages' keys moved and stayed; the queued URLs' keys left with them
    moved_keys = {k for k in fetched if moving(int.from_bytes(k[:8], "big"))}
    assert moved_keys <= set(store_j.dedup.scan(0, 0))
    assert {k for k in store_a.dedup.scan(0, 0) if moving(int.from_bytes(k[:8], "big"))} == moved_keys
    assert all(store_a.frontier.get_state(h) is None for _, h in going)


async def test_the_drop_after_the_last_ack_lets_other_tasks_run_between_slices(stores, autojump_clock):
    store_a, _ = stores
    items, _ = fill(store_a, hosts=600)
    before = len(store_a.frontier)
    going = sum(1 for i in items if moving(host_position(i.host)))
    out = Recorder()
    a = Handoff("a", store_a, out, config=HandoffConfig(window=10_000, arcs_per_drop=4), wall_clock=wall)
    a.view_changed(1, OLD, NEW)
    seen_while_dropping: list[tuple[int, int]] = []
    finished = trio.Event()

    async def watch() -> None:
        while not finished.is_set():
            seen_while_dropping.append((a.outstanding(), len(store_a.frontier)))
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        await trio.lowlevel.checkpoint()
        for _ in range(1000):  # pump and ack everything (the transfer to j) until done
            a.pump()
            sent, out.sent = out.sent, []
            for peer, message in sent:
                await a.on_message(peer, HandoffAck(transfer_id=message.transfer_id, chunk_seq=message.chunk_seq))
            if not sent and not a.outstanding():
                break
        finished.set()
    assert len(store_a.frontier) == before - going and a.transfers_completed == 1 and a.outstanding() == 0
    # the other task ran while the arcs were being dropped, and saw the drop under way and counted as outstanding
    partial = [(n, size) for n, size in seen_while_dropping if before - going < size < before]
    assert partial and all(n > 0 for n, _ in partial)


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=12, unique=True),
       wrap=st.booleans(), positions=st.lists(st.integers(0, 2**64 - 1), max_size=30))
def test_arc_sets_locate_positions_as_in_arc_does(cuts: list[int], wrap: bool, positions: list[int]) -> None:
    """The numpy look-ups of an arc set against the definition: disjoint arcs, the last one wrapping or ending
    at 2**64 (written 0), and the whole ring."""
    cuts.sort()
    arcs = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    if wrap:
        arcs[-1] = (arcs[-1][0], 0 if arcs[0][0] == 0 else min(arcs[0][0], 2**63) // 2)
    wholes = [(5, 5)]
    probes = np.array(sorted(set(positions) | {0, 2**64 - 1} | {a for arc in arcs for a in arc}), dtype=np.uint64)
    for arc_list in (arcs, wholes):
        arc_set = ArcSet(arc_list)
        expected = [next((i for i, arc in enumerate(arc_set.arcs) if in_arc(p, *arc)), -1) for p in probes.tolist()]
        assert arc_set.locate(probes).tolist() == expected
        assert [arc_set.find(p) for p in probes.tolist()] == [arc_set.arcs[i] if i >= 0 else None for i in expected]
        assert arc_set.occupied(probes).tolist() == sorted({i for i in expected if i >= 0})
        assert arc_set.holds_any(probes) == any(i >= 0 for i in expected)
        for other in (ArcSet([(int(p), int(p) + 1) for p in probes[::3].tolist() if p < 2**64 - 1]),
                      ArcSet([(cuts[0] + 1, cuts[-1])]) if cuts[-1] > cuts[0] + 1 else ArcSet()):
            shared = any(in_arc(p, *b) for a in arc_set.arcs for b in other.arcs for p in (a[0], b[0])
                         if in_arc(p, *a) and in_arc(p, *b))
            assert arc_set.touches(other) == other.touches(arc_set) == shared


# -- overlapping arc sets merged (a node fresh from a restart waits for the union of two gain computations) --

_SPACE = 2**64
_points = st.integers(0, _SPACE - 1)


@st.composite
def _disjoint_sets(draw) -> ArcSet:
    """Disjoint arcs, at most one wrapping, as a ring's moved arcs are: cut points sorted, every other gap kept."""
    cuts = sorted(set(draw(st.lists(_points, min_size=0, max_size=12))))
    if len(cuts) < 2:
        return ArcSet()
    arcs = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    if draw(st.booleans()) and len(cuts) % 2 == 1 and len(cuts) > 2:
        arcs.append((cuts[-1], cuts[0]))  # one arc across 2**64
    return ArcSet(arcs)


@pytest.mark.slow  # 300 examples, about 2 s
@settings(max_examples=300, deadline=None)
@given(sets=st.lists(_disjoint_sets(), min_size=1, max_size=3), probes=st.lists(_points, min_size=1, max_size=40))
def test_merged_arc_sets_hold_exactly_the_positions_of_their_parts(sets, probes) -> None:
    merged = ArcSet.merged(sets)
    edges = [p for s in sets for arc in s.arcs for p in (arc[0], (arc[0] - 1) % _SPACE, arc[1], (arc[1] - 1) % _SPACE)]
    for position in [*probes, *edges]:
        assert (position in merged) == any(position in s for s in sets), position
    starts = merged.starts.tolist()
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    wrapping = [(a, b) for a, b in merged.arcs if b != 0 and b <= a]
    assert len(wrapping) <= 1


def test_merged_arc_sets_join_overlaps_and_the_whole_ring() -> None:
    a = ArcSet([(10, 20), (30, 40)])
    b = ArcSet([(15, 35), (_SPACE - 5, 3)])
    assert ArcSet.merged([a, b]).arcs == [(10, 40), (_SPACE - 5, 3)]
    assert ArcSet.merged([ArcSet([(0, 0)]), a]).arcs == [(0, 0)]
    assert ArcSet.merged([ArcSet([(5, 5)])]).arcs == [(0, 0)]  # equal bounds: the whole ring
    assert ArcSet.merged([ArcSet([(0, _SPACE // 2)]), ArcSet([(_SPACE // 2, 0)])]).arcs == [(0, 0)]


def test_a_fresh_node_also_waits_for_the_owners_of_the_ring_without_it() -> None:
    """A restarted node whose first ring came from a partial view (a and c, not b) owns some of b's arcs in both
    its rings: the plain diff waits for nobody there; the extra gains against the ring without it wait for b."""
    full = Ring({"a": 3, "b": 2, "c": 2}, points_per_weight=20)
    partial = Ring({"a": 3, "c": 2}, points_per_weight=20)
    without = Ring({"a": 3, "b": 2}, points_per_weight=20)
    plain = plan_view("c", partial, full)
    fresh = plan_view("c", partial, full, extra_gains=diff_moves(without, full))
    assert "b" not in plain.gained
    assert "b" in fresh.gained
    b_arcs = fresh.gained["b"]
    for start, end in b_arcs.arcs:  # each of them is c's now and was b's without c
        assert full.owner_at(start) == "c" and without.owner_at(start) == "b"
    # and what the plain diff waits for is still waited for
    for peer, arcs in plain.gained.items():
        for start, _end in arcs.arcs:
            assert start in fresh.gained[peer]


def test_a_node_declared_dead_waits_for_the_owners_of_both_rings_it_is_given() -> None:
    """c and d were cut off together from a and b for longer than the suspicion timeout, and each side held the
    other dead. At the heal c's own rings give it its arcs all along; a and b crawled them under the ring of
    their side, where an arc of c's went to a or b, while the ring without c gives some of them to d (which was
    with c and never had them). c waits for the owners of both rings (a list of extra gains), each arc from its
    owner in each."""
    full = Ring({"a": 3, "b": 2, "c": 2, "d": 2}, points_per_weight=20)
    ours = Ring({"c": 2, "d": 2}, points_per_weight=20)
    without = Ring({"a": 3, "b": 2, "d": 2}, points_per_weight=20)
    theirs = Ring({"a": 3, "b": 2}, points_per_weight=20)
    plan = plan_view("c", ours, full, extra_gains=[diff_moves(without, full), diff_moves(theirs, full)])
    probes = [p for p in range(0, 1 << 64, (1 << 64) // 4096) if full.owner_at(p) == "c"]
    assert probes
    for position in probes:
        for ring in (without, theirs):
            assert position in plan.gained[ring.owner_at(position)]
    assert "d" in plan.gained  # the ring without c gives d some of c's arcs: waited for too, d answers at once
