"""Seen-key replicas: each page a node fetches is also marked seen on the node that would own its host if this
node died, so a death costs only the fetches under way, not every page the dead node had fetched.

Why: the owner's dedup store is the authority (DESIGN decision 4), and it dies with its node. Without a copy,
the hosts' new owners fetch again every page of those hosts that is linked again while the dead node is away
(hundreds of pages in the real-daemon test). Queued URLs are not replicated: a replica marks a URL seen, and a
URL marked seen but queued nowhere would be lost; pages already fetched are the only keys that are safe to copy.

How: after a page's commit the crawler calls `fetched(item)`; every `interval` the keys gathered are recorded
in the store's `fetched` database, grouped by their backups, `ring.holders_at(position, 2, zones)` (the owner of the
position in the ring without this node, so a death moves each arc exactly to the node holding its replica, and
the owner once that one is gone too; and a node in another failure zone if both share this node's), and sent as `SeenReplica` messages. The receiver puts the keys in its dedup store, where they decide nothing while
the sender owns their arc: a node looks a URL up only for hosts it owns. Once it owns them (the sender died, or
the arc moved to it by hand-off, which carries the same keys anyway) they keep those pages from being fetched
again.

A join or a leave changes backups: the next tick after the ring changed scans the `fetched` record and sends
again every key to each backup it did not have under the ring of the last scan (all of them after a
restart), and forgets the keys of arcs this node no longer owns (their seen keys left with the hand-off). The
scan yields to trio every 4,096 keys; it costs a ring look-up and two backup look-ups per key recorded.

Keys that arrive by hand-off are of fetched pages too (a sender never sends the keys of URLs queued or in
flight). Those of arcs this node owns are recorded and replicated like its own (`adopt`); those of arcs owned
elsewhere (the arc moved on while it travelled, or this node skipped a ring: it saw a join and a leave as one
change, so it never hands on what the leaver gave it) are sent to their owner at once and again at each ring
change, ahead of the hand-off transfers on the same links, so the owner knows them before a transfer releases
their hosts (`ring_changed`).

Politeness states take the same path: a hand-off chunk's states for hosts owned elsewhere (`pass_states`) go to
their owner in the `hosts` of a `SeenReplica`, which merges them like a hand-off's (the later ready time wins),
so a joiner does not fetch a host sooner than the leaver's Crawl-delay allows because the leaver's state went
to a node that no longer owned the host. A node that receives states it does not own keeps them and sends them
on only at its next ring change (never at once: two nodes whose views differ would pass them back and forth).

With `--replicas R` (R >= 1) none of this travels by `SeenReplica`: a page's key goes with its release, and
what is left (a backup the release did not reach, a ring change's re-sends) goes in the queued-URL replicas'
acknowledged FIFO (`reliable`, `QueueReplicas.mark_seen`). With `--replicas 0` the messages are best effort, no
acks: a replica lost with a connection or a full send queue costs at most a page fetched twice after a death. The
window between a page's commit and its replica leaving is `interval`.
Replicas a node holds for arcs that later moved elsewhere stay in its store as harmless seen keys (every one of
them names a page that was fetched); they cost about 40 bytes each on disk.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import trio

from protocol import HostState as WireHostState
from protocol import Limits, Message, SeenReplica
from ring import Zones
from storage import NodeStore, QueuedUrl, queued_url_keys

__all__ = ["REPLICA_COPIES", "REPLICA_INTERVAL", "SeenReplicas"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.replicas")

#: Keys leave 10 times a second: a kill loses the replicas of at most 0.1 s of pages, at one small message per
#: backup per tick.
REPLICA_INTERVAL = 0.1
#: Keys waiting to leave, at most (about 2 MB): past it the oldest are dropped and counted. Only a node whose
#: peers stay unreachable for a long time gets there, and a lost replica costs at most a repeated fetch.
MAX_PENDING = 100_000
#: Each key goes to the first two backups of its position: a node that dies while one of its backups is leaving
#: or dead, or before it has seen a join or a leave move its backups (its replicas would have gone to a node that
#: then left), still has one at the arc's next owner. Twice the replica traffic: about 37 bytes a page in msgpack.
REPLICA_COPIES = 2
#: Keys per message, at most: 4,096 keys are about 70 KB in either codec, well inside the 1 MiB frame limit.
MAX_KEYS_PER_MESSAGE = 4096
#: A dedup key: 8 bytes of ring position, 8 of URL fingerprint (storage/_keys.py).
KEY_SIZE = 16
#: Host positions whose backups are remembered under the current ring (about 150 bytes each); past it the memory
#: starts over. A flush asked the ring for the backups of every position it carried, each time (a bisection and a
#: walk of the ring: about half of what seen-key replicas cost per page, docs/benchmarks.md).
HOLDERS_CACHE = 200_000


def _ignore(_items: Sequence[object]) -> None:
    """What a part built alone does with what it would tell the cluster: nothing."""


class SeenReplicas:
    """Sends the seen keys of fetched pages to their backups and stores the keys peers send here."""

    def __init__(
        self,
        node_id: str,
        store: NodeStore,
        links: Any,
        *,
        ring_of: Callable[[], tuple[int, Any]],
        interval: float = REPLICA_INTERVAL,
        max_pending: int = MAX_PENDING,
        copies: int = REPLICA_COPIES,
        apply_states: Callable[[Sequence[WireHostState]], None] = _ignore,
        wall_clock: Callable[[], float] = time.time,
        zones_of: Callable[[], Zones] = Zones,
        reliable: Callable[[str, Sequence[bytes]], bool] | None = None,
        on_marked: Callable[[Sequence[bytes]], None] = _ignore,
    ) -> None:
        self.node_id = node_id
        # (backup, keys) -> the keys go to the backup acknowledged and re-sent (the queued-URL replicas' FIFO,
        # with --replicas R >= 1), or False: no room, best effort then; None: `SeenReplica` messages only
        self.reliable = reliable
        self.store = store
        self.links = links
        self.ring_of = ring_of  # () -> (view epoch, the current Ring or None)
        self.zones_of = zones_of  # () -> the failure zones of the ring's nodes (a copy goes outside the owner's)
        self.interval = interval
        self.max_pending = max_pending
        self.copies = copies
        self.max_keys = min(Limits().max_keys_per_chunk, MAX_KEYS_PER_MESSAGE)
        self._pending: list[bytes] = []
        # keys of pages released through the queued-URL replicas (`fetched(..., released=backups)`), with the
        # backups that release went to: they mark the key seen with it, so it goes only to the others (none in a
        # cluster of two). The backups of the release, not those of the ring at the flush: the ring may change
        # in between, and a backup that the ring makes first then would get neither the key nor the release.
        self._released: list[tuple[bytes, frozenset[str]]] = []
        self._foreign: dict[bytes, None] = {}  # fetched-page keys of arcs owned elsewhere, oldest first
        # host -> (crawl delay, ready at (wall clock), failures): states of hosts owned elsewhere, to pass on
        self._states: dict[str, tuple[float, float, int, int, int]] = {}  # delay, ready, failures, pages, bytes
        self.apply_states = apply_states  # merge states of hosts owned here (the cluster: timers and store)
        # called with the keys a peer's `SeenReplica` marks seen here: the hand-off keeps them through the drop of
        # arcs it is handing over (`Handoff.marked_seen`)
        self.on_marked = on_marked
        self.wall_clock = wall_clock  # states travel as durations; kept here as wall-clock times
        self.states_passed_on = 0
        self._synced: Any = None  # the ring under which every recorded key was last sent to its backup
        self._synced_zones = Zones()  # its members' zones then: an older ring's backups are found with its own
        self._holders_ring: Any = None  # the ring and zones `_holders` was filled under
        self._holders_zones: Any = None
        self._holders: dict[bytes, tuple[str, ...]] = {}  # host position -> its backups (not this node)
        self.rescans = 0
        self.keys_resent = 0
        self.keys_sent = 0
        self.keys_dropped = 0  # the send queue was full, no link, or the pending list overflowed
        self.keys_received = 0
        self.keys_passed_on = 0  # hand-off keys of arcs owned elsewhere, sent to their owners
        self.keys_refused = 0  # malformed keys from a peer

    def fetched(self, item: QueuedUrl, key: bytes | None = None, *, released: frozenset[str] | None = None) -> None:
        """The crawler committed `item` as fetched: its key (`key`, if the caller has it already) goes to the
        backups at the next tick. `released`: the backups its release went to through the queued-URL replicas,
        which mark it seen there: it goes to the others only (it is recorded all the same)."""
        key = key if key is not None else queued_url_keys((item,))[0]
        if released is None:
            self._pending.append(key)
        else:
            self._released.append((key, released))
        self._trim_pending()

    def _trim_pending(self) -> None:
        """Past `max_pending` keys waiting to leave, the oldest go (counted as dropped)."""
        for pending in (self._pending, self._released):
            excess = len(pending) - self.max_pending
            if excess > 0:
                del pending[:excess]
                self.keys_dropped += excess

    def adopt(self, keys: list[bytes]) -> None:
        """Keys of fetched pages that came by hand-off: ours are replicated like our own, the others go to their
        owner (now, and at every ring change while they are not ours)."""
        epoch, ring = self.ring_of()
        if ring is None:
            return
        node = self.node_id
        foreign: dict[str, list[bytes]] = defaultdict(list)
        for key in keys:
            owner = ring.owner_at(int.from_bytes(key[:8], "big"))
            if owner == node:
                self._pending.append(key)
            else:
                foreign[owner].append(key)
                self._foreign[key] = None
        if len(self._foreign) > self.max_pending:
            for key in list(self._foreign)[: len(self._foreign) - self.max_pending]:
                del self._foreign[key]
        self._trim_pending()
        self.keys_passed_on += self._send(epoch, foreign)

    def pass_states(self, states: Sequence[WireHostState]) -> None:
        """Politeness states that came by hand-off for hosts owned elsewhere: sent to their owner now, and kept
        to be sent again at ring changes until this node owns them (then merged here)."""
        self._keep_states(states)
        _epoch, ring = self.ring_of()
        if ring is not None:
            self._send_states(ring, only=[state.host for state in states])

    def _keep_states(self, states: Sequence[WireHostState]) -> None:
        wall = self.wall_clock()
        kept = self._states
        for state in states:
            earlier = kept.get(state.host)
            ready, pages, size = wall + state.ready_in, state.pages, state.bytes
            if earlier is not None:
                ready, pages, size = max(ready, earlier[1]), max(pages, earlier[3]), max(size, earlier[4])
            kept[state.host] = (state.crawl_delay, ready, state.failures, pages, size)
        if len(kept) > self.max_pending // 10:
            for host in list(kept)[: len(kept) - self.max_pending // 10]:
                del kept[host]

    def _send_states(self, ring: Any, only: Sequence[str] | None = None) -> None:
        """Send the kept states (or those of `only`) to their owners under `ring`; merge and forget ours."""
        epoch, _ring = self.ring_of()
        wall = self.wall_clock()
        node = self.node_id
        by_owner: dict[str, list[WireHostState]] = defaultdict(list)
        mine: list[WireHostState] = []
        for host in list(only if only is not None else self._states):
            entry = self._states.get(host)
            if entry is None:
                continue
            delay, ready, failures, pages, size = entry
            if ready <= wall:
                # nothing left to wait for; the host's page and byte counts went with its hand-off chunk
                del self._states[host]
                continue
            wire = WireHostState(host=host, crawl_delay=delay, ready_in=max(0.0, ready - wall), failures=failures,
                                 pages=pages, bytes=size)
            owner = ring.owner(host)
            if owner == node:
                del self._states[host]
                mine.append(wire)
            else:
                by_owner[owner].append(wire)
        if mine:
            self.apply_states(mine)
        for owner, states in by_owner.items():
            if self.links.send_nowait(owner, SeenReplica(epoch=epoch, keys=(), hosts=tuple(states))):
                self.states_passed_on += len(states)

    def ring_changed(self, ring: Any, epoch: int) -> None:
        """Called as the node adopts `ring`, before its hand-off transfers start: the keys and states held for
        arcs owned elsewhere go to their owners under `ring` (those now owned here become ours)."""
        if self._states:
            self._send_states(ring)
        if not self._foreign:
            return
        node = self.node_id
        foreign: dict[str, list[bytes]] = defaultdict(list)
        for key in list(self._foreign):
            owner = ring.owner_at(int.from_bytes(key[:8], "big"))
            if owner == node:
                del self._foreign[key]
                self._pending.append(key)
            else:
                foreign[owner].append(key)
        self.keys_passed_on += self._send(epoch, foreign)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            self.flush()
            _epoch, ring = self.ring_of()
            if ring is not None and ring is not self._synced:
                await self.rescan(ring)

    def flush(self) -> int:
        """Record the keys gathered so far and send them, grouped by backup; returns how many were sent."""
        if not self._pending and not self._released:
            return 0
        keys, self._pending = self._pending, []
        released, self._released = self._released, []
        nothing: frozenset[str] = frozenset()
        self.store.mark_fetched(keys + [key for key, _done in released])
        epoch, ring = self.ring_of()
        if ring is None:
            return 0  # no ring yet: the first rescan sends them
        by_backup: dict[str, list[bytes]] = defaultdict(list)
        holders = self._holders_under(ring)
        node, copies, zones = self.node_id, self.copies, self.zones_of()
        for key, done in [(key, nothing) for key in keys] + released:
            position = key[:8]
            backups = holders.get(position)
            if backups is None:
                # none in a cluster of one; not this node, if the host moved away meanwhile (its key travels with
                # the hand-off of the arc instead)
                if len(holders) >= HOLDERS_CACHE:
                    holders.clear()
                backups = holders[position] = tuple(
                    b for b in ring.holders_at(int.from_bytes(position, "big"), copies, zones) if b != node)
            for backup in backups:
                # not those the queued-URL replicas' release reached (`done`): it marks the key seen there
                if backup not in done:
                    by_backup[backup].append(key)
        sent = self._send(epoch, by_backup, backups=True)
        self.keys_sent += sent
        return sent

    def _holders_under(self, ring: Any) -> dict[bytes, tuple[str, ...]]:
        """The remembered backups of host positions under `ring` (a new ring, or new zones, start over)."""
        zones = self.zones_of()
        if ring is not self._holders_ring or zones is not self._holders_zones:
            self._holders_ring, self._holders_zones, self._holders = ring, zones, {}
        return self._holders

    async def rescan(self, ring: Any) -> int:
        """The ring changed to `ring`: send again each recorded key whose backup changed since the last scan
        (every key after a start), forget those of arcs no longer owned here; returns how many were sent."""
        old, old_zones = self._synced, self._synced_zones
        node, zones = self.node_id, self.zones_of()
        resend: dict[str, list[bytes]] = defaultdict(list)
        forget: list[bytes] = []
        for n, key in enumerate(self.store.fetched_keys(), start=1):
            position = int.from_bytes(key[:8], "big")
            if ring.owner_at(position) != node:
                forget.append(key)
                continue
            had = old.holders_at(position, self.copies, old_zones) if old is not None else ()
            for backup in ring.holders_at(position, self.copies, zones):
                if backup not in had:
                    resend[backup].append(key)
            if n % 4096 == 0:
                await trio.sleep(0)
        self.store.forget_fetched(forget)
        epoch, _ring = self.ring_of()
        sent = self._send(epoch, resend, backups=True)
        self.keys_resent += sent
        self._synced, self._synced_zones = ring, zones
        self.rescans += 1
        if sent or forget:
            log.info("replicas moved with the ring", extra={"keys_sent": sent, "keys_forgotten": len(forget)})
        return sent

    def _send(self, epoch: int, by_backup: dict[str, list[bytes]], *, backups: bool = False) -> int:
        """Send each peer its keys; `backups`: the peers are their positions' backups, and the keys go the
        reliable way if there is one."""
        sent = 0
        if backups and self.reliable is not None:
            rest = {}
            for backup, group in by_backup.items():
                if self.reliable(backup, group):
                    sent += len(group)
                else:
                    rest[backup] = group
            by_backup = rest
        for backup, group in by_backup.items():
            for i in range(0, len(group), self.max_keys):
                part = tuple(group[i : i + self.max_keys])
                if self.links.send_nowait(backup, SeenReplica(epoch=epoch, keys=part)):
                    sent += len(part)
                else:
                    self.keys_dropped += len(part)
        return sent

    def on_message(self, peer_id: str, message: Message) -> bool:
        """Store a peer's `SeenReplica`; False for any other message."""
        if not isinstance(message, SeenReplica):
            return False
        if message.hosts:
            _epoch, ring = self.ring_of()
            if ring is not None:
                mine = [state for state in message.hosts if ring.owner(state.host) == self.node_id]
                if mine:
                    self.apply_states(mine)
                self._keep_states([state for state in message.hosts if ring.owner(state.host) != self.node_id])
        keys = [key for key in message.keys if len(key) == KEY_SIZE]
        if len(keys) < len(message.keys):
            self.keys_refused += len(message.keys) - len(keys)
            log.warning("replica keys of the wrong size dropped", extra={"peer": peer_id})
        if keys:
            self.store.dedup.insert(keys)
            self.keys_received += len(keys)
            self.on_marked(keys)
        return True

    def status(self) -> dict[str, Any]:
        _epoch, ring = self.ring_of()
        # synced: the keys recorded so far went to the backups of the current ring (new pages go every tick)
        return {"synced": ring is not None and ring is self._synced,"keys_sent": self.keys_sent, "keys_resent": self.keys_resent, "keys_received": self.keys_received,
                "keys_dropped": self.keys_dropped, "keys_refused": self.keys_refused,
                "keys_passed_on": self.keys_passed_on, "keys_foreign": len(self._foreign),
                "states_passed_on": self.states_passed_on, "states_foreign": len(self._states),
                "keys_pending": len(self._pending) + len(self._released), "rescans": self.rescans}
