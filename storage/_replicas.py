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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import lmdb
import msgpack

from ._keys import arc_ranges, host_prefix
from ._lmdb import LmdbEnv
from ._records import HostState, QueuedUrl

__all__ = ["REPLICA_DBS", "Replicas"]

REPLICA, RSTATE = b"replica", b"rstate"
REPLICA_DBS = (REPLICA, RSTATE)
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
    """The replicas held here. Every public call is one transaction, or a scan in short ones."""

    def __init__(self, env: LmdbEnv) -> None:
        self._env = env
        self._db = env.db(REPLICA)
        self._states = env.db(RSTATE)

    def hold(self, items: Sequence[tuple[bytes, QueuedUrl]], released: Sequence[bytes],
             states: Sequence[HostState] = ()) -> int:
        """Delete the `released` keys, then store `items` (key, URL) and merge `states` (the later
        `next_allowed` wins), in one transaction. Returns how many released keys were held."""
        return self._env.write(lambda txn: self._hold_in(txn, items, released, states))

    def _hold_in(self, txn: lmdb.Transaction, items: Sequence[tuple[bytes, QueuedUrl]], released: Sequence[bytes],
                 states: Sequence[HostState]) -> int:
        gone = 0
        for key in released:
            gone += txn.delete(key, db=self._db)
        for key, item in items:
            txn.put(key, _packb([item.url, item.host, item.depth, item.hops, item.found_on]), db=self._db)
        for state in states:
            prefix = host_prefix(state.host)
            raw = txn.get(prefix, db=self._states)
            ready = state.next_allowed
            if raw is not None:
                ready = max(ready, _unpackb(raw)[0])
            txn.put(prefix, _packb([float(ready), float(state.crawl_delay), state.failures]), db=self._states)
        return gone

    def arc(self, start: int, end: int) -> tuple[list[tuple[bytes, QueuedUrl]], list[HostState]]:
        """What is held for the arc [start, end): (key, URL) pairs and host states."""
        ranges = arc_ranges(start, end)
        items = [(key, _item(value)) for key, value in self._env.scan(REPLICA, ranges)]
        states = [_state(key, value) for key, value in self._env.scan(RSTATE, ranges)]
        return items, states

    def where(self, wanted: Callable[[int], bool]) -> tuple[list[tuple[bytes, QueuedUrl]], list[HostState]]:
        """What is held at the ring positions `wanted(position)` picks: one pass over the replicas (a death
        moves thousands of small arcs; one scan beats thousands of range reads)."""
        items = [(key, _item(value)) for key, value in self._env.scan(REPLICA, _WHOLE_RING)
                 if wanted(int.from_bytes(key[:8], "big"))]
        states = [_state(key, value) for key, value in self._env.scan(RSTATE, _WHOLE_RING)
                  if wanted(int.from_bytes(key[:8], "big"))]
        return items, states

    def _forget_in(self, txn: lmdb.Transaction, keys: Sequence[bytes], hosts: Sequence[str]) -> None:
        for key in keys:
            txn.delete(key, db=self._db)
        for host in hosts:
            txn.delete(host_prefix(host), db=self._states)

    def drop_arc(self, start: int, end: int) -> int:
        """Forget everything held for the arc [start, end); returns how many URLs were held."""
        ranges = arc_ranges(start, end)
        self._env.delete_ranges(RSTATE, ranges)
        return self._env.delete_ranges(REPLICA, ranges)

    def keys(self) -> Iterator[bytes]:
        """Every key held, in ring order, read in short transactions."""
        for key, _value in self._env.scan(REPLICA, _WHOLE_RING):
            yield key

    def drop_where(self, unwanted: Callable[[int], bool], *, chunk: int = 4096) -> int:
        """Forget the URLs and states whose ring position `unwanted(position)` says are not this node's to hold
        (it is no longer a backup there). Reads in short transactions, deletes `chunk` keys per transaction."""
        dropped = {REPLICA: 0, RSTATE: 0}
        for name in (REPLICA, RSTATE):
            db = self._env.db(name)
            batch: list[bytes] = []
            for key, _value in self._env.scan(name, _WHOLE_RING):
                if unwanted(int.from_bytes(key[:8], "big")):
                    batch.append(key)
                if len(batch) >= chunk:
                    dropped[name] += self._delete(db, batch)
                    batch = []
            if batch:
                dropped[name] += self._delete(db, batch)
        return dropped[REPLICA]

    def _delete(self, db: object, keys: list[bytes]) -> int:
        return self._env.write(lambda txn: sum(1 for key in keys if txn.delete(key, db=db)))

    def __len__(self) -> int:
        return self._env.entries(REPLICA)

    def host_states(self) -> int:
        return self._env.entries(RSTATE)
