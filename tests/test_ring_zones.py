"""Failure zones (ring/_zones.py): a position's holders keep a copy outside its owner's zone, on the node that owns
the position once that whole zone is gone; the zone travels in the view and on the wire (protocol version 4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import TYPE_CODES, Gossip, Limits, Member as WireMember, decode_body, encode_body
from ring import Member, MemberState, Ring, View, Zones, check_zone, host_position
from peer.cluster.membership.membership import from_wire, to_wire

LIMITS = Limits()
POSITIONS = [host_position(f"host-{i}.test") for i in range(400)]


def _fleet(draw_zones: list[int], weights: list[int]) -> tuple[Ring, Zones]:
    nodes = {f"n{i}": w for i, w in enumerate(weights)}
    zones = Zones({f"n{i}": f"z{z}" for i, z in enumerate(draw_zones)})
    return Ring(nodes, points_per_weight=5), zones


@settings(max_examples=60, deadline=None)
@given(data=st.data(), count=st.integers(1, 3))
def test_a_zone_lost_at_once_hands_each_position_to_a_node_holding_it(data, count) -> None:
    size = data.draw(st.integers(2, 9), label="nodes")
    weights = data.draw(st.lists(st.integers(1, 30), min_size=size, max_size=size), label="weights")
    zone_ids = data.draw(st.lists(st.integers(0, 2), min_size=size, max_size=size), label="zones")
    ring, zones = _fleet(zone_ids, weights)
    for position in POSITIONS[:120]:
        owner = ring.owner_at(position)
        plain = ring.backups_at(position, count)
        holders = ring.holders_at(position, count, zones)
        assert holders[:len(plain)] == plain  # the backups come first, in order
        assert owner not in holders and len(set(holders)) == len(holders)
        assert len(holders) <= len(plain) + 1
        home = zones.zone(owner)
        others = {n: w for n, w in ring.weights.items() if zones.zone(n) != home}
        if not others:
            assert holders == plain  # the whole ring is one zone: nothing more can be done
            continue
        # the owner's whole zone gone: the new owner already holds the position's copy
        assert Ring(others, points_per_weight=5).owner_at(position) in holders
        if len(holders) > len(plain):
            assert all(zones.zone(n) == home for n in plain) and zones.zone(holders[-1]) != home


def test_without_zones_or_with_zoneless_owners_the_holders_are_the_backups() -> None:
    ring = Ring({"a": 10, "b": 10, "c": 10, "d": 10}, points_per_weight=20)
    partly = Zones({"a": "m1", "b": "m1"})  # c and d named no zone: each is a zone of its own
    for position in POSITIONS:
        plain = ring.backups_at(position, 1)
        assert ring.holders_at(position, 1) == plain
        assert ring.holders_at(position, 1, Zones()) == plain
        assert ring.holders_at(position, 0, partly) == ()
        if ring.owner_at(position) in ("c", "d"):
            assert ring.holders_at(position, 1, partly) == plain


def test_nodes_sharing_a_machine_get_one_copy_off_it() -> None:
    ring = Ring({"a1": 50, "a2": 50, "a3": 50, "b1": 50}, points_per_weight=20)
    zones = Zones({"a1": "m1", "a2": "m1", "a3": "m1", "b1": "m2"})
    extra = 0
    for position in POSITIONS:
        holders = ring.holders_at(position, 1, zones)
        if zones.zone(ring.owner_at(position)) == "m1":
            assert "b1" in holders
            extra += len(holders) == 2
        else:
            assert len(holders) == 1
    assert extra > 0  # an owner on m1 whose first backup is on m1 too gets the extra copy


def test_zone_names_are_checked() -> None:
    assert check_zone("rack-7/host.example") == "rack-7/host.example"
    for bad in ("two words", "x" * 65, "tab\t", "é", 7):
        with pytest.raises(ValueError, match="zone"):
            check_zone(bad)
    with pytest.raises(ValueError, match="zone"):
        Member(node_id="a", address="127.0.0.1:1", weight=1, zone="bad zone")


def test_the_view_carries_zones_and_a_new_zone_is_a_new_incarnation() -> None:
    view = View().join("a", "127.0.0.1:1", 10, "m1").join("b", "127.0.0.1:2", 10)
    assert view.member("a").zone == "m1" and view.member("b").zone == ""
    assert dict(view.zones()) == {"a": "m1"}
    moved = view.join("a", "127.0.0.1:1", 10, "m2")
    assert moved.member("a").zone == "m2" and moved.member("a").incarnation == 1
    assert moved.fingerprint() != view.fingerprint()
    # a member without a zone digests as it did before zones existed
    plain = View().join("b", "127.0.0.1:2", 10)
    assert plain.fingerprint() == View(epoch=plain.epoch, members=(
        Member(node_id="b", address="127.0.0.1:2", weight=10),)).fingerprint()
    dead = moved.update("a", state=MemberState.DEAD)
    assert "a" not in dead.zones()  # only members that own arcs


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_zones_cross_the_wire_in_version_4_and_older_versions_read_none(codec) -> None:
    record = Member(node_id="a", address="127.0.0.1:1", weight=10, incarnation=2, zone="m1")
    gossip = Gossip(epoch=9, full=True, members=(to_wire(record),))
    code, body = encode_body(gossip, codec, LIMITS, version=4)
    assert from_wire(decode_body(code, body, codec, LIMITS, version=4).members[0]) == record
    code, old = encode_body(gossip, codec, LIMITS, version=3)
    assert b"m1" not in old
    back = decode_body(TYPE_CODES[Gossip], old, codec, LIMITS, version=3).members[0]
    assert isinstance(back, WireMember) and back.zone == ""
    assert from_wire(back) == Member(node_id="a", address="127.0.0.1:1", weight=10, incarnation=2)
