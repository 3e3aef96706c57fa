"""Compare two CPU-time profiles written by ``tests/bench/_cpuprof/sitecustomize.py`` (``bench_scaling
--cpu-profile``, ``bench_crawl --cpu-profile``), in microseconds of CPU per page.

Run: ``python -m tests.bench._cpuprof.report A.PAGES B.PAGES --under unrolled_run --depth 1`` where each argument is
a profile file (or several, joined with ``+``: the nodes of one cluster) and, after a comma, the pages those
processes fetched, e.g. ``cpu-1-1-lone.123,20000 cpu-2-2-r0.124+cpu-2-2-r0.125,20000``. Each stack is grouped by
the ``--depth`` frames below the innermost frame whose name contains ``--under`` (default: trio's
``unrolled_run``, so depth 1 is the task: ``Crawler._worker``, ``PeerLinks._writer``, ...). One sample is
``--sample-ms`` of CPU (the kernel's timer tick: 4 ms at HZ=250, whatever interval was asked for).
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path


def load(spec: str, under: str, depth: int) -> tuple[collections.Counter[str], int]:
    files, _, pages = spec.rpartition(",")
    counts: collections.Counter[str] = collections.Counter()
    for name in files.split("+"):
        for line in Path(name).read_text(encoding="utf-8").splitlines():
            stack, _, n = line.rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            if under:
                hits = [i for i, f in enumerate(frames) if under in f.split(" (")[0]]
                if not hits:
                    continue
                frames = frames[hits[-1] + 1:]
            key = ";".join(f.split(" (")[0] for f in frames[:depth]) or "<self>"
            counts[key] += int(n)
    return counts, int(pages)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench._cpuprof.report", description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="FILE[+FILE...],PAGES: the reference")
    p.add_argument("b", help="FILE[+FILE...],PAGES: compared with it")
    p.add_argument("--under", default="unrolled_run")
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sample-ms", type=float, default=4.0)
    args = p.parse_args()
    (a, pa), (b, pb) = load(args.a, args.under, args.depth), load(args.b, args.under, args.depth)
    us = args.sample_ms * 1000
    print(f"{'A µs/page':>10} {'B µs/page':>10} {'B - A':>8}  (totals {sum(a.values()) * us / pa:.1f} and "
          f"{sum(b.values()) * us / pb:.1f})")
    for key in sorted(set(a) | set(b), key=lambda k: -abs(b[k] * us / pb - a[k] * us / pa))[: args.top]:
        x, y = a[key] * us / pa, b[key] * us / pb
        print(f"{x:10.1f} {y:10.1f} {y - x:8.1f}  {key}")


if __name__ == "__main__":
    main()
