"""Which arcs change owner between two rings: the work list of a hand-off.

When the view changes, the previous owner of every moved arc streams that arc's state to the next owner. Since
seen-URL keys begin with the host's ring position, each ``ArcMove`` is one contiguous key range to scan.

Only positions at or after a point of a node that joined, left or changed weight, and before the next point that
is in both rings, can change owner. So when both rings have the same points per weight and few nodes changed,
``diff`` evaluates both rings only at those nodes' points and the point that follows each of them: the cost is that
of the changed nodes' points, not of the ring. Otherwise it evaluates both rings at every arc start of either.

A join or leave at a thousand points per weight moves one arc per point of the changed node (150,000 arcs for a
node of weight 150): ``diff_moves`` gives them as a ``Moves`` of numpy arrays, never one Python object per arc,
and ``diff`` is the same answer as a list of ``ArcMove``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from ._hash import RING_SPACE
from ._ring import _FREE, Ring, _positions

__all__ = ["ArcMove", "Moves", "diff", "diff_moves", "moved_fraction"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ArcMove:
    """Positions ``start <= p < end`` move from ``previous`` to ``next``.

    ``previous`` is None when the old ring was empty (nothing to hand off) and ``next`` is None when the new ring
    is empty (nobody to hand to). Like ``Ring.arcs()``, moves never wrap through zero.
    """

    start: int
    end: int
    previous: str | None
    next: str | None


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` by sorting (numpy's hashed unique is several times slower on uint64)."""
    values = np.sort(values)
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _owner_ids(ring: Ring, at: np.ndarray, ids: dict[str, int]) -> np.ndarray:
    """The owner of each position in ``at`` as an index into ``names`` (-1 for an empty ring)."""
    if not ring.point_count:
        return np.full(len(at), -1, dtype=np.int64)
    table = np.array([ids[node] if node != _FREE else -2 for node in ring._slots], dtype=np.int64)
    owners: np.ndarray = table[ring._after[ring._search(at)]]
    return owners


def _changed_boundaries(old: Ring, new: Ring, changed: list[str]) -> np.ndarray:
    """Positions where an owner may change: the changed nodes' points, 0, and the next point of either ring after
    each of them (sorted, unique)."""
    ppw = old.points_per_weight
    parts = [np.zeros(1, dtype=np.uint64)]
    for node in changed:
        for weights in (old._weights, new._weights):
            if node in weights:
                parts.append(_positions(node, weights[node] * ppw))
    changed_points = _sorted_unique(np.concatenate(parts))
    bounds = [changed_points]
    for ring in (old, new):
        if ring.point_count:
            after = ring._search(changed_points)
            bounds.append(ring._pos[after[after < ring.point_count]])
    return _sorted_unique(np.concatenate(bounds))


_EMPTY_U64 = np.zeros(0, dtype=np.uint64)
_EMPTY_I32 = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, slots=True, eq=False)
class Moves:
    """Moved arcs as arrays: arc ``i`` is ``[starts[i], ends[i])`` and moves from ``names[previous[i]]`` to
    ``names[next[i]]`` (index -1: None, an empty ring). An end is kept modulo 2**64: an end of 0 is 2**64.

    ``wire`` tells which of the two forms it is: False for ``diff_moves`` (in position order, none wrapping,
    the same arcs as ``diff``), True for the hand-off's form (``wire_moves``: the two ends of a move through
    zero joined into one arc whose end is below its start). Iterating gives the ``ArcMove``s of the form: with
    ``wire`` an end of 2**64 reads 0, as on the wire; without, it reads 2**64.
    """

    starts: np.ndarray
    ends: np.ndarray
    previous: np.ndarray
    next: np.ndarray
    names: tuple[str, ...]
    wire: bool = False

    def __len__(self) -> int:
        return len(self.starts)

    def __bool__(self) -> bool:
        return len(self.starts) > 0

    def __iter__(self) -> Iterator[ArcMove]:
        label = (*self.names, None)  # index -1 names None
        top = 0 if self.wire else RING_SPACE
        for start, end, p, n in zip(self.starts.tolist(), self.ends.tolist(), self.previous.tolist(),
                                    self.next.tolist()):
            yield ArcMove(start=start, end=end or top, previous=label[p], next=label[n])

    def index_of(self, node: str | None) -> int:
        """The index naming ``node`` in ``previous``/``next`` (-1 for None; -2 for a node that does not occur)."""
        if node is None:
            return -1
        try:
            return self.names.index(node)
        except ValueError:
            return -2

    def where(self, mask: np.ndarray) -> Moves:
        """The moves selected by a boolean mask (or an index array), in the same form."""
        return Moves(starts=self.starts[mask], ends=self.ends[mask], previous=self.previous[mask],
                     next=self.next[mask], names=self.names, wire=self.wire)

    def lengths(self) -> np.ndarray:
        """Each arc's length as float64 (a wrapping arc goes round through zero)."""
        span = (self.ends - self.starts).astype(np.float64)  # uint64 arithmetic wraps: exact below 2**64
        return np.where(self.ends == self.starts, float(RING_SPACE), span)

    @classmethod
    def from_arcs(cls, arcs: Iterable[ArcMove], *, wire: bool) -> Moves:
        """The arrays of a list of ``ArcMove`` (of ``diff`` if not ``wire``, of ``handoff_arcs`` if ``wire``)."""
        arcs = list(arcs)
        names = tuple(sorted({node for a in arcs for node in (a.previous, a.next) if node is not None}))
        ids: dict[str | None, int] = {name: index for index, name in enumerate(names)}
        ids[None] = -1
        return cls(starts=np.array([a.start for a in arcs], dtype=np.uint64),
                   ends=np.array([a.end % RING_SPACE for a in arcs], dtype=np.uint64),
                   previous=np.array([ids[a.previous] for a in arcs], dtype=np.int32),
                   next=np.array([ids[a.next] for a in arcs], dtype=np.int32), names=names, wire=wire)

    @classmethod
    def empty(cls, *, wire: bool = False) -> Moves:
        return cls(starts=_EMPTY_U64, ends=_EMPTY_U64, previous=_EMPTY_I32, next=_EMPTY_I32, names=(), wire=wire)


def _against_one_node(ring: Ring, node: str, names: list[str], *, was_alone: bool) -> Moves:
    """The moves between a ring of ``node`` alone (it owns everything) and ``ring``, which holds it among others:
    every maximal arc of ``ring`` that another node owns (a node that joins a cluster sees this at its first
    view). Read off the ring's arcs, O(points) in numpy."""
    starts, slots = ring._run_arrays()
    ids = {name: index for index, name in enumerate(names)}
    label = np.array([ids[n] if n != _FREE else -1 for n in ring._slots], dtype=np.int32)
    owners = label[slots.astype(np.intp)]
    ends = np.empty(len(starts), dtype=np.uint64)
    ends[:-1] = starts[1:]
    ends[-1] = 0  # 2**64
    keep = owners != ids[node]
    me = np.full(int(np.count_nonzero(keep)), ids[node], dtype=np.int32)
    starts, ends, owners = starts[keep], ends[keep], owners[keep]
    previous, nxt = (me, owners) if was_alone else (owners, me)
    return Moves(starts=starts, ends=ends, previous=previous, next=nxt, names=tuple(names))


def _one_node_moves(ring: Ring, node: str, names: list[str], *, joined: bool) -> Moves:
    """The moves of one node joining (``ring`` is the ring with it) or leaving (``ring`` is the ring it leaves),
    read off ``ring`` alone. Without the node, a position belongs to the last point at or before it that is not
    the node's, so what moves is exactly the node's arcs in ``ring``, between the node and the owner of the
    point before each run of its points. No search: one pass over the owner array and work per node point."""
    ids = {name: index for index, name in enumerate(names)}
    label = np.array([ids[n] if n != _FREE else -1 for n in ring._slots], dtype=np.int32)
    slot = ring._slot_of[node]
    count, pos, after = ring._count, ring._pos, ring._after
    owners = after[1:]  # owners[k] owns point k
    mine = np.flatnonzero(owners == slot)
    if not len(mine):
        return Moves.empty()
    # runs of consecutive points of the node: [first, last]
    breaks = np.flatnonzero(np.diff(mine) != 1)
    firsts = mine[np.concatenate(([0], breaks + 1))]
    lasts = mine[np.concatenate((breaks, [len(mine) - 1]))]
    # the point before a run is another node's (wrapping: before point 0 comes the last point not the node's)
    before = firsts - 1
    if before[0] < 0:
        others = np.flatnonzero(owners != slot)
        before[0] = others[-1]
    other = label[owners[before]]
    starts = pos[firsts]
    ends = np.empty(len(lasts), dtype=np.uint64)
    inner = lasts + 1 < count
    ends[inner] = pos[lasts[inner] + 1]
    ends[~inner] = 0  # 2**64
    me = np.full(len(starts), ids[node], dtype=np.int32)
    if owners[-1] == slot and pos[0] > 0:  # the node's last point owns [0, first point) too
        starts = np.concatenate((np.zeros(1, np.uint64), starts))
        ends = np.concatenate((pos[:1], ends))
        other = np.concatenate((other[-1:], other))
        me = np.concatenate((me[:1], me))
    # drop empty arcs (a point shared with another node that sorts after it), then join neighbours with the same
    # owners (possible only around such a shared point, or at a run starting at the ring's first point)
    keep = starts != ends
    starts, ends, other, me = starts[keep], ends[keep], other[keep], me[keep]
    join = np.flatnonzero((ends[:-1] == starts[1:]) & (other[:-1] == other[1:]))
    if len(join):
        first = np.ones(len(starts), dtype=bool)
        first[join + 1] = False
        last = np.ones(len(starts), dtype=bool)
        last[join] = False
        starts, other, me = starts[first], other[first], me[first]
        ends = ends[last]
    previous, nxt = (other, me) if joined else (me, other)
    return Moves(starts=starts, ends=ends, previous=previous, next=nxt, names=tuple(names))


def diff_moves(old: Ring, new: Ring) -> Moves:
    """``diff(old, new)`` as arrays: the maximal arcs whose owner differs, in position order, split at zero
    (neighbouring arcs with the same previous and next owners are always one arc)."""
    if not old.point_count and not new.point_count:
        return Moves.empty()
    changed = sorted(node for node in set(old._weights) | set(new._weights)
                     if old._weights.get(node) != new._weights.get(node))
    if not changed:
        return Moves.empty()
    names = sorted(set(old._weights) | set(new._weights))
    for alone, other, was_alone in ((old, new, True), (new, old, False)):
        if len(alone._weights) == 1 and other.point_count and next(iter(alone._weights)) in other._weights:
            return _against_one_node(other, next(iter(alone._weights)), names, was_alone=was_alone)
    if len(changed) == 1 and old.point_count and new.point_count and old.points_per_weight == new.points_per_weight:
        node = changed[0]
        if node not in old._weights:
            return _one_node_moves(new, node, names, joined=True)
        if node not in new._weights:
            return _one_node_moves(old, node, names, joined=False)
    changed_points = sum(w.get(node, 0) for node in changed for w in (old._weights, new._weights))
    if (old.points_per_weight == new.points_per_weight
            and 4 * changed_points * old.points_per_weight < old.point_count + new.point_count):
        bounds = _changed_boundaries(old, new, changed)
    else:
        bounds = _sorted_unique(np.concatenate([old._run_arrays()[0], new._run_arrays()[0], np.zeros(1, np.uint64)]))
    ids = {node: index for index, node in enumerate(names)}
    was, now = _owner_ids(old, bounds, ids), _owner_ids(new, bounds, ids)
    moved = was != now
    if not moved.any():
        return Moves.empty()
    # a move starts where owners differ and the previous interval did not move or moved between other nodes
    same = moved[:-1] & moved[1:] & (was[1:] == was[:-1]) & (now[1:] == now[:-1])
    first = moved.copy()
    first[1:] &= ~same
    # ... and ends at the next boundary where that stops
    last = moved.copy()
    last[:-1] &= ~same
    ends_at = np.flatnonzero(last) + 1
    edges = np.empty(len(bounds) + 1, dtype=np.uint64)
    edges[:-1] = bounds
    edges[-1] = 0  # 2**64, modulo 2**64
    return Moves(starts=bounds[first], ends=edges[ends_at], previous=was[first].astype(np.int32),
                 next=now[first].astype(np.int32), names=tuple(names))


def wire_moves(moves: Moves) -> Moves:
    """``moves`` (of ``diff_moves``) in the hand-off's form: a move ending at 2**64 and one starting at 0 with the
    same owners become one wrapping arc (end < start), put first; an end of 2**64 is written 0. Both ends of a
    hand-off use it, so they agree on arcs (the array form of ``handoff_arcs``)."""
    if moves.wire:
        return moves
    starts, ends, previous, nxt = moves.starts, moves.ends, moves.previous, moves.next
    n = len(starts)
    if (n >= 2 and int(starts[0]) == 0 and int(ends[-1]) == 0
            and int(previous[0]) == int(previous[-1]) and int(nxt[0]) == int(nxt[-1])):
        order = np.concatenate(([n - 1], np.arange(1, n - 1)))
        ends = ends[order]
        ends[0] = moves.ends[0]
        starts, previous, nxt = starts[order], previous[order], nxt[order]
    return Moves(starts=starts, ends=ends, previous=previous, next=nxt, names=moves.names, wire=True)


def diff(old: Ring, new: Ring) -> list[ArcMove]:
    """The maximal arcs whose owner differs between ``old`` and ``new``, in position order (``diff_moves`` as a
    list of ``ArcMove``: one object per arc, which a large view change pays for)."""
    return list(diff_moves(old, new))


def moved_fraction(moves: list[ArcMove] | Moves) -> float:
    """The fraction of the key space covered by ``moves``."""
    if isinstance(moves, Moves):
        return float(moves.lengths().sum()) / RING_SPACE if moves else 0.0
    return sum((move.end - move.start) % RING_SPACE or RING_SPACE for move in moves) / RING_SPACE
