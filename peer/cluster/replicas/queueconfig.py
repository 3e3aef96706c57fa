"""The queued-URL replicas' limits and timings, and the owner's state per backup: what is staged for it, sent,
acknowledged (`Backup`), and what a received batch waits for before it is acknowledged (`Ticket`). The rest is
in peer/cluster/replicas/queuereplicas.py (`QueueReplicas`), whose docstring tells the whole design.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from protocol import QueueReplica
from storage import QueuedUrl

__all__ = [
    "BACKUPS_CACHE", "FOLD_AGE", "FOLD_ENTRIES", "FULL", "GC_DELAY", "INTERVAL", "MAX_ENTRIES", "MAX_HOST",
    "MAX_STAGED", "MAX_URL_BYTES", "RESEND_AFTER", "SCAN_CHUNK", "Backup", "QueueAlone", "QueueDelegate",
    "Ticket", "merged",
]

#: A backup's next message leaves at most this long after the first entry was staged for it, and no sooner
#: unless FULL entries wait: one message per backup per interval carries the pages of the last 100 ms (about
#: 60 entries on 2 cores) instead of one message per page (each costs its frame, HMAC, compression, decoding,
#: the backup's transaction and the ack: docs/benchmarks.md, cluster overhead).
INTERVAL = 0.1
#: Staged entries that make a message due at once (a hand-off's URLs, a re-homing scan, a backlog after a
#: slow ack): bulk work goes as fast as the acks come back.
FULL = 500
# A backup acknowledges a replica once it is committed (in the OS page cache: it survives the process's death);
# the node's sync service (peer/crawl/syncs.py) forces it to disk with the rest of the store, once per
# `sync_interval`. An fsync before each ack would guard only against the backup's machine crashing together
# with the owner dying for good, two failures, which R = 1 does not promise to survive; the owner's own copy is
# synced before it acknowledges anything (docs/cluster.md).

#: An unacknowledged replica is sent again after this long.
RESEND_AFTER = 2.0
#: Entries per message, and URL bytes per message: far inside the 1 MiB frame limit.
MAX_ENTRIES = 2000
MAX_URL_BYTES = 512 * 1024
#: Entries waiting for one backup, at most (about 300 bytes each); past it the waiting adds are dropped and a
#: full re-homing scan rebuilds them from the frontier on disk. A backup gets there only if it stays
#: unreachable long after SWIM would have declared it dead.
MAX_STAGED = 200_000
#: A backup drops replicas of positions it no longer backs once the ring has been stable this long: long enough
#: for a view to settle, short enough that a replica whose release went to the backup of a ring in between is
#: not still here when rings change again (it would be promoted at a death and repeat a page).
GC_DELAY = 1.0
#: Re-homing reads the queue in chunks of this many URLs, yielding to trio between chunks.
SCAN_CHUNK = 2048
#: A backup journals each message (one put at the end of a table) and folds the journal into its replica and seen
#: tables once this many entries wait, or the oldest has waited FOLD_AGE seconds (storage/_replicas.py): applied
#: one message at a time, each entry copied a leaf page of its own and each message paid a commit; a fold writes
#: the keys in order, many to a page, in one commit (and an add released within it is never written). A fold of
#: 8,192 entries takes about 10-20 ms.
FOLD_ENTRIES = 8192
FOLD_AGE = 5.0
#: A host name is at most 253 bytes (RFC 1035).
MAX_HOST = 253
#: Hosts whose backups are remembered under the current ring (about 150 bytes each); past it the memory starts
#: over. Every queued URL and every release asks for its host's backups, and a crawl names the same hosts over
#: and over: a hash, a bisection and a walk of the ring each time cost more than the rest of staging.
BACKUPS_CACHE = 200_000


class Ticket:
    """What a received batch waits for before it is acknowledged: for each backup, its state here and the count
    of entries staged for it up to this batch's URLs. Done once each backup has acknowledged that far (or left
    the ring). A backup that left the ring and came back has a new state whose counts start again from 0: the
    old state is how a ticket tells it left (its entries were dropped, and counted as acknowledged, when it did)."""

    __slots__ = ("targets", "callbacks")

    def __init__(self, targets: dict[str, tuple[Backup, int]]) -> None:
        self.targets = targets
        self.callbacks: list[Callable[[], None]] = []


def merged(a: Ticket | None, b: Ticket | None) -> Ticket | None:
    """A ticket done once both are."""
    if a is None or b is None:
        return a or b
    targets = dict(a.targets)
    for backup, (state, count) in b.targets.items():
        mine = targets.get(backup)
        targets[backup] = (state, max(count, mine[1])) if mine is not None and mine[0] is state else (state, count)
    return Ticket(targets)


@dataclass(slots=True)
class Backup:
    # adds (key, URL), releases (key, URL, True) and keys of fetched pages (seen marks: a release with no URL of
    # this node's queue); an add carries its key, computed once for all its backups
    staged: deque[tuple[bytes, QueuedUrl] | tuple[bytes, QueuedUrl, bool] | bytes] = field(default_factory=deque)
    staged_total: int = 0  # entries ever staged for this backup
    acked_total: int = 0  # entries acknowledged (or dropped): FIFO, so everything up to here arrived
    seq: int = 0
    inflight: QueueReplica | None = None
    inflight_count: int = 0
    inflight_released: list[str] = field(default_factory=list)  # the URLs the message in flight releases
    sent_at: float = 0.0
    connection: int = 0
    staged_at: float | None = None  # when the oldest entry not yet sent was staged (None: nothing staged)


class QueueDelegate(Protocol):
    """What the queued-URL replicas tell the node they are part of (the cluster), as memberlist's delegates do.
    Given at construction; `QueueAlone`, the default, tells nobody."""

    def release_staged(self, item: QueuedUrl, key: bytes, backups: frozenset[str]) -> None:
        """The release of `item` (its seen `key`) is staged for `backups`: the seen-key replicas send the key now,
        to the other backups only (they mark it seen with the release), so no backup holds a page as seen while
        the links it queued may be lost with this node."""

    def marked_seen(self, keys: Sequence[bytes]) -> None:
        """A peer's replica marked `keys` seen here (its releases): the hand-off keeps them through the drop of an
        arc it is handing over."""

    def pass_on(self, items: list[QueuedUrl]) -> None:
        """The URLs of replicas this node no longer backs, before they are dropped: sent to their owners."""

    def held_from(self, peer_id: str, epoch: int, items: list[QueuedUrl]) -> None:
        """A replica message from `peer_id`, sent under view `epoch`, was held here: its URLs are durably queued
        at their owner, and the crawler need not route them there again."""


class QueueAlone:
    """The delegate of queued-URL replicas that belong to no cluster (tests, a node's parts built alone)."""

    def release_staged(self, item: QueuedUrl, key: bytes, backups: frozenset[str]) -> None:
        pass

    def marked_seen(self, keys: Sequence[bytes]) -> None:
        pass

    def pass_on(self, items: list[QueuedUrl]) -> None:
        pass

    def held_from(self, peer_id: str, epoch: int, items: list[QueuedUrl]) -> None:
        pass
