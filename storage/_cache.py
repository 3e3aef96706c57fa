"""A bounded LRU cache with per-entry expiry, the clock passed in (DNS answers, robots.txt rules).

Time is an argument, never read here, so callers use their own clock (trio's, a MockClock) and tests are
exact. Every operation is O(1) on an OrderedDict. `export`/`load` let the entries of an arc move with their
hosts when ownership changes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["LruTtlCache"]

K = TypeVar("K")
V = TypeVar("V")


class LruTtlCache(Generic[K, V]):
    """At most `maxsize` entries; the least recently used goes first; an entry is dead from `expires_at` on."""

    __slots__ = ("_entries", "maxsize", "hits", "misses")

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self._entries: OrderedDict[K, tuple[V, float]] = OrderedDict()
        self.hits = 0  # `get` found a live entry
        self.misses = 0  # `get` found none, or an expired one

    def get(self, key: K, now: float) -> V | None:
        """The live value for `key` (and mark it recently used), or None; an expired entry is removed."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        value, expires_at = entry
        if now >= expires_at:
            del self._entries[key]
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: K, value: V, expires_at: float) -> None:
        """Store or replace `key` as the most recently used, evicting the least recently used if full."""
        entries = self._entries
        entries[key] = (value, expires_at)
        entries.move_to_end(key)
        if len(entries) > self.maxsize:
            entries.popitem(last=False)

    def discard(self, key: K) -> None:
        self._entries.pop(key, None)

    def __contains__(self, key: object) -> bool:
        """Whether an entry exists (live or expired, without touching recency)."""
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def export(self, predicate: Callable[[K], bool]) -> list[tuple[K, V, float]]:
        """(key, value, expires_at) of every entry whose key satisfies `predicate`, least recent first.

        Loading them in this order elsewhere keeps their relative recency. The cache is unchanged.
        """
        return [(key, value, expires_at) for key, (value, expires_at) in self._entries.items() if predicate(key)]

    def load(self, entries: Iterable[tuple[K, V, float]]) -> None:
        """Put each (key, value, expires_at) in order, as `put` does (the last becomes the most recent)."""
        for key, value, expires_at in entries:
            self.put(key, value, expires_at)
