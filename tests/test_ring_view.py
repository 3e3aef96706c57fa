"""Membership views: records, helpers, the merge semilattice and the epoch, and the ring a view implies."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ring import Member, MemberState, Ring, View, diff, merge

PPW = 2  # tiny rings: the properties do not depend on the number of points

members = st.builds(
    Member,
    node_id=st.sampled_from(["a", "b", "c", "d"]),
    address=st.sampled_from(["10.0.0.1:7000", "10.0.0.2:7000", "[::1]:7001"]),
    weight=st.integers(1, 3),
    incarnation=st.integers(0, 3),
    state=st.sampled_from(list(MemberState)),
)


@st.composite
def views(draw: st.DrawFn) -> View:
    records = {m.node_id: m for m in draw(st.lists(members, max_size=4))}
    return View(epoch=draw(st.integers(0, 50)), members=tuple(records.values()))


def conflicting(a: View, b: View) -> bool:
    """Records of one node at the same incarnation and state that disagree on weight or address: a correct node
    never makes them (a change needs a new incarnation); merge still resolves them deterministically."""
    for x in a.members:
        y = b.member(x.node_id)
        if y is not None and (x.incarnation, x.state) == (y.incarnation, y.state) and x != y:
            return True
    return False


def test_conflicting_records_resolve_deterministically() -> None:
    light = Member(node_id="a", address="h:1", weight=1)
    heavy = Member(node_id="a", address="h:1", weight=2)
    one, two = View(members=(light,)), View(members=(heavy,))
    assert merge(one, two).members == merge(two, one).members == (heavy,)
    assert merge(one, two).epoch == max(one.epoch, two.epoch) == 0  # same rank, same offsets


def test_member_validation_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="host:port"):
        Member(node_id="a", address="10.0.0.1", weight=1)
    with pytest.raises(ValueError, match="host:port"):
        Member(node_id="a", address="10.0.0.1:70000", weight=1)
    with pytest.raises(ValueError, match="weight"):
        Member(node_id="a", address="h:1", weight=0)
    with pytest.raises(ValueError, match="incarnation"):
        Member(node_id="a", address="h:1", weight=1, incarnation=-1)
    with pytest.raises(ValueError, match="node_id"):
        Member(node_id="", address="h:1", weight=1)
    with pytest.raises(ValueError, match="twice"):
        View(members=(Member(node_id="a", address="h:1", weight=1), Member(node_id="a", address="h:2", weight=1)))
    with pytest.raises(ValueError, match="epoch"):
        View(epoch=-1)


def test_swim_order_and_arc_ownership() -> None:
    order = [MemberState.ALIVE, MemberState.SUSPECT, MemberState.LEAVING, MemberState.DEAD]
    assert [state.rank for state in order] == [0, 1, 2, 3]
    assert [state.owns_arcs for state in order] == [True, True, False, False]


def test_helpers_raise_the_epoch_exactly_when_members_change() -> None:
    view = View()
    a = view.join("a", "10.0.0.1:7000", 3)
    assert a.epoch > view.epoch and a.member("a") == Member(node_id="a", address="10.0.0.1:7000", weight=3)
    assert a.join("a", "10.0.0.1:7000", 3) is a
    b = a.join("b", "10.0.0.2:7000", 1)
    suspect = b.update("a", state=MemberState.SUSPECT)
    assert suspect.member("a").incarnation == 0 and suspect.epoch > b.epoch  # worse news: same incarnation
    refuted = suspect.join("a", "10.0.0.1:7000", 3)
    assert refuted.member("a").incarnation == 1 and refuted.member("a").state is MemberState.ALIVE
    heavier = refuted.update("a", weight=5)
    assert heavier.member("a").incarnation == 2 and heavier.epoch > refuted.epoch
    assert heavier.update("a", weight=5) is heavier
    stale = heavier.with_member(Member(node_id="a", address="10.0.0.1:7000", weight=1, incarnation=1))
    assert stale is heavier
    with pytest.raises(KeyError, match="no member 'zz'"):
        heavier.update("zz", weight=1)
    assert heavier.member("zz") is None
    assert [m.node_id for m in heavier.members] == ["a", "b"]


def test_ring_of_a_view_uses_alive_and_suspect_members_only() -> None:
    view = View()
    for node, weight in (("a", 2), ("b", 1), ("c", 3), ("d", 1)):
        view = view.join(node, f"{node}.local:7000", weight)
    view = view.update("b", state=MemberState.SUSPECT).update("c", state=MemberState.LEAVING)
    view = view.update("d", state=MemberState.DEAD)
    assert view.owner_weights() == {"a": 2, "b": 1}
    assert view.ring(points_per_weight=PPW) == Ring({"a": 2, "b": 1}, points_per_weight=PPW)


def test_a_leave_then_the_same_rejoin_restores_the_ring() -> None:
    view = View()
    for node, weight in (("a", 2), ("b", 1), ("c", 3)):
        view = view.join(node, f"{node}.local:7000", weight)
    before = view.ring(points_per_weight=PPW)
    gone = view.update("c", state=MemberState.LEAVING)
    assert all(move.previous == "c" for move in diff(before, gone.ring(points_per_weight=PPW)))
    back = gone.join("c", "c.local:7000", 3)
    assert back.epoch > gone.epoch > view.epoch
    assert back.ring(points_per_weight=PPW).arcs() == before.arcs()


def test_fingerprint_tracks_members_not_epoch() -> None:
    one = View().join("a", "h:1", 1)
    assert one.fingerprint() == View(epoch=99, members=one.members).fingerprint()
    assert one.fingerprint() != one.update("a", weight=2).fingerprint()


def test_merging_records_already_held_gives_the_held_view_itself() -> None:
    """A partial gossip of records a node holds (the common case in a large cluster) merges into the node's own
    view object, whichever side it is on; one superseding record makes a new view with it."""
    whole = View()
    for i in range(300):
        whole = whole.join(f"n{i:03d}", f"10.0.{i // 250}.{i % 250}:7000", 1)
    whole = whole.update("n007", state=MemberState.SUSPECT)
    held = [whole.member(node) for node in ("n007", "n150", "n299")]
    gossip = View(members=tuple(held))  # a partial gossip's epoch is its rank: offset 0
    gossip = View(epoch=gossip.rank, members=gossip.members)
    assert merge(whole, gossip) is whole and merge(gossip, whole) is whole
    news = View(members=(replace(held[1], state=MemberState.DEAD),))
    news = View(epoch=news.rank, members=news.members)
    merged = merge(whole, news)
    assert merged.member("n150").state is MemberState.DEAD and merged.epoch > whole.epoch
    assert merged == merge(news, whole)


@settings(max_examples=200, deadline=None)
@given(a=views(), b=views())
def test_merge_is_commutative_and_never_goes_back(a: View, b: View) -> None:
    ab = merge(a, b)
    assert ab == merge(b, a)
    assert ab.epoch >= max(a.epoch, b.epoch)
    if ab.members not in (a.members, b.members) and not conflicting(a, b):
        assert ab.epoch > max(a.epoch, b.epoch)
    for member in a.members + b.members:
        assert ab.member(member.node_id).precedence() >= member.precedence()


@settings(max_examples=200, deadline=None)
@given(a=views(), b=views(), c=views())
def test_merge_is_associative_and_idempotent(a: View, b: View, c: View) -> None:
    assert merge(merge(a, b), c) == merge(a, merge(b, c))
    assert merge(a, a) == a
    assert merge(merge(a, b), b) == merge(a, b)


@settings(max_examples=200, deadline=None)
@given(a=views(), b=views())
def test_merge_picks_higher_incarnation_then_worse_state(a: View, b: View) -> None:
    ab = merge(a, b)
    for member in ab.members:
        x, y = a.member(member.node_id), b.member(member.node_id)
        candidates = [m for m in (x, y) if m is not None]
        best = max(candidates, key=lambda m: (m.incarnation, m.state.rank))
        assert (member.incarnation, member.state) == (best.incarnation, best.state)


class Gossip(RuleBasedStateMachine):
    """Three nodes change their own views and gossip in any order: views only move up, epochs only grow,
    and once everyone has merged everything, all views are equal."""

    def __init__(self) -> None:
        super().__init__()
        self.views = [View(), View(), View()]
        self.epochs = [0, 0, 0]

    @rule(i=st.integers(0, 2), node=st.sampled_from(["a", "b", "c"]), weight=st.integers(1, 3))
    def join(self, i: int, node: str, weight: int) -> None:
        self.views[i] = self.views[i].join(node, f"{node}.local:7000", weight)

    @precondition(lambda self: any(v.members for v in self.views))
    @rule(i=st.integers(0, 2), data=st.data(), state=st.sampled_from(list(MemberState)))
    def mark(self, i: int, data: st.DataObject, state: MemberState) -> None:
        if self.views[i].members:
            node = data.draw(st.sampled_from([m.node_id for m in self.views[i].members]))
            self.views[i] = self.views[i].update(node, state=state)

    @rule(i=st.integers(0, 2), j=st.integers(0, 2))
    def gossip(self, i: int, j: int) -> None:
        self.views[i] = merge(self.views[i], self.views[j])

    @invariant()
    def epochs_only_grow(self) -> None:
        for i, view in enumerate(self.views):
            assert view.epoch >= self.epochs[i]
            self.epochs[i] = view.epoch

    def teardown(self) -> None:
        total = merge(merge(self.views[0], self.views[1]), self.views[2])
        for order in ((2, 0, 1), (1, 2, 0)):
            other = merge(merge(self.views[order[0]], self.views[order[1]]), self.views[order[2]])
            assert other == total
        assert total.ring(points_per_weight=PPW) == Ring(total.owner_weights(), points_per_weight=PPW)


Gossip.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
TestGossip = Gossip.TestCase
