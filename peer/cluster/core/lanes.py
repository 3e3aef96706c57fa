"""Per-address limits across the fleet: the ring gives each server address an owner, which lends its lanes to
the nodes that have hosts on that address, for a lease, a batch of requests at a time.

The rule (docs/cluster.md, "Per-address limits", has the proof sketch):

- An address has `connections` lanes. Only its owner lends them, and a lane is lent to one node at a time.
- The borrower starts requests on a lane only before `lease` seconds after it *sent* the ask the grant answers,
  and only after the lane's `ready_in`, counted from the grant's receipt. A request on a lane ends within
  `max_request` seconds of its start (the fetcher's total time-out). After a request ends the lane rests
  `delay` seconds on the borrower before it starts another one; a lane given back carries the rest still due.
- The owner takes a lane back when it is returned (free `ready_in` after receipt) or, if it never is (the
  borrower died or is cut off), `lease + max_request + delay` after the grant. A new owner of an address (a
  view change moved it here) lends none of its lanes until the previous owner's `LaneHandover` arrives (sent
  once that owner stopped lending, with when each lane may be lent again) or, failing that (it died),
  `quarantine = lease + max_request + delay` after it became the owner, so every older lease has run out (a
  hand-over that arrives before the ring giving this node the address counts when its view epoch is later
  than every remembered view in which another node owned it: `_handed_for_now`). A
  process that starts waits out what its previous run may have lent (`start_wait`, from a file the cluster
  keeps), none if it never lent to another node.

Everything is a duration on the wire and a local trio time on each side: the two clocks are never compared.
Lanes on the node that owns the address are lent to itself the same way, without a message.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from protocol import LaneAsk, LaneGrant, LaneHandover, LaneHandoverAsk, LaneReturn, Message

from peer.crawl.addressgate import Lane

__all__ = ["LEASE", "FleetLanes", "LanesDelegate"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.lanes")

#: An ask not answered in this long may be sent again (to the owner of the current view).
ASK_TIMEOUT = 2.0
#: How long a grant lets a node start requests on its lanes: one ask per lease per address per node, so a
#: round trip is paid once per this many seconds of requests, not per request.
LEASE = 2.0
#: Rings remembered to tell since when this node has owned an address.
_RING_HISTORY = 16
#: Hand-overs remembered to answer asks, at most (they are forgotten after the quarantine anyway).
MAX_REMEMBERED = 100_000


class LanesDelegate(Protocol):
    """What the lanes ask of the cluster around them."""

    def owner_of(self, host: str) -> str:
        """The owner of a ring key under the current view (an address is a key like a host name)."""

    def send_lanes(self, peer_id: str, message: Message) -> bool:
        """Send a lane message to a peer without waiting; False if it could not be queued."""

    def address_ready(self, address: str) -> None:
        """Lanes of `address` arrived here: hosts waiting for them may try again."""

    def successor_of(self, host: str) -> str | None:
        """The node that would own a ring key if this node were not in the ring (None if it is alone)."""


@dataclass(slots=True)
class _OwnedLane:
    holder: str | None = None
    free_at: float = 0.0  # when it may next be lent (its rest after the last request)
    reclaim_at: float = math.inf  # while lent: when it is free again if never returned
    handed: bool = False  # free_at is the previous owner's word (a later hand-over of its replaces it)


@dataclass(slots=True)
class _Owned:
    since: float  # when this node became the owner of the address
    lanes: list[_OwnedLane]
    asks: deque[tuple[str, int, int, float]] = field(default_factory=deque)  # node, seq, want, asked at


@dataclass(slots=True)
class _Held:
    # (lender, lane) -> [free_at (inf: in service), deadline]
    lanes: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    asked_seq: int | None = None
    asked_at: float = -math.inf
    sent_at: dict[int, float] = field(default_factory=dict)  # ask seq -> when it was sent


class FleetLanes:
    """Both sides of the lane protocol on one node: the owner of the addresses the ring gives it, and the
    borrower for the crawler (`try_acquire` / `release`, as `peer.crawl.addressgate.AddressGate`)."""

    def __init__(
        self,
        node_id: str,
        connections: int,
        delay: float,
        *,
        lease: float,
        max_request: float,
        delegate: LanesDelegate,
        start_wait: float | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        if connections < 1:
            raise ValueError(f"fleet lanes need connections >= 1, got {connections}")
        self.node_id = node_id
        self.connections = connections
        self.delay = delay
        self.lease = lease
        self.max_request = max_request
        self.quarantine = lease + max_request + delay
        self.delegate = delegate
        self.clock = clock
        self._owned: dict[str, _Owned] = {}
        self._held: dict[str, _Held] = {}
        self._seq = 0
        # (installed at, owner of an address, the view epoch): the rings remembered, oldest first
        self._rings: deque[tuple[float, Callable[[str], str], int]] = deque(maxlen=_RING_HISTORY)
        # the first ring is the process start: what a previous run lent may still run for `start_wait`
        self._start_wait = self.quarantine if start_wait is None else min(max(0.0, start_wait), self.quarantine)
        self._started_at: float | None = None
        # address -> (received at, ready_in, the sender's view epoch): hand-overs of addresses not owned here yet
        self._handed: dict[str, tuple[float, tuple[float, ...], int]] = {}
        # address -> (when, ready_in): what this node said in its hand-over when the address moved away, to
        # answer the new owner's LaneHandoverAsk if the hand-over was lost or thrown away
        self._released: dict[str, tuple[float, tuple[float, ...]]] = {}
        # address -> its entry when it moved away: lanes still out on lease come back here, and the new owner is
        # told at once (a lane in use at the change would otherwise wait out its whole lease, up to a minute)
        self._gone: dict[str, _Owned] = {}
        self._current_epoch = 0
        self.lent_until = -math.inf  # the latest time a lane lent to another node may still be in use
        self.grants_sent = 0
        self.asks_sent = 0
        self.reclaimed = 0
        self.handover_asks = 0  # LaneHandoverAsk sent: a new owner with no hand-over asked its previous owner
        self.handover_answers = 0  # hand-overs sent in answer to one
        self.returns_forwarded = 0  # lanes returned here after their address moved away, passed on to its owner

    active = True

    # -- the view --------------------------------------------------------------------------------------------

    def ring_changed(self, owner_of: Callable[[str], str], epoch: int = 0) -> None:
        """A new ring is in force (the first one at start), from the view of `epoch`: owned addresses that moved
        away stop being lent from here (their leases run out on their own); asks from departed members are
        dropped later."""
        now = self.clock()
        if self._started_at is None:
            self._started_at = now
        self._rings.append((now, owner_of, epoch))
        self._current_epoch = epoch
        for address in [a for a in self._owned if owner_of(a) != self.node_id]:
            entry = self._owned.pop(address)
            # hand over: from now on nothing is lent here; each lane may be lent again once its lease (with its
            # longest request and rest) is over, or its rest, or this node's own wait, has run out
            wait = max(0.0, self._ready_at(entry) - now)
            ready = tuple(
                max(wait, (lane.reclaim_at if lane.holder is not None else lane.free_at) - now, 0.0)
                for lane in entry.lanes
            )
            target = owner_of(address)
            message = LaneHandover(address=address, ready_in=ready, epoch=epoch)
            if target == self.node_id:
                continue
            if len(self._released) < MAX_REMEMBERED:
                self._released[address] = (now, ready)
                if any(lane.holder is not None for lane in entry.lanes):
                    self._gone[address] = entry
            self.delegate.send_lanes(target, message)
        for address in [a for a in self._handed if now - self._handed[a][0] > self.quarantine]:
            del self._handed[address]
        for address in [a for a, (at, _ready) in self._released.items() if now - at > self.quarantine]:
            del self._released[address]
            self._gone.pop(address, None)
        for address in [a for a in self._gone if owner_of(a) == self.node_id]:
            del self._gone[address]  # owned here again: its new entry waits for the hand-overs

    def joining(self) -> None:
        """This node is about to join a cluster: the rings it had on its own (all of them itself alone) owned
        nothing that a member did not lend first. Forgotten, so an address it owns in its first ring with the
        others counts as newly gained from its previous owner: it waits for that owner's hand-over, or the
        quarantine, before lending, as after any change of owner. (Kept, a joiner would lend at once lanes the
        cluster's owner still has out on lease.)"""
        self._rings.clear()
        self._start_wait = self.quarantine  # what a previous run lent is inside the quarantine anyway
        for address in [a for a, entry in self._owned.items() if not any(lane.holder for lane in entry.lanes)]:
            del self._owned[address]

    def _owned_since(self, address: str) -> float:
        """Since when this node has owned `address` without a break, by the rings remembered (the oldest one
        remembered counts from when it came in: the process start, or as far back as is known)."""
        since = math.inf
        for installed, owner_of, _epoch in reversed(self._rings):
            if owner_of(address) != self.node_id:
                break
            since = installed
        return since

    # -- the borrower (the crawler's side) --------------------------------------------------------------------

    def try_acquire(self, address: str, now: float) -> Lane | float:
        """A lane for a request starting now; else the time one held here rests until, or inf when none is
        held (an ask goes to the owner; the crawler is told by `address_ready` when lanes arrive)."""
        held = self._held.get(address)
        if held is None:
            held = self._held[address] = _Held()
        best = math.inf
        for key, (free_at, deadline) in held.lanes.items():
            if free_at <= now < deadline:
                held.lanes[key][0] = math.inf
                return Lane(address, key[1], free_at, key[0])
            if free_at < deadline:
                best = min(best, free_at)
        if best == math.inf:
            self._ask(address, held, now)
            for key, (free_at, deadline) in held.lanes.items():  # the owner may be this node: lent at once
                if free_at <= now < deadline:
                    held.lanes[key][0] = math.inf
                    return Lane(address, key[1], free_at, key[0])
                if free_at < deadline:
                    best = min(best, free_at)
        return best

    def release(self, lane: Lane, now: float, *, used: bool = True) -> None:
        held = self._held.get(lane.address)
        key = (lane.lender, lane.index)
        if held is None or key not in held.lanes:
            return
        entry = held.lanes[key]
        entry[0] = now + self.delay if used else lane.before
        if entry[0] >= entry[1]:  # the lease ends before the lane could be used again: give it back now
            self._give_back(lane.address, held, [key], now)

    def in_service(self, address: str) -> int:
        held = self._held.get(address)
        return 0 if held is None else sum(1 for free_at, _ in held.lanes.values() if free_at == math.inf)

    def _ask(self, address: str, held: _Held, now: float) -> None:
        if held.asked_seq is not None and now - held.asked_at < ASK_TIMEOUT:
            return
        self._seq += 1
        seq = self._seq
        held.asked_seq, held.asked_at = seq, now
        held.sent_at[seq] = now
        if len(held.sent_at) > 8:
            del held.sent_at[min(held.sent_at)]
        owner = self.delegate.owner_of(address)
        message = LaneAsk(address=address, seq=seq, want=self.connections)
        self.asks_sent += 1
        if owner == self.node_id:
            self._on_ask(self.node_id, message, now)
        else:
            self.delegate.send_lanes(owner, message)

    def _on_grant(self, lender: str, message: LaneGrant, now: float) -> None:
        held = self._held.setdefault(message.address, _Held())
        sent = held.sent_at.pop(message.seq, None)
        if sent is None:  # an answer to an ask not made (or long forgotten): give the lanes straight back
            self._return(lender, message.address, list(message.lanes), list(message.ready_in), now)
            return
        if held.asked_seq == message.seq:
            held.asked_seq = None
        deadline = sent + message.lease
        for index, ready_in in zip(message.lanes, message.ready_in):
            held.lanes[(lender, index)] = [now + ready_in, deadline]
        self.delegate.address_ready(message.address)

    def _give_back(self, address: str, held: _Held, keys: list[tuple[str, int]], now: float) -> None:
        """Lanes go back to the node that lent them, with the rest still due on each."""
        by_lender: dict[str, tuple[list[int], list[float]]] = {}
        for key in keys:
            free_at = held.lanes.pop(key)[0]
            indexes, ready = by_lender.setdefault(key[0], ([], []))
            indexes.append(key[1])
            ready.append(max(0.0, free_at - now))
        for lender, (indexes, ready) in by_lender.items():
            self._return(lender, address, indexes, ready, now)

    def _return(self, lender: str, address: str, indexes: list[int], ready: list[float], now: float) -> None:
        if not indexes:
            return
        message = LaneReturn(address=address, lanes=tuple(indexes), ready_in=tuple(ready))
        if lender == self.node_id:
            self._on_return(self.node_id, message, now)
        else:
            self.delegate.send_lanes(lender, message)

    # -- the owner --------------------------------------------------------------------------------------------

    def _ready_at(self, entry: _Owned) -> float:
        """When the owner may start lending: its wait after becoming the owner is over."""
        if entry.since == -math.inf:
            return -math.inf  # handed over
        if entry.since == self._started_at:
            return entry.since + self._start_wait
        return entry.since + self.quarantine

    def _owned_entry(self, address: str, now: float) -> _Owned | None:
        entry = self._owned.get(address)
        if entry is None:
            if self.delegate.owner_of(address) != self.node_id:
                return None
            entry = self._owned[address] = _Owned(
                since=self._owned_since(address), lanes=[_OwnedLane() for _ in range(self.connections)]
            )
            handed = self._handed.pop(address, None)
            if handed is not None and (handed[0] >= entry.since or self._handed_for_now(address, handed[2])):
                self._apply_handover(entry, handed[0], handed[1])
            elif now < self._ready_at(entry):
                self._ask_handover(address)
        return entry

    def _ask_handover(self, address: str) -> None:
        """No hand-over for an address just found owned here: ask the previous owner (by the rings remembered,
        else, for a node that has just joined, the node that owns it without this one) for what it knows. Its
        own hand-over may have been lost, or it never lent the address and so sent none (it still knows when
        the leases of the owner before it ran out); without an answer the quarantine stands."""
        previous = None
        for _installed, owner_of, _epoch in reversed(self._rings):
            owner = owner_of(address)
            if owner != self.node_id:
                previous = owner
                break
        else:
            successor = getattr(self.delegate, "successor_of", None)
            previous = successor(address) if successor is not None else None
        if previous is None or previous == self.node_id:
            return
        self.handover_asks += 1
        self.delegate.send_lanes(previous, LaneHandoverAsk(address=address, epoch=self._current_epoch))

    def _on_handover_ask(self, peer_id: str, message: LaneHandoverAsk, now: float) -> None:
        """Answer a new owner that has no hand-over, if this node owned the address just before it (by the rings
        remembered here: no other owner between): when each lane may be lent again, by what this node handed
        over, or else by its own wait (it lent nothing: its wait covered the leases of the owner before it)."""
        address = message.address
        if self.delegate.owner_of(address) != peer_id:
            return  # our views differ: the asker asks again, or waits out the quarantine
        rings = list(self._rings)
        while rings and rings[-1][1](address) == peer_id:
            rings.pop()  # the asker's own time as owner
        if not rings or rings[-1][1](address) != self.node_id:
            return  # not the owner just before it (or too long ago to know): no answer
        period_start, period_epoch = rings[-1][0], rings[-1][2]
        while rings and rings[-1][1](address) == self.node_id:
            period_start, period_epoch = rings[-1][0], rings[-1][2]
            rings.pop()
        released = self._released.get(address)
        if released is not None and released[0] >= period_start:
            at, ready = released
            answer = tuple(max(0.0, r - (now - at)) for r in ready)
        else:
            if period_start == self._started_at:
                wait_end = period_start + self._start_wait
            else:
                wait_end = period_start + self.quarantine
            handed = self._handed.get(address)
            if handed is not None and (handed[0] >= period_start or (handed[2] > 0 and handed[2] >= period_epoch)):
                received, ready_in = handed[0], handed[1]
                longest = max(ready_in, default=0.0)
                answer = tuple(max(0.0, received + (ready_in[i] if i < len(ready_in) else longest) - now)
                               for i in range(self.connections))
            else:
                answer = (max(0.0, wait_end - now),) * self.connections
        self.handover_answers += 1
        self.delegate.send_lanes(peer_id, LaneHandover(address=address, ready_in=answer, epoch=self._current_epoch))

    def _handed_for_now(self, address: str, epoch: int) -> bool:
        """Whether a hand-over sent from a view of `epoch`, received before this node's own ring gave it the
        address, is about the ownership that ring began: it was sent after every view remembered here in which
        another node owned the address. (The previous owner installs the new ring first as often as not, so
        its hand-over often arrives before the new owner's ring does: taken only by arrival time it was thrown
        away, and the new owner waited out the whole quarantine, a minute in which the address served nobody.)
        An older hand-over, of an earlier time this node owned the address, comes from a view no later than one
        in which it did not."""
        if epoch <= 0:
            return False  # a peer that speaks an older protocol sends no epoch: arrival time alone decides
        for _installed, owner_of, seen in reversed(self._rings):
            if owner_of(address) != self.node_id:
                return epoch > seen
        return True  # owned in every ring remembered since this process started or joined

    def _apply_handover(self, entry: _Owned, received: float, ready_in: tuple[float, ...]) -> None:
        longest = max(ready_in, default=0.0)
        for i, lane in enumerate(entry.lanes):
            if lane.holder is None:
                said = received + (ready_in[i] if i < len(ready_in) else longest)
                # a later word of the previous owner replaces its earlier one (a lane came back to it); a lane
                # this node has lent since is its own
                lane.free_at = said if lane.handed else max(lane.free_at, said)
                lane.handed = True
        entry.since = -math.inf

    def _on_handover(self, message: LaneHandover, now: float) -> None:
        entry = self._owned.get(message.address)
        if entry is not None:
            self._apply_handover(entry, now, message.ready_in)
            self._serve(message.address, entry, now)
        elif len(self._handed) < 100_000:
            self._handed[message.address] = (now, message.ready_in, message.epoch)

    def _on_ask(self, peer_id: str, message: LaneAsk, now: float) -> None:
        entry = self._owned_entry(message.address, now)
        if entry is None:
            return  # not ours under our view: the asker asks again once its view agrees
        # An ask made again keeps its place in the line (first come, first served, so no node is starved by
        # the others' quicker re-asks); only its seq and want are brought up to date.
        for i, (node, _seq, _want, asked) in enumerate(entry.asks):
            if node == peer_id:
                entry.asks[i] = (peer_id, message.seq, message.want, asked)
                break
        else:
            entry.asks.append((peer_id, message.seq, message.want, now))
        self._serve(message.address, entry, now)

    def _on_return(self, peer_id: str, message: LaneReturn, now: float) -> None:
        entry = self._owned.get(message.address)
        if entry is None:
            self._returned_after_move(peer_id, message, now)
            return
        for index, ready_in in zip(message.lanes, message.ready_in):
            if 0 <= index < len(entry.lanes) and entry.lanes[index].holder == peer_id:
                lane = entry.lanes[index]
                lane.holder, lane.free_at, lane.reclaim_at = None, now + ready_in, math.inf
        self._serve(message.address, entry, now)

    def _returned_after_move(self, peer_id: str, message: LaneReturn, now: float) -> None:
        """A lane lent here before the address moved away came back: tell the new owner when each lane may be
        lent again now (the hand-over said: when its lease runs out)."""
        entry = self._gone.get(message.address)
        if entry is None:
            return
        changed = False
        for index, ready_in in zip(message.lanes, message.ready_in):
            if 0 <= index < len(entry.lanes) and entry.lanes[index].holder == peer_id:
                lane = entry.lanes[index]
                lane.holder, lane.free_at, lane.reclaim_at = None, now + ready_in, math.inf
                changed = True
        if not changed:
            return
        target = self.delegate.owner_of(message.address)
        if target == self.node_id:
            return
        ready = tuple(max((lane.reclaim_at if lane.holder is not None else lane.free_at) - now, 0.0)
                      for lane in entry.lanes)
        if not any(lane.holder is not None for lane in entry.lanes):
            del self._gone[message.address]
        self._released[message.address] = (now, ready)
        self.returns_forwarded += 1
        self.delegate.send_lanes(target, LaneHandover(address=message.address, ready_in=ready,
                                                      epoch=self._current_epoch))

    def _serve(self, address: str, entry: _Owned, now: float) -> None:
        if now < self._ready_at(entry):
            return  # leases a previous owner (or this node's previous run) made may still run
        # a lane the previous owner's word still holds is not lent until it is free: the old owner's later word
        # (the lane came back to it) may free it sooner
        free = [i for i, lane in enumerate(entry.lanes)
                if lane.holder is None and not (lane.handed and lane.free_at > now)]
        while entry.asks and free:
            # lanes are shared among the nodes waiting, so each gets some at once rather than all to the first
            share = max(1, len(free) // len(entry.asks))
            peer_id, seq, want, _asked = entry.asks.popleft()
            given: list[int] = []
            ready: list[float] = []
            while free and len(given) < min(want, share):
                index = free.pop(0)
                lane = entry.lanes[index]
                lane.holder, lane.handed = peer_id, False
                lane.reclaim_at = now + self.lease + self.max_request + self.delay
                if peer_id != self.node_id:
                    self.lent_until = max(self.lent_until, lane.reclaim_at)
                given.append(index)
                ready.append(max(0.0, lane.free_at - now))
            grant = LaneGrant(address=address, seq=seq, lanes=tuple(given), ready_in=tuple(ready), lease=self.lease)
            self.grants_sent += 1
            if peer_id == self.node_id:
                self._on_grant(self.node_id, grant, now)
            else:
                self.delegate.send_lanes(peer_id, grant)

    # -- time and messages -------------------------------------------------------------------------------------

    def tick(self, members: set[str] | None = None) -> None:
        """Lanes lent and never returned come back at their reclaim time; lanes held here past their lease
        go back; quarantines that ended serve their asks; asks from nodes no longer members are dropped."""
        now = self.clock()
        for address, held in list(self._held.items()):
            expired = [key for key, (free_at, deadline) in held.lanes.items()
                       if free_at != math.inf and (free_at >= deadline or now >= deadline)]
            if expired:
                self._give_back(address, held, expired, now)
            if held.asked_seq is not None and now - held.asked_at >= ASK_TIMEOUT:
                held.asked_seq = None  # unanswered (the owner died, or its view differs): hosts try again
                self.delegate.address_ready(address)
            if not held.lanes and held.asked_seq is None and not held.sent_at:
                del self._held[address]
        for address, entry in list(self._owned.items()):
            for lane in entry.lanes:
                if lane.holder is not None and now >= lane.reclaim_at:
                    lane.holder, lane.free_at, lane.reclaim_at = None, lane.reclaim_at, math.inf
                    self.reclaimed += 1
            if members is not None:
                entry.asks = deque(a for a in entry.asks if a[0] in members)
            self._serve(address, entry, now)

    def on_message(self, peer_id: str, message: Message) -> bool:
        """Handle a lane message; False if `message` is not one."""
        now = self.clock()
        if isinstance(message, LaneAsk):
            self._on_ask(peer_id, message, now)
        elif isinstance(message, LaneGrant):
            self._on_grant(peer_id, message, now)
        elif isinstance(message, LaneReturn):
            self._on_return(peer_id, message, now)
        elif isinstance(message, LaneHandover):
            self._on_handover(message, now)
        elif isinstance(message, LaneHandoverAsk):
            self._on_handover_ask(peer_id, message, now)
        else:
            return False
        return True

    def status(self) -> dict[str, int]:
        return {
            "addresses_owned": len(self._owned),
            "addresses_held": sum(1 for h in self._held.values() if h.lanes),
            "lanes_held": sum(len(h.lanes) for h in self._held.values()),
            "asks_sent": self.asks_sent,
            "grants_sent": self.grants_sent,
            "lanes_reclaimed": self.reclaimed,
            "handover_asks": self.handover_asks,
            "handover_answers": self.handover_answers,
            "returns_forwarded": self.returns_forwarded,
        }
