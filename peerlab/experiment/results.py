"""What an experiment measured, and the arithmetic that judges it. Both modes fill the same records.

**Expected ratios.** A sender keeps the URLs of the hosts it owns, so of everything node ``i`` sends, node
``j`` should receive ``w_j / (W - w_i)``, where ``W`` is the total weight of the live nodes (``ratio``). The same
formula applied to other share vectors gives what each cause alone predicts:

- ``ring``: the nodes' key-space shares (``Ring.shares()``) instead of their weight shares;
- ``hosts``: the share of the web's *hosts* each node owns (a finite set of hosts on that ring);
- ``popularity`` (simulation only): the share of link *probability* each node owns, given the web's
  popularity law; the measured ratio differs from it only by sampling.

**The split.** Measured over expected factors exactly: ``m / e = (r / e) * (h / r) * (m / h)``, so the
relative deviation ``m / e - 1`` has three parts: the ring's key-space error ``r / e - 1``, the host-count
part ``h / r - 1`` (which hosts happen to exist) and the popularity part ``m / h - 1`` (a few popular hosts
weigh more than many small ones; plus sampling). For a node as a receiver, the same ratios are summed over the
senders weighted by what each sent (``NodeDeviation``), which is how the headline figures are given.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .plan import Plan

__all__ = [
    "Cell",
    "ChangeCost",
    "ChangeResult",
    "ExperimentResult",
    "NodeDeviation",
    "PhaseResult",
    "Sample",
    "cells",
    "node_deviations",
    "normalized",
    "phase_summary",
    "ratio",
    "receiver_expected_shares",
    "rms",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseResult:
    """One phase: the live nodes (in ``weights`` order), their shares by each measure, and the URLs sent
    between them as a flat row-major matrix (``sent[i * n + j]``: from the i-th node to the j-th), compact
    enough for a thousand nodes."""

    index: int
    name: str
    start: float
    end: float
    pages: int
    weights: dict[str, int]
    key_shares: dict[str, float]
    host_shares: dict[str, float]
    popularity_shares: dict[str, float] | None
    sent: array
    #: URLs each node found for hosts it owns itself (not sent); None when the mode cannot see them.
    kept: dict[str, int] | None = None

    @property
    def nodes(self) -> list[str]:
        return list(self.weights)

    def urls(self, sender: str, receiver: str) -> int:
        nodes = self.nodes
        return self.sent[nodes.index(sender) * len(nodes) + nodes.index(receiver)]

    def row_totals(self) -> dict[str, int]:
        n = len(self.weights)
        return {node: sum(self.sent[i * n:(i + 1) * n]) for i, node in enumerate(self.weights)}

    def column_totals(self) -> dict[str, int]:
        n = len(self.weights)
        return {node: sum(self.sent[j::n]) for j, node in enumerate(self.weights)}

    @property
    def total_sent(self) -> int:
        return sum(self.sent)

    @staticmethod
    def matrix(nodes: Sequence[str], sent: Mapping[tuple[str, str], int]) -> array:
        """The flat matrix of ``sent`` ((sender, receiver) -> URLs) over ``nodes``."""
        n = len(nodes)
        index = {node: i for i, node in enumerate(nodes)}
        out = array("Q", bytes(8 * n * n))
        for (i, j), count in sent.items():
            out[index[i] * n + index[j]] += count
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """URLs sent and received by each node between the previous sample and ``time`` (seconds since the start)."""

    time: float
    phase: int
    sent_by: dict[str, int]
    received_by: dict[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeCost:
    """What one view change cost the nodes of a simulated cluster (mode cluster), from the change until every node
    settled on the new ring, beside the same figures per virtual second of the phase before it (the crawl's own
    traffic, which goes on during the change). Per node: divided by the nodes running at the change."""

    nodes: int
    seconds: float  # virtual seconds from the change to the settle
    messages: int  # messages the nodes received, of every kind (the links' received_kinds)
    bytes: int  # bytes the nodes wrote to the network
    cpu_seconds: float  # CPU time of the simulating process
    handoff_messages: int  # HandoffChunk, HandoffAck and HandoffAsk sent
    handoff_pairs: int  # ordered (sender, receiver) pairs that exchanged any of them
    #: nodes whose arcs changed (the previous or the new owner of a moved arc), and of the hand-off messages those
    #: sent between two nodes that share no moved arc (either way): what a hand-off confined to them leaves at 0
    changed_nodes: int = 0
    handoff_stray: int = 0
    #: (sender, receiver) -> hand-off messages sent
    handoff_by_pair: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: the phase before the change, per node and virtual second: messages, bytes, CPU seconds
    phase_messages: float = 0.0
    phase_bytes: float = 0.0
    phase_cpu: float = 0.0
    #: of `cpu_seconds` and of `phase_cpu`, the part in trio's run loop outside any task (sampled:
    #: peerlab/experiment/loopshare.py), what running n nodes' timers in one process costs on top of their tasks
    loop_cpu_seconds: float = 0.0
    phase_loop_cpu: float = 0.0
    #: kind -> (messages, bytes) the nodes' links wrote from the change to the settle (the links' sent_kinds and
    #: sent_kind_bytes: a message's type, "handshake" for the frames of new connections' handshakes, a
    #: datagram's type with " (datagram)"), and per node per virtual second of the phase before
    sent_by_kind: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    phase_sent_by_kind: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    #: kind -> connections the nodes dialled from the change to the settle, by the kind of the first message
    #: written on each (the links' dialled_for: what the new connections were opened for)
    dialled_for: Mapping[str, int] = field(default_factory=dict)

    def per_node(self, total: float) -> float:
        return total / max(1, self.nodes)

    def excess(self, total: float, rate: float) -> float:
        """Per node, what the change cost beyond the phase's rate over the same virtual seconds (at least 0)."""
        return max(0.0, self.per_node(total) - rate * self.seconds)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeResult:
    """What one change moved. Key-space figures are fractions of the ring; URLs are those the previous owners
    held for the hosts that changed owner (``urls_lost``: held by a killed node, so nobody hands them off)."""

    phase: int
    name: str
    time: float
    actions: tuple[str, ...]
    ideal_keyspace: float
    moved_keyspace: float
    hosts_moved: int
    hosts_total: int
    urls_moved: int
    urls_lost: int
    urls_held: int
    #: (previous owner, new owner) -> URLs moved (or lost) between them.
    by_pair: dict[tuple[str, str], int] = field(default_factory=dict)
    #: live: seconds from the change (its actions included) until the cluster settled on the new ring: every
    #: view shows it and no hand-off is under way (0 in simulation).
    settle_seconds: float = 0.0
    #: live: URLs sent while the views were changing; they belong to no phase (0 in simulation).
    transition_urls: int = 0
    #: cluster mode: what the change cost the nodes (messages, bytes, CPU, hand-off pairs)
    cost: ChangeCost | None = None

    @property
    def ideal_urls(self) -> float:
        """URLs a perfect ring would move: the ideal key-space fraction of everything held."""
        return self.ideal_keyspace * self.urls_held


@dataclass(frozen=True, slots=True, kw_only=True)
class ExperimentResult:
    plan: Plan
    mode: str
    phases: tuple[PhaseResult, ...]
    samples: tuple[Sample, ...]
    changes: tuple[ChangeResult, ...]
    wall_seconds: float
    peak_rss_bytes: int
    #: where the time went (ring building, host placement, links, ...), seconds.
    timings: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def all_nodes(self) -> list[str]:
        """Every node that took part, in order of first appearance."""
        seen: dict[str, None] = {}
        for phase in self.phases:
            seen.update(dict.fromkeys(phase.weights))
        return list(seen)

    def weights(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for phase in self.phases:
            out.update(phase.weights)
        return out


# --------------------------------------------------------------------------- arithmetic


def normalized(values: Mapping[str, float]) -> dict[str, float]:
    """``values`` scaled to sum to 1 (weights to weight shares)."""
    total = sum(values.values())
    if total <= 0:
        raise ValueError("cannot normalize values that sum to zero")
    return {node: value / total for node, value in values.items()}


def ratio(shares: Mapping[str, float], sender: str, receiver: str) -> float:
    """The fraction of ``sender``'s outgoing URLs that ``receiver`` should get: its share of what the sender
    does not own. With weights: ``w_j / (W - w_i)``; ``shares`` may be weights or any share vector."""
    total = sum(shares.values())
    rest = total - shares[sender]
    return shares[receiver] / rest if rest > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """URLs from ``sender`` to ``receiver`` in one phase, with every ratio that predicts them."""

    phase: int
    sender: str
    receiver: str
    urls: int
    row_total: int
    expected: float
    ring: float
    hosts: float
    popularity: float | None

    @property
    def measured(self) -> float:
        return self.urls / self.row_total if self.row_total else 0.0

    @property
    def deviation(self) -> float:
        return _rel(self.measured, self.expected)

    @property
    def key_part(self) -> float:
        return _rel(self.ring, self.expected)

    @property
    def host_part(self) -> float:
        return _rel(self.hosts, self.ring)

    @property
    def popularity_part(self) -> float:
        return _rel(self.measured, self.hosts)


def _rel(value: float, reference: float) -> float:
    return value / reference - 1.0 if reference > 0 else 0.0


def cells(phase: PhaseResult) -> Iterator[Cell]:
    """Every (sender, receiver) pair of distinct live nodes of ``phase``, senders and receivers in node order
    (a generator: a thousand nodes make a million cells)."""
    nodes = phase.nodes
    n = len(nodes)
    weights = {node: float(w) for node, w in phase.weights.items()}
    rows = phase.row_totals()
    pop = phase.popularity_shares
    for a, i in enumerate(nodes):
        for b, j in enumerate(nodes):
            if a == b:
                continue
            yield Cell(
                phase=phase.index, sender=i, receiver=j, urls=phase.sent[a * n + b], row_total=rows[i],
                expected=ratio(weights, i, j), ring=ratio(phase.key_shares, i, j),
                hosts=ratio(phase.host_shares, i, j), popularity=None if pop is None else ratio(pop, i, j),
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeDeviation:
    """A node as a receiver in one phase: URLs received against what each measure predicts, given what every
    sender actually sent (``sum_i sent_i * ratio(shares, i, node)``)."""

    phase: int
    node: str
    weight_share: float
    received: int
    expected: float
    ring: float
    hosts: float
    popularity: float | None

    @property
    def deviation(self) -> float:
        return _rel(self.received, self.expected)

    @property
    def key_part(self) -> float:
        return _rel(self.ring, self.expected)

    @property
    def host_part(self) -> float:
        return _rel(self.hosts, self.ring)

    @property
    def popularity_part(self) -> float:
        return _rel(self.received, self.hosts)

    @property
    def sampling_part(self) -> float | None:
        """Simulation only: measured against the exact popularity prediction (the law of large numbers)."""
        return None if self.popularity is None else _rel(self.received, self.popularity)


def _predicted(rows: Mapping[str, int], vector: Mapping[str, float]) -> dict[str, float]:
    """For every node j: ``sum over senders i != j of rows[i] * ratio(vector, i, j)``, in O(nodes)."""
    total = sum(vector.values())
    # ratio(vector, i, j) = v_j / (total - v_i): the sum over i != j is v_j * (S - rows[j] / (total - v_j)).
    per_sender = {i: rows[i] / (total - vector[i]) if total > vector[i] else 0.0 for i in rows}
    s = sum(per_sender.values())
    return {j: vector[j] * (s - per_sender[j]) for j in rows}


def node_deviations(phase: PhaseResult) -> list[NodeDeviation]:
    rows = phase.row_totals()
    received = phase.column_totals()
    weights = {node: float(w) for node, w in phase.weights.items()}
    shares = normalized(weights)
    expected = _predicted(rows, weights)
    ring_pred = _predicted(rows, phase.key_shares)
    hosts_pred = _predicted(rows, phase.host_shares)
    pop_pred = None if phase.popularity_shares is None else _predicted(rows, phase.popularity_shares)
    return [
        NodeDeviation(
            phase=phase.index, node=j, weight_share=shares[j], received=received[j], expected=expected[j],
            ring=ring_pred[j], hosts=hosts_pred[j], popularity=None if pop_pred is None else pop_pred[j],
        )
        for j in phase.nodes
    ]


def receiver_expected_shares(weights: Mapping[str, int], sent_by: Mapping[str, int]) -> dict[str, float]:
    """Each node's expected share of the URLs received by all nodes, given what each node sent."""
    rows = {node: sent_by.get(node, 0) for node in weights}
    total = sum(rows.values())
    if total == 0:
        return {node: 0.0 for node in weights}
    predicted = _predicted(rows, {node: float(v) for node, v in weights.items()})
    return {node: value / total for node, value in predicted.items()}


def rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


def phase_summary(phase: PhaseResult) -> dict[str, Any]:
    """The phase's headline: the largest and RMS relative deviation over receivers, and each part's."""
    devs = node_deviations(phase)

    def worst(attr: str) -> float:
        values = [getattr(d, attr) for d in devs]
        return max(values, key=abs) if values else 0.0

    out: dict[str, Any] = {
        "phase": phase.index, "name": phase.name, "urls_sent": phase.total_sent, "pages": phase.pages,
        "max_deviation": worst("deviation"), "max_key_part": worst("key_part"),
        "max_host_part": worst("host_part"), "max_popularity_part": worst("popularity_part"),
        "rms_deviation": rms([d.deviation for d in devs]), "rms_key_part": rms([d.key_part for d in devs]),
        "rms_host_part": rms([d.host_part for d in devs]),
        "rms_popularity_part": rms([d.popularity_part for d in devs]),
    }
    if phase.popularity_shares is not None:
        out["max_sampling_part"] = max((d.sampling_part or 0.0 for d in devs), key=abs, default=0.0)
        out["rms_sampling_part"] = rms([d.sampling_part or 0.0 for d in devs])
    return out
