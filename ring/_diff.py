"""Which arcs change owner between two rings: the work list of a hand-off.

When the view changes, the previous owner of every moved arc streams that arc's state to the next owner. Since
seen-URL keys begin with the host's ring position, each ``ArcMove`` is one contiguous key range to scan.

Only positions at or after a point of a node that joined, left or changed weight, and before the next point that
is in both rings, can change owner. So when both rings have the same points per weight and few nodes changed,
``diff`` evaluates both rings only at those nodes' points and the point that follows each of them: the cost is that
of the changed nodes' points, not of the ring. Otherwise it evaluates both rings at every arc start of either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._hash import RING_SPACE
from ._ring import Ring, _positions

__all__ = ["ArcMove", "diff", "moved_fraction"]


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
    table = np.array([ids[node] if node is not None else -2 for node in ring._slots], dtype=np.int64)
    return table[ring._after[np.searchsorted(ring._pos, at, side="right")]]


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
            after = np.searchsorted(ring._pos, changed_points, side="right")
            bounds.append(ring._pos[after[after < ring.point_count]])
    return _sorted_unique(np.concatenate(bounds))


def diff(old: Ring, new: Ring) -> list[ArcMove]:
    """The maximal arcs whose owner differs between ``old`` and ``new``, in position order."""
    if not old.point_count and not new.point_count:
        return []
    changed = sorted(node for node in set(old._weights) | set(new._weights)
                     if old._weights.get(node) != new._weights.get(node))
    if not changed:
        return []
    changed_points = sum(w.get(node, 0) for node in changed for w in (old._weights, new._weights))
    if (old.points_per_weight == new.points_per_weight
            and 4 * changed_points * old.points_per_weight < old.point_count + new.point_count):
        bounds = _changed_boundaries(old, new, changed)
    else:
        bounds = _sorted_unique(np.concatenate([old._run_arrays()[0], new._run_arrays()[0], np.zeros(1, np.uint64)]))
    names = sorted(set(old._weights) | set(new._weights))
    ids = {node: index for index, node in enumerate(names)}
    was, now = _owner_ids(old, bounds, ids), _owner_ids(new, bounds, ids)
    moved = was != now
    if not moved.any():
        return []
    # a move starts where owners differ and the previous interval did not move or moved between other nodes
    first = moved.copy()
    first[1:] &= ~(moved[:-1] & (was[1:] == was[:-1]) & (now[1:] == now[:-1]))
    # ... and ends at the next boundary where that stops
    last = moved.copy()
    last[:-1] &= ~(moved[1:] & (was[1:] == was[:-1]) & (now[1:] == now[:-1]))
    starts = bounds[first].tolist()
    ends_at = np.flatnonzero(last) + 1
    edges = bounds.tolist()
    edges.append(RING_SPACE)
    label = [*names, None]  # id -1 (an empty ring) names None
    return [ArcMove(start=start, end=edges[end], previous=label[p], next=label[n])
            for start, end, p, n in zip(starts, ends_at.tolist(), was[first].tolist(), now[first].tolist())]


def moved_fraction(moves: list[ArcMove]) -> float:
    """The fraction of the key space covered by ``moves``."""
    return sum(move.end - move.start for move in moves) / RING_SPACE
