"""Every dedup kind against the same model: check-and-insert, arcs, hand-off, and clear refusals.

The Redis kind runs against a real redis-server that this module starts on a free loopback port (another one if
that port is taken before the server binds it) and stops by its PID; it is skipped (with the reason) only when
redis-server is not installed.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import (
    DEDUP_KINDS,
    BloomDedup,
    DedupUnsupported,
    DigitTreeDedup,
    StorageError,
    arc_ranges,
    in_arc,
    md5_key,
    open_dedup,
    url_key,
)
from storage._bloom import bloom_size

pytestmark = pytest.mark.slow  # a real redis-server, and the study's structures filled

EXACT_KEYED = ["lmdb", "memory-md5", "md5-tree", "redis"]
REDIS = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_redis(port: int) -> subprocess.Popen | None:
    """redis-server on `port`, once it answers as itself (its INFO names its own PID); None when it could not
    take the port (another process bound it between `free_port` and the start), so the caller tries another."""
    import redis

    proc = subprocess.Popen(
        [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            pid = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).info("server")["process_id"]
        except (OSError, redis.exceptions.RedisError):
            time.sleep(0.05)
            continue
        if pid == proc.pid:
            return proc
        break  # another server answers on that port
    proc.terminate()
    proc.wait(timeout=10)
    return None


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    if REDIS is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    # redis-server cannot be told to pick a free port itself (--port 0 turns TCP off), so a port that another
    # process takes before the server binds it is given up for another
    for _ in range(5):
        port = free_port()
        proc = _start_redis(port)
        if proc is not None:
            break
    else:
        raise AssertionError("redis-server did not start on any of 5 free ports within 10 s each")
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def opened(kind: str, request: pytest.FixtureRequest, *, expected: int = 10_000, fp_rate: float = 1e-9):
    """A fresh, empty store of `kind` (own temp dir, own Redis namespace)."""
    url = request.getfixturevalue("redis_url") if kind == "redis" else None
    with tempfile.TemporaryDirectory() as tmp:
        store = open_dedup(
            kind, Path(tmp) / "dedup", expected=expected, fp_rate=fp_rate, redis_url=url, namespace=uuid.uuid4().hex
        )
        with store:
            yield store


def k(position: int, tail: int) -> bytes:
    return position.to_bytes(8, "big") + tail.to_bytes(8, "big")


@pytest.mark.parametrize("kind", [*EXACT_KEYED, "bloom"])
def test_batch_check_and_insert(kind, request):
    with opened(kind, request) as store:
        a, b, c = k(1, 1), k(1, 2), k(2**63, 7)
        assert store.add_new([a, b, a]) == [True, True, False]  # only the first occurrence is new
        assert store.add_new([c, b]) == [True, False]
        assert store.add_new([]) == []
        assert len(store) == 3
        assert a in store and c in store and k(5, 5) not in store
        assert store.insert([a, k(9, 9)]) == 1
        assert len(store) == 4
        assert store.add_new_urls([(7, "http://x.test/a"), (7, "http://x.test/a")]) == [True, False]
        assert store.contains_url(7, "http://x.test/a") and not store.contains_url(7, "http://x.test/b")
        assert url_key(7, "http://x.test/a") in store
        store.sync()


@pytest.mark.parametrize("kind", ["memory-md5", "md5-tree", "redis", "bloom"])
def test_bad_keys_are_the_callers_bug(kind, request):
    with opened(kind, request) as store:
        with pytest.raises(ValueError):
            store.add_new([b"short"])
        assert len(store) == 0


positions = st.sampled_from([0, 1, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]) | st.integers(0, 2**64 - 1)
keys = st.builds(k, positions, st.integers(0, 3))
ring_points = st.sampled_from([0, 1, 2**63, 2**64 - 1]) | st.integers(0, 2**64 - 1)


@pytest.mark.parametrize("kind", EXACT_KEYED)
def test_same_answers_as_a_set(kind, request):
    examples = {"lmdb": 60, "redis": 40}.get(kind, 150)

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(batches=st.lists(st.lists(keys, max_size=12), max_size=5), start=ring_points, end=ring_points)
    def check(batches, start, end):
        with opened(kind, request) as store:
            model: set[bytes] = set()
            for batch in batches:
                expect = []
                for key in batch:
                    expect.append(key not in model)
                    model.add(key)
                assert store.add_new(batch) == expect
            assert len(store) == len(model)
            inside = sorted(key for key in model if in_arc(int.from_bytes(key[:8], "big"), start, end))
            assert list(store.scan(start, end)) == inside
            assert store.delete(start, end) == len(inside)
            assert list(store.scan(start, end)) == []
            assert sorted(store.scan(0, 0)) == sorted(model.difference(inside))
            assert len(store) == len(model) - len(inside)
            # the arc handed back (a new owner's insert) restores everything
            assert store.insert(inside) == len(inside)
            assert sorted(store.scan(0, 0)) == sorted(model)

    check()


def url_stream(seed: int, count: int) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    hosts = [(rng.getrandbits(64), f"h{i}.test") for i in range(40)]
    hosts.append((2**64 - 1, "edge.test"))
    out = []
    for _ in range(count):
        position, host = rng.choice(hosts)
        out.append((position, f"http://{host}/p/{rng.randrange(count // 2)}"))
    return out


def test_all_exact_kinds_agree_on_urls_and_arcs(request):
    stream = url_stream(3, 600)
    start, end = 2**63, 2**62  # a wrapping arc
    answers = {}
    for kind in ["memory-urls", *EXACT_KEYED]:
        with opened(kind, request) as store:
            got = [store.add_new_urls(stream[i : i + 50]) for i in range(0, len(stream), 50)]
            answers[kind] = (got, list(store.scan(start, end)), len(store))
            assert store.delete(start, end) == len(answers[kind][1])
            assert list(store.scan(0, 0)) == sorted(set(store.scan(end, start)))
    first = answers["memory-urls"]
    truth: set[tuple[int, str]] = set()
    flat = [new for batch in first[0] for new in batch]
    assert flat == [not (item in truth or truth.add(item)) for item in stream]
    assert 0 < len(first[1]) < first[2]
    for kind, answer in answers.items():
        assert answer == first, kind


def test_memory_urls_refuses_keys_in_one_line():
    store = open_dedup("memory-urls", None)
    for call in (lambda: store.add_new([k(1, 1)]), lambda: store.insert([k(1, 1)]), lambda: k(1, 1) in store):
        with pytest.raises(DedupUnsupported) as info:
            call()
        assert "memory-urls" in str(info.value) and "\n" not in str(info.value)
        assert isinstance(info.value, StorageError)
    assert store.add_new_urls([(1, "http://a.test/")]) == [True]
    assert list(store.scan(0, 0)) == [url_key(1, "http://a.test/")]


def test_bloom_sizing_follows_the_formula():
    assert bloom_size(1000, 0.01) == (9592, 7)  # m = ceil(9585.06) rounded up to whole bytes; k = round(6.64)
    assert bloom_size(1_000_000, 0.001)[1] == 10
    for bad in ((0, 0.01), (10, 0.0), (10, 1.0)):
        with pytest.raises(ValueError):
            bloom_size(*bad)


def test_bloom_false_positive_rate_near_target_and_no_false_negatives():
    rng = random.Random(11)
    bloom = BloomDedup(expected=20_000, fp_rate=0.01)
    stored = [rng.randbytes(16) for _ in range(20_000)]
    accepted = sum(bloom.add_new(stored))
    assert all(key in bloom for key in stored)  # never a false negative
    assert 20_000 - accepted < 20_000 * 0.01  # a few collide with earlier bits while filling
    fresh = [rng.randbytes(16) for _ in range(20_000)]
    false_pos = sum(key in bloom for key in fresh)  # checked, not added: the filter stays at `expected`
    assert 0.005 < false_pos / 20_000 < 0.02, false_pos  # target 1% at the expected count
    assert 0.005 < bloom.estimated_fp_rate() < 0.05


def test_bloom_refuses_arcs_in_one_line():
    bloom = open_dedup("bloom", None, expected=100, fp_rate=0.01)
    for call in (lambda: list(bloom.scan(0, 0)), lambda: bloom.delete(0, 5)):
        with pytest.raises(DedupUnsupported) as info:
            call()
        assert "bloom" in str(info.value) and "\n" not in str(info.value)


def test_digit_tree_frees_and_reuses_nodes():
    tree = DigitTreeDedup()
    rng = random.Random(5)
    batch = [rng.randbytes(16) for _ in range(300)]
    tree.add_new(batch)
    grown = tree.node_count
    assert grown > 300  # random keys share only the top levels
    assert tree.delete(0, 0) == 300
    assert tree.node_count == 1 and len(tree) == 0  # only the root is left
    tree.add_new(batch)
    assert tree.node_count == grown and tree.nbytes == grown * 64  # the freed nodes were reused


def test_study_tree_over_md5_digits():
    tree = DigitTreeDedup(key_bytes=8)
    url = "http://example.test/index.html"
    assert tree.add_new([md5_key(url), md5_key(url + "?")]) == [True, True]
    assert tree.node_count == 2 * 15 + 1 - _shared_levels(md5_key(url), md5_key(url + "?"))
    assert tree.add_new([md5_key(url)]) == [False]
    with pytest.raises(DedupUnsupported):
        list(tree.scan(0, 0))
    with pytest.raises(ValueError):
        tree.add_new([url_key(1, url)])  # 16 bytes into the 8-byte tree


def _shared_levels(a: bytes, b: bytes) -> int:
    """Nodes two 16-digit paths share below the root (the last digit needs no node)."""
    shared = 0
    for x, y in zip(a.hex()[:15], b.hex()[:15]):
        if x != y:
            break
        shared += 1
    return shared


def test_md5_key_is_the_middle_of_md5():
    import hashlib

    url = "http://example.test/"
    assert md5_key(url) == bytes.fromhex(hashlib.md5(url.encode()).hexdigest()[8:24])


def test_open_dedup_errors_name_the_choice():
    with pytest.raises(ValueError, match="memory-md5"):
        open_dedup("hashset", None)
    with pytest.raises(ValueError, match="needs a server URL"):
        open_dedup("redis", None)
    with pytest.raises(ValueError, match="needs a directory"):
        open_dedup("lmdb", None)
    assert set(DEDUP_KINDS) == {"lmdb", "memory-urls", "memory-md5", "md5-tree", "bloom", "redis"}


def test_redis_unreachable_is_one_storage_error():
    with socket.socket() as bound, pytest.raises(StorageError) as info:
        bound.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused, and no one else takes it
        open_dedup("redis", None, redis_url=f"redis://127.0.0.1:{bound.getsockname()[1]}/0")
    assert "redis at 127.0.0.1" in str(info.value) and "\n" not in str(info.value)


def test_redis_namespaces_and_buckets(redis_url):
    with open_dedup("redis", None, redis_url=redis_url, namespace="a") as a, open_dedup(
        "redis", None, redis_url=redis_url, namespace="b"
    ) as b:
        spread = [k(p << 52, 1) for p in range(4096)]  # 16 keys in each of the 256 buckets
        assert a.add_new(spread) == [True] * 4096
        assert b.add_new(spread[:10]) == [True] * 10
        assert len(a) == 4096 and len(b) == 10
        arc = (5 << 52) + 1, 40 << 52  # from inside bucket 0 to the start of bucket 2
        assert list(a.scan(*arc)) == spread[6:40]
        assert a.delete(*arc) == 34 and len(a) == 4062 and len(b) == 10
        assert list(a.scan(*arc)) == [] and list(a.scan(0, 0)) == spread[:6] + spread[40:]
        assert [r[0] for r in arc_ranges(*arc)] == [((5 << 52) + 1).to_bytes(8, "big")]
        assert a.used_memory() > 0


def test_the_node_store_caps_its_seen_filter_and_saves_it_when_it_closes(tmp_path):
    """`open_node_store` passes the node's `seen_filter_mib` cap to the LMDB store; a NodeStore (dedup and
    frontier in one file) saves its filter when it closes, and the next open reads it."""
    from peer.crawl.seenstores import open_node_store
    from storage import HostState, NodeStore, QueuedUrl

    with open_node_store(tmp_path / "capped", filter_max_bytes=1 << 12) as store:
        assert store.dedup.filter.nbytes == 1 << 12 and store.dedup.filter.at_cap
    items = [QueuedUrl(url=f"http://h{i % 7}.test/{i}", host=f"h{i % 7}.test", depth=1) for i in range(300)]
    with NodeStore.open(tmp_path / "state", save_filter_from=0) as store:
        assert len(store.admit(items)) == 300
        store.frontier.put_states([HostState(host="h0.test", next_allowed=0.0)])
    assert (tmp_path / "state" / "seen-filter").exists()
    with NodeStore.open(tmp_path / "state", save_filter_from=0) as store:
        assert store.dedup.filter_open.source == "saved" and store.dedup.filter_open.keys == 300
        assert store.admit(items) == []
