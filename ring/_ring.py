"""The weighted virtual-node ring: who owns which host.

Each node places ``weight * points_per_weight`` points on the 2**64 circle (see ``_hash.node_points``). A position
belongs to the node of the nearest point at or before it (counter-clockwise), so the arcs are half-open
``[point, next point)``. Because a node's points depend only on its own id and weight:

- every position has exactly one owner, the same in every process;
- a join moves positions only to the new node, a leave only away from the leaving node;
- a leave followed by the same join restores the placement exactly, and the order nodes were added in is
  irrelevant (points at one position are ordered by node id).

Lookups are on the hot path of every link the crawler finds, so ``owner`` is built for speed: the sorted points
sit in a compact ``array('Q')``; the top bits of the position pick a bucket whose owner is stored directly when
one arc covers it (most buckets); otherwise a bucket table narrows the bisect to a point or two, and a list of
owners shifted by one turns "the point before" into a plain index (index 0 is the arc through zero). ``docs/ring.md`` has the measured figures behind ``DEFAULT_POINTS_PER_WEIGHT``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from hashlib import blake2b
from itertools import accumulate, islice, repeat
from operator import and_, lshift, or_, rshift

from ._hash import RING_SPACE, node_points

__all__ = ["Arc", "DEFAULT_POINTS_PER_WEIGHT", "EmptyRingError", "MAX_POINTS", "Ring"]

#: Points per unit of weight. A node's key-space share misses its weight share by about 1/sqrt(points), so the
#: smallest node of the design (weight 40) gets 40,000 points: a 0.5% standard error, 2% at four sigma.
DEFAULT_POINTS_PER_WEIGHT = 1000

#: Largest ring we agree to build: about 40 bytes per point once built, ~75 while sorting (see docs/ring.md).
MAX_POINTS = 20_000_000

_MAX_BUCKET_BITS = 22
_from_bytes = int.from_bytes


class EmptyRingError(LookupError):
    """A lookup on a ring with no nodes: the caller asked before any member could own anything."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Arc:
    """Positions ``start <= p < end`` owned by ``owner``. ``arcs()`` never returns a wrapping arc: the arc through
    zero is split in two, one ending at 2**64 and one starting at 0."""

    start: int
    end: int
    owner: str


class _NoOwner:
    """Stands in for the owner list of an empty ring, so lookups need no emptiness test."""

    __slots__ = ()

    def __getitem__(self, index: int) -> str:
        raise EmptyRingError("the ring has no nodes: no member is alive or suspect in this view")


class Ring:
    """A weighted consistent-hash ring over node ids. Immutable once built."""

    __slots__ = ("_weights", "_nodes", "_ppw", "_points", "_count", "_after", "_buckets", "_shift", "_direct")

    def __init__(self, weights: Mapping[str, int], *, points_per_weight: int = DEFAULT_POINTS_PER_WEIGHT) -> None:
        if isinstance(points_per_weight, bool) or not isinstance(points_per_weight, int) or points_per_weight < 1:
            raise ValueError(f"points_per_weight must be an integer >= 1, got {points_per_weight!r}")
        for node, weight in weights.items():
            if not isinstance(node, str) or not node:
                raise ValueError(f"node ids must be non-empty strings, got {node!r}")
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                raise ValueError(f"weight of node {node!r} must be an integer >= 1, got {weight!r}")
        total = sum(weights.values()) * points_per_weight
        if total > MAX_POINTS:
            raise ValueError(
                f"the ring would hold {total:,} points (total weight {sum(weights.values()):,} x "
                f"points_per_weight {points_per_weight}), over the limit of {MAX_POINTS:,}; "
                "use smaller weights or fewer points per weight"
            )
        self._nodes: tuple[str, ...] = tuple(sorted(weights))
        self._weights = {node: weights[node] for node in self._nodes}
        self._ppw = points_per_weight
        self._build()

    def _build(self) -> None:
        nodes = self._nodes
        bits = max(1, (len(nodes) - 1).bit_length())
        # Sort (position, node index) pairs packed into one int: C-speed sort, ties broken by node id.
        packed: list[int] = []
        for index, node in enumerate(nodes):
            points = node_points(node, self._weights[node] * self._ppw)
            packed.extend(map(or_, map(lshift, points, repeat(bits)), repeat(index)))
        packed.sort()
        self._points = array("Q", map(rshift, packed, repeat(bits)))
        owners = list(map(nodes.__getitem__, map(and_, packed, repeat((1 << bits) - 1))))
        del packed
        count = len(owners)
        bucket_bits = min(_MAX_BUCKET_BITS, max(4, (2 * count).bit_length()))
        shift = self._shift = 64 - bucket_bits
        # _buckets[b] = number of points below the start of bucket b (one extra entry closes the last bucket).
        per_bucket = [0] * (1 << bucket_bits)
        for bucket, n in Counter(map(rshift, self._points, repeat(shift))).items():
            per_bucket[bucket] = n
        self._buckets = array("I", accumulate(per_bucket, initial=0))
        # _after[i] is the owner of the arc holding a position with i points at or below it.
        self._count = count
        if owners:
            owners.insert(0, owners[-1])
        self._after: list[str] | _NoOwner = owners if owners else _NoOwner()
        # _direct[b] is the owner of bucket b when one arc covers all of it (most buckets), else None.
        direct: list[str | None] = [None] * (1 << bucket_bits)
        size = 1 << shift
        for start, end, owner in self.runs():
            first, last = -(-start // size), end >> shift
            if last > first:
                direct[first:last] = repeat(owner, last - first)
        self._direct = direct

    # -- lookups -------------------------------------------------------------------------------------------

    def owner(self, host: str) -> str:
        """The node that owns ``host`` (lower-case IDNA, no port)."""
        position = _from_bytes(blake2b(host.encode(), digest_size=8).digest(), "big")
        bucket = position >> self._shift
        owner = self._direct[bucket]
        if owner is None:
            buckets = self._buckets
            owner = self._after[bisect_right(self._points, position, buckets[bucket], buckets[bucket + 1])]
        return owner

    def owner_at(self, position: int) -> str:
        """The node that owns ring position ``position`` (0 <= position < 2**64)."""
        if not 0 <= position < RING_SPACE:
            raise ValueError(f"ring positions are 0 <= p < 2**64, got {position}")
        bucket = position >> self._shift
        owner = self._direct[bucket]
        if owner is None:
            buckets = self._buckets
            owner = self._after[bisect_right(self._points, position, buckets[bucket], buckets[bucket + 1])]
        return owner

    def backup_at(self, position: int) -> str | None:
        """The node that would own ``position`` if its owner left (None in a ring of one): ``backups_at``'s first."""
        backups = self.backups_at(position, 1)
        return backups[0] if backups else None

    def backups_at(self, position: int, count: int) -> tuple[str, ...]:
        """Up to ``count`` nodes that would own ``position`` if the nodes before them left, in order: the first
        owns it once its owner is gone, the second once the owner and the first are gone, and so on (exactly
        ``Ring(weights without them).owner_at(position)``, since a node's points do not depend on the others).
        They are the owners of the nearest points at or before the position that belong to other nodes."""
        if not 0 <= position < RING_SPACE:
            raise ValueError(f"ring positions are 0 <= p < 2**64, got {position}")
        total = self._count
        if not total:
            raise EmptyRingError("the ring has no nodes: no member is alive or suspect in this view")
        wanted = min(count, len(self._nodes) - 1)
        if wanted <= 0:
            return ()
        after = self._after
        # after[m + 1] owns point m; the position's own point is the last one at or before it (wrapping).
        m = bisect_right(self._points, position) - 1
        taken = [after[m + 1]]
        for _ in range(total):
            m = m - 1 if m > 0 else total - 1
            node = after[m + 1]
            if node not in taken:
                taken.append(node)
                if len(taken) > wanted:
                    break
        return tuple(taken[1:])

    def owners_at(self, positions: list[int]) -> list[str]:
        """The owner of each of ``positions`` (in range, unchecked): the batch form of ``owner_at``."""
        if not self._count:
            raise EmptyRingError("the ring has no nodes: no member is alive or suspect in this view")
        points, after, buckets, shift, direct = self._points, self._after, self._buckets, self._shift, self._direct
        return [
            direct[p >> shift] or after[bisect_right(points, p, buckets[p >> shift], buckets[(p >> shift) + 1])]
            for p in positions
        ]

    # -- structure -----------------------------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node ids, sorted."""
        return self._nodes

    @property
    def weights(self) -> dict[str, int]:
        """A copy of the weights the ring was built from."""
        return dict(self._weights)

    @property
    def points_per_weight(self) -> int:
        return self._ppw

    @property
    def point_count(self) -> int:
        return self._count

    def runs(self) -> Iterator[tuple[int, int, str]]:
        """``(start, end, owner)`` for every maximal arc, in order from 0 to 2**64, wrap split (see ``Arc``)."""
        if not self._count:
            return
        after = self._after
        current, start = after[0], 0
        for position, owner in zip(self._points, islice(after, 1, None)):
            if owner is not current:
                if position > start:
                    yield start, position, current
                start, current = position, owner
        yield start, RING_SPACE, current

    def arcs(self) -> list[Arc]:
        """Every maximal arc as an ``Arc``, in order; together they cover [0, 2**64) exactly once."""
        arcs: list[Arc] = []
        for start, end, owner in self.runs():
            if arcs and arcs[-1].owner == owner:  # neighbours split only by a zero-length arc
                start = arcs.pop().start
            arcs.append(Arc(start=start, end=end, owner=owner))
        return arcs

    def shares(self) -> dict[str, float]:
        """Each node's fraction of the key space (sums to 1 for a non-empty ring)."""
        lengths = dict.fromkeys(self._nodes, 0)
        for start, end, owner in self.runs():
            lengths[owner] += end - start
        return {node: length / RING_SPACE for node, length in lengths.items()}

    def weight_shares(self) -> dict[str, float]:
        """Each node's fraction of the total weight: what ``shares()`` aims at."""
        total = sum(self._weights.values())
        return {node: weight / total for node, weight in self._weights.items()}

    # -- value semantics ---------------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ring):
            return NotImplemented
        return self._ppw == other._ppw and self._weights == other._weights

    def __hash__(self) -> int:
        return hash((self._ppw, tuple(self._weights.items())))

    def __repr__(self) -> str:
        return f"Ring({self._weights!r}, points_per_weight={self._ppw})"
