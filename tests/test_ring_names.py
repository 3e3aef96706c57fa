"""Ring names (`ring_id`): equal rings get one name on every node, different rings different names, and the memory
of the last rings named (by identity) never gives a ring another ring's name."""

from __future__ import annotations

from peer.cluster.core.rings import RingCache, ring_id
from ring import Ring


def test_a_ring_is_named_by_its_weights_whichever_object_holds_them() -> None:
    weights = {f"n{i}": 1 + i % 3 for i in range(50)}
    one = Ring(weights, points_per_weight=4)
    same = Ring(dict(reversed(list(weights.items()))), points_per_weight=4)
    heavier = Ring({**weights, "n7": 9}, points_per_weight=4)
    denser = Ring(weights, points_per_weight=5)
    names = [ring_id(ring) for ring in (one, heavier, same, denser, one, heavier, same)]
    assert names[0] == names[2] == names[4] == names[6]
    assert len({names[0], names[1], names[3]}) == 3 and names[1] == names[5]
    assert all(0 <= name < 1 << 63 for name in names)


def test_nodes_sharing_a_ring_cache_share_the_name() -> None:
    cache = RingCache(size=2)
    weights = {"a": 3, "b": 1}
    held = cache.put(Ring(weights, points_per_weight=4))
    other = cache.ring(weights, 4)
    assert other is held and ring_id(other) == ring_id(Ring(weights, points_per_weight=4))
