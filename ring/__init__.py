"""Pure hashing and membership views: the weighted virtual-node ring. No I/O, no clock, no randomness.

Every node derives the same ring from the same view, so the owner of a host is a local computation: see
docs/ring.md for the placement, the measured balance and the cost.
"""

from ._diff import ArcMove, Moves, diff, diff_moves, moved_fraction, wire_moves
from ._hash import RING_SPACE, host_position, host_position_bytes, node_points
from ._hostnames import RandomSource, random_hosts
from ._ring import DEFAULT_POINTS_PER_WEIGHT, MAX_POINTS, Arc, EmptyRingError, Ring
from ._simulate import AddNode, ChangeFigures, NodeFigures, RemoveNode, SimulationReport, Stage, simulate
from ._view import Member, MemberState, View, merge
from ._zones import MAX_ZONE, Zones, check_zone

__all__ = [
    "AddNode",
    "Arc",
    "ArcMove",
    "ChangeFigures",
    "DEFAULT_POINTS_PER_WEIGHT",
    "EmptyRingError",
    "MAX_POINTS",
    "MAX_ZONE",
    "Member",
    "MemberState",
    "Moves",
    "NodeFigures",
    "RING_SPACE",
    "RandomSource",
    "RemoveNode",
    "Ring",
    "SimulationReport",
    "Stage",
    "View",
    "Zones",
    "check_zone",
    "diff",
    "diff_moves",
    "host_position",
    "host_position_bytes",
    "merge",
    "moved_fraction",
    "node_points",
    "random_hosts",
    "simulate",
    "wire_moves",
]
