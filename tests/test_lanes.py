"""The fleet's per-address lanes (peer/cluster/core/lanes.py) between simulated nodes: messages go through an
in-memory bus with delays and a shared simulated clock; the code under test is the real FleetLanes. Every
request's [start, end] is recorded per address, and the rule is checked: never more than N in service at once,
and with one lane never a gap shorter than S, through ownership moves, deaths and lost messages."""

from __future__ import annotations

import heapq
import itertools
import math
import random

import pytest

from peer.cluster.core.cluster import LANES_FILE, _lent_until
from peer.cluster.core.lanes import LEASE, FleetLanes
from peer.crawl.addressgate import Lane
from protocol import LaneAsk, LaneHandover, Message

MAX_REQUEST = 1.0


class Sim:
    def __init__(self, names: list[str], connections: int, delay: float, seed: int) -> None:
        self.now = 0.0
        self.rng = random.Random(seed)
        self.events: list[tuple[float, int, object]] = []
        self.seq = itertools.count()
        self.alive = set(names)
        self.cut: set[str] = set()  # partitioned away: its messages are lost both ways
        self.owner_map: dict[str, str] = {}
        self.names = names
        self.requests: dict[str, list[tuple[float, float, str]]] = {}
        self.nodes = {n: FleetLanes(n, connections, delay, lease=LEASE, max_request=MAX_REQUEST,
                                    delegate=_Delegate(self, n), clock=lambda: self.now) for n in names}
        self.ready_calls: dict[str, int] = dict.fromkeys(names, 0)
        # with `park`, a host that finds no lane waits for `address_ready`, as the crawler's hosts do: (node,
        # address) -> the hosts parked there, each with when it parked
        self.park = False
        self.parked: dict[tuple[str, str], list[tuple[float, object]]] = {}
        self.set_owners(names)

    def set_owners(self, names: list[str]) -> None:
        live = sorted(names)
        self.owner_map = {a: live[int(a.rsplit(".", 1)[1]) % len(live)] for a in ADDRESSES}
        for n in live:
            self.nodes[n].ring_changed(lambda a, m=dict(self.owner_map): m[a])

    def at(self, t: float, fn) -> None:
        heapq.heappush(self.events, (t, next(self.seq), fn))

    def run_until(self, t_end: float) -> None:
        while self.events and self.events[0][0] <= t_end:
            t, _, fn = heapq.heappop(self.events)
            self.now = t
            fn()
        self.now = t_end

    def send(self, src: str, dst: str, message: Message) -> bool:
        if src in self.cut or dst in self.cut or self.rng.random() < 0.02:
            return True  # lost
        def deliver() -> None:
            if dst in self.alive:
                self.nodes[dst].on_message(src, message)
        self.at(self.now + self.rng.uniform(0.001, 0.05), deliver)
        return True


class _Delegate:
    def __init__(self, sim: Sim, name: str) -> None:
        self.sim, self.name = sim, name

    def owner_of(self, host: str) -> str:
        return self.sim.owner_map[host]

    def send_lanes(self, peer_id: str, message: Message) -> bool:
        return self.sim.send(self.name, peer_id, message)

    def address_ready(self, address: str) -> None:
        self.sim.ready_calls[self.name] += 1
        for _since, wake in self.sim.parked.pop((self.name, address), ()):
            self.sim.at(self.sim.now, wake)


ADDRESSES = ("10.0.0.1", "10.0.0.2", "10.0.0.3")


def _worker(sim: Sim, node: str, address: str) -> None:
    """A host's turns on `node`: try for a lane; with one, a request of random length, then release."""
    if node not in sim.alive:
        return
    lanes = sim.nodes[node]
    got = lanes.try_acquire(address, sim.now)
    if isinstance(got, Lane):
        start = sim.now
        length = sim.rng.uniform(0.001, MAX_REQUEST * 0.9)

        def end() -> None:
            if node not in sim.alive:
                return  # died mid-request: the request still ends at the server within MAX_REQUEST
            lanes.release(got, sim.now)
            sim.at(sim.now + sim.rng.uniform(0.0, 0.02), lambda: _worker(sim, node, address))

        sim.requests.setdefault(address, []).append((start, start + length, node))
        sim.at(start + length, end)
        return
    if got == math.inf and sim.park:
        sim.parked.setdefault((node, address), []).append((sim.now, lambda: _worker(sim, node, address)))
        return
    retry = got if got != math.inf else sim.now + sim.rng.uniform(0.05, 0.3)
    sim.at(max(retry, sim.now + 0.001), lambda: _worker(sim, node, address))


def _ticks(sim: Sim, node: str) -> None:
    if node in sim.alive:
        sim.nodes[node].tick(sim.alive)
        sim.at(sim.now + 0.1, lambda: _ticks(sim, node))


def _check(sim: Sim, connections: int, delay: float) -> None:
    assert sim.requests, "nothing was fetched"
    for address, reqs in sim.requests.items():
        events = sorted([(s, 1) for s, _, _ in reqs] + [(e, 0) for _, e, _ in reqs])
        active = best = 0
        for _, is_start in events:
            active += 1 if is_start else -1
            best = max(best, active)
        assert best <= connections, (address, best)
        if connections == 1:
            reqs = sorted(reqs)
            for (s1, e1, _), (s2, _, _) in zip(reqs, reqs[1:]):
                assert s2 - e1 >= delay - 1e-9, (address, s2 - e1)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("connections", "delay"), [(1, 0.2), (2, 0.0), (3, 0.1)])
def test_lanes_hold_through_moves_deaths_and_partitions(seed: int, connections: int, delay: float) -> None:
    names = ["A", "B", "C", "D"]
    sim = Sim(names, connections, delay, seed)
    for node in names:
        sim.at(0.0, lambda n=node: _ticks(sim, n))
        for address in ADDRESSES:
            for _ in range(3):  # three hosts on each address per node
                sim.at(sim.rng.uniform(0, 0.5), lambda n=node, a=address: _worker(sim, n, a))
    sim.run_until(10.0)
    # D dies: its lanes come back at their reclaim time; the ring moves its addresses to the others
    sim.alive.discard("D")
    sim.at(sim.now + 0.5, lambda: sim.set_owners(["A", "B", "C"]))
    sim.run_until(25.0)
    # C is cut off for a while (partition) then comes back; the ring does not change: lost messages only
    sim.cut.add("C")
    sim.run_until(35.0)
    sim.cut.clear()
    sim.run_until(50.0)
    _check(sim, connections, delay)
    late = {a: sum(1 for s, _, _ in r if s > 40.0) for a, r in sim.requests.items()}
    assert all(n > 0 for n in late.values()), late  # the lanes still move after all that
    assert sum(n.reclaimed for n in sim.nodes.values()) > 0  # D's lanes came back by lease expiry


def test_a_new_owner_waits_out_the_old_leases() -> None:
    sim = Sim(["A", "B"], 1, 0.0, 1)
    a, b = sim.nodes["A"], sim.nodes["B"]
    address = "10.0.0.2"  # owned by A under ["A", "B"]
    assert sim.owner_map[address] == "A"
    sim.run_until(a.quarantine + 0.1)  # A's own start quarantine
    got = b.try_acquire(address, sim.now)
    assert got == math.inf  # asked
    sim.run_until(sim.now + 0.2)
    lane = b.try_acquire(address, sim.now)
    assert isinstance(lane, Lane) and lane.lender == "A"
    # the ring moves the address to B: B lends nothing until every lease A made has run out
    sim.owner_map = {k: "B" for k in sim.owner_map}
    b.ring_changed(lambda _a: "B")
    a.ring_changed(lambda _a: "B")
    moved = sim.now
    b.release(lane, sim.now)  # back to its lender A, which no longer owns the address: ignored there
    for node in ("A", "B"):
        sim.at(sim.now, lambda n=node: _ticks(sim, n))
    assert a.try_acquire(address, sim.now) == math.inf  # asked B
    sim.run_until(moved + b.quarantine - 0.2)
    assert a.try_acquire(address, sim.now) == math.inf  # no grant yet: B waits out A's leases
    sim.run_until(moved + b.quarantine + 0.3)
    got = a.try_acquire(address, sim.now)
    assert isinstance(got, Lane) and got.lender == "B"


def test_a_hand_over_that_arrives_before_the_new_owners_ring_is_taken() -> None:
    """The old owner installs the new ring first as often as not (the new owner may still be building it): its
    hand-over then reaches the new owner before the ring that gives it the address. It is about that ring (sent
    from a later view than any in which the new owner did not own the address), so the new owner lends at once
    instead of waiting out the quarantine, a minute in which the address serves nobody."""
    sim = Sim(["A", "B"], 1, 0.0, 4)
    a, b = sim.nodes["A"], sim.nodes["B"]
    address = "10.0.0.2"  # owned by A under ["A", "B"]
    sim.run_until(a.quarantine + 0.1)
    lane = a.try_acquire(address, sim.now)
    assert isinstance(lane, Lane) and lane.lender == "A"
    a.release(lane, sim.now)
    sim.run_until(sim.now + a.quarantine)  # every lease A made has run out: its hand-over says "at once"
    sim.owner_map = {k: "B" for k in sim.owner_map}
    a.ring_changed(lambda _a: "B", 7)  # A first: it hands the address over from its view of epoch 7
    sim.run_until(sim.now + 0.2)  # the hand-over reaches B ...
    assert address in b._handed
    b.ring_changed(lambda _a: "B", 7)  # ... before B's own ring of that view gives it the address
    got = b.try_acquire(address, sim.now)  # lent by itself at once
    assert isinstance(got, Lane) and got.lender == "B"


def test_a_lane_out_on_lease_at_a_move_comes_back_through_the_old_owner() -> None:
    """A lane lent when its address moves is counted by the new owner until the lease could end (lease, longest
    request, rest); when it comes back to the old owner, the old owner tells the new one at once."""
    sim = Sim(["A", "B"], 1, 0.0, 6)
    a, b = sim.nodes["A"], sim.nodes["B"]
    address = "10.0.0.2"  # owned by A under ["A", "B"]
    sim.run_until(a.quarantine + 0.1)
    assert b.try_acquire(address, sim.now) == math.inf  # asked A
    sim.run_until(sim.now + 0.2)
    lane = b.try_acquire(address, sim.now)
    assert isinstance(lane, Lane) and lane.lender == "A"
    sim.owner_map = {k: "B" for k in sim.owner_map}
    moved = sim.now
    for node in (a, b):
        node.ring_changed(lambda _a: "B", 7)
    sim.run_until(sim.now + 0.2)
    assert not isinstance(b.try_acquire(address, sim.now), Lane)  # the lane is still out on A's lease
    b.release(lane, sim.now)
    for name in ("A", "B"):
        sim.at(sim.now, lambda n=name: _ticks(sim, n))
    # at the lease's end B gives the lane back to A, which no longer owns the address: A passes the word on
    sim.run_until(moved + a.lease + 0.3)
    got = b.try_acquire(address, sim.now)
    if not isinstance(got, Lane):
        sim.run_until(sim.now + 0.1)
        got = b.try_acquire(address, sim.now)
    assert isinstance(got, Lane) and got.lender == "B"
    assert sim.now < moved + a.lease + MAX_REQUEST  # long before A's lease could have run out
    assert a.returns_forwarded == 1


def test_a_hand_over_of_an_earlier_ownership_is_not_taken() -> None:
    sim = Sim(["A", "B"], 1, 0.0, 5)
    a, b = sim.nodes["A"], sim.nodes["B"]
    address = "10.0.0.2"  # owned by A under ["A", "B"] (epoch 0 here)
    sim.run_until(b.quarantine + 0.1)
    for node in (a, b):
        node.ring_changed(lambda _a: "B", 3)  # B owned it from epoch 3 ...
    sim.run_until(sim.now + 0.1)
    for node in (a, b):
        node.ring_changed(lambda _a: "A", 5)  # ... and lost it at epoch 5
    b.on_message("A", LaneHandover(address=address, ready_in=(0.0,), epoch=3))  # late: about epoch 3
    b.on_message("A", LaneHandover(address="10.0.0.3", ready_in=(0.0,)))  # a peer of an older protocol
    sim.run_until(sim.now + 0.1)
    gained = sim.now
    sim.owner_map = {k: "B" for k in sim.owner_map}
    for node in (a, b):
        node.ring_changed(lambda _a: "B", 9)  # B owns both again: it asks A, whose answer is its own wait
    for name in ("A", "B"):
        sim.at(sim.now, lambda n=name: _ticks(sim, n))
    for other in (address, "10.0.0.3"):
        assert not isinstance(b.try_acquire(other, sim.now), Lane)  # A's leases of epoch 5 on may still run
    sim.run_until(sim.now + 0.1)
    for other in (address, "10.0.0.3"):
        assert not isinstance(b.try_acquire(other, sim.now), Lane)
    sim.run_until(gained + b.quarantine + 0.3)
    got = b.try_acquire(address, sim.now)
    if not isinstance(got, Lane):  # the lane lent before was past its lease: asked again
        sim.run_until(sim.now + 0.1)
        got = b.try_acquire(address, sim.now)
    assert isinstance(got, Lane)


def test_a_fresh_start_lends_at_once_and_a_restart_waits_what_it_lent(tmp_path) -> None:
    assert _lent_until(tmp_path / LANES_FILE, 1000.0) == 0.0  # never lent to another node
    (tmp_path / LANES_FILE).write_text("1012.5\n")
    assert _lent_until(tmp_path / LANES_FILE, 1000.0) == 12.5
    assert _lent_until(tmp_path / LANES_FILE, 2000.0) == 0.0
    (tmp_path / LANES_FILE).write_text("garbage")
    assert _lent_until(tmp_path / LANES_FILE, 1000.0) is None  # unreadable: the whole wait
    for start_wait, lent_at_once in ((0.0, True), (None, False), (3.0, False)):
        sim = Sim(["A"], 1, 0.0, 2)
        sim.nodes["A"] = FleetLanes("A", 1, 0.0, lease=LEASE, max_request=MAX_REQUEST,
                                    delegate=_Delegate(sim, "A"), start_wait=start_wait, clock=lambda: sim.now)
        sim.nodes["A"].ring_changed(lambda _a: "A")
        got = sim.nodes["A"].try_acquire("10.0.0.1", sim.now)
        assert isinstance(got, Lane) is lent_at_once


def test_a_joiner_does_not_lend_what_it_owned_alone_before_it_joined() -> None:
    """A node that starts alone (a fresh data dir: no start wait) and then joins a cluster owned the whole ring
    only in its own head. Its first ring with the others must count as a change of owner: it waits for the old
    owner's hand-over or the quarantine, as the cluster's owner may still have lanes out on lease."""
    sim = Sim(["A"], 1, 0.0, 3)
    address = "10.0.0.2"
    a = sim.nodes["A"]
    sim.run_until(a.quarantine + 0.1)
    lane = a.try_acquire(address, sim.now)  # A, the cluster's owner, lends itself its lane
    assert isinstance(lane, Lane)
    c = FleetLanes("C", 1, 0.0, lease=LEASE, max_request=MAX_REQUEST, delegate=_Delegate(sim, "C"),
                   start_wait=0.0, clock=lambda: sim.now)
    sim.nodes["C"], sim.ready_calls["C"] = c, 0
    c.ring_changed(lambda _a: "C")  # C's own first ring: itself alone
    c.joining()
    sim.owner_map = {k: "C" for k in sim.owner_map}  # the cluster's ring gives the address to C
    joined = sim.now
    c.ring_changed(lambda _a: "C")
    assert not isinstance(c.try_acquire(address, sim.now), Lane)  # A's lease may still run
    sim.run_until(joined + c.quarantine + 0.3)
    assert isinstance(c.try_acquire(address, sim.now), Lane)  # the quarantine is over: every old lease ran out


def test_an_ask_made_again_keeps_its_place_in_line() -> None:
    sim = Sim(["A", "B", "C"], 1, 0.0, 3)
    address = "10.0.0.3"  # owned by A under ["A", "B", "C"]
    owner = sim.nodes[sim.owner_map[address]]
    sim.run_until(owner.quarantine + 0.1)
    assert isinstance(owner.try_acquire(address, sim.now), Lane)  # the owner holds the only lane
    others = [n for n in ("A", "B", "C") if n != owner.node_id]
    owner.on_message(others[0], LaneAsk(address=address, seq=1, want=1))
    owner.on_message(others[1], LaneAsk(address=address, seq=1, want=1))
    owner.on_message(others[0], LaneAsk(address=address, seq=2, want=1))  # asked again: still first
    assert [(node, seq) for node, seq, _, _ in owner._owned[address].asks] == [(others[0], 2), (others[1], 1)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("connections", "delay"), [(1, 0.2), (2, 0.0), (1, 2.5), (4, 3.0)])
def test_a_host_waiting_for_a_lane_is_always_woken(seed: int, connections: int, delay: float) -> None:
    """The crawler parks a host that finds no lane and tries it again only when `address_ready` says lanes
    arrived (or an ask went unanswered): so a host may park only while something is sure to wake it. Checked
    through ownership moves, a death and lost messages, with rests longer than a lease as well: no host stays
    parked past the quarantine, and every address keeps serving."""
    names = ["A", "B", "C", "D"]
    sim = Sim(names, connections, delay, 100 + seed)
    sim.park = True
    for node in names:
        sim.at(0.0, lambda n=node: _ticks(sim, n))
        for address in ADDRESSES:
            for _ in range(2):
                sim.at(sim.rng.uniform(0, 0.5), lambda n=node, a=address: _worker(sim, n, a))
    sim.run_until(10.0)
    sim.alive.discard("D")
    sim.parked = {k: v for k, v in sim.parked.items() if k[0] != "D"}
    sim.at(sim.now + 0.5, lambda: sim.set_owners(["A", "B", "C"]))
    sim.run_until(40.0)
    quarantine = sim.nodes["A"].quarantine
    _check(sim, connections, delay)
    stuck = {key: [round(sim.now - since, 1) for since, _ in hosts] for key, hosts in sim.parked.items()
             if any(sim.now - since > quarantine + delay + 1.0 for since, _ in hosts)}
    assert not stuck, stuck
    late = {a: sum(1 for start, _end, _node in sim.requests.get(a, ()) if start > 30.0) for a in ADDRESSES}
    assert all(late.values()), late  # every address still serves

