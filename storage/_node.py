"""A node's dedup store and frontier in ONE LMDB environment, so they can change in one transaction.

Why together: if "seen" were committed and the crash came before "queued", that URL would be lost for good
(seen, so never queued again). `admit` marks URLs seen and queues the new ones atomically; `finish` also
clears the page they were found on from in-flight, so after kill -9 either the page is fetched again and
its links re-admitted, or all of it happened. A sender's batch is acknowledged only after `sync()`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any


from ._closing import Closing
from ._dedup import DEDUP_DBS, SAVE_FILTER_FROM, DedupStore, MemoryDedupStore
from ._digests import DIGESTS_DB, MemoryPayloadDigests, PayloadDigests
from ._frontier import FRONTIER_DBS, FrontierStore
from ._crawllog import CRAWLLOG_DB, CrawlLogSpool
from ._items import ITEMS_DB, ItemSpool
from ._keys import arc_ranges, host_position_bytes, url_fingerprint
from ._lmdb import DEFAULT_MAP_SIZE, MAX_MAP_SIZE, LmdbEnv, put_keys
from ._memfrontier import MemoryFrontierStore
from ._outbox import OUTBOX_DB, Outbox
from ._records import HostState, QueuedUrl
from ._replicas import REPLICA_DBS, Replicas
from ._revisits import REVISIT_DB, REVISIT_DUE_DB, RevisitRecord, RevisitSchedule, queued
from ._seenfilter import MAX_BYTES
from ._uploads import UPLOAD_DBS, Uploads

if TYPE_CHECKING:
    from ._lmdb import Txn

__all__ = ["FETCHED_DB", "MemoryNodeStore", "NodeStore", "queued_url_keys"]

#: Seen keys of the pages this node fetched itself (not those only queued): the keys it may replicate to a
#: backup node (peer/cluster/replicas/seenreplicas.py), as a URL merely queued must never be marked seen elsewhere.
FETCHED_DB = b"fetched"
#: Keys to be recorded in FETCHED_DB, appended in the order they came (8-byte sequence number -> the keys
#: concatenated): a tick's keys are one put at the end of a table instead of a leaf page each (random ring
#: positions), and they reach FETCHED_DB sorted, many to a page, FETCHED_FOLD at a time or when it is read.
FETCHED_JOURNAL_DB = b"fetched_journal"
#: Journaled keys that make `mark_fetched` fold them into FETCHED_DB (16 bytes each; about 20 ms of one
#: transaction, every half minute of a node fetching 600 pages a second).
FETCHED_FOLD = 16_384
_KEY_SIZE = 16  # a dedup key: ring position (8) + URL fingerprint (8)
_ALL = [(b"\x00" * 8, b"\xff" * 8)]


def queued_url_keys(items: Sequence[QueuedUrl]) -> list[bytes]:
    """The dedup keys of queued URLs: `url_key(host_position(item.host), item.url)` for each, made fast."""
    position, fingerprint = host_position_bytes, url_fingerprint
    return [position(item.host) + fingerprint(item.url) for item in items]


class NodeStore(Closing):
    """`dedup` and `frontier` sharing one environment, plus the atomic operations across them."""

    def __init__(self, env: LmdbEnv, *, filter_max_bytes: int = MAX_BYTES,
                 save_filter_from: int = SAVE_FILTER_FROM) -> None:
        self._env = env
        self.dedup = DedupStore(env, owns_env=False, filter_max_bytes=filter_max_bytes,
                                save_filter_from=save_filter_from)
        self.frontier = FrontierStore(env, owns_env=False)
        self.outbox = Outbox(env)
        # a released replica marks its key seen here (its owner is done with it), when the journal is folded
        self.replicas = Replicas(env, mark_seen_in=self.dedup._insert_in)
        self.revisits = RevisitSchedule(env)
        self.items = ItemSpool(env)  # items the plug-ins extracted, put with their page (peer/plugins)
        # payload digests this node owns, and where each was first stored in full (storage/_digests.py)
        self.digests = PayloadDigests(env)
        self.uploads = Uploads(env)  # closed WARC files on their way to object storage (storage/_uploads.py)
        self.crawl_log = CrawlLogSpool(env)  # one record per finished URL, put with its page (storage/_crawllog.py)
        self._fetched_next = 0  # the next FETCHED_JOURNAL_DB sequence number
        self.fetched_journaled = 0  # keys journaled since the last fold (1 at open when the journal holds some)
        with env.read() as txn:
            last = txn.cursor(env.db(FETCHED_JOURNAL_DB))
            if last.last():
                self._fetched_next = int.from_bytes(last.key(), "big") + 1
                self.fetched_journaled = 1
        #: Completed `sync` calls: whatever was committed before the count last moved is on disk, so parts of
        #: the node that need their commits durable share one fsync instead of each forcing its own.
        self.syncs = 0

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = MAX_MAP_SIZE,
        filter_max_bytes: int = MAX_BYTES,
        save_filter_from: int = SAVE_FILTER_FROM,
    ) -> NodeStore:
        """Open or create the node's state in directory `path`. Raises `StorageError` if it is unusable.
        `filter_max_bytes` caps the seen filter's memory; a store of at least `save_filter_from` seen keys
        saves its filter when it closes, for the next open (storage/_dedup.py)."""
        env = LmdbEnv.open(
            path, (*DEDUP_DBS, *FRONTIER_DBS, OUTBOX_DB, FETCHED_DB, FETCHED_JOURNAL_DB, REVISIT_DB, REVISIT_DUE_DB,
                   *REPLICA_DBS, ITEMS_DB, *UPLOAD_DBS, DIGESTS_DB, CRAWLLOG_DB),
            map_size=map_size, max_map_size=max_map_size,
        )
        try:
            return cls(env, filter_max_bytes=filter_max_bytes, save_filter_from=save_filter_from)
        except BaseException:
            env.close()
            raise

    def _admit_in(self, txn: Txn, items: Sequence[QueuedUrl]) -> list[QueuedUrl]:
        fresh = self.dedup._add_new_in(txn, queued_url_keys(items))
        new = [item for item, is_new in zip(items, fresh) if is_new]
        self.frontier._push_in(txn, new)
        return new

    def admit(self, items: Sequence[QueuedUrl]) -> list[QueuedUrl]:
        """Mark the URLs seen and queue those that were new, in one transaction; return the new ones."""
        if not items:
            return []
        return self._env.write(lambda txn: self._admit_in(txn, items))

    def finish(
        self,
        item: QueuedUrl | None,
        links: Sequence[QueuedUrl],
        routed: Sequence[tuple[str, QueuedUrl]] = (),
        *,
        state: HostState | None = None,
        items: Sequence[dict[str, Any]] = (),
        logged: Sequence[Any] | None = None,
    ) -> list[QueuedUrl]:
        """Admit a fetched page's local links, put its `routed` (owner, url) links in the outbox, clear the
        page from in-flight, save its host's politeness `state`, spool the `items` extracted from it and its
        crawl-log record (`logged`, `LOG_FIELDS`), in one transaction."""

        def run(txn: Txn) -> list[QueuedUrl]:
            new = self._admit_in(txn, links)
            self.outbox._put_in(txn, routed)
            if item is not None:
                self.frontier._done_in(txn, item)
            if state is not None:
                self.frontier._put_state_in(txn, state)
            if items:
                self.items._put_in(txn, items)
            if logged is not None:
                self.crawl_log._put_in(txn, (logged,))
            return new

        return self._env.write(run)

    def accept(self, owned: Sequence[QueuedUrl], forward: Sequence[tuple[str, QueuedUrl]], *,
               aside: bool = False, handed: bool = False) -> list[QueuedUrl]:
        """A peer's batch: admit the URLs owned here and put the others in the outbox for their owners, in
        one transaction; return the new ones. `aside`: no page's release waits for the forwarded ones.
        `handed`: the URLs came with their arc in a hand-off, where a queued one may be a page's revisit: a new
        one whose page has a revisit waiting here is that revisit, taken off the time index."""

        def run(txn: Txn) -> list[QueuedUrl]:
            new = self._admit_in(txn, owned) if owned else []
            self.outbox._put_in(txn, forward, aside=aside)
            if handed and new:
                self.revisits._queued_in(txn, new)
            return new

        return self._env.write(run)

    def put_revisits(self, records: Sequence[RevisitRecord]) -> None:
        """Revisit schedules handed over with their arc (`queued`: at their sender), in one transaction: each is
        queued here exactly when its page's URL is queued or in flight here, else it waits on the time index
        (`RevisitSchedule._put_arc_in`)."""
        if not records:
            return

        def run(txn: Txn) -> None:
            revisits = self.revisits
            ask = []
            for record in records:
                if record.queued:
                    ask.append(record)
                else:
                    here = revisits._get_in(txn, record.key())
                    if here is not None and here.queued:
                        ask.append(record)
            held = self.frontier._holding_in(txn, [(record.host, record.url) for record in ask])
            revisits._put_arc_in(txn, records, {r.key() for r in ask if (r.host, r.url) in held})

        self._env.write(run)

    def discard(self, items: Sequence[QueuedUrl]) -> int:
        """Remove these queued URLs (a hand-off says the host's previous owner has them as fetched), in one
        transaction with their pages' revisits: one that was queued waits on the time index again, so it is not
        lost with its queue entry. Returns how many URLs were removed."""
        if not items:
            return 0

        def run(txn: Txn) -> int:
            removed = self.frontier._discard_in(txn, items)
            self.revisits._unqueued_in(txn, removed)
            return len(removed)

        return self._env.write(run)

    def reroute(self, owner_of: Callable[[str], str], local: str) -> tuple[dict[str, int], list[QueuedUrl]]:
        """After a view change: re-key outbox entries whose owner changed, and admit those now owned by
        `local`, in one transaction. Returns (entries moved per new owner, the new local URLs)."""

        def run(txn: Txn) -> tuple[dict[str, int], list[QueuedUrl]]:
            moved, mine = self.outbox._reroute_in(txn, owner_of, local)
            return moved, self._admit_in(txn, mine) if mine else []

        return self._env.write(run)

    def hold_replicas(self, items: Sequence[tuple[bytes, QueuedUrl]], released: Sequence[bytes],
                      states: Sequence[HostState] = (), revisits: Sequence[RevisitRecord] = (), *,
                      fold: bool = False) -> None:
        """A peer's `QueueReplica`, journaled in one transaction (`Replicas.hold`); the released keys are marked
        seen when the journal is folded (the peer is done with those URLs: if it dies, its heir must not queue
        them again when they are linked), which promotion does first. `revisits`: the released pages' revisit
        schedules, held for the heir."""
        self.replicas.hold(items, released, states, revisits, fold=fold)

    def promote(self, inherited: Callable[[int], bool]) -> tuple[list[QueuedUrl], list[HostState]]:
        """This node inherits arcs from a dead owner (`inherited(position)` says which positions): the replicas
        held there are queued and marked seen, merged host states stored, and the replicas forgotten, in one
        transaction, with the revisit schedules held there: each is queued exactly when its page's URL was
        promoted now, else it waits on the time index (a revisit neither lost nor queued twice), and a record
        here already keeps the later due time. Returns the URLs queued and the dead owner's host states for
        those hosts, merged with any here (the later `next_allowed` and the longer Crawl-delay win)."""
        held, states = self.replicas.where(inherited)
        items = [item for _key, item in held]
        schedules = self.replicas.revisits_where(inherited)

        def run(txn: Txn) -> list[HostState]:
            # Queued even if seen here: a page whose seen key arrived but whose replica was not released yet was
            # fetched, but the links it routed to other owners were not acknowledged when its owner died; only
            # fetching it again brings them back.
            self.dedup._add_new_in(txn, [key for key, _item in held])
            self.frontier._push_in(txn, items)
            merged = self.frontier._merge_states_in(txn, states)
            if schedules:
                revisits = self.revisits
                queued_here = {(item.host, item.url) for item in items}
                # a page whose revisit is queued here already (its schedule came by an earlier hand-off) is
                # queued exactly when its URL is still queued or in flight here
                ask = [(r.host, r.url) for r in schedules if (r.host, r.url) not in queued_here
                       and (mine := revisits._get_in(txn, r.key())) is not None and mine.queued]
                if ask:
                    queued_here |= self.frontier._holding_in(txn, ask)
                revisits._put_arc_in(txn, schedules, {r.key() for r in schedules if (r.host, r.url) in queued_here})
            self.replicas._forget_in(txn, [key for key, _item in held], [state.host for state in states], schedules)
            return merged

        merged = self._env.write(run)
        if schedules:
            # pages fetched (by the dead owner) on a schedule here now: recorded as fetched here, so the seen-key
            # replicas' scan after this ring change sends their marks, and with them their schedules, to this
            # node's backups (a second death, once that is done, does not lose them)
            self.mark_fetched(queued_url_keys([queued(r) for r in schedules]))
            self.replicas.revisits_promoted += len(schedules)
        return items, merged

    def queue_due(self, now: float, limit: int, may: Callable[[str], bool]) -> list[QueuedUrl]:
        """Queue the pages whose revisit is due at `now` (wall clock) on hosts that `may` be fetched here, at
        most `limit`, in one transaction with taking them off the time index; return what was queued."""

        def run(txn: Txn) -> list[QueuedUrl]:
            items = [queued(record) for record in self.revisits._take_due_in(txn, now, limit, may)]
            self.frontier._push_in(txn, items)
            return items

        return self._env.write(run)

    def finish_revisit(self, item: QueuedUrl, record: RevisitRecord | None,
                       links: Sequence[QueuedUrl] = (), routed: Sequence[tuple[str, QueuedUrl]] = (), *,
                       state: HostState | None = None, items: Sequence[dict[str, Any]] = (),
                       logged: Sequence[Any] | None = None) -> list[QueuedUrl]:
        """`finish` for a page on the revisit schedule: its next visit (`record`, or off the schedule when None)
        is written in the same transaction that clears it from in-flight."""

        def run(txn: Txn) -> list[QueuedUrl]:
            new = self._admit_in(txn, links)
            self.outbox._put_in(txn, routed)
            self.frontier._done_in(txn, item)
            if record is not None:
                self.revisits._put_in(txn, record)
            if state is not None:
                self.frontier._put_state_in(txn, state)
            if items:
                self.items._put_in(txn, items)
            if logged is not None:
                self.crawl_log._put_in(txn, (logged,))
            return new

        return self._env.write(run)

    def drop_arcs(self, arcs: Sequence[tuple[int, int]], keep: frozenset[bytes] | set[bytes] = frozenset()) -> int:
        """A completed hand-off: delete what is queued in `arcs`, their hosts' states, their revisit schedules and
        their seen keys except those in `keep` (the keys of fetched pages that were sent, which stay), in ONE
        transaction; return the URLs dropped. The caller bounds how many arcs it drops at once."""
        ranges = [r for start, end in arcs for r in arc_ranges(start, end)]

        def run(txn: Txn) -> int:
            dropped = self.frontier._drop_arc_in(txn, ranges)
            self.revisits._drop_in(txn, ranges)
            self.dedup._delete_in(txn, ranges, keep)
            return dropped

        return self._env.write(run) if ranges else 0

    # -- pages fetched here (the replicas' record) --

    def mark_fetched(self, keys: Sequence[bytes]) -> None:
        """Record the seen keys of pages this node fetched, in one transaction: journaled, and folded into the
        record once FETCHED_FOLD keys wait (every read of the record folds first). Keys are dedup keys (16
        bytes); any other is not recorded."""
        keys = [key for key in keys if len(key) == _KEY_SIZE]
        if not keys:
            return
        journal, seq = self._env.db(FETCHED_JOURNAL_DB), self._fetched_next.to_bytes(8, "big")
        fold = self.fetched_journaled + len(keys) >= FETCHED_FOLD

        def run(txn: Txn) -> None:
            txn.put(seq, b"".join(keys), db=journal, append=True)
            if fold:
                self._fold_fetched_in(txn)

        self._env.write(run)
        self._fetched_next += 1
        self.fetched_journaled = 0 if fold else self.fetched_journaled + len(keys)

    def _fold_fetched(self) -> None:
        if self.fetched_journaled:
            self._env.write(self._fold_fetched_in)
            self.fetched_journaled = 0

    def _fold_fetched_in(self, txn: Txn) -> None:
        journal = self._env.db(FETCHED_JOURNAL_DB)
        keys = sorted({raw[i:i + _KEY_SIZE] for _seq, raw in txn.cursor(journal)
                       for i in range(0, len(raw), _KEY_SIZE)})
        put_keys(txn, self._env.db(FETCHED_DB), keys)
        txn.drop(journal, delete=False)

    def fetched_keys(self) -> Iterator[bytes]:
        """Every recorded key, in ring order, read in short transactions (see `LmdbEnv.scan`)."""
        self._fold_fetched()
        for key, _value in self._env.scan(FETCHED_DB, _ALL):
            yield key

    def forget_fetched(self, keys: Iterable[bytes]) -> int:
        """Drop recorded keys (their arcs moved to other nodes); return how many were there."""
        keys = list(keys)
        if not keys:
            return 0
        self._fold_fetched()
        db = self._env.db(FETCHED_DB)
        return self._env.write(lambda txn: sum(1 for key in keys if txn.delete(key, db=db)))

    def fetched_count(self) -> int:
        self._fold_fetched()
        return self._env.entries(FETCHED_DB)

    def release_resident(self) -> int:
        """Let the store's mapped pages go from this process's resident memory (`LmdbEnv.release_resident`)."""
        return self._env.release_resident()

    def sync(self) -> None:
        """Force every committed transaction to disk (fsync) and count it in `syncs`."""
        self._env.sync()
        self.syncs += 1

    def disk_bytes(self) -> int:
        return self._env.disk_bytes()

    def seen_bytes(self) -> int:
        """Bytes of the data file's pages that hold seen-URL keys (both tables)."""
        return self._env.db_bytes(DEDUP_DBS)

    def frontier_bytes(self) -> int:
        """Bytes of the data file's pages that hold the frontier (queues, in-flight, host table and states)."""
        return self._env.db_bytes(FRONTIER_DBS)

    def close(self) -> None:
        self.crawl_log.close()
        if not self._env.closed:
            self.dedup.save_filter()
        self._env.close()


class MemoryNodeStore(Closing):
    """The same API in memory, for unit tests."""

    def __init__(self) -> None:
        self.dedup = MemoryDedupStore()
        self.frontier = MemoryFrontierStore()
        self.items: list[dict[str, Any]] = []  # nothing durable: a test's store
        self.digests = MemoryPayloadDigests()
        self.logged: list[Sequence[Any]] = []  # crawl-log records, as `NodeStore.crawl_log` spools them
        self.syncs = 0

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, **_options: object) -> MemoryNodeStore:
        return cls()


    def admit(self, items: Sequence[QueuedUrl]) -> list[QueuedUrl]:
        fresh = self.dedup.add_new(queued_url_keys(items))
        new = [item for item, is_new in zip(items, fresh) if is_new]
        self.frontier.push(new)
        return new

    def finish(
        self, item: QueuedUrl | None, links: Sequence[QueuedUrl], routed: Sequence[tuple[str, QueuedUrl]] = (),
        *, state: HostState | None = None, items: Sequence[dict[str, Any]] = (),
        logged: Sequence[Any] | None = None,
    ) -> list[QueuedUrl]:
        if routed:
            raise ValueError("MemoryNodeStore keeps no outbox: a cluster node needs NodeStore")
        self.items += items
        if logged is not None:
            self.logged.append(logged)
        new = self.admit(links)
        if item is not None:
            self.frontier.done(item)
        if state is not None:
            self.frontier.put_state(state)
        return new

    def release_resident(self) -> int:
        """Nothing mapped."""
        return 0

    def sync(self) -> None:
        """Nothing to force; counted as `NodeStore.sync` is."""
        self.syncs += 1

    def close(self) -> None:
        """Nothing to release."""
