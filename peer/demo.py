"""``peerctl demo``: a local web and its DNS server, a peercrawl node crawling it, progress, and a verdict.

The web (``peer.localweb``) is generated from a seed, with robots.txt rules, Crawl-delay, redirects and a
redirect loop, traps, odd charsets, slow and huge pages and names that do not resolve. The node runs as a
real ``peerd`` process talking to that web over loopback through that DNS server. At the end the demo
compares what the web saw with the oracle (the set of pages a correct crawler must fetch) and checks
politeness from the web's own request log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import trio

from .cli import format_status
from .localweb.dns_server import serve_dns
from .localweb.graph import SiteGraph
from .localweb.referee import crawl_delay_violations, max_concurrent_connections_per_host, requested_urls
from .localweb.server import serve_web

__all__ = ["add_arguments", "main", "run_demo"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", type=int, default=40, help="hosts in the local web (default 40)")
    p.add_argument("--pages-per-host", dest="pages_per_host", type=int, default=25, help="(default 25)")
    p.add_argument("--web-seed", dest="web_seed", type=int, default=7, help="generator seed (default 7)")
    p.add_argument("--dir", default="demo-data", help="where node data and logs go (default ./demo-data)")
    p.add_argument("--delay", type=float, default=0.2, help="per-host delay for the node (default 0.2 s)")
    p.add_argument("--resume", action="store_true", help="keep the data dir from an earlier run")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    p.add_argument("--json", action="store_true", help="print the final report as JSON")


def _peerd_command(args: argparse.Namespace, seeds: list[str], dns_port: int, data_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "peer", "start", "--node-id", "demo-1", "--data-dir", str(data_dir),
           "--control", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--nameserver", f"127.0.0.1:{dns_port}",
           "--allow-private", "--delay", str(args.delay), "--exit-when-done", "--log-format", "json"]
    for s in seeds:
        cmd += ["--seed", s]
    return cmd


async def _status(data_dir: Path) -> dict[str, Any] | None:
    try:
        addr = (data_dir / "control.addr").read_text().strip()
    except OSError:
        return None
    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            resp = await client.get(f"http://{addr}/status")
        return resp.json()
    except (httpx.HTTPError, ValueError):
        return None


async def run_demo(args: argparse.Namespace, out=sys.stdout) -> dict[str, Any]:
    base = Path(args.dir).resolve()
    data_dir = base / "node-1"
    if data_dir.exists() and not args.resume:
        shutil.rmtree(data_dir)
    base.mkdir(parents=True, exist_ok=True)
    graph = SiteGraph.generate(seed=args.web_seed, hosts=args.hosts, pages_per_host=args.pages_per_host)
    report: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_web, graph)
        dns = await nursery.start(serve_dns, graph.zone())
        seeds = web.seeds()
        print(f"local web: {len(graph.zone())} hosts on 127.0.0.1:{web.port}, DNS on "
              f"127.0.0.1:{dns.address[1]}, {len(seeds)} seeds", file=out)
        cmd = _peerd_command(args, seeds, dns.address[1], data_dir)
        log_path = base / "node-1.log"
        print(f"starting node: peerd start --data-dir {data_dir} ... (log: {log_path})", file=out)
        with open(log_path, "ab") as log_file:
            proc = await trio.lowlevel.open_process(cmd, stdout=log_file, stderr=log_file)
            try:
                with trio.move_on_after(args.timeout) as scope:
                    while proc.poll() is None:
                        await trio.sleep(1.0)
                        st = await _status(data_dir)
                        if st is not None:
                            q = st["queue"]
                            print(f"  pages {st['pages']:6d}  rate {st['rate']:7.1f}/s  queued {q['urls']:6d}  "
                                  f"hosts waiting {q['hosts_waiting']:4d}  errors {sum(st['errors'].values()):4d}",
                                  file=out, flush=True)
                            report["status"] = st
                if scope.cancelled_caught:
                    print(f"timed out after {args.timeout:.0f} s; stopping the node", file=out)
                    proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(30):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        nursery.cancel_scope.cancel()
    report["exit_code"] = proc.returncode
    expected = web.expected(max_body=10 * 2**20)
    seen = requested_urls(web.log, port=web.port)
    fetched = set(seen)
    report["expected_pages"] = len(expected.fetched)
    report["fetched_pages"] = len(fetched & expected.fetched)
    report["missing"] = sorted(expected.fetched - fetched)
    report["unexpected"] = sorted(fetched - expected.fetched - expected.robots)
    report["disallowed_requested"] = sorted(fetched & expected.disallowed)
    report["fetched_twice"] = sorted(u for u, n in seen.items()
                                     if n > 1 and u not in expected.retried and u not in expected.robots)
    conc = max_concurrent_connections_per_host(web.log)
    report["max_connections_per_host"] = max(conc.values()) if conc else 0
    report["crawl_delay_violations"] = len(crawl_delay_violations(web.log, graph))
    report["warc_files"] = sorted(str(p) for p in (data_dir / "warc").glob("*.warc.gz"))
    report["ok"] = (
        proc.returncode == 0 and not report["missing"] and not report["disallowed_requested"]
        and report["max_connections_per_host"] <= 1 and report["crawl_delay_violations"] == 0
    )
    return report


def main(args: argparse.Namespace) -> int:
    report = trio.run(run_demo, args)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return 0 if report["ok"] else 1
    st = report.get("status")
    if st:
        print(format_status(st))
    print()
    print(f"pages a correct crawler must fetch: {report['expected_pages']}")
    print(f"fetched of those:                   {report['fetched_pages']}")
    print(f"missing:                            {len(report['missing'])}")
    print(f"disallowed by robots but requested: {len(report['disallowed_requested'])}")
    print(f"fetched twice:                      {len(report['fetched_twice'])}")
    print(f"max connections to one host:        {report['max_connections_per_host']}")
    print(f"Crawl-delay violations:             {report['crawl_delay_violations']}")
    for f in report["warc_files"]:
        print(f"WARC: {os.path.relpath(f)}")
    print("verdict: " + ("OK" if report["ok"] else "PROBLEMS (see above)"))
    return 0 if report["ok"] else 1


