"""The owner's side of the queued-URL replicas, sending: one `QueueReplica` at a time to each backup (window 1,
re-sent until its `ReplicaAck`), made from what is staged for it; and re-homing, the scan of the queue after
every ring change that stages each queued URL for the backups it did not have (docs/cluster.md, "Queued-URL
replicas").

A mixin of `peer.cluster.replicas.queuereplicas.QueueReplicas`: it works on its attributes, set in `QueueReplicas.__init__`.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import trio

from protocol import HostState as WireHostState
from protocol import QueueReplica, ReplicaAck, RevisitEntry, UrlEntry
from ring import host_position
from storage import QueuedUrl, queued_url_keys

from peer.cluster.replicas.queueconfig import GC_DELAY, MAX_ENTRIES, MAX_HOST, MAX_URL_BYTES, SCAN_CHUNK, Backup

if TYPE_CHECKING:
    from collections.abc import Callable

    from protocol import Limits
    from ring import Zones
    from storage import NodeStore, RevisitRecord

    from peer.cluster.replicas.queueconfig import Ticket

__all__ = ["ReplicaSending"]

# the replicas' records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.backups")


class ReplicaSending:
    """Messages to the backups, their acks, and re-homing after a ring change."""

    if TYPE_CHECKING:
        # What this part uses of the QueueReplicas it is mixed into: attributes and its other parts' methods.
        _backups: dict[str, Backup]
        copies: int
        _gc_ring: Any
        _held_epoch: Any
        interval: float
        limits: Limits
        links: Any
        max_staged: int
        messages_resent: int
        messages_sent: int
        node_id: str
        _releases: list[tuple[dict[str, int], Ticket | None, QueuedUrl]]
        releases_sent: int
        resend_after: float
        _restore: dict[str, tuple[Backup, int]] | None
        ring_of: Callable[[], tuple[int, Any]]
        store: NodeStore
        _synced: Any
        _synced_zones: Zones
        urls_rehomed: int
        urls_sent: int
        _wake: trio.Event
        wall_clock: Callable[[], float]
        zones_of: Callable[[], Zones]

        def _check_tickets(self) -> None: ...
        def _due(self, state: Backup, now: float) -> bool: ...
        def _stage(self, peer: str, entry: tuple[bytes, QueuedUrl] | tuple[bytes, QueuedUrl, bool] | bytes) -> None: ...
        def _stage_releases(self, *, force: bool = False) -> None: ...
        def collect(self, ring: Any) -> int: ...

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
                                   released=message.released, hosts=message.hosts, revisits=message.revisits)
            state.inflight, state.inflight_count = message, count
            state.sent_at, state.connection = now, self._connection(peer)
            if self.links.send_nowait(peer, message):
                self.messages_sent += 1
                self.urls_sent += len(message.urls)
                self.releases_sent += len(message.released)
            else:
                state.sent_at = now - self.resend_after + self.interval  # the queue is full: again soon

    def _message(self, state: Backup, epoch: int) -> tuple[QueueReplica, int, list[str]]:
        """The next message from the front of `state.staged`: the last word on each key wins (an add followed
        by its release in the same message cancels out), so the receiver may apply releases before adds. A
        released page, or one marked seen, carries its revisit schedule as it stands now (`--revisit`), looked
        up in one read transaction, its bytes counted with the URLs'."""
        final: dict[bytes, QueuedUrl | None] = {}
        hosts: dict[str, None] = {}
        released_urls: list[str] = []
        schedules: dict[bytes, RevisitRecord] = {}
        count = size = 0
        staged = state.staged
        max_keys = min(MAX_ENTRIES, self.limits.max_keys_per_chunk, self.limits.max_urls_per_batch)
        with self.store.revisits.finding() as find:
            while staged and count < max_keys and size < MAX_URL_BYTES:
                entry = staged.popleft()
                count += 1
                if isinstance(entry, bytes):  # a fetched page's seen mark
                    final[entry] = None
                    found = find((), (entry,)) if find is not None else ()
                elif len(entry) == 2:
                    key, item = entry
                    final[key] = item
                    size += len(item.url) + len(item.found_on or "") + 16
                    continue
                else:
                    key, done, _release = entry
                    final[key] = None
                    hosts[done.host] = None
                    released_urls.append(done.url)
                    found = find(((done.host, done.url),), ()) if find is not None else ()
                for record in found:
                    schedules[record.key()] = record
                    size += len(record.url) + len(record.etag or "") + len(record.last_modified or "") + 96
        urls = tuple(UrlEntry(url=i.url, depth=i.depth, found_on=i.found_on, hops=i.hops)
                     for i in final.values() if i is not None)
        released = tuple(key for key, i in final.items() if i is None)
        wall = self.wall_clock()
        states = []
        for host, st in self.store.frontier.get_states(hosts).items():  # one read transaction for them all
            if len(host.encode()) <= MAX_HOST:
                states.append(WireHostState(host=host, crawl_delay=max(0.0, st.crawl_delay),
                                            ready_in=max(0.0, st.next_allowed - wall), failures=st.failures))
        # a validator longer than the wire allows (a server's choice) goes as none: that page's next revisit is
        # an unconditional GET, where the whole message refused would stall this backup's FIFO
        fits = self.limits.max_string

        def valid(text: str | None) -> str | None:
            return text if text is None or len(text.encode()) <= fits else None

        revisits = tuple(
            RevisitEntry(url=r.url, depth=r.depth, due_in=max(0.0, r.due - wall), queued=r.queued,
                         interval=r.interval, etag=valid(r.etag), last_modified=valid(r.last_modified),
                         digest=r.digest, stored_at=max(0.0, r.stored_at), size=r.size, changed=r.changed,
                         unchanged=r.unchanged)
            for r in schedules.values() if len(r.url.encode()) <= self.limits.max_url_length
        )
        message = QueueReplica(seq=0, epoch=epoch, urls=urls, released=released, hosts=tuple(states),
                               revisits=revisits)
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
        old, old_zones = self._synced, self._synced_zones  # the previous scan's ring, with its own members' zones
        me, copies, zones = self.node_id, self.copies, self.zones_of()
        staged = 0

        def place(item: QueuedUrl) -> int:
            position = host_position(item.host)
            if ring.owner_at(position) != me:
                return 0  # handed off with its arc
            had: tuple[str, ...] = ()
            if old is not None and old.owner_at(position) == me:
                had = old.holders_at(position, copies, old_zones)
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
        self._synced, self._synced_zones = ring, zones
        self._restore = {peer: (s, s.staged_total) for peer, s in self._backups.items()}
        self._wake.set()
        self._check_tickets()
        if staged:
            log.info("queued URLs re-homed to their backups", extra={"entries": staged})
        return staged
