"""Replicas of queued URLs this node holds for other nodes (their ring backup, `--replicas R`).

Why on disk: a backup holds every URL its owners have queued, which is as large as their frontiers; memory
would not hold a wide crawl, and a replica that dies with a restart is no replica.

Layout, two LMDB databases in the node's environment (keys begin with the host's ring position, so an arc of
the ring is one key range, as everywhere in the node store):

- replica: the URL's dedup key (position(8) + URL fingerprint(8))  ->  msgpack [url, host, depth, hops, found_on]
- rstate:  host_prefix(host) (position(8) + host + NUL)            ->  msgpack [next_allowed (wall clock),
                                                                        crawl_delay, failures]

`rstate` is the owner's last known politeness state of the hosts it fetched, so a backup that inherits them
keeps their timers (one connection per host and Crawl-delay hold through a take-over).

- rrevisit: host_prefix(host) + URL fingerprint(8) (the key of the owner's `revisit` table)  ->  the owner's
            revisit record of a page it fetched (`--revisit`), as storage/_revisits.py stores one, due at a time
            of this node's wall clock and never queued (promotion queues it where its URL is promoted, else it
            waits on the heir's time index)

- rjournal: sequence number(8, big-endian)  ->  msgpack [[[key, replica value], ...],
                                                         [released key, ...],
                                                         [[host, next_allowed, crawl_delay, failures], ...],
                                                         [[rrevisit key, revisit record value], ...]]
                                                (the fourth list may be absent: none)

Why a journal: a backup receives a message per owner every 100 ms, each a page's add and release or so per page
fetched. Applied at once, every entry touched a leaf page of its own in `replica` and in the seen table
(keys begin with a random ring position), so each message's commit copied and wrote about one page per entry;
and most URLs of a crawl are released a few seconds after they were added. So a message is appended to the
journal (one put at the end of a table: its commit writes a page or two) and the journal is folded into
`replica`, `rstate`, `rrevisit` and the seen table (`mark_seen_in`) in one transaction when the caller says so (the node
folds every `FOLD_ENTRIES` entries or `FOLD_AGE` seconds, peer/cluster/replicas/queuereplicas.py), and before anything reads
the replicas (promotion, the clean-up, an arc, the count). The fold applies the messages in the order they
came, as one: a URL added and released within it never reaches `replica`; a host's states collapse into
one write. A journaled message is committed like any other write: it survives the process's death, and a
store opened again folds what its journal holds first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from ._keys import arc_ranges, host_prefix
from ._lmdb import LmdbEnv
from ._records import HostState, QueuedUrl
from ._revisits import RevisitRecord, record_of, record_value

if TYPE_CHECKING:
    from ._lmdb import Db, Txn

__all__ = ["REPLICA_DBS", "Replicas"]

REPLICA, RSTATE, RJOURNAL, RREVISIT = b"replica", b"rstate", b"rjournal", b"rrevisit"
REPLICA_DBS = (REPLICA, RSTATE, RJOURNAL, RREVISIT)
_WHOLE_RING = arc_ranges(0, 0)
_packb = msgpack.packb
_unpackb = msgpack.unpackb


def _item(value: bytes) -> QueuedUrl:
    url, host, depth, hops, found_on = _unpackb(value)
    return QueuedUrl(url=url, host=host, depth=depth, hops=hops, found_on=found_on)


def _state(key: bytes, value: bytes) -> HostState:
    next_allowed, crawl_delay, failures = _unpackb(value)
    return HostState(host=key[8:-1].decode("utf-8"), next_allowed=next_allowed, crawl_delay=crawl_delay,
                     failures=failures)


class Replicas:
    """The replicas held here. Every public call is one transaction, or a scan in short ones. Messages go to the
    journal (`hold`) and reach the tables when folded (`fold`, or `hold(..., fold=True)`); every read folds
    first."""

    def __init__(self, env: LmdbEnv,
                 mark_seen_in: Callable[[Txn, list[bytes]], Any] | None = None) -> None:
        self._env = env
        self._db = env.db(REPLICA)
        self._states = env.db(RSTATE)
        self._journal = env.db(RJOURNAL)
        self._revisits = env.db(RREVISIT)
        # marks released keys seen in the same transaction (the node store's seen table); None: not marked
        self._mark_seen_in = mark_seen_in
        with env.read() as txn:
            last = txn.cursor(self._journal)
            self._next = int.from_bytes(last.key(), "big") + 1 if last.last() else 0
        #: entries (URLs, releases, host states) journaled since the last fold
        self.journaled = 0
        self.folds = 0
        #: revisit records that promotion put on this node's schedule
        self.revisits_promoted = 0
        if self._next:
            self.journaled = 1
            self.fold()  # what a stopped or killed node had journaled

    def hold(self, items: Sequence[tuple[bytes, QueuedUrl]], released: Sequence[bytes],
             states: Sequence[HostState] = (), revisits: Sequence[RevisitRecord] = (), *,
             fold: bool = False) -> None:
        """Journal one message: delete the `released` keys (and mark them seen), then store `items` (key, URL),
        merge `states` (the later `next_allowed` wins) and store the `revisits` records (the newest wins), in one
        transaction; with `fold`, the journal is folded in the same transaction."""
        self._env.write(lambda txn: self._hold_in(txn, items, released, states, revisits, fold=fold))
        self._held(len(items) + len(released) + len(states) + len(revisits), folded=fold)

    def _hold_in(self, txn: Txn, items: Sequence[tuple[bytes, QueuedUrl]], released: Sequence[bytes],
                 states: Sequence[HostState], revisits: Sequence[RevisitRecord] = (), *,
                 fold: bool = False) -> None:
        """The transaction's part of `hold`; the caller calls `_held` once it has committed."""
        parts: list[Any] = [
            [[key, _packb([i.url, i.host, i.depth, i.hops, i.found_on])] for key, i in items],
            list(released),
            [[s.host, float(s.next_allowed), float(s.crawl_delay), s.failures] for s in states],
        ]
        if revisits:
            parts.append([[r.key(), record_value(r)] for r in revisits])
        record = _packb(parts)
        txn.put(self._next.to_bytes(8, "big"), record, db=self._journal, append=True)
        if fold:
            self._fold_in(txn)

    def _held(self, entries: int, *, folded: bool) -> None:
        """A `_hold_in` committed."""
        self._next += 1
        self.journaled = 0 if folded else self.journaled + max(1, entries)
        self.folds += folded

    def fold(self) -> int:
        """Apply the journal to the tables, in one transaction; returns the entries folded (0: it was empty)."""
        if not self.journaled:
            return 0
        entries = self._env.write(self._fold_in)
        self.journaled = 0
        self.folds += 1
        return entries

    def _fold_in(self, txn: Txn) -> int:
        """The journal's messages in the order they came, applied as one: the last word on each key wins (a
        release deletes and marks seen, an add stores), a host's states merge (the later ready time, the newest
        Crawl-delay and failures); then the journal is emptied. Writes keys in order (neighbours share pages)."""
        final: dict[bytes, bytes | None] = {}  # key -> its `replica` value, or None: released
        marks: list[bytes] = []
        merged: dict[str, tuple[float, float, int]] = {}
        schedules: dict[bytes, bytes] = {}  # rrevisit key -> the newest record
        entries = 0
        for _seq, raw in txn.cursor(self._journal):
            added, released, states, *more = _unpackb(raw)
            for key, value in more[0] if more else ():
                schedules[key] = value
                entries += 1
            for key in released:
                final[key] = None
            marks.extend(released)
            for key, value in added:
                final[key] = value
            for host, ready, delay, failures in states:
                earlier = merged.get(host)
                if earlier is not None and earlier[0] > ready:
                    ready = earlier[0]
                merged[host] = (ready, delay, failures)
            entries += len(added) + len(released) + len(states)
        if marks and self._mark_seen_in is not None:
            marks.sort()
            self._mark_seen_in(txn, marks)
        db, put, delete = self._db, txn.put, txn.delete
        keep = []
        for key in sorted(final):
            kept = final[key]
            if kept is None:
                delete(key, db=db)
            else:
                keep.append((key, kept))
        if keep:
            txn.cursor(db).putmulti(keep)
        for prefix, (ready, delay, failures) in sorted((host_prefix(h), s) for h, s in merged.items()):
            stored = txn.get(prefix, db=self._states)
            if stored is not None:
                ready = max(ready, _unpackb(stored)[0])
            put(prefix, _packb([float(ready), float(delay), failures]), db=self._states)
        if schedules:
            txn.cursor(self._revisits).putmulti(sorted(schedules.items()))
        txn.drop(self._journal, delete=False)
        return entries

    def arc(self, start: int, end: int) -> tuple[list[tuple[bytes, QueuedUrl]], list[HostState]]:
        """What is held for the arc [start, end): (key, URL) pairs and host states."""
        self.fold()
        ranges = arc_ranges(start, end)
        items = [(key, _item(value)) for key, value in self._env.scan(REPLICA, ranges)]
        states = [_state(key, value) for key, value in self._env.scan(RSTATE, ranges)]
        return items, states

    def where(self, wanted: Callable[[int], bool]) -> tuple[list[tuple[bytes, QueuedUrl]], list[HostState]]:
        """What is held at the ring positions `wanted(position)` picks: one pass over the replicas (a death
        moves thousands of small arcs; one scan beats thousands of range reads)."""
        self.fold()
        items = [(key, _item(value)) for key, value in self._env.scan(REPLICA, _WHOLE_RING)
                 if wanted(int.from_bytes(key[:8], "big"))]
        states = [_state(key, value) for key, value in self._env.scan(RSTATE, _WHOLE_RING)
                  if wanted(int.from_bytes(key[:8], "big"))]
        return items, states

    def revisits_where(self, wanted: Callable[[int], bool]) -> list[RevisitRecord]:
        """The revisit records held at the ring positions `wanted(position)` picks, in one pass."""
        self.fold()
        return [record_of(value) for key, value in self._env.scan(RREVISIT, _WHOLE_RING)
                if wanted(int.from_bytes(key[:8], "big"))]

    def _forget_in(self, txn: Txn, keys: Sequence[bytes], hosts: Sequence[str],
                   revisits: Sequence[RevisitRecord] = ()) -> None:
        for key in keys:
            txn.delete(key, db=self._db)
        for host in hosts:
            txn.delete(host_prefix(host), db=self._states)
        for record in revisits:
            txn.delete(record.key(), db=self._revisits)

    def drop_arc(self, start: int, end: int) -> int:
        """Forget everything held for the arc [start, end); returns how many URLs were held."""
        self.fold()
        ranges = arc_ranges(start, end)
        self._env.delete_ranges(RSTATE, ranges)
        self._env.delete_ranges(RREVISIT, ranges)
        return self._env.delete_ranges(REPLICA, ranges)

    def keys(self) -> Iterator[bytes]:
        """Every key held, in ring order, read in short transactions."""
        self.fold()
        for key, _value in self._env.scan(REPLICA, _WHOLE_RING):
            yield key

    def drop_where(self, unwanted: Callable[[int], bool], *, chunk: int = 4096,
                   passing: Callable[[list[QueuedUrl]], object] | None = None) -> int:
        """Forget the URLs and states whose ring position `unwanted(position)` says are not this node's to hold
        (it is no longer a backup there). Reads in short transactions, deletes `chunk` keys per transaction;
        `passing` is given each chunk's URLs before they are deleted (a backup passes them on to their owners)."""
        self.fold()
        dropped = {REPLICA: 0, RSTATE: 0}
        for name in (REPLICA, RSTATE):
            db = self._env.db(name)
            batch: list[bytes] = []
            items: list[QueuedUrl] = []
            for key, value in self._env.scan(name, _WHOLE_RING):
                if unwanted(int.from_bytes(key[:8], "big")):
                    batch.append(key)
                    if passing is not None and name == REPLICA:
                        items.append(_item(value))
                if len(batch) >= chunk:
                    dropped[name] += self._drop(db, batch, items, passing)
                    batch, items = [], []
            if batch:
                dropped[name] += self._drop(db, batch, items, passing)
        return dropped[REPLICA]

    def drop_revisits_where(self, unwanted: Callable[[int], bool], *, chunk: int = 4096) -> int:
        """Forget the revisit records whose ring position `unwanted(position)` says are not this node's to hold;
        returns how many. (Nothing is passed on: their owner has its own schedule.)"""
        self.fold()
        dropped = 0
        batch: list[bytes] = []
        for key, _value in self._env.scan(RREVISIT, _WHOLE_RING):
            if unwanted(int.from_bytes(key[:8], "big")):
                batch.append(key)
            if len(batch) >= chunk:
                dropped += self._delete(self._revisits, batch)
                batch = []
        if batch:
            dropped += self._delete(self._revisits, batch)
        return dropped

    def _drop(self, db: Db, keys: list[bytes], items: list[QueuedUrl],
              passing: Callable[[list[QueuedUrl]], object] | None) -> int:
        if items and passing is not None:
            passing(items)  # committed first: a crash between them passes them on again, never loses them
        return self._delete(db, keys)

    def _delete(self, db: Db, keys: list[bytes]) -> int:
        return self._env.write(lambda txn: sum(1 for key in keys if txn.delete(key, db=db)))

    def __len__(self) -> int:
        self.fold()
        return self._env.entries(REPLICA)

    def folded(self) -> int:
        """URLs held as of the last fold (without folding: for status)."""
        return self._env.entries(REPLICA)

    def host_states(self) -> int:
        self.fold()
        return self._env.entries(RSTATE)

    def revisits_held(self) -> int:
        """Revisit records held as of the last fold (without folding: for status)."""
        return self._env.entries(RREVISIT)
