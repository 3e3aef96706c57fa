"""The node's record of seen URLs: an owner-authoritative dedup store (DESIGN decision 4).

Keys are `url_key(host position, url)`: 16 bytes that sort in ring order, so an arc is one key range and
`scan`/`delete` of an arc touch only that range. The LMDB store keeps memory bounded by the OS page cache
however many URLs it holds; the memory store has the same API for fast unit tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from sortedcontainers import SortedSet

from ._closing import Closing
from ._keys import arc_ranges
from ._lmdb import DEFAULT_MAP_SIZE, MAX_MAP_SIZE, LmdbEnv, put_keys

if TYPE_CHECKING:
    from ._lmdb import Txn

__all__ = ["DEDUP_DB", "DedupStore", "MemoryDedupStore"]

DEDUP_DB = b"seen"
_EMPTY = b""


class DedupStore(Closing):
    """Seen-URL keys in LMDB. Every batch call is one transaction; see `storage._lmdb` for durability."""

    def __init__(self, env: LmdbEnv, *, owns_env: bool) -> None:
        self._env = env
        self._db = env.db(DEDUP_DB)
        self._owns_env = owns_env

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = MAX_MAP_SIZE,
    ) -> DedupStore:
        """Open or create the store in directory `path`. Raises `StorageError` if the directory is unusable."""
        env = LmdbEnv.open(path, [DEDUP_DB], map_size=map_size, max_map_size=max_map_size)
        return cls(env, owns_env=True)


    # -- transaction-level parts, shared with NodeStore so several stores commit together --

    def _add_new_in(self, txn: Txn, keys: Sequence[bytes]) -> list[bool]:
        put = txn.put
        db = self._db
        return [put(key, _EMPTY, overwrite=False, db=db) for key in keys]

    # -- public API --

    def add_new(self, keys: Sequence[bytes]) -> list[bool]:
        """Check-and-insert a batch in ONE transaction: True where the key was new and is now stored.

        Within a batch only the first occurrence of a key is True.
        """
        if not keys:
            return []
        return self._env.write(lambda txn: self._add_new_in(txn, keys))

    def insert(self, keys: Iterable[bytes]) -> int:
        """Store keys whether or not they are there (idempotent, for a hand-off); return how many were new."""
        keys = list(keys)
        if not keys:
            return 0
        return self._env.write(lambda txn: self._insert_in(txn, keys))

    def _insert_in(self, txn: Txn, keys: Iterable[bytes]) -> int:
        """`insert` inside a caller's transaction (sorted keys share leaf pages); how many were new."""
        return put_keys(txn, self._db, keys)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes) or not key:
            return False
        with self._env.read() as txn:
            return txn.get(key, db=self._db) is not None

    def __len__(self) -> int:
        return self._env.entries(DEDUP_DB)

    def scan(self, start: int, end: int) -> Iterator[bytes]:
        """Keys of the ring arc [start, end) in key order (start == end: all of them)."""
        for key, _value in self._env.scan(DEDUP_DB, arc_ranges(start, end)):
            yield key

    def delete(self, start: int, end: int) -> int:
        """Remove the keys of the ring arc [start, end); return how many were removed."""
        return self._env.delete_ranges(DEDUP_DB, arc_ranges(start, end))

    def scan_arcs(self, arcs: Sequence[tuple[int, int]]) -> list[list[bytes]]:
        """`scan` of each of `arcs`, in one read transaction (the caller bounds how many)."""
        ranges = [arc_ranges(start, end) for start, end in arcs]
        found = iter(self._env.scan_each(DEDUP_DB, [r for rs in ranges for r in rs]))
        return [[key for _ in rs for key, _value in next(found)] for rs in ranges]

    def _delete_in(self, txn: Txn, ranges: Sequence[tuple[bytes, bytes]], keep: AbstractSet[bytes]) -> int:
        """Delete the keys in `ranges` except those in `keep`, within `txn`; return how many were deleted."""
        cur = txn.cursor(self._db)
        n = 0
        for first, last in ranges:
            if not cur.set_range(first):
                continue
            while True:
                key = cur.key()
                if not key or key[:8] > last:
                    break
                if key in keep:
                    if not cur.next():
                        break
                    continue
                cur.delete()  # the cursor is now on the next key
                n += 1
        return n

    def sync(self) -> None:
        self._env.sync()

    def disk_bytes(self) -> int:
        """Bytes on disk of the whole LMDB file (shared with the frontier inside a NodeStore)."""
        return self._env.disk_bytes()

    def close(self) -> None:
        if self._owns_env:
            self._env.close()


class MemoryDedupStore(Closing):
    """The same API in memory (a sorted set): for unit tests and small runs; nothing survives the process."""

    def __init__(self) -> None:
        self._keys: SortedSet[bytes] = SortedSet()

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, **_options: object) -> MemoryDedupStore:
        return cls()


    def add_new(self, keys: Sequence[bytes]) -> list[bool]:
        out = []
        seen = self._keys
        for key in keys:
            _check_key(key)
            if key in seen:
                out.append(False)
            else:
                seen.add(key)
                out.append(True)
        return out

    def insert(self, keys: Iterable[bytes]) -> int:
        before = len(self._keys)
        for key in keys:
            _check_key(key)
            self._keys.add(key)
        return len(self._keys) - before

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def _in_arc(self, start: int, end: int) -> list[bytes]:
        found: list[bytes] = []
        for first, last in arc_ranges(start, end):
            # a key (at most 511 bytes) whose 8-byte prefix is <= last sorts before last + 504 * 0xff
            found.extend(
                key for key in self._keys.irange(first, last + b"\xff" * 504) if key[:8] <= last
            )
        return found

    def scan(self, start: int, end: int) -> Iterator[bytes]:
        return iter(self._in_arc(start, end))

    def delete(self, start: int, end: int) -> int:
        doomed = self._in_arc(start, end)
        for key in doomed:
            self._keys.discard(key)
        return len(doomed)

    def sync(self) -> None:
        """Nothing to force: the memory store keeps nothing on disk."""

    def close(self) -> None:
        """Nothing to release."""


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or not 1 <= len(key) <= 511:
        raise ValueError(f"a dedup key is 1..511 bytes, got {key!r:.40}")
