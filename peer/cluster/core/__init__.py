"""The cluster core: the `Cluster` that composes one node's cluster side beside its crawler, and what it is made
of besides the network, membership, hand-off and replicas: the rings of the views and their changes, URL
dispatch, the fleet's per-address lanes, the partition fence, the progress tree and cluster-wide termination,
the crawl settings' gossip, and the status the dashboard and the peers read."""

from peer.cluster.core.cluster import Cluster, ClusterError
from peer.cluster.core.dispatch import DispatchConfig, DispatchStats, Dispatcher
from peer.cluster.core.fence import PartitionFence
from peer.cluster.core.lanes import FleetLanes
from peer.cluster.core.progress import ProgressTree
from peer.cluster.core.rings import RingCache, ring_id

__all__ = [
    "Cluster", "ClusterError", "DispatchConfig", "DispatchStats", "Dispatcher", "FleetLanes", "PartitionFence",
    "ProgressTree", "RingCache", "ring_id",
]
