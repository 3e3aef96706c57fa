"""Many arcs at once (a view change's hand-off): reading them in one transaction per database, and dropping them in
one transaction, give exactly what the per-arc calls give. Real on-disk LMDB."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import HostState, NodeStore, QueuedUrl, RevisitRecord, host_position, url_key

HOSTS = [f"h{i}.example" for i in range(120)]


def fill(store: NodeStore) -> None:
    items = [QueuedUrl(url=f"http://{h}/p{k}", host=h, depth=k % 3) for h in HOSTS for k in range(3)]
    store.admit(items)
    store.dedup.insert([url_key(host_position(h), f"http://{h}/done{k}") for h in HOSTS for k in range(2)])
    store.frontier.put_states([HostState(host=h, next_allowed=10.0, crawl_delay=1.0) for h in HOSTS[::2]])
    for i, h in enumerate(HOSTS[::3]):
        store.revisits.put(RevisitRecord(url=f"http://{h}/done0", host=h, depth=1, due=100.0 + i, interval=60.0,
                                         queued=i % 4 == 0))
    store.sync()


def random_arcs(rng: random.Random, count: int) -> list[tuple[int, int]]:
    """Disjoint arcs in position order; the last one may wrap through zero."""
    cuts = sorted(rng.sample(range(1, 1 << 20), 2 * count))
    arcs = [(cuts[2 * i] << 44, cuts[2 * i + 1] << 44) for i in range(count)]
    if rng.random() < 0.5:
        start, _ = arcs[-1]
        arcs[-1] = (start, rng.randrange(0, arcs[0][0] or 1))  # wraps (or ends at 2**64 when 0)
    return arcs


@pytest.fixture
def store(tmp_path):
    s = NodeStore.open(tmp_path / "s", map_size=1 << 24)
    fill(s)
    yield s
    s.close()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(1, 12))
def test_reading_many_arcs_at_once_equals_reading_each(tmp_path_factory, seed: int, count: int) -> None:
    s = NodeStore.open(tmp_path_factory.mktemp("s"), map_size=1 << 24)
    try:
        fill(s)
        arcs = random_arcs(random.Random(seed), count) + [(5, 5)]  # and the whole ring
        assert s.frontier.export_arcs(arcs) == [s.frontier.export_arc(*arc) for arc in arcs]
        assert s.dedup.scan_arcs(arcs) == [list(s.dedup.scan(*arc)) for arc in arcs]
        assert s.revisits.export_arcs(arcs) == [s.revisits.export_arc(*arc) for arc in arcs]
    finally:
        s.close()


def test_host_positions_are_the_hosts_keys_prefixes(store: NodeStore) -> None:
    raw = store.frontier.host_positions()
    positions = [int.from_bytes(raw[i:i + 8], "big") for i in range(0, len(raw), 8)]
    assert positions == sorted(host_position(h) for h in HOSTS) + sorted(host_position(h) for h in HOSTS[::2])


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(1, 10))
def test_dropping_many_arcs_in_one_transaction_equals_dropping_each(tmp_path_factory, seed: int, count: int) -> None:
    rng = random.Random(seed)
    arcs = random_arcs(rng, count)
    one, each = (NodeStore.open(tmp_path_factory.mktemp(name), map_size=1 << 24) for name in ("one", "each"))
    try:
        fill(one)
        fill(each)
        every_key = list(one.dedup.scan(0, 0))
        keep = set(rng.sample(every_key, len(every_key) // 3))
        dropped = one.drop_arcs(arcs, keep)
        expected = 0
        for start, end in arcs:  # what the hand-off did per arc before
            expected += each.frontier.drop_arc(start, end)
            each.revisits.drop_arc(start, end)
            each.dedup.delete(start, end)
        each.dedup.insert(k for k in keep if any(_in(k, arc) for arc in arcs))
        assert dropped == expected
        assert one.frontier.export_arc(0, 0) == each.frontier.export_arc(0, 0)
        assert list(one.frontier.hosts()) == list(each.frontier.hosts()) and len(one.frontier) == len(each.frontier)
        assert list(one.dedup.scan(0, 0)) == list(each.dedup.scan(0, 0))
        assert list(one.revisits.records()) == list(each.revisits.records())
        assert one.revisits.next_due(1000) == each.revisits.next_due(1000)
    finally:
        one.close()
        each.close()


def _in(key: bytes, arc: tuple[int, int]) -> bool:
    position, (start, end) = int.from_bytes(key[:8], "big"), arc
    if start == end:
        return True
    return start <= position < end if start < end else position >= start or position < end


def test_dropping_no_arcs_changes_nothing(store: NodeStore) -> None:
    before = (len(store.frontier), len(store.dedup), len(store.revisits))
    assert store.drop_arcs([]) == 0
    assert (len(store.frontier), len(store.dedup), len(store.revisits)) == before
