"""Which store the crawler's seen-set lives in (``--dedup KIND``).

The default, ``lmdb``, is the seen-set inside the node's ``NodeStore``: marking URLs seen, queueing the new
ones and clearing the page they came from happen in ONE transaction, so a crash loses nothing.
Every other kind (the URL-dedup study's structures, and Redis) is a separate store next to the frontier:
``SplitStore`` gives the crawler the same ``admit`` / ``finish`` calls, but the two commits are separate,
so a crash between them can lose the links of the pages then in flight, and the in-memory kinds forget
everything at exit (a restarted node then re-queues what it finds again). ``bloom`` also loses URLs by
design: a false positive is answered "seen". Those trade-offs are what the study measures; the default
keeps the guarantees.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from pathlib import Path

from storage import DEDUP_KINDS, SEEN_FILTER_MAX_BYTES, HostState, NodeStore, QueuedUrl, host_position, open_dedup

__all__ = ["SplitStore", "open_node_store", "DEDUP_KINDS"]


class SplitStore:
    """A frontier (from a ``NodeStore``) beside a seen-set of another kind, with NodeStore's calls."""

    def __init__(self, frontier_store: NodeStore, dedup) -> None:
        self._base = frontier_store
        self.frontier = frontier_store.frontier
        self.dedup = dedup
        self.uploads = frontier_store.uploads
        self.digests = frontier_store.digests  # payload digests (peer/crawl/payloads.py) live in the frontier's store
        self.crawl_log = frontier_store.crawl_log

    def admit(self, items: Sequence[QueuedUrl]) -> list[QueuedUrl]:
        if not items:
            return []
        fresh = self.dedup.add_new_urls([(host_position(i.host), i.url) for i in items])
        new = [item for item, is_new in zip(items, fresh) if is_new]
        if new:
            self.frontier.push(new)
        return new

    def finish(self, item: QueuedUrl | None, links: Sequence[QueuedUrl], *,
               state: HostState | None = None, items: Sequence[dict[str, Any]] = (),
               logged: Sequence[Any] | None = None) -> list[QueuedUrl]:
        new = self.admit(links)
        if items:  # the page's items, in the frontier's store (a commit of their own, like the seen-set's)
            self._base.items.put(items)
        if logged is not None:  # its crawl-log record too
            self._base.crawl_log.put((logged,))
        if item is not None:
            self.frontier.done(item)
        if state is not None:
            self.frontier.put_state(state)
        return new

    def release_resident(self) -> int:
        return self._base.release_resident()

    @property
    def syncs(self) -> int:
        """Completed syncs (each syncs both stores), as `NodeStore.syncs`."""
        return self._base.syncs

    def sync(self) -> None:
        self.dedup.sync()
        self._base.sync()

    def close(self) -> None:
        try:
            self.dedup.close()
        finally:
            self._base.close()

    def __enter__(self) -> SplitStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_node_store(
    data_dir: str | os.PathLike[str], kind: str = "lmdb", *, expected: int = 10_000_000,
    fp_rate: float = 0.001, redis_url: str | None = None, namespace: str | None = None,
    filter_max_bytes: int = SEEN_FILTER_MAX_BYTES,
):
    """The node's state under ``data_dir/state`` with the seen-set of ``kind``; ``filter_max_bytes`` caps the
    seen filter of the LMDB store."""
    state = Path(data_dir) / "state"
    if kind == "lmdb":
        return NodeStore.open(state, filter_max_bytes=filter_max_bytes)
    if kind not in DEDUP_KINDS:
        raise ValueError(f"unknown dedup kind {kind!r}; one of {', '.join(DEDUP_KINDS)}")
    base = NodeStore.open(state, filter_max_bytes=filter_max_bytes)
    try:
        dedup = open_dedup(kind, Path(data_dir) / f"dedup-{kind}", expected=expected, fp_rate=fp_rate,
                           redis_url=redis_url, namespace=namespace)
    except BaseException:
        base.close()
        raise
    return SplitStore(base, dedup)
