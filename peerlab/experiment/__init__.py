"""``peerctl experiment``: the design's ring-rebalance experiment, simulated or live.

A plan (TOML, ``plan.py``) names the nodes and weights, the changes (add, remove gracefully, kill) with their
triggers, the web and the mode. ``simulate`` runs it on the real ring over a synthetic web with Zipf host
popularity, without processes or network; ``cluster`` runs the real nodes (membership, dispatch, hand-off) in one process over an
in-memory network in virtual time; ``live`` runs real ``peerd`` processes on loopback against the local
web. All three give, per phase, the URLs sent from each node to each other node against the ratios the weights
promise, and split the deviation into the ring's key-space error, the host count and host popularity
(``results.py``); ``report.py`` writes the tables, CSV files and plots into a run folder.

    peerctl experiment                                  # the design's plan (bundled), simulated
    peerctl experiment --plan my.toml --out runs/mine   # your plan, into a folder of your choice
    peerctl experiment --set web.hosts=10000000 --set fleet.count=996 --set points_per_weight=50
    peerctl experiment --plan live-small                # real peerd processes on loopback, 400 hosts
    peerctl experiment --plan live-wide                 # the same on 4,000 hosts: shares within a few percent
    peerctl experiment --plan demo --out runs/demo      # the demo's plan: a web with features, WARC files kept
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path

from .plan import (
    BUNDLED_PLANS,
    Dispatch,
    End,
    Fleet,
    LiveSettings,
    Phase,
    Plan,
    PlanError,
    SimulateSettings,
    Web,
    bundled_plan_text,
    load_plan,
    parse_plan,
    to_toml,
)
from .report import default_run_dir, format_report, write_run
from .results import ChangeCost, ChangeResult, ExperimentResult, PhaseResult, Sample, node_deviations, ratio
from .cluster import ClusterRunError, run_cluster
from .simulate import run_simulation

__all__ = [
    "BUNDLED_PLANS",
    "ChangeCost",
    "ChangeResult",
    "ClusterRunError",
    "Dispatch",
    "End",
    "ExperimentResult",
    "Fleet",
    "LiveSettings",
    "Phase",
    "PhaseResult",
    "Plan",
    "PlanError",
    "Sample",
    "SimulateSettings",
    "Web",
    "add_arguments",
    "bundled_plan_text",
    "default_run_dir",
    "format_report",
    "load_plan",
    "node_deviations",
    "parse_plan",
    "ratio",
    "run",
    "run_cluster",
    "run_simulation",
    "to_toml",
    "write_run",
]

log = logging.getLogger(__name__)

_EXAMPLE = "example: peerctl experiment --plan design --set web.hosts=1000000 --out runs/design-1m"


def _override(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. web.hosts=1000000), got {text!r}")
    return key.strip(), value.strip()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``peerctl experiment`` options to ``parser``."""
    parser.description = ("Run the ring-rebalance experiment of a plan (simulated or with live nodes) and write "
                          "its tables, CSV files and plots into a run folder. " + _EXAMPLE)
    parser.add_argument("--plan", default="design", metavar="FILE|NAME",
                        help=f"plan TOML file, or a bundled plan: {', '.join(sorted(BUNDLED_PLANS))} "
                        "(default design: the original design's A=150 B=80 C=200 D=40, C removed, E=300 added)")
    parser.add_argument("--mode", choices=["simulate", "cluster", "live"],
                        help="override the plan's mode: simulate (the ring's arithmetic), cluster (real nodes "
                        "simulated in one process, in virtual time), live (peerd processes)")
    parser.add_argument("--set", dest="overrides", action="append", type=_override, default=[],
                        metavar="KEY=VALUE", help="override a plan setting, value in TOML (repeatable; e.g. "
                        "web.hosts=10000000, fleet.count=996, points_per_weight=50)")
    parser.add_argument("--out", metavar="DIR", help="run folder (default runs/<timestamp>-<plan name>/)")
    parser.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG plots")
    parser.add_argument("--show-plan", action="store_true",
                        help="print the effective plan (every setting) as TOML and exit")
    parser.add_argument("--quiet", action="store_true", help="print only the run folder, not the report")


def run(args: argparse.Namespace) -> int:
    """Run the experiment of ``args``; 0 on success, 2 on a bad plan (one line on stderr)."""
    overrides = dict(args.overrides or [])
    if getattr(args, "mode", None):
        overrides["mode"] = f'"{args.mode}"'
    try:
        plan, _ = load_plan(args.plan, overrides=overrides)
        source = bundled_plan_text(args.plan) if args.plan in BUNDLED_PLANS else Path(args.plan).read_text(
            encoding="utf-8")
    except PlanError as exc:
        print(f"peerctl experiment: {exc}", file=sys.stderr)
        return 2
    if args.show_plan:
        sys.stdout.write(to_toml(plan))
        return 0
    if args.plots and importlib.util.find_spec("matplotlib") is None:
        print("peerctl experiment: the plots need matplotlib (a dependency of peercrawl: pip install matplotlib); or give --no-plots",
              file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else default_run_dir(plan)
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        if plan.mode == "simulate":
            result = run_simulation(plan, progress=progress)
        elif plan.mode == "cluster":
            try:
                result = run_cluster(plan, progress=progress)
            except ClusterRunError as exc:
                print(f"peerctl experiment: {exc}", file=sys.stderr)
                return 1
        else:
            from .live import LiveError, run_live

            try:
                result = run_live(plan, out, progress=progress)
            except LiveError as exc:
                print(f"peerctl experiment: {exc}", file=sys.stderr)
                return 1
    except PlanError as exc:
        print(f"peerctl experiment: {exc}", file=sys.stderr)
        return 2
    text, _ = write_run(result, out, source_text=source, plots=args.plots)
    if not args.quiet:
        sys.stdout.write(text)
    print(f"run folder: {out}", file=sys.stdout if args.quiet else sys.stderr)
    return 0
