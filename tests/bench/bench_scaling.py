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

``--cluster-replicas 0,1``: the cluster runs once per listed ``--replicas`` setting beside each lone run (a lone
node replicates nothing whatever the setting), so issue 19's overhead target (a cluster node's CPU per page at
most 1.1x a lone node's) is read pair by pair for each setting. Each run also reports its CPU per page between
20% and 80% of the crawl (the nodes' CPU sampled from /proc with their pages), which leaves out what a process
pays once (start-up, the join, the last rounds) and keeps what it pays per page. ``--pin`` puts every node on
core 0 and the web (nginx and the name server) on the other cores: a lone node and a cluster then crawl on the
same one core, and the ratio shows what the cluster's code costs without the two nodes' contention for both
cores with the web server. ``--together`` runs each round's crawls (the lone node, the clusters, and with
``--baseline`` the baseline's) all at once instead of one after the other: each then has the machine's same
moments, busy or quiet, and the ratios hold while other work comes and goes; each is also given from 20% to
80% of its crawl (without start-up and the end), and ``--cpu-profile`` samples only that window (the benchmark
signals each node at 20% and 80%), with the collector's time per generation and the crawls' context switches. ``--contention`` adds, to each round, two lone nodes that crawl the whole web at once,
each on its own (no cluster): the machine is as busy as under a cluster, with none of the cluster's code, so
"two lone / one lone" is what the contention costs and "cluster / two lone" what the cluster's code costs. ``--baseline SRC`` runs each round again with the code of
the source tree SRC (put first on PYTHONPATH; say an unpacked ``git archive main``, or ``git worktree add DIR
COMMIT``): both versions' ratios in one run, on this tree's web; flags that SRC's ``peer start`` does not know
(``--ip-connections``, ``--page-threads``, ``--replicas``) are left out for it.

The web is ``peerlab.localweb.bench`` (nginx, ``--hosts`` x ``--pages-per-host`` pages of about 15 KB with about 30
links each, 30% to other hosts, real markup unless ``--filler``; its names come from ``peerlab.localweb.dns_server``);
``--wide-web`` crawls the real-markup web instead (``REAL_WEB``: 2,000 hosts x 50 pages built like real ones,
python3-doc's documents on a fifth of the hosts, 20% of links to other hosts, 31 hosts per address, 5% of hosts
with Crawl-delay 2; docs/localweb.md), and ``--wide-web --filler`` the filler wide web (``WIDE_WEB``). First one node crawls it to the end
(``--exit-when-done``); then two nodes of equal weight (the second joins the first) crawl a fresh copy of the
same crawl, each process with its own data dir. Measured from outside: wall time from the first start to the
last exit, CPU of each node from its rusage, pages from each node's final counters. The figure is the ratio of
pages per second, two nodes over one (issue 5's target: >= 1.8x on this 2-core machine); the web server's CPU
is printed beside it, because it shares the same two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from peer.control import auth_headers
from peerlab.localweb.bench import REAL_WEB, WIDE_WEB, BenchWeb, start_bench_web

import psutil

from .bench_crawl import BENCH_DOMAIN, _cpu_seconds, _final_stats, _start_dns, _stop

SECRET = "bench-scaling-cluster-secret"


def _bench_web(args: argparse.Namespace) -> contextlib.AbstractContextManager[BenchWeb]:
    """The benchmark web of --hosts x --pages-per-host pages, or with --wide-web the real-markup web (REAL_WEB;
    with --filler the filler wide web, WIDE_WEB). Printed first, so every figure says which web it is."""
    if args.wide_web:
        shape = WIDE_WEB if args.filler else REAL_WEB
        print(f"web: {'FILLER wide web (WIDE_WEB)' if args.filler else 'real-markup web (REAL_WEB)'}", flush=True)
        return start_bench_web(**shape)  # type: ignore[arg-type]
    print(f"web: {'FILLER' if args.filler else 'real-markup'} web, {args.hosts} hosts x {args.pages_per_host} pages",
          flush=True)
    return start_bench_web(hosts=args.hosts, pages_per_host=args.pages_per_host,
                           links_per_page=args.links_per_page, page_bytes=args.page_bytes,
                           markup="filler" if args.filler else "real")


_FLAGS_OF: dict[str, str] = {}


def _knows(source: str, flag: str) -> bool:
    """Whether the `peer start` of the source tree `source` ("" for this checkout) takes `flag`: a --baseline
    tree from before a flag existed (per-address limits, page threads, replicas) runs without it, which is
    how that tree behaved anyway. Its --help is read once per tree."""
    if not source:
        return True
    if source not in _FLAGS_OF:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, *filter(None, [os.environ.get("PYTHONPATH")])])}
        _FLAGS_OF[source] = subprocess.run([sys.executable, "-m", "peer", "start", "--help"], env=env, cwd=source,
                                           capture_output=True, text=True, timeout=300).stdout
    return flag in _FLAGS_OF[source].split()


def _node_cmd(name: str, data: Path, seeds: Path, dns_port: int, args: argparse.Namespace,
              join: str | None, cpus: str = "", threads: int = 0, processes: int = 0,
              source: str = "") -> list[str]:
    pin = ["taskset", "-c", cpus] if cpus else []
    cmd = [*pin, sys.executable, "-m", "peer", "start", "--node-id", name, "--listen", "127.0.0.1:0",
           "--control", "127.0.0.1:0", "--seeds-file", str(seeds), "--allow-host", BENCH_DOMAIN,
           "--allow-private", "--nameserver", f"127.0.0.1:{dns_port}", "--delay", "0",
           "--ip-connections", "0",  # one nginx on 127.0.0.1 stands for as many servers as hosts
           "--concurrency", str(args.concurrency), "--exit-when-done", "--data-dir", str(data),
           "--store", args.store, "--log-format", "json", "--log-level", "info", "--page-threads", str(threads)]
    if processes:  # only when asked: a --baseline tree may not know the flag
        cmd += ["--page-processes", str(processes)]
    if join:
        cmd += ["--join", join]
    if args.replicas is not None:
        cmd += ["--replicas", str(args.replicas)]
    if source:
        for flag in ("--ip-connections", "--page-threads", "--replicas"):
            if flag in cmd and not _knows(source, flag):
                at = cmd.index(flag)
                del cmd[at:at + 2]
    return cmd


def _pages_now(workdir: Path, nodes: int, names: list[str] | None = None) -> int | None:
    """Pages fetched so far by all nodes (their data dirs `names` under workdir, default "{nodes}-n{i}"), from
    their control endpoints; None if one cannot be asked."""
    import httpx

    total = 0
    for name in names or [f"{nodes}-n{i}" for i in range(nodes)]:
        try:
            address = (workdir / name / "control.addr").read_text().strip()
            headers = auth_headers(workdir / name)
            total += int(httpx.get(f"http://{address}/status", timeout=2.0, headers=headers).json()["pages"])
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            return None
    return total


def _proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a live process so far (/proc/PID/stat), or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu(pid: int) -> float:
    """User + system CPU seconds so far of the live children of a process (its page workers), 0 if none."""
    total = 0.0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            total += _proc_cpu(int(child)) or 0.0
    return total


def _steady_cpu(samples: list[tuple[float, int, float]], total: int) -> float | None:
    """ms of CPU per page between 20% and 80% of the crawl, from (seconds, pages, CPU seconds) samples."""
    low = next((s for s in samples if s[1] >= 0.2 * total), None)
    high = next((s for s in samples if s[1] >= 0.8 * total), None)
    if low is None or high is None or high[1] <= low[1]:
        return None
    return 1000 * (high[2] - low[2]) / (high[1] - low[1])


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
                cpus: str = "", threads: int = 0, alone: bool = False, source: str = "",
                processes: int = 0) -> dict[str, Any]:
    """Crawl the web with `nodes` processes (1: standalone; more: a cluster; with `alone`, that many lone nodes
    each crawling the whole web at once) and measure them (`processes`: each node's --page-processes)."""
    seeds = workdir / "seeds.txt"
    seeds.write_text("\n".join(web.seeds) + "\n", encoding="utf-8")
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [env.get("PYTHONPATH")])])
    if args.cpu_profile:  # tests/bench/_cpuprof/sitecustomize.py samples each node on its own CPU time
        args.profile_runs = getattr(args, "profile_runs", 0) + 1
        Path(args.results_dir).mkdir(parents=True, exist_ok=True)  # the nodes write there as they exit
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "_cpuprof"),
                                             *filter(None, [env.get("PYTHONPATH")])])
        kind = ("alone" if alone else f"r{args.replicas}" if nodes > 1 else "lone") + ("-baseline" if source else "")
        env["BENCH_CPU_PROFILE"] = str(Path(args.results_dir).resolve()
                                                 / f"cpu-{args.profile_runs}-{nodes}-{kind}")
    if nodes > 1 and not alone:
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
                proc = subprocess.Popen(_node_cmd(name, data, seeds, dns_port, args, join, cpus, threads, processes,
                                                  source),
                                        stdin=subprocess.DEVNULL, cwd=workdir,  # not the checkout: see --baseline
                                        stdout=err, stderr=err, env=env)
            procs.append((name, proc, log))
            if args.py_spy and i == 0:
                args.spy_runs = getattr(args, "spy_runs", 0) + 1
                out = Path(args.results_dir).resolve() / f"py-spy-{args.spy_runs}-{nodes}node-n0.txt"
                spies.append(subprocess.Popen([shutil.which("py-spy") or "py-spy", "record", "--pid", str(proc.pid),
                                               "--rate", "200", "--format", "raw", "--output", str(out),
                                               "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if nodes > 1 and join is None and not alone:
                deadline = time.perf_counter() + 60
                while not (data / "peer.addr").exists():  # bounded: the node writes it once it listens
                    if proc.poll() is not None or time.perf_counter() > deadline:
                        raise SystemExit(f"bench_scaling: {name} did not start: {log.read_text()[-2000:]}")
                    time.sleep(0.05)
                join = (data / "peer.addr").read_text().strip()
        cpu = user = 0.0
        samples: list[tuple[float, int]] = []  # (seconds since start, pages of all nodes): the steady rate
        cpu_samples: list[tuple[float, int, float]] = []  # (seconds, pages, CPU of all nodes): steady CPU per page
        worker_samples: list[tuple[float, int, float]] = []  # the same for the nodes' page workers
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
                    before = [_proc_cpu(p.pid) for _n, p, _l in procs]
                    pages = _pages_now(workdir, nodes)
                    after = [_proc_cpu(p.pid) for _n, p, _l in procs]
                    if pages is not None:
                        samples.append((last_sample - t0, pages))
                        if None not in before and None not in after:  # every node alive: its CPU is readable
                            cpu_now = sum((a + b) / 2 for a, b in zip(before, after))  # type: ignore[operator]
                            cpu_samples.append((last_sample - t0, pages, cpu_now))
                            if processes:
                                worker_samples.append((last_sample - t0, pages,
                                                       sum(_children_cpu(p.pid) for _n, p, _l in procs)))
                time.sleep(0.05)
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode != 0:
                raise SystemExit(f"bench_scaling: {name} exited {proc.returncode}: {log.read_text()[-2000:]}")
            cpu += usage.ru_utime + usage.ru_stime
            user += usage.ru_utime
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
            "steady_cpu_ms_per_page": _steady_cpu(cpu_samples, pages),
            "steady_workers_ms_per_page": _steady_cpu(worker_samples, pages) if processes else None,
            "cpu_ms_per_page": 1000 * cpu / max(1, pages), "user_share": user / max(cpu, 1e-9), "web_cpu_s": _cpu_seconds(web.processes) - web_cpu0,
            "per_node_pages": [int(f.get("pages", 0)) for f in finals]}


def run_together(web: BenchWeb, dns_port: int, groups: list[dict[str, Any]], args: argparse.Namespace,
                 workdir: Path) -> list[dict[str, Any]]:
    """Crawl the web with every group at once, each on its own: a group is a lone node ({"nodes": 1}) or a
    cluster ({"nodes": 2, "replicas": R}), with the code of {"source": SRC} or this checkout. Running them
    side by side gives each the same machine at the same moments, so their CPU per page compares even while
    other work comes and goes on it (``--together``)."""
    seeds = workdir / "seeds.txt"
    seeds.write_text("\n".join(web.seeds) + "\n", encoding="utf-8")
    started: list[tuple[int, str, subprocess.Popen[bytes], Path]] = []
    args.profile_runs = getattr(args, "profile_runs", 0) + 1
    t0 = time.perf_counter()
    try:
        for k, group in enumerate(groups):
            env = dict(os.environ)
            if group.get("source"):
                env["PYTHONPATH"] = os.pathsep.join([group["source"], *filter(None, [env.get("PYTHONPATH")])])
            if group["nodes"] > 1:
                env["PEERCRAWL_CLUSTER_SECRET"] = f"{SECRET}-{k}"
            if args.cpu_profile:  # as in run_cluster: each node sampled on its own CPU time
                Path(args.results_dir).mkdir(parents=True, exist_ok=True)
                env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "_cpuprof"),
                                                     *filter(None, [env.get("PYTHONPATH")])])
                kind = (f"r{group.get('replicas')}" if group["nodes"] > 1 else "lone") + \
                    ("-baseline" if group.get("source") else "")
                env["BENCH_CPU_PROFILE"] = str(Path(args.results_dir).resolve()
                                               / f"cpu-together-{args.profile_runs}-{kind}")
                env["BENCH_CPU_PROFILE_WINDOW"] = "1"  # counted from 20% to 80% of the crawl (signals below)
            args.replicas = group.get("replicas")
            join = None
            for i in range(group["nodes"]):
                name = f"g{k}n{i}"
                data = workdir / name
                shutil.rmtree(data, ignore_errors=True)
                log = workdir / f"{name}.log"
                with open(log, "wb") as err:
                    proc = subprocess.Popen(_node_cmd(f"n{i}", data, seeds, dns_port, args, join,
                                                      source=group.get("source", "")),
                                            stdin=subprocess.DEVNULL, cwd=workdir, stdout=err, stderr=err, env=env)
                started.append((k, name, proc, log))
                if group["nodes"] > 1 and join is None:
                    deadline = time.perf_counter() + 60
                    while not (data / "peer.addr").exists():  # bounded: the node writes it once it listens
                        if proc.poll() is not None or time.perf_counter() > deadline:
                            raise SystemExit(f"bench_scaling: {name} did not start: {log.read_text()[-2000:]}")
                        time.sleep(0.05)
                    join = (data / "peer.addr").read_text().strip()
        cpu = [0.0] * len(groups)
        switches = [[0, 0] for _ in groups]  # voluntary (the node waited) and involuntary (preempted)
        # (pages, CPU seconds) of each group's nodes, every 2 s while all of them run: its CPU per page
        # between 20% and 80% of its crawl, without start-up (imports, the join) and the end (the last rounds)
        cpu_samples: list[list[tuple[float, int, float]]] = [[] for _ in groups]
        expected = args.hosts * args.pages_per_host  # the bench web's pages, all allowed
        window: list[list[int]] = [[] for _ in groups]  # pages when the profile window opened and closed
        last_sample = 0.0
        for k, name, proc, log in started:
            deadline = t0 + args.time_limit
            while True:  # bounded by the time limit
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    break
                if time.perf_counter() > deadline:
                    raise SystemExit(f"bench_scaling: {name} ran past {args.time_limit} s")
                if time.perf_counter() - last_sample >= 2.0:  # a cluster node's /status costs about 2 ms
                    last_sample = time.perf_counter()
                    for g in range(len(groups)):
                        mine = [(n, p) for gk, n, p, _l in started if gk == g]
                        before = [_proc_cpu(p.pid) for _n, p in mine]
                        pages = _pages_now(workdir, 0, [n for n, _p in mine])
                        after = [_proc_cpu(p.pid) for _n, p in mine]
                        if pages is not None and None not in before and None not in after:
                            cpu_now = sum((a + b) / 2 for a, b in zip(before, after))  # type: ignore[operator]
                            cpu_samples[g].append((last_sample - t0, pages, cpu_now))
                            if args.cpu_profile and len(window[g]) < 2 and pages >= (0.2, 0.8)[len(window[g])] * expected:
                                window[g].append(pages)  # --cpu-profile: open, then close, the sampler's window
                                for _n, p in mine:
                                    with contextlib.suppress(ProcessLookupError):
                                        os.kill(p.pid, signal.SIGUSR1 if len(window[g]) == 1 else signal.SIGUSR2)
                time.sleep(0.05)
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode != 0:
                raise SystemExit(f"bench_scaling: {name} exited {proc.returncode}: {log.read_text()[-2000:]}")
            cpu[k] += usage.ru_utime + usage.ru_stime
            switches[k][0] += usage.ru_nvcsw
            switches[k][1] += usage.ru_nivcsw
    finally:
        for _k, _name, proc, _log in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = []
    for k, group in enumerate(groups):
        pages = sum(int(_final_stats(log).get("pages", 0)) for g, _n, _p, log in started if g == k)
        out.append({**group, "pages": pages, "cpu_s": cpu[k], "cpu_ms_per_page": 1000 * cpu[k] / max(1, pages),
                    "steady_cpu_ms_per_page": _steady_cpu(cpu_samples[k], pages), "cpu_samples": cpu_samples[k],
                    "profile_window_pages": window[k], "context_switches": switches[k],
                    "switches_per_page": [n / max(1, pages) for n in switches[k]]})
    return out


def _ratio(run: dict[str, Any], reference: dict[str, Any]) -> str:
    """The steady CPU per page of two runs and their ratio, as printed."""
    a, b = run.get("steady_cpu_ms_per_page"), reference.get("steady_cpu_ms_per_page")
    return f"{a:.3f} / {b:.3f} ms = {a / b:.3f}x" if a and b else "not sampled"


def together(args: argparse.Namespace) -> None:
    """``--together``: each round runs a lone node and the cluster (each --cluster-replicas setting), and with
    --baseline the same for the baseline's code, all at once; the ratios are taken within each round."""
    settings = [int(x) for x in args.cluster_replicas.split(",") if x.strip()] or [None]
    sources = [""] + ([str(Path(args.baseline).resolve())] if args.baseline else [])
    groups = [{"nodes": 1, "source": src} for src in sources]
    groups += [{"nodes": 2, "replicas": r, "source": src} for src in sources for r in settings]
    rounds: list[list[dict[str, Any]]] = []
    Path(args.results_dir).mkdir(parents=True, exist_ok=True)  # --cpu-profile writes there as nodes exit
    with tempfile.TemporaryDirectory(prefix="peercrawl-bench-together-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with _bench_web(args) as web:
            dns, dns_port = _start_dns(web.zone, workdir)
            try:
                print(f"web: {web.kind}, {args.hosts} hosts x {args.pages_per_host} pages, --store {args.store}; "
                      f"each round: {len(groups)} crawls at once", flush=True)
                for i in range(args.repeat):
                    load = os.getloadavg()[0]
                    rows = run_together(web, dns_port, groups if i % 2 == 0 else groups[::-1], args, workdir)
                    rounds.append(rows)
                    for src in sources:
                        mine = [r for r in rows if r["source"] == src]
                        lone = next(r for r in mine if r["nodes"] == 1)
                        for r in (r for r in mine if r["nodes"] == 2):
                            print(f"round {i + 1}{' [baseline]' if src else ''}, load {load:.1f}: cluster (--replicas "
                                  f"{'default' if r['replicas'] is None else r['replicas']}) / lone node, CPU per "
                                  f"page: {r['cpu_ms_per_page']:.3f} / {lone['cpu_ms_per_page']:.3f} ms = "
                                  f"{r['cpu_ms_per_page'] / lone['cpu_ms_per_page']:.3f}x ({r['pages']} and "
                                  f"{lone['pages']} pages); 20%-80%: {_ratio(r, lone)}", flush=True)
            finally:
                _stop(dns)
    results = Path(args.results_dir).resolve()
    results.mkdir(parents=True, exist_ok=True)
    doc = {"bench": "bench_scaling --together", "args": vars(args), "rounds": rounds, "loadavg": os.getloadavg()}
    (results / "bench_scaling_together.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


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
    p.add_argument("--pin", action="store_true",
                   help="every node on core 0, the web server and the name server on the other cores")
    p.add_argument("--baseline", metavar="SRC", default="",
                   help="also run every round with the code of this source tree (first on PYTHONPATH)")
    p.add_argument("--cpu-profile", action="store_true",
                   help="sample every node on its own CPU time (tests/bench/_cpuprof) into the results dir")
    p.add_argument("--together", action="store_true",
                   help="run the lone node and the clusters of each round at once (see run_together)")
    p.add_argument("--contention", action="store_true",
                   help="also two lone nodes crawling the whole web at once, in each round")
    p.add_argument("--cluster-replicas", default="",
                   help="comma-separated --replicas settings for the cluster runs (default: the node's default)")
    p.add_argument("--replica-cost", action="store_true",
                   help="instead: two nodes with --replicas 1 against two with --replicas 0, alternated")
    p.add_argument("--mode", choices=["nodes", "cores"], default="nodes",
                   help="nodes: two nodes against one; cores: one node on every core against itself on one")
    p.add_argument("--page-threads", type=int, default=2, help="--mode cores: the free node's --page-threads")
    p.add_argument("--page-processes", type=int, default=0,
                   help="--mode cores: the free node's --page-processes instead of page threads (0: threads); "
                        "--mode nodes (without --together): every node's --page-processes")
    p.add_argument("--wide-web", action="store_true",
                   help="crawl the real-markup web instead (REAL_WEB: 2,000 hosts x 50 pages built like real ones, "
                        "python3-doc's documents on a fifth of the hosts, 20%% of links to other hosts, 31 hosts per "
                        "address, 5%% Crawl-delay 2); with --filler the filler wide web (WIDE_WEB)")
    p.add_argument("--filler", action="store_true",
                   help="the filler web (a list of links and filler words per page) instead of the real-markup one")
    args = p.parse_args()
    args.replicas = None
    if args.wide_web:
        args.hosts, args.pages_per_host = WIDE_WEB["hosts"], WIDE_WEB["pages_per_host"]
    if args.mode == "cores":
        return cores(args)
    if args.together:
        return together(args)
    results = Path(args.results_dir).resolve()
    results.mkdir(parents=True, exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 16384), hard), hard))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="peercrawl-bench-scaling-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with _bench_web(args) as web:
            dns, dns_port = _start_dns(web.zone, workdir)
            cpus = ""
            if args.pin:
                cpus = "0"
                others = list(range(1, os.cpu_count() or 1)) or [0]
                for proc in [*web.processes, dns]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        for q in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                            q.cpu_affinity(others)
            try:
                print(f"web: {web.kind}, {args.hosts} hosts x {args.pages_per_host} pages, --store {args.store}"
                      f"{', nodes on core 0, the web on the others' if args.pin else ''}", flush=True)
                settings = [int(x) for x in args.cluster_replicas.split(",") if x.strip()] or [None]
                plan: list[tuple[int, int | None | str]] = (
                    [(2, 0), (2, 1)] if args.replica_cost
                    else [(1, None), *((2, r) for r in settings), *([(2, "alone")] if args.contention else [])])
                sources = [""] + ([str(Path(args.baseline).resolve())] if args.baseline else [])
                for i in range(args.repeat):
                    for (nodes, replicas), source in [(run, source) for source in sources for run in plan][
                            :: 1 if i % 2 == 0 else -1]:
                        alone = replicas == "alone"
                        args.replicas = None if alone else replicas
                        r = run_cluster(web, dns_port, nodes, args, workdir, cpus=cpus, alone=alone, source=source,
                                        processes=args.page_processes)
                        r["replicas"] = None if alone else replicas
                        r["alone"] = alone
                        r["baseline"] = bool(source)
                        rows.append(r)
                        if source:
                            print("  [baseline]", end="")
                        if alone:
                            print("  two lone nodes at once:", end="")
                        elif replicas is not None:
                            print(f"  --replicas {replicas}:", end="")
                        r["repeat"] = i
                        r["load"] = os.getloadavg()[0]
                        steady = r["steady_pages_per_s"]
                        steady_cpu = r["steady_cpu_ms_per_page"]
                        print(f"  {nodes} node(s): {r['pages']} pages in {r['wall_s']:.1f} s = "
                              f"{r['pages_per_s']:.0f} pages/s end to end, "
                              f"{'-' if steady is None else f'{steady:.0f}'} pages/s from 20% to 80%, "
                              f"{r['cpu_ms_per_page']:.3f} ms CPU/page "
                              f"({'-' if steady_cpu is None else f'{steady_cpu:.3f}'} from 20% to 80%), "
                              f"user {100 * r['user_share']:.0f}%, load {r['load']:.1f}, "
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
    overhead: list[dict[str, Any]] = []
    for i, baseline in ((i, b) for i in range(args.repeat) for b in ([False, True] if args.baseline else [False])):
        # pair by pair: each cluster run against the lone run of the same round and code
        mine = [r for r in rows if r["repeat"] == i and r["baseline"] == baseline]
        lone = next(r for r in mine if r["nodes"] == 1)
        pair = next((r for r in mine if r["alone"]), None)
        for r in (r for r in mine if r["nodes"] == 2 and not r["alone"]):
            if baseline:
                print("[baseline] ", end="")
            if pair is not None:
                print(f"round {i + 1}, cluster (--replicas {'default' if r['replicas'] is None else r['replicas']}) "
                      f"/ two lone nodes at once, CPU per page: {r['cpu_ms_per_page'] / pair['cpu_ms_per_page']:.3f}x "
                      f"end to end (two lone / one lone: {pair['cpu_ms_per_page'] / lone['cpu_ms_per_page']:.3f}x)")
            steady = (r["steady_cpu_ms_per_page"] / lone["steady_cpu_ms_per_page"]
                      if r["steady_cpu_ms_per_page"] and lone["steady_cpu_ms_per_page"] else None)
            overhead.append({"repeat": i, "replicas": r["replicas"], "baseline": baseline,
                             "ratio": r["cpu_ms_per_page"] / lone["cpu_ms_per_page"], "steady_ratio": steady})
            print(f"round {i + 1}, cluster (--replicas {'default' if r['replicas'] is None else r['replicas']}) "
                  f"/ lone node, CPU per page: {r['cpu_ms_per_page']:.3f} / {lone['cpu_ms_per_page']:.3f} ms = "
                  f"{overhead[-1]['ratio']:.3f}x end to end; from 20% to 80%: "
                  f"{'-' if steady is None else f'{steady:.3f}x'} (target <= 1.1x)")
    ones = [r["pages_per_s"] for r in rows if r["nodes"] == 1 and not r["baseline"]]
    twos = [r["pages_per_s"] for r in rows if r["nodes"] == 2 and not r["alone"] and not r["baseline"]][:: len(settings)]
    ratios = [b / a for a, b in zip(ones, twos)]
    s1 = [r["steady_pages_per_s"] for r in rows if r["nodes"] == 1 and not r["baseline"]]
    s2 = [r["steady_pages_per_s"] for r in rows if r["nodes"] == 2 and not r["alone"] and not r["baseline"]][
        :: len(settings)]
    steady = [b / a for a, b in zip(s1, s2) if a and b]
    load = os.getloadavg()
    print(f"two nodes / one node, pages per second end to end: {', '.join(f'{x:.2f}x' for x in ratios)}; "
          f"from 20% to 80% of the crawl: {', '.join(f'{x:.2f}x' for x in steady) or '-'} "
          f"(target >= 1.8x); load average {load[0]:.1f} on {os.cpu_count()} cores")
    doc = {"bench": "bench_scaling", "args": vars(args), "rows": rows, "ratios": ratios, "steady_ratios": steady,
           "cpu_overhead": overhead, "loadavg": load}
    (results / "bench_scaling.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


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
    # --baseline SRC: the first two configurations again with that tree's code, in the same rounds
    base = str(Path(args.baseline).resolve()) if args.baseline else ""
    plan = [(label, cpus, threads, processes, "") for label, cpus, threads, processes in configs]
    if base:
        plan += [(f"[baseline] {label}", cpus, threads, processes, base)
                 for label, cpus, threads, processes in configs[:2]]
    with tempfile.TemporaryDirectory(prefix="peercrawl-bench-cores-") as tmp:
        workdir = Path(tmp)
        with _bench_web(args) as web:
            dns, dns_port = _start_dns(web.zone, workdir)
            try:
                print(f"web: {web.kind}, {args.hosts} hosts x {args.pages_per_host} pages, --store {args.store}; "
                      f"{os.cpu_count()} cores", flush=True)
                for _ in range(args.repeat):
                    for label, cpus, threads, processes, source in plan:
                        load0 = os.getloadavg()[0]
                        r = run_cluster(web, dns_port, 1, args, workdir, cpus=cpus, threads=threads,
                                        processes=processes, source=source)
                        r["load"] = (load0, os.getloadavg()[0])
                        rows.append((label, r))
                        steady = r["steady_pages_per_s"]
                        print(f"  {label}: {r['pages']} pages in {r['wall_s']:.1f} s = {r['pages_per_s']:.0f} "
                              f"pages/s end to end, {'-' if steady is None else f'{steady:.0f}'} pages/s from 20% "
                              f"to 80%; CPU ms/page {r['cpu_ms_per_page']:.3f} (node's own process "
                              f"{r['own_ms_per_page']:.3f}, from 20% to 80% {_ms(r['steady_cpu_ms_per_page'])}; "
                              f"page workers {r['workers_ms_per_page']:.3f}, from 20% to 80% "
                              f"{_ms(r['steady_workers_ms_per_page'])}), web "
                              f"{1000 * r['web_cpu_s'] / max(1, r['pages']):.3f} ms/page = "
                              f"{r['web_cpu_s'] / r['wall_s']:.2f} of a core; load {r['load'][0]:.1f} -> "
                              f"{r['load'][1]:.1f}", flush=True)
            finally:
                _stop(dns)
    k = len(plan)

    def ratio(i: int, ref: int = 0) -> list[float]:
        return [b["steady_pages_per_s"] / a["steady_pages_per_s"] for (_, a), (_, b) in
                zip(rows[ref::k], rows[i::k]) if a["steady_pages_per_s"] and b["steady_pages_per_s"]]

    for i, (label, _cpus, _t, _p, source) in enumerate(plan[1:], start=1):
        if source and label == f"[baseline] {configs[0][0]}":
            continue
        ref = len(configs) if source else 0
        target = " (target >= 1.7x)" if i == 1 else ""
        print(f"{label} / {plan[ref][0]}, steady pages/s: {', '.join(f'{x:.2f}x' for x in ratio(i, ref)) or '-'}"
              f"{target}")
    if base:
        for key, what in (("own_ms_per_page", "whole crawl"), ("steady_cpu_ms_per_page", "from 20% to 80%")):
            for label in (plan[0][0], plan[1][0]):
                mine = [r[key] for lb, r in rows if lb == label]
                theirs = [r[key] for lb, r in rows if lb == f"[baseline] {label}"]
                print(f"{label}: the node's own process, ms CPU per page ({what}), this tree / baseline: "
                      f"{', '.join(f'{_ms(a)} / {_ms(b)}' for a, b in zip(mine, theirs))}")
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores")
    results = Path(args.results_dir).resolve()
    results.mkdir(parents=True, exist_ok=True)
    doc = {"bench": "bench_scaling --mode cores", "args": vars(args), "rows": [{"config": c, **r} for c, r in rows],
           "loadavg": load}
    (results / "bench_cores.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
