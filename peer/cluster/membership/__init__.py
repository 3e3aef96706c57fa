"""Membership in the SWIM manner of HashiCorp's memberlist, over the peer links: probes, indirect probes,
suspicion, gossip of the versioned view."""

from peer.cluster.membership.membership import Membership, MembershipConfig, ViewWatch, from_wire, to_wire

__all__ = ["Membership", "MembershipConfig", "ViewWatch", "from_wire", "to_wire"]
