"""The politeness scheduler: the Mercator back-queue heap, one entry per host that has work.

A host is in exactly one of three places: *waiting* in the heap with the time it may next be fetched,
*busy* (a worker holds it, so at most one request to a host is ever in flight), or *idle* (no work known).
Time is passed in by the caller (trio time in the crawler, plain numbers in tests), so this is pure.
"""

from __future__ import annotations

import heapq
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


class HostScheduler:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._seq = 0
        self.turns: dict[str, HostTurn] = {}

    def turn(self, host: str) -> HostTurn:
        t = self.turns.get(host)
        if t is None:
            t = self.turns[host] = HostTurn(host)
        return t

    def wake(self, host: str, now: float) -> bool:
        """Work arrived for ``host``: queue it unless a worker holds it or it is already queued.

        Returns True if the host entered the heap."""
        t = self.turn(host)
        if t.busy or t.waiting:
            return False
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

    def release(self, t: HostTurn, now: float, *, more_work: bool) -> None:
        """A worker is done with the host; ``t.next_allowed`` already says when it may go again."""
        t.busy = False
        if more_work:
            self.wake(t.host, now)

    def __len__(self) -> int:
        return len(self._heap)

    def busy_count(self) -> int:
        return sum(1 for t in self.turns.values() if t.busy)
