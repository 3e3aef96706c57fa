"""Rings and their differences, kept by value so that the nodes holding one `RingCache` share them.

A ring is a pure function of its members' weights and its points per weight, and the moved arcs between two
rings a pure function of the two: every node that adopts the same view builds the same arrays. A node keeps the
last few it built (views flap between the same members); nodes that run in one process (the lab's simulated
cluster) may be given one cache, so that a thousand of them hold one copy of each ring (about 70 MB at 1,000
nodes and 40 points per weight) and compute each view change's moved arcs once instead of once per node. The
arrays of a cached `Moves` are made read-only, so a user that wrote into one would fail at once.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping

from ring import Moves, Ring

__all__ = ["RingCache", "ring_id"]

RingKey = tuple[frozenset[tuple[str, int]], int]


#: The last rings named, by identity (the current ring and the one before): a node names its ring at every view
#: change, a thousand times for the same ring in a 1,000-node cluster whose views change but not its weights, and
#: the nodes of one process that share a `RingCache` name each ring once. The text named is O(members).
_NAMED: list[tuple[Ring, int]] = []
_NAMED_SIZE = 2


def ring_id(ring: Ring) -> int:
    """A 63-bit name of a ring, the same on every node that built it: hand-off transfers are labelled with it."""
    for held, name in _NAMED:
        if held is ring:
            return name
    name = _ring_id(ring)
    _NAMED.insert(0, (ring, name))
    del _NAMED[_NAMED_SIZE:]
    return name


def _ring_id(ring: Ring) -> int:
    text = ",".join(f"{node}={weight}" for node, weight in sorted(ring.weights.items()))
    text += f"/{ring.points_per_weight}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


def ring_key(weights: Mapping[str, int], points_per_weight: int) -> RingKey:
    return frozenset(weights.items()), points_per_weight


class RingCache:
    """The last `size` rings and the last `size` ring differences built, by value."""

    def __init__(self, size: int = 4) -> None:
        if size < 1:
            raise ValueError(f"a ring cache holds at least one ring, not {size}")
        self.size = size
        self._rings: OrderedDict[RingKey, Ring] = OrderedDict()
        self._moves: OrderedDict[tuple[RingKey, RingKey], Moves] = OrderedDict()
        # the key of each ring held, by identity: the nodes hold the cache's own ring objects, and a key made from
        # a ring's weights costs O(members), at each of the n nodes' view changes
        self._keys: dict[int, tuple[Ring, RingKey]] = {}
        self.hits = 0
        self.builds = 0

    def ring(self, weights: Mapping[str, int], points_per_weight: int) -> Ring | None:
        """The ring of `weights` if it is held (and then the most recently used)."""
        key = ring_key(weights, points_per_weight)
        ring = self._rings.get(key)
        if ring is not None:
            self._rings.move_to_end(key)
            self.hits += 1
        return ring

    def put(self, ring: Ring) -> Ring:
        """Hold `ring`; the one held already for the same weights if another node put it first."""
        key = self._key(ring)
        held = self._rings.get(key)
        if held is not None:
            self._rings.move_to_end(key)
            return held
        self.builds += 1
        self._rings[key] = ring
        self._keys[id(ring)] = (ring, key)
        while len(self._rings) > self.size:
            _key, gone = self._rings.popitem(last=False)
            self._keys.pop(id(gone), None)
        return ring

    def _key(self, ring: Ring) -> RingKey:
        """The key of `ring`: looked up by identity for a ring held here, else made from its weights."""
        held = self._keys.get(id(ring))
        if held is not None and held[0] is ring:
            return held[1]
        return ring_key(ring.weights, ring.points_per_weight)

    def moves(self, old: Ring, new: Ring) -> Moves | None:
        """The moved arcs from `old` to `new` if they are held."""
        key = (self._key(old), self._key(new))
        moves = self._moves.get(key)
        if moves is not None:
            self._moves.move_to_end(key)
            self.hits += 1
        return moves

    def put_moves(self, old: Ring, new: Ring, moves: Moves) -> Moves:
        """Hold `moves` (from `old` to `new`), its arrays made read-only; the ones held already if any."""
        key = (self._key(old), self._key(new))
        held = self._moves.get(key)
        if held is not None:
            return held
        for array in (moves.starts, moves.ends, moves.previous, moves.next):
            array.flags.writeable = False
        self._moves[key] = moves
        while len(self._moves) > self.size:
            self._moves.popitem(last=False)
        return moves


class _Owners:
    """A ring's owner look-up with a bounded memory of hosts already looked up: the crawler asks for every link
    it screens, and a crawl's links name the same hosts over and over."""

    __slots__ = ("ring", "_cache")

    #: Hosts remembered per ring (about 150 bytes each); past it the memory starts over.
    SIZE = 200_000

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self._cache: dict[str, str] = {}

    @property
    def nodes(self) -> tuple[str, ...]:
        """The ring's node ids (the dispatcher sizes its batching wait by them)."""
        return self.ring.nodes

    def owner(self, host: str) -> str:
        try:
            return self._cache[host]
        except KeyError:
            owner = self.ring.owner(host)
            if len(self._cache) >= self.SIZE:
                self._cache.clear()
            self._cache[host] = owner
            return owner
