"""Per-address politeness on one node: many host names share one server address, so the server's limits are
kept by address, not only by host.

An address has `connections` lanes. A request takes a free lane for its whole time in service and gives it
back when it ends; the lane may be taken again `delay` seconds after that end. So at any moment at most
`connections` requests are in service to the address, and with one lane no request starts sooner than
`delay` after the previous one ended.

Pure: time is passed in (trio time in the crawler, plain numbers in tests). The crawler asks before a host
turn's request (`try_acquire`); an address with no free lane answers when one may be free, and the host
waits in the scheduler until then instead of holding a worker (`peer/crawl/hostturns.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["AddressGate", "Lane"]

#: Addresses remembered at most; past it, addresses whose lanes are all free and rested are forgotten.
_MAX_ADDRESSES = 100_000


@dataclass(frozen=True, slots=True)
class Lane:
    """A lane of `address` held by one request; give it back with `AddressGate.release`. `before` is when it
    was free before it was taken (what it goes back to if no request was made after all)."""

    address: str
    index: int
    before: float
    lender: str = ""  # in a fleet, the node that lent it (peer/cluster/core/lanes.py)


class AddressGate:
    """`connections` lanes per address (0: no limits at all) reused `delay` seconds after a request ends."""

    __slots__ = ("connections", "delay", "_free_at")

    def __init__(self, connections: int, delay: float) -> None:
        if connections < 0:
            raise ValueError(f"connections must be >= 0, got {connections}")
        if not (delay >= 0 and math.isfinite(delay)):
            raise ValueError(f"delay must be a finite number >= 0, got {delay}")
        if delay > 0 and connections == 0:
            raise ValueError("a delay between requests to an address needs a connection cap (connections >= 1)")
        self.connections = connections
        self.delay = delay
        # address -> per lane: the time it may be taken again, or inf while a request holds it
        self._free_at: dict[str, list[float]] = {}

    @property
    def active(self) -> bool:
        """False when the gate limits nothing (connections 0): the crawler then skips it."""
        return self.connections > 0

    def try_acquire(self, address: str, now: float) -> Lane | float:
        """A lane for a request starting now, or the earliest time one may be free (inf: all are in service,
        one will be free only after a request ends)."""
        lanes = self._free_at.get(address)
        if lanes is None:
            if len(self._free_at) >= _MAX_ADDRESSES:
                self._forget(now)
            lanes = self._free_at[address] = [0.0] * self.connections
        best = math.inf
        for i, free_at in enumerate(lanes):
            if free_at <= now:
                lanes[i] = math.inf
                return Lane(address, i, free_at)
            best = min(best, free_at)
        return best

    def release(self, lane: Lane, now: float, *, used: bool = True) -> None:
        """The request on `lane` ended at `now` (``used``): the lane rests `delay`; or no request was made
        after all: the lane is as it was before it was taken."""
        lanes = self._free_at.get(lane.address)
        if lanes is None or lane.index >= len(lanes):
            return
        lanes[lane.index] = now + self.delay if used else lane.before

    def in_service(self, address: str) -> int:
        """Requests holding a lane of `address` now."""
        return sum(1 for free_at in self._free_at.get(address, ()) if free_at == math.inf)

    def _forget(self, now: float) -> None:
        for address in [a for a, lanes in self._free_at.items() if all(t <= now for t in lanes)]:
            del self._free_at[address]
