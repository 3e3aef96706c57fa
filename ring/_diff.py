"""Which arcs change owner between two rings: the work list of a hand-off.

When the view changes, the previous owner of every moved arc streams that arc's state to the next owner. Since
seen-URL keys begin with the host's ring position, each ``ArcMove`` is one contiguous key range to scan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ._hash import RING_SPACE
from ._ring import Ring

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


def _runs(ring: Ring) -> Iterator[tuple[int, int, str | None]]:
    if ring.nodes:
        return ring.runs()
    return iter([(0, RING_SPACE, None)])


def diff(old: Ring, new: Ring) -> list[ArcMove]:
    """The maximal arcs whose owner differs between ``old`` and ``new``, in position order.

    Streams both rings' arcs side by side: memory is the answer's, not the rings'.
    """
    before, after = _runs(old), _runs(new)
    moves: list[ArcMove] = []
    open_start = open_prev = open_next = None  # the move being extended, if any
    _, end_a, owner_a = next(before)
    _, end_b, owner_b = next(after)
    start = 0
    while start < RING_SPACE:
        end = end_a if end_a < end_b else end_b
        if owner_a != owner_b:
            if open_start is not None and (open_prev != owner_a or open_next != owner_b):
                moves.append(ArcMove(start=open_start, end=start, previous=open_prev, next=open_next))
                open_start = None
            if open_start is None:
                open_start, open_prev, open_next = start, owner_a, owner_b
        elif open_start is not None:
            moves.append(ArcMove(start=open_start, end=start, previous=open_prev, next=open_next))
            open_start = None
        if end < RING_SPACE:
            if end == end_a:
                _, end_a, owner_a = next(before)
            if end == end_b:
                _, end_b, owner_b = next(after)
        start = end
    if open_start is not None:
        moves.append(ArcMove(start=open_start, end=RING_SPACE, previous=open_prev, next=open_next))
    return moves


def moved_fraction(moves: list[ArcMove]) -> float:
    """The fraction of the key space covered by ``moves``."""
    return sum(move.end - move.start for move in moves) / RING_SPACE
