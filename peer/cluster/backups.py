"""Queued-URL replicas (`--replicas R`): every URL queued here is also held durably by the R ring backups of its
host's position, so a node that dies for good takes no URL with it.

Why: the owner's frontier is the only place a queued URL lives once its sender's batch is acknowledged. When the
owner dies and never comes back, every URL only it had queued is lost (44 of 3,911 pages in the four-node
test before this). The backups are `Ring.holders_at(position, R, zones)`: the first owns the position once the
owner is gone, so a death hands each arc exactly to a node that already holds its queue (R = 2: the second owns
it once the owner and the first are gone, which covers two deaths at once). When all R share the owner's failure
zone (nodes on one machine), the first node after them in another zone holds a copy too: it owns the position
once that whole machine is gone (ring/_zones.py).

The owner's side (`QueueReplicas`):
- every URL queued here (a page's links, seeds, a peer's batch, a hand-off chunk) is staged for its backups, and
  so is the release of every URL this node is done with (fetched, refused, given up), with the politeness
  state of its host; each backup gets one `QueueReplica` at a time (a FIFO per backup, window 1, so a release
  never overtakes the add it cancels), re-sent until the backup's `ReplicaAck`;
- a peer's batch is acknowledged only once the owner has it durably *and* every backup has acknowledged the
  replica carrying it (`replicate` returns a `Ticket` the dispatcher waits on), or the backup left the ring
  (declared dead, or left). While a backup is slow or unreachable the sender keeps the batch in its outbox and
  re-sends it (the owner does not ack a re-send whose replicas are still on their way): the URL then lives on
  the sender and the owner, two nodes, until SWIM decides whether the backup is alive;
- after every ring change (and at start) the queue is scanned, in short read transactions and with
  back-pressure, and each queued or in-flight URL owned here goes to each backup it did not have under the ring
  of the previous scan (re-homing); `restore_seconds` is the time from the ring change until every replica
  staged by that scan is acknowledged: the invariant "every queued URL is on R + 1 live nodes" holds again.

The backup's side: a `QueueReplica` is journaled in one transaction (one put at the end of a table) and
acknowledged once committed; the journal is folded into the replica and seen tables as one (messages in the order
they came; in each, releases, then URLs, then host states: the later ready time wins) every FOLD_ENTRIES entries or
FOLD_AGE seconds, at a ring change, and before anything reads the replicas (storage/_replicas.py); while views change
(a message sent under another view than ours, or within FOLD_AGE of our last ring change) each message is folded
at once, as every message was applied before the journal: the arc it names may be moving to this node, whose
crawler then reads those seen keys. Replicas of positions where this node is no longer a backup are passed
on to their owners (through the outbox, `Dispatcher.pass_on`: the owner's dedup store keeps only what it does not
know) and dropped once the ring has been stable for `GC_DELAY` (1 s), and never under a view older than the newest
one a replica held here was sent under: until the owner's re-homing reaches the new backup (a lost frame waits
RESEND_AFTER) or its hand-off of a moved arc is done, this copy may be the only second one.

Promotion (`Cluster._view_changed`): when a member is declared dead, each arc this node inherits from it is
promoted from the replicas into the frontier (`NodeStore.promote`: dedup, frontier and the dead owner's host
states, merged with ours, in one transaction), then the crawler takes the hosts over with those timers.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from protocol import HostState as WireHostState
from protocol import Limits, Message, QueueReplica, ReplicaAck, UrlEntry
from ring import Zones, host_position
from storage import HostState, NodeStore, QueuedUrl, queued_url_keys

from peer.crawl.urls import host_of_normalized, normalize

__all__ = ["GC_DELAY", "QueueReplicas", "Ticket"]

log = logging.getLogger(__name__)

#: A backup's next message leaves at most this long after the first entry was staged for it, and no sooner
#: unless FULL entries wait: one message per backup per interval carries the pages of the last 100 ms (about
#: 60 entries on 2 cores) instead of one message per page (each costs its frame, HMAC, compression, decoding,
#: the backup's transaction and the ack: docs/benchmarks.md, cluster overhead).
INTERVAL = 0.1
#: Staged entries that make a message due at once (a hand-off's URLs, a re-homing scan, a backlog after a
#: slow ack): bulk work goes as fast as the acks come back.
FULL = 500
# A backup acknowledges a replica once it is committed (in the OS page cache: it survives the process's death);
# the node's sync service (peer/crawl/syncs.py) forces it to disk with the rest of the store, once per
# `sync_interval`. An fsync before each ack would guard only against the backup's machine crashing together
# with the owner dying for good, two failures, which R = 1 does not promise to survive; the owner's own copy is
# synced before it acknowledges anything (docs/cluster.md).

#: An unacknowledged replica is sent again after this long.
RESEND_AFTER = 2.0
#: Entries per message, and URL bytes per message: far inside the 1 MiB frame limit.
MAX_ENTRIES = 2000
MAX_URL_BYTES = 512 * 1024
#: Entries waiting for one backup, at most (about 300 bytes each); past it the waiting adds are dropped and a
#: full re-homing scan rebuilds them from the frontier on disk. A backup gets there only if it stays
#: unreachable long after SWIM would have declared it dead.
MAX_STAGED = 200_000
#: A backup drops replicas of positions it no longer backs once the ring has been stable this long: long enough
#: for a view to settle, short enough that a replica whose release went to the backup of a ring in between is
#: not still here when rings change again (it would be promoted at a death and repeat a page).
GC_DELAY = 1.0
#: Re-homing reads the queue in chunks of this many URLs, yielding to trio between chunks.
SCAN_CHUNK = 2048
#: A backup journals each message (one put at the end of a table) and folds the journal into its replica and seen
#: tables once this many entries wait, or the oldest has waited FOLD_AGE seconds (storage/_replicas.py): applied
#: one message at a time, each entry copied a leaf page of its own and each message paid a commit; a fold writes
#: the keys in order, many to a page, in one commit (and an add released within it is never written). A fold of
#: 8,192 entries takes about 10-20 ms.
FOLD_ENTRIES = 8192
FOLD_AGE = 5.0
#: A host name is at most 253 bytes (RFC 1035).
MAX_HOST = 253
#: Hosts whose backups are remembered under the current ring (about 150 bytes each); past it the memory starts
#: over. Every queued URL and every release asks for its host's backups, and a crawl names the same hosts over
#: and over: a hash, a bisection and a walk of the ring each time cost more than the rest of staging.
BACKUPS_CACHE = 200_000


class Ticket:
    """What a received batch waits for before it is acknowledged: for each backup, its state here and the count
    of entries staged for it up to this batch's URLs. Done once each backup has acknowledged that far (or left
    the ring). A backup that left the ring and came back has a new state whose counts start again from 0: the
    old state is how a ticket tells it left (its entries were dropped, and counted as acknowledged, when it did)."""

    __slots__ = ("targets", "callbacks")

    def __init__(self, targets: dict[str, tuple[_Backup, int]]) -> None:
        self.targets = targets
        self.callbacks: list[Callable[[], None]] = []


def _merged(a: Ticket | None, b: Ticket | None) -> Ticket | None:
    """A ticket done once both are."""
    if a is None or b is None:
        return a or b
    targets = dict(a.targets)
    for backup, (state, count) in b.targets.items():
        mine = targets.get(backup)
        targets[backup] = (state, max(count, mine[1])) if mine is not None and mine[0] is state else (state, count)
    return Ticket(targets)


@dataclass(slots=True)
class _Backup:
    # adds (key, URL), releases (key, URL, True) and keys of fetched pages (seen marks: a release with no URL of
    # this node's queue); an add carries its key, computed once for all its backups
    staged: deque[tuple[bytes, QueuedUrl] | tuple[bytes, QueuedUrl, bool] | bytes] = field(default_factory=deque)
    staged_total: int = 0  # entries ever staged for this backup
    acked_total: int = 0  # entries acknowledged (or dropped): FIFO, so everything up to here arrived
    seq: int = 0
    inflight: QueueReplica | None = None
    inflight_count: int = 0
    inflight_released: list[str] = field(default_factory=list)  # the URLs the message in flight releases
    sent_at: float = 0.0
    connection: int = 0
    staged_at: float | None = None  # when the oldest entry not yet sent was staged (None: nothing staged)


class QueueReplicas:
    """Both sides of the queued-URL replicas for one node (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        store: NodeStore,
        links: Any,
        *,
        ring_of: Callable[[], tuple[int, Any]],
        copies: int = 1,
        wall_clock: Callable[[], float] = time.time,
        interval: float = INTERVAL,
        resend_after: float = RESEND_AFTER,
        max_staged: int = MAX_STAGED,
        limits: Limits | None = None,
        zones_of: Callable[[], Zones] = Zones,
        seen_copies: int = 0,
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.links = links
        self.ring_of = ring_of  # () -> (view epoch, the current Ring or None)
        self.zones_of = zones_of  # () -> the failure zones of the ring's nodes (a copy goes outside the owner's)
        self.copies = copies
        # a release goes to the holders of this many backups (at least `copies`): the seen-key replicas' (their
        # copies), so the mark that a page was fetched reaches each of them acknowledged, not best effort
        self.release_copies = max(copies, seen_copies) if copies else 0
        self.wall_clock = wall_clock
        self.interval = interval
        self.resend_after = resend_after
        self.max_staged = max_staged
        self.limits = limits or Limits()
        self._backups: dict[str, _Backup] = {}
        self._tickets: list[Ticket] = []  # those with callbacks waiting (`then`)
        # called with each URL whose release is staged: the cluster sends its seen key to the seen-key replicas
        # only then, so no backup holds a page as seen while the links it queued may be lost with this node; with
        # the backups the release went to (they mark the key seen with it)
        self.on_released: Callable[[QueuedUrl, bytes, frozenset[str]], None] | None = None
        # called with the keys a peer's replica marks seen here (its releases and fetched pages' marks): the
        # hand-off keeps them through the drop of arcs it is handing over (`Handoff.marked_seen`)
        self.on_marked: Callable[[Sequence[bytes]], None] | None = None
        # given the URLs of replicas this node no longer backs, before they are dropped (`collect`): the cluster
        # sends each to its owner (`Dispatcher.pass_on`)
        self.pass_on: Callable[[list[QueuedUrl]], None] | None = None
        # given (the peer, the view epoch its message was sent under, the URLs) of each replica message held
        # here: URLs their owner has durably queued, which the crawler need not route to it again
        # (`Cluster._held_from`)
        self.on_held: Callable[[str, int, list[QueuedUrl]], None] | None = None
        # releases waiting for their page's links: ({owner: outbox seq at the commit}, the links' ticket, URL)
        self._releases: list[tuple[dict[str, int], Ticket | None, QueuedUrl]] = []
        # Whether a held release may have become ready since `_stage_releases` last looked: a release waits for
        # outbox acks and replica acks, so the held list is scanned again only after one of those (or the timer),
        # not at every page (it holds the pages of the last few hundred ms).
        self._releases_due = False
        self._outbox_removals = -1  # `store.outbox.removals` when the held releases were last scanned
        self._cache_ring: Any = None  # the ring `_cache` was filled under
        # host -> (its backups, those of its releases), not this node, under `_cache_ring`
        self._cache: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._wake = trio.Event()
        self._synced: Any = None  # the ring of the last complete re-homing scan
        self._changed_at: float | None = None  # when the ring last changed (for restore_seconds)
        self._restore: dict[str, tuple[_Backup, int]] | None = None  # what the last scan staged, per backup
        self._gc_ring: Any = None  # the ring the last clean-up ran under
        self._held_epoch = 0  # the newest view epoch a replica held here was sent under
        self._journaled_at: float | None = None  # when the oldest message not yet folded was held (None: none)
        self._ring_at = -math.inf  # when this node last adopted a ring
        self.restore_seconds: list[float] = []  # ring change -> R + 1 copies again, one per change
        self.urls_sent = 0
        self.releases_sent = 0
        self.messages_sent = 0
        self.messages_resent = 0
        self.urls_rehomed = 0
        self.urls_held = 0
        self.releases_held = 0
        self.urls_promoted = 0
        self.urls_passed_on = 0  # replicas of positions no longer backed here, sent to their owners (`collect`)
        self.dropped = 0  # entries dropped for a backup that left the ring, or past max_staged
        self.refused = 0  # malformed entries from a peer

    @property
    def enabled(self) -> bool:
        return self.copies > 0

    # -- the owner's side: staging -------------------------------------------------------------------------

    def _backup(self, peer: str) -> _Backup:
        state = self._backups.get(peer)
        if state is None:
            state = self._backups[peer] = _Backup()
        return state

    def _stage(self, peer: str, entry: tuple[bytes, QueuedUrl] | tuple[bytes, QueuedUrl, bool] | bytes) -> None:
        state = self._backup(peer)
        if not state.staged:
            state.staged_at = trio.current_time()
        state.staged.append(entry)
        state.staged_total += 1
        if len(state.staged) > self.max_staged:
            self._drop_staged(peer, state, rescan=True)

    def _backups_of(self, ring: Any, host: str) -> tuple[str, ...]:
        """The backups that hold `host`'s queued URLs under `ring` (not this node)."""
        return self._holders_of(ring, host)[0]

    def _release_backups_of(self, ring: Any, host: str) -> tuple[str, ...]:
        """The backups a release of one of `host`'s URLs goes to under `ring`: its backups and the seen-key
        replicas' (not this node)."""
        return self._holders_of(ring, host)[1]

    def _holders_of(self, ring: Any, host: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if ring is self._cache_ring:
            found = self._cache.get(host)
            if found is not None:
                return found
        position, zones = host_position(host), self.zones_of()
        backups = tuple(b for b in ring.holders_at(position, self.copies, zones) if b != self.node_id)
        releases = backups
        if self.release_copies > self.copies:
            releases = tuple(b for b in ring.holders_at(position, self.release_copies, zones) if b != self.node_id)
            releases = backups + tuple(b for b in releases if b not in backups)
        found = (backups, releases)
        if ring is self.ring_of()[1]:  # remembered for the current ring only: a new ring starts a new memory
            if ring is not self._cache_ring or len(self._cache) >= BACKUPS_CACHE:
                self._cache_ring, self._cache = ring, {}
            self._cache[host] = found
        return found

    def queued(self, items: Sequence[QueuedUrl]) -> None:
        """URLs were queued here: their backups get them."""
        self.replicate(items)

    def replicate(self, items: Sequence[QueuedUrl]) -> Ticket | None:
        """Stage `items` for their backups; the `Ticket` is done once every backup has them (None: no backup
        to wait for)."""
        if not self.copies or not items:
            return None
        _epoch, ring = self.ring_of()
        if ring is None:
            return None
        touched: set[str] = set()
        for key, item in zip(queued_url_keys(items), items):
            for backup in self._backups_of(ring, item.host):
                self._stage(backup, (key, item))
                touched.add(backup)
        if not touched:
            return None
        self._wake_for(touched)
        return Ticket({b: (self._backups[b], self._backups[b].staged_total) for b in touched})

    def released(self, item: QueuedUrl, routed_to: Iterable[str] = (), links: Ticket | None = None) -> None:
        """This node is done with `item` (fetched, refused or given up): its replicas go, once the links its page
        found are safe elsewhere: those it routed to other owners (`routed_to`) acknowledged by them, and those
        it queued here (`links`, the ticket of their replicas) acknowledged by their backups, which may be other
        nodes than the page's own backups. Until then the page's replica is what brings them back if this node
        dies: the heir fetches the page again."""
        if not self.copies:
            return
        owners = set(routed_to)
        if not owners and (links is None or self._done(links)):
            self._release(item)
            return
        # held until an ack (outbox or replica) or the timer makes `_stage_releases` look again: the page's own
        # links were committed just now, so none of those can have been acknowledged yet
        last = self.store.outbox.last_seq() if owners else 0
        self._releases.append(({owner: last for owner in owners}, links, item))
        if len(self._releases) > self.max_staged:  # owners unreachable for long: release the oldest anyway
            self._release(self._releases.pop(0)[2])

    def rerouted(self, owners: Iterable[str], ticket: Ticket | None) -> None:
        """A view change re-keyed outbox entries to `owners` (new sequence numbers) and admitted some here (their
        replicas under `ticket`). The links a held release waits for may be among them: counted by sequence
        number at the page's commit, they would pass for acknowledged once they left their old owner's queue,
        and the page was released while its links lived only in this node's outbox (the replica simulation,
        seed 27: two of them lost when the node died a second later). So every release that waits for routed
        links now also waits for each of `owners` up to the outbox's last entry, and for `ticket`."""
        owners = tuple(owners)
        if not self._releases or not (owners or ticket is not None):
            return
        last = self.store.outbox.last_seq()
        for index, (marks, links, item) in enumerate(self._releases):
            if marks:  # (a release that routed nothing waits for no outbox entry)
                for owner in owners:
                    marks[owner] = max(marks.get(owner, 0), last)
                self._releases[index] = (marks, _merged(links, ticket), item)

    def held_keys(self) -> set[bytes]:
        """Keys of the pages whose release is held for their links (`released`): a hand-off sends them as seen
        only once released (`Handoff._fill`)."""
        return set(queued_url_keys([item for _marks, _links, item in self._releases])) if self._releases else set()

    def _stage_releases(self, *, force: bool = False) -> None:
        """Stage the held releases whose page's links are all safe elsewhere. Without `force`, only when an ack
        came since the last look (an outbox entry removed, a replica acknowledged, a backup gone)."""
        if not self._releases:
            return
        removals = self.store.outbox.removals
        if not (force or self._releases_due or removals != self._outbox_removals):
            return
        self._releases_due, self._outbox_removals = False, removals
        oldest: dict[str, int | None] = {}
        outbox = self.store.outbox
        still = []
        for marks, links, item in self._releases:
            if links is not None and not self._done(links):
                still.append((marks, links, item))
                continue
            for owner, mark in marks.items():
                if owner not in oldest:
                    oldest[owner] = outbox.oldest_seq(owner)
                first = oldest[owner]
                if first is not None and first <= mark:
                    still.append((marks, links, item))
                    break
            else:
                self._release(item)
        self._releases = still

    def _release(self, item: QueuedUrl) -> None:
        key = queued_url_keys((item,))[0]
        _epoch, ring = self.ring_of()
        backups: set[str] = set()
        if ring is not None:
            backups.update(self._release_backups_of(ring, item.host))
            if self._synced is not None and self._synced is not ring:
                # the arc may have moved since the URL was replicated: the backups it went to are released too
                backups.update(b for b in self._backups_of(self._synced, item.host) if b in ring.weights)
            for backup in sorted(backups):
                self._stage(backup, (key, item, True))
            self._wake_for(backups)
        if self.on_released is not None:
            self.on_released(item, key, frozenset(backups))

    def mark_seen(self, backup: str, keys: Sequence[bytes]) -> bool:
        """`backup` is to hold `keys` (of pages fetched here) as seen: sent like a release, in its FIFO,
        acknowledged and re-sent, so that the mark survives a lost frame (the seen-key replicas' own messages are
        best effort). A backup no longer in the ring gets nothing. False if the backup's FIFO has no room for
        them (a restart's re-sending of every key recorded): the caller sends them best effort instead."""
        _epoch, ring = self.ring_of()
        if not keys or ring is None or backup == self.node_id or backup not in ring.weights:
            return True
        if len(self._backup(backup).staged) + len(keys) > self.max_staged // 2:
            return False
        for key in keys:
            self._stage(backup, key)
        self._wake_for((backup,))
        return True

    def _wake_for(self, backups: Iterable[str]) -> None:
        """Wake the send loop if one of `backups` can take a message now and has FULL entries waiting (window 1:
        one with a message in flight gets the staged entries with its next message, after the ack; fewer wait
        for the loop's next tick, at most INTERVAL away)."""
        states = self._backups
        for b in backups:
            state = states.get(b)
            if state is not None and state.inflight is None and len(state.staged) >= FULL:
                self._wake.set()
                return

    def _due(self, state: _Backup, now: float) -> bool:
        """Whether `state`'s staged entries should go now: FULL of them, or the oldest has waited an interval."""
        return bool(state.staged) and (len(state.staged) >= FULL or state.staged_at is None
                                       or now - state.staged_at >= self.interval - 1e-9)

    def then(self, ticket: Ticket, callback: Callable[[], None]) -> None:
        """Call `callback` once `ticket` is done (now, if it is)."""
        if self._done(ticket):
            callback()
            return
        if not ticket.callbacks:
            # looked at again at each ack; a ticket nobody waits on by callback (a page's links, asked with
            # `done` when its release is looked at) is not, so an ack does not go over a page's worth of them
            self._tickets.append(ticket)
        ticket.callbacks.append(callback)

    def done(self, ticket: Ticket) -> bool:
        return self._done(ticket)

    def _done(self, ticket: Ticket) -> bool:
        return self._reached(ticket.targets)

    def _reached(self, targets: dict[str, tuple[_Backup, int]]) -> bool:
        """Each backup has acknowledged its count, or left the ring since (its state here is gone or new)."""
        backups = self._backups
        for b, (state, n) in targets.items():
            if state.acked_total < n and backups.get(b) is state:
                return False
        return True

    def _check_tickets(self) -> None:
        self._releases_due = True  # a held release may wait for a ticket that is done now
        still = []
        for ticket in self._tickets:
            if self._done(ticket):
                for callback in ticket.callbacks:
                    callback()
                ticket.callbacks.clear()
            else:
                still.append(ticket)
        self._tickets = still
        if self._restore is not None and self._reached(self._restore):
            self._restored()

    def _restored(self) -> None:
        self._restore = None
        if self._changed_at is not None:
            self.restore_seconds.append(trio.current_time() - self._changed_at)
            del self.restore_seconds[:-100]
            self._changed_at = None

    def _drop_staged(self, peer: str, state: _Backup, *, rescan: bool) -> None:
        """Give up what waits for `peer` (it left the ring, or too much waits): counted as acknowledged so no
        batch waits for it; with `rescan`, a full re-homing scan sends the adds again."""
        dropped = len(state.staged) + state.inflight_count
        self.dropped += dropped
        self._releases_due = True
        state.staged.clear()
        state.inflight, state.inflight_count, state.inflight_released = None, 0, []
        state.acked_total = state.staged_total
        if rescan:
            self._synced = None
            log.warning("replicas waiting for a backup dropped; a full scan sends them again",
                        extra={"peer": peer, "entries": dropped})

    def ring_changed(self, ring: Any) -> None:
        """The node adopted `ring`: backups that are no longer in it (dead, left) are waited for no more; a
        re-homing scan follows."""
        for peer, state in list(self._backups.items()):
            if peer not in ring.weights:
                self._drop_staged(peer, state, rescan=False)
                del self._backups[peer]
        for ticket in self._tickets:
            ticket.targets = {b: t for b, t in ticket.targets.items() if self._backups.get(b) is t[0]}
        # the replicas held here reach their tables before ownership moves (promotion and the clean-up fold too)
        self.store.replicas.fold()
        self._journaled_at = None
        self._ring_at = trio.current_time()
        self._changed_at = trio.current_time()
        self._check_tickets()
        self._wake.set()

    # -- the owner's side: sending -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.copies:
            await self._send_loop()

    async def _send_loop(self) -> None:
        stable_since = trio.current_time()
        seen_ring = None
        next_tick = trio.current_time() + self.interval
        while True:
            with trio.move_on_at(next_tick):
                await self._wake.wait()
            self._wake = trio.Event()
            now = trio.current_time()
            tick = now >= next_tick
            if tick:  # every interval: whatever is staged goes (one message per backup), held releases looked at
                next_tick = now + self.interval
                self._releases_due = True
            self.pump(now, due_only=not tick)
            _epoch, ring = self.ring_of()
            if ring is None:
                continue
            if ring is not seen_ring:
                seen_ring, stable_since = ring, trio.current_time()
            if ring is not self._synced:
                await self.rehome(ring)
            elif (ring is not self._gc_ring and trio.current_time() - stable_since >= GC_DELAY
                  and _epoch >= self._held_epoch):
                # never under a view older than one a replica held here was sent under: its sender's ring may
                # make this node a backup where ours does not yet (a joiner, before its first ring, dropped what
                # the whole cluster had just re-homed to it, and a machine's death then lost those URLs)
                self.collect(ring)

    def _connection(self, peer: str) -> int:
        link = self.links.get(peer) if hasattr(self.links, "get") else None
        connects = int(getattr(link, "connects", 0))
        return connects if getattr(link, "connected", False) else connects + 1

    def pump(self, now: float, *, due_only: bool = False) -> None:
        """Send each backup its next message, or re-send the one it has not acknowledged. With `due_only` (the
        send loop), a backup's staged entries go only once due (`_due`): FULL of them or an interval old."""
        self._stage_releases()
        _epoch, ring = self.ring_of()
        epoch = _epoch or 0
        for peer, state in self._backups.items():
            if state.inflight is not None:
                if now - state.sent_at >= self.resend_after or self._connection(peer) > state.connection:
                    if self.links.send_nowait(peer, state.inflight):
                        self.messages_resent += 1
                        state.sent_at = now
                        state.connection = self._connection(peer)
                continue
            if not state.staged or (due_only and not self._due(state, now)):
                continue
            message, count, state.inflight_released = self._message(state, epoch)
            # what a capped message left behind is a backlog: due at once, after the ack
            state.staged_at = None if not state.staged else -math.inf
            state.seq += 1
            message = QueueReplica(seq=state.seq, epoch=message.epoch, urls=message.urls,
                                   released=message.released, hosts=message.hosts)
            state.inflight, state.inflight_count = message, count
            state.sent_at, state.connection = now, self._connection(peer)
            if self.links.send_nowait(peer, message):
                self.messages_sent += 1
                self.urls_sent += len(message.urls)
                self.releases_sent += len(message.released)
            else:
                state.sent_at = now - self.resend_after + self.interval  # the queue is full: again soon

    def _message(self, state: _Backup, epoch: int) -> tuple[QueueReplica, int, list[str]]:
        """The next message from the front of `state.staged`: the last word on each key wins (an add followed
        by its release in the same message cancels out), so the receiver may apply releases before adds."""
        final: dict[bytes, QueuedUrl | None] = {}
        hosts: dict[str, None] = {}
        released_urls: list[str] = []
        count = size = 0
        staged = state.staged
        max_keys = min(MAX_ENTRIES, self.limits.max_keys_per_chunk, self.limits.max_urls_per_batch)
        while staged and count < max_keys and size < MAX_URL_BYTES:
            entry = staged.popleft()
            count += 1
            if entry.__class__ is bytes:  # a fetched page's seen mark
                final[entry] = None  # type: ignore[index]
            elif len(entry) == 2:
                key, item = entry  # type: ignore[misc]
                final[key] = item
                size += len(item.url) + len(item.found_on or "") + 16
            else:
                key, done, _release = entry  # type: ignore[misc]
                final[key] = None
                hosts[done.host] = None
                released_urls.append(done.url)
        urls = tuple(UrlEntry(url=i.url, depth=i.depth, found_on=i.found_on, hops=i.hops)
                     for i in final.values() if i is not None)
        released = tuple(key for key, i in final.items() if i is None)
        wall = self.wall_clock()
        states = []
        for host, st in self.store.frontier.get_states(hosts).items():  # one read transaction for them all
            if len(host.encode()) <= MAX_HOST:
                states.append(WireHostState(host=host, crawl_delay=max(0.0, st.crawl_delay),
                                            ready_in=max(0.0, st.next_allowed - wall), failures=st.failures))
        message = QueueReplica(seq=0, epoch=epoch, urls=urls, released=released, hosts=tuple(states))
        return message, count, released_urls

    def _acked(self, peer: str, ack: ReplicaAck) -> None:
        state = self._backups.get(peer)
        if state is None or state.inflight is None or state.inflight.seq != ack.seq:
            return  # a late or repeated ack
        state.acked_total += state.inflight_count
        state.inflight, state.inflight_count, state.inflight_released = None, 0, []
        self._check_tickets()
        if self._due(state, trio.current_time()):
            self._wake.set()  # a backlog, or entries that waited an interval behind this message: at once

    # -- re-homing ------------------------------------------------------------------------------------------

    async def rehome(self, ring: Any) -> int:
        """Send each queued or in-flight URL owned here, and each page whose release is held, to each backup it did
        not have under the ring of the previous scan (every backup after a start); returns how many entries were
        staged."""
        old = self._synced
        me, copies, zones = self.node_id, self.copies, self.zones_of()
        staged = 0

        def place(item: QueuedUrl) -> int:
            position = host_position(item.host)
            if ring.owner_at(position) != me:
                return 0  # handed off with its arc
            had: tuple[str, ...] = ()
            if old is not None and old.owner_at(position) == me:
                had = old.holders_at(position, copies, zones)
            to = [b for b in ring.holders_at(position, copies, zones) if b != me and b not in had]
            if to:
                entry = (queued_url_keys((item,))[0], item)  # the key once, for every backup
                for backup in to:
                    self._stage(backup, entry)
            return len(to)

        for n, item in enumerate(self.store.frontier.scan_queued(chunk=SCAN_CHUNK), start=1):
            staged += place(item)
            if n % SCAN_CHUNK == 0:  # the scan reads exactly SCAN_CHUNK URLs per transaction
                self.pump(trio.current_time())
                await trio.sleep(0)
                while any(len(s.staged) > self.max_staged // 2 for s in self._backups.values()):
                    await trio.sleep(self.interval)
                    self.pump(trio.current_time())
                if self.ring_of()[1] is not ring:
                    return staged  # the ring changed again: the next scan starts over from `old`
        for item in self.store.frontier.in_flight_items():
            staged += place(item)
        # Pages fetched whose release waits for their links: their replica is what brings the links back if this
        # node dies, so a new backup needs it too (the search found one lost: the backup that held it died, the
        # page's release waited for a link routed to that same dead node, and the heir had no copy to promote).
        for _marks, _links, item in self._releases:
            staged += place(item)
        self.urls_rehomed += staged
        self._synced = ring
        self._restore = {peer: (s, s.staged_total) for peer, s in self._backups.items()}
        self._wake.set()
        self._check_tickets()
        if staged:
            log.info("queued URLs re-homed to their backups", extra={"entries": staged})
        return staged

    def collect(self, ring: Any) -> int:
        """Pass on the replicas of positions this node no longer backs under `ring` (nor owns), then drop them.

        Each URL goes to its owner under the current view through the outbox (`pass_on`: acknowledged once
        durable there, re-routed if that owner dies), whose dedup store decides (DESIGN decision 4): a URL it has
        queued or fetched is dropped there, one it never had is queued. Until the owner has made its queue safe
        under the new ring (its re-homing acknowledged, its hand-off of a moved arc done), this node's copy may be
        the only second one, and the owner may die before that (a lost frame is re-sent only after
        RESEND_AFTER): dropped, the URL was lost with it. Passed on, it reaches the owner, or the owner's heir
        through the outbox's re-routing."""
        me, copies, zones = self.node_id, self.copies, self.zones_of()

        def unwanted(position: int) -> bool:
            return me not in ring.holders_at(position, max(1, copies), zones)

        dropped = self.store.replicas.drop_where(unwanted, passing=self.pass_on)
        if self.pass_on is not None:
            self.urls_passed_on += dropped
        self._gc_ring = ring
        if dropped:
            log.info("replicas of positions no longer backed here passed on to their owners and dropped",
                     extra={"urls": dropped})
        return dropped

    # -- the backup's side ----------------------------------------------------------------------------------

    def on_message(self, peer_id: str, message: Message) -> bool:
        """Hold a peer's `QueueReplica` (durably, then ack) or take a `ReplicaAck`; False for anything else."""
        if isinstance(message, ReplicaAck):
            self._acked(peer_id, message)
            return True
        if not isinstance(message, QueueReplica):
            return False
        items: list[QueuedUrl] = []
        for entry in message.urls:
            # held to what a link from the web is (normalized, an IDNA host of at most 253 bytes), as a peer's
            # batch is, before it reaches the store
            url = normalize(entry.url)
            host = host_of_normalized(url) if url is not None else ""
            if not host or len(host.encode()) > MAX_HOST or len(url) > self.limits.max_url_length:
                continue
            items.append(QueuedUrl(url=url, host=host, depth=entry.depth, hops=entry.hops, found_on=entry.found_on))
        released = [key for key in message.released if len(key) == 16]
        wall = self.wall_clock()
        states = [
            HostState(host=s.host, next_allowed=wall + s.ready_in, crawl_delay=s.crawl_delay, failures=s.failures)
            for s in message.hosts if s.host and len(s.host.encode()) <= MAX_HOST
        ]
        bad = (len(message.urls) - len(items)) + (len(message.released) - len(released))
        bad += len(message.hosts) - len(states)
        if bad:
            self.refused += bad
            log.warning("malformed replica entries from a peer dropped", extra={"peer": peer_id, "entries": bad})
        now = trio.current_time()
        if self._journaled_at is None or not self.store.replicas.journaled:  # (a read folds too)
            self._journaled_at = now
        waiting = self.store.replicas.journaled + len(items) + len(released) + len(states)
        fold = (waiting >= FOLD_ENTRIES or now - self._journaled_at >= FOLD_AGE
                or message.epoch != self.ring_of()[0] or now - self._ring_at < FOLD_AGE)  # views changing: at once
        self.store.hold_replicas(list(zip(queued_url_keys(items), items)), released, states, fold=fold)
        if fold:
            self._journaled_at = None
        self._held_epoch = max(self._held_epoch, message.epoch)
        if released and self.on_marked is not None:
            self.on_marked(released)
        self.urls_held += len(items)
        self.releases_held += len(released)
        if items and self.on_held is not None:
            self.on_held(peer_id, message.epoch, items)
        # committed: it survives this process's death (the note after FULL says why no fsync waits before the ack)
        self.links.send_nowait(peer_id, ReplicaAck(seq=message.seq))  # if lost, the owner re-sends: ack again
        return True

    # -- status ---------------------------------------------------------------------------------------------

    def unreleased(self) -> set[str]:
        """URLs this node is done with whose release has not reached every backup yet (held for their page's
        routed links, or on their way): what its heirs fetch again if it dies now."""
        urls = {item.url for _marks, _links, item in self._releases}
        for state in self._backups.values():
            for entry in state.staged:
                if isinstance(entry, tuple) and len(entry) == 3:
                    urls.add(entry[1].url)
            urls.update(state.inflight_released)
        return urls

    def restored(self) -> bool:
        """Whether every queued URL owned here is on its backups under the current ring: the re-homing scan of
        this ring has run and everything it staged has been acknowledged (or there is nothing to replicate)."""
        _epoch, ring = self.ring_of()
        return not self.copies or (ring is not None and ring is self._synced and self._restore is None)

    def outstanding(self) -> int:
        """Entries staged or sent and not yet acknowledged, over all backups."""
        return len(self._releases) + sum(len(s.staged) + s.inflight_count for s in self._backups.values())

    def status(self) -> dict[str, Any]:
        _epoch, ring = self.ring_of()
        return {
            "copies": self.copies, "synced": ring is not None and ring is self._synced,
            "restored": self.restored(), "unreleased": len(self.unreleased()),
            "outstanding": self.outstanding(), "held": self.store.replicas.folded(),
            "journaled": self.store.replicas.journaled, "folds": self.store.replicas.folds,
            "urls_sent": self.urls_sent, "releases_sent": self.releases_sent, "messages_sent": self.messages_sent,
            "messages_resent": self.messages_resent, "urls_rehomed": self.urls_rehomed,
            "urls_held": self.urls_held, "releases_held": self.releases_held,
            "urls_promoted": self.urls_promoted, "urls_passed_on": self.urls_passed_on, "dropped": self.dropped,
            "refused": self.refused,
            "restore_seconds": self.restore_seconds[-1] if self.restore_seconds else None,
        }
