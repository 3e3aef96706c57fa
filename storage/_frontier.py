"""The durable frontier: per-host queues of URLs, what is in flight, and per-host politeness state.

Everything lives in LMDB, so memory stays bounded however many URLs are queued, and a node killed with
kill -9 resumes where its last commit left it. Databases (all keys begin with the host's ring position, so
an arc of the ring is one key range; `hp` = position(8) + host + NUL, see `host_prefix`):

- hqueue: position(8) + host number + depth(4, big-endian) + seq(8)
                                              ->  msgpack [url(, hops(, found_on(, crashes(, lastmod, sitemap))))]
          The host number tells apart the hosts whose 64-bit positions collide (almost never more than one, so
          it is 0): one byte for 0 to 254, else 0xFF and 4 bytes, so no host's key prefix is another's. It is
          this store's own (given when a host's first URL is queued, kept in `hosts`, free again once the host
          has nothing queued): a hand-off and a replica carry host names, and the receiver numbers its hosts.
          Trailing record fields only when set (`_record`), so records written before them read the same.
          A URL (and a `found_on`) on the key's host is stored without its scheme and host: msgpack bin, one
          byte for the scheme (0 http, 1 https) and the rest of the URL (`_pack_url`); any other URL, and every
          URL of records written before this form, is a msgpack str, read as it is.
          Key order within a host is depth, then arrival: `pop` takes the first key, breadth first.
- queue:  hp + depth(4) + seq(8)               ->  the same record: the queue as stores written before host
          numbers keep it (the host name in every key). Opening such a store moves it into `hqueue`, some
          thousands of records per transaction (storage/_hostnumbers.py): a crash in between leaves both
          halves consistent and the next open goes on.
- flight: hp + url fingerprint(8)             ->  msgpack [count, queue key, url, hops, found_on(, ...)]
          a popped URL until `done`; `recover` puts it back at its place (the depth and sequence of its queue
          key, under the host's number at that time).
- hosts:  hp                                  ->  queued count (8 bytes) + host number, for `hosts()`,
          `hosts_after()`, `queued()` and the queue's keys (a store before host numbers: the count alone)
- state:  hp                                  ->  msgpack [next_allowed, crawl_delay, backoff, failures, pages]
- meta:   b"seq"                              ->  last sequence number handed out (8 bytes)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from ._closing import Closing
from ._hostnumbers import TAIL, HostNumbers, queued_count
from ._keys import arc_ranges, host_prefix, url_fingerprint
from ._lmdb import DEFAULT_MAP_SIZE, MAX_MAP_SIZE, LmdbEnv
from ._records import HostState, QueuedUrl

if TYPE_CHECKING:
    from ._lmdb import Txn

__all__ = ["FRONTIER_DBS", "FrontierStore"]

QUEUE, FLIGHT, HOSTS, STATE, META = b"hqueue", b"flight", b"hosts", b"state", b"meta"
OLD_QUEUE = b"queue"  # the queue keyed by host name, as stores before host numbers hold it (moved at open)
FRONTIER_DBS = (QUEUE, OLD_QUEUE, FLIGHT, HOSTS, STATE, META)
_SEQ = b"seq"
_MAX_DEPTH = 2**32 - 1
_WHOLE_RING = arc_ranges(0, 0)
_packb = msgpack.packb
_unpackb = msgpack.unpackb


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")


def _host_of(prefix: bytes) -> str:
    return prefix[8:-1].decode("utf-8")


_SCHEMES = ("http://", "https://")  # a packed URL's first byte indexes this
_AFTER_HOST = frozenset("/:?#")  # what may follow the host in a URL that is on it (not "host.evil")


def _pack_url(url: str | None, host: str) -> str | bytes | None:
    """`url` without its scheme and host when it is on `host` (bytes: scheme code + the rest), else as it is."""
    if url is None:
        return None
    for code, scheme in enumerate(_SCHEMES):
        if url.startswith(scheme) and url.startswith(host, len(scheme)):
            rest = url[len(scheme) + len(host):]
            if not rest or rest[0] in _AFTER_HOST:
                return bytes((code,)) + rest.encode("utf-8")
    return url


def _unpack_url(packed: str | bytes | None, host: str) -> str | None:
    if packed.__class__ is bytes:
        assert isinstance(packed, bytes)
        return _SCHEMES[packed[0]] + host + packed[1:].decode("utf-8")
    assert packed is None or isinstance(packed, str)
    return packed


def _record(item: QueuedUrl, crashes: int = 0) -> list[object]:
    """The queue record of `item`: [url, hops, found_on] (URLs on the item's host packed, `_pack_url`), then the
    times in a row the process stopped with it in flight, then a sitemap's lastmod and the sitemap flag;
    trailing fields only when set."""
    host = item.host
    record: list[object] = [_pack_url(item.url, host), item.hops, _pack_url(item.found_on, host)]
    if item.lastmod is not None or item.sitemap:
        return [*record, crashes, item.lastmod, item.sitemap]
    if crashes:
        return [*record, crashes]
    if item.found_on is not None:
        return record
    return record[:2] if item.hops else record[:1]


def _item_from(host: str, key: bytes, record: list[Any]) -> QueuedUrl:
    """The queued URL of `host` whose queue key (either form: only its depth is read) is `key`."""
    n = len(record)
    lastmod, sitemap = record[4:6] if n >= 6 else (None, False)
    url = _unpack_url(record[0], host)
    assert url is not None
    return QueuedUrl(
        url=url, host=host, depth=int.from_bytes(key[-12:-8], "big"), hops=record[1] if n > 1 else 0,
        found_on=_unpack_url(record[2], host) if n > 2 else None, lastmod=lastmod, sitemap=sitemap,
    )


def _state_of(key: bytes, value: bytes) -> HostState:
    record = _unpackb(value)
    next_allowed, crawl_delay, backoff, failures, pages = record[:5]
    return HostState(
        host=_host_of(key), next_allowed=next_allowed, crawl_delay=crawl_delay, backoff=backoff,
        failures=failures, pages=pages, bytes=record[5] if len(record) > 5 else 0,  # stores before bytes: 5 fields
    )


def _state_value(state: HostState) -> bytes:
    return _packb(
        [float(state.next_allowed), float(state.crawl_delay), float(state.backoff), state.failures, state.pages,
         state.bytes]
    )


class FrontierStore(Closing):
    """Per-host URL queues and politeness state in LMDB. Every call is one transaction."""

    def __init__(self, env: LmdbEnv, *, owns_env: bool) -> None:
        self._env = env
        self._queue = env.db(QUEUE)
        self._flight = env.db(FLIGHT)
        self._hosts = env.db(HOSTS)
        self._state = env.db(STATE)
        self._meta = env.db(META)
        self._owns_env = owns_env
        self._numbers = HostNumbers(self._hosts, self._queue)
        if env.entries(OLD_QUEUE):
            self._numbers.migrate(env, env.db(OLD_QUEUE))

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = MAX_MAP_SIZE,
    ) -> FrontierStore:
        """Open or create the frontier in directory `path`. Raises `StorageError` if it is unusable."""
        env = LmdbEnv.open(path, FRONTIER_DBS, map_size=map_size, max_map_size=max_map_size)
        return cls(env, owns_env=True)


    # -- transaction-level parts, shared with NodeStore --

    def _push_in(self, txn: Txn, items: Sequence[QueuedUrl]) -> None:
        if not items:
            return
        raw = txn.get(_SEQ, db=self._meta)
        seq = int.from_bytes(raw, "big") if raw else 0
        hosts: dict[str, list[Any]] = {}  # host -> [hp, queue-key prefix, count]
        put = txn.put
        queue = self._queue
        for item in items:
            host = hosts.get(item.host)
            if host is None:
                hp = host_prefix(item.host)
                count, qp = self._numbers.assign(txn, hp)
                host = hosts[item.host] = [hp, qp, count]
            depth = item.depth
            if not 0 <= depth <= _MAX_DEPTH:
                raise ValueError(f"depth must be in [0, 2**32), got {depth} for {item.url!r}")
            seq += 1
            put(host[1] + depth.to_bytes(4, "big") + seq.to_bytes(8, "big"), _packb(_record(item)), db=queue)
            host[2] += 1
        for hp, qp, n in hosts.values():
            self._numbers.set_count(txn, hp, qp, n)
        put(_SEQ, _u64(seq), db=self._meta)

    def _pop_in(self, txn: Txn, host: str) -> QueuedUrl | None:
        prefix = host_prefix(host)
        entry = self._numbers.get(txn, prefix)
        if entry is None:
            return None
        count, qp = entry
        cur = txn.cursor(self._queue)
        if not cur.set_range(qp):
            return None
        key = cur.key()
        if not key.startswith(qp):
            return None
        value = cur.value()
        cur.delete()
        # the count never frees the number while records are under it (it would go to another host)
        self._numbers.set_count(txn, prefix, qp, max(count - 1, int(cur.key().startswith(qp))))
        record = _unpackb(value)
        item = _item_from(host, key, record)
        fkey = prefix + url_fingerprint(item.url)
        old = txn.get(fkey, db=self._flight)
        n = _unpackb(old)[0] + 1 if old else 1
        # A queue value may carry a fourth field: how many times in a row the process stopped with this URL in
        # flight (`recover_in_flight`). It rides along in the flight record; a finished fetch deletes it.
        crashes = int(record[3]) if len(record) > 3 else 0
        txn.put(fkey, _packb([n, key, *_record(item, crashes)]), db=self._flight)
        return item

    def _done_in(self, txn: Txn, item: QueuedUrl) -> bool:
        fkey = host_prefix(item.host) + url_fingerprint(item.url)
        old = txn.get(fkey, db=self._flight)
        if old is None:
            return False
        record = _unpackb(old)
        if record[0] > 1:
            record[0] -= 1
            txn.put(fkey, _packb(record), db=self._flight)
        else:
            txn.delete(fkey, db=self._flight)
        return True

    def _put_back_in(self, txn: Txn, fkey: bytes, qkey: bytes, item: QueuedUrl, crashes: int) -> None:
        """Queue an in-flight `item` again at its place: the depth and sequence of its queue key `qkey` (either
        form), under its host's number now; unless a record is there already."""
        hp = fkey[:-8]
        count, qp = self._numbers.assign(txn, hp)
        added = txn.put(qp + qkey[-TAIL:], _packb(_record(item, crashes)), overwrite=False, db=self._queue)
        self._numbers.set_count(txn, hp, qp, count + int(added))

    # -- queues --

    def push(self, items: Sequence[QueuedUrl]) -> None:
        """Queue a batch of URLs in one transaction (no dedup here: that is the dedup store's job)."""
        if items:
            self._env.write(lambda txn: self._push_in(txn, items))

    def pop(self, host: str) -> QueuedUrl | None:
        """Take the host's next URL (lowest depth, then oldest); it is durably in flight until `done`."""
        return self._env.write(lambda txn: self._pop_in(txn, host))

    def pop_many(self, hosts: Sequence[str]) -> list[QueuedUrl | None]:
        """`pop` for several hosts in one transaction (one result per host, in order)."""
        return self._env.write(lambda txn: [self._pop_in(txn, host) for host in hosts])

    def done(self, item: QueuedUrl) -> None:
        """Forget an in-flight URL: it was fetched (or given up). Unknown items are ignored."""
        self._env.write(lambda txn: self._done_in(txn, item))

    def done_many(self, items: Sequence[QueuedUrl]) -> None:
        """`done` for a batch, in one transaction."""
        if items:
            self._env.write(lambda txn: [self._done_in(txn, item) for item in items])

    def recover(self) -> int:
        """At startup: put every in-flight URL back at its place in its queue; return how many."""
        return self.recover_in_flight(max_crashes=0)[0]

    def recover_in_flight(self, *, max_crashes: int) -> tuple[int, list[QueuedUrl]]:
        """At startup: put in-flight URLs back in their queues, counting the stop against each of them.

        A URL in flight when the process stopped may be what stopped it. Each is put back with its count of
        stops in a row while it was in flight (a fetch that finishes forgets the count); one that reaches
        `max_crashes` (0: never) is dropped instead, so no input can make a node crash-loop. Returns how many
        went back and the dropped URLs, for the caller to record.
        """

        def put_back(txn: Txn) -> tuple[int, list[QueuedUrl]]:
            cur = txn.cursor(self._flight)
            n = 0
            dropped: list[QueuedUrl] = []
            if cur.first():
                while True:
                    fkey = cur.key()
                    if not fkey:
                        break
                    _count, qkey, *record = _unpackb(cur.value())
                    crashes = (record[3] if len(record) > 3 else 0) + 1
                    item = _item_from(_host_of(fkey[:-8]), qkey, record)
                    if max_crashes and crashes >= max_crashes:
                        dropped.append(item)
                    else:
                        self._put_back_in(txn, fkey, qkey, item, crashes)
                        n += 1
                    cur.delete()
            return n, dropped

        return self._env.write(put_back)

    def discard(self, items: Sequence[QueuedUrl]) -> int:
        """Remove these queued URLs (matched by host and URL), e.g. ones a hand-off says were fetched by the
        host's previous owner. Returns how many were removed."""
        return len(self._env.write(lambda txn: self._discard_in(txn, items))) if items else 0

    def _discard_in(self, txn: Txn, items: Sequence[QueuedUrl]) -> list[QueuedUrl]:
        """`discard` within `txn`; returns the queue entries removed."""
        by_host: dict[str, set[str]] = {}
        for item in items:
            by_host.setdefault(item.host, set()).add(item.url)
        removed: list[QueuedUrl] = []
        for host, urls in by_host.items():
            prefix = host_prefix(host)
            entry = self._numbers.get(txn, prefix)
            if entry is None:
                continue
            count, qp = entry
            cur = txn.cursor(self._queue)
            gone = 0
            if cur.set_range(qp):
                while cur.key().startswith(qp):
                    item = _item_from(host, cur.key(), _unpackb(cur.value()))
                    if item.url in urls:
                        if not cur.delete():
                            break
                        removed.append(item)
                        gone += 1
                        continue
                    if not cur.next():
                        break
            if gone:
                left = cur.set_range(qp) and cur.key().startswith(qp)
                self._numbers.set_count(txn, prefix, qp, max(count - gone, int(left)))
        return removed

    def _holding_in(self, txn: Txn, urls: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these (host, URL) pairs are queued or in flight here: a look-up of each in flight, and one
        read of the queue of each host with a URL not in flight."""
        held: set[tuple[str, str]] = set()
        by_host: dict[str, set[str]] = {}
        for host, url in urls:
            if txn.get(host_prefix(host) + url_fingerprint(url), db=self._flight) is not None:
                held.add((host, url))
            else:
                by_host.setdefault(host, set()).add(url)
        for host, wanted in by_host.items():
            entry = self._numbers.get(txn, host_prefix(host))
            if entry is None:
                continue
            qp = entry[1]
            cur = txn.cursor(self._queue)
            if not cur.set_range(qp):
                continue
            for key, value in cur:
                if not key.startswith(qp):
                    break
                url = _item_from(host, key, _unpackb(value)).url
                if url in wanted:
                    held.add((host, url))
                    wanted.discard(url)
                    if not wanted:
                        break
        return held

    def requeue(self, items: Sequence[QueuedUrl]) -> int:
        """Put in-flight URLs back at their place in their queues (a fetch that will not happen here, e.g. the
        host moved to another node); unknown items are ignored. Returns how many went back."""

        def put_back(txn: Txn) -> int:
            n = 0
            for item in items:
                prefix = host_prefix(item.host)
                fkey = prefix + url_fingerprint(item.url)
                old = txn.get(fkey, db=self._flight)
                if old is None:
                    continue
                _count, qkey, *record = _unpackb(old)
                self._put_back_in(txn, fkey, qkey, _item_from(item.host, qkey, record), 0)
                txn.delete(fkey, db=self._flight)
                n += 1
            return n

        return self._env.write(put_back) if items else 0

    def hosts(self) -> Iterator[tuple[str, int]]:
        """Hosts with queued URLs and their counts, in ring order."""
        for key, value in self._env.scan(HOSTS, _WHOLE_RING):
            yield _host_of(key), queued_count(value)

    def hosts_after(self, host: str | None, limit: int) -> list[tuple[str, int]]:
        """Up to `limit` hosts with queued URLs that come after `host` in ring order (from the first when None),
        with their counts, in one short read: the scheduler's way round the host table."""
        out: list[tuple[str, int]] = []
        with self._env.read() as txn:
            cur = txn.cursor(self._hosts)
            if host is None:
                ok = cur.first()
            else:
                prefix = host_prefix(host)
                ok = cur.set_range(prefix)
                if ok and cur.key() == prefix:
                    ok = cur.next()
            while ok and len(out) < limit:
                key, value = cur.item()
                out.append((_host_of(key), queued_count(value)))
                ok = cur.next()
        return out

    def queued(self, host: str) -> int:
        with self._env.read() as txn:
            raw = txn.get(host_prefix(host), db=self._hosts)
        return queued_count(raw) if raw else 0

    def __len__(self) -> int:
        return self._env.entries(QUEUE)

    def in_flight(self) -> int:
        return self._env.entries(FLIGHT)

    def in_flight_items(self) -> list[QueuedUrl]:
        """The URLs now in flight (each once), in ring order."""
        out = []
        for key, value in self._env.scan(FLIGHT, _WHOLE_RING):
            _count, qkey, *record = _unpackb(value)
            out.append(_item_from(_host_of(key[:-8]), qkey, record))
        return out

    # -- politeness state --

    def get_state(self, host: str) -> HostState | None:
        prefix = host_prefix(host)
        with self._env.read() as txn:
            raw = txn.get(prefix, db=self._state)
        return None if raw is None else _state_of(prefix, raw)

    def get_states(self, hosts: Iterable[str]) -> dict[str, HostState]:
        """The stored states of `hosts` (those that have one), read in one transaction."""
        found: dict[str, HostState] = {}
        with self._env.read() as txn:
            for host in hosts:
                prefix = host_prefix(host)
                raw = txn.get(prefix, db=self._state)
                if raw is not None:
                    found[host] = _state_of(prefix, raw)
        return found

    def put_state(self, state: HostState) -> None:
        self.put_states([state])

    def put_states(self, states: Sequence[HostState]) -> None:
        """Store several host states in one transaction."""
        if not states:
            return

        def put_all(txn: Txn) -> None:
            for state in states:
                self._put_state_in(txn, state)

        self._env.write(put_all)

    def _merge_states_in(self, txn: Txn, states: Sequence[HostState]) -> list[HostState]:
        """Merge states into those here, keeping the later `next_allowed` and the longer Crawl-delay; return
        the merged states."""
        merged = []
        for state in states:
            prefix = host_prefix(state.host)
            raw = txn.get(prefix, db=self._state)
            if raw is not None:
                here = _state_of(prefix, raw)
                state = HostState(
                    host=state.host, next_allowed=max(state.next_allowed, here.next_allowed),
                    crawl_delay=max(state.crawl_delay, here.crawl_delay), backoff=here.backoff,
                    failures=max(state.failures, here.failures), pages=max(state.pages, here.pages),
                    bytes=max(state.bytes, here.bytes),
                )
            txn.put(prefix, _state_value(state), db=self._state)
            merged.append(state)
        return merged

    def scan_queued(self, *, chunk: int = 4096) -> Iterator[QueuedUrl]:
        """Every queued URL in ring order, read `chunk` at a time in short transactions (never all in memory)."""
        return self._scan_items(_WHOLE_RING, chunk)

    def _scan_items(self, ranges: Sequence[tuple[bytes, bytes]], chunk: int = 4096) -> Iterator[QueuedUrl]:
        """The queued URLs in `ranges` (as `LmdbEnv.scan`), `chunk` per short read transaction."""
        for first, last in ranges:
            at: bytes | None = first
            while at is not None:
                with self._env.read() as txn:
                    items, at = self._items_in(txn, at, last, chunk)
                yield from items

    def _items_in(self, txn: Txn, at: bytes, last: bytes, limit: int | None) -> tuple[list[QueuedUrl], bytes | None]:
        """The queued URLs from key `at` on whose position is at most `last`, `limit` at most (None: all), each
        with its host's name from `hosts`; and the key to go on from when `limit` ended the read, else None."""
        cur = txn.cursor(self._queue)
        out: list[QueuedUrl] = []
        if not cur.set_range(at):
            return out, None
        hosts = txn.cursor(self._hosts)
        qp, host = b"", None
        for key, value in cur:
            if key[:8] > last:
                break
            if limit is not None and len(out) >= limit:
                return out, key
            if key[:-TAIL] != qp:
                qp = key[:-TAIL]
                host = self._numbers.host_at(hosts, qp)
            if host is not None:  # a record under no host's number (none in a consistent store) is not a URL
                out.append(_item_from(host, key, _unpackb(value)))
        return out, None

    def _put_state_in(self, txn: Txn, state: HostState) -> None:
        txn.put(host_prefix(state.host), _state_value(state), db=self._state)

    def states(self) -> Iterator[HostState]:
        for key, value in self._env.scan(STATE, _WHOLE_RING):
            yield _state_of(key, value)

    # -- arcs (hand-off: export, send, and drop only once the new owner has acknowledged) --

    def export_arc(self, start: int, end: int) -> tuple[list[QueuedUrl], list[HostState]]:
        """Copy out what is queued for the arc [start, end) and its host states; the store is unchanged.

        In-flight URLs are not included: their fetch finishes here and `done` clears them.
        """
        ranges = arc_ranges(start, end)
        items = list(self._scan_items(ranges))
        states = [_state_of(key, value) for key, value in self._env.scan(STATE, ranges)]
        return items, states

    take_arc = export_arc  # the engine's name for it; non-destructive until drop_arc

    def export_arcs(self, arcs: Sequence[tuple[int, int]]) -> list[tuple[list[QueuedUrl], list[HostState]]]:
        """`export_arc` of each of `arcs`, in one read transaction per database (the caller bounds how many)."""
        ranges = [arc_ranges(start, end) for start, end in arcs]
        flat = [r for rs in ranges for r in rs]
        with self._env.read() as txn:
            queued = iter([self._items_in(txn, first, last, None)[0] for first, last in flat])
        states = iter(self._env.scan_each(STATE, flat))
        out = []
        for rs in ranges:
            items: list[QueuedUrl] = []
            hosts: list[HostState] = []
            for _ in rs:
                items.extend(next(queued))
                hosts.extend(_state_of(key, value) for key, value in next(states))
            out.append((items, hosts))
        return out

    def host_positions(self) -> bytes:
        """The ring positions (8 bytes each, big-endian, in ring order per kind) of every host with queued URLs,
        then of every host with a politeness state: what a hand-off must look at, read without decoding a key."""
        return self._env.key_prefixes(HOSTS) + self._env.key_prefixes(STATE)

    def _drop_arc_in(self, txn: Txn, ranges: Sequence[tuple[bytes, bytes]]) -> int:
        """Delete the queues, counts and states of the hosts in `ranges` within `txn`; return URLs dropped."""
        hosts_cur = txn.cursor(self._hosts)
        queue_cur = txn.cursor(self._queue)
        state_cur = txn.cursor(self._state)
        dropped = 0
        for first, last in ranges:
            while hosts_cur.set_range(first):
                if hosts_cur.key()[:8] > last:
                    break
                hosts_cur.delete()
            while queue_cur.set_range(first):
                if queue_cur.key()[:8] > last:
                    break
                queue_cur.delete()
                dropped += 1
            while state_cur.set_range(first):
                if state_cur.key()[:8] > last:
                    break
                state_cur.delete()
        return dropped

    def put_arc(self, items: Sequence[QueuedUrl], states: Sequence[HostState]) -> None:
        """Take in an arc handed over by its previous owner, in one transaction (queue order is kept)."""

        def put_all(txn: Txn) -> None:
            self._push_in(txn, items)
            for state in states:
                txn.put(host_prefix(state.host), _state_value(state), db=self._state)

        self._env.write(put_all)

    def drop_arc(self, start: int, end: int, *, hosts_per_txn: int = 256) -> int:
        """Delete what is queued for the arc [start, end) and its host states; return URLs dropped.

        Each transaction removes whole hosts (queue and count together), so the store is consistent at
        every commit.
        """
        ranges = arc_ranges(start, end)
        dropped = 0
        for first, last in ranges:

            def drop_some(txn: Txn, first: bytes = first, last: bytes = last) -> tuple[int, int]:
                hosts_cur = txn.cursor(self._hosts)
                queue_cur = txn.cursor(self._queue)
                n_hosts = n_items = 0
                if not hosts_cur.set_range(first):
                    return 0, 0
                while n_hosts < hosts_per_txn:
                    prefix = hosts_cur.key()
                    if not prefix or prefix[:8] > last:
                        break
                    qp = prefix[:8] + hosts_cur.value()[8:]
                    if len(qp) > 8 and queue_cur.set_range(qp):
                        while queue_cur.key().startswith(qp):
                            queue_cur.delete()
                            n_items += 1
                    hosts_cur.delete()
                    n_hosts += 1
                return n_hosts, n_items

            while True:
                n_hosts, n_items = self._env.write(drop_some)
                dropped += n_items
                if n_hosts < hosts_per_txn:
                    break
        dropped += self._env.delete_ranges(QUEUE, ranges)  # records under no host (none in a consistent store)
        self._env.delete_ranges(STATE, ranges)
        return dropped

    def sync(self) -> None:
        self._env.sync()

    def disk_bytes(self) -> int:
        return self._env.disk_bytes()

    def close(self) -> None:
        if self._owns_env:
            self._env.close()
