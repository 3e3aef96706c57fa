"""The crawl log's spool: one record per finished URL, kept in the node's store until every reader of the log (the
local files, the stream) has it.

A fetched page's record is written in the transaction that finishes the page (`NodeStore.finish`): appended to the
spool's journal, `crawllog.journal` in the store's directory, in one `write` before the transaction commits. What
a killed process wrote is in the kernel's page cache, so after a kill -9 either the page is fetched again and
logged then, or its record is in the journal (a kill between the write and the commit leaves the record of a fetch
that is made again: two records for the URL, as for any repeated fetch). The readers take the journal's records
from memory; once every reader has handed some on, the journal is emptied and what it held besides moves into the
LMDB table below in one transaction (so does all of it when it piles up, a reader being behind, and at the next
open after a kill, where a record every reader passed or already moved is not moved again). A page's commit thus
writes no page of the table, and a record the readers keep up with never enters it.

Each record gets the next number (numbers never repeat, even once the spool is empty): the record id
`NODE_ID-NUMBER` a consumer can deduplicate on. Each reader keeps its own mark (the last number it has handed on,
written after the hand-on succeeded: at least once); records every reader passed are deleted.

The spool is bounded (`limit` records): a record that finds it full is not kept, and the drop is counted here
(durably, in the page's transaction), so a dead broker costs disk up to the bound and then counted records, never
the crawl.

Layout, one database `crawllog`:

- `r` + number (8 bytes, big-endian)  ->  msgpack of the record's fields (`LOG_FIELDS`, in that order)
- `n`                                 ->  one past the last number every reader passed (8 bytes): the next
                                          number when no record is in the table (while one is, the next is
                                          one past the last record's)
- `d`                                 ->  records dropped since the store was made (8 bytes)
- `m/` + reader name                  ->  the last number that reader handed on (8 bytes)

The journal: entries of the record's number (8 bytes, big-endian), the length of its packed fields (4 bytes) and
the fields (msgpack, as in the table).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from ._errors import StorageError
from ._lmdb import LmdbEnv

if TYPE_CHECKING:
    from ._lmdb import Txn

__all__ = ["CRAWLLOG_DB", "JOURNAL", "LOG_FIELDS", "CrawlLogSpool"]

CRAWLLOG_DB = b"crawllog"
_REC, _NEXT, _DROPS, _MARK = b"r", b"n", b"d", b"m/"
_PACK = msgpack.Packer(use_bin_type=True).pack  # one packer for every record (packb makes one a call)
#: The journal's file name, in the store's directory.
JOURNAL = "crawllog.journal"
#: Records kept in the journal (and memory) at most; past it they move into the table (a reader is behind).
PENDING_BOUND = 2000
_ENTRY = struct.Struct(">QI")  # a journal entry's head: the record's number and the length of its fields

#: A record's fields, in the order they are packed: when it was logged (epoch seconds), the HTTP status (or a
#: negative code for a fetch that got no answer, as Heritrix's), the payload bytes (-1: none), the URL, the
#: discovery path from its seed ("-" for a seed; L link, R redirect, M sitemap), the page it was found on ("-":
#: none), the MIME type, when the fetch began (epoch seconds), how long it took (ms), the payload digest
#: ("sha1:BASE32", "-": none), annotations (comma-separated, "-": none), and the WARC file and offset of its
#: record ("", -1: not stored).
LOG_FIELDS = ("time", "status", "size", "url", "path", "via", "mime", "fetch_began", "duration_ms", "digest",
              "annotations", "warc", "offset")


def _num(raw: bytes | None) -> int:
    return int.from_bytes(raw, "big") if raw is not None else 0


class CrawlLogSpool:
    """Crawl-log records waiting for their readers (`readers`: the names of every reader this node runs)."""

    def __init__(self, env: LmdbEnv, *, limit: int = 1_000_000, readers: Sequence[str] = ("file",)) -> None:
        self._env = env
        self._db = env.db(CRAWLLOG_DB)
        self.limit = limit
        self.readers = tuple(readers)
        #: Puts through this object, and records they dropped, counted in memory (a retried transaction may count
        #: twice): a reader that saw the same count has nothing new to look for, and no drop to warn about.
        self.puts = 0
        self.drops_hint = 0
        self._first_floor = 0  # a number the spool began at, at some point (never after where it begins now)
        self.journal = Path(env.path) / JOURNAL
        self._fd: int | None = None
        self._size = 0  # bytes of whole entries in the journal
        self._pending: list[tuple[int, bytes]] = []  # in the journal, not yet in the table: (number, fields)
        self._seq: int | None = None  # the next number, once a put needed it
        self._last: tuple[object, int] | None = None  # the last record written and its number
        self._replay()

    def configure(self, *, limit: int, readers: Sequence[str]) -> None:
        """The bound and the readers of this run (the node sets them from its configuration at start)."""
        self.limit = limit
        self.readers = tuple(readers)

    # ------------------------------------------------------------------ the journal

    def _replay(self) -> None:
        """Move into the table what a killed run left in the journal, and empty it."""
        try:
            data = self.journal.read_bytes()
        except FileNotFoundError:
            return
        entries: list[tuple[int, bytes]] = []
        pos, head = 0, _ENTRY.size
        while pos + head <= len(data):
            seq, size = _ENTRY.unpack_from(data, pos)
            if pos + head + size > len(data):
                break  # an entry cut short (a machine that stopped mid-write): its page was not committed
            entries.append((seq, data[pos + head:pos + head + size]))
            pos += head + size

        def run(txn: Txn) -> None:
            nxt = self._next(txn)
            for seq, packed in entries:
                if seq >= nxt:  # not moved yet
                    txn.put(_REC + seq.to_bytes(8, "big"), packed, db=self._db, append=True)
                    nxt = seq + 1

        if entries:
            self._env.write(run)
        os.truncate(self.journal, 0)

    def _write(self, entries: list[bytes]) -> None:
        """Append to the journal (a disk that refuses it fails the page's transaction, as a full store would)."""
        data = entries[0] if len(entries) == 1 else b"".join(entries)
        try:
            if self._fd is None:
                self._fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            written = os.write(self._fd, data)
            if written != len(data):  # a disk full mid-entry: the entry cut off again, so none follows a torn one
                os.ftruncate(self._fd, self._size)
                raise OSError(28, "no space left for the whole entry")
        except OSError as exc:
            raise StorageError(f"cannot write the crawl log's journal {self.journal}: {exc.strerror or exc}") from exc
        self._size += len(data)

    def settle(self) -> int:
        """Move the journal's records into the table in one transaction, then empty the journal; how many."""
        pending = self._pending
        if not pending:
            return 0
        db = self._db

        def run(txn: Txn) -> None:
            for seq, packed in pending:
                txn.put(_REC + seq.to_bytes(8, "big"), packed, db=db, append=True)

        self._env.write(run)
        self._pending = []
        self._empty_journal()  # a kill before this: the next open finds them moved and skips them
        return len(pending)

    def _empty_journal(self) -> None:
        if self._fd is not None and self._size:
            os.ftruncate(self._fd, 0)
        self._size = 0

    def close(self) -> None:
        """Settle what is in the journal and close it (the store closes its environment after)."""
        self.settle()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ the table

    def _first(self, txn: Txn, seq: int, kept: Sequence[tuple[int, bytes]] = ()) -> int:
        """The number of the oldest record spooled, in the table, the journal or `kept` (`seq`, the next number,
        when none is)."""
        cursor = txn.cursor(self._db)
        if cursor.set_range(_REC) and cursor.key()[:1] == _REC:
            return _num(cursor.key()[1:])
        return (self._pending or kept or ((seq, b""),))[0][0]

    def _next(self, txn: Txn) -> int:
        """The next record number of the table: one past the last record's, or `n` when none is there (`r` keys
        sort last)."""
        cursor = txn.cursor(self._db)
        if cursor.last():
            key = cursor.key()
            if key[:1] == _REC:
                return int.from_bytes(key[1:], "big") + 1
        return _num(txn.get(_NEXT, db=self._db))

    def _put_in(self, txn: Txn, records: Sequence[Sequence[Any]]) -> int:
        """Spool `records` with the caller's transaction: written to the journal now, before it commits; how many
        were dropped (the spool was full; counted in the transaction). A record put again right after it was (the
        same object: the transaction run again once the map grew) keeps its number and is not written twice.
        Where the spool begins is read only when it may be full: `_first_floor` is a number it began at once, and
        it only moves on (records leave from its start), so while the next number is within `limit` of it there
        is room."""
        seq = self._seq if self._seq is not None else self._next(txn)
        dropped = 0
        entries: list[bytes] = []
        kept: list[tuple[int, bytes]] = []
        last = self._last
        for record in records:
            if last is not None and last[0] is record:
                continue
            if seq - self._first_floor >= self.limit:
                self._first_floor = self._first(txn, seq, kept)
                if seq - self._first_floor >= self.limit:
                    dropped += 1
                    continue
            packed = _PACK(record)
            entries.append(_ENTRY.pack(seq, len(packed)) + packed)
            kept.append((seq, packed))
            last = (record, seq)
            seq += 1
        if entries:
            self._write(entries)  # raises: nothing kept, the numbers not taken
            self._pending.extend(kept)
        self._last, self._seq = last, seq
        if dropped:
            db = self._db
            txn.put(_DROPS, (_num(txn.get(_DROPS, db=db)) + dropped).to_bytes(8, "big"), db=db)
            self.drops_hint += dropped
        self.puts += 1
        return dropped

    def put(self, records: Sequence[Sequence[Any]]) -> int:
        """Spool records in a transaction of their own (a URL given up, refused by robots.txt); how many were
        dropped."""
        if not records:
            return 0
        return self._env.write(lambda txn: self._put_in(txn, records))

    def after(self, reader: str, limit: int, *, start: int | None = None) -> list[tuple[int, list[Any]]]:
        """Up to `limit` records `reader` has not handed on yet, in number order: (number, fields); from number
        `start` on when given (the caller knows where the reader is). From the table, then from the journal's
        records in memory (moved into the table first when they pile up: readers that cannot hand on)."""
        if len(self._pending) > PENDING_BOUND:
            self.settle()
        out: list[tuple[int, list[Any]]] = []
        unpack = msgpack.unpackb
        with self._env.read() as txn:
            if start is None:
                mark = txn.get(_MARK + reader.encode("utf-8"), db=self._db)
                start = (_num(mark) + 1) if mark is not None else 0
            cursor = txn.cursor(self._db)
            if cursor.set_range(_REC + start.to_bytes(8, "big")):
                for key, value in cursor:
                    if key[:1] != _REC or len(out) >= limit:
                        break
                    out.append((int.from_bytes(key[1:], "big"), unpack(value, raw=False)))
        pending = self._pending
        if len(out) < limit and pending:
            first = out[-1][0] + 1 if out else start
            at = max(0, first - pending[0][0])  # the journal's records are numbered one after another
            out.extend((seq, unpack(packed, raw=False)) for seq, packed in pending[at:at + limit - len(out)])
        return out

    def handed_on(self, reader: str, through: int) -> int:
        """`reader` has handed on every record up to number `through`: its mark moves there, the records every
        reader of this run passed are deleted, and `n` moves past them, in one transaction; how many were
        deleted. Records every reader passed while they were only in the journal never go into the table: the
        rest of the journal is moved there, and the journal emptied."""
        db = self._db

        def run(txn: Txn) -> tuple[int, int]:
            txn.put(_MARK + reader.encode("utf-8"), through.to_bytes(8, "big"), db=db)
            marks = []
            for name in self.readers:
                raw = txn.get(_MARK + name.encode("utf-8"), db=db)
                marks.append(_num(raw) if raw is not None else -1)
            upto = min(marks, default=through)
            if upto < 0:
                return 0, upto
            cursor = txn.cursor(db)
            gone = 0
            last = _REC + upto.to_bytes(8, "big")
            if cursor.set_range(_REC):
                key = cursor.key()
                while key[:1] == _REC and key <= last:
                    cursor.delete()  # onto the next key ("" past the end)
                    gone += 1
                    key = cursor.key()
            if upto + 1 > _num(txn.get(_NEXT, db=db)):  # a killed run's journal: these are not moved again
                txn.put(_NEXT, (upto + 1).to_bytes(8, "big"), db=db)
            return gone, upto

        gone, upto = self._env.write(run)
        pending = self._pending
        if pending and pending[0][0] <= upto:
            passed = min(len(pending), upto + 1 - pending[0][0])
            gone += passed
            self._pending = pending[passed:]
            if self._pending:
                self.settle()
            else:
                self._empty_journal()
        elif len(pending) > PENDING_BOUND:
            self.settle()
        return gone

    def waiting(self, reader: str) -> tuple[int, float | None]:
        """How many records `reader` has not handed on, and when the oldest of them was logged (None: none)."""
        with self._env.read() as txn:
            mark = txn.get(_MARK + reader.encode("utf-8"), db=self._db)
            nxt = self._seq if self._seq is not None else self._next(txn)
            start = (_num(mark) + 1) if mark is not None else 0
            cursor = txn.cursor(self._db)
            if cursor.set_range(_REC + start.to_bytes(8, "big")) and cursor.key()[:1] == _REC:
                return nxt - _num(cursor.key()[1:]), float(msgpack.unpackb(cursor.value(), raw=False)[0])
        pending = self._pending
        at = max(0, start - pending[0][0]) if pending else 0
        if at >= len(pending):
            return 0, None
        seq, packed = pending[at]
        return nxt - seq, float(msgpack.unpackb(packed, raw=False)[0])

    def dropped(self) -> int:
        """Records not kept because the spool was full, since the store was made."""
        with self._env.read() as txn:
            return _num(txn.get(_DROPS, db=self._db))

    def __len__(self) -> int:
        with self._env.read() as txn:
            nxt = self._seq if self._seq is not None else self._next(txn)
            return nxt - self._first(txn, nxt)
