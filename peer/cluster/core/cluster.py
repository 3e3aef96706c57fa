"""The cluster side of one node: membership, the ring of each view, URL dispatch, arc hand-off, progress reports,
cluster-wide termination, and graceful leave.

`Cluster` composes the layers of docs/cluster.md around one node's store and crawler:

- every view change gives a ring (built in a worker thread, cached by its members and weights); the crawler asks
  `owns(host)` (the ring's owner is this node) and `blocked(host)` (the host's arc waits for its hand-off);
- links to hosts owned elsewhere go to `dispatcher.route`, and the crawler stores them with the page that found
  them (`take_routed`);
- a view change starts the hand-off of the arcs this node lost and notes those it gained;
- the seen keys of the pages it fetches go to each arc's backup (`peer/cluster/replicas/seenreplicas.py`), so a death repeats little;
- every second the ring's first member (by node id) gathers every member's progress over a tree of the ring's
  members (`peer/cluster/core/progress.py`: a bounded number of messages per node, whatever the cluster's size); two
  waves in which every member is idle with unchanged activity on the same ring mean the crawl is finished
  everywhere (the four-counter method: an idle node has nothing queued, nothing being fetched, and every batch
  and chunk it sent acknowledged), and the next wave tells every member so.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import trio

from protocol import (
    BatchAck, CaptureAnswer, CaptureAsk, ControlAnswer, ControlAsk, DigestAnswer, DigestAsk, HandoffAck, HandoffAsk,
    HandoffChunk, LaneAsk, LaneGrant, LaneHandover, LaneHandoverAsk, LaneReturn, Message, PluginCheck, ProgressQuery,
    ProgressReport, ProgressTally, ProgressWave, QueueReplica, ReplicaAck, SeenReplica, Settings, StatusQuery,
    StatusReport, UrlBatch,
)
from ring import DEFAULT_POINTS_PER_WEIGHT, MemberState, Ring, View, Zones, host_position
from storage import HostState, NodeStore, QueuedUrl, in_arc

from peer.config import Config
from peer.crawl.crawler import Crawler
from peer.crawl.syncs import StoreSyncs
from peer.cluster.replicas.queueconfig import Ticket
from peer.cluster.replicas.queuereplicas import QueueReplicas
from peer.cluster.core.captures import CaptureLookups, LocalCaptures, no_captures
from peer.cluster.core.clusterstatus import ClusterStatus
from peer.cluster.core.digests import DigestLookups
from peer.cluster.core.dispatch import DispatchConfig, Dispatcher
from peer.cluster.core.fence import PartitionFence
from peer.cluster.handoff.handoff import Handoff, HandoffConfig, Hold
from peer.cluster.core.lanes import LEASE, FleetLanes
from peer.cluster.core.controlfan import Answer, ControlFan, no_control
from peer.cluster.core.pluginjoin import PluginJoin, PluginMismatch, no_plugins
from peer.cluster.membership.membership import Membership, MembershipConfig
from peer.cluster.net.peerlinks import LinkConfig
from peer.cluster.replicas.seenreplicas import REPLICA_COPIES, SeenReplicas
from peer.cluster.core.rings import RingCache, _Owners, ring_id
from peer.cluster.core.settingsgossip import SettingsGossip
from peer.cluster.core.termination import LINGER_TIMEOUT, Termination
from peer.cluster.net.transport import TcpTransport, TlsFiles, Transport
from peer.cluster.core.viewchanges import ViewChanges

__all__ = ["Cluster", "ClusterError", "ring_id"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.cluster")

#: A part's handler of a peer's message: called with the peer and the message; what it returns is awaited if it
#: is awaitable (the dispatcher's and the hand-off's are coroutines), else ignored.
Handler = Callable[[str, Any], object]

#: After a join, how long to wait for the ring of the joined view (a build takes about 0.1 s per million points;
#: a view change derives the next ring from the current one in a few tens of milliseconds).
JOIN_RING_TIMEOUT = 30.0


class Cluster(ViewChanges):
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
        summary: Callable[[], dict[str, Any] | None] = lambda: None,
        plugins: Callable[[], dict[str, Any]] = no_plugins,
        admitting: Callable[[], bool] = lambda: True,
        captures: LocalCaptures = no_captures,
        control: Answer = no_control,
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
            admits=self.admits, refuses=self.refuses,  # the plug-in chains (below)
            link_busy=self.link_busy,
            codecs=codecs,
            compressions=compressions,
            members=members,
        )
        self.links = self.membership.links
        # the plug-in chains compared at join (peer/cluster/core/pluginjoin.py)
        self.plugin_join = PluginJoin(self.links, plugins)
        # control requests for the whole cluster through this node (peerctl plugins, items, plugins reload)
        self.control = ControlFan(node_id, self.links, lambda: [self.node_id, *self.live_peers()], control,
                                  dead=lambda: [m.node_id for m in self.view.members if m.state is MemberState.DEAD])
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
        self.wall_clock = wall_clock  # the one wall clock of every part (states and leases travel as durations)
        # every queued URL also on the ring backups of its position (--replicas R), promoted when its owner dies;
        # the cluster is its delegate (`QueueDelegate`: releases staged, seen marks held, replicas passed on)
        self.backups = QueueReplicas(node_id, store, self.links, ring_of=lambda: (self.epoch, self.ring),
                                     copies=cfg.replicas, wall_clock=wall_clock, zones_of=lambda: self.zones,
                                     seen_copies=REPLICA_COPIES,  # a release marks a page seen where its key goes
                                     delegate=self)
        self.dispatcher = Dispatcher(
            node_id, store, self.links, ring_of=self.ring_of,
            config=DispatchConfig(batch_size=cfg.batch_size, interval=cfg.dispatch_interval),
            on_admitted=self._admitted, backups=self.backups, syncs=self.syncs,
            answered_by=lambda: self.crawler.answered if self.crawler is not None else None,
            admitting=admitting,  # False while the node's disk is low (peer/diskguard.py)
        )
        # the hand-off asks the cluster (its delegate) what is busy, who owns what, and where keys go
        self.handoff = Handoff(node_id, store, self.links, config=HandoffConfig(wait=cfg.handoff_wait),
                               wall_clock=wall_clock, delegate=self)
        # seen marks that peers' replicas leave here stay through the drop of an arc being handed over: this node
        # is often the backup of the arc's new owner, and its heir
        self.replicas = SeenReplicas(node_id, store, self.links, ring_of=lambda: (self.epoch, self.ring),
                                     apply_states=self._merge_states, wall_clock=wall_clock,
                                     zones_of=lambda: self.zones,
                                     reliable=self.backups.mark_seen if cfg.replicas else None,
                                     on_marked=self.handoff.marked_seen)
        # per-address limits held fleet-wide: this node owns the addresses the ring gives it and lends their
        # lanes (peer/cluster/core/lanes.py); the crawler borrows through it
        self._lanes_file = Path(cfg.data_dir) / LANES_FILE
        self._lanes_written = -math.inf
        self.lanes = (
            FleetLanes(node_id, cfg.ip_connections, cfg.ip_delay, lease=LEASE, max_request=cfg.total_timeout,
                       delegate=self, start_wait=_lent_until(self._lanes_file, wall_clock()))
            if cfg.ip_connections > 0 else None
        )
        # where payloads were first stored, asked of each digest's owner (peer/cluster/core/digests.py): the
        # crawler's PayloadOriginals
        self.digests = DigestLookups(node_id, store.digests, self.links, owner_of=self._key_owner)
        self.crawler: Crawler | None = None
        # URLs of peers' replicas the crawler learnt are queued at their owner, so not routed there (`held_from`)
        self.urls_known_elsewhere = 0
        self.address: str | None = None
        self.ready = trio.Event()  # joined (or started a new cluster) and seeded: progress waves may begin
        self._ready_at: float | None = None  # when `ready` was set (see `_fresh`)
        self.leaving = False
        self.view_changes = 0
        self.hosts_swept = 0
        # progress reports, the waves over the tree of the ring's members, and concluding the crawl is finished
        self.termination = Termination(
            node_id, view=lambda: self.view, members=lambda: (self._ring_id, self._order), links=self.links,
            dispatcher=self.dispatcher, handoff=self.handoff, crawler=lambda: self.crawler, stats=stats,
            queued=lambda: len(store.frontier), ready=self.ready)
        self.progress = self.termination.progress
        # (when, dead node, URLs promoted): each arc inherited from a dead node, promoted from its replicas
        self.promotions: list[tuple[float, str, int]] = []
        self._routed_to: set[str] = set()  # owners of the links routed by the page being committed
        self._queued_ticket: Ticket | None = None  # the replicas of the links it queued here
        self.fence = PartitionFence(node_id, view=lambda: self.view, last_heard=self.membership.last_heard,
                                    suspicion_timeout=cfg.suspicion_timeout, probe_interval=cfg.probe_interval,
                                    majority_heard=lambda: self.progress.contact_at)
        # the crawl settings sent to the peers at each change and repeated as gossip
        self.gossip = SettingsGossip(node_id, links=self.links, view=lambda: self.view, live_peers=self.live_peers,
                                     crawler=lambda: self.crawler)
        self.messages_unknown = 0  # peers' messages of a type no part handles
        # `/status`'s cluster part and the dashboard's `/cluster`, with what the peers tell of themselves; the
        # node's summary is its detailed status (none when the cluster is built alone)
        self.statuses = ClusterStatus(
            node_id, facts=self, links=self.links, dispatcher=self.dispatcher, handoff=self.handoff,
            replicas=self.replicas, backups=self.backups, fence=self.fence, lanes=self.lanes, gossip=self.gossip,
            termination=self.termination, live_peers=self.live_peers, summary=summary)
        # the cluster's `GET /cdx`: every live member asked for its captures (`captures`: this node's)
        self.captures = CaptureLookups(node_id, links=self.links, live_peers=self.live_peers,
                                       address_of=self._address_of, local=captures)
        self._handlers = self._message_table()

    # -- the parts' faces: what the node and the control routes ask of the cluster ----------------------------

    def status(self) -> dict[str, Any]:
        """`/status`'s cluster part (`ClusterStatus.status`), with the payload digests asked of their owners."""
        return {**self.statuses.status(), "digests": self.digests.status()}

    def cluster_status(self, *, detail: bool = False) -> dict[str, Any]:
        """Every member as this node knows it (`ClusterStatus.cluster_status`)."""
        return self.statuses.cluster_status(detail=detail)

    def watched(self) -> None:
        """Someone looks at the cluster: the peers are asked for their detailed status (`ClusterStatus.watched`)."""
        self.statuses.watched()

    def transfers(self) -> list[dict[str, Any]]:
        return self.statuses.transfers()

    def shares(self) -> dict[str, tuple[float, float]]:
        return self.statuses.shares()

    def share_settings(self, peers: Iterable[str] | None = None) -> int:
        """Send the crawl settings in force to `peers`, every live peer by default (`SettingsGossip.share`)."""
        return self.gossip.share(peers)

    def local_progress(self, seq: int = 0) -> ProgressReport:
        return self.termination.local_progress(seq)

    async def linger(self, timeout: float = LINGER_TIMEOUT) -> None:
        """After concluding, keep answering the progress tree a while (`Termination.linger`)."""
        await self.termination.linger(timeout)

    @property
    def finished(self) -> trio.Event:
        """Set once the whole cluster's crawl is finished (`Termination.finished`)."""
        return self.termination.finished

    @property
    def current_ring_id(self) -> int:
        """The current ring's id (`ring_id`): the progress waves and the dashboard's ring picture follow it."""
        return self._ring_id

    def _address_of(self, peer_id: str) -> str | None:
        member = self.view.member(peer_id)
        return member.address if member is not None else None

    def admits(self, peer_id: str) -> bool:
        """Membership's question before it merges the view of a node that is not yet a live member here: has
        it shown a plug-in chain like this node's (`PluginJoin.admits`)? Asked for it when not."""
        return self.plugin_join.admits(peer_id)

    def refuses(self, node_id: str) -> bool:
        """Whether `node_id` showed a plug-in chain that differs from this node's: it is left out of the views
        this node merges, whoever gossips of it."""
        return node_id in self.plugin_join.refused_nodes

    def live_peers(self) -> list[str]:
        """The other members of this node's view that own arcs."""
        return [m.node_id for m in self.view.members if m.node_id != self.node_id and m.state.owns_arcs]

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
            # its seen key goes to the seen-key replicas with its release (`release_staged`): once the links
            # its page found are safe elsewhere, as a backup that held the page seen would never fetch it again
            self.backups.released(item, routed_to, links)
        else:
            self.replicas.fetched(item)

    # -- the queued-URL replicas' delegate (peer/cluster/replicas/queueconfig.py: QueueDelegate) -------------

    def release_staged(self, item: QueuedUrl, key: bytes, backups: frozenset[str]) -> None:
        """A released page's seen key: its release marks it seen at the backups it went to, so the seen-key
        replicas send it only to the others."""
        self.replicas.fetched(item, key, released=backups)

    def marked_seen(self, keys: Sequence[bytes]) -> None:
        self.handoff.marked_seen(keys)

    def pass_on(self, items: list[QueuedUrl]) -> None:
        """Replicas this node no longer backs go to their owners before they are dropped, not only dropped."""
        self.dispatcher.pass_on(items)

    def held_from(self, peer_id: str, epoch: int, items: Sequence[QueuedUrl]) -> None:
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

    # -- the lanes' delegate (peer/cluster/core/lanes.py: LanesDelegate) ----------------------------------------

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
            members = {m.node_id for m in self.view.members if m.state.owns_arcs} | {self.node_id}
            self.lanes.tick(members)
            # Until when lanes lent to other nodes may be in use, on disk (as wall time), so that a restart waits
            # out only what this run lent: written when it moves on by a second or more.
            until = self.lanes.lent_until
            if until > self._lanes_written + 1.0:
                wall = self.wall_clock() + (until - trio.current_time())
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

    # -- the hand-off's delegate (peer/cluster/handoff/config.py: HandoffDelegate) --------------------------

    def owner_of(self, host: str) -> str:
        assert self._owners is not None
        return self._owners.owner(host)

    def _key_owner(self, key: str) -> str | None:
        """The owner of a ring key now; None before the first ring (the digests' look-ups answer here then)."""
        ring = self.ring
        return None if ring is None else ring.owner(key)

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

    def departing(self, peer_id: str) -> bool:
        member = self.view.member(peer_id)
        return member is not None and member.state is MemberState.LEAVING

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
            nursery.start_soon(self.termination.run)
            nursery.start_soon(self._sweep_loop)
            nursery.start_soon(self.fence.contact_loop)
            if self.lanes is not None:
                nursery.start_soon(self._lanes_loop)
            nursery.start_soon(self.gossip.run)
            await nursery.start(self.digests.run)
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
                await self.plugin_join.check(seed, self.links.config.handshake_timeout)
            except PluginMismatch as exc:
                raise ClusterError(str(exc)) from exc
            except Exception as exc:  # LinkError, a transport error, no answer in time: try the next seed
                problems.append(f"cannot ask {seed} for its plug-ins: {exc or type(exc).__name__}")
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
        others = [m for m in self.view.members if m.node_id != self.node_id and m.state.owns_arcs]
        if not others:
            log.info("leaving: no other member to hand off to")
            return True
        self.dispatcher.drain()
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

    def _message_table(self) -> dict[type, Handler]:
        """Each message type a peer may send the cluster (membership's own are taken before), and its one handler."""
        lanes = self.lanes.on_message if self.lanes is not None else self._no_lanes
        table: dict[type, Handler] = {
            ProgressWave: self.progress.on_wave,
            ProgressTally: self.progress.on_tally,
            ProgressQuery: self.termination.asked,
            PluginCheck: self.plugin_join.on_message,
            ControlAsk: self.control.on_message,
            ControlAnswer: self.control.on_message,
            ProgressReport: self.statuses.progress_arrived,
            StatusQuery: self.statuses.asked,
            StatusReport: self.statuses.arrived,
            CaptureAsk: self.captures.asked,
            CaptureAnswer: self.captures.answered,
            Settings: self.gossip.arrived,
            UrlBatch: self.dispatcher.on_message,
            BatchAck: self.dispatcher.on_message,
            HandoffChunk: self.handoff.on_message,
            HandoffAck: self.handoff.on_message,
            HandoffAsk: self.handoff.on_message,
            SeenReplica: self.replicas.on_message,
            QueueReplica: self.backups.on_message,
            ReplicaAck: self.backups.on_message,
            DigestAsk: self.digests.on_message,
            DigestAnswer: self.digests.on_message,
        }
        for lane_message in (LaneAsk, LaneGrant, LaneReturn, LaneHandover, LaneHandoverAsk):
            table[lane_message] = lanes
        return table

    async def _on_message(self, peer_id: str, message: Message) -> None:
        """A peer's message, to the one part that handles its type. A type no part handles (a peer of another
        version, or one that misbehaves) is counted and logged, and the link goes on."""
        handler = self._handlers.get(type(message))
        if handler is None:
            self.messages_unknown += 1
            log.warning("a peer sent a message no part of the cluster handles; ignored",
                        extra={"peer": peer_id, "type": type(message).__name__})
            return
        result = handler(peer_id, message)
        if isinstance(result, Awaitable):
            await result

    def _no_lanes(self, peer_id: str, message: Message) -> None:
        """A lane message to a node that holds no per-address limits (`ip_connections` 0): nothing to lend."""
        log.debug("a lane message to a node without lanes; ignored", extra={"peer": peer_id})


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


class ClusterError(RuntimeError):
    """The node cannot take part in the cluster as asked (for instance no seed answered)."""
