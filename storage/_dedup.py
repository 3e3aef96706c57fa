"""The node's record of seen URLs: an owner-authoritative dedup store (DESIGN decision 4).

Keys are `url_key(host position, url)`: 16 bytes that sort in ring order, so an arc is one key range and
`scan`/`delete` of an arc touch only that range. The LMDB store keeps memory bounded by the OS page cache
however many URLs it holds; the memory store has the same API for fast unit tests.

The LMDB store is two tables and a filter. `seen` is the large table, `seen_new` a small one that takes every
new key; a Bloom filter in memory (`storage._seenfilter`) holds every key of both. A key the filter has never
seen is new without a read of `seen`: a link's check costs no random read of the large table, which no longer
fits in memory past some 10^7 keys. Staged keys move to `seen` in ring order, a slice with each commit that
stages more, once they pass a sixteenth of the folded ones: the slice's keys are neighbours in `seen` (about ten
staged keys to one leaf page), so the move reads each leaf page once for several keys, in key order. Both tables
change in the caller's transaction, so a page's single commit still marks its links seen, or nothing.

When the keys outgrow the filter (twice the keys it was sized for, under its cap), a larger one is built beside
it a slice of `BUILD_SLICE` keys per commit that stages keys, in key order through both tables; meanwhile new and
moved keys go into both, the old one answers, and the new one takes over once the slices reach the end: no
commit reads every key, so a growing store never stalls its node for the minutes a full read of 10^8 keys takes.

The filter is built from every key when the store opens, unless the store was closed cleanly: `close` then
saves it to `FILTER_FILE` beside the data file, stamped with the store's last transaction, its key counts and the
data file's identity, and the next open reads it back if all of these still match (and deletes the file, so a
crash after the open can never leave a stale filter for the next one).
"""

from __future__ import annotations

import heapq
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from sortedcontainers import SortedSet

from ._closing import Closing
from ._keys import arc_ranges
from ._lmdb import DEFAULT_MAP_SIZE, MAX_MAP_SIZE, LmdbEnv, put_keys
from ._errors import StorageError
from ._seenfilter import MAX_BYTES, SeenFilter, SeenFilterFileError

if TYPE_CHECKING:
    from ._lmdb import Db, Txn

__all__ = ["DEDUP_DB", "DEDUP_DBS", "FILTER_FILE", "SAVE_FILTER_FROM", "STAGED_DB", "DedupStore", "FilterOpen",
           "MemoryDedupStore"]

DEDUP_DB = b"seen"
#: New seen keys, until they move to DEDUP_DB in ring order (see the module's docstring).
STAGED_DB = b"seen_new"
DEDUP_DBS = (DEDUP_DB, STAGED_DB)
STAGE_SHARE = 16  # staged keys move once they pass 1/16 of the folded ones ...
STAGE_MIN = 1 << 16  # ... or 65,536 (a small store keeps its new keys staged: they fit in memory anyway)
MOVE_MIN = 256  # keys moved by a commit that moves any: twice what it staged, at least this
_EMPTY = b""
_KEY_SIZE = 16
_BUILD_CHUNK = 1 << 20  # keys read at once to build the filter
#: Keys a commit that stages keys reads into a larger filter being built (about 20 ms here).
BUILD_SLICE = 1 << 16
#: The filter's file beside the store's data file, while the store is closed.
FILTER_FILE = "seen-filter"
#: Keys from which a clean close saves the filter (below, rebuilding it at open takes under a second).
SAVE_FILTER_FROM = 1 << 21


@dataclass(frozen=True, slots=True)
class FilterOpen:
    """How the store's filter was made when it opened: `source` "saved" (read from FILTER_FILE) or "built"
    (from every key; `reason` says why the file was not used), over `keys` keys in `seconds`."""

    source: str
    reason: str
    keys: int
    seconds: float
    nbytes: int


class DedupStore(Closing):
    """Seen-URL keys in LMDB. Every batch call is one transaction; see `storage._lmdb` for durability."""

    def __init__(self, env: LmdbEnv, *, owns_env: bool, filter_max_bytes: int = MAX_BYTES,
                 save_filter_from: int = SAVE_FILTER_FROM) -> None:
        self._env = env
        self._db = env.db(DEDUP_DB)
        self._staged = env.db(STAGED_DB)
        self._owns_env = owns_env
        self._sweep = _EMPTY  # where the next move of staged keys starts (a hint: any start is correct)
        self._filter_max_bytes = filter_max_bytes
        self._save_filter_from = save_filter_from
        self.filter_path = Path(env.path) / FILTER_FILE
        #: a larger filter being built a slice per commit, and where its next slice starts (table, key)
        self._building: SeenFilter | None = None
        self._build_at: tuple[int, bytes] = (0, _EMPTY)
        t = time.perf_counter()
        with env.read() as txn:
            keys = self._count(txn)
            try:
                self.filter = SeenFilter.load(self.filter_path, self._stamp(txn), max_bytes=filter_max_bytes)
                source, reason = "saved", ""
            except SeenFilterFileError as exc:
                self.filter = self._build_filter(txn)
                source, reason = "built", str(exc)
        env.release_resident()  # the build read every key: its pages need not stay in this process's memory
        self.filter_path.unlink(missing_ok=True)  # it held until now: the next commit makes it stale
        #: how the filter was made at open (the node logs it)
        self.filter_open = FilterOpen(source, reason, keys, time.perf_counter() - t, self.filter.nbytes)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = MAX_MAP_SIZE,
        filter_max_bytes: int = MAX_BYTES,
        save_filter_from: int = SAVE_FILTER_FROM,
    ) -> DedupStore:
        """Open or create the store in directory `path`. Raises `StorageError` if the directory is unusable."""
        env = LmdbEnv.open(path, DEDUP_DBS, map_size=map_size, max_map_size=max_map_size)
        try:
            return cls(env, owns_env=True, filter_max_bytes=filter_max_bytes, save_filter_from=save_filter_from)
        except BaseException:
            env.close()
            raise


    # -- transaction-level parts, shared with NodeStore so several stores commit together --

    def _count(self, txn: Txn) -> int:
        return int(txn.stat(self._db)["entries"]) + int(txn.stat(self._staged)["entries"])

    def _stamp(self, txn: Txn) -> bytes:
        """What a saved filter must match: the last commit, both tables' key counts, the data file's identity."""
        st = os.stat(os.path.join(self._env.path, "data.mdb"))
        seen, staged = (int(txn.stat(db)["entries"]) for db in (self._db, self._staged))
        return f"txn {self._env.last_txnid()} seen {seen} staged {staged} file {st.st_dev}:{st.st_ino}".encode()

    def save_filter(self) -> bool:
        """Save the filter for the next open (what `close` does first): everything committed is synced, then
        the bits are written with the store's stamp. False, and no file, if the store is below
        `save_filter_from` keys or the save failed (a full disk: the next open rebuilds the filter)."""
        if self._env.closed:
            return False
        try:
            if len(self) < self._save_filter_from:
                return False
            self._env.sync()
            with self._env.read() as txn:
                stamp = self._stamp(txn)
            self.filter.save(self.filter_path, stamp)
        except (OSError, StorageError):
            self.filter_path.unlink(missing_ok=True)
            return False
        return True

    def _build_filter(self, txn: Txn) -> SeenFilter:
        """A filter holding every key of both tables, as `txn` sees them."""
        dbs = (self._db, self._staged)
        seen = SeenFilter(self._count(txn), max_bytes=self._filter_max_bytes)
        for db in dbs:
            keys = txn.cursor(db).iternext(keys=True, values=False)
            while chunk := list(islice(keys, _BUILD_CHUNK)):
                _add_keys(seen, chunk)
                if len(chunk) == _BUILD_CHUNK:  # a large table: its pages read so far need not stay resident
                    self._env.release_resident()
        return seen

    def _add(self) -> Callable[[bytes], None]:
        """How a key goes into the filter: into the one being built too, while there is one."""
        add, building = self.filter.add, self._building
        if building is None:
            return add
        add_too = building.add

        def both(key: bytes) -> None:
            add(key)
            add_too(key)

        return both

    def _add_new_in(self, txn: Txn, keys: Sequence[bytes]) -> list[bool]:
        get, put = txn.get, txn.put
        folded, staged = self._db, self._staged
        maybe, add = self.filter.may_contain, self._add()
        out = []
        new = 0
        for key in keys:
            # the filter answers "never added" for most new links: no read of the large table
            if maybe(key) and (get(key, db=staged) is not None or get(key, db=folded) is not None):
                out.append(False)
            elif put(key, _EMPTY, overwrite=False, db=staged):
                add(key)  # before the commit: an abort leaves a stray bit (a look-up), never a missing one
                out.append(True)
                new += 1
            else:  # an empty key, refused by put as by the table
                out.append(False)
        if new:
            self._after_staging(txn, new)
        return out

    def _after_staging(self, txn: Txn, new: int) -> None:
        """Move staged keys to the large table if they are past their share; rebuild the filter if the keys
        outgrew it."""
        folded_n = int(txn.stat(self._db)["entries"])
        staged_n = int(txn.stat(self._staged)["entries"])
        if staged_n > max(STAGE_MIN, folded_n // STAGE_SHARE):
            self._move_in(txn, max(MOVE_MIN, 2 * new))
        if self._building is None and self.filter.outgrown(folded_n + staged_n):
            self._building = SeenFilter(folded_n + staged_n, max_bytes=self._filter_max_bytes)
            self._build_at = (0, _EMPTY)
        if self._building is not None:
            self._build_step(txn)

    def _build_step(self, txn: Txn) -> None:
        """Read the next BUILD_SLICE keys into the filter being built; once both tables are read, it takes over.
        Every key it has not read yet is ahead of the slices, or went into it as it came (`_add`, `_move_in`);
        a slice read in a transaction that aborts read keys that stay, so progress made there is kept."""
        building = self._building
        assert building is not None
        table, start = self._build_at
        dbs = (self._db, self._staged)
        cur = txn.cursor(dbs[table])
        ok = cur.set_range(start) if start else cur.first()
        chunk: list[bytes] = []
        while ok and len(chunk) < BUILD_SLICE:
            chunk.append(cur.key())
            ok = cur.next()
        _add_keys(building, chunk)
        if ok:
            self._build_at = (table, cur.key())
        elif table == 0:
            self._build_at = (1, _EMPTY)
        else:
            self.filter, self._building = building, None

    def _move_in(self, txn: Txn, limit: int) -> int:
        """Move up to `limit` staged keys to the large table, in ring order from where the last move stopped
        (round the ring); return how many moved."""
        cur = txn.cursor(self._staged)
        ok = cur.set_range(self._sweep) or cur.first()
        moved: list[bytes] = []
        while ok and len(moved) < limit:
            key = cur.key()
            if not key:  # the last key was just moved: go on from the first
                ok = cur.first()
                continue
            moved.append(key)
            cur.delete()  # the cursor is now on the next key
        if moved:
            self._sweep = moved[-1]
            if self._building is not None:  # from a table the build may not have read into one it may have
                self._building.add_all(moved)
            moved.sort()  # two runs when the move went round the ring
            txn.cursor(self._db).putmulti([(key, _EMPTY) for key in moved], dupdata=False, overwrite=False)
        return len(moved)

    def _tables(self) -> tuple[Db, Db]:
        return self._db, self._staged

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
        """`insert` inside a caller's transaction (sorted keys share leaf pages); how many were new. Keys go to
        the large table (a hand-off's, sorted), except those staged already."""
        maybe, get, staged, add = self.filter.may_contain, txn.get, self._staged, self._add()
        fresh = [key for key in keys if not (maybe(key) and get(key, db=staged) is not None)]
        for key in fresh:
            if key:
                add(key)
        return put_keys(txn, self._db, fresh)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes) or not key:
            return False
        if not self.filter.may_contain(key):
            return False
        with self._env.read() as txn:
            return txn.get(key, db=self._staged) is not None or txn.get(key, db=self._db) is not None

    def __len__(self) -> int:
        return self._env.entries(DEDUP_DB) + self._env.entries(STAGED_DB)

    def staged(self) -> int:
        """Keys in the small table, not yet moved to the large one."""
        return self._env.entries(STAGED_DB)

    def scan(self, start: int, end: int) -> Iterator[bytes]:
        """Keys of the ring arc [start, end) in key order (start == end: all of them)."""
        ranges = arc_ranges(start, end)
        for key, _value in heapq.merge(self._env.scan(DEDUP_DB, ranges), self._env.scan(STAGED_DB, ranges)):
            yield key

    def delete(self, start: int, end: int) -> int:
        """Remove the keys of the ring arc [start, end); return how many were removed."""
        ranges = arc_ranges(start, end)
        return self._env.delete_ranges(DEDUP_DB, ranges) + self._env.delete_ranges(STAGED_DB, ranges)

    def scan_arcs(self, arcs: Sequence[tuple[int, int]]) -> list[list[bytes]]:
        """`scan` of each of `arcs`, in one read transaction per table (the caller bounds how many)."""
        ranges = [arc_ranges(start, end) for start, end in arcs]
        flat = [r for rs in ranges for r in rs]
        folded = iter(self._env.scan_each(DEDUP_DB, flat))
        staged = iter(self._env.scan_each(STAGED_DB, flat))
        return [sorted(key for _ in rs for table in (next(folded), next(staged)) for key, _value in table)
                for rs in ranges]

    def _delete_in(self, txn: Txn, ranges: Sequence[tuple[bytes, bytes]], keep: AbstractSet[bytes]) -> int:
        """Delete the keys in `ranges` except those in `keep`, within `txn`; return how many were deleted."""
        return sum(self._delete_table_in(txn, db, ranges, keep) for db in self._tables())

    def _delete_table_in(self, txn: Txn, db: Db, ranges: Sequence[tuple[bytes, bytes]],
                         keep: AbstractSet[bytes]) -> int:
        cur = txn.cursor(db)
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
        if self._owns_env and not self._env.closed:
            self.save_filter()
            self._env.close()


def _add_keys(seen: SeenFilter, keys: list[bytes]) -> None:
    """Keys read from the tables into `seen`: vectorized when all are dedup keys, else one at a time (tests)."""
    if set(map(len, keys)) == {_KEY_SIZE}:
        seen.add_packed(b"".join(keys), _KEY_SIZE)
    else:
        seen.add_all(keys)


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
