"""The weighted virtual-node ring: who owns which host.

Each node places ``weight * points_per_weight`` points on the 2**64 circle (see ``_hash.node_points``). A position
belongs to the node of the nearest point at or before it (counter-clockwise), so the arcs are half-open
``[point, next point)``. Because a node's points depend only on its own id and weight:

- every position has exactly one owner, the same in every process;
- a join moves positions only to the new node, a leave only away from the leaving node;
- a leave followed by the same join restores the placement exactly, and the order nodes were added in is
  irrelevant (points at one position are ordered by node id).

The points live in numpy arrays: a sorted ``uint64`` array of positions and, shifted by one, the owner of each
arc as a small integer (a "slot" naming a node). A build hashes every node's points (SHAKE-128, in C), sorts them
once and counts them per bucket (the top bits of a position); a lookup takes the bucket's range of points from
that table and bisects within it (one or two probes), through zero-copy ``memoryview``s so that no numpy scalar is
made on the hot path. ``with_weights`` derives the ring of a new view from this one by inserting or removing only
the points of the nodes that changed, and equals a fresh build. ``docs/ring.md`` has the measured figures.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from hashlib import blake2b, shake_128

import numpy as np

from ._hash import _POINT_DOMAIN, RING_SPACE
from ._zones import Zones

__all__ = ["Arc", "DEFAULT_POINTS_PER_WEIGHT", "EmptyRingError", "MAX_POINTS", "Ring"]

#: Points per unit of weight. A node's key-space share misses its weight share by about 1/sqrt(points), so the
#: smallest node of the design (weight 40) gets 40,000 points: a 0.5% standard error, 2% at four sigma.
#: A large fleet sets fewer (see docs/ring.md: "Sizing the ring").
DEFAULT_POINTS_PER_WEIGHT = 1000

#: Largest ring we agree to build: 10 bytes per point once built (plus a 16 MiB bucket table), about 30 while
#: sorting (see docs/ring.md).
MAX_POINTS = 20_000_000

_MAX_BUCKET_BITS = 22
#: Nodes a ring names at once (owner slots are uint16; a ring past this many slots compacts them on rebuild).
_MAX_SLOTS = 65_535
_from_bytes = int.from_bytes


def _bucket_shift(count: int) -> int:
    """64 minus the bucket bits for a ring of ``count`` points: two to four points per bucket (their 16-32 bytes
    share a cache line, so the bisect within a bucket costs one memory access), at most 2**22 buckets."""
    return 64 - min(_MAX_BUCKET_BITS, max(4, (count // 4).bit_length()))


class EmptyRingError(LookupError):
    """A lookup on a ring with no nodes: the caller asked before any member could own anything."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Arc:
    """Positions ``start <= p < end`` owned by ``owner``. ``arcs()`` never returns a wrapping arc: the arc through
    zero is split in two, one ending at 2**64 and one starting at 0."""

    start: int
    end: int
    owner: str


#: A slot of the slot table freed by a node that left (node ids are non-empty), which no point names.
_FREE = ""


class _NoOwner:
    """Stands in for the slot table of an empty ring, so lookups need no emptiness test."""

    __slots__ = ()

    def __getitem__(self, index: int) -> str:
        raise EmptyRingError("the ring has no nodes: no member is alive or suspect in this view")

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Iterator[str]:
        return iter(())


def _positions(node: str, count: int) -> np.ndarray:
    """``node_points(node, count)`` as a numpy ``uint64`` array (the same SHAKE-128 words, read big-endian)."""
    raw = shake_128(_POINT_DOMAIN + node.encode()).digest(8 * count)
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64)


def _count_buckets(delta: np.ndarray, points: np.ndarray, shift: int, sign: int) -> None:
    """Add ``sign`` times the number of ``points`` (sorted) in each bucket to ``delta``: work per point, where a
    ``bincount`` would allocate and convert a count for each of up to 4 M buckets."""
    if not len(points):
        return
    buckets = (points >> np.uint64(shift)).astype(np.intp)
    firsts = np.flatnonzero(np.concatenate(([True], buckets[1:] != buckets[:-1])))
    counts = np.diff(np.append(firsts, len(buckets))).astype(np.int32)
    delta[buckets[firsts]] += counts if sign > 0 else -counts


def _check(weights: Mapping[str, int], points_per_weight: int) -> None:
    if isinstance(points_per_weight, bool) or not isinstance(points_per_weight, int) or points_per_weight < 1:
        raise ValueError(f"points_per_weight must be an integer >= 1, got {points_per_weight!r}")
    for node, weight in weights.items():
        if not isinstance(node, str) or not node:
            raise ValueError(f"node ids must be non-empty strings, got {node!r}")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise ValueError(f"weight of node {node!r} must be an integer >= 1, got {weight!r}")
    if len(weights) > _MAX_SLOTS:
        raise ValueError(f"a ring holds at most {_MAX_SLOTS:,} nodes, got {len(weights):,}")
    total = sum(weights.values()) * points_per_weight
    if total > MAX_POINTS:
        raise ValueError(
            f"the ring would hold {total:,} points (total weight {sum(weights.values()):,} x "
            f"points_per_weight {points_per_weight}), over the limit of {MAX_POINTS:,}; "
            "use smaller weights or fewer points per weight"
        )


class Ring:
    """A weighted consistent-hash ring over node ids. Immutable once built."""

    __slots__ = ("_weights", "_nodes", "_ppw", "_pos", "_after", "_slots", "_slot_of", "_count", "_buckets",
                 "_shift", "_points", "_after_view", "_bucket_view")

    #: Each slot's node id (`_FREE` for a freed slot); the owner arrays hold slot numbers.
    _slots: list[str] | _NoOwner
    _shift: int
    _buckets: np.ndarray  # point counts per bucket, accumulated: bucket b's points are [_buckets[b], _buckets[b + 1])

    def __init__(self, weights: Mapping[str, int], *, points_per_weight: int = DEFAULT_POINTS_PER_WEIGHT) -> None:
        _check(weights, points_per_weight)
        self._nodes: tuple[str, ...] = tuple(sorted(weights))
        self._weights = {node: weights[node] for node in self._nodes}
        self._ppw = points_per_weight
        self._build()

    # -- building --------------------------------------------------------------------------------------------

    def _build(self) -> None:
        """Every point hashed and sorted: slots are the nodes in id order, so ties sort by node id."""
        nodes = self._nodes
        counts = np.array([self._weights[node] * self._ppw for node in nodes], dtype=np.int64)
        pos = np.concatenate([_positions(node, int(k)) for node, k in zip(nodes, counts)]) if nodes else \
            np.zeros(0, np.uint64)
        slot = np.repeat(np.arange(len(nodes), dtype=np.uint16), counts)
        order = np.argsort(pos)  # not stable, so equal positions are put in node order below
        pos = pos[order]
        slot = slot[order]
        del order
        ties = np.flatnonzero(pos[1:] == pos[:-1])
        if ties.size:  # two nodes' points at one position (about one ring in a million): node id order
            for start in ties[np.concatenate(([True], np.diff(ties) > 1))].tolist():
                end = start + 1
                while end < len(pos) and pos[end] == pos[start]:
                    end += 1
                slot[start:end] = np.sort(slot[start:end])
        self._install(pos, slot, list(nodes))

    def _install(self, pos: np.ndarray, slot: np.ndarray, slots: list[str]) -> None:
        """Adopt sorted positions and their owners' slots (a fresh build)."""
        after = np.empty(len(pos) + 1, dtype=np.uint16)
        after[1:] = slot
        self._adopt(pos, after, slots, None)

    def _adopt(self, pos: np.ndarray, after: np.ndarray, slots: list[str],
               buckets: tuple[int, np.ndarray] | None) -> None:
        """Adopt sorted positions and the owner array shifted by one (``after[0]`` is set here); ``buckets`` is a
        bucket table already made for these points, with its shift, or None to count them."""
        count = len(pos)
        after[0] = after[-1] if count else 0
        self._pos = pos
        self._after = after
        self._slots = slots if count else _NoOwner()
        self._slot_of = {node: index for index, node in enumerate(slots) if node != _FREE}
        self._count = count
        if buckets is None or buckets[0] != _bucket_shift(count):
            shift = _bucket_shift(count)
            per_bucket = np.bincount((pos >> np.uint64(shift)).astype(np.intp), minlength=1 << (64 - shift))
            table = np.zeros((1 << (64 - shift)) + 1, dtype=np.uint32)
            np.cumsum(per_bucket, out=table[1:])
            buckets = (shift, table)
        self._shift, self._buckets = buckets
        # the arrays' buffers as memoryviews (`.data`: the same view `memoryview(array)` gives)
        self._points = pos.data
        self._after_view = after.data
        self._bucket_view = self._buckets.data

    def with_weights(self, weights: Mapping[str, int]) -> Ring:
        """The ring of ``weights`` (same points per weight), derived from this one: only the points of nodes that
        joined, left or changed weight are inserted or removed, so the cost is that of those nodes' points plus
        one copy of the arrays. Equal to ``Ring(weights, points_per_weight=...)`` in every lookup and arc."""
        _check(weights, self._ppw)
        changed = sorted(node for node in set(weights) | set(self._weights)
                         if weights.get(node) != self._weights.get(node))
        if not changed:
            return self
        unchanged = len(weights) - sum(1 for node in changed if node in weights)
        if not self._count or unchanged < len(changed) or len(self._slots) + len(changed) > _MAX_SLOTS:
            return Ring(weights, points_per_weight=self._ppw)
        ring = Ring.__new__(Ring)
        ring._nodes = tuple(sorted(weights))
        ring._weights = {node: weights[node] for node in ring._nodes}
        ring._ppw = self._ppw
        pos, after, slots = self._pos, self._after, list(self._slots)
        shift, table = self._shift, self._buckets
        bucket_delta = np.zeros(len(table) - 1, dtype=np.int32)
        gone = [self._slot_of[node] for node in changed if node in self._weights]
        if gone:
            owners = after[1:]
            drop = owners == gone[0] if len(gone) == 1 else np.isin(owners, np.array(gone, dtype=np.uint16))
            _count_buckets(bucket_delta, pos[drop], shift, -1)
            keep = ~drop
            pos = pos[keep]  # boolean indexing: several times faster than np.compress on 10 M points
            trimmed = np.empty(len(pos) + 1, dtype=np.uint16)
            trimmed[1:] = owners[keep]
            after = trimmed
            for index in gone:
                slots[index] = _FREE
        arriving = [node for node in changed if node in weights]
        if arriving:
            free = [index for index, node in enumerate(slots) if node == _FREE]
            new_pos, new_slot = [], []
            for node in arriving:
                index = free.pop() if free else len(slots)
                if index == len(slots):
                    slots.append(node)
                else:
                    slots[index] = node
                points = _positions(node, weights[node] * self._ppw)
                new_pos.append(points)
                new_slot.append(np.full(len(points), index, dtype=np.uint16))
            add_pos = np.concatenate(new_pos)
            order = np.argsort(add_pos)
            add_pos, add_slot = add_pos[order], np.concatenate(new_slot)[order]
            # how many points lie at or before each new one (through the bucket table while it still fits `pos`)
            at = np.searchsorted(pos, add_pos, side="right") if gone else self._search(add_pos)
            hit = at > 0
            if np.any(pos[at[hit] - 1] == add_pos[hit]) or np.any(add_pos[1:] == add_pos[:-1]):
                return Ring(weights, points_per_weight=self._ppw)  # a point shared with another: order by id
            _count_buckets(bucket_delta, add_pos, shift, 1)
            # where each new point lands in the merged arrays, and where the old ones go
            landing = at + np.arange(len(at))
            is_new = np.zeros(len(pos) + len(add_pos), dtype=bool)
            is_new[landing] = True
            old_slots = ~is_new
            merged = np.empty(len(is_new), dtype=np.uint64)
            merged[landing] = add_pos
            merged[old_slots] = pos  # a boolean-mask assignment: faster than np.place here, 3x for uint16
            grown = np.empty(len(is_new) + 1, dtype=np.uint16)
            owners = grown[1:]
            owners[landing] = add_slot
            owners[old_slots] = after[1:]
            pos, after = merged, grown
        # the counts below each bucket move by the points added and removed (uint32 arithmetic wraps, and the
        # true result is in range, so adding a negative change cast to uint32 is exact)
        table = table.copy()
        table[1:] += np.cumsum(bucket_delta, dtype=np.int32).view(np.uint32)
        ring._adopt(pos, after, slots, (shift, table))
        return ring

    # -- lookups -------------------------------------------------------------------------------------------

    def _search(self, at: np.ndarray) -> np.ndarray:
        """``np.searchsorted(self._pos, at, side="right")`` for a ``uint64`` array, through the bucket table: each
        query steps through its bucket's 2-4 points, vectorized over the queries still stepping, instead of
        bisecting the whole ring (about 3x faster for 150,000 queries into 10 M points)."""
        if len(at) < 64 or not self._count:
            return np.searchsorted(self._pos, at, side="right")
        bucket = (at >> np.uint64(self._shift)).astype(np.intp)
        found = self._buckets[bucket].astype(np.intp)
        end = self._buckets[bucket + 1].astype(np.intp)
        pos = self._pos
        active = np.flatnonzero(found < end)
        while len(active):  # at most the most points in one bucket, and the set shrinks at each step
            active = active[pos[found[active]] <= at[active]]
            found[active] += 1
            active = active[found[active] < end[active]]
        return found

    def owner(self, host: str) -> str:
        """The node that owns ``host`` (lower-case IDNA, no port)."""
        position = _from_bytes(blake2b(host.encode(), digest_size=8).digest(), "big")
        bucket = position >> self._shift
        buckets = self._bucket_view
        return self._slots[self._after_view[bisect_right(self._points, position, buckets[bucket],
                                                         buckets[bucket + 1])]]

    def owner_at(self, position: int) -> str:
        """The node that owns ring position ``position`` (0 <= position < 2**64)."""
        if not 0 <= position < RING_SPACE:
            raise ValueError(f"ring positions are 0 <= p < 2**64, got {position}")
        bucket = position >> self._shift
        buckets = self._bucket_view
        return self._slots[self._after_view[bisect_right(self._points, position, buckets[bucket],
                                                         buckets[bucket + 1])]]

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
        after, slots = self._after_view, self._slots
        # after[m + 1] owns point m; the position's own point is the last one at or before it (wrapping).
        m = bisect_right(self._points, position) - 1
        taken = [after[m + 1]]
        for _ in range(total):
            m = m - 1 if m > 0 else total - 1
            slot = after[m + 1]
            if slot not in taken:
                taken.append(slot)
                if len(taken) > wanted:
                    break
        return tuple(slots[slot] for slot in taken[1:])

    def holders_at(self, position: int, count: int, zones: Zones | None = None) -> tuple[str, ...]:
        """The nodes that keep copies of ``position``'s queued URLs and seen keys: ``backups_at(position, count)``
        and, when every one of those is in the owner's zone, also the first node after them in another zone (the
        one that owns the position once the owner's whole zone is gone: see ``ring/_zones.py``). Nothing when
        ``count`` is 0."""
        backups = self.backups_at(position, count)
        if not backups or zones is None or not zones:
            return backups
        owner, slots = self.owner_at(position), self._slots
        home = zones.zone(owner)
        if not home or any(zones.zone(node) != home for node in backups):
            return backups
        if zones.alone(owner, len(self._nodes)):
            return backups  # every node of the ring is in the owner's zone: no copy can be kept off it
        after, total = self._after_view, self._count
        m = bisect_right(self._points, position) - 1
        for _ in range(total):
            m = m - 1 if m > 0 else total - 1
            node = slots[after[m + 1]]
            if zones.zone(node) != home:
                return (*backups, node)
        return backups

    def owners_at(self, positions: list[int]) -> list[str]:
        """The owner of each of ``positions`` (in range, unchecked): the batch form of ``owner_at``."""
        if not self._count:
            raise EmptyRingError("the ring has no nodes: no member is alive or suspect in this view")
        if len(positions) > 64:
            at = np.searchsorted(self._pos, np.asarray(positions, dtype=np.uint64), side="right")
            return [self._slots[slot] for slot in self._after[at].tolist()]
        points, after, buckets, shift, slots = (self._points, self._after_view, self._bucket_view, self._shift,
                                                self._slots)
        return [slots[after[bisect_right(points, p, buckets[p >> shift], buckets[(p >> shift) + 1])]]
                for p in positions]

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

    @property
    def nbytes(self) -> int:
        """Bytes held by the ring's arrays (positions, owners, bucket table)."""
        return self._pos.nbytes + self._after.nbytes + self._buckets.nbytes

    def _run_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Maximal arcs as (starts, slots): arc i is [starts[i], starts[i+1]) (the last ends at 2**64), no
        zero-length arc, neighbours owned by different slots unless the ring has one arc."""
        if not self._count:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint16)
        starts = np.empty(self._count + 1, dtype=np.uint64)
        starts[0] = 0
        starts[1:] = self._pos
        owners = self._after
        # drop zero-length arcs (a point at 0, or several points at one position): the last one there owns it
        keep = np.ones(len(starts), dtype=bool)
        keep[:-1] = starts[1:] != starts[:-1]
        starts, owners = starts[keep], owners[keep]
        change = np.ones(len(starts), dtype=bool)
        change[1:] = owners[1:] != owners[:-1]
        return starts[change], owners[change]

    def runs(self) -> Iterator[tuple[int, int, str]]:
        """``(start, end, owner)`` for every maximal arc, in order from 0 to 2**64, wrap split (see ``Arc``)."""
        starts, owners = self._run_arrays()
        slots = self._slots
        bounds = starts.tolist()
        bounds.append(RING_SPACE)
        for index, slot in enumerate(owners.tolist()):
            yield bounds[index], bounds[index + 1], slots[slot]

    def arcs(self) -> list[Arc]:
        """Every maximal arc as an ``Arc``, in order; together they cover [0, 2**64) exactly once."""
        return [Arc(start=start, end=end, owner=owner) for start, end, owner in self.runs()]

    def shares(self) -> dict[str, float]:
        """Each node's fraction of the key space (sums to 1 for a non-empty ring)."""
        if not self._count:
            return {}
        starts, owners = self._run_arrays()
        lengths = np.empty(len(starts), dtype=np.float64)
        lengths[:-1] = np.diff(starts).astype(np.float64)
        lengths[-1] = float(RING_SPACE - int(starts[-1]))
        per_slot = np.bincount(owners.astype(np.intp), weights=lengths, minlength=len(self._slots))
        return {node: float(per_slot[self._slot_of[node]]) / RING_SPACE for node in self._nodes}

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
