"""Two nodes against one: the same benchmark web crawled by one peerd, then by a cluster of two, in one run.

Run: ``python -m tests.bench.bench_scaling [--hosts 1000] [--pages-per-host 20] [--store none] [--repeat 1]
[--mode nodes|cores] [--page-threads 2] [--page-processes N]``

``--mode cores`` compares one node with itself instead: pinned to one core (``taskset -c 0``, inline page
work) against the same node free on every core with ``--page-threads N`` (or, with ``--page-processes N``,
with N page worker processes; then also the node and its workers pinned to one core together), and free on
every core inline (issue 19's target: >= 1.7x the one-core steady pages/s on this 2-core machine). Each run
prints its CPU per page split into the node's own process, its page workers and the web server (nginx and
the DNS server share the same two cores), and the load average before and after it.

``--replica-cost``: two nodes with ``--replicas 1`` against two with ``--replicas 0`` instead.

The web is ``peerlab.localweb.bench`` (nginx, ``--hosts`` x ``--pages-per-host`` pages of about 15 KB with about 30
links each; its names come from ``peerlab.localweb.dns_server``). First one node crawls it to the end
(``--exit-when-done``); then two nodes of equal weight (the second joins the first) crawl a fresh copy of the
same crawl, each process with its own data dir. Measured from outside: wall time from the first start to the
last exit, CPU of each node from its rusage, pages from each node's final counters. The figure is the ratio of
pages per second, two nodes over one (issue 5's target: >= 1.8x on this 2-core machine); the web server's CPU
is printed beside it, because it shares the same two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from peer.control import auth_headers
from peerlab.localweb.bench import BenchWeb, start_bench_web

from .bench_crawl import BENCH_DOMAIN, _cpu_seconds, _final_stats, _start_dns, _stop

SECRET = "bench-scaling-cluster-secret"


def _node_cmd(name: str, data: Path, seeds: Path, dns_port: int, args: argparse.Namespace,
              join: str | None, cpus: str = "", threads: int = 0, processes: int = 0) -> list[str]:
    pin = ["taskset", "-c", cpus] if cpus else []
    cmd = [*pin, sys.executable, "-m", "peer", "start", "--node-id", name, "--listen", "127.0.0.1:0",
           "--control", "127.0.0.1:0", "--seeds-file", str(seeds), "--allow-host", BENCH_DOMAIN,
           "--allow-private", "--nameserver", f"127.0.0.1:{dns_port}", "--delay", "0",
           "--ip-connections", "0",  # one nginx on 127.0.0.1 stands for as many servers as hosts
           "--concurrency", str(args.concurrency), "--exit-when-done", "--data-dir", str(data),
           "--store", args.store, "--log-format", "json", "--log-level", "info", "--page-threads", str(threads),
           "--page-processes", str(processes)]
    if join:
        cmd += ["--join", join]
    if args.replicas is not None:
        cmd += ["--replicas", str(args.replicas)]
    return cmd


def _pages_now(workdir: Path, nodes: int) -> int | None:
    """Pages fetched so far by all nodes, from their control endpoints; None if one cannot be asked."""
    import httpx

    total = 0
    for i in range(nodes):
        try:
            address = (workdir / f"{nodes}-n{i}" / "control.addr").read_text().strip()
            headers = auth_headers(workdir / f"{nodes}-n{i}")
            total += int(httpx.get(f"http://{address}/status", timeout=2.0, headers=headers).json()["pages"])
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            return None
    return total


def _steady_rate(samples: list[tuple[float, int]], total: int) -> float | None:
    """Pages per second between 20% and 80% of the crawl: leaves out start-up (joins, ring builds, the first
    hand-off) and the tail (the last hosts, termination rounds)."""
    def crossing(fraction: float) -> tuple[float, int] | None:
        return next(((t, n) for t, n in samples if n >= fraction * total), None)

    low, high = crossing(0.2), crossing(0.8)
    if low is None or high is None or high[0] <= low[0]:
        return None
    return (high[1] - low[1]) / (high[0] - low[0])


def run_cluster(web: BenchWeb, dns_port: int, nodes: int, args: argparse.Namespace, workdir: Path, *,
                cpus: str = "", threads: int = 0, processes: int = 0) -> dict[str, Any]:
    """Crawl the web with `nodes` processes (1: standalone; more: a cluster) and measure them."""
    seeds = workdir / "seeds.txt"
    seeds.write_text("\n".join(web.seeds) + "\n", encoding="utf-8")
    env = dict(os.environ)
    if nodes > 1:
        env["PEERCRAWL_CLUSTER_SECRET"] = SECRET
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    spies: list[subprocess.Popen[bytes]] = []
    web_cpu0 = _cpu_seconds(web.processes)
    t0 = time.perf_counter()
    join = None
    try:
        for i in range(nodes):
            name = f"n{i}"
            data = workdir / f"{nodes}-{name}"
            shutil.rmtree(data, ignore_errors=True)
            log = workdir / f"{nodes}-{name}.log"
            with open(log, "wb") as err:
                proc = subprocess.Popen(_node_cmd(name, data, seeds, dns_port, args, join, cpus, threads, processes),
                                        stdin=subprocess.DEVNULL,
                                        stdout=err, stderr=err, env=env)
            procs.append((name, proc, log))
            if args.py_spy and nodes > 1 and i == 0:
                spies.append(subprocess.Popen(["py-spy", "record", "--pid", str(proc.pid), "--rate", "200",
                                               "--format", "raw", "--output", str(workdir / "py-spy-n0.txt"),
                                               "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if nodes > 1 and join is None:
                deadline = time.perf_counter() + 60
                while not (data / "peer.addr").exists():  # bounded: the node writes it once it listens
                    if proc.poll() is not None or time.perf_counter() > deadline:
                        raise SystemExit(f"bench_scaling: {name} did not start: {log.read_text()[-2000:]}")
                    time.sleep(0.05)
                join = (data / "peer.addr").read_text().strip()
        cpu = 0.0
        samples: list[tuple[float, int]] = []  # (seconds since start, pages of all nodes): the steady rate
        last_sample = 0.0
        for name, proc, log in procs:
            deadline = t0 + args.time_limit
            while True:  # bounded by the time limit
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    break
                if time.perf_counter() > deadline:
                    proc.kill()
                    raise SystemExit(f"bench_scaling: {name} ran past {args.time_limit} s")
                if time.perf_counter() - last_sample >= 0.5:
                    last_sample = time.perf_counter()
                    pages = _pages_now(workdir, nodes)
                    if pages is not None:
                        samples.append((last_sample - t0, pages))
                time.sleep(0.05)
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode != 0:
                raise SystemExit(f"bench_scaling: {name} exited {proc.returncode}: {log.read_text()[-2000:]}")
            cpu += usage.ru_utime + usage.ru_stime
        wall = time.perf_counter() - t0
    finally:
        for _name, proc, _log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for spy in spies:
            spy.wait(timeout=60)
    finals = [_final_stats(log) for _name, _proc, log in procs]
    pages = sum(int(f.get("pages", 0)) for f in finals)
    own = sum(float(f.get("cpu_s", 0.0)) for f in finals)  # the nodes' own processes; cpu adds their workers
    return {"nodes": nodes, "wall_s": wall, "pages": pages, "pages_per_s": pages / wall, "cpu_s": cpu,
            "own_cpu_s": own, "own_ms_per_page": 1000 * own / max(1, pages),
            "workers_ms_per_page": 1000 * (cpu - own) / max(1, pages),
            "steady_pages_per_s": _steady_rate(samples, pages),
            "cpu_ms_per_page": 1000 * cpu / max(1, pages), "web_cpu_s": _cpu_seconds(web.processes) - web_cpu0,
            "per_node_pages": [int(f.get("pages", 0)) for f in finals]}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--pages-per-host", type=int, default=20)
    p.add_argument("--links-per-page", type=int, default=30)
    p.add_argument("--page-bytes", type=int, default=15_000)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--store", choices=["warc", "none"], default="none")
    p.add_argument("--repeat", type=int, default=1, help="alternate the 1- and 2-node runs this many times")
    p.add_argument("--time-limit", type=float, default=600.0)
    p.add_argument("--results-dir", default="bench-results")
    p.add_argument("--keep", metavar="DIR", help="keep the nodes' data dirs and logs in DIR")
    p.add_argument("--py-spy", action="store_true", help="record the first node of the cluster with py-spy")
    p.add_argument("--replica-cost", action="store_true",
                   help="instead: two nodes with --replicas 1 against two with --replicas 0, alternated")
    p.add_argument("--mode", choices=["nodes", "cores"], default="nodes",
                   help="nodes: two nodes against one; cores: one node on every core against itself on one")
    p.add_argument("--page-threads", type=int, default=2, help="--mode cores: the free node's --page-threads")
    p.add_argument("--page-processes", type=int, default=0,
                   help="--mode cores: the free node's --page-processes instead of page threads (0: threads)")
    args = p.parse_args()
    args.replicas = None
    if args.mode == "cores":
        return cores(args)
    results = Path(args.results_dir).resolve()
    results.mkdir(parents=True, exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 16384), hard), hard))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="peercrawl-bench-scaling-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with start_bench_web(hosts=args.hosts, pages_per_host=args.pages_per_host,
                             links_per_page=args.links_per_page, page_bytes=args.page_bytes) as web:
            dns, dns_port = _start_dns(web.zone, workdir)
            try:
                print(f"web: {web.kind}, {args.hosts} hosts x {args.pages_per_host} pages, --store {args.store}",
                      flush=True)
                plan = [(2, 0), (2, 1)] if args.replica_cost else [(1, None), (2, None)]
                for i in range(args.repeat):
                    for nodes, replicas in plan if i % 2 == 0 else plan[::-1]:
                        args.replicas = replicas
                        r = run_cluster(web, dns_port, nodes, args, workdir)
                        r["replicas"] = replicas
                        rows.append(r)
                        if replicas is not None:
                            print(f"  --replicas {replicas}:", end="")
                        steady = r["steady_pages_per_s"]
                        print(f"  {nodes} node(s): {r['pages']} pages in {r['wall_s']:.1f} s = "
                              f"{r['pages_per_s']:.0f} pages/s end to end, "
                              f"{'-' if steady is None else f'{steady:.0f}'} pages/s from 20% to 80%, "
                              f"{r['cpu_ms_per_page']:.2f} ms CPU/page, "
                              f"web CPU {r['web_cpu_s']:.1f} s, per node {r['per_node_pages']}", flush=True)
            finally:
                _stop(dns)
    if args.replica_cost:
        cpu = {k: [r["cpu_ms_per_page"] for r in rows if r["replicas"] == k] for k in (0, 1)}
        ratios = [b / a for a, b in zip(cpu[0], cpu[1])]
        rates = [b["pages_per_s"] / a["pages_per_s"] for a, b in zip([r for r in rows if r["replicas"] == 0],
                                                                     [r for r in rows if r["replicas"] == 1])]
        print(f"two nodes, CPU per page with --replicas 1 / --replicas 0: {', '.join(f'{x:.3f}' for x in ratios)} "
              f"(target <= 1.15); pages per second: {', '.join(f'{x:.3f}' for x in rates)}; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        doc = {"bench": "bench_scaling --replica-cost", "args": vars(args), "rows": rows, "cpu_ratios": ratios}
        (results / "bench_replica_cost.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        return
    ones = [r["pages_per_s"] for r in rows if r["nodes"] == 1]
    twos = [r["pages_per_s"] for r in rows if r["nodes"] == 2]
    ratios = [b / a for a, b in zip(ones, twos)]
    s1 = [r["steady_pages_per_s"] for r in rows if r["nodes"] == 1]
    s2 = [r["steady_pages_per_s"] for r in rows if r["nodes"] == 2]
    steady = [b / a for a, b in zip(s1, s2) if a and b]
    load = os.getloadavg()
    print(f"two nodes / one node, pages per second end to end: {', '.join(f'{x:.2f}x' for x in ratios)}; "
          f"from 20% to 80% of the crawl: {', '.join(f'{x:.2f}x' for x in steady) or '-'} "
          f"(target >= 1.8x); load average {load[0]:.1f} on {os.cpu_count()} cores")
    doc = {"bench": "bench_scaling", "args": vars(args), "rows": rows, "ratios": ratios, "steady_ratios": steady,
           "loadavg": load}
    (results / "bench_scaling.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def cores(args: argparse.Namespace) -> None:
    """One node on one core (inline) against the same node on every core with page threads or page worker
    processes, alternating; the ratio of steady pages/s is the figure."""
    rows: list[tuple[str, dict[str, Any]]] = []
    n = args.page_processes
    configs: list[tuple[str, str, int, int]] = [("one core, inline", "0", 0, 0)]
    if n:
        configs += [(f"all cores, --page-processes {n}", "", 0, n),
                    (f"one core, --page-processes {n}", "0", 0, n)]
    else:
        configs += [(f"all cores, --page-threads {args.page_threads}", "", args.page_threads, 0)]
    configs += [("all cores, inline", "", 0, 0)]
    with tempfile.TemporaryDirectory(prefix="peercrawl-bench-cores-") as tmp:
        workdir = Path(tmp)
        with start_bench_web(hosts=args.hosts, pages_per_host=args.pages_per_host,
                             links_per_page=args.links_per_page, page_bytes=args.page_bytes) as web:
            dns, dns_port = _start_dns(web.zone, workdir)
            try:
                print(f"web: {web.kind}, {args.hosts} hosts x {args.pages_per_host} pages, --store {args.store}; "
                      f"{os.cpu_count()} cores", flush=True)
                for _ in range(args.repeat):
                    for label, cpus, threads, processes in configs:
                        load0 = os.getloadavg()[0]
                        r = run_cluster(web, dns_port, 1, args, workdir, cpus=cpus, threads=threads,
                                        processes=processes)
                        r["load"] = (load0, os.getloadavg()[0])
                        rows.append((label, r))
                        steady = r["steady_pages_per_s"]
                        print(f"  {label}: {r['pages']} pages in {r['wall_s']:.1f} s = {r['pages_per_s']:.0f} "
                              f"pages/s end to end, {'-' if steady is None else f'{steady:.0f}'} pages/s from 20% "
                              f"to 80%; CPU ms/page {r['cpu_ms_per_page']:.3f} (node's own process "
                              f"{r['own_ms_per_page']:.3f}, page workers {r['workers_ms_per_page']:.3f}), web "
                              f"{1000 * r['web_cpu_s'] / max(1, r['pages']):.3f} ms/page = "
                              f"{r['web_cpu_s'] / r['wall_s']:.2f} of a core; load {r['load'][0]:.1f} -> "
                              f"{r['load'][1]:.1f}", flush=True)
            finally:
                _stop(dns)
    k = len(configs)

    def ratio(i: int) -> list[float]:
        return [b["steady_pages_per_s"] / a["steady_pages_per_s"] for (_, a), (_, b) in
                zip(rows[0::k], rows[i::k]) if a["steady_pages_per_s"] and b["steady_pages_per_s"]]

    for i, (label, _cpus, _t, _p) in enumerate(configs[1:], start=1):
        target = " (target >= 1.7x)" if i == 1 else ""
        print(f"{label} / one core inline, steady pages/s: {', '.join(f'{x:.2f}x' for x in ratio(i)) or '-'}{target}")
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores")
    results = Path(args.results_dir).resolve()
    results.mkdir(parents=True, exist_ok=True)
    doc = {"bench": "bench_scaling --mode cores", "args": vars(args), "rows": [{"config": c, **r} for c, r in rows],
           "loadavg": load}
    (results / "bench_cores.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
