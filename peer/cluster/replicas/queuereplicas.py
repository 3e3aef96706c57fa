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
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from protocol import Limits
from ring import Zones, host_position
from storage import NodeStore, QueuedUrl, queued_url_keys

from peer.cluster.replicas.queueconfig import (
    BACKUPS_CACHE, FOLD_AGE, FOLD_ENTRIES, FULL, GC_DELAY, INTERVAL, MAX_STAGED, RESEND_AFTER, Backup, QueueAlone, QueueDelegate,
    Ticket, merged,
)
from peer.cluster.replicas.queueholding import ReplicaHolding
from peer.cluster.replicas.queuesending import ReplicaSending

__all__ = ["FOLD_AGE", "FOLD_ENTRIES", "FULL", "GC_DELAY", "QueueAlone", "QueueDelegate", "QueueReplicas", "Ticket"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.backups")


class QueueReplicas(ReplicaSending, ReplicaHolding):
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
        delegate: QueueDelegate | None = None,
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
        self._backups: dict[str, Backup] = {}
        self._tickets: list[Ticket] = []  # those with callbacks waiting (`then`)
        # what the replicas tell the cluster: a release staged, seen marks held, replicas passed on, URLs held
        self.delegate: QueueDelegate = delegate if delegate is not None else QueueAlone()
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
        # the zones of that ring's members, as they were at the scan: the backups a URL had under an older ring are
        # found with that ring's zones (today's view lacks a member that left, and a ring node missing from the
        # zones counts as another zone, which sent the zone walk of `Ring.holders_at` round the ring)
        self._synced_zones: Zones = Zones()
        self._changed_at: float | None = None  # when the ring last changed (for restore_seconds)
        self._restore: dict[str, tuple[Backup, int]] | None = None  # what the last scan staged, per backup
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
        self.revisits_received = 0  # revisit records that came with releases (`--revisit`)
        self.urls_promoted = 0
        self.urls_passed_on = 0  # replicas of positions no longer backed here, sent to their owners (`collect`)
        self.dropped = 0  # entries dropped for a backup that left the ring, or past max_staged
        self.refused = 0  # malformed entries from a peer

    @property
    def enabled(self) -> bool:
        return self.copies > 0

    # -- the owner's side: staging -------------------------------------------------------------------------

    def _backup(self, peer: str) -> Backup:
        state = self._backups.get(peer)
        if state is None:
            state = self._backups[peer] = Backup()
        return state

    def _stage(self, peer: str, entry: tuple[bytes, QueuedUrl] | tuple[bytes, QueuedUrl, bool] | bytes) -> None:
        state = self._backup(peer)
        if not state.staged:
            state.staged_at = trio.current_time()
        state.staged.append(entry)
        state.staged_total += 1
        if len(state.staged) > self.max_staged:
            self._drop_staged(peer, state, rescan=True)

    def _backups_of(self, ring: Any, host: str, zones: Zones | None = None) -> tuple[str, ...]:
        """The backups that hold `host`'s queued URLs under `ring` (not this node), with the members' `zones`
        (those of the current view by default: give an older ring's own)."""
        return self._holders_of(ring, host, zones)[0]

    def _release_backups_of(self, ring: Any, host: str) -> tuple[str, ...]:
        """The backups a release of one of `host`'s URLs goes to under `ring`: its backups and the seen-key
        replicas' (not this node)."""
        return self._holders_of(ring, host)[1]

    def _holders_of(self, ring: Any, host: str, zones: Zones | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if ring is self._cache_ring:
            found = self._cache.get(host)
            if found is not None:
                return found
        position = host_position(host)
        if zones is None:
            zones = self.zones_of()
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
        and the page would be released while its links live only in this node's outbox: lost if the node dies
        before they are acknowledged. So every release that waits for routed links also waits for each of
        `owners` up to the outbox's last entry, and for `ticket`."""
        owners = tuple(owners)
        if not self._releases or not (owners or ticket is not None):
            return
        last = self.store.outbox.last_seq()
        for index, (marks, links, item) in enumerate(self._releases):
            if marks:  # (a release that routed nothing waits for no outbox entry)
                for owner in owners:
                    marks[owner] = max(marks.get(owner, 0), last)
                self._releases[index] = (marks, merged(links, ticket), item)

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
        still: list[tuple[dict[str, int], Ticket | None, QueuedUrl]] = []
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
                backups.update(b for b in self._backups_of(self._synced, item.host, self._synced_zones)
                               if b in ring.weights)
            for backup in sorted(backups):
                self._stage(backup, (key, item, True))
            self._wake_for(backups)
        self.delegate.release_staged(item, key, frozenset(backups))

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

    def _due(self, state: Backup, now: float) -> bool:
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

    def _reached(self, targets: dict[str, tuple[Backup, int]]) -> bool:
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

    def _drop_staged(self, peer: str, state: Backup, *, rescan: bool) -> None:
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
            "revisits_received": self.revisits_received, "revisits_promoted": self.store.replicas.revisits_promoted,
            "urls_promoted": self.urls_promoted, "urls_passed_on": self.urls_passed_on, "dropped": self.dropped,
            "refused": self.refused,
            "restore_seconds": self.restore_seconds[-1] if self.restore_seconds else None,
        }
