"""The cluster: what makes one crawler node a member of a fleet. The transport (TCP, TLS, in-memory), links to
peers, membership (SWIM-style probes, suspicion, views), discovery (DNS SRV), dispatch of links to their
owners, hand-off of moved arcs, seen-key replicas, queued-URL replicas (`backups`), the partition fence, the
per-address lanes, the status the dashboard and the peers read (`report`), the progress tree that finds the end
of the crawl (`progress`), the cache of rings (`rings`), and the `Cluster` that composes them beside a crawler.
"""

from peer.cluster.cluster import Cluster, ClusterError
from peer.cluster.discovery import DiscoveryError, srv_seeds
from peer.cluster.dispatch import DispatchConfig, DispatchStats, Dispatcher
from peer.cluster.handoff import Handoff, HandoffConfig, handoff_arcs
from peer.cluster.membership import Membership, MembershipConfig
from peer.cluster.peerlinks import LinkConfig, LinkError, PeerLinks
from peer.cluster.progress import ProgressTree
from peer.cluster.replicas import SeenReplicas
from peer.cluster.rings import RingCache
from peer.cluster.memtransport import MemoryNetwork
from peer.cluster.transport import TcpTransport, TlsFiles, Transport, TransportError

__all__ = [
    "Cluster", "ClusterError", "DiscoveryError", "DispatchConfig", "DispatchStats", "Dispatcher", "Handoff",
    "HandoffConfig", "LinkConfig", "LinkError", "MemoryNetwork", "Membership", "MembershipConfig",
    "PeerLinks", "ProgressTree", "RingCache", "SeenReplicas", "TcpTransport", "TlsFiles", "Transport", "TransportError",
    "handoff_arcs", "srv_seeds",
]
