"""The cluster: what makes one crawler node a member of a fleet, in five rooms whose imports point one way:

- `core`: the `Cluster` beside a crawler, the rings of the views and their changes, URL dispatch, the per-address
  lanes, the partition fence, the progress tree and termination, settings gossip, the status forms;
- `handoff`: the hand-off of moved arcs; `replicas`: seen-key replicas (`SeenReplicas`) and queued-URL replicas
  (`QueueReplicas`);
- `membership`: SWIM-style probes, suspicion and views;
- `net`: the transport (TCP, TLS, in-memory), the links between peers, discovery (DNS SRV).
"""

from peer.cluster.core import (
    Cluster, ClusterError, DispatchConfig, DispatchStats, Dispatcher, ProgressTree, RingCache,
)
from peer.cluster.handoff import Handoff, HandoffConfig, handoff_arcs
from peer.cluster.membership import Membership, MembershipConfig
from peer.cluster.net import (
    DiscoveryError, LinkConfig, LinkError, MemoryNetwork, PeerLinks, TcpTransport, TlsFiles, Transport,
    TransportError, srv_seeds,
)
from peer.cluster.replicas import QueueReplicas, SeenReplicas

__all__ = [
    "Cluster", "ClusterError", "DiscoveryError", "DispatchConfig", "DispatchStats", "Dispatcher", "Handoff",
    "HandoffConfig", "LinkConfig", "LinkError", "MemoryNetwork", "Membership", "MembershipConfig",
    "PeerLinks", "ProgressTree", "QueueReplicas", "RingCache", "SeenReplicas", "TcpTransport", "TlsFiles",
    "Transport", "TransportError", "handoff_arcs", "srv_seeds",
]
