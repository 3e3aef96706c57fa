"""The revisit schedule: when each fetched page is due again, and what its last fetch returned.

Two LMDB databases in the node's environment (so a page's schedule changes in the same transactions as its
queue, and an arc of the ring is one key range, as everywhere in the store):

- `revisit`:  host prefix (position + host + NUL) + URL fingerprint (8)  ->  msgpack record (`RevisitRecord`)
- `revisit_due`: due time (8 bytes, big-endian milliseconds of the wall clock) + the `revisit` key -> empty

The first is the schedule itself, keyed by host position so it moves with its arc. The second is its index
by time, derived from it (each record that waits has exactly one entry; a record whose revisit is queued has
none, and keeps the time it was due, so its lateness can be measured), so finding what is due reads only what
is due: nothing is ever held in memory whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import msgpack

from ._keys import arc_ranges, host_prefix, url_fingerprint
from ._lmdb import LmdbEnv
from ._records import QueuedUrl

if TYPE_CHECKING:
    from ._lmdb import Txn

__all__ = ["REVISIT_DB", "REVISIT_DUE_DB", "RevisitRecord", "RevisitSchedule", "record_value", "record_of"]

REVISIT_DB = b"revisit"
REVISIT_DUE_DB = b"revisit_due"
_EMPTY = b""
_packb = msgpack.packb
_unpackb = msgpack.unpackb


@dataclass(frozen=True, slots=True, kw_only=True)
class RevisitRecord:
    """One page's schedule. `due` is when its next visit is due (wall-clock seconds); `queued` says that visit is
    queued (taken off the time index);
    `interval` the current revisit interval; `etag`/`last_modified` the validators its last answer gave;
    `digest` the payload digest (base32 SHA-1) of the last full record written, `stored_at` that record's
    time (what a revisit record refers to) and `size` its bytes on disk; `changed`/`unchanged` count the
    revisits that found the page so."""

    url: str
    host: str
    depth: int
    due: float
    interval: float
    etag: str | None = None
    last_modified: str | None = None
    digest: str = ""
    stored_at: float = 0.0
    size: int = 0
    changed: int = 0
    unchanged: int = 0
    queued: bool = False

    def key(self) -> bytes:
        return host_prefix(self.host) + url_fingerprint(self.url)


def _value(r: RevisitRecord) -> bytes:
    return _packb([r.url, r.host, r.depth, float(r.due), float(r.interval), r.etag, r.last_modified, r.digest,
                   float(r.stored_at), r.size, r.changed, r.unchanged, r.queued])


def _record(value: bytes) -> RevisitRecord:
    (url, host, depth, due, interval, etag, last_modified, digest, stored_at, size, changed, unchanged,
     queued) = _unpackb(value)
    return RevisitRecord(url=url, host=host, depth=depth, due=due, interval=interval, etag=etag,
                         last_modified=last_modified, digest=digest, stored_at=stored_at, size=size, changed=changed,
                         unchanged=unchanged, queued=queued)


#: A record's stored form, for the replicas a backup holds of another node's schedule (storage/_replicas.py).
record_value = _value
record_of = _record


def _due_key(due: float, key: bytes) -> bytes:
    return max(0, int(due * 1000)).to_bytes(8, "big") + key


class RevisitSchedule:
    """The schedule in the node's LMDB environment. Every call is one transaction (or a chunked scan)."""

    def __init__(self, env: LmdbEnv) -> None:
        self._env = env
        self._db = env.db(REVISIT_DB)
        self._due = env.db(REVISIT_DUE_DB)

    # -- inside other transactions (NodeStore composes them) --

    def _put_in(self, txn: Txn, record: RevisitRecord) -> None:
        key = record.key()
        old = txn.get(key, db=self._db)
        if old is not None:
            before = _record(old)
            if not before.queued:
                txn.delete(_due_key(before.due, key), db=self._due)
        txn.put(key, _value(record), db=self._db)
        if not record.queued:
            txn.put(_due_key(record.due, key), _EMPTY, db=self._due)

    def _take_due_in(self, txn: Txn, now: float, limit: int,
                     may: Callable[[str], bool]) -> list[RevisitRecord]:
        """Records due at `now` whose host `may` be fetched here, at most `limit`, marked queued."""
        cur = txn.cursor(self._due)
        bound = int(now * 1000)
        out: list[RevisitRecord] = []
        skipped = 0
        if not cur.first():
            return out
        while len(out) < limit and skipped < 4 * limit:
            dkey = cur.key()
            if not dkey or int.from_bytes(dkey[:8], "big") > bound:
                break
            value = txn.get(dkey[8:], db=self._db)
            if value is None:  # an index entry without its record (cannot happen; heal it)
                cur.delete()
                continue
            record = _record(value)
            if not may(record.host):
                skipped += 1
                if not cur.next():
                    break
                continue
            cur.delete()  # moves to the next entry
            queued = replace(record, queued=True)
            txn.put(dkey[8:], _value(queued), db=self._db)
            out.append(queued)
        return out

    def _get_in(self, txn: Txn, key: bytes) -> RevisitRecord | None:
        value = txn.get(key, db=self._db)
        return None if value is None else _record(value)

    def _find_in(self, txn: Txn, pages: Sequence[tuple[str, str]], seen_keys: Sequence[bytes]) -> list[RevisitRecord]:
        """The records of these pages, named by (host, URL) or by their dedup key (position + URL fingerprint:
        a look-up of the position's few hosts); a page off the schedule has none."""
        out = []
        for host, url in pages:
            value = txn.get(host_prefix(host) + url_fingerprint(url), db=self._db)
            if value is not None:
                out.append(_record(value))
        if seen_keys:
            cur = txn.cursor(self._db)
            for key in seen_keys:
                position, fingerprint = key[:8], key[8:]
                if not cur.set_range(position):
                    continue
                for found, value in cur:
                    if found[:8] != position:
                        break
                    if found[-8:] == fingerprint:
                        out.append(_record(value))
                        break
        return out

    # -- on their own --

    def get(self, host: str, url: str) -> RevisitRecord | None:
        with self._env.read() as txn:
            value = txn.get(host_prefix(host) + url_fingerprint(url), db=self._db)
        return None if value is None else _record(value)

    @contextmanager
    def finding(self) -> Iterator[Callable[[Sequence[tuple[str, str]], Sequence[bytes]], list[RevisitRecord]] | None]:
        """A look-up of pages' records (`_find_in`) within one read transaction; None when the schedule is empty
        (no `--revisit`): nothing to look up."""
        with self._env.read() as txn:
            if not txn.stat(self._db)["entries"]:
                yield None
            else:
                yield lambda pages, seen_keys: self._find_in(txn, pages, seen_keys)

    def put(self, record: RevisitRecord) -> None:
        self._env.write(lambda txn: self._put_in(txn, record))

    def forget(self, host: str, url: str) -> bool:
        """Take a page off the schedule (it is gone, or out of scope)."""
        key = host_prefix(host) + url_fingerprint(url)

        def run(txn: Txn) -> bool:
            old = txn.get(key, db=self._db)
            if old is None:
                return False
            before = _record(old)
            if not before.queued:
                txn.delete(_due_key(before.due, key), db=self._due)
            return bool(txn.delete(key, db=self._db))

        return self._env.write(run)

    def next_due(self, limit: int = 10) -> list[tuple[float, str]]:
        """The next `limit` revisits waiting, (due, URL), soonest first."""
        out = []
        with self._env.read() as txn:
            cur = txn.cursor(self._due)
            for dkey, _ in cur:
                value = txn.get(dkey[8:], db=self._db)
                if value is not None:
                    out.append((int.from_bytes(dkey[:8], "big") / 1000, _record(value).url))
                if len(out) >= limit:
                    break
        return out

    def __len__(self) -> int:
        return self._env.entries(REVISIT_DB)

    def waiting(self) -> int:
        return self._env.entries(REVISIT_DUE_DB)

    # -- arcs (hand-off) --

    def export_arc(self, start: int, end: int) -> list[RevisitRecord]:
        return [_record(value) for _key, value in self._env.scan(REVISIT_DB, arc_ranges(start, end))]

    def export_arcs(self, arcs: Sequence[tuple[int, int]]) -> list[list[RevisitRecord]]:
        """`export_arc` of each of `arcs`, in one read transaction (the caller bounds how many)."""
        ranges = [arc_ranges(start, end) for start, end in arcs]
        found = iter(self._env.scan_each(REVISIT_DB, [r for rs in ranges for r in rs]))
        return [[_record(value) for _ in rs for _key, value in next(found)] for rs in ranges]

    def _drop_in(self, txn: Txn, ranges: Sequence[tuple[bytes, bytes]]) -> int:
        """Delete the records in `ranges` and their index entries within `txn`; return how many."""
        cur = txn.cursor(self._db)
        n = 0
        for first, last in ranges:
            while cur.set_range(first):
                key = cur.key()
                if key[:8] > last:
                    break
                record = _record(cur.value())
                if not record.queued:
                    txn.delete(_due_key(record.due, key), db=self._due)
                cur.delete()
                n += 1
        return n

    def records(self) -> Iterator[RevisitRecord]:
        for _key, value in self._env.scan(REVISIT_DB, arc_ranges(0, 0)):
            yield _record(value)

    def put_arc(self, records: Sequence[RevisitRecord]) -> None:
        """Take in records handed over, with this schedule alone: a page whose revisit is queued here is taken as
        still queued (`NodeStore.put_revisits` asks the frontier instead). See `_put_arc_in`."""

        def run(txn: Txn) -> None:
            held = set()
            for record in records:
                old = txn.get(record.key(), db=self._db)
                if old is not None and _record(old).queued:
                    held.add(record.key())
            self._put_arc_in(txn, records, held)

        if records:
            self._env.write(run)

    def _put_arc_in(self, txn: Txn, records: Sequence[RevisitRecord], held: set[bytes]) -> None:
        """Records handed over (`queued`: at their sender), merged with those here: the handed-over fields, the
        later of the two due times (never revisit early), and queued exactly when the page's URL is queued or
        in flight here (its key in `held`): else it waits on the time index, so no revisit is queued twice and
        none is left queued with nothing queued to fetch it."""
        for record in records:
            key = record.key()
            old = txn.get(key, db=self._db)
            due = record.due if old is None else max(record.due, _record(old).due)
            self._put_in(txn, replace(record, due=due, queued=key in held))

    def _queued_in(self, txn: Txn, items: Sequence[QueuedUrl]) -> int:
        """These pages were queued here by other means than the schedule (a hand-off's URLs): a waiting
        record among them is taken off the time index, since that queued URL is its revisit. Returns how many.
        With no schedule here (no `--revisit`) it looks nothing up."""
        n = 0
        if not txn.stat(self._db)["entries"]:
            return n
        for item in items:
            key = host_prefix(item.host) + url_fingerprint(item.url)
            old = txn.get(key, db=self._db)
            if old is not None:
                record = _record(old)
                if not record.queued:
                    self._put_in(txn, replace(record, queued=True))
                    n += 1
        return n

    def _unqueued_in(self, txn: Txn, items: Sequence[QueuedUrl]) -> int:
        """These queued URLs left the frontier unfetched (a hand-off said the host's previous owner has
        them as fetched): a record among them whose revisit was queued waits again, due when it was due (a
        record handed over from that owner may make it later). Returns how many."""
        n = 0
        for item in items:
            key = host_prefix(item.host) + url_fingerprint(item.url)
            old = txn.get(key, db=self._db)
            if old is not None:
                record = _record(old)
                if record.queued:
                    self._put_in(txn, replace(record, queued=False))
                    n += 1
        return n

    def drop_arc(self, start: int, end: int, *, chunk: int = 10_000) -> int:
        """Delete the arc's records and their index entries, `chunk` records per transaction."""
        dropped = 0
        batch: list[RevisitRecord] = []

        def delete(txn: Txn) -> int:
            n = 0
            for record in batch:
                key = record.key()
                if not record.queued:
                    txn.delete(_due_key(record.due, key), db=self._due)
                n += bool(txn.delete(key, db=self._db))
            return n

        for _key, value in self._env.scan(REVISIT_DB, arc_ranges(start, end)):
            batch.append(_record(value))
            if len(batch) >= chunk:
                dropped += self._env.write(delete)
                batch = []
        if batch:
            dropped += self._env.write(delete)
        return dropped


def queued(record: RevisitRecord) -> QueuedUrl:
    """The queue entry of a record that is due."""
    return QueuedUrl(url=record.url, host=record.host, depth=record.depth)
