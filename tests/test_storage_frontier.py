"""Frontier store (LMDB and memory): breadth-first order, in-flight recovery, host states, arcs, NodeStore."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from storage import (
    FrontierStore,
    HostState,
    MemoryFrontierStore,
    MemoryNodeStore,
    NodeStore,
    QueuedUrl,
    StorageError,
    host_position,
    host_position_bytes,
    in_arc,
    queued_url_keys,
    url_key,
)

ROOT = Path(__file__).resolve().parent.parent


def q(host: str, n: int, depth: int = 0, **kw) -> QueuedUrl:
    return QueuedUrl(url=f"http://{host}/{n}", host=host, depth=depth, **kw)


@pytest.fixture(params=["lmdb", "memory"])
def frontier(request, tmp_path):
    store = FrontierStore.open(tmp_path / "f", map_size=1 << 20) if request.param == "lmdb" else MemoryFrontierStore()
    with store:
        yield store


@pytest.fixture(params=["lmdb", "memory"])
def node(request, tmp_path):
    store = NodeStore.open(tmp_path / "n", map_size=1 << 20) if request.param == "lmdb" else MemoryNodeStore()
    with store:
        yield store


def drain(frontier, host: str) -> list[QueuedUrl]:
    out = []
    for _ in range(10_000):
        item = frontier.pop(host)
        if item is None:
            return out
        out.append(item)
    raise AssertionError("queue did not drain")


def test_breadth_first_then_fifo_per_host(frontier):
    frontier.push([q("a", 1, 2), q("a", 2, 0), q("b", 1, 0), q("a", 3, 1)])
    frontier.push([q("a", 4, 0), q("a", 5, 2, hops=3, found_on="http://a/0")])
    assert len(frontier) == 6 and frontier.queued("a") == 5 and frontier.queued("b") == 1
    assert frontier.queued("ab") == 0
    got = drain(frontier, "a")
    assert [i.url for i in got] == ["http://a/2", "http://a/4", "http://a/3", "http://a/1", "http://a/5"]
    assert got[-1] == q("a", 5, 2, hops=3, found_on="http://a/0")
    assert frontier.in_flight() == 5 and len(frontier) == 1
    assert frontier.pop("nobody") is None


def test_host_prefix_does_not_leak_between_hosts(frontier):
    frontier.push([q("ab", 1), q("a", 1), q("a.b", 1)])
    assert [i.url for i in drain(frontier, "a")] == ["http://a/1"]
    assert frontier.queued("ab") == 1 and frontier.queued("a.b") == 1


def test_hosts_lists_counts_in_ring_order(frontier):
    hosts = [f"h{i}.example" for i in range(20)]
    frontier.push([q(h, n) for i, h in enumerate(hosts) for n in range(i + 1)])
    listed = list(frontier.hosts())
    assert sorted(listed) == sorted((h, i + 1) for i, h in enumerate(hosts))
    assert [host_position(h) for h, _n in listed] == sorted(host_position(h) for h in hosts)
    drain(frontier, "h0.example")
    assert "h0.example" not in dict(frontier.hosts())


def test_hosts_after_reads_the_host_table_round_from_any_host(frontier):
    hosts = [f"h{i}.example" for i in range(7)]
    frontier.push([q(h, n) for h in hosts for n in range(hosts.index(h) + 1)])
    whole = list(frontier.hosts())
    assert frontier.hosts_after(None, 100) == whole
    # read three at a time from the start: the whole table, in order, then nothing
    got, at = [], None
    while rows := frontier.hosts_after(at, 3):
        assert len(rows) <= 3
        got += rows
        at = rows[-1][0]
    assert got == whole
    # strictly after a host, whether or not it has work (a host emptied since it was read)
    third, count = whole[2]
    assert frontier.hosts_after(third, 2) == whole[3:5]
    for item in [frontier.pop(third) for _ in range(count)]:
        frontier.done(item)
    assert frontier.hosts_after(third, 100) == whole[3:]
    assert frontier.hosts_after(whole[1][0], 1) == [whole[3]]
    assert frontier.hosts_after(whole[-1][0], 5) == []


def test_done_and_recover(frontier):
    items = [q("a", n, depth=n % 2) for n in range(6)]
    frontier.push(items)
    first, second, third = frontier.pop("a"), frontier.pop("a"), frontier.pop("a")
    frontier.done(second)
    frontier.done(second)  # unknown now: ignored
    assert frontier.in_flight() == 2 and len(frontier) == 3
    assert sorted(i.url for i in frontier.in_flight_items()) == sorted([first.url, third.url])
    assert frontier.recover() == 2
    assert frontier.in_flight() == 0 and len(frontier) == 5
    # recovered items go back to their original places: the order is as if they had never left
    assert (first, second, third) == (items[0], items[2], items[4])
    assert drain(frontier, "a") == [first, third, items[1], items[3], items[5]]


def test_requeue_puts_one_in_flight_url_back_in_place(frontier):
    items = [q("a", n) for n in range(4)]
    frontier.push(items)
    first, second = frontier.pop("a"), frontier.pop("a")
    assert frontier.requeue([first, q("a", 99)]) == 1  # the unknown item is ignored
    assert frontier.in_flight() == 1 and len(frontier) == 3
    assert frontier.requeue([first]) == 0  # no longer in flight
    assert drain(frontier, "a") == [first, items[2], items[3]]
    frontier.done(second)
    assert frontier.in_flight() == 3  # drain() popped three without finishing them


def test_discard_removes_only_the_named_queued_urls(frontier):
    items = [q("a", n) for n in range(5)] + [q("b", n) for n in range(2)]
    frontier.push(items)
    assert frontier.discard([items[1], items[3], items[6], q("a", 99)]) == 3
    assert len(frontier) == 4 and frontier.queued("a") == 3 and frontier.queued("b") == 1
    assert drain(frontier, "a") == [items[0], items[2], items[4]]
    assert drain(frontier, "b") == [items[5]]


def test_same_url_in_flight_twice_needs_two_dones(frontier):
    frontier.push([q("a", 1), q("a", 1)])
    one, two = frontier.pop("a"), frontier.pop("a")
    assert one == two
    frontier.done(one)
    assert frontier.in_flight() == 1
    frontier.done(two)
    assert frontier.in_flight() == 0


def test_pop_many_and_done_many(frontier):
    frontier.push([q("a", 1), q("b", 1), q("b", 2)])
    got = frontier.pop_many(["b", "c", "a", "b"])
    assert got == [q("b", 1), None, q("a", 1), q("b", 2)]
    frontier.done_many([g for g in got if g is not None])
    assert frontier.in_flight() == 0 and len(frontier) == 0


def test_states_round_trip(frontier):
    s1 = HostState(host="a.example", next_allowed=1_700_000_000.25, crawl_delay=2.5, backoff=8.0, failures=3,
                   pages=41)
    s2 = HostState(host="b.example", next_allowed=0.0)
    assert frontier.get_state("a.example") is None
    frontier.put_state(s1)
    frontier.put_states([s2])
    assert frontier.get_state("a.example") == s1 and frontier.get_state("b.example") == s2
    s1b = HostState(host="a.example", next_allowed=5.0, pages=42)
    frontier.put_state(s1b)
    assert frontier.get_state("a.example") == s1b
    assert sorted(frontier.states(), key=lambda s: s.host) == [s1b, s2]
    # several at once, in one read: hosts without a state are left out
    assert frontier.get_states(["b.example", "none.example", "a.example"]) == {"b.example": s2, "a.example": s1b}
    assert frontier.get_states([]) == {}


def test_bad_input_is_the_callers_error(frontier):
    with pytest.raises(ValueError):
        frontier.push([q("a", 1, depth=-1)])
    with pytest.raises(ValueError):
        frontier.push([QueuedUrl(url="http://x/", host="", depth=0)])
    assert len(frontier) == 0


def _arc_fixture(frontier):
    rng = random.Random(3)
    hosts = [f"host{i}.test" for i in range(60)]
    items = [q(h, n, depth=rng.randrange(3)) for h in hosts for n in range(rng.randrange(1, 6))]
    rng.shuffle(items)
    frontier.push(items)
    states = [HostState(host=h, next_allowed=float(i), pages=i) for i, h in enumerate(hosts)]
    frontier.put_states(states)
    return hosts, items, states


@pytest.mark.parametrize("arc", [(2**62, 2**63), (2**63 + 2**62, 2**61), (123, 123)])
def test_export_put_and_drop_arc(frontier, tmp_path, arc):
    start, end = arc
    hosts, items, states = _arc_fixture(frontier)
    moved_hosts = {h for h in hosts if in_arc(host_position(h), start, end)}
    assert moved_hosts  # the arcs above are wide enough to hold some of 60 hosts
    exported, exported_states = frontier.export_arc(start, end)
    assert {i.host for i in exported} == moved_hosts
    assert sorted(exported, key=lambda i: i.url) == sorted((i for i in items if i.host in moved_hosts),
                                                           key=lambda i: i.url)
    assert exported_states == sorted((s for s in states if s.host in moved_hosts),
                                     key=lambda s: (host_position(s.host), s.host))
    assert len(frontier) == len(items)  # export is non-destructive

    with FrontierStore.open(tmp_path / "receiver") as receiver:
        receiver.put_arc(exported, exported_states)
        for host in moved_hosts:
            mine = [i for i in exported if i.host == host]
            assert drain(receiver, host) == mine  # queue order survives the move
        assert list(receiver.states()) == exported_states

    dropped = frontier.drop_arc(start, end, hosts_per_txn=7)
    assert dropped == len(exported)
    assert len(frontier) == len(items) - dropped
    assert {h for h, _n in frontier.hosts()} == set(hosts) - moved_hosts
    assert {s.host for s in frontier.states()} == set(hosts) - moved_hosts
    assert frontier.export_arc(start, end) == ([], [])


def test_lmdb_frontier_reopen_and_recover(tmp_path):
    path = tmp_path / "f"
    with FrontierStore.open(path, map_size=128 * 1024) as f:
        f.push([q(f"h{n % 50}", n, depth=n % 4) for n in range(5000)])  # more than 128 KiB: the map grows
        popped = [f.pop("h7") for _ in range(3)]
        f.done(popped[0])
        f.put_state(HostState(host="h7", next_allowed=99.5, crawl_delay=1.0))
    with FrontierStore.open(path) as f:
        assert len(f) == 4997 and f.in_flight() == 2
        assert f.get_state("h7") == HostState(host="h7", next_allowed=99.5, crawl_delay=1.0)
        assert f.recover() == 2
        assert f.pop("h7") == popped[1] and f.pop("h7") == popped[2]


def test_node_admit_dedups_and_queues_atomically(node):
    a1, a2, b1 = q("a", 1), q("a", 2), q("b", 1, depth=1)
    assert node.admit([a1, a2, a1, b1]) == [a1, a2, b1]
    assert node.admit([a2, q("a", 3)]) == [q("a", 3)]
    assert len(node.frontier) == 4 and len(node.dedup) == 4
    page = node.frontier.pop("a")
    assert page == a1
    assert node.finish(page, [q("a", 3), q("c", 1, depth=1)]) == [q("c", 1, depth=1)]
    assert node.frontier.in_flight() == 0
    assert node.finish(None, []) == []


def test_finish_saves_the_hosts_state_with_the_page(node):
    node.admit([q("a", 1)])
    page = node.frontier.pop("a")
    state = HostState(host="a", next_allowed=1234.5, crawl_delay=2.0, backoff=0.0, failures=0, pages=7, bytes=99)
    assert node.frontier.get_state("a") is None
    node.finish(page, [q("a", 2)], state=state)
    assert node.frontier.get_state("a") == state and node.frontier.in_flight() == 0


def test_queued_url_keys_are_url_keys():
    items = [q("a.test", 1), q("b.test", 2), q("a.test", 3)]
    assert queued_url_keys(items) == [url_key(host_position(i.host), i.url) for i in items]
    assert host_position_bytes("a.test") == host_position("a.test").to_bytes(8, "big")


def test_node_store_fits_frontier_unopened_dbs(tmp_path):
    with NodeStore.open(tmp_path / "n") as node:
        node.admit([q("a", 1)])
    with NodeStore.open(tmp_path / "n") as node:
        assert len(node.dedup) == 1 and node.frontier.queued("a") == 1


def test_unwritable_frontier_dir(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_bytes(b"")
    with pytest.raises(StorageError, match="cannot open store"):
        FrontierStore.open(blocker / "x")


CHILD_CRAWLER = textwrap.dedent(
    """
    import sys
    from storage import NodeStore, QueuedUrl
    node = NodeStore.open(sys.argv[1], map_size=1 << 20)
    node.admit([QueuedUrl(url="http://h0/0", host="h0", depth=0)])
    # a fake crawl: every page links to 3 new pages and 2 old ones, across 20 hosts
    for n in range(1_000_000):
        host = f"h{n % 20}"
        page = node.frontier.pop(host)
        if page is None:
            continue
        k = int(page.url.rsplit("/", 1)[1])
        links = [QueuedUrl(url=f"http://h{m % 20}/{m}", host=f"h{m % 20}", depth=page.depth + 1)
                 for m in (3 * k + 1, 3 * k + 2, 3 * k + 3, k // 2, 0)]
        node.finish(page, links)
        print(k, flush=True)
    """
)


def test_crawl_state_survives_sigkill_at_several_moments(tmp_path):
    for moment in (5, 60, 400):
        path = tmp_path / f"n{moment}"
        child = subprocess.Popen([sys.executable, "-c", CHILD_CRAWLER, str(path)], stdout=subprocess.PIPE,
                                 text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        finished = []
        try:
            deadline = time.monotonic() + 20
            while len(finished) < moment and time.monotonic() < deadline:
                line = child.stdout.readline()
                if not line:
                    break
                finished.append(int(line))
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.wait(timeout=10)
        assert len(finished) == moment
        finished += [int(line) for line in child.stdout.read().split()]  # printed before the kill
        child.stdout.close()
        with NodeStore.open(path) as node:
            assert node.frontier.in_flight() <= 1  # the child had at most one page in flight
            node.frontier.recover()
            queued = {i.url for i in node.frontier.export_arc(0, 0)[0]}
            # nothing lost: every link of every finished page is queued or finished; at most one page was
            # finished but killed before it could say so, and that one is seen
            missing = {
                f"http://h{m % 20}/{m}"
                for k in finished
                for m in (3 * k + 1, 3 * k + 2, 3 * k + 3)
                if f"http://h{m % 20}/{m}" not in queued and m not in finished
            }
            assert len(missing) <= 1
            assert all(url_key(host_position(u.split("/")[2]), u) in node.dedup for u in missing)
            # nothing doubled: seen = queued + finished (+ the page killed in flight, now queued again)
            assert len(node.dedup) == len(queued) + len(set(finished)) + len(missing)
            assert not queued & {f"http://h{k % 20}/{k}" for k in finished}


@pytest.mark.parametrize("url, found_on", [
    ("https://a.test/x?y=1", "https://a.test/"),  # both on the host: both packed
    ("http://a.test:8080/p", "https://b.test/page"),  # a port; found on another host: kept whole
    ("https://a.test.evil/p", None),  # not on the host, though it begins with its name
    ("https://a.test", "http://a.test#top"),  # nothing after the host
    ("http://a.test/\u00e9t\u00e9", None),
])
def test_queue_record_packs_urls_on_its_host_and_reads_them_back(tmp_path, url, found_on):
    items = [QueuedUrl(url=url, host="a.test", depth=2, hops=1, found_on=found_on),
             QueuedUrl(url="https://a.test/bare", host="a.test", depth=3)]
    with FrontierStore.open(tmp_path / "f", map_size=1 << 20) as store:
        store.push(items)
        assert [store.pop("a.test"), store.pop("a.test")] == items
        store.recover()  # the in-flight records, packed the same way, go back whole
        assert [store.pop("a.test"), store.pop("a.test")] == items


def test_queue_records_of_the_earlier_form_still_read(tmp_path):
    """A store written before URLs were packed ([absolute url, hops, found_on], in flight too) and before host
    numbers (the host name in the queue key, the count alone in the host table) keeps its queue."""
    import msgpack

    from storage._frontier import FLIGHT, HOSTS
    from storage._frontier import OLD_QUEUE as QUEUE
    from storage._keys import host_prefix, url_fingerprint

    hp = host_prefix("old.test")
    queued_key = hp + (1).to_bytes(4, "big") + (7).to_bytes(8, "big")
    flying_key = hp + (0).to_bytes(4, "big") + (3).to_bytes(8, "big")
    with NodeStore.open(tmp_path / "s", map_size=1 << 20) as store:
        env = store._env
        env.write(lambda txn: (
            txn.put(queued_key, msgpack.packb(["http://old.test/q", 0, "http://old.test/"]), db=env.db(QUEUE)),
            txn.put(hp + url_fingerprint("http://old.test/f"),
                    msgpack.packb([1, flying_key, "http://old.test/f", 2, None, 1]), db=env.db(FLIGHT)),
            txn.put(hp, (1).to_bytes(8, "big"), db=env.db(HOSTS))))
    with NodeStore.open(tmp_path / "s", map_size=1 << 20) as store:
        assert store.frontier.recover() == 1
        assert [store.frontier.pop("old.test"), store.frontier.pop("old.test")] == [
            QueuedUrl(url="http://old.test/f", host="old.test", depth=0, hops=2),
            QueuedUrl(url="http://old.test/q", host="old.test", depth=1, found_on="http://old.test/")]


def test_a_queued_url_on_its_host_takes_under_sixty_bytes_of_record(tmp_path):
    host = "www.site123456.example12.test"
    items = [QueuedUrl(url=f"https://{host}/section-{i % 13}/article/{i}.html", host=host, depth=1)
             for i in range(2000)]
    with NodeStore.open(tmp_path / "s", map_size=1 << 24) as store:
        store.frontier.push(items)
        with store._env.read() as txn:
            from storage._frontier import QUEUE
            sizes = [len(k) + len(v) for k, v in txn.cursor(store._env.db(QUEUE))]
    # key 21 (position, host number, depth, sequence) + value 30 (the URL without its host), where the host's
    # name in the key made it 50 + 30
    assert len(sizes) == 2000 and max(sizes) < 60
