"""URL dispatch between peers: the design's URL dispatcher (sender) and URL receiver, with a durable outbox.

Links for hosts another node owns go to that owner in batches (`UrlBatch`), flushed every `interval` or as
soon as `batch_size` URLs wait, to cut the number of messages. Nothing is lost (DESIGN decision 5): routed
URLs wait in the store's outbox (written in the transaction that finishes their page) until the owner's
`BatchAck`, and the owner acks only after the URLs are durably in its dedup store and frontier, or durably in
its own outbox when a stale view sent them to the wrong node (it forwards them). Delivery over a peer link is
at most once per connection, so unacked batches are re-sent after `resend_after` or a reconnect, and entries
are re-keyed to their new owner when the view changes. Duplicates are harmless: the owner's dedup decides
(DESIGN decision 4); the sender's "recently sent" filter only saves traffic.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from protocol import BatchAck, Message, UrlBatch, UrlEntry
from ring import Ring
from storage import NodeStore, QueuedUrl, url_fingerprint

from peer.cluster.replicas.queuereplicas import QueueReplicas, Ticket
from peer.config import DEFAULTS
from peer.crawl.syncs import StoreSyncs
from peer.crawl.urls import host_of_normalized, normalize

__all__ = ["DispatchConfig", "DispatchStats", "Dispatcher", "LinkLayer"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.dispatch")


class LinkLayer(Protocol):
    """What the dispatcher needs of `PeerLinks`: queue a message for a peer, and see a peer's link."""

    def send_nowait(self, peer_id: str, message: Message) -> bool: ...

    def get(self, peer_id: str) -> object | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchConfig:
    """Dispatch tuning; every default has its reason."""

    # The operator's settings (batch_size, dispatch_interval): default and reason in peer.config (FIELDS).
    batch_size: int = DEFAULTS["batch_size"]
    interval: float = DEFAULTS["dispatch_interval"]
    # At most 12 partial batches a tick, to the owners whose links have waited longest: a node sends at most
    # 12 / interval partial batches a second however many peers it has (60 at 200 ms), so under a heavy crawl,
    # with work for every owner, a partial batch waits its turn and batches keep their size as the cluster
    # grows (docs/cluster.md: frames per URL at 10, 100 and 1,000 nodes within 2x); with work for few owners
    # (a young crawl, a quiet node) every partial batch goes at the next tick. Full batches never wait.
    partials_per_interval: int = 12
    # An unacked batch is sent again after 5 s: an ack needs one store commit and the node's next sync (once per
    # `sync_interval`, 1 s by default), far less than that.
    resend_after: float = 5.0
    # 100,000 fingerprints (about 10 MB) cover the popular links of a wide crawl (site-wide menus, footers).
    recent_size: int = 100_000
    # Batches in flight per owner: keeps a peer's link queue (256 messages) far from full.
    window: int = 8

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.window < 1 or self.recent_size < 0 or self.partials_per_interval < 1:
            raise ValueError("dispatch batch_size, window and partials_per_interval must be >= 1, recent_size >= 0")
        if self.interval <= 0 or self.resend_after <= 0:
            raise ValueError("dispatch interval and resend_after must be > 0 seconds")


@dataclass(slots=True)
class DispatchStats:
    """Counters; the per-peer ones give the URLs sent from this node to each other node."""

    batches_sent: int = 0
    batches_resent: int = 0
    batches_acked: int = 0
    batches_received: int = 0
    acks_waiting: int = 0  # acks that waited for the batch's replicas to reach the backups
    batches_held: int = 0  # re-sends of a batch whose ack waits for its replicas: not handled again
    batches_refused: int = 0  # batches left unacknowledged while this node admits nothing (its disk is low)
    acks_unmatched: int = 0  # acks for batches we no longer hold (late, repeated, or from an earlier run)
    send_refused: int = 0  # the link queue was full; the batch goes again at the next tick
    urls_routed: int = 0  # handed to route()
    urls_recent: int = 0  # dropped by the recently-sent filter
    urls_new: int = 0  # received, owned here, new
    urls_seen: int = 0  # received, owned here, already known
    urls_forwarded: int = 0  # received for another owner (a stale view) and put in our outbox
    urls_rejected: int = 0  # received but not a crawlable URL
    urls_rerouted: int = 0  # outbox entries re-keyed to a new owner by a view change
    urls_reclaimed: int = 0  # outbox entries that a view change made ours
    urls_sent: Counter[str] = field(default_factory=Counter)  # per peer, first sends only
    urls_resent: Counter[str] = field(default_factory=Counter)
    urls_acked: Counter[str] = field(default_factory=Counter)
    urls_received: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class _Batch:
    seqs: list[int]
    sent_at: float
    connection: int  # the link's connection number the batch was (or will be) written on


@dataclass(slots=True)
class _Owner:
    cursor: int = 0  # the highest outbox seq put in a batch by this process
    pending: int = 0  # entries beyond the cursor, as far as we know (used to flush full batches early)
    since: float | None = None  # when the oldest of those entries was stored here (None: unknown, send now)
    inflight: dict[int, _Batch] = field(default_factory=dict)


def _by_url(item: QueuedUrl) -> str:
    return item.url


class Dispatcher:
    """Routes links to their owners and receives the batches peers route to this node.

    Wiring: the cluster's `Ownership.route` is `dispatcher.route`; the crawler passes the cluster's
    `take_routed()` (this dispatcher's) to `store.finish` so routed links are durable with their page; `Membership(on_message=dispatcher.on_message)`;
    `await nursery.start(dispatcher.run)`.
    """

    def __init__(
        self,
        node_id: str,
        store: NodeStore,
        links: LinkLayer,
        *,
        ring_of: Callable[[], tuple[int, Ring]],
        config: DispatchConfig | None = None,
        on_admitted: Callable[[list[QueuedUrl]], None] | None = None,
        backups: QueueReplicas | None = None,
        syncs: StoreSyncs | None = None,
        answered_by: Callable[[], Callable[[str], bool] | None] = lambda: None,
        admitting: Callable[[], bool] = lambda: True,
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.links = links
        self.ring_of = ring_of
        self.config = config or DispatchConfig()
        self.on_admitted = on_admitted
        self.stats = DispatchStats()
        # the queued-URL replicas: a batch is acknowledged once its URLs are on the owner's backups too
        self.backups = backups
        # False while this node takes no new URL (its disk is low): a peer's batch is then left unacknowledged,
        # and its sender, which keeps it until acknowledged, sends it again
        self.admitting = admitting
        self._held: dict[tuple[str, int], Ticket] = {}  # (sender, batch seq) -> replicas on their way
        self._staged: list[QueuedUrl] = []
        self._local: list[QueuedUrl] = []
        self._recent: dict[bytes, None] = {}
        self._owners: dict[str, _Owner] = {}
        # owners a tick must look at (entries stored beyond the cursor, or batches unacknowledged), oldest work
        # first (an owner goes to the end when links start waiting for it): a tick's cost follows the owners with
        # work, not every owner this node ever sent to, and its partial batches go to those that waited longest
        self._active: dict[str, None] = {}
        self._epoch: int | None = None
        self._draining = False  # leaving: every partial batch goes at the next tick
        self._run = 0
        self._batches = 0
        self._wake = trio.Event()
        # The node's sync service: a received batch is acknowledged after its next sync (DESIGN decision 5), one
        # fsync for every batch and every other waiter of that moment. Without one (tests, tools), a batch is
        # synced on its own at once.
        self.syncs = syncs if syncs is not None else StoreSyncs(store, period=DEFAULTS["sync_interval"])
        # received and stored, not yet synced and acked: (peer, ack, replicas' ticket, the sync mark of the commit)
        self._unsynced: list[tuple[str, BatchAck, Ticket | None, int]] = []
        self._unsynced_keys: set[tuple[str, int]] = set()  # (peer, batch seq) of those
        # () -> whether the crawler's memory says a URL is in this node's dedup store, for a host it owns under
        # the current ring (`Crawler.answered`, once the crawler is attached; None before): a peer's URL it knows
        # is counted as seen without being normalized, built into a record or looked up again (most URLs a peer
        # sends were found here first, on their own host). Asked once per batch, not per URL.
        self.answered_by = answered_by

    # -- the crawler's side -------------------------------------------------------------------------------

    def route(self, item: QueuedUrl) -> None:
        """Queue a link for the owner of `host` (the crawler's `router`). Repeats of a recently sent URL are
        dropped: the owner already has it or will have it."""
        self.stats.urls_routed += 1
        recent = self._recent
        if self.config.recent_size:
            key = url_fingerprint(item.url)
            if key in recent:
                self.stats.urls_recent += 1
                return
            recent[key] = None
            if len(recent) > self.config.recent_size:
                del recent[next(iter(recent))]
        self._staged.append(item)
        if len(self._staged) >= self.config.batch_size:
            self._wake.set()

    def take_routed(self) -> list[tuple[str, QueuedUrl]]:
        """The routed links not yet stored, with their owners under the current view, for
        `store.finish(page, links, routed=...)`; the caller stores them in that transaction (with no await
        in between, so no view change can slip in). Links that turn out to be ours are admitted at the next
        tick."""
        staged, self._staged = self._staged, []
        if not staged:
            return []
        ring = self.ring_of()[1]
        routed: list[tuple[str, QueuedUrl]] = []
        for item in staged:
            owner = ring.owner(item.host)
            if owner == self.node_id:  # the caller's view was older than ours: it is ours after all
                self._local.append(item)
                self._wake.set()
            else:
                routed.append((owner, item))
        self._stored(routed)
        return routed

    def flush_staged(self) -> int:
        """Store routed links that no page's `finish` took (seeds, redirects); `run` calls it every tick."""
        staged = self.take_routed()
        self.store.outbox.put(staged)
        if self._local:
            local, self._local = self._local, []
            self._place(local)  # the view may have changed since these were found to be ours
        return len(staged)

    def pass_on(self, items: Sequence[QueuedUrl]) -> list[QueuedUrl]:
        """Queued URLs this node held as a backup and no longer backs (`QueueReplicas.collect`): each goes to
        its owner under the current view like a routed link (the outbox, acknowledged once durable there), or
        is admitted here if this node owns it now. The owner's dedup store decides: most are queued or fetched
        there already. Put aside in the outbox: a held release waits for the oldest entry of each owner its
        page's links went to, and a pass-on of thousands would hold every page's release until it is all
        acknowledged. Returns those new here."""
        return self._place(items, aside=True)

    def _place(self, items: Sequence[QueuedUrl], *, aside: bool = False) -> list[QueuedUrl]:
        """Admit `items` owned here under the current view and put the others in the outbox for their owners, in
        one transaction; returns those new here (replicated and their hosts woken)."""
        ring = self.ring_of()[1]
        mine: list[QueuedUrl] = []
        others: list[tuple[str, QueuedUrl]] = []
        for item in items:
            owner = ring.owner(item.host)
            if owner == self.node_id:
                mine.append(item)
            else:
                others.append((owner, item))
        new = self.store.accept(mine, others, aside=aside)
        self._stored(others)
        self._replicate(new)
        self._admitted(new)
        return new

    def _stored(self, routed: Sequence[tuple[str, QueuedUrl]]) -> None:
        full = False
        now = trio.current_time()
        for owner, _ in routed:
            state = self._owner(owner)
            if not state.pending and state.since is None:
                state.since = now
                self._queue_last(owner)
            state.pending += 1
            full = full or state.pending >= self.config.batch_size
        if full:
            self._wake.set()

    def _owner(self, peer_id: str) -> _Owner:
        """The sending state of `peer_id`, which a caller is about to give work: the next tick looks at it."""
        state = self._owners.get(peer_id)
        if state is None:
            state = self._owners[peer_id] = _Owner()
        self._active[peer_id] = None
        return state

    def _queue_last(self, peer_id: str) -> None:
        """Links start waiting for `peer_id`: it goes behind the owners whose links waited before."""
        active = self._active
        del active[peer_id]
        active[peer_id] = None

    def _replicate(self, new: list[QueuedUrl]) -> Ticket | None:
        return self.backups.replicate(new) if self.backups is not None and new else None

    def _admitted(self, new: list[QueuedUrl]) -> None:
        if new and self.on_admitted is not None:
            self.on_admitted(new)

    # -- the sender's loop --------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush every `interval` (and early for full batches) until cancelled. What a previous process left
        in the outbox is sent again, re-routed first if the view changed."""
        self._run = self.store.outbox.new_run()
        for owner, count in self.store.outbox.counts().items():
            self._owner(owner).pending += count
        self._check_view(force=True)
        task_status.started()
        interval = self.config.interval
        next_tick = trio.current_time() + interval
        while True:
            with trio.move_on_at(next_tick):
                await self._wake.wait()
            self._wake = trio.Event()
            now = trio.current_time()
            timer = now >= next_tick
            if timer:
                next_tick += interval * max(1, math.ceil((now - next_tick) / interval + 1e-9))
            self.tick(now, full_only=not timer)

    def tick(self, now: float, *, full_only: bool = False) -> None:
        """One flush: store what is staged, re-route on a view change, re-send what is due, send new batches
        (only full ones when `full_only`)."""
        self.flush_staged()
        self._check_view()
        outbox, active = self.store.outbox, self._active
        for owner in outbox.changed_owners():  # entries stored by others (a hand-off's forwarded URLs) too
            self._owner(owner)
        # the partial batches of this tick, oldest work first: the message rate is bounded, not each URL's wait
        # (but a leaving node's: it sends everything it holds at once, and then nothing more)
        partials = math.inf if self._draining else 0 if full_only else self.config.partials_per_interval
        for owner in list(active):
            state = self._owners[owner]
            self._resend(owner, state, now)
            if self._send_new(owner, state, now, full_only=partials <= 0):
                partials -= 1
            if not state.inflight and not state.pending and outbox.newest(owner) <= state.cursor:
                del active[owner]  # nothing unacknowledged, nothing stored beyond what was batched

    def _check_view(self, *, force: bool = False) -> None:
        epoch, ring = self.ring_of()
        if not force and epoch == self._epoch:
            return
        if self._epoch is not None:
            # a URL sent to a node that has since died must be sent again to its new owner when found again
            self._recent.clear()
        self._epoch = epoch
        moved, mine = self.store.reroute(ring.owner, self.node_id)
        for owner, count in moved.items():
            self._owner(owner).pending += count
            self.stats.urls_rerouted += count
        self.stats.urls_reclaimed += len(mine)
        ticket = self._replicate(mine)
        if (moved or mine) and self.backups is not None:
            self.backups.rerouted(moved, ticket)  # held releases wait for the moved links under their new keys
        self._admitted(mine)

    def _send(self, owner: str, seq: int, entries: Sequence[tuple[int, QueuedUrl]]) -> bool:
        # sorted: the wire form codes each URL against the one before it (protocol/_urlcolumns.py)
        ordered = sorted((i for _, i in entries), key=_by_url)
        urls = tuple(
            UrlEntry(url=i.url, depth=i.depth, found_on=i.found_on, hops=i.hops, lastmod=i.lastmod, sitemap=i.sitemap)
            for i in ordered
        )
        batch = UrlBatch(seq=seq, sender=self.node_id, epoch=self._epoch or 0, urls=urls)
        if self.links.send_nowait(owner, batch):
            return True
        self.stats.send_refused += 1
        return False

    def _connection(self, owner: str) -> int:
        """The number of the connection a message queued now will be written on: the current one, or the
        next if the link is down (its queue survives reconnects). A batch written on a connection that has
        since been replaced may be lost, so it is sent again."""
        link = self.links.get(owner)
        connects = int(getattr(link, "connects", 0))
        return connects if getattr(link, "connected", False) else connects + 1

    def _resend(self, owner: str, state: _Owner, now: float) -> None:
        if not state.inflight:
            return
        connection = self._connection(owner)
        for seq, batch in list(state.inflight.items()):
            reconnected = connection > batch.connection
            if not reconnected and now - batch.sent_at < self.config.resend_after:
                continue
            entries = self.store.outbox.get(owner, batch.seqs)
            if not entries:  # every entry was re-routed elsewhere
                del state.inflight[seq]
                continue
            batch.seqs = [s for s, _ in entries]
            batch.sent_at = now if self._send(owner, seq, entries) else -math.inf
            batch.connection = self._connection(owner)
            self.stats.batches_resent += 1
            self.stats.urls_resent[owner] += len(entries)

    def _send_new(self, owner: str, state: _Owner, now: float, *, full_only: bool) -> bool:
        """Send `owner` its new entries, full batches only when `full_only`; whether a partial batch went."""
        size = self.config.batch_size
        while len(state.inflight) < self.config.window:
            if full_only and state.pending < size:
                return False
            entries = self.store.outbox.take(owner, size, after=state.cursor)
            if not entries:
                state.pending, state.since = 0, None
                return False
            if full_only and len(entries) < size:
                state.pending = len(entries)
                return False
            state.cursor = entries[-1][0]
            state.pending = max(0, state.pending - len(entries))
            state.since = now if state.pending else None
            self._batches += 1
            seq = (self._run << 32) | (self._batches & 0xFFFFFFFF)
            sent = self._send(owner, seq, entries)
            state.inflight[seq] = _Batch(
                seqs=[s for s, _ in entries], sent_at=now if sent else -math.inf, connection=self._connection(owner)
            )
            self.stats.batches_sent += 1
            self.stats.urls_sent[owner] += len(entries)
            if len(entries) < size:
                return True
        return False

    # -- the receiver -------------------------------------------------------------------------------------

    async def on_message(self, peer_id: str, message: Message) -> None:
        """Handle `UrlBatch` and `BatchAck` from `peer_id`; other messages are not ours and are ignored."""
        if isinstance(message, UrlBatch):
            self._receive(peer_id, message)
        elif isinstance(message, BatchAck):
            self._acked(peer_id, message)

    def _receive(self, peer_id: str, batch: UrlBatch) -> None:
        if (peer_id, batch.seq) in self._held or (peer_id, batch.seq) in self._unsynced_keys:
            # a re-send of a batch not yet synced, or whose replicas are still on their way: it is acknowledged
            # when they are (an ack for the re-send now would let the sender drop URLs that only this node has)
            self.stats.batches_held += 1
            return
        if not self.admitting():
            self.stats.batches_refused += 1
            return
        epoch, ring = self.ring_of()
        owned: list[QueuedUrl] = []
        forward: list[tuple[str, QueuedUrl]] = []
        answered = self.answered_by()
        known = 0
        for entry in batch.urls:
            if answered is not None and answered(entry.url):  # (a URL the memory holds is normalized)
                known += 1
                continue
            # A peer's URL is held to what a link from the web is: normalized (scheme, IDNA host of at most 253
            # bytes in valid labels, port, path) before it reaches the stores; what does not normalize is dropped.
            url = normalize(entry.url)
            host = host_of_normalized(url) if url is not None else ""
            if url is None or not host:
                self.stats.urls_rejected += 1
                log.warning("peer sent a URL with no usable host; dropped", extra={"peer": peer_id})
                continue
            item = QueuedUrl(
                url=url, host=host, depth=entry.depth, hops=entry.hops, found_on=entry.found_on,
                lastmod=entry.lastmod, sitemap=entry.sitemap,
            )
            owner = ring.owner(host)
            if owner == self.node_id:
                owned.append(item)
            else:
                forward.append((owner, item))
        new = self.store.accept(owned, forward)
        stats = self.stats
        stats.batches_received += 1
        stats.urls_received[peer_id] += len(batch.urls)
        seen = known + len(owned) - len(new)
        stats.urls_new += len(new)
        stats.urls_seen += seen
        stats.urls_forwarded += len(forward)
        self._stored(forward)
        ticket = self._replicate(new)
        self._admitted(new)
        ack = BatchAck(seq=batch.seq, new=len(new), seen=seen, forwarded=len(forward), epoch=epoch)
        mark = self.syncs.mark()
        first = not self._unsynced
        self._unsynced.append((peer_id, ack, ticket, mark))
        self._unsynced_keys.add((peer_id, batch.seq))
        if first:  # one waiter for all the batches of the moment: the next sync covers them all
            self.syncs.after(mark, self._ack_synced)

    def _ack_synced(self) -> int:
        """Ack the received batches a sync has made durable (DESIGN decision 5: durable before the ack); those
        committed after that sync began wait for the next one."""
        if not self._unsynced:
            return 0
        syncs = self.syncs
        acks = [entry for entry in self._unsynced if syncs.durable(entry[3])]
        if len(acks) < len(self._unsynced):
            self._unsynced = [entry for entry in self._unsynced if not syncs.durable(entry[3])]
            syncs.after(self._unsynced[0][3], self._ack_synced)
        else:
            self._unsynced = []
        for peer_id, ack, _ticket, _mark in acks:
            self._unsynced_keys.discard((peer_id, ack.seq))
        for peer_id, ack, ticket, _mark in acks:
            if ticket is None or self.backups is None or self.backups.done(ticket):
                self.links.send_nowait(peer_id, ack)  # if lost, the sender re-sends and we ack again
                continue
            # durable here, not yet on every backup: the ack waits (the sender keeps the batch meanwhile)
            key = (peer_id, ack.seq)
            self._held[key] = ticket
            self.stats.acks_waiting += 1
            self.backups.then(ticket, functools.partial(self._release_ack, key, ack))
        return len(acks)

    def _release_ack(self, key: tuple[str, int], ack: BatchAck) -> None:
        """The replicas of a held batch arrived at every backup (or the backups left the ring): ack it."""
        self._held.pop(key, None)
        self.links.send_nowait(key[0], ack)

    def _acked(self, peer_id: str, ack: BatchAck) -> None:
        state = self._owners.get(peer_id)
        batch = state.inflight.pop(ack.seq, None) if state is not None else None
        if batch is None:
            self.stats.acks_unmatched += 1
            return
        removed = self.store.outbox.ack(peer_id, batch.seqs)
        self.stats.batches_acked += 1
        self.stats.urls_acked[peer_id] += removed
        if state is not None and state.pending >= self.config.batch_size:
            self._wake.set()  # room in the window for a full batch that was waiting

    def wake(self) -> None:
        """Tick now (the view changed, or work is waiting) instead of at the next timer."""
        self._wake.set()

    def drain(self) -> None:
        """The node is leaving: from the next tick on, send every owner everything waiting for it (no bound on
        the partial batches of a tick), so that the outbox empties and the node may go."""
        self._draining = True
        self._wake.set()

    # -- for status and termination -----------------------------------------------------------------------

    @property
    def run_number(self) -> int:
        """Which start of this node's sender this is (1, 2, ...); the high 32 bits of its batch numbers."""
        return self._run

    def in_flight(self) -> int:
        """Batches sent and not yet acknowledged."""
        owners = self._owners
        return sum(len(owners[owner].inflight) for owner in self._active)  # an owner with some stays active

    def in_flight_to(self, owner: str) -> int:
        """Batches sent to `owner` and not yet acknowledged."""
        state = self._owners.get(owner)
        return len(state.inflight) if state is not None else 0

    def outstanding(self) -> int:
        """URLs routed from this node that their owner has not acknowledged (staged or in the outbox): the
        crawl is not finished while any node has some."""
        return len(self._staged) + len(self._local) + len(self.store.outbox)
