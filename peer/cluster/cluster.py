"""The cluster side of one node: membership, the ring of each view, URL dispatch, arc hand-off, progress reports,
cluster-wide termination, and graceful leave.

`Cluster` composes the layers of docs/cluster.md around one node's store and crawler:

- every view change gives a ring (built in a worker thread, cached by its members and weights); the crawler asks
  `owns(host)` (the ring's owner is this node) and `blocked(host)` (the host's arc waits for its hand-off);
- links to hosts owned elsewhere go to `dispatcher.route`, and the crawler stores them with the page that found
  them (`take_routed`);
- a view change starts the hand-off of the arcs this node lost and notes those it gained;
- the seen keys of the pages it fetches go to each arc's backup (`peer/cluster/replicas.py`), so a death repeats little;
- every second the ring's first member (by node id) gathers every member's progress over a tree of the ring's
  members (`peer/cluster/progress.py`: a bounded number of messages per node, whatever the cluster's size); two
  waves in which every member is idle with unchanged activity on the same ring mean the crawl is finished
  everywhere (the four-counter method: an idle node has nothing queued, nothing being fetched, and every batch
  and chunk it sent acknowledged), and the next wave tells every member so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import trio

from protocol import (
    Message, ProgressQuery, ProgressReport, ProgressTally, ProgressWave, Settings, StatusQuery, StatusReport,
)
from ring import (DEFAULT_POINTS_PER_WEIGHT, MemberState, Moves, Ring, View, Zones, diff_moves, host_position,
                  wire_moves)
from storage import HostState, NodeStore, QueuedUrl, in_arc

from peer.config import Config
from peer.crawl.crawler import Crawler
from peer.cluster.backups import QueueReplicas
from peer.crawl.settings import CrawlSettings, SettingsError
from peer.crawl.syncs import StoreSyncs
from peer.cluster.dispatch import DispatchConfig, Dispatcher
from peer.cluster.fence import TAKEOVER_GRACE, PartitionFence
from peer.cluster.handoff import ArcSet, Handoff, HandoffConfig, Hold, plan_view
from peer.cluster.membership import Membership, MembershipConfig
from peer.cluster.peerlinks import LinkConfig
from peer.cluster.progress import Local, ProgressTree
from peer.cluster.lanes import LEASE, FleetLanes
from peer.cluster.replicas import REPLICA_COPIES, SeenReplicas
from peer.cluster.rings import RingCache
from peer.cluster.report import ring_pending, ring_slices, status_dict, status_report
from peer.cluster.transport import TcpTransport, TlsFiles, Transport

__all__ = ["Cluster", "ClusterError"]

log = logging.getLogger(__name__)

#: Progress waves: the ring's first member starts one this often (peer/cluster/progress.py).
PROGRESS_INTERVAL = 1.0
#: How often a node looks for queued hosts it no longer owns (state that arrived late or from an older view).
SWEEP_INTERVAL = 5.0
#: After a join, how long to wait for the ring of the joined view (a build takes about 0.1 s per million points;
#: a view change derives the next ring from the current one in a few tens of milliseconds).
JOIN_RING_TIMEOUT = 30.0
#: A node seen LEAVING this long and no longer connected has left: its arcs are not waited for any more. Its
#: links stay up while it hands off, so this only needs to cover a link that is not up yet.
LEFT_GRACE = 2.0
#: A node that joined (or restarted) less than this many suspicion timeouts ago takes the arcs it gains at a view
#: change as coming from the owners of the ring without it: its first views may have been partial.
FRESH_WINDOW = 2.0
#: After concluding the crawl is finished, a node keeps answering until the members it answers for (its range of
#: the progress tree) have concluded too.
LINGER_TIMEOUT = 5.0
#: A look at the cluster asks the peers for their detailed status (the dashboard's) at most this often.
STATUS_INTERVAL = 0.5
#: A peer's detailed status older than this is not shown.
DETAIL_MAX_AGE = 10.0
#: The dashboard's picture folds the ring into this many slices.
RING_SLICES = 360
#: The crawl settings go to every live peer at each change, to a member that joins, and again this often to
#: `SETTINGS_FANOUT` live peers picked at random (links deliver at most once per connection: the repeat is what
#: makes a lost record harmless). As gossip, a record reaches every member in about log4(n) intervals, and a
#: node sends three small messages per interval whatever the cluster's size.
SETTINGS_INTERVAL = 5.0
SETTINGS_FANOUT = 3

_OWNING = (MemberState.ALIVE, MemberState.SUSPECT)


class _Owners:
    """A ring's owner look-up with a bounded memory of hosts already looked up: the crawler asks for every link
    it screens, and a crawl's links name the same hosts over and over."""

    __slots__ = ("ring", "_cache")

    #: Hosts remembered per ring (about 150 bytes each); past it the memory starts over.
    SIZE = 200_000

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self._cache: dict[str, str] = {}

    @property
    def nodes(self) -> tuple[str, ...]:
        """The ring's node ids (the dispatcher sizes its batching wait by them)."""
        return self.ring.nodes

    def owner(self, host: str) -> str:
        try:
            return self._cache[host]
        except KeyError:
            owner = self.ring.owner(host)
            if len(self._cache) >= self.SIZE:
                self._cache.clear()
            self._cache[host] = owner
            return owner


class Cluster:
    """One node's membership in the cluster. Build it, `attach` the crawler, then `await nursery.start(run)`."""

    def __init__(
        self,
        cfg: Config,
        *,
        node_id: str,
        store: NodeStore,
        secret: bytes,
        stats: Any,
        transport: Transport | None = None,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] = time.time,
        points_per_weight: int = DEFAULT_POINTS_PER_WEIGHT,
        rings: RingCache | None = None,
        members: View | None = None,
        syncs: StoreSyncs | None = None,
    ) -> None:
        self.cfg = cfg
        self.points_per_weight = points_per_weight  # fewer in simulations: a ring of many points takes a second
        self.node_id = node_id
        self.store = store
        self.stats = stats
        # the node's one sync service (peer/crawl/syncs.py): the receiver's acks wait for its next sync; run by
        # whoever made it (the node), or by `run` when the cluster is built alone (simulations)
        self._own_syncs = syncs is None
        self.syncs = syncs if syncs is not None else StoreSyncs(store, period=cfg.sync_interval)
        codecs = (cfg.codec, "json" if cfg.codec == "msgpack" else "msgpack")
        compressions = (cfg.compression, *(c for c in ("br", "zlib", "none") if c != cfg.compression))
        self.membership = Membership(
            node_id=node_id,
            weight=cfg.weight,
            zone=cfg.resolved_zone(),
            secret=secret,
            transport=transport or TcpTransport(
                cfg.listen, advertise=cfg.advertise or None,
                tls=TlsFiles(cert=cfg.tls_cert, key=cfg.tls_key, ca=cfg.tls_ca) if cfg.tls_cert else None),
            rng=rng or random.Random(),
            config=MembershipConfig(probe_interval=cfg.probe_interval, probe_timeout=cfg.probe_timeout,
                                    suspicion_timeout=cfg.suspicion_timeout),
            link_config=LinkConfig(idle_timeout=cfg.link_idle_timeout, max_links=cfg.max_links,
                                   datagrams=cfg.peer_datagrams),
            on_message=self._on_message,
            link_busy=self.link_busy,
            codecs=codecs,
            compressions=compressions,
            members=members,
        )
        self.links = self.membership.links
        self.view = View()
        self.epoch = 0
        self.ring: Ring | None = None
        self._owners: _Owners | None = None
        self._ring_id = 0
        self._order: tuple[str, ...] = ()  # the ring's members sorted by node id: the progress tree's numbering
        # the rings of recent views and their moved arcs; nodes in one process may share one cache (rings.py)
        self._rings = rings if rings is not None else RingCache()
        # the failure zones of the ring's nodes: replicas keep a copy outside the owner's zone (ring/_zones.py)
        self.zones = Zones()
        # every queued URL also on the ring backups of its position (--replicas R), promoted when its owner dies
        self.backups = QueueReplicas(node_id, store, self.links, ring_of=lambda: (self.epoch, self.ring),
                                     copies=cfg.replicas, wall_clock=wall_clock, zones_of=lambda: self.zones,
                                     seen_copies=REPLICA_COPIES)  # a release marks a page seen where its key goes
        self.wall_clock = wall_clock
        self.dispatcher = Dispatcher(
            node_id, store, self.links, ring_of=self.ring_of,
            config=DispatchConfig(batch_size=cfg.batch_size, interval=cfg.dispatch_interval),
            on_admitted=self._admitted, backups=self.backups, syncs=self.syncs,
        )
        self.replicas = SeenReplicas(node_id, store, self.links, ring_of=lambda: (self.epoch, self.ring),
                                     apply_states=self._merge_states, wall_clock=wall_clock,
                                     zones_of=lambda: self.zones,
                                     reliable=self.backups.mark_seen if cfg.replicas else None)
        # a released page's seen key: its release marks it seen at the backups it went to, so the seen-key
        # replicas send it only to the others
        self.backups.on_released = lambda item, key, done: self.replicas.fetched(item, key, released=done)
        # the hand-off asks the cluster (its delegate) what is busy, who owns what, and where keys go
        self.handoff = Handoff(node_id, store, self.links, config=HandoffConfig(wait=cfg.handoff_wait),
                               wall_clock=wall_clock, delegate=self)
        # seen marks that peers' replicas leave here stay through the drop of an arc being handed over: this node
        # is often the backup of the arc's new owner, and its heir
        self.backups.on_marked = self.replicas.on_marked = self.handoff.marked_seen
        # replicas this node no longer backs go to their owners before they are dropped, not only dropped
        self.backups.pass_on = self.dispatcher.pass_on
        # the URLs a peer's queued-URL replicas bring are queued at their owner: the crawler does not route them
        self.backups.on_held = self._held_from
        # per-address limits held fleet-wide: this node owns the addresses the ring gives it and lends their
        # lanes (peer/cluster/lanes.py); the crawler borrows through it
        self._lanes_file = Path(cfg.data_dir) / LANES_FILE
        self._lanes_written = -math.inf
        self.lanes = (
            FleetLanes(node_id, cfg.ip_connections, cfg.ip_delay, lease=LEASE, max_request=cfg.total_timeout,
                       delegate=self, start_wait=_lent_until(self._lanes_file, wall_clock()))
            if cfg.ip_connections > 0 else None
        )
        self._wall_clock = wall_clock
        self.crawler: Crawler | None = None
        # URLs of peers' replicas the crawler learnt are queued at their owner, so not routed there (`_held_from`)
        self.urls_known_elsewhere = 0
        self.address: str | None = None
        self.finished = trio.Event()  # the whole cluster's crawl is finished (set once)
        self.ready = trio.Event()  # joined (or started a new cluster) and seeded: progress waves may begin
        self._ready_at: float | None = None  # when `ready` was set (see `_fresh`)
        self.leaving = False
        self.view_changes = 0
        self.hosts_swept = 0
        self.peers: dict[str, ProgressReport] = {}  # the latest report of each peer (asked while someone looks)
        self._seq = 0
        self.progress = ProgressTree(node_id, members=lambda: (self._ring_id, self._order),
                                     local=self._wave_local, send=self._send_to, concluded=self._conclude,
                                     suspect=self._suspect)
        self._leaving_since: dict[str, float] = {}  # peer -> when this node first saw it LEAVING
        # (when, dead node, URLs promoted): each arc inherited from a dead node, promoted from its replicas
        self.promotions: list[tuple[float, str, int]] = []
        self._routed_to: set[str] = set()  # owners of the links routed by the page being committed
        self._queued_ticket = None  # the replicas of the links it queued here
        self.fence = PartitionFence(node_id, view=lambda: self.view, last_heard=self.membership.last_heard,
                                    suspicion_timeout=cfg.suspicion_timeout, probe_interval=cfg.probe_interval,
                                    majority_heard=lambda: self.progress.contact_at)
        # The dashboard: this node's detailed status (set by the node), its peers' latest, and until when to ask.
        self.summary: Callable[[], dict[str, Any]] | None = None
        self.details: dict[str, tuple[float, dict[str, Any]]] = {}  # peer -> (trio time received, status)
        self._asked_at = float("-inf")  # when peers were last asked for their detailed status
        self._slices: tuple[int, list[dict[str, float]]] | None = None  # (ring id, the ring folded)
        self.settings_sent = 0
        self.settings_adopted = 0
        self.settings_refused = 0
        self._gossip_rng = random.Random(f"{node_id}:settings")  # whom the settings are repeated to

    def link_busy(self, peer_id: str) -> bool:
        """Whether the link to `peer_id` must not be closed for idleness: URL batches to it wait for their ack,
        or gained arcs wait for its hand-off. (An outgoing hand-off re-sends its chunks every few seconds, and a
        queued message always keeps its link.)"""
        return self.dispatcher.in_flight_to(peer_id) > 0 or self.handoff.waits_for(peer_id)

    # -- the crawler's Ownership (peer/crawl/seams.py) -------------------------------------------------------

    solo = False  # a fleet: links for hosts owned elsewhere are routed, and the cluster decides when it ends

    def attach(self, crawler: Crawler) -> None:
        """The crawler this cluster wakes when work arrives (built with `ownership=cluster`)."""
        self.crawler = crawler
        self.dispatcher.answered = crawler.answered

    def route(self, item: QueuedUrl) -> None:
        self.dispatcher.route(item)

    def take_routed(self) -> list[tuple[str, QueuedUrl]]:
        routed = self.dispatcher.take_routed()
        # the owners of the links the page being committed routed: its replicas wait for their acks
        self._routed_to = {owner for owner, _item in routed}
        return routed

    def queued(self, items) -> None:
        # the links a page being committed queued here: its replicas' release waits for theirs
        self._queued_ticket = self.backups.replicate(items)

    def fetched(self, item: QueuedUrl) -> None:
        routed_to, self._routed_to = self._routed_to, set()
        links, self._queued_ticket = self._queued_ticket, None
        if self.backups.copies:
            # its seen key goes to the seen-key replicas with its release (`backups.on_released`): once the links
            # its page found are safe elsewhere, as a backup that held the page seen would never fetch it again
            self.backups.released(item, routed_to, links)
        else:
            self.replicas.fetched(item)

    def _held_from(self, peer_id: str, epoch: int, items: Sequence[QueuedUrl]) -> None:
        """A replica message from `peer_id` was held here: the URLs of hosts it owns under this node's ring, sent
        under this node's view, are durably queued there (a node replicates what it queued, after its commit;
        a commit lost in a crash is redone from its source, which is lost with it). The crawler drops links to
        them like routed repeats (`Crawler.known_elsewhere`) until the ring changes: in a cluster of two, most
        links to the other node's hosts name pages that node found first on the host itself."""
        crawler, owners = self.crawler, self._owners
        if crawler is None or owners is None or epoch != self.epoch:
            return
        owner = owners.owner
        urls = [item.url for item in items if owner(item.host) == peer_id]
        if urls:
            self.urls_known_elsewhere += crawler.known_elsewhere(urls)

    def ring_of(self) -> tuple[int, Any]:
        """The view epoch and the current ring's owner look-up (what the dispatcher needs of a ring)."""
        assert self._owners is not None, "Cluster.run() builds the first ring"
        return self.epoch, self._owners

    def _set_ring(self, ring: Ring) -> None:
        self.ring = ring
        zones, self.zones = self.zones, self.view.zones()  # the view's members that own arcs: the ring's nodes
        one_zone = (self.cfg.replicas > 0 and len(ring.nodes) > 1
                    and self.zones.alone(self.node_id, len(ring.nodes)))
        if one_zone and not (zones and zones.alone(self.node_id, len(zones))):
            log.info("every node of the ring is in this node's zone: a queued URL survives a node's death, not the "
                     "zone's", extra={"zone": self.zones.zone(self.node_id), "nodes": len(ring.nodes)})
        self._owners = _Owners(ring)
        before, self._ring_id = self._ring_id, ring_id(ring)
        self._order = tuple(sorted(ring.nodes))
        if self.crawler is not None and self._ring_id != before:
            # the crawler trusts its memory of answered and routed URLs without asking `owns` again: a new ring
            # may move their hosts (a URL routed to a node that has died must go to its new owner when found).
            # A view change that keeps the ring (a suspicion, a new incarnation) keeps every owner: no call.
            self.crawler.forget_seen()
        if self.lanes is not None:
            self.lanes.ring_changed(self._owners.owner, self.epoch)

    # -- the lanes' delegate (peer/cluster/lanes.py: LanesDelegate) ----------------------------------------

    def send_lanes(self, peer_id: str, message: Message) -> bool:
        return self.links.send_nowait(peer_id, message)

    def address_ready(self, address: str) -> None:
        if self.crawler is not None:
            self.crawler.address_ready(address)

    def successor_of(self, host: str) -> str | None:
        """The node that owns `host` (an address is a key like a host) in the ring without this node."""
        if self.ring is None:
            return None
        position = host_position(host)
        if self.ring.owner_at(position) != self.node_id:
            return self.ring.owner_at(position)
        return self.ring.backup_at(position)

    async def _lanes_loop(self) -> None:
        assert self.lanes is not None
        while True:
            await trio.sleep(0.1)
            members = {m.node_id for m in self.view.members if m.state in _OWNING} | {self.node_id}
            self.lanes.tick(members)
            # Until when lanes lent to other nodes may be in use, on disk (as wall time), so that a restart waits
            # out only what this run lent: written when it moves on by a second or more.
            until = self.lanes.lent_until
            if until > self._lanes_written + 1.0:
                wall = self._wall_clock() + (until - trio.current_time())
                try:
                    self._lanes_file.write_text(f"{wall:.3f}\n")
                    self._lanes_written = until
                except OSError as exc:
                    log.warning("cannot record the lanes lent (a restart waits the whole lease time instead)",
                                extra={"path": str(self._lanes_file), "error": str(exc)})

    def owns(self, host: str) -> bool:
        """Whether this node owns `host` under its current view (links to it are queued here, not routed)."""
        owners = self._owners
        return owners is not None and owners.owner(host) == self.node_id

    # -- the hand-off's delegate (peer/cluster/handoffconfig.py: HandoffDelegate) --------------------------

    def owner_of(self, host: str) -> str:
        assert self._owners is not None
        return self._owners.owner(host)

    def keys_arrived(self, keys: list[bytes]) -> None:
        self.replicas.adopt(keys)

    def unpark(self, start: int, end: int) -> None:
        if self.crawler is not None:
            self.crawler.unpark(lambda host: in_arc(host_position(host), start, end))

    def discarded(self, items: list[QueuedUrl]) -> None:
        for item in items:
            self.backups.released(item)

    def foreign_states(self, states) -> None:
        self.replicas.pass_states(states)

    def blocked(self, host: str) -> bool:
        """Whether `host` may not be fetched yet: it lies in a gained arc whose hand-off has not arrived, or in
        one inherited from a dead member that may still be fetching on the other side of a partition, or this
        node is on the minority side of a partition (`fenced`)."""
        if self.fence.fenced():
            return True
        holding, waiting = self.fence.holding(), self.handoff.waiting()
        if not (holding or waiting):
            return False  # the common case: no hash of the host per turn
        position = host_position(host)
        return (holding and self.fence.held(position)) or (waiting and self.handoff.blocked(position))

    def busy_positions(self) -> list[int]:
        return [host_position(host) for host in self.crawler.busy_hosts()] if self.crawler else []

    def held_keys(self) -> set[bytes]:
        return self.backups.held_keys()

    def _admitted(self, new: list[QueuedUrl]) -> None:
        if self.crawler is not None:
            self.crawler.wake_hosts(new)

    def _merge_states(self, wire_states) -> None:
        """Politeness states a peer passed on for hosts owned here: merged as a hand-off's are."""
        states = [self.handoff.merge_state(wire) for wire in wire_states]
        self.store.frontier.put_states(states)
        if self.crawler is not None:
            self.crawler.take_over([], states)

    def applied(self, new: list[QueuedUrl], states: list[HostState]) -> Hold | None:
        ticket = self.backups.replicate(new)
        if self.crawler is not None:
            self.crawler.take_over(new, states)
        if ticket is None or self.backups.done(ticket):
            return None
        return lambda callback: self.backups.then(ticket, callback)

    # -- lifetime -----------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve peers, follow view changes, dispatch, hand off and report progress until cancelled; reports
        the address peers dial."""
        async with trio.open_nursery() as nursery:
            watch = self.membership.watch()
            self.address = await nursery.start(self.membership.run)
            self.view = self.membership.view
            self.epoch = self.view.epoch
            self._set_ring(await self._ring(self.view))
            if self._own_syncs:
                await nursery.start(self.syncs.run)
            await nursery.start(self.dispatcher.run)
            await nursery.start(self.handoff.run)
            await nursery.start(self.replicas.run)
            await nursery.start(self.backups.run)
            await nursery.start(self.progress.serve)
            nursery.start_soon(self._note_ready)
            nursery.start_soon(self._follow_views, watch)
            nursery.start_soon(self._progress_loop)
            nursery.start_soon(self._sweep_loop)
            nursery.start_soon(self.fence.contact_loop)
            if self.lanes is not None:
                nursery.start_soon(self._lanes_loop)
            nursery.start_soon(self._settings_loop)
            log.info("cluster member listening", extra={"node_id": self.node_id, "address": self.address})
            task_status.started(self.address)

    async def join(self, seeds: Iterable[str]) -> str:
        """Join through the first seed that answers (each tried with the links' retries); the seed used."""
        if self.lanes is not None:
            self.lanes.joining()
        problems = []
        for seed in seeds:
            if seed == self.address:
                continue
            try:
                joined = await self.membership.join(seed)
            except Exception as exc:  # LinkError or a transport error: try the next seed
                problems.append(str(exc))
                continue
            # Return once our ring is that of the joined view, so what is seeded next goes to its owners.
            with trio.move_on_after(JOIN_RING_TIMEOUT):
                while self.epoch < joined.epoch:
                    await trio.sleep(0.02)
            log.info("joined the cluster", extra={"seed": seed, "members": len(self.view.members)})
            return seed
        raise ClusterError("; ".join(problems) or "no seed to join through")

    async def leave(self, timeout: float) -> bool:
        """Leave gracefully: say so (the others take over our arcs), hand everything off, then close the links.
        True if everything was handed off and acknowledged within `timeout`."""
        self.leaving = True
        others = [m for m in self.view.members if m.node_id != self.node_id and m.state in _OWNING]
        if not others:
            log.info("leaving: no other member to hand off to")
            return True
        await self.membership.leave(close_links=False)
        with trio.move_on_after(timeout):
            while True:
                if (self.ring is not None and self.node_id not in self.ring.weights and self._settled()):
                    break
                await trio.sleep(0.1)
        handed = self._settled()
        if handed:
            log.info("leave: everything handed off")
        else:
            log.warning("leave: not everything was handed off in time; it stays in this node's store",
                        extra={"outbox": self.dispatcher.outstanding(), "chunks": self.handoff.outstanding(),
                               "queued": len(self.store.frontier)})
        await self.links.close_all("leaving")
        return handed

    def _settled(self) -> bool:
        crawler = self.crawler
        return (
            self.dispatcher.outstanding() == 0
            and self.handoff.outstanding() == 0
            and len(self.store.frontier) == 0
            and (crawler is None or crawler.active == 0)
        )

    # -- views --------------------------------------------------------------------------------------------

    async def _ring(self, view: View) -> Ring:
        weights = view.owner_weights()
        if not weights:  # nobody owns arcs (the last member is leaving): keep the ring we had
            assert self.ring is not None
            return self.ring
        return await self._ring_of(weights, self.ring)

    async def _ring_of(self, weights: dict[str, int], base: Ring | None) -> Ring:
        ppw = self.points_per_weight
        ring = self._rings.ring(weights, ppw)
        if ring is None:
            if base is not None and base.points_per_weight == ppw:
                # only the points of the members that joined, left or changed weight are inserted or removed
                ring = await trio.to_thread.run_sync(lambda: base.with_weights(weights))
            else:
                ring = await trio.to_thread.run_sync(lambda: Ring(weights, points_per_weight=ppw))
            ring = self._rings.put(ring)
        return ring

    async def _moves(self, old: Ring, new: Ring) -> Moves:
        """The moved arcs from `old` to `new` in the hand-off's form (computed in a worker thread, once per
        cache)."""
        moves = self._rings.moves(old, new)
        if moves is None:
            moves = await trio.to_thread.run_sync(lambda: wire_moves(diff_moves(old, new)))
            moves = self._rings.put_moves(old, new, moves)
        return moves

    async def _follow_views(self, watch) -> None:
        while True:
            view = await watch.next()
            await self._view_changed(view)

    def _fresh(self) -> bool:
        """Still joining, or joined less than FRESH_WINDOW suspicion timeouts ago: the views this node merges may
        still be partial (a restarted node's first view can lack members the cluster has)."""
        if not self.ready.is_set() or self._ready_at is None:
            return True
        return trio.current_time() - self._ready_at < FRESH_WINDOW * self.cfg.suspicion_timeout

    def _taken_over(self) -> bool:
        """This node refuted a record of itself DEAD less than FRESH_WINDOW suspicion timeouts ago: members that
        held it dead (the other side of a partition longer than the suspicion timeout) took its arcs over and
        crawled them, and hand them back as their views take it in again."""
        return trio.current_time() - self.membership.declared_dead_at < FRESH_WINDOW * self.cfg.suspicion_timeout

    async def _note_ready(self) -> None:
        await self.ready.wait()
        self._ready_at = trio.current_time()

    async def _view_changed(self, view: View) -> None:
        old_view, old_ring = self.view, self.ring
        assert old_ring is not None
        new_ring = await self._ring(view)
        alone_before = not any(
            m.state in _OWNING for m in old_view.members if m.node_id != self.node_id
        )
        gain_arcs: Moves | None = None
        extra_gains: list[Moves] = []
        if new_ring == old_ring:
            arcs = Moves.empty(wire=True)
        else:
            # the moved arcs as arrays (a join at 1,000 points per weight moves one arc per point of the joiner)
            arcs = await self._moves(old_ring, new_ring)
            replace = alone_before or not self.ready.is_set()
            taken_over = self._taken_over()
            if (replace or self._fresh() or taken_over) and new_ring.nodes != (self.node_id,):
                # Our own previous ring had only us, or we are still joining (a partial view merged first): the
                # arcs we gain come from the owners in the cluster's ring without us. Joined (or back from a
                # restart) only a moment ago, we wait for those owners too, besides the previous owners in our own
                # previous ring: that ring may have been built from a partial view (a restarted node merges its
                # last view or the seed's first), which gave us an arc "from" a node that never had it, so the next
                # ring shows the arc as ours in both. We ask each owner we wait for (`HandoffAsk`), which answers with
                # a transfer (empty at least) once it has adopted our ring, so waiting for one that holds nothing
                # costs the ask's delay and a round trip.
                without = {n: w for n, w in new_ring.weights.items() if n != self.node_id}
                if without and self.node_id in new_ring.weights:
                    before = await self._ring_of(without, new_ring)
                    moved = await self._moves(before, new_ring)
                else:
                    moved = Moves.empty(wire=True)
                if replace:
                    gain_arcs = moved
                else:
                    extra_gains.append(moved)
            if taken_over and not replace and self.node_id in new_ring.weights and new_ring.nodes != (self.node_id,):
                # Declared dead a moment ago (a partition longer than the suspicion timeout): our own rings may
                # show our arcs as ours all along, while the other side crawled them under a ring of its own,
                # without us and without whoever was on our side. Its members come back to our view as they
                # refute our record of them: our arcs came from the owners in the ring of the members that
                # were not ours before this change, as well as from those of the ring without us (above). We
                # wait for their hand-offs, which carry the timers of their last requests (the partition
                # simulation, seed 42: the hold after the heal ran out 1.5 s after the heir's last request to
                # a host with a 2 s Crawl-delay, and this node fetched it).
                before_members = {m.node_id for m in old_view.members if m.state in _OWNING}
                back = {n: w for n, w in new_ring.weights.items() if n not in before_members and n != self.node_id}
                if back:
                    extra_gains.append(await self._moves(await self._ring_of(back, new_ring), new_ring))
        gone = {m.node_id for m in view.members if m.state is MemberState.DEAD}
        plan = None
        extra_gains = [moves for moves in extra_gains if moves]
        if arcs or gain_arcs or extra_gains:
            # who gets which arcs, worked out in the worker thread too (a joiner loses millions of arcs at once)
            node_id = self.node_id
            plan = await trio.to_thread.run_sync(lambda: plan_view(node_id, old_ring, new_ring, gone=gone, arcs=arcs,
                                                                   gain_arcs=gain_arcs,
                                                                   extra_gains=extra_gains or None))
        # No await from here on: the ring, the hand-off and the crawler change together.
        self.view, self.epoch = view, view.epoch
        self._set_ring(new_ring)
        # Fetched-page keys held for arcs owned elsewhere go to their owners now, ahead of the transfers below
        # on the same links: a receiver released by a transfer must not fetch those pages again.
        self.replicas.ring_changed(new_ring, view.epoch)
        self.backups.ring_changed(new_ring)
        self.view_changes += 1
        if self.crawler is not None:
            self.crawler.release_moved()  # parked URLs of moved hosts go back to the queue, into the hand-off
        for node in gone:
            self.handoff.abandon(node)
        for m in view.members:
            if m.node_id != self.node_id and m.state not in _OWNING and self.handoff.cancel_to(m.node_id):
                log.info("hand-off to a departed node stopped; its content goes to the current owners",
                         extra={"peer": m.node_id, "state": m.state.value})
        if plan is not None:
            lost = self.handoff.view_changed(ring_id(new_ring), old_ring, new_ring, gone=gone, plan=plan)
            log.info("ring changed", extra={
                "epoch": view.epoch, "members": ",".join(f"{n}={w}" for n, w in sorted(new_ring.weights.items())),
                "arcs_moved": len(arcs), "arcs_lost": len(lost),
                "arcs_pending": self.handoff.pending_count()})
            if plan.inherited:
                self._promote(plan.inherited)
        if self.crawler is not None:
            self.crawler.rewake()
        self.dispatcher.wake()
        # a member that joined gets the crawl settings at once (the others have them: they are not sent again)
        before = {m.node_id for m in old_view.members if m.state in _OWNING}
        joined = [peer for peer in self._live_peers() if peer not in before]
        if joined:
            self.share_settings(joined)

    # -- crawl settings -----------------------------------------------------------------------------------

    def share_settings(self, peers: Iterable[str] | None = None) -> int:
        """Send the crawl settings in force to `peers` (every live peer by default); the number sent."""
        if self.crawler is None:
            return 0
        current = self.crawler.settings
        message = Settings(version=current.version, origin=current.origin, body=current.body())
        sent = 0
        for peer in (self._live_peers() if peers is None else peers):
            member = self.view.member(peer)
            sent += bool(self.links.send_nowait(peer, message, address=member.address if member else None))
        self.settings_sent += sent
        return sent

    async def _settings_loop(self) -> None:
        while True:
            await trio.sleep(SETTINGS_INTERVAL)
            peers = self._live_peers()
            self.share_settings(self._gossip_rng.sample(peers, min(SETTINGS_FANOUT, len(peers))))

    def _settings_arrived(self, peer_id: str, message: Settings) -> None:
        if self.crawler is None:
            return
        try:
            settings = CrawlSettings.from_record(message.version, message.origin, message.body)
        except SettingsError as exc:
            self.settings_refused += 1
            log.warning("a peer sent crawl settings this node cannot use; ignored",
                        extra={"peer": peer_id, "error": str(exc)})
            return
        if self.crawler.adopt(settings):
            self.settings_adopted += 1
        elif settings.rank() < self.crawler.settings.rank():
            self.share_settings([peer_id])  # the sender is behind: it gets ours now, not at the next round

    def _promote(self, inherited: dict[str, ArcSet]) -> int:
        """Arcs this node inherits from dead members (per dead node, from `plan_view`): their queued URLs come out
        of the replicas held here into the frontier, with the dead owner's last known host states (merged with
        ours: the later ready time and the longer Crawl-delay win), and the crawler takes those hosts over with
        those timers."""
        if not inherited:
            return 0
        by_arc = inherited
        every = ArcSet.union(inherited.values())
        promoted, states = self.store.promote(lambda position: position in every)
        by_node: dict[str, int] = {node: 0 for node in inherited}
        for item in promoted:
            position = host_position(item.host)
            for node, arc_set in by_arc.items():
                if position in arc_set:
                    by_node[node] += 1
                    break
        now = trio.current_time()
        hold_end = max(self.fence.inherit(node, by_arc[node]) for node in inherited)
        # Were the dead node alive behind a partition, its last request may end as late as the hold: its hosts'
        # Crawl-delay then runs from the end of the hold, not from its last replicated state.
        fence_end = self.wall_clock() + (hold_end - now)
        # A host with no replicated state (its first pages' releases had not arrived) gets TAKEOVER_GRACE more:
        # its Crawl-delay is not known here until its robots.txt is fetched again.
        if math.isfinite(fence_end):
            states = [dataclasses.replace(st, next_allowed=max(st.next_allowed, fence_end + st.crawl_delay))
                      for st in states]
            known = {st.host for st in states}
            for host in sorted({item.host for item in promoted} - known):
                here = self.store.frontier.get_state(host)
                if here is None or here.next_allowed < fence_end + TAKEOVER_GRACE:
                    states.append(HostState(host=host, next_allowed=fence_end + TAKEOVER_GRACE,
                                            crawl_delay=here.crawl_delay if here else 0.0))
        if states:
            self.store.frontier.put_states(states)
        for node, count in by_node.items():
            self.promotions.append((now, node, count))
        del self.promotions[:-100]
        self.backups.urls_promoted += len(promoted)
        if self.crawler is not None and (promoted or states):
            self.crawler.take_over(promoted, states)
        log.info("queued URLs of a dead node promoted from its replicas",
                 extra={"urls": len(promoted), "hosts": len(states), "dead": ",".join(sorted(by_node))})
        return len(promoted)

    # -- stray state --------------------------------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        """Queued hosts this node does not own (a chunk that arrived after its arc moved on, a restart with an
        older view) go to their owners, so nothing waits forever where nobody fetches it."""
        while True:
            await trio.sleep(SWEEP_INTERVAL)
            self.sweep()

    def sweep(self) -> int:
        if self.ring is None or self.handoff.outstanding():
            return 0
        ring, owners = self.ring, self._owners
        assert owners is not None
        strays = [host for host, _ in self.store.frontier.hosts() if owners.owner(host) != self.node_id]
        if not strays:
            return 0
        n = self.handoff.sweep(ring_id(ring), owners.owner, strays)
        self.hosts_swept += n
        log.info("handing queued hosts to their owners", extra={"hosts": n})
        return n

    # -- progress and termination -------------------------------------------------------------------------

    def local_progress(self, seq: int = 0) -> ProgressReport:
        """This node's progress as the report it sends (``seq`` answers a query; 0 when unasked or kept here)."""
        crawler = self.crawler
        d, h = self.dispatcher.stats, self.handoff
        idle = (
            crawler is not None
            and crawler.is_done()
            and self.dispatcher.outstanding() == 0
            and h.outstanding() == 0
            and not h.waiting()
        )
        activity = self.stats.pages + self.stats.urls_new + d.urls_new + d.batches_received + h.chunks_applied
        return ProgressReport(
            seq=seq, ring=self._ring_id, idle=idle, finished=self.finished.is_set(),
            activity=activity, pages=self.stats.pages, queued=len(self.store.frontier),
            urls_received=sum(d.urls_received.values()) + h.urls_received, rate=max(0.0, self.stats.rate()),
        )

    def _live_peers(self) -> list[str]:
        return [m.node_id for m in self.view.members if m.node_id != self.node_id and m.state in _OWNING]

    def _send_to(self, peer: str, message: Message) -> bool:
        member = self.view.member(peer)
        return self.links.send_nowait(peer, message, address=member.address if member else None)

    async def _progress_loop(self) -> None:
        await self.ready.wait()  # a node that is still joining must not conclude anything from its lone view
        second = True
        while True:
            # the two trees' waves half an interval apart: each root starts one every interval
            await trio.sleep(PROGRESS_INTERVAL / 2)
            self.release_departed()
            second = not second
            if self.progress.is_root(second):
                self.progress.tick(second)

    def release_departed(self) -> list[str]:
        """Stop waiting for arcs from nodes that left: LEAVING for LEFT_GRACE and no longer connected (a leaving
        node keeps its links until it has handed everything off, then exits). It handed off under its own last
        ring; what we wait for under a ring it never adopted will not come, and without this the wait runs out
        only after `handoff_wait` (30 s), the arcs' hosts unfetched meanwhile. Returns the peers released."""
        now = trio.current_time()
        connected = set(self.links.connected_peers())
        released = []
        for member in self.view.members:
            peer = member.node_id
            if member.state is not MemberState.LEAVING or peer == self.node_id:
                self._leaving_since.pop(peer, None)
                continue
            since = self._leaving_since.setdefault(peer, now)
            if now - since >= LEFT_GRACE and peer not in connected and self.handoff.waits_for(peer):
                self.handoff.abandon(peer)
                released.append(peer)
                log.info("a node that left hands nothing more: its arcs are no longer waited for",
                         extra={"peer": peer})
        return released

    def _suspect(self, peer: str) -> bool:
        """Whether this node's view holds `peer` SUSPECT (the progress waves go around it)."""
        member = self.view.member(peer)
        return member is not None and member.state is MemberState.SUSPECT

    def _wave_local(self, finished: bool) -> Local:
        """This node's part of a wave's tally; a wave from a root that concluded makes an idle node conclude."""
        me = self.local_progress()
        if finished and me.idle and not self.finished.is_set():
            self._conclude("the ring's first member concluded it")
        return Local(idle=me.idle, activity=me.activity, finished=self.finished.is_set())

    def _conclude(self, why: str) -> None:
        log.info("crawl finished across the cluster", extra={"reason": why, "members": len(self._order)})
        self.finished.set()

    async def linger(self, timeout: float = LINGER_TIMEOUT) -> None:
        """After concluding, keep answering until every member this node answers for in the progress tree has
        concluded too (bounded): they learn it from the waves that pass through this node."""
        with trio.move_on_after(timeout):
            while not self.progress.range_concluded:
                await trio.sleep(0.2)

    async def _on_message(self, peer_id: str, message: Message) -> None:
        if isinstance(message, ProgressWave):
            self.progress.on_wave(peer_id, message)
        elif isinstance(message, ProgressTally):
            self.progress.on_tally(peer_id, message)
        elif isinstance(message, ProgressQuery):
            self.links.send_nowait(peer_id, self.local_progress(message.seq))
        elif isinstance(message, Settings):
            self._settings_arrived(peer_id, message)
        elif isinstance(message, ProgressReport):
            self.peers[peer_id] = message
        elif isinstance(message, StatusQuery):
            if self.summary is not None:
                self.links.send_nowait(peer_id, status_report(message.seq, self.summary()))
        elif isinstance(message, StatusReport):
            self.details[peer_id] = (trio.current_time(), status_dict(message))
        elif self.lanes is not None and self.lanes.on_message(peer_id, message):
            return
        elif self.backups.on_message(peer_id, message):
            return
        elif not self.replicas.on_message(peer_id, message):
            await self.dispatcher.on_message(peer_id, message)
            await self.handoff.on_message(peer_id, message)

    # -- status -------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        d, h = self.dispatcher.stats, self.handoff
        me = self.local_progress()
        return {
            "enabled": True,
            "address": self.address,
            "epoch": self.epoch,
            "members": [
                {"node_id": m.node_id, "address": m.address, "weight": m.weight, "state": m.state.value,
                 "incarnation": m.incarnation, "zone": m.zone}
                for m in self.view.members
            ],
            "peers_connected": self.links.connected_peers(),
            "dispatch": {
                "urls_routed": d.urls_routed, "urls_recent": d.urls_recent,
                "urls_sent": dict(d.urls_sent), "urls_resent": dict(d.urls_resent),
                "urls_acked": dict(d.urls_acked), "urls_received": dict(d.urls_received),
                "urls_new": d.urls_new, "urls_seen": d.urls_seen, "urls_forwarded": d.urls_forwarded,
                "urls_rerouted": d.urls_rerouted, "urls_known_elsewhere": self.urls_known_elsewhere,
                "batches_sent": d.batches_sent,
                "batches_resent": d.batches_resent, "batches_received": d.batches_received,
                "outstanding": self.dispatcher.outstanding(),
            },
            "handoff": {
                "outstanding": h.outstanding(), "pending_arcs": h.pending_count(),
                "urls_sent": h.urls_sent, "urls_received": h.urls_received, "keys_sent": h.keys_sent,
                "keys_withheld": h.keys_withheld, "withheld_expired": h.withheld_expired,
                "revisits_sent": h.revisits_sent, "revisits_received": h.revisits_received,
                "chunks_sent": h.chunks_sent, "chunks_resent": h.chunks_resent, "chunks_applied": h.chunks_applied,
                "transfers_completed": h.transfers_completed, "transfers_received": h.transfers_received,
                "waits_expired": h.waits_expired, "hosts_swept": self.hosts_swept,
            },
            "replica": self.replicas.status(),
            "backups": self.backups.status(),
            "fence": {"fenced": self.fence.fenced(), "fences": self.fence.fences},
            # inbound connections refused before or in the handshake, by reason (each logged at debug only),
            # connections closed because handling a peer's message raised, and the link bound at work: links
            # open now, closed for idleness, closed as the least recently used past max_links; and membership's
            # datagrams (probes and gossip without a link): whether on, sent, received, refused (not ours, forged)
            "links": {"refused_inbound": dict(self.links.refused), "handshake_failures": self.links.handshake_failures,
                      "handler_errors": self.links.handler_errors, "live": self.links.live,
                      "idle_closes": self.links.idle_closes, "evictions": self.links.evictions,
                      "datagrams": self.links.datagrams, "datagrams_sent": self.links.datagrams_sent,
                      "datagrams_received": self.links.datagrams_received,
                      "datagrams_refused": self.links.datagrams_refused},
            "lanes": self.lanes.status() if self.lanes is not None else None,
            "settings": {"sent": self.settings_sent, "adopted": self.settings_adopted,
                         "refused": self.settings_refused},
            "view_changes": self.view_changes,
            "leaving": self.leaving,
            "done": me.idle,
            # concluded, and still true: work that arrives later (a joiner's seeds) makes it false again
            "cluster_done": self.finished.is_set() and me.idle,
        }

    # -- the dashboard ------------------------------------------------------------------------------------

    def watched(self) -> None:
        """Someone looks at the cluster (the dashboard polls once a second): ask every live peer for its progress
        and its detailed status, at most every `STATUS_INTERVAL`; the answers show from the next look on. Nobody
        looking, nothing is sent."""
        now = trio.current_time()
        if now - self._asked_at < STATUS_INTERVAL:
            return
        self._asked_at = now
        for peer in self._live_peers():
            self._seq += 1
            member = self.view.member(peer)
            address = member.address if member else None
            self.links.send_nowait(peer, ProgressQuery(seq=self._seq), address=address)
            self.links.send_nowait(peer, StatusQuery(seq=self._seq), address=address)

    def transfers(self) -> list[dict[str, Any]]:
        """Hand-offs under way here: the key share still awaited from each peer, the chunks each has not acked."""
        return [{"peer": peer, "incoming": incoming, "share": round(share, 6), "chunks": chunks}
                for peer, incoming, share, chunks in self.handoff.progress()]

    def shares(self) -> dict[str, tuple[float, float]]:
        """Each member's (key share, weight share) on the current ring."""
        ring = self.ring
        if ring is None:
            return {}
        keys, weights = ring.shares(), ring.weight_shares()
        return {node: (keys.get(node, 0.0), weights.get(node, 0.0)) for node in ring.nodes}

    def ring_map(self) -> dict[str, Any]:
        """The ring in `RING_SLICES` slices (each node's fraction of each, sampled: `ring_slices`), and the fraction
        of each slice whose hand-off this node still awaits (`ring_pending`)."""
        ring = self.ring
        if ring is None:
            return {"slices": [], "pending": []}
        if self._slices is None or self._slices[0] != self._ring_id:
            self._slices = (self._ring_id, ring_slices(ring, RING_SLICES))
        pending = ring_pending(self.handoff.blocked, RING_SLICES) if self.handoff.waiting() else [0.0] * RING_SLICES
        return {"slices": self._slices[1], "pending": pending}

    def cluster_status(self, *, detail: bool = False) -> dict[str, Any]:
        """Every member as this node knows it: its view, ring shares, and the latest progress reports; with
        `detail`, each member's detailed status (the dashboard's) and the ring folded into slices."""
        ring = self.ring
        shares = ring.shares() if ring is not None else {}
        weight_shares = ring.weight_shares() if ring is not None else {}
        me = self.local_progress()
        nodes = []
        for m in self.view.members:
            report = me if m.node_id == self.node_id else self.peers.get(m.node_id)
            live = m.state in _OWNING
            nodes.append({
                "node_id": m.node_id, "address": m.address, "weight": m.weight, "state": m.state.value,
                "zone": m.zone, "key_share": shares.get(m.node_id, 0.0), "weight_share": weight_shares.get(m.node_id, 0.0),
                "pages": report.pages if report else None, "rate": report.rate if report else None,
                "queue": report.queued if report else None,
                "urls_received": report.urls_received if report else None,
                "idle": report.idle if report and live else None,
                "ring": report.ring if report else None,
                "connected": m.node_id == self.node_id or m.node_id in self.links.connected_peers(),
            })
            if detail:
                nodes[-1]["detail"] = self._detail_of(m.node_id, m.state)
        done = self.finished.is_set() and me.idle
        out = {"node_id": self.node_id, "epoch": self.epoch, "done": done, "nodes": nodes}
        if detail:
            out["ring_map"] = self.ring_map()
        return out

    def _detail_of(self, node: str, state: MemberState) -> dict[str, Any] | None:
        if node == self.node_id:
            return self.summary() if self.summary is not None else None
        if state not in _OWNING and state is not MemberState.LEAVING:
            return None
        got = self.details.get(node)
        if got is None:
            return None
        age = trio.current_time() - got[0]
        return None if age > DETAIL_MAX_AGE else {**got[1], "age": round(age, 1)}


#: In the data dir: the wall time until which lanes this node lent to others may still be in use.
LANES_FILE = "lanes.until"


def _lent_until(path: Path, now: float) -> float | None:
    """Seconds a starting node must wait before lending lanes: what its previous run lent may still run. No file:
    it never lent to another node (0). An unreadable one: None (wait the whole lease time)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0.0
    except OSError:
        return None
    try:
        until = float(text.strip())
    except ValueError:
        return None
    return max(0.0, until - now) if math.isfinite(until) else None


def ring_id(ring: Ring) -> int:
    """A 63-bit name of a ring, the same on every node that built it: hand-off transfers are labelled with it."""
    text = ",".join(f"{node}={weight}" for node, weight in sorted(ring.weights.items()))
    text += f"/{ring.points_per_weight}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


class ClusterError(RuntimeError):
    """The node cannot take part in the cluster as asked (for instance no seed answered)."""
