"""Revisits on a web of many hosts: disk bytes per revisit against a full record, CPU per revisit against a
first fetch, and how late revisits come against their schedule.

Run: ``python -m tests.bench.bench_revisit [--hosts 1000] [--pages-per-host 3] [--seconds 90]
[--revisit-min 10] [--revisit-max 40]``

The local web (``peerlab.localweb``, served in this process with a ``ChangeSchedule``: a quarter of the pages
change every 15 s, a quarter every 30 s, half never; half the hosts answer conditional requests) and its DNS
server run here; one ``peerd --revisit`` runs as its own process, measured from outside (CPU from /proc). The
first phase lasts until every page was fetched once: its CPU per page is the reference for the CPU per
revisit measured over the rest of the run, in the same run. Disk: the node's own counters give the bytes of
the revisit records written and the bytes the page's last full record took (a revisit record stands in for
it); lateness is the node's (fetch time - due time) over its revisits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

from peerlab.localweb.changes import ChangeSchedule
from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.server import serve_web


def _cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc; no extra library)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _status(control: str) -> dict:
    async with httpx.AsyncClient(timeout=10.0) as client:
        return (await client.get(f"http://{control}/status")).json()


async def run(args: argparse.Namespace) -> dict:
    graph = SiteGraph.generate(seed=7, hosts=args.hosts, pages_per_host=args.pages_per_host, features=False,
                               page_bytes=args.page_bytes)
    changes = ChangeSchedule(start=time.time(), periods=(None, 15.0, None, 30.0))
    tmp = Path(tempfile.mkdtemp(prefix="bench-revisit-"))
    pages_total = 0
    async with trio.open_nursery() as nursery:
        web = await nursery.start(lambda task_status: serve_web(graph, changes=changes, keep_log=False,
                                                                on_record=None, task_status=task_status))
        dns = await nursery.start(serve_dns, graph.zone())
        argv = [sys.executable, "-m", "peer", "start", "--node-id", "bench", "--data-dir", str(tmp / "node"),
                "--control", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--delay", str(args.delay),
                "--concurrency", "256", "--nameserver", f"127.0.0.1:{dns.address[1]}", "--allow-private",
                "--log-format", "json", "--log-level", "warning", "--revisit",
                "--revisit-min", str(args.revisit_min), "--revisit-max", str(args.revisit_max)]
        for seed in web.seeds():
            argv += ["--seed", seed]
        with open(tmp / "node.log", "ab") as log:
            node = subprocess.Popen(argv, stderr=log)
        try:
            while not (tmp / "node" / "control.addr").exists():
                await trio.sleep(0.05)
            control = (tmp / "node" / "control.addr").read_text().strip()
            started, start_cpu = time.time(), _cpu(node.pid)  # the start-up (imports, stores) is left out
            expected = len(graph.expected(port=web.port).fetched)
            # phase 1: every page once
            while True:
                st = await _status(control)
                if st["revisit"]["scheduled"] >= expected or time.time() - started > args.seconds:
                    break
                await trio.sleep(0.25)
            first_cpu, first_at = _cpu(node.pid), time.time()
            first_pages = st["pages"]
            first_revisits = st["revisits"]["fetched"]
            pages_total = st["revisit"]["scheduled"]
            await trio.sleep(max(0.0, args.seconds - (first_at - started)))
            st = await _status(control)
            end_cpu = _cpu(node.pid)
        finally:
            node.send_signal(signal.SIGTERM)
            node.wait(30)
        nursery.cancel_scope.cancel()
    rv = st["revisits"]
    revisits = rv["fetched"] - first_revisits
    unchanged = max(1, rv["unchanged"])
    out = {
        "hosts": args.hosts, "pages": pages_total, "seconds": args.seconds,
        "first_pass_s": round(first_at - started, 1),
        "cpu_ms_per_first_fetch": round(1000 * (first_cpu - start_cpu) / max(1, first_pages), 3),
        "cpu_ms_per_revisit": round(1000 * (end_cpu - first_cpu) / max(1, revisits), 3),
        "revisits": rv["fetched"], "changed": rv["changed"], "unchanged": rv["unchanged"],
        "not_modified": rv["not_modified"],
        "bytes_per_revisit_record": round(rv["record_bytes"] / unchanged, 1),
        "bytes_per_full_record": round((rv["record_bytes"] + rv["bytes_saved"]) / unchanged, 1),
        "late_s": rv["late_s"],
    }
    out["cpu_ratio_revisit_vs_first"] = round(out["cpu_ms_per_revisit"] / max(1e-9, out["cpu_ms_per_first_fetch"]), 3)
    out["disk_ratio_revisit_vs_full"] = round(out["bytes_per_revisit_record"] / max(1e-9, out["bytes_per_full_record"]), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--pages-per-host", type=int, default=3)
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--delay", type=float, default=0.2)
    p.add_argument("--page-bytes", type=int, default=15_000, help="page size (the crawl benchmark's 15 KB)")
    p.add_argument("--revisit-min", type=float, default=10.0)
    p.add_argument("--revisit-max", type=float, default=40.0)
    args = p.parse_args(argv)
    result = trio.run(run, args)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
