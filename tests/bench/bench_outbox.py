"""The sender's side of the durable outbox, per page: a page's commit with its routed links, and the sender's
tick taking them (`Outbox.take`) and their ack deleting them, in CPU per page; against another source tree's in
the same run (`--baseline SRC`, an unpacked `git archive main`), rounds alternated.

Run: python -m tests.bench.bench_outbox [--pages N] [--routed K] [--rounds R] [--baseline SRC]

Each round: N pages, each `NodeStore.finish(None, [], routed=K links)` to one peer; every 100 pages the sender
takes what was committed since its last take (as its 200 ms tick does) and the owner's ack deletes them. The
figure is the process's CPU (user + system) per page, the best of the round's three passes.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from storage import NodeStore, QueuedUrl


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(pages: int, routed: int) -> float:
    """CPU µs per page of commits with `routed` links each, taken and acknowledged every 100 pages."""
    links = [
        [("n1", QueuedUrl(url=f"http://h{(p * 7 + i) % 3000}.test/p{p}-{i}", host=f"h{(p * 7 + i) % 3000}.test",
                          depth=2, hops=0, found_on=f"http://x.test/{p}")) for i in range(routed)]
        for p in range(pages)
    ]
    best = float("inf")
    with tempfile.TemporaryDirectory(prefix="peercrawl-bench-outbox-") as tmp, \
            NodeStore.open(tmp, map_size=1 << 28) as store:
        cursor = store.outbox.last_seq()
        for _pass in range(3):
            started = _cpu()
            for p in range(pages):
                store.finish(None, [], routed=links[p])
                if p % 100 == 99:
                    taken = store.outbox.take("n1", 100 * routed, after=cursor)
                    cursor = taken[-1][0]
                    store.outbox.ack("n1", [seq for seq, _item in taken])
            best = min(best, (_cpu() - started) / pages * 1e6)
    return best


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_outbox", description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=20_000)
    p.add_argument("--routed", type=int, default=6, help="routed links per page")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--baseline", metavar="SRC", default="", help="also measure the code of this source tree")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child measuring its own tree
    args = p.parse_args()
    if args.one:
        print(sys.modules["storage"].__file__)  # which tree's code: the parent checks
        print(f"{measure(args.pages, args.routed):.2f}")
        return
    trees = [("this tree", "")] + ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else [])
    for r in range(args.rounds):
        figures = {}
        for name, source in trees if r % 2 == 0 else trees[::-1]:
            env = dict(os.environ)
            if source:
                env["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [env.get("PYTHONPATH")])])
            # run as a script from elsewhere: `storage` then comes from SRC (first on PYTHONPATH), not from here
            with tempfile.TemporaryDirectory(prefix="peercrawl-bench-outbox-") as cwd:
                out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", "--pages",
                                      str(args.pages), "--routed", str(args.routed)],
                                     env=env, check=True, capture_output=True, text=True, cwd=cwd)
            where, figure = out.stdout.split()[-2:]
            if source and not where.startswith(source):
                raise SystemExit(f"the baseline ran this tree's code ({where}), not {source}'s")
            figures[name] = float(figure)
        line = ", ".join(f"{name} {us:.1f} µs" for name, us in figures.items())
        ratio = f" ({figures['this tree'] / figures['baseline']:.2f}x)" if "baseline" in figures else ""
        print(f"round {r + 1}: a page's commit with {args.routed} routed links, taken and acked: {line} CPU per "
              f"page{ratio}", flush=True)


if __name__ == "__main__":
    main()
