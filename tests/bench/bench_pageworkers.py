"""The page worker pool alone: what a job costs the node's own process, and its workers, without a crawl.

Run: ``python -m tests.bench.bench_pageworkers [--jobs 20000] [--processes 2] [--concurrency 256]
[--page-bytes 15000] [--repeat 3] [--baseline SRC]``

A crawl's CPU per page moves with everything else on the machine (the fetch path, LMDB, nginx, the other
engineers' work), so a change to the pool's own cost (framing, copies, wake-ups) is lost in it. This bench
feeds ``--jobs`` synthetic HTML pages (about ``--page-bytes`` each, 30 links, as the benchmark web's) through
`peer.crawl.pageworkers.open_page_workers` from ``--concurrency`` tasks at once, as a node's host turns do,
with WARC records built at gzip level 1, and measures from 20% to 80% of the jobs: the node process's CPU per
job (its rusage: user + system, the kernel's work for its sockets included), jobs per second, and the
workers' CPU per job (over the whole run, from their rusage once they exited). Each measurement runs in a
fresh process; with ``--baseline SRC`` (a source tree, say ``git archive main | tar -x -C SRC``, put first on
PYTHONPATH) each round runs this tree's pool and then the baseline's, and the ratios of the node's CPU per
job are printed pair by pair, so both see the same moments of the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

_WORDS = b"lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore "


def _body(i: int, page_bytes: int) -> bytes:
    links = b"".join(b'<li><a href="/p/%d.html">page %d</a></li>' % ((i * 7 + k) % 5000, k) for k in range(30))
    head = b"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>page %d</title></head><body><ul>" % i
    text = (_WORDS * (page_bytes // len(_WORDS) + 1))[: max(0, page_bytes - len(head) - len(links) - 30)]
    return head + links + b"</ul><p>" + text + b"</p></body></html>"


def child(args: argparse.Namespace) -> dict:
    """One measurement in this process (the pool's code from whatever tree is first on PYTHONPATH)."""
    import trio

    from peer.crawl.pageworkers import PageJob, open_page_workers

    bodies = [_body(i, args.page_bytes) for i in range(64)]
    jobs = args.jobs
    marks: dict[str, tuple[float, float]] = {}

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    async def main() -> None:
        async with open_page_workers(args.processes) as pool:
            with trio.fail_after(60):
                while pool.status()["ready"] < args.processes:
                    await trio.sleep(0.02)
            done = 0
            next_job = 0

            async def feeder() -> None:
                nonlocal done, next_job
                while next_job < jobs:
                    i = next_job
                    next_job += 1
                    job = PageJob(url=f"http://h{i % 600}.bench.test/p/{i}.html",
                                  content_type="text/html; charset=utf-8", body=bodies[i % len(bodies)], parse=True,
                                  compress_level=1, request_headers=[("user-agent", "bench"), ("host", "h.test")],
                                  status=200, reason="OK",
                                  response_headers=[("server", "nginx"), ("content-type", "text/html; charset=utf-8"),
                                                    ("content-length", str(len(bodies[i % len(bodies)])))],
                                  ip="127.0.0.1", fetched_at=1_700_000_000.0 + i, truncated=False)
                    result = await pool.process(job)
                    assert len(result.page.links) == 30
                    done += 1
                    for name, at in (("low", 0.2), ("high", 0.8)):
                        if name not in marks and done >= at * jobs:
                            marks[name] = (time.perf_counter(), cpu())

            async with trio.open_nursery() as nursery:
                for _ in range(args.concurrency):
                    nursery.start_soon(feeder)

    trio.run(main)
    (t0, c0), (t1, c1) = marks["low"], marks["high"]
    n = (0.8 - 0.2) * jobs
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"node_ms_per_job": 1000 * (c1 - c0) / n, "jobs_per_s": n / (t1 - t0),
            "workers_ms_per_job": 1000 * (workers.ru_utime + workers.ru_stime) / jobs}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_pageworkers", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--page-bytes", type=int, default=15_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--baseline", metavar="SRC", default="")
    p.add_argument("--results-dir", default="bench-results")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    here = Path(__file__).resolve()
    tree = str(here.parents[2])
    sources = [("this tree", tree)] + ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else [])
    rows: list[dict] = []
    for i in range(args.repeat):
        for name, src in sources:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])}
            cmd = [sys.executable, str(here), "--child", "--jobs", str(args.jobs), "--processes", str(args.processes),
                   "--concurrency", str(args.concurrency), "--page-bytes", str(args.page_bytes)]
            load = os.getloadavg()[0]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd="/", check=False)
            if out.returncode != 0:
                raise SystemExit(f"bench_pageworkers: {name} failed: {out.stderr[-2000:]}")
            r = {"round": i, "tree": name, "load": load, **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(r)
            print(f"  round {i + 1}, {name}: node {r['node_ms_per_job']:.4f} ms CPU/job from 20% to 80%, "
                  f"{r['jobs_per_s']:.0f} jobs/s, workers {r['workers_ms_per_job']:.4f} ms CPU/job; load {load:.1f}",
                  flush=True)
    if args.baseline:
        ratios = [a["node_ms_per_job"] / b["node_ms_per_job"] for a, b in zip(rows[0::2], rows[1::2])]
        wratios = [a["workers_ms_per_job"] / b["workers_ms_per_job"] for a, b in zip(rows[0::2], rows[1::2])]
        print(f"node's CPU per job, this tree / baseline: {', '.join(f'{x:.3f}' for x in ratios)} "
              f"(median {statistics.median(ratios):.3f}); workers' CPU per job: "
              f"{', '.join(f'{x:.3f}' for x in wratios)} (median {statistics.median(wratios):.3f})")
    results = Path(args.results_dir).resolve()
    results.mkdir(parents=True, exist_ok=True)
    (results / "bench_pageworkers.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n",
                                                    encoding="utf-8")


if __name__ == "__main__":
    main()
