"""``peerctl ring``: the ring-rebalance experiment, in simulation.

``--node NAME=WEIGHT`` describes a cluster; ``--remove NAME`` and ``--add NAME=WEIGHT`` (in the order given)
change it. For each stage it prints every node's weight share, key-space share and share of N random host
names, and for each change how much moved against the ideal and how much moved needlessly (always 0).
``--json`` prints the stable form documented in docs/ring.md. The live-cluster form of ``peerctl ring`` will sit
beside this one; the ``--node`` form stays the simulation.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

import ring

__all__ = ["add_arguments", "run"]

_EXAMPLE = (
    "example: peerctl ring --node A=150 --node B=80 --node C=200 --node D=40 --remove C --add E=300 "
    "--hosts 1000000"
)


def _node_weight(text: str) -> tuple[str, int]:
    name, sep, weight = text.partition("=")
    if not sep or not name or not weight.isdigit() or int(weight) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=WEIGHT with an integer weight >= 1, got {text!r}")
    return name, int(weight)


class _Change(argparse.Action):
    """Collects --add and --remove into one list, keeping their command-line order."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        changes = list(getattr(namespace, self.dest, None) or [])
        if option_string == "--add":
            name, weight = values
            changes.append(ring.AddNode(node_id=name, weight=weight))
        else:
            changes.append(ring.RemoveNode(node_id=values))
        setattr(namespace, self.dest, changes)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``peerctl ring`` simulation options to ``parser``."""
    parser.description = (
        "Simulate the weighted ring: shares per node and keys moved per change. " + _EXAMPLE
    )
    parser.add_argument("--node", action="append", type=_node_weight, default=[], metavar="NAME=WEIGHT",
                        help="a node of the initial cluster (repeat)")
    parser.add_argument("--remove", action=_Change, dest="changes", metavar="NAME",
                        help="then remove this node (repeatable; applied in command-line order with --add)")
    parser.add_argument("--add", action=_Change, dest="changes", type=_node_weight, metavar="NAME=WEIGHT",
                        help="then add this node (repeatable; applied in command-line order with --remove)")
    parser.add_argument("--hosts", type=int, default=1_000_000, metavar="N",
                        help="random host names to place (default 1,000,000; 0 skips the sample)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the host-name generator (default 1)")
    parser.add_argument("--points-per-weight", type=_positive, default=ring.DEFAULT_POINTS_PER_WEIGHT,
                        metavar="P", help=f"ring points per unit of weight (default {ring.DEFAULT_POINTS_PER_WEIGHT},"
                        " the cluster's setting)")
    parser.add_argument("--json", action="store_true", help="print JSON (keys documented in docs/ring.md)")


def run(args: argparse.Namespace) -> int:
    """Run the simulation described by ``args``; 0 on success, 2 on a bad request (one line on stderr)."""
    nodes: dict[str, int] = {}
    for name, weight in args.node:
        if name in nodes:
            print(f"peerctl ring: node {name!r} is given twice", file=sys.stderr)
            return 2
        nodes[name] = weight
    if not nodes:
        print(f"peerctl ring: give at least one --node NAME=WEIGHT ({_EXAMPLE})", file=sys.stderr)
        return 2
    if args.hosts < 0:
        print(f"peerctl ring: --hosts must be >= 0, got {args.hosts}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        report = ring.simulate(nodes, args.changes or [], hosts=args.hosts, rng=random.Random(args.seed),
                               points_per_weight=args.points_per_weight)
    except ValueError as exc:
        print(f"peerctl ring: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    if args.json:
        document = report.to_json()
        document["seed"] = args.seed
        document["elapsed_seconds"] = round(elapsed, 3)
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_table(report, seed=args.seed, elapsed=elapsed))
    return 0


def format_table(report: ring.SimulationReport, *, seed: int, elapsed: float) -> str:
    """The report as a table for people."""
    lines = [f"ring simulation: {report.points_per_weight} points per weight, {report.hosts:,} random hosts "
             f"(seed {seed}), {elapsed:.1f} s"]
    for stage in report.stages:
        lines.append("")
        lines.append(f"== {stage.label}: total weight {stage.total_weight:,}, {stage.points:,} points")
        lines.append(f"{'node':<16} {'weight':>7} {'weight%':>8} {'keys%':>8} {'err':>7} {'hosts%':>8} {'err':>7}")
        for node in stage.nodes:
            lines.append(
                f"{node.node_id:<16} {node.weight:>7} {node.weight_share:>8.3%} {node.key_share:>8.3%} "
                f"{node.key_error:>+7.2%} {node.host_share:>8.3%} {node.host_error:>+7.2%}"
            )
        change = stage.change
        if change is not None:
            ratio = change.moved_keyspace / change.ideal if change.ideal else 0.0
            lines.append(
                f"moved: keys {change.moved_keyspace:.3%} vs ideal {change.ideal:.3%} (x{ratio:.4f}), hosts "
                f"{change.moved_host_share:.3%}; unnecessary: keys {change.unnecessary_keyspace:.3%}, "
                f"hosts {change.unnecessary_hosts}"
            )
    lines.append("")
    lines.append(f"max |error|: keys {report.max_key_error:.2%}, hosts {report.max_host_error:.2%}; "
                 f"unnecessary moves: {report.unnecessary_moves}")
    return "\n".join(lines) + "\n"
