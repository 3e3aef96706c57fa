"""The ring-rebalance experiment behind ``peerctl ring``: shares and moves, measured.

Given nodes and weights and a sequence of changes (a node leaves, a node joins), it builds the ring of every
stage and reports, per node, the weight share, the key-space share (exact, from the arcs) and the share of N
random host names, and per change how much of the key space and of the hosts moved, against the ideal (the
weight share that had to move) and how much moved needlessly (between two nodes the change did not involve).
Host names are generated and counted a chunk at a time, so N can be tens of millions. Pure: the random
generator is an argument.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._diff import diff
from ._hash import RING_SPACE, host_position
from ._hostnames import RandomSource, random_hosts
from ._ring import DEFAULT_POINTS_PER_WEIGHT, Ring

__all__ = ["AddNode", "ChangeFigures", "NodeFigures", "RemoveNode", "SimulationReport", "Stage", "simulate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AddNode:
    """A node joins with ``weight``."""

    node_id: str
    weight: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoveNode:
    """A node leaves."""

    node_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFigures:
    """One node in one stage. Errors are relative: ``share / weight_share - 1``."""

    node_id: str
    weight: int
    weight_share: float
    key_share: float
    key_error: float
    hosts: int
    host_share: float
    host_error: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeFigures:
    """What one change moved. ``ideal`` is the weight share that had to move; moves are fractions of the key
    space or of the sampled hosts; ``unnecessary_*`` moved between nodes the change did not involve."""

    kind: str
    node_id: str
    weight: int
    ideal: float
    moved_keyspace: float
    moved_hosts: int
    moved_host_share: float
    unnecessary_keyspace: float
    unnecessary_hosts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    label: str
    total_weight: int
    points: int
    nodes: tuple[NodeFigures, ...]
    change: ChangeFigures | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulationReport:
    points_per_weight: int
    hosts: int
    stages: tuple[Stage, ...]

    @property
    def max_key_error(self) -> float:
        return max(abs(node.key_error) for stage in self.stages for node in stage.nodes)

    @property
    def max_host_error(self) -> float:
        return max((abs(node.host_error) for stage in self.stages for node in stage.nodes), default=0.0)

    @property
    def unnecessary_moves(self) -> int:
        """Hosts moved needlessly, over every change (0 for a correct ring)."""
        return sum(stage.change.unnecessary_hosts for stage in self.stages if stage.change is not None)

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form documented in docs/ring.md."""
        return {
            "points_per_weight": self.points_per_weight,
            "hosts": self.hosts,
            "max_key_error": self.max_key_error,
            "max_host_error": self.max_host_error,
            "unnecessary_moves": self.unnecessary_moves,
            "stages": [
                {
                    "label": stage.label,
                    "total_weight": stage.total_weight,
                    "points": stage.points,
                    "nodes": [
                        {
                            "node": node.node_id,
                            "weight": node.weight,
                            "weight_share": node.weight_share,
                            "key_share": node.key_share,
                            "key_error": node.key_error,
                            "hosts": node.hosts,
                            "host_share": node.host_share,
                            "host_error": node.host_error,
                        }
                        for node in stage.nodes
                    ],
                    "change": None if stage.change is None else {
                        "kind": stage.change.kind,
                        "node": stage.change.node_id,
                        "weight": stage.change.weight,
                        "ideal": stage.change.ideal,
                        "moved_keyspace": stage.change.moved_keyspace,
                        "moved_hosts": stage.change.moved_hosts,
                        "moved_host_share": stage.change.moved_host_share,
                        "unnecessary_keyspace": stage.change.unnecessary_keyspace,
                        "unnecessary_hosts": stage.change.unnecessary_hosts,
                    },
                }
                for stage in self.stages
            ],
        }


def _stage_weights(nodes: Mapping[str, int], changes: Sequence[AddNode | RemoveNode]) -> list[dict[str, int]]:
    stages = [dict(nodes)]
    for change in changes:
        weights = dict(stages[-1])
        if isinstance(change, AddNode):
            if change.node_id in weights:
                raise ValueError(f"cannot add node {change.node_id!r}: it is already in the ring")
            weights[change.node_id] = change.weight
        elif isinstance(change, RemoveNode):
            if change.node_id not in weights:
                raise ValueError(f"cannot remove node {change.node_id!r}: it is not in the ring")
            del weights[change.node_id]
            if not weights:
                raise ValueError(f"removing node {change.node_id!r} would leave the ring empty")
        else:
            raise TypeError(f"a change is AddNode or RemoveNode, got {change!r}")
        stages.append(weights)
    return stages


def simulate(
    nodes: Mapping[str, int],
    changes: Sequence[AddNode | RemoveNode] = (),
    *,
    hosts: int,
    rng: RandomSource,
    points_per_weight: int = DEFAULT_POINTS_PER_WEIGHT,
    chunk: int = 65536,
) -> SimulationReport:
    """Run the experiment: stage 0 is ``nodes``, then one stage per change, all measured on the same hosts."""
    if not nodes:
        raise ValueError("the simulation needs at least one node")
    if hosts < 0:
        raise ValueError(f"the number of hosts must be >= 0, got {hosts}")
    weights = _stage_weights(nodes, changes)
    rings = [Ring(stage, points_per_weight=points_per_weight) for stage in weights]

    counts = [Counter[str]() for _ in rings]
    moved = [0] * len(rings)
    needless = [0] * len(rings)
    for names in random_hosts(rng, hosts, chunk=chunk):
        positions = list(map(host_position, names))
        previous: list[str] | None = None
        for index, ring in enumerate(rings):
            owners = ring.owners_at(positions)
            counts[index].update(owners)
            if previous is not None:
                change = changes[index - 1]
                moves = [(old, new) for old, new in zip(previous, owners) if old is not new]
                moved[index] += len(moves)
                if isinstance(change, AddNode):
                    needless[index] += sum(1 for _, new in moves if new != change.node_id)
                else:
                    needless[index] += sum(1 for old, _ in moves if old != change.node_id)
            previous = owners

    stages: list[Stage] = []
    for index, ring in enumerate(rings):
        change_figures = None
        if index:
            change = changes[index - 1]
            arc_moves = diff(rings[index - 1], ring)
            if isinstance(change, AddNode):
                kind, weight = "add", change.weight
                ideal = weight / sum(weights[index].values())
                needless_arcs = [move for move in arc_moves if move.next != change.node_id]
            else:
                kind, weight = "remove", weights[index - 1][change.node_id]
                ideal = weight / sum(weights[index - 1].values())
                needless_arcs = [move for move in arc_moves if move.previous != change.node_id]
            change_figures = ChangeFigures(
                kind=kind,
                node_id=change.node_id,
                weight=weight,
                ideal=ideal,
                moved_keyspace=sum(move.end - move.start for move in arc_moves) / RING_SPACE,
                moved_hosts=moved[index],
                moved_host_share=moved[index] / hosts if hosts else 0.0,
                unnecessary_keyspace=sum(move.end - move.start for move in needless_arcs) / RING_SPACE,
                unnecessary_hosts=needless[index],
            )
        stages.append(_stage(_label(changes, index), ring, counts[index], hosts, change_figures))
    return SimulationReport(points_per_weight=points_per_weight, hosts=hosts, stages=tuple(stages))


def _label(changes: Sequence[AddNode | RemoveNode], index: int) -> str:
    if index == 0:
        return "initial"
    change = changes[index - 1]
    if isinstance(change, AddNode):
        return f"add {change.node_id}={change.weight}"
    return f"remove {change.node_id}"


def _stage(label: str, ring: Ring, counts: Counter[str], hosts: int, change: ChangeFigures | None) -> Stage:
    key_shares = ring.shares()
    weight_shares = ring.weight_shares()
    figures = []
    for node in ring.nodes:
        host_share = counts[node] / hosts if hosts else 0.0
        figures.append(
            NodeFigures(
                node_id=node,
                weight=ring.weights[node],
                weight_share=weight_shares[node],
                key_share=key_shares[node],
                key_error=key_shares[node] / weight_shares[node] - 1,
                hosts=counts[node],
                host_share=host_share,
                host_error=host_share / weight_shares[node] - 1 if hosts else 0.0,
            )
        )
    return Stage(
        label=label,
        total_weight=sum(ring.weights.values()),
        points=ring.point_count,
        nodes=tuple(figures),
        change=change,
    )
