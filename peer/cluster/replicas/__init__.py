"""Replicas on the ring's backups: the seen keys of fetched pages (`SeenReplicas`) and the queued URLs
(`QueueReplicas`, `--replicas R`, with its sending side, its holding side and its limits)."""

from peer.cluster.replicas.queueconfig import Ticket
from peer.cluster.replicas.queuereplicas import QueueReplicas
from peer.cluster.replicas.seenreplicas import REPLICA_COPIES, SeenReplicas

__all__ = ["REPLICA_COPIES", "QueueReplicas", "SeenReplicas", "Ticket"]
