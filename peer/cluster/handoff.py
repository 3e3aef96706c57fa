"""Arc hand-off: when the view changes, the previous owner of each moved arc streams its state to the new owner.

DESIGN decision 6: the queued URLs, the seen-URL keys and the hosts' politeness state of an arc go to its new
owner in `HandoffChunk`s; the old owner keeps all of it until every chunk of the arc is acknowledged, and only
then deletes it (but the seen keys of fetched pages: those it sent, and those marked here meanwhile as the new
owner's backup, `marked_seen`). The receiver applies chunks idempotently and acknowledges only after `sync()`,
so a lost chunk, a lost ack, a re-send and a receiver restart all end with each URL queued once at the new owner.

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

import numpy as np
import trio

from protocol import HandoffAck, HandoffAsk, HandoffChunk, Message, RevisitEntry, UrlEntry
from protocol import HostState as WireHostState
from ring import RING_SPACE, ArcMove, Moves, Ring, diff_moves, host_position, wire_moves
from storage import HostState, NodeStore, QueuedUrl, RevisitRecord, in_arc, queued_url_keys

from peer.config import DEFAULTS
from peer.crawl.urls import host_of_normalized, normalize

__all__ = ["Alone", "ArcSet", "Handoff", "HandoffConfig", "HandoffDelegate", "HandoffLinks", "Hold", "ViewPlan",
           "handoff_arcs", "plan_view"]

log = logging.getLogger(__name__)

_KEY_POSITION = 8  # a seen-URL key begins with the host's 8-byte ring position
#: Transfers started in one step of the event loop (each reads the flight records and locates the hosts); the
#: rest start at the next pump, which `run` makes at once when some were left.
_STARTS_PER_STEP = 16


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
    # Arcs read from the store at once while a transfer's chunks are made (one read transaction per database),
    # and arcs dropped per write transaction once it completes: a join moves tens of thousands of small arcs,
    # and a few dozen at a time keep each step of the event loop to a few milliseconds.
    arcs_per_read: int = 32
    arcs_per_drop: int = 32
    # A chunk with no ack after this long is sent again (the link layer delivers at most once per connection).
    resend_after: float = 5.0
    # How often `run` looks for chunks to send or re-send.
    interval: float = 0.2
    # A page fetched here whose release waits for its links (`HandoffDelegate.held_keys`) is sent as seen only
    # once its links are safe: the transfer's last chunk waits for that at most this long, and at most two thirds
    # of `wait` (the receiver holds the arc's hosts meanwhile). Its links' owners ack within a round trip, and a
    # lost batch is re-sent after 5 s; but the outbox releases in order, so with 5% of the frames lost a release
    # waited up to 20 s, and with 20% lost the cluster's joins no longer settled within 40 s. Past the limit the
    # keys go as seen all the same: the old owner's death within the limit of the transfer's end is covered
    # (the seconds after a join, when it has mattered), a later one could lose those links again, and sending
    # them as not seen would fetch every such page twice.
    withhold_limit: float = 5.0
    # Gained arcs whose transfer has not come after this long make the node ask their previous owner for it
    # (`HandoffAsk`), and again every `resend_after`: a small transfer on a LAN arrives well within it, so the
    # ask is mostly sent to a previous owner that has nothing for us under our ring (it saw other rings).
    ask_after: float = 0.25
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
    """One transfer. Its chunks are made a few arcs at a time as the window opens (`Handoff._fill`), so starting a
    transfer of thousands of arcs reads nothing yet; `last` is known once every arc has been read."""

    transfer_id: int
    epoch: int
    peer: str
    chunks: dict[int, _Chunk]  # unacknowledged chunks by seq
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


@dataclass(slots=True)
class _Incoming:
    applied: set[int] = field(default_factory=set)
    last: int | None = None
    complete: bool = False


class _ArcSet:
    """Disjoint arcs with a bisect lookup; at most one of them wraps (then it sorts last by start). Held as numpy
    arrays (a join hands one peer tens of thousands of arcs); `arcs` gives them as tuples when asked."""

    def __init__(self, arcs: Iterable[tuple[int, int]] = ()) -> None:
        pairs = sorted(arcs)
        self._adopt(np.array([start for start, _ in pairs], dtype=np.uint64),
                    np.array([end for _, end in pairs], dtype=np.uint64))

    @classmethod
    def of(cls, starts: np.ndarray, ends: np.ndarray) -> _ArcSet:
        """The arcs `[starts[i], ends[i])` (uint64 arrays, an end of 0 meaning 2**64), in any order."""
        arc_set = cls.__new__(cls)
        if len(starts) > 1 and not np.all(starts[1:] > starts[:-1]):  # moves come in position order but one
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], ends[order]
        arc_set._adopt(starts, ends)
        return arc_set

    @classmethod
    def union(cls, sets: Iterable[_ArcSet]) -> _ArcSet:
        """The arcs of several disjoint sets in one."""
        sets = list(sets)
        if not sets:
            return cls()
        return cls.of(np.concatenate([s.starts for s in sets]), np.concatenate([s.ends for s in sets]))

    @classmethod
    def merged(cls, sets: Iterable[_ArcSet]) -> _ArcSet:
        """The positions of several sets that may overlap, as disjoint arcs (overlapping and touching arcs
        joined; at most one arc wraps, and the whole ring is one arc with equal bounds). Vectorized: a node fresh
        from a join merges one arc per point of its own."""
        sets = [s for s in sets if len(s.starts)]
        if not sets:
            return cls()
        starts = np.concatenate([s.starts for s in sets])
        lasts = np.concatenate([s.ends for s in sets]) - np.uint64(1)  # inclusive: an end of 0 (2**64) fits
        if np.any(starts == lasts + np.uint64(1)):
            return cls([(0, 0)])  # one of them is the whole ring
        wraps = starts > lasts
        top = np.uint64(RING_SPACE - 1)
        starts = np.concatenate((starts[~wraps], starts[wraps], np.zeros(int(wraps.sum()), dtype=np.uint64)))
        lasts = np.concatenate((lasts[~wraps], np.full(int(wraps.sum()), top, dtype=np.uint64), lasts[wraps]))
        order = np.argsort(starts, kind="stable")
        starts, lasts = starts[order], np.maximum.accumulate(lasts[order])
        # a new arc begins where a start lies beyond the previous arcs' reach by more than one position
        gap = np.concatenate(([True], (starts[1:] > lasts[:-1]) & (starts[1:] - lasts[:-1] > np.uint64(1))))
        firsts = np.flatnonzero(gap)
        starts, lasts = starts[firsts], lasts[np.concatenate((firsts[1:] - 1, [len(lasts) - 1]))]
        if len(starts) == 1 and starts[0] == 0 and lasts[0] == top:
            return cls([(0, 0)])
        if len(starts) > 1 and starts[0] == 0 and lasts[-1] == top:
            lasts[-1] = lasts[0]  # one arc across 2**64 again
            starts, lasts = starts[1:], lasts[1:]
        return cls.of(starts, lasts + np.uint64(1))

    def _adopt(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.starts, self.ends = starts, ends
        self._starts_view = memoryview(starts)
        self._ends_view = memoryview(ends)
        self._arcs: list[tuple[int, int]] | None = None
        self._length: int | None = None

    @property
    def arcs(self) -> list[tuple[int, int]]:
        """The arcs as (start, end) tuples, sorted by start (made once, on first use)."""
        if self._arcs is None:
            self._arcs = list(zip(self.starts.tolist(), self.ends.tolist()))
        return self._arcs

    def __len__(self) -> int:
        return len(self.starts)

    def length(self) -> int:
        """The positions the arcs cover (equal bounds: the whole ring); computed once, on first use."""
        if self._length is None:
            spans = (self.ends - self.starts).tolist()  # uint64 arithmetic wraps: a wrapping arc comes out right
            self._length = sum(spans) + RING_SPACE * int(np.count_nonzero(self.ends == self.starts))
        return self._length

    def __contains__(self, position: int) -> bool:
        return self.find(position) is not None

    def find(self, position: int) -> tuple[int, int] | None:
        """The arc holding `position`, or None."""
        if not len(self.starts):
            return None
        index = bisect.bisect_right(self._starts_view, position) - 1  # -1: the last arc, the wrapping one if any
        arc = (self._starts_view[index], self._ends_view[index])
        return arc if in_arc(position, *arc) else None

    def locate(self, positions: np.ndarray) -> np.ndarray:
        """For each position (a uint64 array), the index of the arc holding it, or -1."""
        if not len(self.starts) or not len(positions):
            return np.full(len(positions), -1, dtype=np.intp)
        index = np.searchsorted(self.starts, positions, side="right") - 1
        index[index < 0] = len(self.starts) - 1  # before the first start: only the wrapping arc can hold it
        starts, ends = self.starts[index], self.ends[index]
        inside = np.where(starts < ends, (positions >= starts) & (positions < ends),
                          (positions >= starts) | (positions < ends))  # ends <= starts: wraps (or ends at 2**64)
        inside |= starts == ends  # one arc that is the whole ring
        return np.where(inside, index, -1)

    def occupied(self, positions: np.ndarray) -> np.ndarray:
        """The indices of the arcs holding at least one of `positions` (a SORTED uint64 array): two binary
        searches per arc into the positions, whichever of the two is larger."""
        below_start = np.searchsorted(positions, self.starts, side="left")
        below_end = np.searchsorted(positions, self.ends, side="left")
        plain = self.starts < self.ends
        count = np.where(plain, below_end - below_start, len(positions) - below_start + below_end)
        count[self.starts == self.ends] = len(positions)  # one arc that is the whole ring
        return np.flatnonzero(count > 0)

    def touches(self, other: _ArcSet) -> bool:
        """Whether the two sets share a position: one of them holds the start of an arc of the other. Costs
        O(len(other) x log len(self)): call it on the larger set."""
        if not len(self.starts) or not len(other.starts):
            return False
        return bool(len(other.occupied(self.starts))) or self.holds_any(other.starts)

    def holds_any(self, positions: np.ndarray) -> bool:
        """Whether any of `positions` (a uint64 array) lies in one of the arcs."""
        return bool(len(positions)) and bool(np.any(self.locate(positions) >= 0))


def _positions(values: Iterable[int]) -> np.ndarray:
    return np.fromiter(values, dtype=np.uint64)


def _as_wire(arcs: Moves | Iterable[ArcMove]) -> Moves:
    """Moved arcs in the hand-off's form, as arrays: a `Moves` (of `diff_moves` or `wire_moves`) or a list of
    `ArcMove` already in the form of `handoff_arcs`."""
    if isinstance(arcs, Moves):
        return wire_moves(arcs)
    return Moves.from_arcs(arcs, wire=True)


def _by_node(moves: Moves, selected: np.ndarray, column: np.ndarray) -> dict[str, _ArcSet]:
    """The selected moves grouped by the node named in `column` (their previous or next owner), None left out:
    one sort, then a slice per node."""
    starts, ends, column = moves.starts[selected], moves.ends[selected], column[selected]
    # node indices fit 16 bits (a ring names at most 65,535 nodes): numpy sorts those stably by radix
    order = np.argsort(column.astype(np.int16), kind="stable")
    starts, ends, column = starts[order], ends[order], column[order]
    firsts = np.flatnonzero(np.concatenate(([True], column[1:] != column[:-1]))) if len(column) else column
    bounds = [*firsts.tolist(), len(column)]
    groups: dict[str, _ArcSet] = {}
    for first, end in zip(bounds, bounds[1:]):
        index = int(column[first])
        if index >= 0:
            groups[moves.names[index]] = _ArcSet.of(starts[first:end], ends[first:end])
    return groups


def _joined_up(arcs: _ArcSet) -> _ArcSet:
    """The same positions in fewer arcs: neighbours (one ending where the next starts) become one. A node that
    joins loses every arc of its first ring but its own, ten million of them at 1,000 points per weight, but
    between two of its own arcs they all touch."""
    starts, ends = arcs.starts, arcs.ends
    if len(starts) < 2:
        return arcs
    touch = ends[:-1] == starts[1:]
    if not touch.any():
        return arcs
    first = np.concatenate(([True], ~touch))
    last = np.concatenate((~touch, [True]))
    return _ArcSet.of(starts[first], ends[last])


@dataclass(frozen=True, slots=True)
class ViewPlan:
    """What a view change means for one node's hand-off, worked out from the moved arcs alone (numpy, no store,
    no state of the hand-off), so the cluster makes it in its worker thread with the ring: the arcs it loses
    (`lost`, as moves), the same positions as an arc set, the arcs it hands each peer, and the arcs it gains
    from each previous owner that is not dead."""

    lost: Moves
    lost_set: _ArcSet
    by_peer: dict[str, _ArcSet]
    gained: dict[str, _ArcSet]
    inherited: dict[str, _ArcSet]  # arcs this node takes over from each dead previous owner (`gone`)


def plan_view(node_id: str, old: Ring, new: Ring, *, gone: Iterable[str] = (), gains_from: Ring | None = None,
              arcs: Moves | Sequence[ArcMove] | None = None,
              gain_arcs: Moves | Sequence[ArcMove] | None = None,
              extra_gains: Moves | Sequence[ArcMove] | None = None) -> ViewPlan:
    """The `ViewPlan` of `node_id` for the change from `old` to `new` (the arguments of `Handoff.view_changed`).
    `extra_gains`: more moved arcs whose gains this node also waits for, from their previous owners there (a
    node fresh from a join or a restart: the arcs it gains against the ring without it, besides those of the
    diff from its own previous ring, which may have been built from a partial view)."""
    moves = _as_wire(arcs) if arcs is not None else wire_moves(diff_moves(old, new))
    lost_mask = moves.previous == moves.index_of(node_id)
    lost = moves.where(lost_mask)
    by_peer = _by_node(moves, lost_mask, moves.next)
    if gain_arcs is not None:
        gains = _as_wire(gain_arcs)
    elif gains_from is not None:
        gains = wire_moves(diff_moves(gains_from, new))
    else:
        gains = moves
    gained_mask = (gains.next == gains.index_of(node_id)) & (gains.previous >= 0)
    gone = set(gone)
    inherited: dict[str, _ArcSet] = {}
    if gone:
        gained_mask &= ~np.isin(gains.previous, [gains.index_of(node) for node in gone])
        inherited_mask = (moves.next == moves.index_of(node_id)) & np.isin(
            moves.previous, [moves.index_of(node) for node in gone])
        inherited = _by_node(moves, inherited_mask, moves.previous)
    gained = _by_node(gains, gained_mask, gains.previous)
    if extra_gains is not None:
        extra = _as_wire(extra_gains)
        extra_mask = (extra.next == extra.index_of(node_id)) & (extra.previous >= 0)
        if gone:
            extra_mask &= ~np.isin(extra.previous, [extra.index_of(node) for node in gone])
        for peer, peer_arcs in _by_node(extra, extra_mask, extra.previous).items():
            gained[peer] = _ArcSet.merged([gained[peer], peer_arcs]) if peer in gained else peer_arcs
    return ViewPlan(lost=lost, lost_set=_joined_up(_ArcSet.of(lost.starts, lost.ends)), by_peer=by_peer,
                    gained=gained, inherited=inherited)


ArcSet = _ArcSet  # disjoint arcs with a bisect look-up (the cluster holds inherited arcs in one)


#: Given a callback, calls it once what an applied chunk queued is held by this node's backups too.
Hold = Callable[[Callable[[], None]], None]


class HandoffDelegate(Protocol):
    """What the hand-off asks of the node around it (memberlist's delegate): one protocol, not loose callables.
    `Alone` is the default for a hand-off on its own (tests); the cluster implements it for a node."""

    def busy_positions(self) -> Iterable[int]:
        """Ring positions of the hosts being fetched here now: a transfer starts once none lies in its arcs, so
        the host states it carries include the last fetch (the politeness rule, docs/cluster.md)."""

    def held_keys(self) -> set[bytes]:
        """Keys of pages fetched here whose release waits for the links they found (`--replicas`): until those
        links are safe elsewhere, only fetching the page again brings them back if this node dies, so a transfer
        must not yet tell the new owner the page was fetched."""

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

    def held_keys(self) -> set[bytes]:
        return set()

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
        self._ring: Ring | None = None  # the ring `_ring_id` names
        self._asked: dict[str, int] = {}  # peer -> the ring it waits for arcs up to (its HandoffAsk)
        self._asks_sent: dict[str, float] = {}  # peer -> when we last asked it
        self.asks_sent = 0
        self.asks_answered = 0  # empty transfers sent because a peer asked
        self.urls_forwarded = 0
        self.urls_discarded = 0  # queued here, but the previous owner had already fetched them
        self._run = 0  # the store's run counter, set by `run`: transfer ids never repeat an earlier process's
        self._transfers = 0
        # transfers not started yet: (transfer id, ring id, peer, arcs, the ring it hands off to (None: a sweep))
        self._waiting: list[tuple[int, int, str, _ArcSet, Ring | None]] = []
        # transfer id -> (its arcs, the keys of pages fetched elsewhere marked seen here since it was queued that
        # lie in them), for each transfer waiting, under way or being dropped: those keys stay after its drop
        self._marked: dict[int, tuple[_ArcSet, set[bytes]]] = {}
        self._dropping = 0  # completed transfers whose arcs are being dropped from the store, a slice at a time
        self._hosts_here: np.ndarray | None = None  # positions of the hosts held here, while transfers start
        self._deferred = False  # transfers that may start were left for the next step
        self._wake: trio.Event | None = None  # set to wake `run` before its interval is up
        self._latest: set[int] = set()  # ids of the transfers of the latest view change (their arcs are `_lost`)
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
        self.keys_withheld = 0  # seen keys sent only once their page's release was no longer held
        self.withheld_expired = 0  # ... or after `withhold_limit`, still held

    # -- view changes --

    def view_changed(
        self,
        epoch: int,
        old: Ring,
        new: Ring,
        *,
        gone: Iterable[str] = (),
        gains_from: Ring | None = None,
        arcs: Moves | Sequence[ArcMove] | None = None,
        gain_arcs: Moves | Sequence[ArcMove] | None = None,
        plan: ViewPlan | None = None,
    ) -> Moves:
        """Start handing off the arcs this node loses from `old` to `new`, and note the arcs it gains.

        `gone` names previous owners that will send nothing (dead nodes): their arcs are not waited for.
        `gains_from` is the ring to compute gained arcs against when it is not `old`: a node that just joined
        had only itself in `old`, but the arcs it gains come from the owners in the cluster's previous ring.
        `arcs` and `gain_arcs` may carry the moves of `old` to `new` and of `gains_from` to `new` computed
        beforehand, as `diff_moves` (or `wire_moves` of it), or as a list in the form of `handoff_arcs(diff(...))`;
        or `plan` carries all of it worked out (`plan_view`, in the cluster's worker thread: a node that joins
        loses ten million arcs at 1,000 points per weight). The moves are handled as arrays: nothing here makes
        an object per arc. Returns the arcs this node loses, in the hand-off's form (a wrapping arc is one).
        """
        if not 0 <= epoch < 1 << 64:
            raise ValueError(f"ring id {epoch} must be in [0, 2**64)")
        if plan is None:
            plan = plan_view(self.node_id, old, new, gone=gone, gains_from=gains_from, arcs=arcs,
                             gain_arcs=gain_arcs)
        self._ring_id = epoch
        self._ring = new
        self._lost = plan.lost_set
        first = self._transfers + 1
        for peer in sorted(plan.by_peer):
            self._queue(epoch, peer, plan.by_peer[peer], new)
        self._latest = {self._run << 40 | n for n in range(first, self._transfers + 1)}  # within `_lost`
        # A peer that asked for this ring before we adopted it hears "nothing more from me up to this ring" (an
        # empty transfer, after any earlier one to it) if this change gives it nothing of ours: a receiver that
        # saw the rings in another order, and waits for arcs this node labelled with a ring it never adopted, is
        # released by it instead of by the wait timeout. Peers ask only for what they wait for (`HandoffAsk`).
        for peer, ring in sorted(self._asked.items()):
            if ring == epoch:
                self._answer_ask(peer)
        self._start_quiet()
        for peer, peer_arcs in plan.gained.items():
            if epoch in self._completed.get(peer, ()):
                self._release(peer, epoch)  # its transfer for this ring arrived before we adopted the ring
                continue
            self._pending[(peer, epoch)] = peer_arcs
            self._pending_since[(peer, epoch)] = None  # the next pump starts the clock
        # A peer whose transfer to this ring arrived before we adopted it has nothing more for us up to this
        # ring, so it releases what we still wait for from it under older rings too, even if it hands us nothing
        # in this one (a joiner whose first ring still held a leaving node waited 30 s for such arcs).
        for peer in {key[0] for key in self._pending}:
            if epoch in self._completed.get(peer, ()):
                self._release(peer, epoch)
        return plan.lost

    def sweep(self, epoch: int, owner_of: Callable[[str], str], hosts: Iterable[str]) -> int:
        """Hand off the state of `hosts` this node holds but does not own (a chunk that arrived after the
        arc moved on, a restart with an older view): each host's point of the ring becomes a one-position
        arc sent to its owner. Returns how many hosts were swept."""
        by_peer: dict[str, set[int]] = {}
        for host in hosts:
            owner = owner_of(host)
            if owner == self.node_id:
                continue
            by_peer.setdefault(owner, set()).add(host_position(host))
        for peer, positions in sorted(by_peer.items()):
            self._queue(epoch, peer, _ArcSet((position, (position + 1) % RING_SPACE) for position in positions), None)
        self._start_quiet()
        return sum(len(positions) for positions in by_peer.values())

    def _next_transfer_id(self) -> int:
        self._transfers += 1
        return self._run << 40 | self._transfers

    def _queue(self, epoch: int, peer: str, arcs: _ArcSet, ring: Ring | None) -> None:
        """A transfer of `arcs` to `peer` waits to start (`_start_quiet`); from now on the seen marks of its arcs
        are kept for its drop (`marked_seen`)."""
        transfer_id = self._next_transfer_id()
        self._waiting.append((transfer_id, epoch, peer, arcs, ring))
        if len(arcs):
            self._marked[transfer_id] = (arcs, set())

    def marked_seen(self, keys: Sequence[bytes]) -> None:
        """Keys of pages fetched elsewhere were just marked seen here: this node is a backup of their owner (a
        page's release, a seen-key replica). Those in the arcs of a transfer waiting, under way or being dropped
        stay after its drop, as the keys of fetched pages it sent do.

        Why: the drop takes the arcs' seen keys but those sent as seen, and the keys of the URLs sent queued were
        not. The new owner fetches such a URL and releases it to its backups, often this node (the arc's owner
        before it); the release marked it seen here, then the drop took the mark, and at the new owner's death
        this node, its heir, fetched the page again though it was not under way (`h248.sim/` in the replica
        simulation, seed 4: released here 40 ms before the end of a hand-off that took 2.4 s)."""
        if not self._marked or not keys:
            return
        positions = np.frombuffer(b"".join(key[:_KEY_POSITION] for key in keys), dtype=">u8").astype(np.uint64)
        for arcs, kept in self._marked.values():
            inside = (arcs.locate(positions) >= 0).tolist()
            kept.update(key for key, hit in zip(keys, inside) if hit)

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
        self._hosts_here = None  # read once per call, by the first transfer that starts
        busy_list = list(self.delegate.busy_positions())
        busy = _positions(busy_list)
        sending = {transfer.peer for transfer in self._outgoing.values()}
        # (transfer id, ring id) of every transfer not yet acknowledged, started or not
        open_transfers = [(t.transfer_id, t.epoch) for t in self._outgoing.values()]
        open_transfers += [(w[0], w[1]) for w in self._waiting]
        pending = list(self._pending.values())
        # A transfer of the latest ring hands off arcs within `_lost`: if those touch no awaited arc (a joiner
        # awaits its 150,000 arcs and hands off the others), no such transfer needs the check one by one.
        lost_touches = any(self._lost.touches(arcs) for arcs in pending)
        still: list[tuple[int, int, str, _ArcSet, Ring | None]] = []
        started = 0
        self._deferred = False
        for transfer_id, epoch, peer, arc_set, ring in self._waiting:
            if started >= _STARTS_PER_STEP:  # a leaving node starts 64 transfers: a few per step of the loop
                still.append((transfer_id, epoch, peer, arc_set, ring))
                self._deferred = True
                continue
            if (
                peer in sending
                or arc_set.holds_any(busy)
                or (ring is not None and busy_list and peer in ring.weights and peer in ring.owners_at(busy_list))
                or ((lost_touches or transfer_id not in self._latest)
                    and any(arc_set.touches(arcs) for arcs in pending))
                or any(tid < transfer_id and ring_id != epoch for tid, ring_id in open_transfers)
            ):
                still.append((transfer_id, epoch, peer, arc_set, ring))
                sending.add(peer)  # keep this peer's later transfers behind this one
            else:
                self._start_transfer(transfer_id, epoch, peer, arc_set)
                sending.add(peer)
                started += 1
        self._waiting = still

    def _start_transfer(self, transfer_id: int, epoch: int, peer: str, arcs: _ArcSet) -> None:
        """Start a transfer: find the arcs holding anything here (one pass over the hosts, located on the ring
        with numpy); their content is read a few arcs at a time as chunks are needed (`_fill`)."""
        todo = self._occupied(arcs)
        in_flight = set(queued_url_keys(self.store.frontier.in_flight_items())) if todo else set()
        self._outgoing[transfer_id] = transfer = _Outgoing(
            transfer_id=transfer_id, epoch=epoch, peer=peer, chunks={}, last=None, arcs=[], todo=todo,
            in_flight=in_flight,
        )
        if not todo:  # nothing to move, but the receiver still learns that the transfer is complete
            start, end = (arcs._starts_view[0], arcs._ends_view[0]) if len(arcs) else (0, 0)
            transfer.chunks[0] = _Chunk(seq=0, start=start, end=end)
            transfer.made, transfer.last = 1, 0
        log.info("hand-off started", extra={"peer": peer, "arcs": len(arcs), "occupied": len(todo)})

    def _fill(self, transfer: _Outgoing, wanted: int, budget: int) -> int:
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
                    transfer.chunks[transfer.made] = _Chunk(seq=transfer.made, start=start, end=end)
                    transfer.made += 1
                transfer.last = transfer.made - 1
        return read

    def _send_withheld(self, transfer: _Outgoing) -> bool:
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

    def _flush(self, transfer: _Outgoing) -> None:
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

    def _occupied(self, arcs: _ArcSet) -> list[tuple[int, int]]:
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

    def pending_count(self) -> int:
        """How many gained arcs wait for their transfer (`len(pending_arcs())` without making the list)."""
        return sum(len(arcs) for arcs in self._pending.values())

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
        gone += [w[0] for w in self._waiting if w[2] == peer_id]
        for tid in gone:
            self._outgoing.pop(tid, None)
            self._marked.pop(tid, None)
        self._waiting = [w for w in self._waiting if w[2] != peer_id]
        return len(gone)

    def _release(self, peer_id: str, epoch: int) -> None:
        """A transfer from `peer_id` to the ring `epoch` is complete. If that is our current ring, the peer has
        handed off everything it held in arcs that ring gives away, which covers every arc we still wait for
        from it (whatever rings it went through); an older ring's transfer covers only that ring's arcs."""
        self._completed.setdefault(peer_id, set()).add(epoch)
        current = epoch == self._ring_id
        for key in [key for key in self._pending if key[0] == peer_id and (current or key[1] == epoch)]:
            del self._pending[key]
            self._pending_since.pop(key, None)

    def _answer_ask(self, peer: str) -> None:
        """`peer` waits for arcs from us up to our current ring: a transfer labelled with it, an empty one
        unless one to it is on its way already."""
        epoch = self._asked.pop(peer)
        if any(w[2] == peer and w[1] == epoch for w in self._waiting) or any(
                t.peer == peer and t.epoch == epoch for t in self._outgoing.values()):
            return
        self._waiting.append((self._next_transfer_id(), epoch, peer, _ArcSet(), self._ring))
        self.asks_answered += 1

    def _asked_by(self, peer_id: str, ask: HandoffAsk) -> None:
        self._asked[peer_id] = ask.ring
        if ask.ring == self._ring_id and peer_id in (self._ring.weights if self._ring is not None else ()):
            self._answer_ask(peer_id)
            self._start_quiet()
            if self._wake is not None:
                self._wake.set()

    def _expire(self, now: float) -> None:
        ask: set[str] = set()
        for key, since in list(self._pending_since.items()):
            if since is not None and now - since >= self.config.ask_after:
                ask.add(key[0])
            if since is None:
                self._pending_since[key] = now
            elif now - since >= self.config.wait:
                self._pending.pop(key, None)
                del self._pending_since[key]
                self.waits_expired += 1
                log.warning("gained arcs released without their hand-off after %.0f s", self.config.wait,
                            extra={"peer": key[0], "epoch": key[1]})
        if self._ring_id is None:
            return
        for peer in sorted(ask):
            if now - self._asks_sent.get(peer, -float("inf")) >= self.config.resend_after and self.links.send_nowait(
                    peer, HandoffAsk(ring=self._ring_id)):
                self._asks_sent[peer] = now
                self.asks_sent += 1
        for peer in [peer for peer in self._asks_sent if not self.waits_for(peer)]:
            del self._asks_sent[peer]

    def outstanding(self) -> int:
        """Chunks sent or to send and not yet acknowledged, over all outgoing transfers (at least one for a
        transfer still waiting for its arcs' fetches to finish, or whose chunks are not all made yet, and for one
        completed whose arcs are still being dropped here)."""
        return (sum(len(transfer.chunks) or not transfer.done for transfer in self._outgoing.values())
                + len(self._waiting) + self._dropping)

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

    # -- receiving --

    async def on_message(self, peer_id: str, message: Message) -> None:
        """Take a `HandoffChunk` (apply, sync, ack), a `HandoffAck` or a `HandoffAsk`; ignore anything else."""
        if isinstance(message, HandoffChunk):
            self._receive(peer_id, message)
        elif isinstance(message, HandoffAck):
            await self._acked(peer_id, message)
        elif isinstance(message, HandoffAsk):
            self._asked_by(peer_id, message)

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
