"""Low disk as a state: the guard's marks and transitions with a fake free-space reading (MockClock), a peer's
batch left unacknowledged while the disk is low and taken once space is back."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from peer.cluster.core.dispatch import Dispatcher
from peer.crawl.syncs import StoreSyncs
from peer.diskguard import DiskGuard, DiskMarks, statvfs_free
from protocol import BatchAck
from storage import NodeStore

from .test_dispatch import RING2, FakeLinks, _batch, owned_hosts

MiB = 1 << 20


class FakeDisk:
    """A free-space reading the test sets; `fail` makes the next readings raise as statvfs would."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.fail = False
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        if self.fail:
            raise OSError(5, "Input/output error")
        return self.free


def test_marks_resume_a_quarter_above_low_and_refuse_an_empty_band():
    assert DiskMarks.from_mib(1024) == DiskMarks(low=1024 * MiB, resume=1280 * MiB)
    assert DiskMarks.from_mib(2) == DiskMarks(low=2 * MiB, resume=3 * MiB)  # at least 1 MiB between them
    assert DiskMarks.from_mib(0) == DiskMarks(low=0, resume=MiB)  # 0: free space is never below 0, never held
    with pytest.raises(ValueError):
        DiskMarks(low=5, resume=5)
    with pytest.raises(ValueError):
        DiskMarks(low=-1, resume=5)


def test_the_state_turns_on_below_low_stays_on_between_the_marks_and_turns_off_at_resume():
    disk = FakeDisk(10 * MiB)
    holds: list[bool] = []
    guard = DiskGuard(disk, DiskMarks(low=4 * MiB, resume=6 * MiB), hold=holds.append)
    assert guard.check() is False and guard.admitting() and holds == []
    disk.free = 4 * MiB  # at the mark: not below it
    assert guard.check() is False
    disk.free = 4 * MiB - 1
    assert guard.check() is True and not guard.admitting() and holds == [True]
    for free in (3 * MiB, 5 * MiB, 6 * MiB - 1):  # the pages under way finish and space comes back slowly
        disk.free = free
        assert guard.check() is True
    assert holds == [True]  # told once, not at every reading
    disk.free = 6 * MiB
    assert guard.check() is False and guard.admitting() and holds == [True, False]
    assert guard.status() == {"low": False, "free_bytes": 6 * MiB, "low_bytes": 4 * MiB, "resume_bytes": 6 * MiB,
                              "holds": 1}


def test_a_failed_reading_changes_nothing():
    disk = FakeDisk(1 * MiB)
    holds: list[bool] = []
    guard = DiskGuard(disk, DiskMarks(low=4 * MiB, resume=6 * MiB), hold=holds.append)
    assert guard.check() is True
    disk.fail = True
    disk.free = 100 * MiB
    assert guard.check() is True and guard.read_errors == 1 and holds == [True]
    disk.fail = False
    assert guard.check() is False and guard.read_errors == 0 and holds == [True, False]


def test_statvfs_free_reads_the_filesystem_of_the_path(tmp_path):
    import os

    st = os.statvfs(tmp_path)
    free = statvfs_free(tmp_path)()
    assert 0 < free <= st.f_blocks * st.f_frsize


async def test_served_the_guard_checks_at_start_and_every_interval(autojump_clock):
    disk = FakeDisk(1 * MiB)  # a node started on a disk already low holds before its first fetch
    changes: list[tuple[float, bool]] = []
    guard = DiskGuard(disk, DiskMarks(low=4 * MiB, resume=6 * MiB),
                      hold=lambda on: changes.append((trio.current_time(), on)))
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(guard.serve, 1.0)
        assert changes == [(start, True)]
        await trio.sleep(2.5)
        disk.free = 7 * MiB
        await trio.sleep(1.0)  # the next reading is at start + 3
        assert [(t - start, on) for t, on in changes] == [(0.0, True), (3.0, False)]
        assert disk.reads == 4
        nursery.cancel_scope.cancel()


async def test_a_peers_batch_is_left_unacknowledged_while_the_disk_is_low_and_taken_after(tmp_path, autojump_clock):
    """Nothing is lost: the sender keeps an unacknowledged batch and sends it again; the owner stores nothing
    while its disk is low and acknowledges the re-send once space is back."""
    disk = FakeDisk(1 * MiB)
    guard = DiskGuard(disk, DiskMarks(low=4 * MiB, resume=6 * MiB), hold=lambda on: None)
    guard.check()
    links = FakeLinks()
    with NodeStore.open(tmp_path / "a", map_size=1 << 24) as store:
        syncs = StoreSyncs(store, period=0.5)
        d = Dispatcher("a", store, links, ring_of=lambda: (1, RING2), syncs=syncs, admitting=guard.admitting)
        host = owned_hosts(RING2, "a", 1)[0]
        async with trio.open_nursery() as nursery:
            await nursery.start(syncs.run)
            await d.on_message("b", _batch(1, host))
            await trio.sleep(2.0)
            assert [m for _t, _p, m in links.sent if isinstance(m, BatchAck)] == []
            assert len(store.dedup) == 0 and len(store.frontier) == 0 and d.stats.batches_refused == 1
            disk.free = 8 * MiB
            guard.check()
            await d.on_message("b", _batch(1, host))  # the sender's re-send
            await trio.sleep(1.0)
            assert [m.seq for _t, _p, m in links.sent if isinstance(m, BatchAck)] == [1]
            assert len(store.frontier) == 1
            nursery.cancel_scope.cancel()
