"""Arcs of the ring as the hand-off handles them: the wire form of moved arcs (`handoff_arcs`), a set of disjoint
arcs held as numpy arrays with its look-ups (`ArcSet`), and what a view change means for one node's hand-off,
worked out from the moved arcs alone (`plan_view` -> `ViewPlan`: the arcs it loses and to whom, the arcs it gains
and from whom). Pure numpy over the ring's moves: no store, no state of the hand-off, no trio, so the cluster
makes a plan in its worker thread with the ring.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any
from dataclasses import dataclass

import numpy as np

from ring import RING_SPACE, ArcMove, Moves, Ring, diff_moves, wire_moves
from storage import in_arc

__all__ = ["KEY_POSITION", "ArcSet", "ViewPlan", "handoff_arcs", "plan_view"]

KEY_POSITION = 8  # a seen-URL key begins with the host's 8-byte ring position


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


class ArcSet:
    """Disjoint arcs with a bisect lookup; at most one of them wraps (then it sorts last by start). Held as numpy
    arrays (a join hands one peer tens of thousands of arcs); `arcs` gives them as tuples when asked."""

    def __init__(self, arcs: Iterable[tuple[int, int]] = ()) -> None:
        pairs = sorted(arcs)
        self._adopt(np.array([start for start, _ in pairs], dtype=np.uint64),
                    np.array([end for _, end in pairs], dtype=np.uint64))

    @classmethod
    def of(cls, starts: np.ndarray, ends: np.ndarray) -> ArcSet:
        """The arcs `[starts[i], ends[i])` (uint64 arrays, an end of 0 meaning 2**64), in any order."""
        arc_set = cls.__new__(cls)
        if len(starts) > 1 and not np.all(starts[1:] > starts[:-1]):  # moves come in position order but one
            order = np.argsort(starts, kind="stable")
            starts, ends = starts[order], ends[order]
        arc_set._adopt(starts, ends)
        return arc_set

    @classmethod
    def union(cls, sets: Iterable[ArcSet]) -> ArcSet:
        """The arcs of several disjoint sets in one."""
        sets = list(sets)
        if not sets:
            return cls()
        return cls.of(np.concatenate([s.starts for s in sets]), np.concatenate([s.ends for s in sets]))

    @classmethod
    def merged(cls, sets: Iterable[ArcSet]) -> ArcSet:
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
        self._starts_view = starts.data  # the buffer's memoryview, as memoryview(starts) gives
        self._ends_view = ends.data
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

    def touches(self, other: ArcSet) -> bool:
        """Whether the two sets share a position: one of them holds the start of an arc of the other. Costs
        O(len(other) x log len(self)): call it on the larger set."""
        if not len(self.starts) or not len(other.starts):
            return False
        return bool(len(other.occupied(self.starts))) or self.holds_any(other.starts)

    def holds_any(self, positions: np.ndarray) -> bool:
        """Whether any of `positions` (a uint64 array) lies in one of the arcs."""
        return bool(len(positions)) and bool(np.any(self.locate(positions) >= 0))


def _as_wire(arcs: Moves | Iterable[ArcMove]) -> Moves:
    """Moved arcs in the hand-off's form, as arrays: a `Moves` (of `diff_moves` or `wire_moves`) or a list of
    `ArcMove` already in the form of `handoff_arcs`."""
    if isinstance(arcs, Moves):
        return wire_moves(arcs)
    return Moves.from_arcs(arcs, wire=True)


def _by_node(moves: Moves, selected: np.ndarray, column: np.ndarray) -> dict[str, ArcSet]:
    """The selected moves grouped by the node named in `column` (their previous or next owner), None left out:
    one sort, then a slice per node."""
    starts, ends, column = moves.starts[selected], moves.ends[selected], column[selected]
    # node indices fit 16 bits (a ring names at most 65,535 nodes): numpy sorts those stably by radix
    order = np.argsort(column.astype(np.int16), kind="stable")
    starts, ends, column = starts[order], ends[order], column[order]
    firsts = np.flatnonzero(np.concatenate(([True], column[1:] != column[:-1]))) if len(column) else column
    bounds = [*firsts.tolist(), len(column)]
    groups: dict[str, ArcSet] = {}
    for first, end in zip(bounds, bounds[1:]):
        index = int(column[first])
        if index >= 0:
            groups[moves.names[index]] = ArcSet.of(starts[first:end], ends[first:end])
    return groups


def _joined_up(arcs: ArcSet) -> ArcSet:
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
    return ArcSet.of(starts[first], ends[last])


@dataclass(frozen=True, slots=True)
class ViewPlan:
    """What a view change means for one node's hand-off, worked out from the moved arcs alone (numpy, no store,
    no state of the hand-off), so the cluster makes it in its worker thread with the ring: the arcs it loses
    (`lost`, as moves), the same positions as an arc set, the arcs it hands each peer, and the arcs it gains
    from each previous owner that is not dead."""

    lost: Moves
    lost_set: ArcSet
    by_peer: dict[str, ArcSet]
    gained: dict[str, ArcSet]
    inherited: dict[str, ArcSet]  # arcs this node takes over from each dead previous owner (`gone`)
    #: peers of `by_peer` that wait for nothing from this node: under the ring the cluster had before this node
    #: came (`gains_from`, `gain_arcs`), they gained no arc from it. Its lone first ring gave it every arc, and
    #: it "loses" them to their owners, but a transfer that finds nothing here to send is not sent to these.
    quiet: frozenset[str] = frozenset()


def plan_view(node_id: str, old: Ring, new: Ring, *, gone: Iterable[str] = (), gains_from: Ring | None = None,
              arcs: Moves | Sequence[ArcMove] | None = None,
              gain_arcs: Moves | Sequence[ArcMove] | None = None,
              extra_gains: Moves | Sequence[ArcMove] | Sequence[Moves] | None = None) -> ViewPlan:
    """The `ViewPlan` of `node_id` for the change from `old` to `new` (the arguments of `Handoff.view_changed`).
    `extra_gains`: more moved arcs whose gains this node also waits for, from their previous owners there (a
    node fresh from a join or a restart: the arcs it gains against the ring without it, besides those of the
    diff from its own previous ring, which may have been built from a partial view), or a list of such moves
    (a node declared dead by the other side of a partition: also against the ring of that side)."""
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
    inherited: dict[str, ArcSet] = {}
    if gone:
        gained_mask &= ~np.isin(gains.previous, [gains.index_of(node) for node in gone])
        inherited_mask = (moves.next == moves.index_of(node_id)) & np.isin(
            moves.previous, [moves.index_of(node) for node in gone])
        inherited = _by_node(moves, inherited_mask, moves.previous)
    gained = _by_node(gains, gained_mask, gains.previous)
    quiet: frozenset[str] = frozenset()
    if gains is not moves and by_peer:
        # who gains arcs from this node between the ring the cluster had and the new one: the peers that wait
        mine = gains.previous == gains.index_of(node_id)
        awaited = {gains.names[i] for i in np.unique(gains.next[mine]).tolist() if i >= 0}
        quiet = frozenset(peer for peer in by_peer if peer not in awaited)
    if extra_gains is None:
        extras: list[Moves] = []
    elif isinstance(extra_gains, Moves):
        extras = [extra_gains]
    else:
        listed: list[Any] = list(extra_gains)  # Moves, or ArcMoves (the wire's)
        extras = listed if all(isinstance(m, Moves) for m in listed) and listed else [_as_wire(listed)]
    for extra in map(_as_wire, extras):
        extra_mask = (extra.next == extra.index_of(node_id)) & (extra.previous >= 0)
        if gone:
            extra_mask &= ~np.isin(extra.previous, [extra.index_of(node) for node in gone])
        for peer, peer_arcs in _by_node(extra, extra_mask, extra.previous).items():
            gained[peer] = ArcSet.merged([gained[peer], peer_arcs]) if peer in gained else peer_arcs
    return ViewPlan(lost=lost, lost_set=_joined_up(ArcSet.of(lost.starts, lost.ends)), by_peer=by_peer,
                    gained=gained, inherited=inherited, quiet=quiet)
