"""Dedup store: key formats, arcs, batched check-and-insert, reopen, map growth, kill -9, disk faults."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import (
    RING_SIZE,
    DedupStore,
    MemoryDedupStore,
    StorageError,
    arc_ranges,
    host_position,
    in_arc,
    url_key,
)

ROOT = Path(__file__).resolve().parent.parent


def key_at(position: int, n: int = 0) -> bytes:
    return url_key(position, f"http://h/{n}")


@pytest.fixture(params=["lmdb", "memory"])
def store(request, tmp_path):
    if request.param == "lmdb":
        s = DedupStore.open(tmp_path / "dedup", map_size=1 << 20)
    else:
        s = MemoryDedupStore()
    with s:
        yield s


# -- keys and arcs --


def test_url_key_layout():
    key = url_key(0x0102030405060708, "http://example.com/")
    assert len(key) == 16
    assert key[:8] == bytes([1, 2, 3, 4, 5, 6, 7, 8])
    assert key[8:] == hashlib.blake2b(b"http://example.com/", digest_size=8).digest()


def test_host_position_is_blake2b_and_matches_ring_when_present():
    expected = int.from_bytes(hashlib.blake2b(b"example.com", digest_size=8).digest(), "big")
    assert host_position("example.com") == expected
    try:
        from ring import host_position as ring_host_position
    except ImportError:
        return
    for host in ("example.com", "a.b.c", "xn--bcher-kva.example"):
        assert ring_host_position(host) == host_position(host)


def test_arc_ranges_plain_wrapping_and_whole():
    b = lambda p: p.to_bytes(8, "big")
    assert arc_ranges(10, 20) == [(b(10), b(19))]
    assert arc_ranges(5, 5) == [(b(0), b(RING_SIZE - 1))]
    assert arc_ranges(RING_SIZE - 10, 7) == [(b(0), b(6)), (b(RING_SIZE - 10), b(RING_SIZE - 1))]
    assert arc_ranges(100, 0) == [(b(100), b(RING_SIZE - 1))]
    with pytest.raises(ValueError):
        arc_ranges(0, RING_SIZE)


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(0, RING_SIZE - 1),
    end=st.integers(0, RING_SIZE - 1),
    position=st.integers(0, RING_SIZE - 1),
)
def test_arc_ranges_agree_with_in_arc(start, end, position):
    key = url_key(position, "u")
    in_ranges = any(first <= key[:8] <= last for first, last in arc_ranges(start, end))
    assert in_ranges == in_arc(position, start, end)


# -- dedup semantics, both implementations --


def test_add_new_batch_semantics(store):
    a, b, c = key_at(1), key_at(2), key_at(3)
    assert store.add_new([a, b, a, c, b]) == [True, True, False, True, False]
    assert store.add_new([c, key_at(4), a]) == [False, True, False]
    assert store.add_new([]) == []
    assert len(store) == 4
    assert a in store and key_at(4) in store and key_at(5) not in store


def test_insert_is_idempotent(store):
    keys = [key_at(p) for p in (5, 6, 7)]
    assert store.insert(keys) == 3
    assert store.insert(keys + [key_at(8)]) == 1
    assert len(store) == 4
    assert store.add_new(keys) == [False, False, False]


def test_scan_and_delete_plain_and_wrapping_arcs(store):
    positions = [0, 1, 99, 100, 2**63, RING_SIZE - 2, RING_SIZE - 1]
    keys = {p: key_at(p, i) for i, p in enumerate(positions)}
    store.insert(keys.values())
    assert list(store.scan(1, 100)) == [keys[1], keys[99]]
    assert list(store.scan(RING_SIZE - 2, 2)) == [keys[0], keys[1], keys[RING_SIZE - 2], keys[RING_SIZE - 1]]
    assert list(store.scan(7, 7)) == sorted(keys.values())
    assert list(store.scan(101, 2**63)) == []
    assert store.delete(RING_SIZE - 1, 1) == 2  # wraps: RING_SIZE-1 and 0
    assert keys[0] not in store and keys[RING_SIZE - 1] not in store
    assert len(store) == 5
    assert store.delete(3, 3) == 5
    assert len(store) == 0


@settings(max_examples=60, deadline=None)
@given(
    positions=st.lists(st.integers(0, RING_SIZE - 1), max_size=60),
    start=st.integers(0, RING_SIZE - 1),
    end=st.integers(0, RING_SIZE - 1),
)
def test_memory_scan_matches_model(positions, start, end):
    store = MemoryDedupStore()
    keys = [key_at(p, i) for i, p in enumerate(positions)]
    store.insert(keys)
    expected = sorted({k for k in keys if in_arc(int.from_bytes(k[:8], "big"), start, end)})
    assert list(store.scan(start, end)) == expected
    assert store.delete(start, end) == len(expected)
    assert len(store) == len(set(keys)) - len(expected)


# -- LMDB specifics --


def test_lmdb_scan_matches_memory_across_chunks(tmp_path):
    import random

    rng = random.Random(7)
    keys = [key_at(rng.randrange(RING_SIZE), i) for i in range(12_000)]
    mem = MemoryDedupStore()
    mem.insert(keys)
    with DedupStore.open(tmp_path / "d") as disk:
        disk.insert(keys)
        for start, end in [(0, 0), (2**62, 2**63), (2**63 + 5, 2**60), (RING_SIZE - 1, 0)]:
            assert list(disk.scan(start, end)) == list(mem.scan(start, end))
        assert disk.delete(2**63 + 5, 2**60) == mem.delete(2**63 + 5, 2**60)
        assert list(disk.scan(0, 0)) == list(mem.scan(0, 0))


def test_reopen_keeps_everything_and_map_grows(tmp_path):
    keys = [key_at((i * 0x9E3779B97F4A7C15) % RING_SIZE, i) for i in range(40_000)]
    with DedupStore.open(tmp_path / "d", map_size=256 * 1024) as store:
        assert all(store.add_new(keys))
        assert store._env.map_size > 256 * 1024  # 40,000 keys do not fit in 256 KiB: it grew
        store.sync()
    with DedupStore.open(tmp_path / "d", map_size=256 * 1024) as store:
        assert len(store) == 40_000
        assert not any(store.add_new(keys[::97]))
        assert list(store.scan(0, 0)) == sorted(keys)


def test_map_full_at_maximum_is_a_storage_error(tmp_path):
    with DedupStore.open(tmp_path / "d", map_size=64 * 1024, max_map_size=128 * 1024) as store:
        with pytest.raises(StorageError, match="full at its maximum map size"):
            for i in range(100):
                store.add_new([key_at(i * 2**56 + j, j) for j in range(1000)])
        count = len(store)
        assert count > 0 and count % 1000 == 0  # whole batches only: the failed one left no trace


def test_bad_key_is_the_callers_error(tmp_path):
    with DedupStore.open(tmp_path / "d") as store:
        with pytest.raises(ValueError):
            store.add_new([b""])
        with pytest.raises(ValueError):
            store.add_new([b"x" * 600])
    with pytest.raises(ValueError):
        MemoryDedupStore().add_new([b""])


def test_unwritable_data_dir_is_one_line_storage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError) as info:
        DedupStore.open(blocker / "dedup")
    message = str(info.value)
    assert "\n" not in message and str(blocker / "dedup") in message
    if os.geteuid() != 0:  # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(StorageError, match="Permission denied"):
            DedupStore.open(ro / "dedup")


def test_closed_store_refuses_use(tmp_path):
    store = DedupStore.open(tmp_path / "d")
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.add_new([key_at(1)])


# -- processes that die --

CHILD_WRITER = textwrap.dedent(
    """
    import sys
    from storage import DedupStore, url_key
    store = DedupStore.open(sys.argv[1], map_size=1 << 20)
    batch = 0
    while True:
        store.add_new([url_key((batch * 1000 + i) * 7919 % 2**64, str(i)) for i in range(1000)])
        print(batch, flush=True)
        batch += 1
    """
)


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_committed_batches_survive_sigkill(tmp_path):
    path = tmp_path / "d"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=_child_env()
    )
    try:
        acked = -1
        deadline = time.monotonic() + 20
        while acked < 30 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acked = int(line)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    assert acked >= 30, "the writer did not get going"
    with DedupStore.open(path) as store:
        n = len(store)
        assert n % 1000 == 0 and n >= (acked + 1) * 1000  # every acknowledged batch, whole batches only
        for batch in range(n // 1000):
            expect = [url_key((batch * 1000 + i) * 7919 % 2**64, str(i)) for i in range(0, 1000, 111)]
            assert all(k in store for k in expect)


CHILD_DISK_FULL = textwrap.dedent(
    """
    import resource, signal, sys
    from storage import DedupStore, StorageError, url_key
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    store = DedupStore.open(sys.argv[1], map_size=64 << 20)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))
    committed = 0
    try:
        for batch in range(10_000):
            store.add_new([url_key((batch * 1000 + i) * 104729 % 2**64, str(i)) for i in range(1000)])
            committed += 1000
    except StorageError as exc:
        print(committed)
        print(exc)
    """
)


def test_full_disk_is_a_clean_storage_error_and_store_stays_readable(tmp_path):
    path = tmp_path / "d"
    result = subprocess.run(
        [sys.executable, "-c", CHILD_DISK_FULL, str(path)], check=False, capture_output=True, text=True, env=_child_env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    committed_line, message = result.stdout.strip().split("\n")
    committed = int(committed_line)
    assert message.startswith(f"cannot write store at {path}: ")  # one line: the path and the reason
    assert committed > 0
    with DedupStore.open(path) as store:
        assert len(store) == committed
        assert store.add_new([url_key(7 * 104729 % 2**64, "7")]) == [False]


def _keys(n: int, salt: str = "") -> list[bytes]:
    return [url_key(host_position(f"h{i % 50}.test"), f"http://h{i % 50}.test/{salt}{i}") for i in range(n)]


def test_new_keys_are_staged_then_moved_in_ring_order_and_answer_the_same(tmp_path, monkeypatch):
    """New keys go to the small table; past their share they move to the large one, a slice per commit, and
    every answer (add_new, in, len, scan, delete) is the same wherever a key sits, also after a reopen."""
    import storage._dedup as dedup

    monkeypatch.setattr(dedup, "STAGE_MIN", 100)
    monkeypatch.setattr(dedup, "MOVE_MIN", 16)
    keys = _keys(3000)
    with DedupStore.open(tmp_path / "d", map_size=1 << 22) as store:
        for first in range(0, 3000, 30):  # a page's links at a time
            assert store.add_new(keys[first:first + 30]) == [True] * 30
            assert store.add_new(keys[first:first + 5]) == [False] * 5
        staged = store.staged()
        assert 100 <= staged <= 100 + 60  # at its floor: each commit moved twice what it staged
        assert len(store) == 3000 and all(key in store for key in keys)
        assert list(store.scan(0, 0)) == sorted(keys)
        assert store.add_new(keys[::7]) == [False] * len(keys[::7])
    with DedupStore.open(tmp_path / "d", map_size=1 << 22) as store:
        assert store.staged() == staged and len(store) == 3000
        assert store.add_new(keys[::3] + _keys(10, "new")) == [False] * 1000 + [True] * 10
        start, end = 0, 2**63
        inside = [k for k in keys + _keys(10, "new") if in_arc(int.from_bytes(k[:8], "big"), start, end)]
        assert store.scan_arcs([(start, end)]) == [sorted(inside)]
        assert store.delete(start, end) == len(inside)
        assert len(store) == 3010 - len(inside)
        assert store.add_new(inside[:5]) == [True] * 5  # gone from both tables and the filter lets them in


def test_the_filter_lets_most_new_keys_through_without_a_look_up(tmp_path):
    """A key the filter never saw is new without a look-up in either table; the few it may hold (its false
    positives) are looked up, and answered new all the same."""
    keys = _keys(4000)
    with DedupStore.open(tmp_path / "d", map_size=1 << 24) as store:
        store.insert(keys[:2000])
        fresh = _keys(2000, "fresh")
        assert sum(store.filter.may_contain(key) for key in fresh) < 2000 * 0.03
        assert all(store.filter.may_contain(key) for key in keys[:2000])
        assert store.add_new(fresh) == [True] * 2000
        assert store.add_new(keys[:2000]) == [False] * 2000


def test_a_filter_rebuilt_when_the_keys_outgrow_it_still_holds_every_key(tmp_path, monkeypatch):
    import storage._seenfilter as seenfilter

    monkeypatch.setattr(seenfilter, "MIN_KEYS", 64)
    keys = _keys(2000)
    with DedupStore.open(tmp_path / "d", map_size=1 << 22) as store:
        first = store.filter.capacity
        for i in range(0, 2000, 100):
            store.add_new(keys[i:i + 100])
        assert store.filter.capacity > first
        assert all(store.filter.may_contain(key) for key in keys)
        assert store.add_new(keys) == [False] * 2000


# -- the filter saved by a clean close --

CHILD_WRITES_THEN_DIES = textwrap.dedent(
    """
    import os, sys
    from storage import DedupStore, url_key, host_position
    store = DedupStore.open(sys.argv[1], map_size=1 << 24, save_filter_from=0)
    assert store.filter_open.source == "saved", store.filter_open
    store.add_new([url_key(host_position("late.test"), f"http://late.test/{i}") for i in range(500)])
    os._exit(0)  # no close: as a crash or kill -9 ends a node
    """
)


def test_a_clean_close_saves_the_filter_and_the_next_open_reads_it_instead_of_every_key(tmp_path):
    keys = _keys(3000)
    with DedupStore.open(tmp_path / "d", map_size=1 << 24, save_filter_from=0) as store:
        assert store.filter_open.source == "built" and store.filter_open.reason == "no saved filter"
        store.add_new(keys[:2000])
        bits = bytes(store.filter._bits)
    assert (tmp_path / "d" / "seen-filter").stat().st_size > len(bits)
    with DedupStore.open(tmp_path / "d", map_size=1 << 24, save_filter_from=0) as store:
        assert store.filter_open.source == "saved" and store.filter_open.keys == 2000
        assert not (tmp_path / "d" / "seen-filter").exists()  # a crash from here on cannot find a stale one
        assert bytes(store.filter._bits) == bits
        assert store.add_new(keys) == [False] * 2000 + [True] * 1000
    with DedupStore.open(tmp_path / "d", map_size=1 << 24, save_filter_from=0) as store:
        assert store.filter_open.source == "saved" and store.filter_open.keys == 3000
        assert all(store.filter.may_contain(key) for key in keys)


def test_after_a_crash_the_filter_is_built_from_the_keys_again(tmp_path):
    with DedupStore.open(tmp_path / "d", map_size=1 << 24, save_filter_from=0) as store:
        store.add_new(_keys(1000))
    subprocess.run([sys.executable, "-c", CHILD_WRITES_THEN_DIES, str(tmp_path / "d")], check=True,
                   env=_child_env(), timeout=60)
    with DedupStore.open(tmp_path / "d", map_size=1 << 24, save_filter_from=0) as store:
        assert store.filter_open.source == "built" and store.filter_open.reason == "no saved filter"
        late = [url_key(host_position("late.test"), f"http://late.test/{i}") for i in range(500)]
        assert len(store) == 1500
        assert store.add_new(late + _keys(1000)) == [False] * 1500


def test_a_saved_filter_of_another_state_or_altered_is_not_used(tmp_path):
    path = tmp_path / "d"
    keys = _keys(2000)
    with DedupStore.open(path, map_size=1 << 24, save_filter_from=0) as store:
        store.add_new(keys[:1000])
    old = (path / "seen-filter").read_bytes()
    with DedupStore.open(path, map_size=1 << 24, save_filter_from=10**9) as store:  # this close saves nothing
        store.add_new(keys[1000:])
    assert not (path / "seen-filter").exists()
    (path / "seen-filter").write_bytes(old)  # the file of an earlier state, put back
    with DedupStore.open(path, map_size=1 << 24, save_filter_from=0) as store:
        assert store.filter_open.source == "built"
        assert store.filter_open.reason == "it was saved for another state of the store"
        assert store.add_new(keys) == [False] * 2000  # the keys added after that save are seen
    altered = bytearray((path / "seen-filter").read_bytes())
    altered[-1] ^= 0x40
    (path / "seen-filter").write_bytes(bytes(altered))
    with DedupStore.open(path, map_size=1 << 24, save_filter_from=0) as store:
        assert store.filter_open.source == "built" and "checksum" in store.filter_open.reason
        assert all(store.filter.may_contain(key) for key in keys)
    (path / "seen-filter").write_bytes((path / "seen-filter").read_bytes()[:-100])
    with DedupStore.open(path, map_size=1 << 24, save_filter_from=0) as store:
        assert store.filter_open.source == "built" and "torn" in store.filter_open.reason


def test_a_saved_filter_over_a_lowered_cap_is_not_used(tmp_path):
    with DedupStore.open(tmp_path / "d", map_size=1 << 24, save_filter_from=0) as store:
        store.add_new(_keys(100))
        assert store.filter.nbytes > 1 << 16
    with DedupStore.open(tmp_path / "d", map_size=1 << 24, save_filter_from=0, filter_max_bytes=1 << 16) as store:
        assert store.filter_open.source == "built" and "cap" in store.filter_open.reason
        assert store.filter.nbytes == 1 << 16


def test_a_filter_at_its_cap_is_not_rebuilt_as_the_keys_grow_past_it(tmp_path):
    """At its cap a rebuild would give the same size: the filter takes every key in place (more false positives,
    each a look-up) instead of reading every key again at each commit."""
    keys = _keys(20_000)
    with DedupStore.open(tmp_path / "d", map_size=1 << 24, filter_max_bytes=1 << 10) as store:
        assert store.filter.at_cap and store.filter.capacity == 1024
        first = store.filter
        for i in range(0, len(keys), 1000):
            store.add_new(keys[i:i + 1000])
        assert store.filter is first  # 20,000 keys, ten times twice its capacity: never rebuilt
        assert store.add_new(keys) == [False] * len(keys)
        assert store.add_new(_keys(100, "new")) == [True] * 100


def test_a_larger_filter_is_built_a_slice_per_commit_while_the_old_one_answers(tmp_path, monkeypatch):
    """Past twice its capacity the filter is not rebuilt in one commit: a larger one is read in a slice per
    commit while keys keep coming and staged keys move to the large table; every answer stays right, and the new
    filter, once it takes over, holds every key."""
    import storage._dedup as dedup
    import storage._seenfilter as seenfilter

    monkeypatch.setattr(seenfilter, "MIN_KEYS", 64)
    monkeypatch.setattr(dedup, "BUILD_SLICE", 40)
    monkeypatch.setattr(dedup, "STAGE_MIN", 64)  # staged keys move to the large table as the build goes
    keys = _keys(3000)
    with DedupStore.open(tmp_path / "d", map_size=1 << 24) as store:
        first = store.filter
        builds = []
        for i in range(0, 3000, 30):
            assert store.add_new(keys[i:i + 30]) == [True] * 30
            assert store.add_new(keys[max(0, i - 200):i + 30:7]) == [False] * len(keys[max(0, i - 200):i + 30:7])
            if store._building is not None:
                builds.append(store._build_at)
        assert store.filter is not first and store.filter.capacity > first.capacity
        assert len(builds) > 10  # the builds went on across many commits, none read every key at once
        assert store.staged() < len(store)  # keys moved from the staged table during the builds
        assert all(store.filter.may_contain(key) for key in keys)
        assert store.add_new(keys) == [False] * 3000
        assert store.add_new(_keys(50, "new")) == [True] * 50
