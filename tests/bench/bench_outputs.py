"""What the outputs cost: CPU per page of a node with every output on (upload to S3, webhook, the crawl log's
local files and its Redis stream) against the same crawl with none, and with the default (the crawl log's local
files only), side by side in one run.

Run: ``python -m tests.bench.bench_outputs [--hosts 100] [--pages-per-host 40] [--warc-mib 4] [--rounds 1]``

One local web (``peerlab.localweb``: pages built like the web's, python3-doc's documents on a fifth of the hosts
when installed, as the real-markup benchmark web; ``--markup filler`` for the old list of links and filler text)
runs here, its DNS server in a process of its own, and a real S3
server (SeaweedFS, tests/support/s3server.py), a redis-server and a webhook receiver on loopback. Three ``peerd``
processes crawl the whole web at the same time, each into its own data dir: `outputs-on` with ``--upload`` (WARC
files rotated at ``--warc-mib`` so that many files go during the crawl, the last at the stop), ``--webhook`` and
``--crawl-log redis://...`` beside the local crawl-log files; `outputs-off` with none (``crawl_log_local off``);
`default` with the crawl log's local files only. CPU is each process's own (user + system, from /proc at
its control endpoint's start, and its `node stopped` log line at the end), so the start-up is left out and the
final upload is in. Pages are each node's `pages`. The figures are the ratios of the CPU-per-page figures to
that of `outputs-off`; the machine's noise falls on all three. ``--rounds N`` runs the three crawls N times, one
round after the other, and gives each round's ratios and their median (a round's ratio moves by a few points with
the machine's load, more than the outputs cost).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.server import serve_web
from tests.support.redisserver import RedisServer
from tests.support.s3server import BUCKET, WeedS3
from tests.support.webhook_receiver import SECRET, Receiver


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[str, float]:
    """CPU seconds of each of a process's threads so far, by thread: "main" (the node's trio loop, whose id is the
    process's) and "threads" (worker threads: files hashed, the stream's sends, page threads)."""
    out = {"main": 0.0, "threads": 0.0}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        out["main" if tid == str(pid) else "threads"] += seconds
    return out


def _stopped(log: Path) -> dict:
    for line in reversed(log.read_text().splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") == "node stopped":
            return record
    raise RuntimeError(f"no 'node stopped' line in {log}")


async def _node(name: str, tmp: Path, argv: list[str], env: dict[str, str], out: dict) -> None:
    data = tmp / name
    log_path = tmp / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([*argv, "--data-dir", str(data), "--node-id", name], stderr=log, env=env)
    try:
        while not (data / "control.addr").exists():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {log_path.read_text()[-2000:]}")
            await trio.sleep(0.02)
        start_cpu, started = _cpu(proc.pid), time.time()
        threads0 = threads = _threads(proc.pid)
        while proc.poll() is None:
            now = _threads(proc.pid)  # the most seen (a thread that ended takes its time out of the sum)
            threads = {k: max(v, now[k]) for k, v in threads.items()}
            await trio.sleep(0.1)
        assert proc.returncode == 0, log_path.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    stopped = _stopped(log_path)
    out[name] = {"pages": stopped["pages"], "cpu_s": round(stopped["cpu_s"] - start_cpu, 3),
                 "seconds": round(time.time() - started, 1),
                 "cpu_ms_per_page": round(1000 * (stopped["cpu_s"] - start_cpu) / max(1, stopped["pages"]), 4),
                 # worker threads' share, up to the last look before the exit (threads that ended earlier count)
                 "main_thread_cpu_s": round(threads["main"] - threads0["main"], 2),
                 "other_threads_cpu_s": round(threads["threads"] - threads0["threads"], 2)}


async def run(args: argparse.Namespace) -> dict:
    graph = SiteGraph.generate(seed=5, hosts=args.hosts, pages_per_host=args.pages_per_host, features=False,
                               page_bytes=args.page_bytes, markup=args.markup)
    tmp = Path(tempfile.mkdtemp(prefix="bench-outputs-"))
    load = [round(x, 2) for x in os.getloadavg()]  # 1, 5 and 15 minutes: the machine is shared
    s3 = WeedS3(tmp / "weed")
    await trio.to_thread.run_sync(s3.start)
    redis = RedisServer()
    receiver = Receiver()
    dns_proc: subprocess.Popen[str] | None = None
    out: dict = {}
    try:
        async with trio.open_nursery() as nursery:
            web = await nursery.start(lambda task_status: serve_web(graph, keep_log=False, on_record=None,
                                                                    task_status=task_status))
            # the DNS server in a process of its own: in this one, behind the web server that three nodes keep
            # busy, its answers came later than the nodes' 5 s timeout on a loaded machine (robots.txt then
            # counted unavailable, and those hosts not crawled)
            zone_file = tmp / "zone.txt"
            zone_file.write_text("".join(f"{name} {ip}\n" for name, ip in graph.zone().items()))
            dns_proc = subprocess.Popen([sys.executable, "-m", "peerlab.localweb.dns_server", "--zone-file",
                                         str(zone_file)], stdout=subprocess.PIPE, text=True)
            dns_port = int(dns_proc.stdout.readline().rsplit(":", 1)[1]) if dns_proc.stdout else 0
            argv = [sys.executable, "-m", "peer", "start", "--control", "127.0.0.1:0", "--listen", "127.0.0.1:0",
                    "--delay", str(args.delay), "--concurrency", "128", "--allow-private", "--exit-when-done",
                    "--nameserver", f"127.0.0.1:{dns_port}", "--log-format", "json", "--log-level", "info"]
            for seed in web.seeds():
                argv += ["--seed", seed]
            base = {**os.environ, "PEERCRAWL_WARC_MAX_BYTES": str(args.warc_mib << 20)}
            if args.cpu_profile:  # tests/bench/_cpuprof/sitecustomize.py samples each node on its own CPU time
                Path(args.cpu_profile).mkdir(parents=True, exist_ok=True)
                base["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "_cpuprof"),
                                                      *filter(None, [base.get("PYTHONPATH")])])
            every = {**base, **s3.env(), "PEERCRAWL_UPLOAD": f"s3://{BUCKET}/bench",
                     "PEERCRAWL_WEBHOOK": receiver.url, "PEERCRAWL_WEBHOOK_SECRET": SECRET.decode(),
                     "PEERCRAWL_CRAWL_LOG": f"{redis.url}?stream=bench"}
            async with trio.open_nursery() as nodes:
                off = {**base, "PEERCRAWL_CRAWL_LOG_LOCAL": "off"}
                for name, env in (("outputs-on", every), ("outputs-off", off), ("default", base)):
                    if args.cpu_profile:
                        env = {**env, "BENCH_CPU_PROFILE": str(Path(args.cpu_profile).resolve() / f"cpu-{name}")}
                    nodes.start_soon(_node, name, tmp, argv, env, out)
            nursery.cancel_scope.cancel()
        objects = s3.objects("bench/")
        streamed = redis.client().xlen("bench")
    finally:
        if dns_proc is not None:
            dns_proc.terminate()
            dns_proc.wait(timeout=10)
        s3.kill()
        redis.close()
        receiver.close()
    out["objects_uploaded"] = len(objects)
    out["bytes_uploaded"] = sum(objects.values())
    out["crawl_log_records_streamed"] = streamed
    out["webhook_notices"] = len(receiver.accepted())
    # a node that fetched less than the whole web (its DNS or web server starved on a loaded machine) measured
    # another crawl: the ratios are not comparable then
    expected = len(graph.expected().fetched)  # the oracle's pages: on the real-markup web, 404s and 301s too
    out["complete"] = all(out[name]["pages"] == expected for name in ("outputs-on", "outputs-off", "default"))
    out["load_average"] = {"start": load, "end": [round(x, 2) for x in os.getloadavg()]}
    off = max(1e-9, out["outputs-off"]["cpu_ms_per_page"])
    out["cpu_per_page_ratio_on_vs_off"] = round(out["outputs-on"]["cpu_ms_per_page"] / off, 3)
    out["cpu_per_page_ratio_default_vs_off"] = round(out["default"]["cpu_ms_per_page"] / off, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=100)
    p.add_argument("--pages-per-host", type=int, default=40)
    p.add_argument("--page-bytes", type=int, default=15_000, help="page size (the crawl benchmark's 15 KB)")
    p.add_argument("--delay", type=float, default=0.02)
    p.add_argument("--warc-mib", type=int, default=4, help="WARC rotation size of both nodes, in MiB")
    p.add_argument("--cpu-profile", metavar="DIR",
                   help="sample each node on its own CPU time (tests/bench/_cpuprof) into DIR/cpu-NAME.PID; compare "
                        "with python -m tests.bench._cpuprof.report DIR/cpu-outputs-off.PID,PAGES "
                        "DIR/cpu-outputs-on.PID,PAGES")
    p.add_argument("--markup", choices=("real", "filler"), default="real",
                   help="the pages: built like the web's (default) or the old filler pages (figures labelled so)")
    p.add_argument("--rounds", type=int, default=1, help="the three crawls this many times; the median ratios")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    rounds = []
    for k in range(args.rounds):
        result = trio.run(run, args)
        rounds.append(result)
        print(json.dumps({"round": k + 1, **result}, indent=1), flush=True)
    complete = [r for r in rounds if r["complete"]]
    summary = {
        "markup": args.markup, "rounds": len(rounds), "complete_rounds": len(complete),
        "ratios_on_vs_off": [r["cpu_per_page_ratio_on_vs_off"] for r in complete],
        "ratios_default_vs_off": [r["cpu_per_page_ratio_default_vs_off"] for r in complete],
    }
    if complete:
        summary["median_on_vs_off"] = statistics.median(summary["ratios_on_vs_off"])
        summary["median_default_vs_off"] = statistics.median(summary["ratios_default_vs_off"])
    print(json.dumps({"summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
