"""The durable outbox in NodeStore: put, take, ack, re-route on a view change, and surviving a reopen."""

from __future__ import annotations

import pytest

from storage import NodeStore, QueuedUrl
from storage._outbox import SEQ_BLOCK


def q(host: str, n: int = 0, depth: int = 1) -> QueuedUrl:
    return QueuedUrl(url=f"http://{host}/{n}", host=host, depth=depth, hops=n % 3, found_on=f"http://seed/{n}")


@pytest.fixture
def store(tmp_path):
    with NodeStore.open(tmp_path / "node", map_size=1 << 24) as s:
        yield s


def test_put_take_ack_per_owner_in_order(store):
    seqs = store.outbox.put([("b", q("x.b", 1)), ("c", q("y.c", 2)), ("b", q("x.b", 3))])
    assert seqs == [1, 2, 3]
    assert store.outbox.counts() == {"b": 2, "c": 1}
    assert store.outbox.take("b", 10) == [(1, q("x.b", 1)), (3, q("x.b", 3))]
    assert store.outbox.take("b", 1) == [(1, q("x.b", 1))]
    assert store.outbox.take("b", 10, after=1) == [(3, q("x.b", 3))]
    assert store.outbox.take("b", 10, after=3) == []
    assert store.outbox.take("nobody", 10) == []
    assert store.outbox.ack("b", [1, 99]) == 1  # unknown seqs are ignored
    assert store.outbox.ack("b", [1]) == 0  # a repeated ack changes nothing
    assert store.outbox.get("b", [1, 3]) == [(3, q("x.b", 3))]
    assert len(store.outbox) == 2


def test_owner_prefixes_do_not_mix(store):
    # "a" must not read the entries of "ab" (the NUL after the id separates them)
    store.outbox.put([("ab", q("h.ab")), ("a", q("h.a"))])
    assert [i.host for _, i in store.outbox.take("a", 10)] == ["h.a"]
    assert [i.host for _, i in store.outbox.take("ab", 10)] == ["h.ab"]


def test_bad_owner_ids_are_refused(store):
    for bad in ["", "\x00x", "a\x00b"]:
        with pytest.raises(ValueError, match="node id"):
            store.outbox.put([(bad, q("h"))])


def test_finish_stores_routed_links_with_the_page(store):
    page = q("mine.example", 0, depth=0)
    store.admit([page])
    popped = store.frontier.pop("mine.example")
    assert popped == page
    new = store.finish(popped, [q("mine.example", 5)], routed=[("peer", q("other.example", 6))])
    assert new == [q("mine.example", 5)]
    assert store.outbox.take("peer", 10) == [(1, q("other.example", 6))]
    assert store.frontier.recover() == 0  # the page left in-flight in the same transaction


def test_survives_close_and_reopen(tmp_path):
    path = tmp_path / "node"
    with NodeStore.open(path, map_size=1 << 24) as s:
        s.outbox.put([("b", q("x.b", i)) for i in range(5)])
        s.outbox.ack("b", [2])
        assert s.outbox.new_run() == 1
    with NodeStore.open(path, map_size=1 << 24) as s:
        assert [seq for seq, _ in s.outbox.take("b", 10)] == [1, 3, 4, 5]
        # numbers are never reused: a new process starts above the last reservation (the rest are skipped)
        assert s.outbox.put([("b", q("x.b", 9))]) == [5 + SEQ_BLOCK + 1]
        assert s.outbox.new_run() == 2


def test_accept_admits_owned_and_keeps_forwarded(store):
    new = store.accept([q("mine", 1), q("mine", 1), q("mine", 2)], [("c", q("theirs", 3))])
    assert new == [q("mine", 1), q("mine", 2)]
    assert store.accept([q("mine", 1)], []) == []  # the dedup store decides
    assert store.outbox.take("c", 10) == [(1, q("theirs", 3))]


def test_reroute_rekeys_changed_owners_and_reclaims_ours(store):
    store.outbox.put([("b", q("h1", 1)), ("b", q("h2", 2)), ("c", q("h3", 3)), ("c", q("h4", 4))])
    owners = {"h1": "b", "h2": "d", "h3": "me", "h4": "c"}
    moved, mine = store.reroute(owners.__getitem__, "me")
    assert moved == {"d": 1}
    assert mine == [q("h3", 3)]
    assert store.outbox.counts() == {"b": 1, "c": 1, "d": 1}
    # the moved entry has a new, higher seq, so a sender's "sent up to" cursor cannot skip it
    assert store.outbox.take("d", 10) == [(5, q("h2", 2))]
    assert store.outbox.take("b", 10) == [(1, q("h1", 1))]
    # reclaimed URLs were admitted: queued in our frontier and seen
    assert store.frontier.pop("h3") == q("h3", 3)
    assert store.admit([q("h3", 3)]) == []
    # a second re-route under the same owners changes nothing
    assert store.reroute(owners.__getitem__, "me") == ({}, [])


def test_memory_store_refuses_routed_links_it_cannot_keep():
    from storage import MemoryNodeStore

    store = MemoryNodeStore()
    assert store.finish(None, [q("h", 1)], routed=()) == [q("h", 1)]
    with pytest.raises(ValueError, match="needs NodeStore"):
        store.finish(None, [], routed=[("b", q("x", 2))])


def test_last_seq_is_kept_in_memory_and_never_behind_the_store(tmp_path):
    with NodeStore.open(tmp_path / "node", map_size=1 << 24) as s:
        assert s.outbox.last_seq() == 0
        s.outbox.put([("b", q("x.b", 1)), ("b", q("x.b", 2))])
        assert s.outbox.last_seq() == 2
        s.outbox.put([("c", q("y.c", 3))])
        assert s.outbox.last_seq() == 3

        def fail(txn):
            s.outbox._put_in(txn, [("b", q("x.b", 4))])
            raise RuntimeError("the caller's transaction aborts")

        with pytest.raises(RuntimeError):
            s._env.write(fail)
        # the aborted number is skipped, never given again
        assert s.outbox.last_seq() == 4
        assert s.outbox.put([("b", q("x.b", 5))]) == [5]
        assert s.outbox.last_seq() == 5
        assert [seq for seq, _ in s.outbox.take("b", 10)] == [1, 2, 5]
    with NodeStore.open(tmp_path / "node", map_size=1 << 24) as s:  # a new process starts above the reservation
        assert s.outbox.last_seq() == 2 + SEQ_BLOCK
        assert s.outbox.put([("c", q("y.c", 6))]) == [2 + SEQ_BLOCK + 1]


def test_the_counter_is_written_once_per_block_and_an_aborted_reservation_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setattr("storage._outbox.SEQ_BLOCK", 10)
    path = tmp_path / "node"
    with NodeStore.open(path, map_size=1 << 24) as s:
        assert s.outbox.put([("b", q("x.b", 1))]) == [1]
        assert s.outbox._stored_seq() == 11  # reserved up to 11
        s.outbox.put([("b", q("x.b", n)) for n in range(2, 11)])
        assert s.outbox._stored_seq() == 11  # within the block: not written

        def fail(txn):
            s.outbox._put_in(txn, [("b", q("x.b", 11)), ("b", q("x.b", 12))])  # past the block: reserves
            raise RuntimeError("the caller's transaction aborts")

        with pytest.raises(RuntimeError):
            s._env.write(fail)
        assert s.outbox._stored_seq() == 11  # the reservation went with the transaction...
        assert s.outbox.put([("b", q("x.b", 13))]) == [13]
        assert s.outbox._stored_seq() == 23  # ... and the next put made it again
    with NodeStore.open(path, map_size=1 << 24) as s:
        assert s.outbox.put([("b", q("x.b", 14))]) == [24]
        assert [seq for seq, _ in s.outbox.take("b", 20)] == [*range(1, 11), 13, 24]


def test_removals_count_the_commits_that_took_entries_out(store):
    store.outbox.put([("b", q("x.b", 1)), ("c", q("y.c", 2))])
    assert store.outbox.removals == 0
    assert store.outbox.ack("b", [99]) == 0
    assert store.outbox.removals == 0  # nothing removed: nothing for a waiting reader to look at
    store.outbox.ack("b", [1])
    assert store.outbox.removals == 1
    store.reroute(lambda host: "d", "a")  # c's entry re-keyed to d
    assert store.outbox.removals == 2 and store.outbox.counts() == {"d": 1}


def test_an_aborted_write_skips_its_numbers_and_keeps_nothing(store):
    store.outbox.put([("b", q("x.b", 1))])

    def fails(txn):
        store.outbox._put_in(txn, [("b", q("x.b", 2))])
        raise RuntimeError("the transaction fails after its put")

    with pytest.raises(RuntimeError):
        store._env.write(fails)
    assert store.outbox.take("b", 10) == [(1, q("x.b", 1))]
    assert store.outbox.put([("b", q("x.b", 3))]) == [3]  # the aborted seq is skipped
    assert store.outbox.take("b", 10, after=1) == [(3, q("x.b", 3))]


def test_reroute_gives_moved_entries_new_numbers_under_their_new_owner(store):
    store.outbox.put([("b", q("h1", 1)), ("b", q("h2", 2)), ("b", q("h3", 3))])
    owners = {"h1": "b", "h2": "d", "h3": "me"}
    moved, mine = store.reroute(owners.__getitem__, "me")
    assert moved == {"d": 1} and mine == [q("h3", 3)]
    assert store.outbox.take("b", 10) == [(1, q("h1", 1))]
    assert store.outbox.take("d", 10) == [(4, q("h2", 2))]


def test_entries_put_aside_are_passed_over_by_oldest_seq_until_acked_or_rerouted(store):
    """A backup passes on replicas it no longer backs through the outbox (`Dispatcher.pass_on`); no page's
    release waits for them, so `oldest_seq`, which held releases read, passes over them. A re-route gives them
    new numbers under their new owner, which count again."""
    page_link = [("b", q("h1.test", 1))]
    passed = [("b", q("h2.test", i)) for i in range(3)]
    store.accept([], passed, aside=True)
    assert store.outbox.oldest_seq("b") is None  # only entries put aside: nothing a release waits for
    (link_seq,) = store.outbox.put(page_link)
    assert store.outbox.oldest_seq("b") == link_seq
    store.outbox.ack("b", [link_seq])
    assert store.outbox.oldest_seq("b") is None and store.outbox.counts() == {"b": 3}
    moved, _mine = store.reroute(lambda host: "c", "a")
    assert moved == {"c": 3}
    assert store.outbox.oldest_seq("c") is not None  # re-keyed: they count again
    seqs = [seq for seq, _item in store.outbox.take("c", 10)]
    store.outbox.ack("c", seqs)
    assert store.outbox.oldest_seq("c") is None and store.outbox.counts() == {}
