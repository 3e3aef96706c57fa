"""The durable outbox: URLs routed to other nodes, kept until their owner acknowledges them.

Why on disk: a link found on a page is routed to its owner, and the page is cleared from in-flight. If the
routed URL lived only in memory, a crash before the owner's ack would lose it for good (the page is done, so
it is never fetched again). So routed URLs are written in the transaction that clears the page
(`NodeStore.finish(..., routed=...)`) and deleted only by the owner's ack (DESIGN decision 5).

Layout, one LMDB database `outbox` in the node's environment:

- owner id (UTF-8) + NUL + seq (8, big-endian)  ->  msgpack [url, host, depth, hops, found_on(, lastmod, sitemap)]
- NUL + b"seq"  ->  the highest entry sequence number reserved (8 bytes): written once per SEQ_BLOCK entries
- NUL + b"run"  ->  the number of times the outbox was opened for sending (8 bytes)

An owner's entries are one key range in arrival order. Sequence numbers are never reused, and an entry that
changes owner (a view change) gets a new one, so a sender that remembers "everything up to seq s was put in a
batch" never misses a re-routed entry. The meta keys begin with NUL, which no node id does.

The entries this process puts are also kept in memory until the sender takes them (`take`), so the sender's
tick does not read back what the page's commit has just written (a read transaction, a cursor and a decode per
entry: about 5 µs a page in a cluster node). The store's copy is the one that counts: it survives a crash, the
sender re-sends from it (`get`), and a restarted process, whose memory is empty, sends what it finds there.
The memory holds an owner's entries only above a floor (at first the last sequence number handed out when the
outbox was opened): `take` below the floor reads the store. Memory follows commits only: the writes that put
or re-key entries (`NodeStore.finish`, `accept`, `reroute`, `finish_revisit`, `put`) tell the outbox whether
their transaction committed (`_kept`, `_abandon`), and a put whose fate it was not told about drops the memory.
It holds at most MEMORY_ENTRIES entries (an owner that is not acknowledging, a long partition): past that the
largest owner's entries are dropped from memory and read from the store again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import TypeVar

import lmdb
import msgpack

from ._lmdb import LmdbEnv
from ._records import QueuedUrl

__all__ = ["OUTBOX_DB", "Outbox", "OutboxEntry"]

OUTBOX_DB = b"outbox"
_SEQ_KEY = b"\x00seq"
_RUN_KEY = b"\x00run"
_T = TypeVar("_T")
_packb = msgpack.packb
_unpackb = msgpack.unpackb

OutboxEntry = tuple[int, QueuedUrl]
"""An outbox entry: its sequence number and the URL."""

#: Sequence numbers reserved in the store at once: the counter is written once per this many entries, not by
#: every commit that puts some (a read and a write of its own leaf page in every page's commit). A restarted
#: process starts above the last reservation, so numbers are never reused; the ones left unused are skipped.
SEQ_BLOCK = 1 << 16

#: Entries kept in memory for the sender, at most (about 300 bytes each: some 6 MB). A sender takes its owners'
#: entries every 200 ms, so a node keeps far fewer unless an owner stops acknowledging.
MEMORY_ENTRIES = 20_000


def _owner_prefix(owner: str) -> bytes:
    if not owner or owner.startswith("\x00") or "\x00" in owner:
        raise ValueError(f"not a usable node id for the outbox: {owner!r}")
    return owner.encode("utf-8") + b"\x00"


def _value(item: QueuedUrl) -> bytes:
    if item.lastmod is None and not item.sitemap:
        return _packb([item.url, item.host, item.depth, item.hops, item.found_on])
    return _packb([item.url, item.host, item.depth, item.hops, item.found_on, item.lastmod, item.sitemap])


def _item(value: bytes) -> QueuedUrl:
    record = _unpackb(value)
    url, host, depth, hops, found_on = record[:5]
    lastmod, sitemap = record[5:7] if len(record) >= 7 else (None, False)
    return QueuedUrl(url=url, host=host, depth=depth, hops=hops, found_on=found_on, lastmod=lastmod, sitemap=sitemap)


def _owner_of_key(key: bytes) -> str:
    return key[:-9].decode("utf-8")


class Outbox:
    """Routed URLs per owner, in LMDB. Every public call is one transaction; `_*_in` join a caller's."""

    def __init__(self, env: LmdbEnv) -> None:
        self._env = env
        self._db = env.db(OUTBOX_DB)
        # The last sequence number handed out by this process (at first the stored reservation: every number
        # above it is unused). An aborted transaction's numbers are skipped, never given again.
        self._last = self._stored_seq()
        self._reserved = self._last  # the stored counter: numbers up to it may be in use
        self._reserving: int | None = None  # the reservation of the write transaction under way
        #: Commits of this process that removed entries (acks, re-routes): a reader that waits for entries to go
        #: looks again only when this changed.
        self.removals = 0
        # The memory of fresh entries (module doc): per owner, seq -> item in seq order, holding every committed
        # entry of that owner above its floor that no `take` has passed yet.
        self._fresh: dict[str, dict[int, QueuedUrl]] = {}
        self._floors: dict[str, int] = {}  # per owner; the others' floor is `_floor`
        self._floor = self._last
        self._held = 0  # entries in `_fresh`
        # the puts (first seq, their (owner, url) pairs) and deletions (owner, seq) of the write transaction under
        # way, applied to memory once it commits
        self._pending_txn: lmdb.Transaction | None = None
        self._pending: list[tuple[int, Sequence[tuple[str, QueuedUrl]]]] = []
        self._pending_gone: list[tuple[str, int]] = []
        self._prefixes: dict[str, bytes] = {}  # owner -> its key prefix (checked once)
        self.memory_drops = 0  # times the memory was dropped (an owner over MEMORY_ENTRIES, an unknown commit)

    def _stored_seq(self) -> int:
        with self._env.read() as txn:
            raw = txn.get(_SEQ_KEY, db=self._db)
        return int.from_bytes(raw, "big") if raw else 0

    # -- the memory of fresh entries ------------------------------------------------------------------------

    def _note(self, txn: lmdb.Transaction) -> None:
        """The changes noted next belong to `txn`: kept until it is known to have committed."""
        if txn is not self._pending_txn:
            if self._pending_txn is not None and (self._pending or self._pending_gone):
                # the last transaction's fate was never told (or this is a retry after a full map: rare), so
                # memory cannot be trusted
                self._drop_memory()
            self._pending_txn, self._pending, self._pending_gone, self._reserving = txn, [], [], None

    def _kept(self) -> None:
        """The write that called `_put_in` / `_reroute_in` committed: apply its changes to memory."""
        if self._pending_txn is None:
            return
        pending, gone = self._pending, self._pending_gone
        if self._reserving is not None:
            self._reserved = max(self._reserved, self._reserving)
        self._pending_txn, self._pending, self._pending_gone, self._reserving = None, [], [], None
        fresh, floors, floor = self._fresh, self._floors, self._floor
        for owner, seq in gone:
            entries = fresh.get(owner)
            if entries is not None and entries.pop(seq, None) is not None:
                self._held -= 1
        for first, routed in pending:
            for seq, (owner, item) in enumerate(routed, first):
                if seq > floors.get(owner, floor):
                    entries = fresh.get(owner)
                    if entries is None:
                        entries = fresh[owner] = {}
                    entries[seq] = item
                    self._held += 1
        while self._held > MEMORY_ENTRIES:
            owner = max(fresh, key=lambda name: len(fresh[name]))
            entries = fresh.pop(owner)
            floors[owner] = max(floors.get(owner, floor), next(reversed(entries)))
            self._held -= len(entries)
            self.memory_drops += 1

    def _abandon(self) -> None:
        """The write that called `_put_in` / `_reroute_in` did not commit: forget its changes."""
        self._pending_txn, self._pending, self._pending_gone, self._reserving = None, [], [], None

    def _drop_memory(self) -> None:
        self._fresh, self._floors, self._held = {}, {}, 0
        self._floor = max(self._floor, self._last)  # every number handed out so far, the untold ones too
        self.memory_drops += 1

    def _write(self, fn: Callable[[lmdb.Transaction], _T]) -> _T:
        """One write transaction of the outbox's own, memory told of its outcome."""
        try:
            result = self._env.write(fn)
        except BaseException:
            self._abandon()
            raise
        self._kept()
        return result

    def held(self) -> int:
        """Entries kept in memory (taken from it by the sender instead of read back)."""
        return self._held

    # -- inside a caller's transaction ----------------------------------------------------------------------

    def _counter_in(self, txn: lmdb.Transaction, key: bytes, add: int) -> int:
        """Advance the counter at `key` by `add`; return its value before."""
        raw = txn.get(key, db=self._db)
        before = int.from_bytes(raw, "big") if raw else 0
        txn.put(key, (before + add).to_bytes(8, "big"), db=self._db)
        return before

    def _put_in(self, txn: lmdb.Transaction, routed: Sequence[tuple[str, QueuedUrl]]) -> list[int]:
        """Append each (owner, url); return the sequence numbers given, in order."""
        if not routed:
            return []
        first = self._last + 1
        self._last = last = first + len(routed) - 1
        self._note(txn)
        if last > max(self._reserved, self._reserving or 0):
            # reserve the next block in this transaction; memory believes it once the transaction has committed
            # (a reservation lost with an aborted one is made again by the next put)
            self._reserving = last + SEQ_BLOCK
            txn.put(_SEQ_KEY, self._reserving.to_bytes(8, "big"), db=self._db)
        prefixes = self._prefixes
        items = []
        for seq, (owner, item) in enumerate(routed, first):
            prefix = prefixes.get(owner)
            if prefix is None:
                prefix = prefixes[owner] = _owner_prefix(owner)
            items.append((prefix + seq.to_bytes(8, "big"), _value(item)))
        txn.cursor(self._db).putmulti(items)
        self._pending.append((first, routed))
        return list(range(first, first + len(routed)))

    # -- public API -------------------------------------------------------------------------------------------

    def put(self, routed: Sequence[tuple[str, QueuedUrl]]) -> list[int]:
        """Append (owner, url) pairs in one transaction; return their sequence numbers."""
        if not routed:
            return []
        return self._write(lambda txn: self._put_in(txn, routed))

    def new_run(self) -> int:
        """Count one more start of a sender and return the count (1, 2, ...): batch numbers made from it never
        repeat those of an earlier process, so a late ack meant for an earlier process matches nothing."""
        return self._env.write(lambda txn: self._counter_in(txn, _RUN_KEY, 1) + 1)

    def take(self, owner: str, limit: int, *, after: int = 0) -> list[OutboxEntry]:
        """Up to `limit` entries for `owner` with seq > `after`, oldest first. Changes nothing in the store; the
        caller says it has what is up to `after`, so memory forgets those (a re-send reads them with `get`)."""
        prefix = _owner_prefix(owner)
        out: list[OutboxEntry] = []
        if limit <= 0:
            return out
        if self._pending_txn is not None:  # a put whose commit was never told: memory cannot be trusted
            self._abandon()
            self._drop_memory()
        floor = self._floors.get(owner, self._floor)
        if after >= floor:  # memory holds every entry above `after`
            if after > floor:  # and from now on only above it: an earlier `after` reads the store
                self._floors[owner] = after
            entries = self._fresh.get(owner)
            if not entries:
                return out
            while entries:
                first = next(iter(entries))
                if first > after:
                    break
                del entries[first]
                self._held -= 1
            return list(islice(entries.items(), limit))
        with self._env.read() as txn:
            cur = txn.cursor(self._db)
            if not cur.set_range(prefix + (after + 1).to_bytes(8, "big")):
                return out
            for key, value in cur:
                if not key.startswith(prefix) or len(key) != len(prefix) + 8:
                    break
                out.append((int.from_bytes(key[-8:], "big"), _item(value)))
                if len(out) >= limit:
                    break
        return out

    def get(self, owner: str, seqs: Iterable[int]) -> list[OutboxEntry]:
        """The entries of `owner` among `seqs` that are still in the outbox, in the order of `seqs`."""
        prefix = _owner_prefix(owner)
        out: list[OutboxEntry] = []
        with self._env.read() as txn:
            for seq in seqs:
                value = txn.get(prefix + seq.to_bytes(8, "big"), db=self._db)
                if value is not None:
                    out.append((seq, _item(value)))
        return out

    def ack(self, owner: str, seqs: Iterable[int]) -> int:
        """Delete `owner`'s entries with these sequence numbers (the owner has them); return how many were
        there. Unknown numbers are ignored: a late or repeated ack is harmless."""
        prefix = _owner_prefix(owner)
        seqs = list(seqs)
        keys = [prefix + seq.to_bytes(8, "big") for seq in seqs]
        if not keys:
            return 0
        db = self._db
        removed = self._env.write(lambda txn: sum(1 for key in keys if txn.delete(key, db=db)))
        if removed:
            self.removals += 1
            entries = self._fresh.get(owner)
            if entries:  # normally taken (sent) before they are acknowledged, so no longer in memory
                for seq in seqs:
                    if entries.pop(seq, None) is not None:
                        self._held -= 1
        return removed

    def counts(self) -> dict[str, int]:
        """Entries waiting per owner."""
        counts: dict[str, int] = {}
        with self._env.read() as txn:
            for key in txn.cursor(self._db).iternext(keys=True, values=False):
                if key.startswith(b"\x00"):
                    continue
                owner = _owner_of_key(key)
                counts[owner] = counts.get(owner, 0) + 1
        return counts

    def __len__(self) -> int:
        return sum(self.counts().values())

    def last_seq(self) -> int:
        """The sequence number handed out last (0 before the first entry; after a restart, the last reservation):
        every entry put since has a higher one. Kept by this process (an aborted transaction's numbers count too:
        a mark taken from it is then higher than needed, which only makes its reader wait for more)."""
        return self._last

    def oldest_seq(self, owner: str) -> int | None:
        """The lowest sequence number of `owner`'s entries still waiting for its ack, or None when it has none:
        every entry of `owner` numbered below it has been acknowledged (or re-routed under a new number)."""
        prefix = _owner_prefix(owner)
        with self._env.read() as txn:
            cur = txn.cursor(self._db)
            if not cur.set_range(prefix):
                return None
            key = cur.key()
            if not key.startswith(prefix) or len(key) != len(prefix) + 8:
                return None
            return int.from_bytes(key[-8:], "big")

    def _reroute_in(
        self, txn: lmdb.Transaction, owner_of: Callable[[str], str], local: str
    ) -> tuple[dict[str, int], list[QueuedUrl]]:
        """Re-key every entry whose owner changed under `owner_of(host)`; entries now owned by `local` are
        removed and returned (the caller admits them in the same transaction). Returns (moved per new owner,
        local items)."""
        db = self._db
        moves: list[tuple[bytes, str, QueuedUrl]] = []
        mine: list[tuple[bytes, QueuedUrl]] = []
        cur = txn.cursor(db)
        for key, value in cur:
            if key.startswith(b"\x00"):
                continue
            item = _item(value)
            owner = owner_of(item.host)
            if owner == local:
                mine.append((key, item))
            elif owner != _owner_of_key(key):
                moves.append((key, owner, item))
        for key, _ in mine:
            txn.delete(key, db=db)
        for key, _, _ in moves:
            txn.delete(key, db=db)
        if mine or moves:
            self.removals += 1
            gone = [key for key, _ in mine] + [key for key, _, _ in moves]
            self._note(txn)
            self._pending_gone.extend((_owner_of_key(key), int.from_bytes(key[-8:], "big")) for key in gone)
        self._put_in(txn, [(owner, item) for _, owner, item in moves])
        moved: dict[str, int] = {}
        for _, owner, _ in moves:
            moved[owner] = moved.get(owner, 0) + 1
        return moved, [item for _, item in mine]
