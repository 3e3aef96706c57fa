"""The node's sync service: one fsync per period serves every waiter whose commit came before it began; a
waiter is never told before such a sync; without its loop it syncs at once."""

from __future__ import annotations

import pytest
import trio

from peer.crawl.syncs import StoreSyncs
from storage import MemoryNodeStore, NodeStore, QueuedUrl


class TimedStore:
    """A real NodeStore whose syncs are recorded with their virtual time."""

    def __init__(self, store: NodeStore) -> None:
        self.store = store
        self.synced_at: list[float] = []

    @property
    def syncs(self) -> int:
        return self.store.syncs

    def sync(self) -> None:
        self.store.sync()
        self.synced_at.append(trio.current_time())


@pytest.fixture
def store(tmp_path):
    with NodeStore.open(tmp_path / "s", map_size=1 << 24) as s:
        yield TimedStore(s)


def _commit(store: TimedStore, n: int) -> None:
    store.store.admit([QueuedUrl(url=f"http://h{n}.test/", host=f"h{n}.test", depth=0)])


async def test_one_sync_per_period_serves_every_waiter_committed_before_it(store, autojump_clock):
    syncs = StoreSyncs(store, period=1.0)
    told: list[tuple[str, float]] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(syncs.run)
        start = trio.current_time()
        for name, at in (("a", 0.1), ("b", 0.5), ("c", 0.95)):
            await trio.sleep_until(start + at)
            _commit(store, len(told))
            syncs.after(syncs.mark(), lambda name=name: told.append((name, trio.current_time() - start)))
        assert told == [] and syncs.waiting() == 3
        await trio.sleep_until(start + 1.5)
        assert [t - start for t in store.synced_at] == pytest.approx([1.0])
        assert [name for name, _t in told] == ["a", "b", "c"]
        assert [t for _name, t in told] == pytest.approx([1.0, 1.0, 1.0])
        # nothing waits: the service still syncs once per period, never more often
        await trio.sleep_until(start + 3.5)
        assert [t - start for t in store.synced_at] == pytest.approx([1.0, 2.0, 3.0])
        nursery.cancel_scope.cancel()


async def test_a_waiter_is_told_only_after_a_sync_that_began_after_its_commit(store, autojump_clock):
    syncs = StoreSyncs(store, period=1.0)
    told: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(syncs.run)
        start = trio.current_time()
        await trio.sleep(1.01)  # the service's first sync has just run
        assert len(store.synced_at) == 1
        _commit(store, 1)
        mark = syncs.mark()
        assert not syncs.durable(mark)  # the sync that just ran began before this commit
        syncs.after(mark, lambda: told.append(trio.current_time() - start))
        await trio.sleep(0.98)
        assert told == []
        await trio.sleep(0.02)
        assert told == pytest.approx([2.0]) and syncs.durable(mark)
        # a callback that waits again (a commit it made meanwhile) is told at the next sync, not this one
        again: list[float] = []

        def chain() -> None:
            _commit(store, 2)
            syncs.after(syncs.mark(), lambda: again.append(trio.current_time() - start))

        _commit(store, 3)
        syncs.after(syncs.mark(), chain)
        await trio.sleep(1.0)
        assert again == []
        await trio.sleep(1.0)
        assert again == pytest.approx([4.0])
        nursery.cancel_scope.cancel()


async def test_a_sync_by_someone_else_covers_earlier_commits(store, autojump_clock):
    syncs = StoreSyncs(store, period=1.0)
    _commit(store, 1)
    mark = syncs.mark()
    store.sync()  # a hand-off's, the stop's
    told: list[int] = []
    syncs.after(mark, lambda: told.append(1))  # covered: told at once, no sync of the service's
    assert told == [1] and len(store.synced_at) == 1  # the other's sync only


async def test_without_its_loop_the_service_syncs_at_once(store):
    syncs = StoreSyncs(store, period=1.0)
    assert not syncs.running
    told: list[int] = []
    _commit(store, 1)
    syncs.after(syncs.mark(), lambda: told.append(1))
    assert told == [1] and len(store.synced_at) == 1 and syncs.waiting() == 0


def test_memory_store_and_a_bad_period():
    memory = MemoryNodeStore()
    syncs = StoreSyncs(memory, period=0.5)
    told: list[int] = []
    syncs.after(syncs.mark(), lambda: told.append(1))
    assert told == [1] and memory.syncs == 1
    with pytest.raises(ValueError, match="sync period"):
        StoreSyncs(memory, period=0)
