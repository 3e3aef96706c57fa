"""The politeness scheduler: the Mercator back-queue heap over a bounded window of hosts.

A host in the window (*resident*: it has a `HostTurn` in memory) is in exactly one of three places: *waiting*
in the heap with the time it may next be fetched, *busy* (a worker holds it, so at most one request to a host is
ever in flight), or *idle* (no work known). The window holds at most ``max_active`` hosts with work (waiting or
busy); idle ones stay as a cache of their politeness state and are the first to go when room is needed.

Hosts with work beyond the window stay on disk, in the frontier's host table: `wake` of a host for which there
is no room refuses it and marks the scheduler *spilled*; the crawler then brings hosts in from the host table,
in ring order round and round, as room frees (`room`). While hosts wait on disk, a resident host gives up its
place after ``quantum`` turns in a row (its URLs stay queued on disk), so no host starves behind deep queues.

Nothing of a host's politeness is lost when it leaves the window: the crawler saves a host's state after every
request (`FrontierStore.put_state`), and ``recall`` makes a host's `HostTurn` from that saved state when it comes
back (Mercator's bounded back queues, with the host table on disk).

Time is passed in by the caller (trio time in the crawler, plain numbers in tests), so this is pure.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HostScheduler", "HostTurn"]


@dataclass(slots=True)
class HostTurn:
    """Per-host runtime politeness: when it may next be fetched and why."""

    host: str
    next_allowed: float = 0.0
    crawl_delay: float = 0.0
    backoff: float = 0.0
    failures: int = 0
    pages: int = 0
    bytes: int = 0
    busy: bool = False
    waiting: bool = False
    rounds: int = 0  # turns since it entered the window


class HostScheduler:
    """The heap of waiting hosts and the window of resident ones.

    ``max_active``: hosts with work held in memory at most (0: no bound). ``recall(host)``: the `HostTurn` of a
    host entering the window, made from its saved politeness state (default: a fresh one). ``quantum``: turns a
    host keeps its place while others wait on disk (0: until its queue is empty, as Mercator's back queues).
    """

    def __init__(self, *, max_active: int = 0, recall: Callable[[str], HostTurn] | None = None,
                 quantum: int = 0) -> None:
        if max_active < 0 or quantum < 0:
            raise ValueError(f"max_active and quantum must be >= 0, got {max_active} and {quantum}")
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self.turns: dict[str, HostTurn] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # resident hosts with no work, oldest first
        self.max_active = max_active
        self.quantum = quantum
        self._recall = recall if recall is not None else HostTurn
        #: hosts with work may be on disk outside the window (cleared by the caller after a full lap finds none)
        self.spilled = False
        #: times a host with work was left on disk (refused for want of room, or rotated out); the caller
        #: compares it across a lap of the host table to know that nothing was left behind
        self.spills = 0
        self.evicted = 0  # hosts that left the window (idle ones for room, busy ones rotated out)

    def turn(self, host: str) -> HostTurn:
        """The host's turn, brought into the window (idle) if it is not resident."""
        t = self.turns.get(host)
        if t is None:
            self._make_room()
            t = self.turns[host] = self._recall(host)
            self._idle[host] = None
        return t

    def _make_room(self) -> bool:
        """Room for one more resident host, evicting the longest-idle one if the window is full."""
        if not self.max_active or len(self.turns) < self.max_active:
            return True
        if self._idle:
            host, _ = self._idle.popitem(last=False)
            del self.turns[host]
            self.evicted += 1
            return True
        return False

    def wake(self, host: str, now: float) -> bool:
        """Work arrived for ``host``: queue it unless a worker holds it or it is already queued.

        A host outside a full window (every resident host has work) is refused and left on disk: the
        scheduler is then *spilled*. Returns True if the host entered the heap."""
        t = self.turns.get(host)
        if t is None:
            if not self._make_room():
                self.spill()
                return False
            t = self.turns[host] = self._recall(host)
        elif t.busy or t.waiting:
            return False
        else:
            self._idle.pop(host, None)
        t.waiting = True
        self._seq += 1
        heapq.heappush(self._heap, (max(now, t.next_allowed), self._seq, host))
        return True

    def pop_ready(self, now: float) -> HostTurn | None:
        """The host whose turn has come, marked busy; None if no host may be fetched at ``now``."""
        heap = self._heap
        if heap and heap[0][0] <= now:
            _, _, host = heapq.heappop(heap)
            t = self.turns[host]
            t.waiting = False
            t.busy = True
            return t
        return None

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def release(self, t: HostTurn, now: float, *, more_work: bool, may_leave: bool = False) -> bool:
        """A worker is done with the host; ``t.next_allowed`` already says when it may go again.

        With ``may_leave`` (its state is saved and nothing of its turn is held in memory), a host with more work
        that has had its ``quantum`` of turns while others wait on disk leaves the window: its URLs stay
        queued on disk. True if it left."""
        t.busy = False
        t.rounds += 1
        if more_work:
            if may_leave and self.spilled and self.quantum and t.rounds >= self.quantum:
                del self.turns[t.host]
                self.evicted += 1
                self.spill()
                return True
            self.wake(t.host, now)
        elif t.host in self.turns and not t.waiting:
            self._idle[t.host] = None
        return False

    def spill(self) -> None:
        """A host with work was left on disk by the caller (no room for it)."""
        self.spilled = True
        self.spills += 1

    def room(self) -> int:
        """How many more hosts with work the window takes (idle residents make way); large when unbounded."""
        if not self.max_active:
            return 1 << 62
        return self.max_active - (len(self.turns) - len(self._idle))

    def active(self) -> int:
        """Resident hosts with work: waiting or busy."""
        return len(self.turns) - len(self._idle)

    def __len__(self) -> int:
        return len(self._heap)

    def busy_count(self) -> int:
        return sum(1 for t in self.turns.values() if t.busy)
