"""The design's experiment on simulated ``Cluster`` nodes (``peerctl experiment --mode cluster``) at growing sizes:
what one node pays per view change and per second of crawl, against the smallest size of the same series (the
sizes run in the order given; the tables list them by size).

Run: ``python -m tests.bench.bench_experiment_scale [--sizes 100 200 500 1000] [--json FILE] [--out DIR]
[--nice 10] [--end-at 900]``; ``--table FILE...`` prints the tables of ``--json`` files again (the rows of several
runs together). Each run's progress lines and report go to ``nN.log`` beside its folder as they come.

Each size n is one run of the experiment in its own process (niced): nodes A-D and n - 4 generated ones (weights
40-300 from the seed), 10 points per weight, 100,000 hosts, one page per virtual second per node, the design's
times at 0.02 (C leaves at 12 virtual s, E joins at 15.6, the end at 18), a dispatch tick of 50 ms::

    peerctl experiment --mode cluster --set fleet.count=N-4 --set points_per_weight=10 --set web.hosts=100000 \\
        --set simulate.pages_per_second=N --set cluster.time_scale=0.02 --set dispatch.interval=0.05 \\
        --set cluster.seeds=0.64N --set end.at=900 --no-plots

64 seed hosts per 100 nodes (the same seeds per node at every size): with a fixed 64 the larger cluster's crawl
fans out from fewer seeds per node and is younger when the changes come, so its change would also pay for a
crawl still opening its first connections.

Per node, from each run's ``summary.json``: for each view change (from the change until every node settled) the
hand-off messages, every message received, KiB written and CPU ms of the simulating process; the ordered pairs that
exchanged hand-off messages, the nodes whose arcs changed and the hand-off messages between nodes sharing no moved
arc (``stray``: 0 when the hand-off stays between the previous and the new owners of moved arcs); and the crawl's
own rate in the phase before the leave (messages, KiB, CPU ms per node per virtual second), and what each change
cost beyond that rate over its settle ("beyond": the change's own work, since the crawl goes on meanwhile and the
settle takes longer in a larger cluster); and of each CPU figure, the part spent in trio's run loop outside the
nodes' tasks (sampled, ``peerlab/experiment/loopshare.py``): the simulation's cost of n nodes' timers in one
process, which n separate processes would not share; and what the nodes wrote at each change by kind (a message's
type, ``handshake`` for new connections' handshakes, datagrams apart), per node. Per run: wall time,
CPU, peak RSS (the child's ``ru_maxrss``) and the load average seen while it ran (the machine is shared). Each
per-node figure is also given as a ratio to the first size's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SIZES = (100, 200, 500, 1000)


def settings(n: int, end_at: float) -> dict[str, str]:
    """The plan settings of an n-node run (the `--set` of its command)."""
    return {"fleet.count": str(n - 4), "points_per_weight": "10", "web.hosts": "100000",
            "simulate.pages_per_second": str(n), "cluster.time_scale": "0.02", "dispatch.interval": "0.05",
            "cluster.seeds": str(seeds(n)), "end.at": f"{end_at:g}"}


def command(n: int, out: Path, end_at: float) -> list[str]:
    sets = [arg for key, value in settings(n, end_at).items() for arg in ("--set", f"{key}={value}")]
    return [sys.executable, "-m", "peerlab.experiment", "--mode", "cluster", *sets, "--no-plots", "--out", str(out)]


def seeds(n: int) -> int:
    """The seed hosts of an n-node run: 64 per 100 nodes, so every size's crawl is as old when the changes come."""
    return max(1, round(n * 64 / 100))


class LoadWatch:
    """The 1-minute load average every few seconds while a run goes on."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self.seen: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.seen.append(os.getloadavg()[0])
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> LoadWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_one(n: int, out: Path, *, nice: int, end_at: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with LoadWatch() as load, open(out.parent / f"{out.name}.log", "w", encoding="utf-8") as log:
        # the run's progress lines and report go to OUT.log as they come: a long run shows where it is
        proc = subprocess.Popen(command(n, out, end_at), env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=(lambda: os.nice(nice)) if nice else None)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{n} nodes: the experiment exited with {os.waitstatus_to_exitcode(status)}")
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    changes = []
    for change in summary["changes"]:
        cost = change["cost"]
        nodes = cost["nodes"]
        changes.append({
            "name": change["name"], "nodes": nodes, "settle_seconds": round(change["settle_seconds"], 3),
            "handoff_messages": cost["handoff_messages"] / nodes, "handoff_pairs": cost["handoff_pairs"],
            "changed_nodes": cost.get("changed_nodes"), "handoff_stray": cost.get("handoff_stray"),
            "messages": cost["messages"] / nodes, "kib": cost["bytes"] / nodes / 1024,
            "cpu_ms": cost["cpu_seconds"] / nodes * 1e3,
            "phase_messages_per_s": cost["phase_messages"], "phase_kib_per_s": cost["phase_bytes"] / 1024,
            "phase_cpu_ms_per_s": cost["phase_cpu"] * 1e3,
            "loop_cpu_ms": cost.get("loop_cpu_seconds", 0.0) / nodes * 1e3,
            "phase_loop_cpu_ms_per_s": cost.get("phase_loop_cpu", 0.0) * 1e3,
            # kind -> [messages, KiB] written per node (a message's type, "handshake", "... (datagram)")
            "kinds": {kind: [n / nodes, size / nodes / 1024]
                      for kind, (n, size) in cost.get("sent_by_kind", {}).items()},
        })
        beyond(changes[-1])
    return {"nodes": n, "wall_s": round(wall, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mib": round(usage.ru_maxrss / 1024), "load_min": min(load.seen), "load_max": max(load.seen),
            "load_mean": round(sum(load.seen) / len(load.seen), 2), "changes": changes,
            "notes": [note for note in summary["notes"] if note.startswith(("phase ", "change ", "links ", "settle "))]}


def beyond(change: dict[str, Any]) -> None:
    """The change's own cost: what it cost beyond the crawl's rate in the phase before, over its settle."""
    seconds = change["settle_seconds"]
    for key, rate in (("messages", "phase_messages_per_s"), ("kib", "phase_kib_per_s"),
                      ("cpu_ms", "phase_cpu_ms_per_s")):
        change[f"{key}_beyond"] = max(0.0, change[key] - change[rate] * seconds)


#: (key, heading, format) of the per-node figures of a change, each also given as a ratio to the first size's
FIGURES = (("handoff_messages", "hand-off msgs", "{:.2f}"), ("messages", "messages", "{:.0f}"),
           ("kib", "KiB", "{:.1f}"), ("cpu_ms", "CPU ms", "{:.0f}"), ("messages_beyond", "messages beyond", "{:.0f}"),
           ("kib_beyond", "KiB beyond", "{:.1f}"), ("cpu_ms_beyond", "CPU ms beyond", "{:.0f}"),
           ("loop_cpu_ms", "of the CPU, run loop ms", "{:.0f}"))
RATES = (("phase_messages_per_s", "msgs/s", "{:.1f}"), ("phase_kib_per_s", "KiB/s", "{:.1f}"),
         ("phase_cpu_ms_per_s", "CPU ms/s", "{:.1f}"), ("phase_loop_cpu_ms_per_s", "of it run loop ms/s", "{:.1f}"))


def table(rows: list[dict[str, Any]]) -> str:
    rows = sorted(rows, key=lambda row: row["nodes"])
    base = rows[0]
    lines = ["| nodes | change | settle (virtual s) | " + " | ".join(h for _, h, _ in FIGURES)
             + " | pairs | changed nodes | stray | x first size (" + ", ".join(h for _, h, _ in FIGURES) + ") |",
             "|---:|---|---:|" + "---:|" * len(FIGURES) + "---:|---:|---:|---|"]
    for row in rows:
        for change, first in zip(row["changes"], base["changes"]):
            ratios = ", ".join(f"{change.get(k, 0) / first[k]:.2f}" if first.get(k) else "-" for k, _, _ in FIGURES)
            lines.append(f"| {row['nodes']:,} | {change['name']} | {change['settle_seconds']:.1f} | "
                         + " | ".join(f.format(change.get(k, 0)) for k, _, f in FIGURES)
                         + f" | {change['handoff_pairs']:,} | {change['changed_nodes']:,} | {change['handoff_stray']:,}"
                         f" | {ratios} |")
    lines += ["", "| nodes | crawl before the leave, per node per virtual s: " + " / ".join(h for _, h, _ in RATES)
              + " | x first size | wall | CPU | peak RSS | load average (min-max) |",
              "|---:|---|---|---:|---:|---:|---|"]
    for row in rows:
        change, first = row["changes"][0], base["changes"][0]
        lines.append(f"| {row['nodes']:,} | " + " / ".join(f.format(change.get(k, 0)) for k, _, f in RATES) + " | "
                     + " / ".join(f"{change.get(k, 0) / first[k]:.2f}" if first.get(k) else "-" for k, _, _ in RATES)
                     + f" | {row['wall_s'] / 60:.1f} min | {row['cpu_s']:,.0f} s | {row['peak_rss_mib']:,} MiB"
                     f" | {row['load_min']:.1f}-{row['load_max']:.1f} |")
    return "\n".join(lines)


def kinds_table(rows: list[dict[str, Any]], top: int = 8) -> str:
    """Per node at each change, what the nodes wrote by kind: messages / KiB at each size, the kinds that weigh
    most at the largest size first."""
    rows = sorted(rows, key=lambda row: row["nodes"])
    if not all(change.get("kinds") for row in rows for change in row["changes"]):
        return ""
    lines = ["| change | kind | " + " | ".join(f"{row['nodes']:,} nodes: messages / KiB" for row in rows) + " |",
             "|---|---|" + "---:|" * len(rows)]
    for i, change in enumerate(rows[-1]["changes"]):
        kinds = sorted(change["kinds"], key=lambda kind: -change["kinds"][kind][1])[:top]
        for kind in kinds:
            cells = []
            for row in rows:
                n, kib = row["changes"][i]["kinds"].get(kind, [0.0, 0.0])
                cells.append(f"{n:.1f} / {kib:.2f}")
            lines.append(f"| {change['name']} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--out", type=Path, help="keep each run's folder under this directory")
    parser.add_argument("--nice", type=int, default=10, help="niceness of each run (default 10)")
    parser.add_argument("--end-at", type=float, default=900.0, help="the plan's end.at (default 900: 18 virtual s)")
    parser.add_argument("--table", type=Path, nargs="+", metavar="JSON",
                        help="print the tables of --json files (their rows together) and exit")
    args = parser.parse_args(argv)
    if args.table:
        rows = [row for path in args.table for row in json.loads(path.read_text(encoding="utf-8"))]
        for row in rows:
            for change in row["changes"]:
                beyond(change)
        print(table(rows))
        print(kinds_table(rows))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="experiment-scale-") as tmp:
        root = args.out or Path(tmp)
        for n in args.sizes:
            row = run_one(n, root / f"n{n}", nice=args.nice, end_at=args.end_at)
            rows.append(row)
            print(f"{n:,} nodes: wall {row['wall_s']:.0f} s, CPU {row['cpu_s']:.0f} s, peak RSS "
                  f"{row['peak_rss_mib']:,} MiB, load {row['load_min']:.1f}-{row['load_max']:.1f}", flush=True)
            if args.json:  # after each size: a long series keeps what it measured
                args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores\n")
    print(table(rows))
    print()
    print(kinds_table(rows))
    for row in rows:
        for note in row["notes"]:
            print(f"{row['nodes']:,} nodes: {note}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
