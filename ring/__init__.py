"""Pure hashing and membership views: the weighted virtual-node ring. No I/O, no clock, no randomness.

Every node derives the same ring from the same view, so the owner of a host is a local computation: see
docs/ring.md for the placement, the measured balance and the cost.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._diff import ArcMove, Moves, diff, diff_moves, moved_fraction, wire_moves
    from ._hash import RING_SPACE, host_position, host_position_bytes, node_points
    from ._hostnames import RandomSource, random_hosts
    from ._ring import DEFAULT_POINTS_PER_WEIGHT, MAX_POINTS, Arc, EmptyRingError, Ring
    from ._simulate import AddNode, ChangeFigures, NodeFigures, RemoveNode, SimulationReport, Stage, simulate
    from ._view import Member, MemberState, View, merge
    from ._zones import MAX_ZONE, Zones, check_zone

# Public names load their module on first use: a process that only hashes host names (a page worker, a store
# check) does not import numpy, which the ring's arrays need.
_EXPORTS = {
    "_diff": ("ArcMove", "Moves", "diff", "diff_moves", "moved_fraction", "wire_moves"),
    "_hash": ("RING_SPACE", "host_position", "host_position_bytes", "node_points"),
    "_hostnames": ("RandomSource", "random_hosts"),
    "_ring": ("DEFAULT_POINTS_PER_WEIGHT", "MAX_POINTS", "Arc", "EmptyRingError", "Ring"),
    "_simulate": ("AddNode", "ChangeFigures", "NodeFigures", "RemoveNode", "SimulationReport", "Stage", "simulate"),
    "_view": ("Member", "MemberState", "View", "merge"),
    "_zones": ("MAX_ZONE", "Zones", "check_zone"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

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


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'ring' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
