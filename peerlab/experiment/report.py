"""The experiment's report: aligned text tables, CSV files, PNG plots and a deviation summary, in a run folder.

Files written to the run folder (``runs/<timestamp>-<plan name>/`` unless ``--out DIR``):

=====================  ==============================================================================
``report.txt``         what ``peerctl experiment`` prints: per phase the URL table and the deviation split
``plan.toml``          the effective plan (every setting; runs again as ``--plan runs/.../plan.toml``)
``plan.source.toml``   the plan text as given (comments kept; ``--set`` overrides not applied)
``sent-phaseK.csv``    URLs sent in phase K: one row per sender, one column per receiver
``cells.csv``          every (phase, sender, receiver): URLs, measured and predicted ratios, deviation parts
                       (left out above ``CELLS_CSV_MAX_NODES`` nodes: it would be millions of rows)
``nodes.csv``          every (phase, node): weight, key, host and popularity shares; URLs sent, received,
                       expected; deviation and its parts
``shares.csv``         every (sample, node): URLs sent and received since the previous sample, the node's
                       share of all URLs received, and the share the weights predict
``changes.csv``        every change: key space moved against the ideal, hosts moved, URLs moved or lost
``moved.csv``          every (change, previous owner, new owner): URLs moved between them
``handoff-pairs.csv``  cluster mode: every (change, sender, receiver): hand-off messages sent between them
``summary.json``       the headline figures, wall time and peak memory
``shares.png``         each node's share of URLs received over time, with the expected share dashed
``moved.png``          URLs moved at each change, by previous owner, against the ideal
``deviation.png``      per phase and node, the deviation split into key space, host count and popularity
=====================  ==============================================================================
"""

from __future__ import annotations

import csv
import json
import logging
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .plan import Plan, to_toml
from .results import (
    ChangeResult,
    ExperimentResult,
    NodeDeviation,
    PhaseResult,
    cells,
    node_deviations,
    normalized,
    phase_summary,
    ratio,
    receiver_expected_shares,
)

__all__ = [
    "CELLS_CSV_MAX_NODES",
    "PLOT_MAX_NODES",
    "PLOT_MIN_URLS",
    "TABLE_MAX_NODES",
    "default_run_dir",
    "format_report",
    "summary",
    "write_csvs",
    "write_plots",
    "write_run",
]

log = logging.getLogger(__name__)

#: Above this many nodes a phase's URL matrix is not printed (it is still in sent-phaseK.csv).
TABLE_MAX_NODES = 12
#: Above this many nodes cells.csv is not written: 200 nodes already make 40,000 rows per phase.
CELLS_CSV_MAX_NODES = 200
#: The row and column of the design's table for named nodes that stand for the rest of a large fleet.
OTHERS = "others"
#: Plots show at most this many nodes (the plan's named nodes first, then the largest deviations).
PLOT_MAX_NODES = 12
#: The share plot leaves out samples in which the nodes received fewer URLs than this: at the end of a live
#: crawl a sample holds one or two URLs, and shares of 0 and 1 would hide the curves (shares.csv keeps them).
PLOT_MIN_URLS = 20


def default_run_dir(plan: Plan, *, root: Path = Path("runs"), now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return root / f"{stamp}-{plan.name}"


# --------------------------------------------------------------------------- text


def _pct(value: float) -> str:
    return f"{value:.2%}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2%}"


def _design_ratio(values: Sequence[float]) -> str:
    """The design's form: ``1:2.50:0.50``, relative to the first receiver."""
    if not values or values[0] <= 0:
        return "-"
    return ":".join(["1"] + [f"{v / values[0]:.2f}" for v in values[1:]])


def _aligned(rows: list[list[str]], right_from: int = 1) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    out = []
    for row in rows:
        parts = [cell.ljust(widths[c]) if c < right_from else cell.rjust(widths[c]) for c, cell in enumerate(row)]
        out.append("  ".join(parts).rstrip())
    return out


def _phase_header(result: ExperimentResult, phase: PhaseResult) -> str:
    weights = " ".join(f"{n}={w}" for n, w in phase.weights.items()) if len(phase.weights) <= TABLE_MAX_NODES \
        else f"{len(phase.weights):,} nodes, total weight {sum(phase.weights.values()):,}"
    return (f"== phase {phase.index + 1} \"{phase.name}\" ({phase.start:,.0f}-{phase.end:,.0f} s): {weights}; "
            f"{phase.pages:,} pages, {phase.total_sent:,} URLs sent")


def _others_label(nodes: Sequence[str]) -> str:
    label = OTHERS
    while label in nodes:
        label += "*"
    return label


def _matrix_table(phase: PhaseResult, only: Sequence[str] | None = None) -> list[str]:
    """The design's table: URLs from each node to each other, with the ratio the weights promise beside the
    measured one; `only` restricts it to some nodes (the named ones of a large fleet) plus the rest of the fleet
    as one node (`others`: its weight, key and host shares summed, the URLs it sent to and received from the
    named nodes), the ratios then taken among them alone. Without the rest, named nodes holding a fraction of a
    percent of the ring each would send each other almost nothing (all zeros at 1,000 nodes)."""
    nodes = phase.nodes
    n = len(nodes)
    weights = {node: float(w) for node, w in phase.weights.items()}
    if only is not None:
        wanted = set(only)
        sub = [node for node in nodes if node in wanted]
        index = [nodes.index(node) for node in sub]
        rest = [k for k, node in enumerate(nodes) if node not in wanted]
        sent_map = {(sub[a], sub[b]): phase.sent[row_at * n + col_at]
                    for a, row_at in enumerate(index) for b, col_at in enumerate(index) if a != b}
        shown = list(sub)
        new_weights = {node: phase.weights[node] for node in sub}
        key_shares = {node: phase.key_shares[node] for node in sub}
        host_shares = {node: phase.host_shares[node] for node in sub}
        pop = None if phase.popularity_shares is None else {node: phase.popularity_shares[node] for node in sub}
        if rest:
            others_label = _others_label(nodes)
            shown.append(others_label)
            named = set(index)
            for a, row_at in enumerate(index):
                sent_row = phase.sent[row_at * n:(row_at + 1) * n]
                sent_map[(sub[a], others_label)] = sum(sent_row) - sum(sent_row[col_at] for col_at in index)
                sent_map[(others_label, sub[a])] = sum(phase.sent[k * n + row_at] for k in range(n) if k not in named)
            new_weights[others_label] = sum(phase.weights[nodes[k]] for k in rest)
            key_shares[others_label] = sum(phase.key_shares.get(nodes[k], 0.0) for k in rest)
            host_shares[others_label] = sum(phase.host_shares.get(nodes[k], 0.0) for k in rest)
            if pop is not None and phase.popularity_shares is not None:
                pop[others_label] = sum(phase.popularity_shares.get(nodes[k], 0.0) for k in rest)
        phase = PhaseResult(index=phase.index, name=phase.name, start=phase.start, end=phase.end,
                            pages=phase.pages, weights=new_weights, key_shares=key_shares, host_shares=host_shares,
                            popularity_shares=pop, sent=PhaseResult.matrix(shown, sent_map))
        return _matrix_table(phase)
    rows = [["from\\to", *nodes, "expected ratio", "measured ratio"]]
    for a, i in enumerate(nodes):
        others = [j for j in nodes if j != i]
        rows.append([i, *("-" if a == b else f"{phase.sent[a * n + b]:,}" for b in range(n)),
                     _design_ratio([ratio(weights, i, j) for j in others]),
                     _design_ratio([float(phase.sent[a * n + nodes.index(j)]) for j in others])])
    lines = _aligned(rows)
    lines.append("")
    lines.append("share of each sender's URLs: measured (expected from the weights) and the deviation")
    share_rows = [["from\\to", *nodes]]
    by_pair = {(c.sender, c.receiver): c for c in cells(phase)}
    for i in nodes:
        row = [i]
        for j in nodes:
            if i == j:
                row.append("-")
            else:
                c = by_pair[(i, j)]
                row.append(f"{c.measured:.1%} ({c.expected:.1%}) {c.deviation:+.1%}")
        share_rows.append(row)
    lines += _aligned(share_rows)
    return lines


def _deviation_table(devs: Sequence[NodeDeviation], simulated: bool) -> list[str]:
    head = ["receiver", "weight", "received", "expected", "deviation", "key space", "host count",
            "popularity" if simulated else "links"]
    if simulated:
        head.append("(sampling)")
    rows = [head]
    for d in devs:
        row = [d.node, _pct(d.weight_share), f"{d.received:,}", f"{d.expected:,.0f}", _signed(d.deviation),
               _signed(d.key_part), _signed(d.host_part), _signed(d.popularity_part)]
        if simulated:
            row.append(_signed(d.sampling_part))
        rows.append(row)
    return _aligned(rows)


def _worst(devs: Sequence[NodeDeviation], attr: str) -> NodeDeviation:
    return max(devs, key=lambda d: abs(getattr(d, attr) or 0.0))


def format_report(result: ExperimentResult) -> str:
    """The whole report as text: one block per phase and change, then the summary."""
    plan = result.plan
    web = plan.web
    simulated = result.mode == "simulate"
    lines = [
        (f"ring-rebalance experiment \"{plan.name}\" ({result.mode}), seed {plan.seed}, "
         f"{plan.points_per_weight} ring points per unit of weight"),
        (f"web: {web.hosts:,} hosts, {web.links_per_page} links per page ({web.internal_links:.0%} internal), "
         f"popularity exponent {web.popularity:g}"),
    ]
    lines += [f"note: {note}" for note in result.notes]
    changes = {c.phase: c for c in result.changes}
    for phase in result.phases:
        change = changes.get(phase.index)
        if change is not None:
            lines += ["", _change_line(change)]
        lines += ["", _phase_header(result, phase)]
        if len(phase.weights) <= TABLE_MAX_NODES:
            lines += _matrix_table(phase)
            lines.append("")
        else:
            lines.append(f"({len(phase.weights):,} nodes: the URL matrix is in sent-phase{phase.index + 1}.csv; "
                         f"shown: the {TABLE_MAX_NODES} receivers that deviate most, then the plan's named nodes)")
            named = [node for node in _named_nodes(plan) if node in phase.weights]
            if named:
                rest = len(phase.weights) - len(named)
                lines.append(f"the design's table for the named nodes ({', '.join(named)}) and the other {rest:,} "
                             f"nodes as one ({_others_label(phase.nodes)}): URLs sent between them, the ratios "
                             "taken among them alone")
                lines += _matrix_table(phase, only=named)
                lines.append("")
        devs = node_deviations(phase)
        shown = devs
        if len(devs) > TABLE_MAX_NODES:
            named = _named_nodes(plan)
            shown = sorted(devs, key=lambda d: -abs(d.deviation))[:TABLE_MAX_NODES]
            shown += [d for d in devs if d.node in named and d not in shown]
        lines.append("URLs received against the weights, and the deviation split (relative; the parts multiply: "
                     f"(1+key)(1+hosts)(1+{'popularity' if simulated else 'links'}) = 1+deviation)")
        lines += _deviation_table(shown, simulated)
    lines += ["", "== summary"]
    for phase in result.phases:
        lines.append(_summary_line(phase, simulated))
    for change in result.changes:
        lines.append(_change_line(change))
    lines += _cost_table(result.changes)
    lines.append(f"wall time {result.wall_seconds:.1f} s, peak memory {result.peak_rss_bytes / 2**20:,.0f} MiB"
                 + (" (this process; the nodes are separate processes)" if result.mode == "live" else "")
                 + ("; " + ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items()) if result.timings
                    else ""))
    return "\n".join(lines) + "\n"


def _summary_line(phase: PhaseResult, simulated: bool) -> str:
    devs = node_deviations(phase)
    if not devs or not phase.total_sent:
        return f"phase {phase.index + 1} \"{phase.name}\": no URLs sent"
    worst = _worst(devs, "deviation")
    parts = [f"key space {_signed(_worst(devs, 'key_part').key_part)}",
             f"host count {_signed(_worst(devs, 'host_part').host_part)}",
             f"{'popularity' if simulated else 'links'} {_signed(_worst(devs, 'popularity_part').popularity_part)}"]
    if simulated:
        parts.append(f"of which sampling {_signed(_worst(devs, 'sampling_part').sampling_part)}")
    line = (f"phase {phase.index + 1} \"{phase.name}\": largest deviation {_signed(worst.deviation)} ({worst.node}); "
            f"largest part by cause: " + ", ".join(parts))
    if len(devs) > TABLE_MAX_NODES:
        line += (f"; median |deviation| {statistics.median(abs(d.deviation) for d in devs):.2%} (key space "
                 f"{statistics.median(abs(d.key_part) for d in devs):.2%}, popularity "
                 f"{statistics.median(abs(d.popularity_part) for d in devs):.2%})")
    return line


def _change_line(change: Any) -> str:
    ideal_ratio = change.moved_keyspace / change.ideal_keyspace if change.ideal_keyspace else 0.0
    line = (f"-- change \"{change.name}\" at {change.time:,.0f} s ({', '.join(change.actions)}): key space moved "
            f"{_pct(change.moved_keyspace)} (ideal {_pct(change.ideal_keyspace)}, x{ideal_ratio:.3f}); ")
    if change.hosts_total:
        line += f"hosts moved {change.hosts_moved:,} of {change.hosts_total:,}; "
    if change.settle_seconds:  # live: queues grow while the cluster settles, so "of what was held" means little
        line += f"URLs handed off {change.urls_moved:,} (queued at the change: {change.urls_held:,})"
    else:
        line += f"URLs moved {change.urls_moved:,}"
        if change.urls_held:
            line += f" of {change.urls_held:,} held (ideal {change.ideal_urls:,.0f})"
    if change.urls_lost:
        line += f", lost with a killed node {change.urls_lost:,}"
    if change.settle_seconds:
        line += (f"; settled in {change.settle_seconds:.1f} s, {change.transition_urls:,} URLs sent meanwhile "
                 "(in no phase)")
    return line


def _cost_table(changes: Sequence[ChangeResult]) -> list[str]:
    """Cluster mode: what each view change cost per node, beside the crawl's own rate in the phase before."""
    costs = [(c, c.cost) for c in changes if c.cost is not None]
    if not costs:
        return []
    lines = ["", "what each view change cost, per node (from the change until every node settled), beside the "
                 "phase before it per virtual second",
             f"{'change':<24} {'nodes':>6} {'settle s':>8} {'hand-off msgs':>13} {'pairs':>7} {'changed':>7} "
             f"{'stray':>5} {'messages':>9} {'KiB':>8} {'CPU ms':>7} {'loop ms':>7} | {'msgs/s':>7} {'KiB/s':>7} "
             f"{'CPU ms/s':>8} {'loop ms/s':>9}",
             "(loop: of the CPU, trio's run loop outside the nodes' tasks, sampled: n nodes' timers in one process)"]
    for change, cost in costs:
        lines.append(
            f"{change.name[:24]:<24} {cost.nodes:>6,} {cost.seconds:>8.1f} "
            f"{cost.per_node(cost.handoff_messages):>13.2f} {cost.handoff_pairs:>7,} {cost.changed_nodes:>7,} "
            f"{cost.handoff_stray:>5,} "
            f"{cost.per_node(cost.messages):>9.1f} {cost.per_node(cost.bytes) / 1024:>8.1f} "
            f"{cost.per_node(cost.cpu_seconds) * 1e3:>7.1f} {cost.per_node(cost.loop_cpu_seconds) * 1e3:>7.1f} | "
            f"{cost.phase_messages:>7.1f} {cost.phase_bytes / 1024:>7.1f} {cost.phase_cpu * 1e3:>8.2f} "
            f"{cost.phase_loop_cpu * 1e3:>9.2f}")
    for change, cost in costs:
        if not cost.sent_by_kind:
            continue
        lines += ["", f"{change.name}: sent per node by kind, from the change until every node settled, beside the "
                      f"phase before's rate over as many virtual seconds ({cost.seconds:.1f})",
                  f"{'kind':<32} {'messages':>9} {'KiB':>8} | {'phase msgs':>10} {'phase KiB':>9}"]
        for kind, (n, size) in cost.sent_by_kind.items():
            rate_n, rate_bytes = cost.phase_sent_by_kind.get(kind, (0.0, 0.0))
            lines.append(f"{kind[:32]:<32} {cost.per_node(n):>9.2f} {cost.per_node(size) / 1024:>8.2f} | "
                         f"{rate_n * cost.seconds:>10.2f} {rate_bytes * cost.seconds / 1024:>9.2f}")
        if cost.dialled_for:
            dialled = cost.per_node(sum(cost.dialled_for.values()))
            lines.append(f"connections dialled per node, by the first message written on them: {dialled:.2f} ("
                         + ", ".join(f"{kind} {cost.per_node(n):.2f}" for kind, n in cost.dialled_for.items()) + ")")
    return lines


# --------------------------------------------------------------------------- files


def _write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _f(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def write_csvs(result: ExperimentResult, out: Path) -> list[Path]:
    written = []
    for phase in result.phases:
        nodes = phase.nodes
        n = len(nodes)
        path = out / f"sent-phase{phase.index + 1}.csv"
        _write_csv(path, ["from\\to", *nodes],
                   ([i, *(phase.sent[a * n + b] for b in range(n))] for a, i in enumerate(nodes)))
        written.append(path)
    if max(len(p.weights) for p in result.phases) <= CELLS_CSV_MAX_NODES:
        path = out / "cells.csv"
        _write_csv(path, ["phase", "phase_name", "sender", "receiver", "urls", "sender_total", "measured",
                          "expected", "ring", "hosts", "popularity", "deviation", "key_part", "host_part",
                          "popularity_part"],
                   ([c.phase + 1, p.name, c.sender, c.receiver, c.urls, c.row_total, _f(c.measured), _f(c.expected),
                     _f(c.ring), _f(c.hosts), _f(c.popularity), _f(c.deviation), _f(c.key_part), _f(c.host_part),
                     _f(c.popularity_part)] for p in result.phases for c in cells(p)))
        written.append(path)
    path = out / "nodes.csv"

    def node_rows() -> Iterable[list[Any]]:
        for p in result.phases:
            shares = normalized({k: float(v) for k, v in p.weights.items()})
            sent = p.row_totals()
            for d in node_deviations(p):
                pop = None if p.popularity_shares is None else p.popularity_shares[d.node]
                kept = None if p.kept is None else p.kept[d.node]
                yield [p.index + 1, p.name, d.node, p.weights[d.node], _f(shares[d.node]), _f(p.key_shares[d.node]),
                       _f(p.host_shares[d.node]), _f(pop), sent[d.node], "" if kept is None else kept, d.received,
                       _f(d.expected), _f(d.deviation), _f(d.key_part), _f(d.host_part), _f(d.popularity_part),
                       _f(d.sampling_part)]

    _write_csv(path, ["phase", "phase_name", "node", "weight", "weight_share", "key_share", "host_share",
                      "popularity_share", "sent", "kept", "received", "expected", "deviation", "key_part",
                      "host_part", "popularity_part", "sampling_part"], node_rows())
    written.append(path)
    path = out / "shares.csv"

    def share_rows() -> Iterable[list[Any]]:
        for s in result.samples:
            weights = result.phases[s.phase].weights
            total = sum(s.received_by.get(node, 0) for node in weights)
            expected = receiver_expected_shares(weights, s.sent_by)
            for node in weights:
                received = s.received_by.get(node, 0)
                yield [f"{s.time:.3f}", s.phase + 1, node, s.sent_by.get(node, 0), received,
                       _f(received / total if total else 0.0), _f(expected[node])]

    _write_csv(path, ["time", "phase", "node", "sent", "received", "share", "expected_share"], share_rows())
    written.append(path)
    path = out / "changes.csv"
    _write_csv(path, ["phase", "name", "time", "actions", "ideal_keyspace", "moved_keyspace", "hosts_moved",
                      "hosts_total", "urls_held", "urls_moved", "urls_lost", "ideal_urls", "settle_seconds",
                      "transition_urls", "nodes", "handoff_messages", "handoff_pairs", "changed_nodes",
                      "handoff_stray", "messages", "bytes", "cpu_seconds", "phase_messages_per_node_s",
                      "phase_bytes_per_node_s", "phase_cpu_per_node_s", "loop_cpu_seconds",
                      "phase_loop_cpu_per_node_s"],
               ([c.phase + 1, c.name, f"{c.time:.3f}", "; ".join(c.actions), _f(c.ideal_keyspace),
                 _f(c.moved_keyspace), c.hosts_moved, c.hosts_total, c.urls_held, c.urls_moved, c.urls_lost,
                 _f(c.ideal_urls), f"{c.settle_seconds:.3f}", c.transition_urls,
                 *((c.cost.nodes, c.cost.handoff_messages, c.cost.handoff_pairs, c.cost.changed_nodes,
                    c.cost.handoff_stray, c.cost.messages, c.cost.bytes, f"{c.cost.cpu_seconds:.3f}",
                    _f(c.cost.phase_messages), _f(c.cost.phase_bytes), _f(c.cost.phase_cpu),
                    f"{c.cost.loop_cpu_seconds:.3f}", _f(c.cost.phase_loop_cpu))
                   if c.cost is not None else ("",) * 13)]
                for c in result.changes))
    written.append(path)
    if any(c.cost is not None for c in result.changes):
        path = out / "handoff-pairs.csv"
        _write_csv(path, ["phase", "name", "from", "to", "handoff_messages"],
                   ([c.phase + 1, c.name, a, b, n] for c in result.changes if c.cost is not None
                    for (a, b), n in sorted(c.cost.handoff_by_pair.items())))
        written.append(path)
    path = out / "moved.csv"
    _write_csv(path, ["phase", "name", "from", "to", "urls"],
               ([c.phase + 1, c.name, a, b, n] for c in result.changes for (a, b), n in c.by_pair.items()))
    written.append(path)
    return written


def summary(result: ExperimentResult) -> dict[str, Any]:
    """The headline figures as JSON-ready data."""
    return {
        "plan": result.plan.name,
        "mode": result.mode,
        "seed": result.plan.seed,
        "points_per_weight": result.plan.points_per_weight,
        "hosts": result.plan.web.hosts,
        "nodes": len(result.all_nodes()),
        "wall_seconds": round(result.wall_seconds, 3),
        "peak_rss_bytes": result.peak_rss_bytes,
        "timings": {k: round(v, 3) for k, v in result.timings.items()},
        "notes": list(result.notes),
        "phases": [
            {**phase_summary(p), "start": p.start, "end": p.end,
             "received": p.column_totals(), "sent": p.row_totals()}
            for p in result.phases
        ],
        "changes": [
            {"phase": c.phase + 1, "name": c.name, "time": c.time, "actions": list(c.actions),
             "ideal_keyspace": c.ideal_keyspace, "moved_keyspace": c.moved_keyspace, "hosts_moved": c.hosts_moved,
             "hosts_total": c.hosts_total, "urls_held": c.urls_held, "urls_moved": c.urls_moved,
             "urls_lost": c.urls_lost, "settle_seconds": c.settle_seconds, "transition_urls": c.transition_urls,
             **({"cost": {"nodes": c.cost.nodes, "handoff_messages": c.cost.handoff_messages,
                          "handoff_pairs": c.cost.handoff_pairs, "changed_nodes": c.cost.changed_nodes,
                          "handoff_stray": c.cost.handoff_stray, "messages": c.cost.messages, "bytes": c.cost.bytes,
                          "cpu_seconds": round(c.cost.cpu_seconds, 3), "phase_messages": c.cost.phase_messages,
                          "phase_bytes": c.cost.phase_bytes, "phase_cpu": c.cost.phase_cpu,
                          "loop_cpu_seconds": round(c.cost.loop_cpu_seconds, 3),
                          "phase_loop_cpu": c.cost.phase_loop_cpu,
                          "sent_by_kind": {kind: list(v) for kind, v in c.cost.sent_by_kind.items()},
                          "phase_sent_by_kind": {kind: list(v) for kind, v in c.cost.phase_sent_by_kind.items()},
                          "dialled_for": dict(c.cost.dialled_for)}}
                if c.cost is not None else {})}
            for c in result.changes
        ],
    }


# --------------------------------------------------------------------------- plots


def _named_nodes(plan: Plan) -> list[str]:
    """Nodes the plan names itself (``[nodes]`` and additions), as opposed to the generated fleet."""
    return [node for node, _ in plan.nodes] + [node for p in plan.phases for node, _ in p.add]


def _plot_nodes(result: ExperimentResult) -> list[str]:
    """The nodes the plots show: the plan's named nodes, then those that deviate most."""
    named = _named_nodes(result.plan)
    everyone = result.all_nodes()
    if len(everyone) <= PLOT_MAX_NODES:
        return everyone
    chosen = [node for node in named if node in everyone][:PLOT_MAX_NODES]
    worst: dict[str, float] = {}
    for p in result.phases:
        for d in node_deviations(p):
            worst[d.node] = max(worst.get(d.node, 0.0), abs(d.deviation))
    for node in sorted(worst, key=lambda x: -worst[x]):
        if len(chosen) >= PLOT_MAX_NODES:
            break
        if node not in chosen:
            chosen.append(node)
    return chosen


def write_plots(result: ExperimentResult, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = _plot_nodes(result)
    colours = {node: plt.get_cmap("tab20")(i % 20) for i, node in enumerate(shown)}
    title_tail = f" ({len(shown)} of {len(result.all_nodes()):,} nodes)" if len(shown) < len(result.all_nodes()) \
        else ""
    written = []

    many = len(result.all_nodes()) > PLOT_MAX_NODES
    fig, ax = plt.subplots(figsize=(10, 5.5), layout="constrained")
    # one line per node and phase: a change breaks the lines (and a live cluster's settling is shaded)
    series: dict[tuple[str, int], tuple[list[float], list[float], list[float]]] = {}
    for s in result.samples:
        weights = result.phases[s.phase].weights
        total = sum(s.received_by.get(node, 0) for node in weights)
        expected = receiver_expected_shares(weights, s.sent_by)
        for node in shown:
            if node in weights and total >= PLOT_MIN_URLS:
                xs, ys, es = series.setdefault((node, s.phase), ([], [], []))
                xs.append(s.time)
                ys.append(s.received_by.get(node, 0) / total)
                es.append(expected[node])
    labelled: set[str] = set()
    for (node, _), (xs, ys, es) in series.items():
        label = None if node in labelled else f"{node} (w={result.weights()[node]})"
        labelled.add(node)
        ax.plot(xs, ys, marker=".", color=colours[node], label=label)
        ax.plot(xs, es, linestyle="--", color=colours[node], alpha=0.7)
    for c in result.changes:
        ax.axvline(c.time, color="grey", linewidth=0.8)
        if c.settle_seconds:
            ax.axvspan(c.time, result.phases[c.phase].start, color="grey", alpha=0.15, linewidth=0)
        ax.annotate(c.name, (c.time, 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                    fontsize=8)
    ax.set_xlabel("seconds since the start" + (" (simulated)" if result.mode == "simulate" else ""))
    ax.set_ylabel("share of URLs received" + (" (log scale)" if many else ""))
    ax.set_title(f"{result.plan.name}: each node's share of URLs received (dashed: expected){title_tail}")
    if many:
        ax.set_yscale("log")  # a thousand small shares beside a few popular owners
    else:
        ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    path = out / "shares.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    labels = [f"{c.name}\n({', '.join(c.actions)})" for c in result.changes]
    if result.changes:
        segments: dict[str, list[float]] = {}
        for index, c in enumerate(result.changes):
            killed = {action.split(" ", 1)[1] for action in c.actions if action.startswith("kill ")}
            for (src, dst), count in c.by_pair.items():
                if src in killed:
                    label = "lost with a killed node"
                elif not src:  # live: counted by the receiver
                    label = f"to {dst}" if dst in colours else "to other nodes"
                else:
                    label = f"from {src}" if src in colours else "from other nodes"
                segments.setdefault(label, [0.0] * len(result.changes))[index] += count
        bottoms = [0.0] * len(result.changes)
        for label, heights in segments.items():
            src = label.removeprefix("from ").removeprefix("to ")
            ax.bar(range(len(labels)), heights, bottom=bottoms, label=label, color=colours.get(src, "lightgrey"),
                   hatch="//" if label.startswith("lost") else None)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        ax.scatter(range(len(labels)), [c.ideal_urls for c in result.changes], marker="_", s=900, color="black",
                   zorder=3, label="ideal (ideal key space x URLs held)")
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.legend(fontsize=8, ncols=2 if len(segments) > 6 else 1)
    else:
        ax.text(0.5, 0.5, "no change in this plan", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("URLs moved (lost, for a killed node)")
    ax.set_title(f"{result.plan.name}: URLs moved at each change")
    path = out / "moved.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, len(result.phases), figsize=(4 + 3.2 * len(result.phases), 4.5), squeeze=False,
                             layout="constrained")
    for ax, phase in zip(axes[0], result.phases):
        devs = [d for d in node_deviations(phase) if d.node in shown]
        positions = list(range(len(devs)))
        width = 0.2
        for offset, (label, attr) in enumerate((("total", "deviation"), ("key space", "key_part"),
                                                ("host count", "host_part"), ("popularity", "popularity_part"))):
            ax.bar([x + (offset - 1.5) * width for x in positions], [100 * getattr(d, attr) for d in devs], width,
                   label=label)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(positions, [d.node for d in devs], fontsize=8, rotation=90 if len(devs) > 6 else 0)
        ax.set_title(f"phase {phase.index + 1}: {phase.name}", fontsize=9)
        ax.set_ylabel("% of the expected URLs")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{result.plan.name}: deviation of URLs received, by cause{title_tail}")
    path = out / "deviation.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written


def write_run(result: ExperimentResult, out: Path, *, source_text: str | None = None,
              plots: bool = True) -> tuple[str, list[Path]]:
    """Write every file of the run folder ``out`` (created if needed); returns the report text and the files."""
    out.mkdir(parents=True, exist_ok=True)
    text = format_report(result)
    written = []
    for name, content in (("report.txt", text), ("plan.toml", to_toml(result.plan))):
        (out / name).write_text(content, encoding="utf-8")
        written.append(out / name)
    if source_text is not None:
        (out / "plan.source.toml").write_text(source_text, encoding="utf-8")
        written.append(out / "plan.source.toml")
    written += write_csvs(result, out)
    (out / "summary.json").write_text(json.dumps(summary(result), indent=1, default=_json_default) + "\n",
                                      encoding="utf-8")
    written.append(out / "summary.json")
    if plots:
        written += write_plots(result, out)
    return text, written


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"cannot write {value!r} as JSON")

