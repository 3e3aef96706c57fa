"""LruTtlCache: exact eviction order, expiry with the clock passed in, export/load of a subset."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import LruTtlCache


def test_evicts_least_recently_used_in_exact_order():
    cache: LruTtlCache[str, int] = LruTtlCache(3)
    for i, key in enumerate("abc"):
        cache.put(key, i, expires_at=100.0)
    assert cache.get("a", now=0.0) == 0  # a is now the most recent: order b, c, a
    cache.put("d", 3, expires_at=100.0)  # evicts b
    assert "b" not in cache and len(cache) == 3
    cache.put("c", 22, expires_at=100.0)  # replacing refreshes recency: order a, d, c
    cache.put("e", 4, expires_at=100.0)  # evicts a
    assert "a" not in cache
    assert [k for k, _v, _e in cache.export(lambda k: True)] == ["d", "c", "e"]
    assert cache.get("c", now=1.0) == 22


def test_expiry_is_exact_and_removes_the_entry():
    cache: LruTtlCache[str, str] = LruTtlCache(10)
    cache.put("x", "1.2.3.4", expires_at=60.0)
    assert cache.get("x", now=59.999) == "1.2.3.4"
    assert "x" in cache
    assert cache.get("x", now=60.0) is None
    assert "x" not in cache and len(cache) == 0
    assert cache.get("never", now=0.0) is None


def test_get_of_missing_does_not_touch_order_and_discard_clear():
    cache: LruTtlCache[int, int] = LruTtlCache(2)
    cache.put(1, 1, 10.0)
    cache.put(2, 2, 10.0)
    assert cache.get(3, 0.0) is None
    cache.put(3, 3, 10.0)
    assert 1 not in cache and 2 in cache
    cache.discard(2)
    cache.discard(2)
    assert len(cache) == 1
    cache.clear()
    assert len(cache) == 0


def test_export_subset_and_load_keeps_relative_recency():
    source: LruTtlCache[str, int] = LruTtlCache(100)
    for i in range(10):
        source.put(f"h{i}.test", i, expires_at=1000.0 + i)
    source.get("h2.test", now=0.0)
    moved = source.export(lambda host: int(host[1]) % 2 == 0)
    assert moved == [("h0.test", 0, 1000.0), ("h4.test", 4, 1004.0), ("h6.test", 6, 1006.0),
                     ("h8.test", 8, 1008.0), ("h2.test", 2, 1002.0)]
    assert len(source) == 10  # export copies
    target: LruTtlCache[str, int] = LruTtlCache(3)
    target.load(moved)
    assert target.export(lambda host: True) == moved[-3:]  # the three most recent survive a smaller cache


def test_maxsize_must_be_positive():
    with pytest.raises(ValueError):
        LruTtlCache(0)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["get", "put"]), st.integers(0, 6), st.integers(0, 20)), max_size=60))
def test_matches_a_list_model(ops):
    cache: LruTtlCache[int, int] = LruTtlCache(4)
    model: list[tuple[int, int, float]] = []  # least recent first
    for now, (op, key, n) in enumerate(ops):
        index = next((i for i, e in enumerate(model) if e[0] == key), None)
        if op == "put":
            if index is not None:
                model.pop(index)
            model.append((key, n, float(now + n)))
            if len(model) > 4:
                model.pop(0)
            cache.put(key, n, float(now + n))
        else:
            expected = None
            if index is not None:
                entry = model.pop(index)
                if now < entry[2]:
                    expected = entry[1]
                    model.append(entry)
            assert cache.get(key, float(now)) == expected
        assert cache.export(lambda k: True) == model


def test_hits_and_misses_are_counted():
    c: LruTtlCache[str, int] = LruTtlCache(2)
    c.put("a", 1, expires_at=10.0)
    assert c.get("a", 1.0) == 1
    assert c.get("b", 1.0) is None
    assert c.get("a", 10.0) is None  # expired: a miss, and the entry is gone
    assert (c.hits, c.misses) == (1, 2)
