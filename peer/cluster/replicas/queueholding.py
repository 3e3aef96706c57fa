"""The backup's side of the queued-URL replicas: a peer's `QueueReplica` journaled in one transaction and
acknowledged once committed (the journal folded into the replica and seen tables every FOLD_ENTRIES entries or
FOLD_AGE seconds, at once while views change); replicas of positions this node no longer backs passed on to
their owners, then dropped (`collect`).

A mixin of `peer.cluster.replicas.queuereplicas.QueueReplicas`: it works on its attributes, set in `QueueReplicas.__init__`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from protocol import Message, QueueReplica, ReplicaAck
from storage import HostState, QueuedUrl, RevisitRecord, queued_url_keys

from peer.cluster.replicas.queueconfig import FOLD_AGE, FOLD_ENTRIES, MAX_HOST
from peer.crawl.urls import host_of_normalized, normalize

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from protocol import Limits
    from ring import Zones
    from storage import NodeStore

    from peer.cluster.replicas.queueconfig import QueueDelegate

__all__ = ["ReplicaHolding"]

# the replicas' records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.backups")


class ReplicaHolding:
    """Holding peers' replicas, and letting go of those this node no longer backs."""

    if TYPE_CHECKING:
        # What this part uses of the QueueReplicas it is mixed into: attributes and its other parts' methods.
        copies: int
        _held_epoch: int
        _journaled_at: float | None
        limits: Limits
        links: Any
        node_id: str
        delegate: QueueDelegate
        refused: int
        releases_held: int
        revisits_received: int
        release_copies: int
        _ring_at: float
        ring_of: Callable[[], tuple[int, Any]]
        store: NodeStore
        urls_held: int
        urls_passed_on: int
        wall_clock: Callable[[], float]
        zones_of: Callable[[], Zones]

        def _acked(self, peer: str, ack: ReplicaAck) -> None: ...

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

        dropped = self.store.replicas.drop_where(unwanted, passing=self.delegate.pass_on)
        self.urls_passed_on += dropped
        # revisit schedules come with releases, which go to the seen-key replicas' backups too
        # (`release_copies`): held while this node is one of those
        self.store.replicas.drop_revisits_where(
            lambda position: me not in ring.holders_at(position, max(1, self.release_copies), zones))
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
            if url is None or not host or len(host.encode()) > MAX_HOST or len(url) > self.limits.max_url_length:
                continue
            items.append(QueuedUrl(url=url, host=host, depth=entry.depth, hops=entry.hops, found_on=entry.found_on))
        released = [key for key in message.released if len(key) == 16]
        wall = self.wall_clock()
        states = [
            HostState(host=s.host, next_allowed=wall + s.ready_in, crawl_delay=s.crawl_delay, failures=s.failures)
            for s in message.hosts if s.host and len(s.host.encode()) <= MAX_HOST
        ]
        revisits = []
        for r in message.revisits:
            url = normalize(r.url)
            host = host_of_normalized(url) if url is not None else ""
            if url is None or not host or len(host.encode()) > MAX_HOST or len(url) > self.limits.max_url_length:
                continue
            # in this node's wall clock, and waiting: one queued at the owner is due at once (promotion queues
            # it only where its URL is promoted)
            revisits.append(RevisitRecord(
                url=url, host=host, depth=r.depth, due=wall if r.queued else wall + r.due_in, interval=r.interval,
                etag=r.etag, last_modified=r.last_modified, digest=r.digest, stored_at=r.stored_at, size=r.size,
                changed=r.changed, unchanged=r.unchanged))
        bad = (len(message.urls) - len(items)) + (len(message.released) - len(released))
        bad += len(message.hosts) - len(states) + len(message.revisits) - len(revisits)
        if bad:
            self.refused += bad
            log.warning("malformed replica entries from a peer dropped", extra={"peer": peer_id, "entries": bad})
        now = trio.current_time()
        if self._journaled_at is None or not self.store.replicas.journaled:  # (a read folds too)
            self._journaled_at = now
        waiting = self.store.replicas.journaled + len(items) + len(released) + len(states) + len(revisits)
        fold = (waiting >= FOLD_ENTRIES or now - self._journaled_at >= FOLD_AGE
                or message.epoch != self.ring_of()[0] or now - self._ring_at < FOLD_AGE)  # views changing: at once
        self.store.hold_replicas(list(zip(queued_url_keys(items), items)), released, states, revisits, fold=fold)
        if fold:
            self._journaled_at = None
        self._held_epoch = max(self._held_epoch, message.epoch)
        if released:
            self.delegate.marked_seen(released)
        self.urls_held += len(items)
        self.releases_held += len(released)
        self.revisits_received += len(revisits)
        if items:
            self.delegate.held_from(peer_id, message.epoch, items)
        # committed: it survives this process's death (backupconfig.py, the note after FULL, says why no fsync
        # waits before the ack)
        self.links.send_nowait(peer_id, ReplicaAck(seq=message.seq))  # if lost, the owner re-sends: ack again
        return True
