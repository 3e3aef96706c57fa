"""The hand-off of moved arcs: the arcs a view change moves (`arcs`), the sending and receiving sides of a
transfer, and the `Handoff` that runs them with what it is given (`config`: its links and its delegate)."""

from peer.cluster.handoff.arcs import KEY_POSITION, ArcSet, ViewPlan, handoff_arcs, plan_view
from peer.cluster.handoff.config import Alone, HandoffConfig, HandoffDelegate, HandoffLinks, Hold
from peer.cluster.handoff.handoff import Handoff

__all__ = [
    "KEY_POSITION", "Alone", "ArcSet", "Handoff", "HandoffConfig", "HandoffDelegate", "HandoffLinks", "Hold",
    "ViewPlan", "handoff_arcs", "plan_view",
]
