"""Where a simulated cluster's CPU goes, per node, at two sizes: a CPU-time profile of ``peerctl experiment --mode
cluster`` cut at the experiment's own marks (the crawl before the leave, the leave until every node settled, the
crawl between, the join), and a comparison of two such profiles by part of the node.

Run: ``python -m tests.bench.profile_experiment run N DIR`` (the experiment of ``bench_experiment_scale`` at N
nodes; run it niced, it takes what that run takes), then ``python -m tests.bench.profile_experiment compare DIR_A
DIR_B [--segment change1] [--by part|function|self] [--under TEXT]``, or ``kinds DIR_A DIR_B [--segment change1]``
for what the nodes wrote at that change by kind of message (and handshake) and what their new connections were
opened for. Figures are CPU ms per node for a change
(divided by the nodes running at it) and per node per virtual second for a phase; a sample is the kernel's tick of
the process's CPU time (``ITIMER_PROF``, 4 ms at HZ=250), scaled so that a segment's samples add up to its CPU.

``--by part`` sorts each sample by the innermost part of the node it falls in (the first rule that matches its
stack below trio's run loop, in the order of ``PARTS``), with ``trio run loop`` for samples in no task (the
simulation's: every node's timers in one heap); ``function`` counts each function of a stack once (inclusive);
``self`` the innermost frame.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import sys
import time
from pathlib import Path

from tests.bench.bench_experiment_scale import settings

#: (part, any of these in a stack below the run loop): the first that matches names the sample's part.
PARTS = (
    ("handshake (first contacts)", ("Sessions._handshake", "MemoryNetwork._connect")),
    ("view change (ring, plan, hand-off start)", ("ViewChanges._view_changed",)),
    ("hand-off", ("peer/cluster/handoff/",)),
    ("re-homing replicas (ring change)", ("ReplicaSending.rehome", "SeenReplicas.rescan")),
    ("queue replicas", ("queuereplicas.py", "queuesending.py", "queueholding.py")),
    ("seen replicas", ("seenreplicas.py",)),
    ("membership", ("Membership.",)),
    ("progress tree", ("progress.py", "termination.py")),
    ("fence", ("fence.py",)),
    ("dispatch", ("dispatch.py",)),
    ("digests", ("digests.py",)),
    ("page source (the simulated crawl)", ("_PageSource",)),
    ("harness", ("peerlab/experiment/cluster.py",)),
    ("store syncs", ("syncs.py",)),
    ("links: frames in and out", ("linksessions.py", "peerlinks.py", "memtransport.py")),
)
_TRIO = ("trio/", "outcome/", "<attrs")  # frames name their file from site-packages on


def _frame(code) -> str:
    return f"{code.co_qualname} ({code.co_filename.split('site-packages/')[-1]}:{code.co_firstlineno})"


def run(n: int, out: Path) -> None:
    from peerlab.experiment import load_plan, run_cluster

    plan, _ = load_plan("design", overrides={"mode": '"cluster"', **settings(n, 900)})
    out.mkdir(parents=True, exist_ok=True)
    import trio

    segment = ["start"]
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    cpu: dict[str, float] = collections.defaultdict(float)
    virtual: dict[str, float] = collections.defaultdict(float)
    mark = [time.process_time(), 0.0]

    def sample(_signum, frame) -> None:
        stack = []
        while frame is not None:
            stack.append(_frame(frame.f_code))
            frame = frame.f_back
        counts[segment[0]][";".join(reversed(stack))] += 1

    def switch(name: str) -> None:
        now = time.process_time()
        try:
            at = trio.current_time()
        except RuntimeError:  # outside trio.run: the run's end
            at = mark[1]
        cpu[segment[0]] += now - mark[0]
        virtual[segment[0]] += at - mark[1]
        mark[:] = [now, at]
        segment[0] = name

    marks = {"phase": 1, "change": 0}

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)
        if "converged in" in line:
            switch("phase1")
        elif line.startswith("change "):
            marks["change"] += 1
            switch(f"change{marks['change']}")
        elif line.startswith("settled in"):
            marks["phase"] += 1
            switch(f"phase{marks['phase']}")

    signal.signal(signal.SIGPROF, sample)
    signal.siginterrupt(signal.SIGPROF, False)
    signal.setitimer(signal.ITIMER_PROF, 0.002, 0.002)
    try:
        result = run_cluster(plan, progress=say, loop_share=False)  # this profile samples SIGPROF itself
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
    switch("end")
    for name, stacks in counts.items():
        (out / f"{name}.folded").write_text("".join(f"{s} {c}\n" for s, c in stacks.items()), encoding="utf-8")
    (out / "meta.json").write_text(json.dumps({
        "nodes": n, "cpu": cpu, "virtual": virtual, "samples": {k: sum(c.values()) for k, c in counts.items()},
        "change_nodes": [c.cost.nodes if c.cost else n for c in result.changes],
        "change_seconds": [c.cost.seconds if c.cost else 0.0 for c in result.changes],
        "change_sent_by_kind": [dict(c.cost.sent_by_kind) if c.cost else {} for c in result.changes],
        "phase_sent_by_kind": [dict(c.cost.phase_sent_by_kind) if c.cost else {} for c in result.changes],
        "change_dialled_for": [dict(c.cost.dialled_for) if c.cost else {} for c in result.changes],
    }, indent=1) + "\n", encoding="utf-8")


def _part(frames: list[str]) -> str:
    loop = [i for i, f in enumerate(frames) if f.startswith("Runner.unrolled_run") or "unrolled_run (" in f]
    below = frames[loop[-1] + 1:] if loop else frames
    if not below or all(any(t in f for t in _TRIO) for f in below):
        return "trio run loop (no task: the simulation's timers and wake-ups)"
    joined = ";".join(below)
    for name, keys in PARTS:
        if any(key in joined for key in keys):
            return name
    return "other: " + below[0].split(" (")[0]


def load(folder: Path, segment: str, by: str, under: str | None) -> dict[str, float]:
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    if segment.startswith("change"):
        per = meta["change_nodes"][int(segment[len("change"):]) - 1]
    else:
        per = meta["nodes"] * meta["virtual"][segment]
    ms = meta["cpu"][segment] * 1e3 / max(1, meta["samples"][segment])
    out: collections.Counter[str] = collections.Counter()
    for line in (folder / f"{segment}.folded").read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if under and not any(under in f for f in frames):
            continue
        keys = {"part": lambda: [_part(frames)], "self": lambda: [frames[-1]],
                "function": lambda: sorted(set(frames))}[by]()
        for key in keys:
            out[key] += int(count)
    return {key: count * ms / per for key, count in out.items()}


def compare(a: Path, b: Path, segment: str, by: str, under: str | None, top: int) -> None:
    first, second = load(a, segment, by, under), load(b, segment, by, under)
    unit = "ms per node" if segment.startswith("change") else "ms per node per virtual s"
    print(f"{segment} ({unit}): {a} {sum(first.values()):.1f}, {b} {sum(second.values()):.1f}"
          + ("" if by == "function" else " in all"))
    for key in sorted(set(first) | set(second), key=lambda k: -second.get(k, 0.0))[:top]:
        x, y = first.get(key, 0.0), second.get(key, 0.0)
        print(f"{x:9.2f} {y:9.2f} {y - x:+9.2f} {y / x if x else float('inf'):6.2f}x  {key}")


def kinds(a: Path, b: Path, segment: str) -> None:
    """Per node, what the nodes wrote at a change by kind (messages and KiB) in the two runs, the most bytes in the
    second first, and the connections they dialled by what each was opened for."""
    index = int(segment[len("change"):]) - 1
    runs = [json.loads((folder / "meta.json").read_text(encoding="utf-8")) for folder in (a, b)]
    per = [meta["change_nodes"][index] for meta in runs]
    sent = [meta["change_sent_by_kind"][index] for meta in runs]
    print(f"{segment}, per node (settle {runs[0]['change_seconds'][index]:.2f} and "
          f"{runs[1]['change_seconds'][index]:.2f} virtual s): messages and KiB written, {a} then {b}")
    for kind in sorted(set(sent[0]) | set(sent[1]), key=lambda k: -sent[1].get(k, [0, 0])[1]):
        (n0, b0), (n1, b1) = (s.get(kind, [0, 0]) for s in sent)
        print(f"{n0 / per[0]:8.2f} {n1 / per[1]:8.2f}  {b0 / per[0] / 1024:7.2f} {b1 / per[1] / 1024:7.2f} KiB  {kind}")
    totals = [(sum(v[0] for v in s.values()) / p, sum(v[1] for v in s.values()) / p / 1024) for s, p in zip(sent, per)]
    print(f"{totals[0][0]:8.2f} {totals[1][0]:8.2f}  {totals[0][1]:7.2f} {totals[1][1]:7.2f} KiB  in all")
    for meta, p, folder in zip(runs, per, (a, b)):
        if "change_dialled_for" not in meta:  # a profile from before the links counted it
            continue
        dialled = meta["change_dialled_for"][index]
        print(f"{folder}: connections dialled per node {sum(dialled.values()) / p:.2f}: "
              + ", ".join(f"{kind} {n / p:.2f}" for kind, n in dialled.items()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="profile the experiment at N nodes into DIR")
    one.add_argument("nodes", type=int)
    one.add_argument("out", type=Path)
    two = sub.add_parser("compare", help="compare two profiles")
    two.add_argument("a", type=Path)
    two.add_argument("b", type=Path)
    two.add_argument("--segment", default="change1", help="phase1, change1, phase2, change2 (default change1)")
    two.add_argument("--by", choices=("part", "function", "self"), default="part")
    two.add_argument("--under", help="only the samples with a frame containing this text")
    two.add_argument("--top", type=int, default=20)
    three = sub.add_parser("kinds", help="what two profiled runs wrote at a change, by kind")
    three.add_argument("a", type=Path)
    three.add_argument("b", type=Path)
    three.add_argument("--segment", default="change1", help="change1 or change2 (default change1)")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.nodes, args.out)
    elif args.command == "kinds":
        kinds(args.a, args.b, args.segment)
    else:
        compare(args.a, args.b, args.segment, args.by, args.under, args.top)


if __name__ == "__main__":
    main()
