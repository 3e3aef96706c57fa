"""The frontier's API in memory, for unit tests and small runs: nothing survives the process.

It mirrors `FrontierStore` exactly (breadth-first order, in-flight records, arcs in ring order), so a test
written against one runs against the other.
"""

from __future__ import annotations

import bisect
import heapq
import os
from collections.abc import Iterable, Iterator, Sequence

from ._closing import Closing
from ._keys import host_position, in_arc
from ._records import HostState, QueuedUrl

__all__ = ["MemoryFrontierStore"]

_MAX_DEPTH = 2**32 - 1


def _ring_order(host: str) -> tuple[int, str]:
    return host_position(host), host


class MemoryFrontierStore(Closing):
    """Per-host heaps of (depth, seq, item); in-flight items keyed by (host, url)."""

    def __init__(self) -> None:
        self._queues: dict[str, list[tuple[int, int, QueuedUrl]]] = {}
        self._flight: dict[tuple[str, str], tuple[int, int, int, QueuedUrl]] = {}
        self._states: dict[str, HostState] = {}
        self._seq = 0
        self._total = 0

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, **_options: object) -> MemoryFrontierStore:
        return cls()


    def push(self, items: Sequence[QueuedUrl]) -> None:
        for item in items:
            if not item.host or "\x00" in item.host:
                raise ValueError(f"host must be a non-empty name without NUL, got {item.host!r}")
            if not 0 <= item.depth <= _MAX_DEPTH:
                raise ValueError(f"depth must be in [0, 2**32), got {item.depth} for {item.url!r}")
        for item in items:
            self._seq += 1
            heapq.heappush(self._queues.setdefault(item.host, []), (item.depth, self._seq, item))
            self._total += 1

    def pop(self, host: str) -> QueuedUrl | None:
        heap = self._queues.get(host)
        if not heap:
            return None
        depth, seq, item = heapq.heappop(heap)
        self._total -= 1
        if not heap:
            del self._queues[host]
        key = (item.host, item.url)
        count = self._flight[key][0] + 1 if key in self._flight else 1
        self._flight[key] = (count, depth, seq, item)
        return item

    def pop_many(self, hosts: Sequence[str]) -> list[QueuedUrl | None]:
        return [self.pop(host) for host in hosts]

    def done(self, item: QueuedUrl) -> None:
        key = (item.host, item.url)
        record = self._flight.get(key)
        if record is None:
            return
        if record[0] > 1:
            self._flight[key] = (record[0] - 1, *record[1:])
        else:
            del self._flight[key]

    def done_many(self, items: Sequence[QueuedUrl]) -> None:
        for item in items:
            self.done(item)

    def recover_in_flight(self, *, max_crashes: int) -> tuple[int, list[QueuedUrl]]:
        """A memory frontier does not outlive its process, so no URL can be in flight at a restart."""
        return self.recover(), []

    def recover(self) -> int:
        n = len(self._flight)
        for _count, depth, seq, item in self._flight.values():
            heapq.heappush(self._queues.setdefault(item.host, []), (depth, seq, item))
            self._total += 1
        self._flight.clear()
        return n

    def discard(self, items: Sequence[QueuedUrl]) -> int:
        n = 0
        for host in {item.host for item in items}:
            urls = {item.url for item in items if item.host == host}
            heap = self._queues.get(host, [])
            keep = [entry for entry in heap if entry[2].url not in urls]
            n += len(heap) - len(keep)
            self._total -= len(heap) - len(keep)
            if keep:
                heapq.heapify(keep)
                self._queues[host] = keep
            else:
                self._queues.pop(host, None)
        return n

    def requeue(self, items: Sequence[QueuedUrl]) -> int:
        n = 0
        for item in items:
            record = self._flight.pop((item.host, item.url), None)
            if record is None:
                continue
            _count, depth, seq, queued = record
            heapq.heappush(self._queues.setdefault(queued.host, []), (depth, seq, queued))
            self._total += 1
            n += 1
        return n

    def hosts(self) -> Iterator[tuple[str, int]]:
        return iter([(host, len(self._queues[host])) for host in sorted(self._queues, key=_ring_order)])

    def hosts_after(self, host: str | None, limit: int) -> list[tuple[str, int]]:
        order = sorted(self._queues, key=_ring_order)
        start = 0 if host is None else bisect.bisect_right(order, _ring_order(host), key=_ring_order)
        return [(h, len(self._queues[h])) for h in order[start:start + limit]]

    def queued(self, host: str) -> int:
        return len(self._queues.get(host, ()))

    def __len__(self) -> int:
        return self._total

    def in_flight(self) -> int:
        return len(self._flight)

    def in_flight_items(self) -> list[QueuedUrl]:
        return [record[3] for _key, record in sorted(self._flight.items(), key=lambda kv: _ring_order(kv[0][0]))]

    def get_state(self, host: str) -> HostState | None:
        return self._states.get(host)

    def get_states(self, hosts: Iterable[str]) -> dict[str, HostState]:
        return {host: self._states[host] for host in hosts if host in self._states}

    def put_state(self, state: HostState) -> None:
        self._states[state.host] = state

    def put_states(self, states: Sequence[HostState]) -> None:
        for state in states:
            self.put_state(state)

    def states(self) -> Iterator[HostState]:
        return iter([self._states[host] for host in sorted(self._states, key=_ring_order)])

    def export_arc(self, start: int, end: int) -> tuple[list[QueuedUrl], list[HostState]]:
        items: list[QueuedUrl] = []
        for host in sorted(self._queues, key=_ring_order):
            if in_arc(host_position(host), start, end):
                items.extend(item for _depth, _seq, item in sorted(self._queues[host]))
        states = [s for s in self.states() if in_arc(host_position(s.host), start, end)]
        return items, states

    take_arc = export_arc

    def put_arc(self, items: Sequence[QueuedUrl], states: Sequence[HostState]) -> None:
        self.push(items)
        self.put_states(states)

    def drop_arc(self, start: int, end: int, *, hosts_per_txn: int = 256) -> int:
        dropped = 0
        for host in [h for h in self._queues if in_arc(host_position(h), start, end)]:
            dropped += len(self._queues.pop(host))
        self._total -= dropped
        for host in [h for h in self._states if in_arc(host_position(h), start, end)]:
            del self._states[host]
        return dropped

    def sync(self) -> None:
        """Nothing to force: the memory store keeps nothing on disk."""

    def close(self) -> None:
        """Nothing to release."""
