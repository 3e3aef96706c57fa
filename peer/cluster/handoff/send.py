"""The sending side of the hand-off: a transfer of the arcs this node lost to one peer, its chunks made from the
store a few arcs at a time as the window opens (queued URLs, seen keys but those of pages whose release is still
held, host politeness states, revisit schedules), sent and re-sent until acknowledged, and the arcs' content
dropped here only once every chunk is (docs/cluster.md, "Hand-off").

A mixin of `peer.cluster.handoff.Handoff`: it works on the hand-off's attributes, set in `Handoff.__init__`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import trio

from protocol import HandoffAck, HandoffChunk, Limits, RevisitEntry, UrlEntry
from protocol import HostState as WireHostState
from ring import ArcMove
from storage import HostState, QueuedUrl, RevisitRecord, queued_url_keys

from peer.cluster.handoff.arcs import ArcSet

if TYPE_CHECKING:
    from collections.abc import Callable

    from storage import NodeStore

    from peer.cluster.handoff.config import HandoffConfig
    from peer.cluster.handoff.config import HandoffDelegate, HandoffLinks

__all__ = ["Chunk", "Outgoing", "Sending"]

# the hand-off's records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.handoff")
_TEXT_ON_WIRE = Limits().max_string


def _on_wire(validator: str | None) -> str | None:
    """A revisit validator as a chunk carries it: one longer than the wire takes (a server's choice) goes as
    none, so the page's next revisit is an unconditional GET, where the whole chunk refused at each send would
    stall the transfer."""
    return validator if validator is None or len(validator.encode()) <= _TEXT_ON_WIRE else None


@dataclass(slots=True)
class Chunk:
    seq: int
    start: int  # the arc its content lies in
    end: int
    urls: tuple[UrlEntry, ...] = ()
    keys: tuple[bytes, ...] = ()
    states: tuple[HostState, ...] = ()
    revisits: tuple[RevisitRecord, ...] = ()
    sent_at: float | None = None


@dataclass(slots=True)
class Outgoing:
    """One transfer. Its chunks are made a few arcs at a time as the window opens (`Handoff._fill`), so starting a
    transfer of thousands of arcs reads nothing yet; `last` is known once every arc has been read."""

    transfer_id: int
    epoch: int
    peer: str
    chunks: dict[int, Chunk]  # unacknowledged chunks by seq
    last: int | None
    arcs: list[tuple[int, int]]  # the arcs with content, dropped here once every chunk is acknowledged
    # Seen keys sent, all of fetched pages: they stay here after the drop. Nothing here looks them up while
    # the arc is elsewhere, and if it comes back before its keys do (a joiner whose first ring was stale hands
    # on what it just received, then gains it again), they keep those pages from being fetched again.
    kept: list[bytes] = field(default_factory=list)
    todo: list[tuple[int, int]] = field(default_factory=list)  # arcs holding a host here, in send order
    read: int = 0  # how many of `todo` have been read
    in_flight: set[bytes] = field(default_factory=set)  # keys of URLs in flight at the start: never sent as seen
    # (arc start, arc end, key) of pages whose release was held when their arc was read: sent as seen in chunks
    # of their own once released, before the last chunk (`Handoff._fill`)
    withheld: list[tuple[int, int, bytes]] = field(default_factory=list)
    withheld_since: float | None = None  # when the transfer first waited for them
    made: int = 0  # chunks made so far (the next chunk's seq)
    # the group of consecutive arcs being gathered into chunks
    group: list[tuple[int, int]] = field(default_factory=list)
    g_items: list[QueuedUrl] = field(default_factory=list)
    g_seen: list[bytes] = field(default_factory=list)
    g_states: list[HostState] = field(default_factory=list)
    g_revisits: list[RevisitRecord] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """Every chunk is made (and `last` known)."""
        return self.last is not None


class Sending:
    """Outgoing transfers: make the chunks, send and re-send them, drop the arcs once all are acknowledged."""

    if TYPE_CHECKING:
        # What this part uses of the Handoff it is mixed into: attributes and its other parts' methods.
        chunks_resent: int
        chunks_sent: int
        config: HandoffConfig
        _deferred: bool
        delegate: HandoffDelegate
        _dropping: int
        _hosts_here: np.ndarray | None
        keys_sent: int
        keys_withheld: int
        links: HandoffLinks
        _marked: dict[int, tuple[ArcSet, set[bytes]]]
        node_id: str
        transfers_unneeded: int
        _outgoing: dict[int, Outgoing]
        revisits_sent: int
        store: NodeStore
        transfers_completed: int
        urls_sent: int
        _wake: trio.Event | None
        wall_clock: Callable[[], float]
        withheld_expired: int

        def _expire(self, now: float) -> None: ...
        def _start_quiet(self) -> None: ...

    def _start_transfer(self, transfer_id: int, epoch: int, peer: str, arcs: ArcSet, *, quiet: bool = False) -> bool:
        """Start a transfer: find the arcs holding anything here (one pass over the hosts, located on the ring
        with numpy); their content is read a few arcs at a time as chunks are needed (`_fill`). A `quiet` one
        that finds nothing is over at once, with no message: its peer waits for nothing from us. Returns whether
        the transfer is under way."""
        todo = self._occupied(arcs)
        if quiet and not todo:
            self._marked.pop(transfer_id, None)
            self.transfers_unneeded += 1
            return False
        in_flight = set(queued_url_keys(self.store.frontier.in_flight_items())) if todo else set()
        self._outgoing[transfer_id] = transfer = Outgoing(
            transfer_id=transfer_id, epoch=epoch, peer=peer, chunks={}, last=None, arcs=[], todo=todo,
            in_flight=in_flight,
        )
        if not todo:  # nothing to move, but the receiver still learns that the transfer is complete
            start, end = (arcs._starts_view[0], arcs._ends_view[0]) if len(arcs) else (0, 0)
            transfer.chunks[0] = Chunk(seq=0, start=start, end=end)
            transfer.made, transfer.last = 1, 0
        log.info("hand-off started", extra={"peer": peer, "arcs": len(arcs), "occupied": len(todo)})
        return True

    def _fill(self, transfer: Outgoing, wanted: int, budget: int) -> int:
        """Make chunks until `wanted` are unsent or every arc is read, reading `arcs_per_read` arcs at a time:
        the URLs, states, seen keys and revisit schedules of each arc, one read transaction per database.
        Consecutive arcs share chunks: one chunk names the arc covering its group (entries are validated against
        it), so a join that moves thousands of small arcs sends a few dozen chunks, not one or more per arc. A
        wrapping arc is a group of its own. Reads at most `budget` arcs (at least one batch); returns how many."""
        limit = self.config.urls_per_chunk
        read = 0
        for _ in range(len(transfer.todo) + 1):  # bounded: each round reads arcs or finishes
            if (transfer.done or read >= budget
                    or sum(1 for c in transfer.chunks.values() if c.sent_at is None) >= wanted):
                return read
            batch = transfer.todo[transfer.read:transfer.read + min(self.config.arcs_per_read, budget - read)]
            read += len(batch)
            transfer.read += len(batch)
            if batch:
                frontier = self.store.frontier.export_arcs(batch)
                seen_keys = self.store.dedup.scan_arcs(batch)
                revisits = self.store.revisits.export_arcs(batch)  # the pages' schedules move too
                held = self.delegate.held_keys()
            for index, (start, end) in enumerate(batch):
                items, states = frontier[index]
                # keys of URLs in flight here are not sent either: a URL is never marked seen at the new owner
                # unless it is queued there or was fetched here
                queued = set(queued_url_keys(items)) | transfer.in_flight
                seen = [key for key in seen_keys[index] if key not in queued]
                if held:  # fetched, but their links not safe yet: sent once they are (below)
                    late = [key for key in seen if key in held]
                    if late:
                        self.keys_withheld += len(late)
                        transfer.withheld.extend((start, end, key) for key in late)
                        seen = [key for key in seen if key not in held]
                arc_revisits = revisits[index]
                if not (items or states or seen or arc_revisits):
                    continue
                transfer.arcs.append((start, end))
                self.urls_sent += len(items)
                self.keys_sent += len(seen)
                wraps = end != 0 and end < start or end == 0
                if wraps or (transfer.group and len(transfer.g_items) + len(transfer.g_seen) // 5 + len(items) > limit):
                    self._flush(transfer)
                transfer.group.append((start, end))
                transfer.g_items.extend(items)
                transfer.g_seen.extend(seen)
                transfer.g_states.extend(states)
                transfer.g_revisits.extend(arc_revisits)
                if wraps:
                    self._flush(transfer)
            if transfer.read >= len(transfer.todo):
                self._flush(transfer)
                if transfer.withheld and not self._send_withheld(transfer):
                    return read  # the last chunk waits for them (looked at again at the next `run` round)
                newest = transfer.chunks.get(transfer.made - 1)
                if transfer.made == 0 or newest is None or newest.sent_at is not None:
                    # nothing made, or the newest chunk already went out without the mark: an empty final chunk
                    start, end = transfer.todo[0]
                    transfer.chunks[transfer.made] = Chunk(seq=transfer.made, start=start, end=end)
                    transfer.made += 1
                transfer.last = transfer.made - 1
        return read

    def _send_withheld(self, transfer: Outgoing) -> bool:
        """The keys `_fill` withheld, once none of their pages' releases is held any more: each arc's in chunks
        of their own. False while one still is (at most `withhold_limit`: then they go all the same)."""
        held = self.delegate.held_keys()
        still = sum(1 for _start, _end, key in transfer.withheld if key in held)
        if still:
            now = trio.current_time()
            if transfer.withheld_since is None:
                transfer.withheld_since = now
            if now - transfer.withheld_since < min(self.config.withhold_limit, self.config.wait * 2 / 3):
                return False
            self.withheld_expired += still
            log.warning("pages whose links are not yet safe elsewhere handed off as fetched after the wait",
                        extra={"peer": transfer.peer, "pages": still})
        by_arc: dict[tuple[int, int], list[bytes]] = {}
        for start, end, key in transfer.withheld:
            by_arc.setdefault((start, end), []).append(key)
        transfer.withheld = []
        for (start, end), keys in by_arc.items():
            transfer.group.append((start, end))
            transfer.g_seen.extend(keys)
            self.keys_sent += len(keys)
            self._flush(transfer)
        return True

    def _flush(self, transfer: Outgoing) -> None:
        """The gathered group's chunks, added to the transfer."""
        if not transfer.group:
            return
        cover = ArcMove(start=transfer.group[0][0], end=transfer.group[-1][1], previous=self.node_id,
                        next=transfer.peer)
        chunks = self._cut(transfer.made, cover, transfer.g_items, transfer.g_seen, transfer.g_states,
                           transfer.g_revisits)
        for chunk in chunks:
            transfer.chunks[chunk.seq] = chunk
            transfer.kept.extend(chunk.keys)
            self.revisits_sent += len(chunk.revisits)
        transfer.made += len(chunks)
        transfer.group, transfer.g_items, transfer.g_seen, transfer.g_states, transfer.g_revisits = [], [], [], [], []

    def _occupied(self, arcs: ArcSet) -> list[tuple[int, int]]:
        """The arcs holding a host with queued URLs or a politeness state here, in send order (by start; the
        wrapping arc, if any, last). A join moves tens of thousands of small arcs, most of them empty: the hosts'
        positions are read off their keys in one pass and located on the arcs with numpy, instead of three store
        scans per arc. Seen keys of hosts with neither are left behind: they only spare the new owner a duplicate
        fetch, and the sweep and later hand-offs never need them."""
        if not len(arcs):
            return []
        if self._hosts_here is None:
            raw = np.frombuffer(self.store.frontier.host_positions(), dtype=">u8").astype(np.uint64)
            self._hosts_here = np.unique(raw)  # sorted: two searches per arc then tell which arcs hold a host
        if not len(self._hosts_here):
            return []
        if len(self._hosts_here) < len(arcs):  # fewer hosts than arcs (a joiner's seeds): locate the hosts
            found = np.unique(arcs.locate(self._hosts_here))
            found = found[found >= 0]
        else:  # fewer arcs: two binary searches per arc into the hosts
            found = arcs.occupied(self._hosts_here)
        return list(zip(arcs.starts[found].tolist(), arcs.ends[found].tolist()))

    def _cut(
        self, first: int, arc: ArcMove, items: Sequence[QueuedUrl], keys: Sequence[bytes], states: Sequence[HostState],
        revisits: Sequence[RevisitRecord] = (),
    ) -> list[Chunk]:
        """One arc's chunks, of one kind each (states, then URLs, then keys, then revisit schedules), numbered from
        `first`."""
        config = self.config
        chunks: list[Chunk] = []

        def add(
            urls: tuple[UrlEntry, ...] = (), keys: tuple[bytes, ...] = (), states: tuple[HostState, ...] = (),
            revisits: tuple[RevisitRecord, ...] = (),
        ) -> None:
            chunks.append(
                Chunk(seq=first + len(chunks), start=arc.start, end=arc.end, urls=urls, keys=keys, states=states,
                       revisits=revisits)
            )

        for i in range(0, len(states), config.hosts_per_chunk):
            add(states=tuple(states[i : i + config.hosts_per_chunk]))
        batch: list[UrlEntry] = []
        size = 0
        for item in items:
            cost = len(item.url) + len(item.found_on or "") + 16
            if batch and (len(batch) >= config.urls_per_chunk or size + cost > config.url_bytes_per_chunk):
                add(urls=tuple(batch))
                batch, size = [], 0
            batch.append(UrlEntry(url=item.url, depth=item.depth, found_on=item.found_on, hops=item.hops,
                                  lastmod=item.lastmod, sitemap=item.sitemap))
            size += cost
        if batch:
            add(urls=tuple(batch))
        for i in range(0, len(keys), config.keys_per_chunk):
            add(keys=tuple(keys[i : i + config.keys_per_chunk]))
        for i in range(0, len(revisits), config.revisits_per_chunk):
            add(revisits=tuple(revisits[i : i + config.revisits_per_chunk]))
        return chunks

    # -- sending --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send new chunks and re-send unacknowledged ones every `interval`, until cancelled."""
        self._run = self.store.outbox.new_run()
        task_status.started()
        while True:
            if self.pump():  # chunks still to make, and room for them: go on after a checkpoint
                await trio.sleep(0)
                continue
            # otherwise after `interval`, or as soon as a pump made elsewhere (an ack's) stops with more to make
            self._wake = trio.Event()
            with trio.move_on_after(self.config.interval):
                await self._wake.wait()

    def pump(self) -> bool:
        """Send what the window allows and re-send chunks older than `resend_after`. Makes chunks by reading at
        most a few batches of arcs (a short step of the event loop); returns whether it stopped for that with
        chunks still to make."""
        self._start_quiet()
        now = trio.current_time()
        self._expire(now)
        budget = self.config.arcs_per_read  # arcs read per pump, over all transfers: a short step
        for transfer in list(self._outgoing.values()):
            in_flight = sum(1 for chunk in transfer.chunks.values() if chunk.sent_at is not None)
            if budget > 0:
                budget -= self._fill(transfer, self.config.window - in_flight, budget)
            for chunk in sorted(transfer.chunks.values(), key=lambda c: c.seq):
                resend = chunk.sent_at is not None and now - chunk.sent_at >= self.config.resend_after
                fresh = chunk.sent_at is None and in_flight < self.config.window
                if not (resend or fresh):
                    continue
                if not self.links.send_nowait(transfer.peer, self._message(transfer, chunk)):
                    break  # the link queue is full: try again at the next tick
                if resend:
                    self.chunks_resent += 1
                else:
                    self.chunks_sent += 1
                    in_flight += 1
                chunk.sent_at = now
        more = self._deferred or (budget <= 0 and any(not transfer.done for transfer in self._outgoing.values()))
        if more and self._wake is not None:
            self._wake.set()  # `run` goes on at once
        return more

    def _message(self, transfer: Outgoing, chunk: Chunk) -> HandoffChunk:
        wall = self.wall_clock()  # ready_in is measured at each send, so a re-sent chunk is still right
        hosts = tuple(
            WireHostState(
                host=state.host, crawl_delay=max(0.0, state.crawl_delay),
                ready_in=max(0.0, state.next_allowed - wall), failures=state.failures,
                pages=state.pages, bytes=state.bytes,
            )
            for state in chunk.states
        )
        revisits = tuple(
            RevisitEntry(url=r.url, depth=r.depth, due_in=max(0.0, r.due - wall), queued=r.queued,
                         interval=r.interval, etag=_on_wire(r.etag), last_modified=_on_wire(r.last_modified),
                         digest=r.digest, stored_at=max(0.0, r.stored_at), size=r.size, changed=r.changed,
                         unchanged=r.unchanged)
            for r in chunk.revisits
        )
        return HandoffChunk(
            transfer_id=transfer.transfer_id, chunk_seq=chunk.seq, epoch=transfer.epoch,
            arc_start=chunk.start, arc_end=chunk.end, urls=chunk.urls, seen_keys=chunk.keys,
            hosts=hosts, last=chunk.seq == transfer.last, revisits=revisits,
        )

    async def _acked(self, peer_id: str, ack: HandoffAck) -> None:
        transfer = self._outgoing.get(ack.transfer_id)
        if transfer is None or transfer.peer != peer_id:
            return  # a late duplicate ack of a finished transfer
        transfer.chunks.pop(ack.chunk_seq, None)
        if transfer.chunks or not transfer.done:
            self.pump()  # room in the window: send the next chunk now, not at the next tick
            return
        # Every chunk is durably at the new owner: only now does the arc's state leave this node, a few dozen
        # arcs per transaction with a checkpoint between, so a leaving node's thousands of arcs do not stall the
        # event loop. The keys of the URLs it queued go (they were not fetched here); the fetched pages' keys it
        # sent stay, and so do those marked seen here meanwhile as the new owner's backup (`marked_seen`: one
        # set, which marks that come while the drop goes on join too).
        del self._outgoing[transfer.transfer_id]
        self._dropping += 1
        try:
            keep = self._marked.get(transfer.transfer_id, (None, set()))[1]
            keep.update(transfer.kept)
            step = self.config.arcs_per_drop
            for i in range(0, len(transfer.arcs), step):
                self.store.drop_arcs(transfer.arcs[i:i + step], keep)
                await trio.lowlevel.checkpoint()
            # No sync here: nothing depends on the drop being durable. Should the process die before the store's
            # next sync, the arcs' content comes back at restart, outside this node's arcs, and the sweep hands it
            # to its owner, whose dedup ignores it (every URL of it is seen there). An fsync after a leaving
            # node's drop of everything took 40-250 ms of the event loop.
        finally:
            self._dropping -= 1
            self._marked.pop(transfer.transfer_id, None)
        self.transfers_completed += 1
        log.info("hand-off complete", extra={"peer": peer_id, "arcs": len(transfer.arcs), "chunks": transfer.made})
