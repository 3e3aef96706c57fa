"""The node's one sync service: forces its store to disk at most once per period, for everyone waiting.

A commit of the node's store (LMDB, `sync=False`) survives the process's death; only a sync (fsync) makes it
survive the machine's. Several parts of a node need their commits on disk: the periodic sync bounds what a
power loss takes, a receiver acknowledges a peer's batch only once it is durable (DESIGN decision 5), a hand-off
chunk likewise. Each forcing its own fsync cost a cluster node up to four a second against a lone node's one,
each about 0.5 ms of CPU and dearer commits after it (docs/benchmarks.md, cluster overhead). So one loop syncs
the store once per `period` (the node's `sync_interval`), and whoever needs a commit durable waits for the next
sync after it: one fsync serves every waiter whose commit came before it began.

The guarantee, kept exactly: a waiter is told only after a sync that began after its commit. `mark()` (taken
right after the commit) is the store's count of completed syncs; a sync runs in the event loop's thread with
no await inside, so no commit can fall between its start and its end, and a count above the mark means a sync
that began after the commit. A sync by anything else in the node (a hand-off's, the stop's) counts too:
`NodeStore.syncs` moves with every one, and a waiter covered by one is told at the next sync here at the latest.

Before `run` has started (and after it ended), nothing syncs on a timer: `after` then syncs at once and tells
the waiter, which is what a receiver needs when no loop runs (tests, tools).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import trio

__all__ = ["StoreSyncs", "SyncedStore"]

log = logging.getLogger(__name__)


class SyncedStore(Protocol):
    """What the service needs of a store: force it to disk, and count the syncs that completed."""

    syncs: int

    def sync(self) -> None: ...


class StoreSyncs:
    """Syncs `store` every `period` seconds while `run` runs; tells the waiters of `after` once their commit is
    durable. Waiters are told in the order they came, right after the sync, with no await in between."""

    def __init__(self, store: SyncedStore, *, period: float) -> None:
        if not period > 0:
            raise ValueError(f"sync period must be > 0 seconds, got {period}")
        self.store = store
        self.period = period
        self._running = False
        # (mark, callback): told once store.syncs > mark
        self._waiters: list[tuple[int, Callable[[], object]]] = []

    @property
    def running(self) -> bool:
        """Whether `run` syncs on its timer (otherwise `after` syncs at once)."""
        return self._running

    def mark(self) -> int:
        """Take right after a commit: `durable(mark)` is true once a sync that began after it has completed."""
        return self.store.syncs

    def durable(self, mark: int) -> bool:
        return self.store.syncs > mark

    def after(self, mark: int, callback: Callable[[], object]) -> None:
        """Call `callback()` once the commits before `mark` are on disk: at once if a sync has covered them, at
        the service's next sync if it runs, else after a sync made now."""
        if self.durable(mark):
            callback()
            return
        self._waiters.append((mark, callback))
        if not self._running:
            self.sync()

    def waiting(self) -> int:
        """Waiters not yet told."""
        return len(self._waiters)

    def sync(self) -> None:
        """Force the store to disk now, then tell every waiter it covered."""
        self.store.sync()
        self._tell()

    def _tell(self) -> None:
        if not self._waiters:
            return
        synced = self.store.syncs
        waiters, self._waiters = self._waiters, []
        for mark, callback in waiters:
            if synced > mark:
                callback()
            else:  # registered by a callback after this sync: the next one
                self._waiters.append((mark, callback))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sync once per period until cancelled (a failed sync raises `StorageError`: the node stops)."""
        self._running = True
        try:
            task_status.started()
            while True:
                await trio.sleep(self.period)
                self.sync()
        finally:
            self._running = False
