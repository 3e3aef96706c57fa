"""What one node's cluster side shows: its status (`/status`'s "cluster"), and the dashboard's picture of every
member (`/cluster`): views, ring shares, the peers' latest progress and detailed status, asked for only while
someone looks, and the ring folded into slices.

`ClusterStatus` is a part of `peer.cluster.core.cluster.Cluster`, built with the parts whose figures it shows and
the cluster's own facts (`ClusterFacts`: its address, epoch, view and ring, and a few counters). It keeps what
the peers tell about themselves (their progress reports and detailed status) and answers their status queries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import trio

from protocol import ProgressQuery, ProgressReport, StatusQuery, StatusReport
from ring import MemberState, Ring, View

from peer.cluster.core.report import ring_pending, ring_slices, status_dict, status_report
from peer.cluster.core.settingsgossip import SettingsGossip
from peer.cluster.core.termination import Termination

__all__ = ["ClusterFacts", "ClusterStatus", "DETAIL_MAX_AGE", "RING_SLICES", "STATUS_INTERVAL"]

#: A look at the cluster asks the peers for their detailed status (the dashboard's) at most this often.
STATUS_INTERVAL = 0.5
#: A peer's detailed status older than this is not shown.
DETAIL_MAX_AGE = 10.0
#: The dashboard's picture folds the ring into this many slices.
RING_SLICES = 360


class ClusterFacts(Protocol):
    """What the status reads of the cluster itself (`Cluster` has each)."""

    address: str | None
    epoch: int
    view: View
    ring: Ring | None
    leaving: bool
    view_changes: int
    hosts_swept: int
    urls_known_elsewhere: int
    messages_unknown: int

    @property
    def current_ring_id(self) -> int: ...


class ClusterStatus:
    """The node's cluster status and the dashboard's view of the cluster."""

    def __init__(
        self,
        node_id: str,
        *,
        facts: ClusterFacts,
        links: Any,
        dispatcher: Any,
        handoff: Any,
        replicas: Any,
        backups: Any,
        fence: Any,
        lanes: Any,
        gossip: SettingsGossip,
        termination: Termination,
        live_peers: Callable[[], list[str]],
        summary: Callable[[], dict[str, Any] | None],
    ) -> None:
        self.node_id = node_id
        self.facts = facts
        # the parts whose figures `status` shows (PeerLinks, Dispatcher, Handoff, SeenReplicas, QueueReplicas,
        # PartitionFence, FleetLanes or None), each read through its public counters and `status()`
        self.links = links
        self.dispatcher = dispatcher
        self.handoff = handoff
        self.replicas = replicas
        self.backups = backups
        self.fence = fence
        self.lanes = lanes
        self.gossip = gossip
        self.termination = termination
        self._live_peers = live_peers
        self.summary = summary  # () -> this node's detailed status (the node's), or None when built alone
        self.peers: dict[str, ProgressReport] = {}  # the latest report of each peer (asked while someone looks)
        self.details: dict[str, tuple[float, dict[str, Any]]] = {}  # peer -> (trio time received, status)
        self._asked_at = float("-inf")  # when peers were last asked for their detailed status
        self._slices: tuple[int, list[dict[str, float]]] | None = None  # (ring id, the ring folded)
        self._seq = 0

    # -- what the peers say -------------------------------------------------------------------------------

    def progress_arrived(self, peer_id: str, message: ProgressReport) -> None:
        self.peers[peer_id] = message

    def asked(self, peer_id: str, message: StatusQuery) -> None:
        """A peer's dashboard asks for this node's detailed status."""
        detail = self.summary()
        if detail is not None:
            self.links.send_nowait(peer_id, status_report(message.seq, detail))

    def arrived(self, peer_id: str, message: StatusReport) -> None:
        self.details[peer_id] = (trio.current_time(), status_dict(message))

    # -- status -------------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        d, h, facts, gossip = self.dispatcher.stats, self.handoff, self.facts, self.gossip
        me = self.termination.local_progress()
        return {
            "enabled": True,
            "address": facts.address,
            "epoch": facts.epoch,
            "members": [
                {"node_id": m.node_id, "address": m.address, "weight": m.weight, "state": m.state.value,
                 "incarnation": m.incarnation, "zone": m.zone}
                for m in facts.view.members
            ],
            "peers_connected": self.links.connected_peers(),
            "dispatch": {
                "urls_routed": d.urls_routed, "urls_recent": d.urls_recent,
                "urls_sent": dict(d.urls_sent), "urls_resent": dict(d.urls_resent),
                "urls_acked": dict(d.urls_acked), "urls_received": dict(d.urls_received),
                "urls_new": d.urls_new, "urls_seen": d.urls_seen, "urls_forwarded": d.urls_forwarded,
                "urls_rerouted": d.urls_rerouted, "urls_known_elsewhere": facts.urls_known_elsewhere,
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
                "waits_expired": h.waits_expired, "hosts_swept": facts.hosts_swept,
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
                      "datagrams_refused": self.links.datagrams_refused,
                      "messages_unknown": facts.messages_unknown},
            "lanes": self.lanes.status() if self.lanes is not None else None,
            "settings": {"sent": gossip.sent, "adopted": gossip.adopted, "refused": gossip.refused},
            "view_changes": facts.view_changes,
            "leaving": facts.leaving,
            "done": me.idle,
            # concluded, and still true: work that arrives later (a joiner's seeds) makes it false again
            "cluster_done": self.termination.finished.is_set() and me.idle,
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
            member = self.facts.view.member(peer)
            address = member.address if member else None
            self.links.send_nowait(peer, ProgressQuery(seq=self._seq), address=address)
            self.links.send_nowait(peer, StatusQuery(seq=self._seq), address=address)

    def transfers(self) -> list[dict[str, Any]]:
        """Hand-offs under way here: the key share still awaited from each peer, the chunks each has not acked."""
        return [{"peer": peer, "incoming": incoming, "share": round(share, 6), "chunks": chunks}
                for peer, incoming, share, chunks in self.handoff.progress()]

    def shares(self) -> dict[str, tuple[float, float]]:
        """Each member's (key share, weight share) on the current ring."""
        ring = self.facts.ring
        if ring is None:
            return {}
        keys, weights = ring.shares(), ring.weight_shares()
        return {node: (keys.get(node, 0.0), weights.get(node, 0.0)) for node in ring.nodes}

    def ring_map(self) -> dict[str, Any]:
        """The ring in `RING_SLICES` slices (each node's fraction of each, sampled: `ring_slices`), and the fraction
        of each slice whose hand-off this node still awaits (`ring_pending`)."""
        ring, ring_id = self.facts.ring, self.facts.current_ring_id
        if ring is None:
            return {"slices": [], "pending": []}
        if self._slices is None or self._slices[0] != ring_id:
            self._slices = (ring_id, ring_slices(ring, RING_SLICES))
        pending = ring_pending(self.handoff.blocked, RING_SLICES) if self.handoff.waiting() else [0.0] * RING_SLICES
        return {"slices": self._slices[1], "pending": pending}

    def cluster_status(self, *, detail: bool = False) -> dict[str, Any]:
        """Every member as this node knows it: its view, ring shares, and the latest progress reports; with
        `detail`, each member's detailed status (the dashboard's) and the ring folded into slices."""
        facts = self.facts
        ring = facts.ring
        shares = ring.shares() if ring is not None else {}
        weight_shares = ring.weight_shares() if ring is not None else {}
        me = self.termination.local_progress()
        nodes = []
        for m in facts.view.members:
            report = me if m.node_id == self.node_id else self.peers.get(m.node_id)
            live = m.state.owns_arcs
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
        done = self.termination.finished.is_set() and me.idle
        out = {"node_id": self.node_id, "epoch": facts.epoch, "done": done, "nodes": nodes}
        if detail:
            out["ring_map"] = self.ring_map()
        return out

    def _detail_of(self, node: str, state: MemberState) -> dict[str, Any] | None:
        if node == self.node_id:
            return self.summary()
        if not state.owns_arcs and state is not MemberState.LEAVING:
            return None
        got = self.details.get(node)
        if got is None:
            return None
        age = trio.current_time() - got[0]
        return None if age > DETAIL_MAX_AGE else {**got[1], "age": round(age, 1)}
