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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import msgpack

from ._lmdb import LmdbEnv
from ._records import QueuedUrl

if TYPE_CHECKING:
    from ._lmdb import Txn

__all__ = ["OUTBOX_DB", "Outbox", "OutboxEntry"]

OUTBOX_DB = b"outbox"
_SEQ_KEY = b"\x00seq"
_RUN_KEY = b"\x00run"
_packb = msgpack.packb
_unpackb = msgpack.unpackb

OutboxEntry = tuple[int, QueuedUrl]
"""An outbox entry: its sequence number and the URL."""

#: Sequence numbers reserved in the store at once: the counter is written once per this many entries, not by
#: every commit that puts some (a write dirties its leaf page in every page's commit; the read that checks the
#: reservation does not). A restarted process starts above the last reservation, so numbers are never reused;
#: the ones left unused are skipped.
SEQ_BLOCK = 1 << 16


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
        #: Commits of this process that removed entries (acks, re-routes): a reader that waits for entries to go
        #: looks again only when this changed.
        self.removals = 0
        self._prefixes: dict[str, bytes] = {}  # owner -> its key prefix (checked once)
        # owner -> sequence numbers of entries no page waits for (`_put_in(..., aside=True)`): `oldest_seq` passes
        # over them. In memory only: what waits for pages' links (held releases) is in memory only too.
        self._aside: dict[str, set[int]] = {}
        # owner -> the highest sequence number this process gave one of its entries, and the owners given entries
        # since the sender last asked (`changed_owners`): a sender with many owners looks in the store only for
        # those that may have entries it has not batched, not for every owner at every tick.
        self._newest: dict[str, int] = {}
        self._changed: dict[str, None] = {}

    def _stored_seq(self) -> int:
        with self._env.read() as txn:
            raw = txn.get(_SEQ_KEY, db=self._db)
        return int.from_bytes(raw, "big") if raw else 0

    # -- inside a caller's transaction ----------------------------------------------------------------------

    def _counter_in(self, txn: Txn, key: bytes, add: int) -> int:
        """Advance the counter at `key` by `add`; return its value before."""
        raw = txn.get(key, db=self._db)
        before = int.from_bytes(raw, "big") if raw else 0
        txn.put(key, (before + add).to_bytes(8, "big"), db=self._db)
        return before

    def _put_in(self, txn: Txn, routed: Sequence[tuple[str, QueuedUrl]], *,
                aside: bool = False) -> list[int]:
        """Append each (owner, url); return the sequence numbers given, in order. `aside`: entries no page's
        release waits for (a backup passing on replicas it no longer backs), which `oldest_seq` passes over."""
        if not routed:
            return []
        first = self._last + 1
        self._last = last = first + len(routed) - 1
        raw = txn.get(_SEQ_KEY, db=self._db)  # the reservation as committed (read in this transaction)
        if last > (int.from_bytes(raw, "big") if raw else 0):
            # reserve the next block here: the counter is written once per SEQ_BLOCK entries, and a reservation
            # lost with an aborted transaction is made again by the next put, which reads the store's
            txn.put(_SEQ_KEY, (last + SEQ_BLOCK).to_bytes(8, "big"), db=self._db)
        prefixes, newest, changed = self._prefixes, self._newest, self._changed
        items = []
        for seq, (owner, item) in enumerate(routed, first):
            prefix = prefixes.get(owner)
            if prefix is None:
                prefix = prefixes[owner] = _owner_prefix(owner)
            items.append((prefix + seq.to_bytes(8, "big"), _value(item)))
            newest[owner] = seq  # (an aborted transaction's numbers stay: a sender then looks once for nothing)
            changed[owner] = None
        txn.cursor(self._db).putmulti(items)
        if aside:  # (numbers of an aborted transaction are never given again: harmless here)
            for seq, (owner, _item) in enumerate(routed, first):
                self._aside.setdefault(owner, set()).add(seq)
        return list(range(first, first + len(routed)))

    # -- public API -------------------------------------------------------------------------------------------

    def newest(self, owner: str) -> int:
        """The highest sequence number this process gave an entry of `owner` (0: none yet). Entries of an earlier
        process all lie at or below the reservation this one started from."""
        return self._newest.get(owner, 0)

    def changed_owners(self) -> list[str]:
        """The owners given entries since the last call, in the order first given (the sender's question: whom
        must I look at again)."""
        changed, self._changed = self._changed, {}
        return list(changed)

    def put(self, routed: Sequence[tuple[str, QueuedUrl]]) -> list[int]:
        """Append (owner, url) pairs in one transaction; return their sequence numbers."""
        if not routed:
            return []
        return self._env.write(lambda txn: self._put_in(txn, routed))

    def new_run(self) -> int:
        """Count one more start of a sender and return the count (1, 2, ...): batch numbers made from it never
        repeat those of an earlier process, so a late ack meant for an earlier process matches nothing."""
        return self._env.write(lambda txn: self._counter_in(txn, _RUN_KEY, 1) + 1)

    def take(self, owner: str, limit: int, *, after: int = 0) -> list[OutboxEntry]:
        """Up to `limit` entries for `owner` with seq > `after`, oldest first. Changes nothing."""
        prefix = _owner_prefix(owner)
        out: list[OutboxEntry] = []
        if limit <= 0:
            return out
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
        aside = self._aside.get(owner)
        if aside is not None:
            aside.difference_update(seqs)
            if not aside:
                del self._aside[owner]
        db = self._db
        removed = self._env.write(lambda txn: sum(1 for key in keys if txn.delete(key, db=db)))
        if removed:
            self.removals += 1
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
        every entry of `owner` numbered below it has been acknowledged (or re-routed under a new number).
        Entries put `aside` are passed over: a backup's pass-on of thousands must not hold the pages' releases."""
        prefix = _owner_prefix(owner)
        aside = self._aside.get(owner, ())
        with self._env.read() as txn:
            cur = txn.cursor(self._db)
            if not cur.set_range(prefix):
                return None
            for key in cur.iternext(keys=True, values=False):
                if not key.startswith(prefix) or len(key) != len(prefix) + 8:
                    return None
                seq = int.from_bytes(key[-8:], "big")
                if seq not in aside:
                    return seq
            return None

    def _reroute_in(
        self, txn: Txn, owner_of: Callable[[str], str], local: str
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
            if self._aside:  # re-keyed entries count again (the held releases wait for them: `rerouted`)
                for key in [key for key, _ in mine] + [key for key, _, _ in moves]:
                    aside = self._aside.get(_owner_of_key(key))
                    if aside is not None:
                        aside.discard(int.from_bytes(key[-8:], "big"))
                self._aside = {owner: seqs for owner, seqs in self._aside.items() if seqs}
        self._put_in(txn, [(owner, item) for _, owner, item in moves])
        moved: dict[str, int] = {}
        for _, owner, _ in moves:
            moved[owner] = moved.get(owner, 0) + 1
        return moved, [item for _, item in mine]
