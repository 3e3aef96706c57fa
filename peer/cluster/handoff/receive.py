"""The receiving side of the hand-off: a chunk of a gained arc is applied idempotently (its URLs admitted or
forwarded to their owner under this node's ring, its seen keys marked, queued URLs its sender had fetched
dropped, host states merged keeping the later `next_allowed`, revisit schedules put), made durable, and
acknowledged; the ack of a chunk whose URLs are on their way to this node's backups waits for them (`Hold`).

A mixin of `peer.cluster.handoff.Handoff`: it works on the hand-off's attributes, set in `Handoff.__init__`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from protocol import HandoffAck, HandoffChunk
from protocol import HostState as WireHostState
from ring import host_position
from storage import HostState, QueuedUrl, RevisitRecord, in_arc, queued_url_keys

from peer.cluster.handoff.arcs import KEY_POSITION
from peer.crawl.urls import host_of_normalized, normalize

if TYPE_CHECKING:
    from collections.abc import Callable

    from storage import NodeStore

    from peer.cluster.handoff.config import HandoffDelegate, HandoffLinks

__all__ = ["Incoming", "Receiving"]

# the hand-off's records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.handoff")


@dataclass(slots=True)
class Incoming:
    applied: set[int] = field(default_factory=set)
    last: int | None = None
    complete: bool = False


class Receiving:
    """Incoming chunks: apply, sync, acknowledge (or hold the ack for this node's backups)."""

    if TYPE_CHECKING:
        # What this part uses of the Handoff it is mixed into: attributes and its other parts' methods.
        acks_held: int
        chunks_applied: int
        delegate: HandoffDelegate
        _held: dict[tuple[str, int, int], None]
        _incoming: dict[tuple[str, int], Incoming]
        links: HandoffLinks
        node_id: str
        revisits_received: int
        store: NodeStore
        transfers_received: int
        urls_discarded: int
        urls_forwarded: int
        urls_received: int
        wall_clock: Callable[[], float]

        def _release(self, peer_id: str, epoch: int) -> None: ...

    def _receive(self, peer_id: str, chunk: HandoffChunk) -> None:
        held = (peer_id, chunk.transfer_id, chunk.chunk_seq)
        if held in self._held:
            return  # a re-send of a chunk whose replicas are on their way: acknowledged when they arrive
        incoming = self._incoming.setdefault((peer_id, chunk.transfer_id), Incoming())
        hold = None
        if not incoming.complete and chunk.chunk_seq not in incoming.applied:
            new, states = self._apply(peer_id, chunk)
            self.store.sync()  # durable before the ack (DESIGN decision 5)
            incoming.applied.add(chunk.chunk_seq)
            self.chunks_applied += 1
            if new or states:
                hold = self.delegate.applied(new, states)
        if chunk.last:
            incoming.last = chunk.chunk_seq
        if not incoming.complete and incoming.last is not None and len(incoming.applied) == incoming.last + 1:
            incoming.complete, incoming.applied = True, set()  # a late duplicate is only acknowledged again
            self._release(peer_id, chunk.epoch)
            self.transfers_received += 1
            log.info("incoming hand-off complete", extra={"peer": peer_id})
        ack = HandoffAck(transfer_id=chunk.transfer_id, chunk_seq=chunk.chunk_seq)
        if hold is None:
            self.links.send_nowait(peer_id, ack)
            return
        # Durable here, not yet at this node's backups: until they hold the URLs, the sender's copy is the
        # second one, so the sender keeps it (and re-sends the chunk) until the ack.
        self._held[held] = None
        self.acks_held += 1

        def release() -> None:
            self._held.pop(held, None)
            self.links.send_nowait(peer_id, ack)

        hold(release)

    def _apply(self, peer_id: str, chunk: HandoffChunk) -> tuple[list[QueuedUrl], list[HostState]]:
        start, end = chunk.arc_start, chunk.arc_end
        items = []
        for entry in chunk.urls:
            url = normalize(entry.url)  # held to what a link from the web is, before it reaches the stores
            host = host_of_normalized(url) if url is not None else ""
            if url is None or not host or not in_arc(host_position(host), start, end):
                log.warning("hand-off URL unusable or outside its arc; dropped", extra={"peer": peer_id})
                continue
            items.append(
                QueuedUrl(
                    url=url, host=host, depth=entry.depth, hops=entry.hops, found_on=entry.found_on,
                    lastmod=entry.lastmod, sitemap=entry.sitemap,
                )
            )
        owner_of = self.delegate.owner_of
        forward: list[tuple[str, QueuedUrl]] = []
        mine = []
        for item in items:
            owner = owner_of(item.host)
            if owner == self.node_id:
                mine.append(item)
            else:
                forward.append((owner, item))
        items = mine
        self.urls_forwarded += len(forward)
        # a URL already seen here (or applied before) is not queued again; one queued is its page's revisit, if
        # the page's schedule came first
        new = self.store.accept(items, forward, handed=True)
        self.urls_received += len(new)
        keys = [
            key for key in chunk.seen_keys
            if len(key) > KEY_POSITION and in_arc(int.from_bytes(key[:KEY_POSITION], "big"), start, end)
        ]
        # where the arc is not (or no longer) ours, its timers go on to whoever owns it
        owned = {item.host for item in items}
        hosts = tuple(state for state in chunk.hosts if owner_of(state.host) == self.node_id or state.host in owned)
        foreign = [state for state in chunk.hosts if state not in hosts
                   and in_arc(host_position(state.host), start, end)]
        if foreign:
            self.delegate.foreign_states(foreign)
        if len(keys) < len(chunk.seen_keys):
            log.warning("hand-off keys outside their arc; dropped", extra={"peer": peer_id})
        if keys:
            # A key sent as seen was fetched (or given up) by the previous owner: if a peer's batch queued that
            # URL here before this chunk came, it must not be fetched again. Nor if the crawler took it from the
            # queue and holds it parked: a node back from a partition may have popped a host's first page before
            # the split and waited since for robots.txt, the fence and the hand-off, while the heir fetched that
            # page during the split. Unparking the arc makes the crawler look at the dedup store again.
            self.delegate.unpark(start, end)
            wanted = set(keys)
            queued_here, _ = self.store.frontier.export_arc(start, end)
            stale = [i for i, k in zip(queued_here, queued_url_keys(queued_here)) if k in wanted]
            if stale:
                self.urls_discarded += self.store.discard(stale)  # a queued revisit among them waits again
                self.delegate.discarded(stale)
        self.store.dedup.insert(keys)
        if keys:
            self.delegate.keys_arrived(keys)
        states = [self._merge(state) for state in hosts if in_arc(host_position(state.host), start, end)]
        self.store.frontier.put_states(states)
        self._apply_revisits(peer_id, chunk)
        return new, states

    def _apply_revisits(self, peer_id: str, chunk: HandoffChunk) -> None:
        """The moving pages' schedules, in wall-clock terms here. One whose revisit was queued at the sender (its
        URL came in this transfer's queue) is queued here if that URL is, else due now: a revisit is neither
        forgotten nor queued twice (`NodeStore.put_revisits`)."""
        wall = self.wall_clock()
        records = []
        for entry in chunk.revisits:
            url = normalize(entry.url)  # held to what a link from the web is, as the arc's queued URLs are
            host = host_of_normalized(url) if url is not None else ""
            if url is None or not host or not in_arc(host_position(host), chunk.arc_start, chunk.arc_end):
                log.warning("hand-off revisit schedule unusable or outside its arc; dropped", extra={"peer": peer_id})
                continue
            records.append(RevisitRecord(
                url=url, host=host, depth=entry.depth, due=wall if entry.queued else wall + entry.due_in,
                interval=entry.interval, etag=entry.etag, last_modified=entry.last_modified, digest=entry.digest,
                stored_at=entry.stored_at, size=entry.size, changed=entry.changed, unchanged=entry.unchanged,
                queued=entry.queued))
        self.store.put_revisits(records)
        self.revisits_received += len(records)

    def merge_state(self, wire: WireHostState) -> HostState:
        """A politeness state that arrived from a peer, merged with any state here (see `_merge`)."""
        return self._merge(wire)

    def _merge(self, wire: WireHostState) -> HostState:
        """The wire state in wall-clock terms, keeping the later `next_allowed` of it and any state here, and the
        larger of the page and byte counts (the host's budgets: a count never goes down by moving)."""
        next_allowed = self.wall_clock() + wire.ready_in
        here = self.store.frontier.get_state(wire.host)
        if here is None:
            return HostState(host=wire.host, next_allowed=next_allowed, crawl_delay=wire.crawl_delay,
                             failures=wire.failures, pages=wire.pages, bytes=wire.bytes)
        return HostState(
            host=wire.host, next_allowed=max(next_allowed, here.next_allowed),
            crawl_delay=max(wire.crawl_delay, here.crawl_delay), backoff=here.backoff, failures=wire.failures,
            pages=max(here.pages, wire.pages), bytes=max(here.bytes, wire.bytes),
        )
