"""Arc hand-off: when the view changes, the previous owner of each moved arc streams its state to the new owner.

DESIGN decision 6: the queued URLs, the seen-URL keys and the hosts' politeness state of an arc go to its new
owner in `HandoffChunk`s; the old owner keeps all of it until every chunk of the arc is acknowledged, and only
then deletes it. The receiver applies chunks idempotently and acknowledges only after `sync()`, so a lost
chunk, a lost ack, a re-send and a receiver restart all end with each URL queued once at the new owner.

Why the receiver can apply chunks in any order and any number of times: queued URLs go through `store.admit`
(dedup + frontier in one transaction), and the seen keys sent are those of the arc *minus* the keys of the
queued URLs being sent, so a URL is never marked seen before it is queued. Host states are merged by keeping
the later `next_allowed`. See docs/cluster.md, "Hand-off", for the politeness rule.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from protocol import HandoffAck, HandoffChunk, Message, RevisitEntry, UrlEntry
from protocol import HostState as WireHostState
from ring import RING_SPACE, ArcMove, Ring, diff, host_position
from storage import HostState, NodeStore, QueuedUrl, RevisitRecord, in_arc, queued_url_keys

from peer.config import DEFAULTS
from peer.crawl.urls import host_of_normalized, normalize

__all__ = ["Alone", "ArcSet", "Handoff", "HandoffConfig", "HandoffDelegate", "HandoffLinks", "Hold", "handoff_arcs"]

log = logging.getLogger(__name__)

_KEY_POSITION = 8  # a seen-URL key begins with the host's 8-byte ring position


class HandoffLinks(Protocol):
    """What the hand-off needs of `PeerLinks`: queue a message for a peer (False if its queue is full)."""

    def send_nowait(self, peer_id: str, message: Message) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffConfig:
    """Hand-off tuning; every default has its reason."""

    # 10,000 keys of 16 bytes is about 200 KB of msgpack: a fifth of the 1 MiB frame limit.
    keys_per_chunk: int = 10_000
    # URL chunks are cut by bytes too: 512 KB of URL text leaves half the frame for framing and fields.
    urls_per_chunk: int = 2_000
    url_bytes_per_chunk: int = 512 * 1024
    # A host state is at most about 280 bytes on the wire: 1,000 of them is under 300 KB.
    hosts_per_chunk: int = 1_000
    # A revisit schedule entry is a URL plus about 120 bytes: 1,000 of them is at most about 2.2 MB of URL text
    # in theory, but typical URLs (under 200 bytes) keep it near 300 KB.
    revisits_per_chunk: int = 1_000
    # Unacknowledged chunks per transfer: enough to keep a link busy, bounded so memory in the link queue is.
    window: int = 8
    # A chunk with no ack after this long is sent again (the link layer delivers at most once per connection).
    resend_after: float = 5.0
    # How often `run` looks for chunks to send or re-send.
    interval: float = 0.2
    # A gained arc waits at most this long for its previous owner's transfer: views that reached the two nodes
    # by different paths (or a previous owner that restarted) must not block its hosts forever. The operator's
    # setting handoff_wait: default and reason in peer.config (FIELDS).
    wait: float = DEFAULTS["handoff_wait"]


def handoff_arcs(moves: Iterable[ArcMove]) -> list[ArcMove]:
    """Moves as wire arcs: a move ending at 2**64 and one starting at 0 with the same owners become one
    wrapping arc (end < start), and an end of 2**64 is written 0. Both sides use this, so they agree on arcs."""
    arcs = list(moves)
    if len(arcs) >= 2:
        first, final = arcs[0], arcs[-1]
        if (
            first.start == 0
            and final.end == RING_SPACE
            and (first.previous, first.next) == (final.previous, final.next)
        ):
            arcs = [ArcMove(start=final.start, end=first.end, previous=first.previous, next=first.next), *arcs[1:-1]]
    return [  # moves are immutable: only one ending at 2**64 needs a new record
        a if a.end < RING_SPACE else ArcMove(start=a.start, end=a.end % RING_SPACE, previous=a.previous, next=a.next)
        for a in arcs
    ]


@dataclass(slots=True)
class _Chunk:
    seq: int
    start: int  # the arc its content lies in
    end: int
    urls: tuple[UrlEntry, ...] = ()
    keys: tuple[bytes, ...] = ()
    states: tuple[HostState, ...] = ()
    revisits: tuple[RevisitRecord, ...] = ()
    sent_at: float | None = None


@dataclass(slots=True)
class _Outgoing:
    transfer_id: int
    epoch: int
    peer: str
    chunks: dict[int, _Chunk]  # unacknowledged chunks by seq
    last: int
    arcs: list[tuple[int, int]]  # the arcs with content, dropped here once every chunk is acknowledged
    # Seen keys sent, all of fetched pages: they stay here after the drop. Nothing here looks them up while
    # the arc is elsewhere, and if it comes back before its keys do (a joiner whose first ring was stale hands
    # on what it just received, then gains it again), they keep those pages from being fetched again.
    kept: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class _Incoming:
    applied: set[int] = field(default_factory=set)
    last: int | None = None
    complete: bool = False


class _ArcSet:
    """Disjoint arcs with a bisect lookup; at most one of them wraps (then it sorts last by start)."""

    def __init__(self, arcs: Iterable[tuple[int, int]]) -> None:
        self.arcs = sorted(arcs)
        self.starts = [start for start, _ in self.arcs]
        self._length: int | None = None

    def length(self) -> int:
        """The positions the arcs cover (equal bounds: the whole ring); computed once, on first use."""
        if self._length is None:
            self._length = sum((end - start) % RING_SPACE or RING_SPACE for start, end in self.arcs)
        return self._length

    def __contains__(self, position: int) -> bool:
        return self.find(position) is not None

    def find(self, position: int) -> tuple[int, int] | None:
        """The arc holding `position`, or None."""
        if not self.arcs:
            return None
        index = bisect.bisect_right(self.starts, position) - 1
        arc = self.arcs[index]  # index -1 is the last arc: the wrapping one, if any
        return arc if in_arc(position, *arc) else None


ArcSet = _ArcSet  # disjoint arcs with a bisect look-up (the cluster holds inherited arcs in one)


#: Given a callback, calls it once what an applied chunk queued is held by this node's backups too.
Hold = Callable[[Callable[[], None]], None]


class HandoffDelegate(Protocol):
    """What the hand-off asks of the node around it (memberlist's delegate): one protocol, not loose callables.
    `Alone` is the default for a hand-off on its own (tests); the cluster implements it for a node."""

    def busy_positions(self) -> Iterable[int]:
        """Ring positions of the hosts being fetched here now: a transfer starts once none lies in its arcs, so
        the host states it carries include the last fetch (the politeness rule, docs/cluster.md)."""

    def applied(self, new: list[QueuedUrl], states: list[HostState]) -> Hold | None:
        """An applied chunk queued `new` and set `states`: wake those hosts, take over their timers. A `Hold`
        when the chunk may not be acknowledged yet (its URLs are on their way to this node's ring backups,
        `--replicas`): the hand-off acknowledges it when the hold calls back."""

    def owner_of(self, host: str) -> str:
        """The owner of `host` under this node's current view. Chunk content for hosts owned elsewhere (the arc
        moved on, or our view is older) is forwarded through the outbox instead of being stored here, where a
        later hand-off of that arc could drop it with the arc."""

    def keys_arrived(self, keys: list[bytes]) -> None:
        """The seen keys of an applied chunk (a sender sends only keys of pages it fetched), to replicate, or to
        pass on to an owner elsewhere."""

    def discarded(self, items: list[QueuedUrl]) -> None:
        """URLs queued here that an applied chunk says its sender already fetched: dropped from the frontier
        (their replicas at the backups go too)."""

    def foreign_states(self, states: list[WireHostState]) -> None:
        """Politeness states of an applied chunk for hosts owned elsewhere under this node's ring: not stored
        here (nothing here would hand them on) but passed on to their owner."""


class Alone:
    """The hand-off's delegate when no cluster is around it: this node owns every host, nothing is busy."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def busy_positions(self) -> Iterable[int]:
        return ()

    def applied(self, new: list[QueuedUrl], states: list[HostState]) -> Hold | None:
        return None

    def owner_of(self, host: str) -> str:
        return self.node_id

    def keys_arrived(self, keys: list[bytes]) -> None:
        pass

    def discarded(self, items: list[QueuedUrl]) -> None:
        pass

    def foreign_states(self, states: list[WireHostState]) -> None:
        pass


class Handoff:
    """Both ends of the hand-off for one node: outgoing transfers of lost arcs, incoming chunks of gained ones.

    A transfer is everything this node hands to one peer at one view epoch: one chunk sequence (numbered from
    0, the final one marked `last`) over the arcs that hold anything; each chunk names the arc its content
    lies in. `view_changed(epoch, old, new)` starts the transfers; `run` sends and re-sends chunks;
    `on_message` takes `HandoffChunk` and `HandoffAck`. The crawler consults `blocked(position)` before
    fetching a host and stops fetching hosts in `lost_arcs()`.
    """

    def __init__(
        self,
        node_id: str,
        store: NodeStore,
        links: HandoffLinks,
        *,
        config: HandoffConfig = HandoffConfig(),
        wall_clock: Callable[[], float] = time.time,
        delegate: HandoffDelegate | None = None,
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.links = links
        self.config = config
        self.wall_clock = wall_clock  # host states keep wall-clock next_allowed; the wire carries durations
        # What the hand-off asks of the node around it (the cluster), as one named protocol.
        self.delegate: HandoffDelegate = delegate if delegate is not None else Alone(node_id)
        # peer -> ring ids of its completed transfers. Transfers are labelled with the id of the ring they hand
        # off to (not the view epoch: two nodes can number the same ring differently), so both ends agree.
        self._completed: dict[str, set[int]] = {}
        self._ring_id: int | None = None
        self.urls_forwarded = 0
        self.urls_discarded = 0  # queued here, but the previous owner had already fetched them
        self._run = 0  # the store's run counter, set by `run`: transfer ids never repeat an earlier process's
        self._transfers = 0
        # transfers not started yet: (transfer id, ring id, peer, arcs, the ring it hands off to (None: a sweep))
        self._waiting: list[tuple[int, int, str, list[ArcMove], Ring | None]] = []
        self._outgoing: dict[int, _Outgoing] = {}
        self._incoming: dict[tuple[str, int], _Incoming] = {}
        # chunks applied here whose ack waits for their URLs' replicas: (sender, transfer, chunk) -> None
        self._held: dict[tuple[str, int, int], None] = {}
        self.acks_held = 0  # chunks whose ack waited for their replicas
        self._lost = _ArcSet(())  # arcs lost at the latest view change
        self._pending: dict[tuple[str, int], _ArcSet] = {}  # (previous owner, epoch) -> arcs gained from it
        self._pending_since: dict[tuple[str, int], float | None] = {}
        self.chunks_sent = 0
        self.chunks_resent = 0
        self.chunks_applied = 0
        self.transfers_completed = 0
        self.transfers_received = 0
        self.waits_expired = 0  # gained arcs released after `wait` without their transfer
        self.urls_sent = 0  # queued URLs exported in transfers
        self.urls_received = 0  # queued URLs that arrived in chunks and were new here
        self.revisits_sent = 0  # revisit schedule entries sent in transfers
        self.revisits_received = 0  # ... and applied here
        self.keys_sent = 0

    # -- view changes --

    def view_changed(
        self,
        epoch: int,
        old: Ring,
        new: Ring,
        *,
        gone: Iterable[str] = (),
        gains_from: Ring | None = None,
        arcs: Sequence[ArcMove] | None = None,
        gain_arcs: Sequence[ArcMove] | None = None,
    ) -> list[ArcMove]:
        """Start handing off the arcs this node loses from `old` to `new`, and note the arcs it gains.

        `gone` names previous owners that will send nothing (dead nodes): their arcs are not waited for.
        `gains_from` is the ring to compute gained arcs against when it is not `old`: a node that just joined
        had only itself in `old`, but the arcs it gains come from the owners in the cluster's previous ring.
        `arcs` and `gain_arcs` may carry `handoff_arcs(diff(old, new))` and `handoff_arcs(diff(gains_from, new))`
        computed beforehand (in a worker thread: a diff of rings of many points takes a while).
        Returns the arcs this node loses (as `handoff_arcs`, so a wrapping arc is one).
        """
        if not 0 <= epoch < 1 << 64:
            raise ValueError(f"ring id {epoch} must be in [0, 2**64)")
        self._ring_id = epoch
        gone = set(gone)
        arcs = list(arcs) if arcs is not None else handoff_arcs(diff(old, new))
        lost = [a for a in arcs if a.previous == self.node_id]
        self._lost = _ArcSet((a.start, a.end) for a in lost)
        by_peer: dict[str, list[ArcMove]] = {}
        for arc in lost:
            if arc.next is not None:
                by_peer.setdefault(arc.next, []).append(arc)
        for peer in sorted(by_peer):
            self._waiting.append((self._next_transfer_id(), epoch, peer, by_peer[peer], new))
        # Every other owner of the new ring hears "nothing more from me up to this ring" (an empty transfer,
        # after any earlier one to it): a receiver that saw the rings in another order, and waits for arcs this
        # node labelled with a ring it never adopted, is released by it instead of by the wait timeout.
        for peer in sorted(set(new.nodes) - set(by_peer) - {self.node_id}):
            self._waiting.append((self._next_transfer_id(), epoch, peer, [], new))
        self._start_quiet()
        if gain_arcs is not None:
            arcs = list(gain_arcs)
        elif gains_from is not None:
            arcs = handoff_arcs(diff(gains_from, new))
        gained: dict[str, list[tuple[int, int]]] = {}
        for arc in arcs:
            if arc.next == self.node_id and arc.previous is not None and arc.previous not in gone:
                gained.setdefault(arc.previous, []).append((arc.start, arc.end))
        for peer, peer_arcs in gained.items():
            if epoch in self._completed.get(peer, ()):
                self._release(peer, epoch)  # its transfer for this ring arrived before we adopted the ring
                continue
            self._pending[(peer, epoch)] = _ArcSet(peer_arcs)
            self._pending_since[(peer, epoch)] = None  # the next pump starts the clock
        # A peer whose transfer to this ring arrived before we adopted it has nothing more for us up to this
        # ring, so it releases what we still wait for from it under older rings too, even if it hands us nothing
        # in this one (a joiner whose first ring still held a leaving node waited 30 s for such arcs).
        for peer in {key[0] for key in self._pending}:
            if epoch in self._completed.get(peer, ()):
                self._release(peer, epoch)
        return lost

    def sweep(self, epoch: int, owner_of: Callable[[str], str], hosts: Iterable[str]) -> int:
        """Hand off the state of `hosts` this node holds but does not own (a chunk that arrived after the
        arc moved on, a restart with an older view): each host's point of the ring becomes a one-position
        arc sent to its owner. Returns how many hosts were swept."""
        by_peer: dict[str, dict[int, ArcMove]] = {}
        for host in hosts:
            owner = owner_of(host)
            if owner == self.node_id:
                continue
            position = host_position(host)
            by_peer.setdefault(owner, {})[position] = ArcMove(
                start=position, end=(position + 1) % RING_SPACE, previous=self.node_id, next=owner
            )
        for peer, arcs in sorted(by_peer.items()):
            self._waiting.append((self._next_transfer_id(), epoch, peer, list(arcs.values()), None))
        self._start_quiet()
        return sum(len(arcs) for arcs in by_peer.values())

    def _next_transfer_id(self) -> int:
        self._transfers += 1
        return self._run << 40 | self._transfers

    def _start_quiet(self) -> None:
        """Start the waiting transfers that may go now. A transfer waits while
        - a fetch is in flight here in one of its arcs (the states it carries must include that fetch), or of any
          host the ring it hands off to gives its peer: a complete transfer to the peer's ring releases every arc
          the peer waits for from us, even one whose content went elsewhere first (to a node that owned it in a
          ring between), so even a transfer with no arcs must not release a host we are fetching;
        - an earlier transfer to the same peer is unacknowledged (a complete transfer to the receiver's ring
          releases every arc it waits for from us, so it must not overtake one still streaming);
        - one of its arcs is still awaited here from its previous owner (an arc that moves on while it arrives
          must reach its next owner with the timers and keys it is bringing, not without them);
        - a transfer to an older ring, to any peer, is still waiting or unacknowledged: it may carry the timers
          of hosts this ring gives this peer (to the node that owned them in the ring between, which passes
          them on), and "nothing more from me up to this ring" must not release those hosts before."""
        if not self._waiting:
            return
        busy = list(self.delegate.busy_positions())
        sending = {transfer.peer for transfer in self._outgoing.values()}
        # (transfer id, ring id) of every transfer not yet acknowledged, started or not
        open_transfers = [(t.transfer_id, t.epoch) for t in self._outgoing.values()]
        open_transfers += [(w[0], w[1]) for w in self._waiting]
        awaited = [arc for arcs in self._pending.values() for arc in arcs.arcs]
        still: list[tuple[int, int, str, list[ArcMove], Ring | None]] = []
        for transfer_id, epoch, peer, arcs, ring in self._waiting:
            arc_set = _ArcSet((arc.start, arc.end) for arc in arcs)
            if (
                peer in sending
                or any(position in arc_set for position in busy)
                or (ring is not None and peer in ring.weights and peer in ring.owners_at(busy))
                or any(start in arc_set for start, _ in awaited)
                or any(arc.start in pending for arc in arcs for pending in self._pending.values())
                or any(tid < transfer_id and ring_id != epoch for tid, ring_id in open_transfers)
            ):
                still.append((transfer_id, epoch, peer, arcs, ring))
                sending.add(peer)  # keep this peer's later transfers behind this one
            else:
                self._start_transfer(transfer_id, epoch, peer, arcs)
                sending.add(peer)
        self._waiting = still

    def _start_transfer(self, transfer_id: int, epoch: int, peer: str, arcs: list[ArcMove]) -> None:
        chunks: list[_Chunk] = []
        with_content: list[tuple[int, int]] = []
        urls = keys = 0
        occupied = self._occupied(arcs)
        in_flight = set(queued_url_keys(self.store.frontier.in_flight_items())) if occupied else set()
        # Consecutive occupied arcs share chunks: one chunk names the arc covering its group (entries are
        # validated against it), so a join that moves thousands of small arcs sends a few dozen chunks, not one
        # or more per arc. A wrapping arc is a group of its own.
        group: list[ArcMove] = []
        g_items: list[QueuedUrl] = []
        g_seen: list[bytes] = []
        g_states: list[HostState] = []
        g_revisits: list[RevisitRecord] = []

        def flush() -> None:
            if group:
                cover = ArcMove(start=group[0].start, end=group[-1].end, previous=group[0].previous,
                                next=group[0].next)
                chunks.extend(self._cut(len(chunks), cover, g_items, g_seen, g_states, g_revisits))
                group.clear()
                g_items.clear()
                g_seen.clear()
                g_states.clear()
                g_revisits.clear()

        budget = self.config.urls_per_chunk
        for arc in sorted(arcs, key=lambda a: (a.end < a.start and a.end != 0, a.start)):
            if (arc.start, arc.end) not in occupied:
                continue
            items, states = self.store.frontier.export_arc(arc.start, arc.end)
            # keys of URLs in flight here are not sent either: a URL is never marked seen at the new owner
            # unless it is queued there or was fetched here
            queued = set(queued_url_keys(items)) | in_flight
            seen = [key for key in self.store.dedup.scan(arc.start, arc.end) if key not in queued]
            revisits = self.store.revisits.export_arc(arc.start, arc.end)  # the pages' schedules move too
            if not (items or states or seen or revisits):
                continue
            with_content.append((arc.start, arc.end))
            urls, keys = urls + len(items), keys + len(seen)
            wraps = arc.end != 0 and arc.end < arc.start or arc.end == 0
            if wraps or (group and len(g_items) + len(g_seen) // 5 + len(items) > budget):
                flush()
            group.append(arc)
            g_items.extend(items)
            g_seen.extend(seen)
            g_states.extend(states)
            g_revisits.extend(revisits)
            if wraps:
                flush()
        flush()
        self.urls_sent += urls
        self.keys_sent += keys
        self.revisits_sent += sum(len(chunk.revisits) for chunk in chunks)
        if not chunks:  # nothing to move, but the receiver still learns that the transfer is complete
            chunks.append(_Chunk(seq=0, start=arcs[0].start if arcs else 0, end=arcs[0].end if arcs else 0))
        self._outgoing[transfer_id] = _Outgoing(
            transfer_id=transfer_id, epoch=epoch, peer=peer, chunks={chunk.seq: chunk for chunk in chunks},
            last=chunks[-1].seq, arcs=with_content, kept=[key for chunk in chunks for key in chunk.keys],
        )
        log.info("hand-off started", extra={"peer": peer, "urls": urls, "keys": keys, "chunks": len(chunks)})

    def _occupied(self, arcs: Sequence[ArcMove]) -> set[tuple[int, int]]:
        """The arcs holding a host with queued URLs or a politeness state here. A join moves tens of thousands
        of small arcs, most of them empty: finding the occupied ones from the hosts here costs one pass over the
        hosts instead of three store scans per arc. Seen keys of hosts with neither are left behind: they only
        spare the new owner a duplicate fetch, and the sweep and later hand-offs never need them."""
        arc_set = _ArcSet((arc.start, arc.end) for arc in arcs)
        found: set[tuple[int, int]] = set()
        hosts = {host for host, _ in self.store.frontier.hosts()}
        hosts.update(state.host for state in self.store.frontier.states())
        for host in hosts:
            arc = arc_set.find(host_position(host))
            if arc is not None:
                found.add(arc)
        return found

    def _cut(
        self, first: int, arc: ArcMove, items: Sequence[QueuedUrl], keys: Sequence[bytes], states: Sequence[HostState],
        revisits: Sequence[RevisitRecord] = (),
    ) -> list[_Chunk]:
        """One arc's chunks, of one kind each (states, then URLs, then keys, then revisit schedules), numbered from
        `first`."""
        config = self.config
        chunks: list[_Chunk] = []

        def add(
            urls: tuple[UrlEntry, ...] = (), keys: tuple[bytes, ...] = (), states: tuple[HostState, ...] = (),
            revisits: tuple[RevisitRecord, ...] = (),
        ) -> None:
            chunks.append(
                _Chunk(seq=first + len(chunks), start=arc.start, end=arc.end, urls=urls, keys=keys, states=states,
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

    # -- what the crawler consults --

    def lost(self, position: int) -> bool:
        """Whether a host at ring `position` lies in an arc lost at the latest view change: no new fetch of it
        may start here (the crawler's ownership check under the current ring covers earlier changes)."""
        return position in self._lost

    def lost_arcs(self) -> list[tuple[int, int]]:
        """Arcs [start, end) lost at the latest view change, in position order (end <= start: it wraps)."""
        return list(self._lost.arcs)

    def pending_arcs(self) -> list[tuple[int, int]]:
        """Arcs gained whose transfer is not complete: their hosts must not be fetched yet."""
        return [arc for arcs in self._pending.values() for arc in arcs.arcs]

    def progress(self) -> list[tuple[str, bool, float, int]]:
        """Transfers under way, for the dashboard: (peer, True, share of the key space awaited from it, 0) for
        incoming ones, (peer, False, 0.0, chunks not yet acknowledged) for outgoing ones."""
        awaited: dict[str, int] = {}
        for (peer, _epoch), arcs in self._pending.items():
            awaited[peer] = awaited.get(peer, 0) + arcs.length()
        sending: dict[str, int] = {}
        for transfer in self._outgoing.values():
            sending[transfer.peer] = sending.get(transfer.peer, 0) + len(transfer.chunks)
        for _tid, _epoch, peer, _arcs, _ring in self._waiting:
            sending[peer] = sending.get(peer, 0) + 1
        return ([(peer, True, length / RING_SPACE, 0) for peer, length in sorted(awaited.items())]
                + [(peer, False, 0.0, n) for peer, n in sorted(sending.items()) if n])

    def waiting(self) -> bool:
        """Whether any gained arc still waits for its transfer (a cheap check before `blocked`)."""
        return bool(self._pending)

    def blocked(self, position: int) -> bool:
        """Whether a host at ring `position` lies in an incoming arc whose transfer is not complete."""
        return any(position in arcs for arcs in self._pending.values())

    def waits_for(self, peer_id: str) -> bool:
        """Whether gained arcs still wait for a transfer from `peer_id`."""
        return any(key[0] == peer_id for key in self._pending)

    def abandon(self, peer_id: str) -> None:
        """`peer_id` died or left: stop waiting for its arcs (what it held is rebuilt from re-sent batches, or
        reached the owners of its last ring)."""
        for key in [key for key in self._pending if key[0] == peer_id]:
            del self._pending[key]
            self._pending_since.pop(key, None)

    def cancel_to(self, peer_id: str) -> int:
        """`peer_id` left or died: stop the transfers to it. Nothing is dropped: what they carried stays in
        this store, outside our arcs, and `sweep` sends it to the hosts' current owners. Returns how many."""
        gone = [tid for tid, t in self._outgoing.items() if t.peer == peer_id]
        for tid in gone:
            del self._outgoing[tid]
        waiting = len(self._waiting)
        self._waiting = [w for w in self._waiting if w[2] != peer_id]
        return len(gone) + waiting - len(self._waiting)

    def _release(self, peer_id: str, epoch: int) -> None:
        """A transfer from `peer_id` to the ring `epoch` is complete. If that is our current ring, the peer has
        handed off everything it held in arcs that ring gives away, which covers every arc we still wait for
        from it (whatever rings it went through); an older ring's transfer covers only that ring's arcs."""
        self._completed.setdefault(peer_id, set()).add(epoch)
        current = epoch == self._ring_id
        for key in [key for key in self._pending if key[0] == peer_id and (current or key[1] == epoch)]:
            del self._pending[key]
            self._pending_since.pop(key, None)

    def _expire(self, now: float) -> None:
        for key, since in list(self._pending_since.items()):
            if since is None:
                self._pending_since[key] = now
            elif now - since >= self.config.wait:
                self._pending.pop(key, None)
                del self._pending_since[key]
                self.waits_expired += 1
                log.warning("gained arcs released without their hand-off after %.0f s", self.config.wait,
                            extra={"peer": key[0], "epoch": key[1]})

    def outstanding(self) -> int:
        """Chunks sent or to send and not yet acknowledged, over all outgoing transfers (at least one for a
        transfer still waiting for its arcs' fetches to finish)."""
        return sum(len(transfer.chunks) for transfer in self._outgoing.values()) + len(self._waiting)

    # -- sending --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send new chunks and re-send unacknowledged ones every `interval`, until cancelled."""
        self._run = self.store.outbox.new_run()
        task_status.started()
        while True:
            self.pump()
            await trio.sleep(self.config.interval)

    def pump(self) -> None:
        """Send what the window allows and re-send chunks older than `resend_after`."""
        self._start_quiet()
        now = trio.current_time()
        self._expire(now)
        for transfer in list(self._outgoing.values()):
            in_flight = sum(1 for chunk in transfer.chunks.values() if chunk.sent_at is not None)
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

    def _message(self, transfer: _Outgoing, chunk: _Chunk) -> HandoffChunk:
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
                         interval=r.interval, etag=r.etag, last_modified=r.last_modified, digest=r.digest,
                         stored_at=max(0.0, r.stored_at), size=r.size, changed=r.changed, unchanged=r.unchanged)
            for r in chunk.revisits
        )
        return HandoffChunk(
            transfer_id=transfer.transfer_id, chunk_seq=chunk.seq, epoch=transfer.epoch,
            arc_start=chunk.start, arc_end=chunk.end, urls=chunk.urls, seen_keys=chunk.keys,
            hosts=hosts, last=chunk.seq == transfer.last, revisits=revisits,
        )

    def _acked(self, peer_id: str, ack: HandoffAck) -> None:
        transfer = self._outgoing.get(ack.transfer_id)
        if transfer is None or transfer.peer != peer_id:
            return  # a late duplicate ack of a finished transfer
        transfer.chunks.pop(ack.chunk_seq, None)
        if transfer.chunks:
            self.pump()  # room in the window: send the next chunk now, not at the next tick
            return
        # Every chunk is durably at the new owner: only now does the arc's state leave this node.
        del self._outgoing[transfer.transfer_id]
        for start, end in transfer.arcs:
            self.store.frontier.drop_arc(start, end)
            self.store.revisits.drop_arc(start, end)
            self.store.dedup.delete(start, end)  # the keys of the URLs it queued go: they were not fetched here
        self.store.dedup.insert(transfer.kept)
        self.store.sync()
        self.transfers_completed += 1
        log.info("hand-off complete", extra={"peer": peer_id})

    # -- receiving --

    async def on_message(self, peer_id: str, message: Message) -> None:
        """Take a `HandoffChunk` (apply, sync, ack) or a `HandoffAck`; ignore anything else."""
        if isinstance(message, HandoffChunk):
            self._receive(peer_id, message)
        elif isinstance(message, HandoffAck):
            self._acked(peer_id, message)

    def _receive(self, peer_id: str, chunk: HandoffChunk) -> None:
        held = (peer_id, chunk.transfer_id, chunk.chunk_seq)
        if held in self._held:
            return  # a re-send of a chunk whose replicas are on their way: acknowledged when they arrive
        incoming = self._incoming.setdefault((peer_id, chunk.transfer_id), _Incoming())
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
            if not host or not in_arc(host_position(host), start, end):
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
        # a URL already seen here (or applied before) is not queued again
        new = self.store.accept(items, forward) if forward else self.store.admit(items)
        self.urls_received += len(new)
        keys = [
            key for key in chunk.seen_keys
            if len(key) > _KEY_POSITION and in_arc(int.from_bytes(key[:_KEY_POSITION], "big"), start, end)
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
            # URL here before this chunk came, it must not be fetched again.
            wanted = set(keys)
            queued_here, _ = self.store.frontier.export_arc(start, end)
            stale = [i for i, k in zip(queued_here, queued_url_keys(queued_here)) if k in wanted]
            if stale:
                self.urls_discarded += self.store.frontier.discard(stale)
                self.delegate.discarded(stale)
        self.store.dedup.insert(keys)
        if keys:
            self.delegate.keys_arrived(keys)
        states = [self._merge(state) for state in hosts if in_arc(host_position(state.host), start, end)]
        self.store.frontier.put_states(states)
        self._apply_revisits(peer_id, chunk)
        return new, states

    def _apply_revisits(self, peer_id: str, chunk: HandoffChunk) -> None:
        """The moving pages' schedules, in wall-clock terms here. One whose revisit was queued at the sender is
        due now: its URL came in this transfer's queue, or was being fetched there (in-flight URLs stay behind),
        and a revisit must not be forgotten."""
        wall = self.wall_clock()
        records = []
        for entry in chunk.revisits:
            url = normalize(entry.url)  # held to what a link from the web is, as the arc's queued URLs are
            host = host_of_normalized(url) if url is not None else ""
            if not host or not in_arc(host_position(host), chunk.arc_start, chunk.arc_end):
                log.warning("hand-off revisit schedule unusable or outside its arc; dropped", extra={"peer": peer_id})
                continue
            records.append(RevisitRecord(
                url=url, host=host, depth=entry.depth, due=wall if entry.queued else wall + entry.due_in,
                interval=entry.interval, etag=entry.etag, last_modified=entry.last_modified, digest=entry.digest,
                stored_at=entry.stored_at, size=entry.size, changed=entry.changed, unchanged=entry.unchanged))
        self.store.revisits.put_arc(records)
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
