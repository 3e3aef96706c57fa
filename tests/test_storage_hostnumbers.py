"""Host numbers in the frontier's queue keys: hosts that share a ring position, and stores of the earlier form
(the host name in every queue key) moved at open."""

from __future__ import annotations

import msgpack
import pytest

import storage._frontier as frontier_module
import storage._hostnumbers as hostnumbers
from storage import NodeStore, QueuedUrl, StorageError
from storage._frontier import HOSTS, META, OLD_QUEUE, QUEUE, _record
from storage._keys import host_prefix
from storage._lmdb import LmdbEnv


def q(host: str, n: int, depth: int = 0) -> QueuedUrl:
    return QueuedUrl(url=f"http://{host}/{n}", host=host, depth=depth)


def drain(frontier, host: str) -> list[QueuedUrl]:
    out = []
    while (item := frontier.pop(host)) is not None:
        out.append(item)
        frontier.done(item)
    return out


def write_earlier_form(store: NodeStore, items: list[QueuedUrl]) -> None:
    """Queue `items` as a store before host numbers did: key host_prefix + depth + seq in `queue`, the count
    alone (8 bytes) in `hosts`, the last sequence number in `meta`."""
    env = store._env
    counts: dict[bytes, int] = {}

    def run(txn) -> None:
        for seq, item in enumerate(items, 1):
            hp = host_prefix(item.host)
            key = hp + item.depth.to_bytes(4, "big") + seq.to_bytes(8, "big")
            txn.put(key, msgpack.packb(_record(item)), db=env.db(OLD_QUEUE))
            counts[hp] = counts.get(hp, 0) + 1
        for hp, n in counts.items():
            txn.put(hp, n.to_bytes(8, "big"), db=env.db(HOSTS))
        txn.put(b"seq", len(items).to_bytes(8, "big"), db=env.db(META))

    env.write(run)


def earlier_items() -> list[QueuedUrl]:
    # 12 hosts of 1 to 12 URLs, depths mixed, arriving interleaved
    return [q(f"h{h}.old.test", n, depth=(n * 7 + h) % 3) for n in range(12) for h in range(12) if n <= h]


def expected_order(items: list[QueuedUrl], host: str) -> list[QueuedUrl]:
    mine = [(item.depth, seq, item) for seq, item in enumerate(items) if item.host == host]
    return [item for _depth, _seq, item in sorted(mine, key=lambda t: t[:2])]


def test_a_queue_of_the_earlier_form_moves_into_host_numbered_keys_at_open(tmp_path, monkeypatch):
    monkeypatch.setattr(hostnumbers, "MIGRATE_CHUNK", 10)  # several transactions, each of whole hosts
    items = earlier_items()
    with NodeStore.open(tmp_path / "s", map_size=1 << 22) as store:
        write_earlier_form(store, items)
    with NodeStore.open(tmp_path / "s", map_size=1 << 22) as store:
        frontier = store.frontier
        assert store._env.entries(OLD_QUEUE) == 0 and len(frontier) == len(items)
        with store._env.read() as txn:
            keys = [key for key, _ in txn.cursor(store._env.db(QUEUE))]
        assert {len(key) for key in keys} == {8 + 1 + 12}  # position, host number, depth, sequence
        hosts = {f"h{h}.old.test" for h in range(12)}
        assert dict(frontier.hosts()) == {host: sum(1 for i in items if i.host == host) for host in hosts}
        assert sorted(frontier.scan_queued(), key=lambda i: i.url) == sorted(items, key=lambda i: i.url)
        frontier.push([q("h3.old.test", 99)])  # after every moved one of its depth: the sequence goes on
        for host in sorted(hosts):
            expected = expected_order(items, host)
            if host == "h3.old.test":
                expected.insert(sum(1 for i in expected if i.depth == 0), q(host, 99))
            assert drain(frontier, host) == expected
        assert list(frontier.hosts()) == [] and len(frontier) == 0


def test_a_move_cut_short_by_a_failed_write_goes_on_at_the_next_open(tmp_path, monkeypatch):
    monkeypatch.setattr(hostnumbers, "MIGRATE_CHUNK", 10)
    items = earlier_items()
    with NodeStore.open(tmp_path / "s", map_size=1 << 22) as store:
        write_earlier_form(store, items)
    write = LmdbEnv.write
    calls = 0

    def failing_third(self, fn):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise StorageError("cannot write store: the disk failed")
        return write(self, fn)

    monkeypatch.setattr(LmdbEnv, "write", failing_third)
    with pytest.raises(StorageError):
        NodeStore.open(tmp_path / "s", map_size=1 << 22)
    monkeypatch.setattr(LmdbEnv, "write", write)
    env = LmdbEnv.open(tmp_path / "s", (OLD_QUEUE, QUEUE))
    try:  # two transactions committed, the third not: part moved, part not
        assert 0 < env.entries(QUEUE) < len(items) and env.entries(OLD_QUEUE) == len(items) - env.entries(QUEUE)
    finally:
        env.close()
    with NodeStore.open(tmp_path / "s", map_size=1 << 22) as store:
        assert calls == 3 and store._env.entries(OLD_QUEUE) == 0 and len(store.frontier) == len(items)
        for host in {item.host for item in items}:
            assert store.frontier.queued(host) == sum(1 for i in items if i.host == host)
            assert drain(store.frontier, host) == expected_order(items, host)


@pytest.fixture
def one_position(monkeypatch):
    """Every host at ring position 1 in the frontier's keys: 64-bit positions collide too rarely to meet
    otherwise, and a host number must keep such hosts apart whatever their count."""
    position = (1).to_bytes(8, "big")
    monkeypatch.setattr(frontier_module, "host_prefix", lambda host: position + host.encode() + b"\0")


def test_hosts_at_one_ring_position_keep_their_own_queues(tmp_path, one_position):
    hosts = [f"c{h}.test" for h in range(300)]  # past 254: numbers of five bytes
    with NodeStore.open(tmp_path / "s", map_size=1 << 24) as store:
        frontier = store.frontier
        frontier.push([q(host, n, depth=n % 2) for n in range(3) for host in hosts])
        with store._env.read() as txn:
            codes = [value[8:] for _key, value in txn.cursor(store._env.db(HOSTS))]
        assert len(set(codes)) == 300 and sorted(len(code) for code in codes) == [1] * 255 + [5] * 45
        assert dict(frontier.hosts()) == dict.fromkeys(hosts, 3)
        assert sorted(frontier.scan_queued(chunk=7), key=lambda i: i.url) == sorted(
            (q(host, n, depth=n % 2) for n in range(3) for host in hosts), key=lambda i: i.url)
        items, _states = frontier.export_arc(0, 0)
        assert len(items) == 900 and all(item.url.startswith(f"http://{item.host}/") for item in items)
        assert frontier.discard([q("c7.test", 1, depth=1), q("c280.test", 0), q("c8.test", 5)]) == 2
        assert drain(frontier, "c7.test") == [q("c7.test", 0), q("c7.test", 2)]
        assert drain(frontier, "c280.test") == [q("c280.test", 2), q("c280.test", 1, depth=1)]
        assert frontier.queued("c8.test") == 3 and len(frontier) == 900 - 6
        # c7's number is free again: the next new host takes it, and c7's URLs come back under another
        frontier.push([q("new.test", 0)])
        frontier.push([q("c7.test", 9)])
        assert drain(frontier, "new.test") == [q("new.test", 0)]
        assert drain(frontier, "c7.test") == [q("c7.test", 9)]
        assert frontier.drop_arc(0, 2) == 900 - 6
        assert len(frontier) == 0 and list(frontier.hosts()) == []


def test_an_in_flight_url_goes_back_under_its_hosts_number_of_now(tmp_path, one_position):
    """A host whose last URL is in flight has no number; another host may take it meanwhile, and the URL
    recovered after a stop is still its own host's."""
    with NodeStore.open(tmp_path / "s", map_size=1 << 22) as store:
        frontier = store.frontier
        frontier.push([q("a.test", 0), q("b.test", 0)])
        flying = frontier.pop("a.test")  # a's number (0) is free
        frontier.push([q("c.test", 0)])  # and c takes it
        assert flying == q("a.test", 0)
    with NodeStore.open(tmp_path / "s", map_size=1 << 22) as store:
        frontier = store.frontier
        assert frontier.recover() == 1
        assert dict(frontier.hosts()) == {"a.test": 1, "b.test": 1, "c.test": 1}
        assert [drain(frontier, host) for host in ("a.test", "b.test", "c.test")] == [
            [q("a.test", 0)], [q("b.test", 0)], [q("c.test", 0)]]
