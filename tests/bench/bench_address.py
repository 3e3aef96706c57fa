"""What per-address limits cost: pages per second with --ip-connections N against per-host limits only
(--ip-connections 0), on a local web with many hosts per server address.

Run: python -m tests.bench.bench_address [--hosts 128] [--addresses 4] [--pages-per-host 12] [--delay 0.25]
     [--nodes 1] [--settings 0,4,1]

The web (peerlab.localweb, features off) serves every host name from one of `--addresses` loopback addresses
(127.0.3.1...), so --hosts/--addresses host names share each address; its DNS server answers for them. For each
setting the same crawl runs to the end with `--nodes` real peerd daemons (a cluster when more than one), and the
figures come from the web's own log: pages, wall time from first to last request, pages/s, the most requests in
service on one address at once (less a 20 ms margin for the server's end stamp, see SLACK). The first setting is the reference each ratio is against.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import trio

from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import max_in_service_per_address
from peerlab.localweb.server import serve_web
from tests.support.crawl import child_env, kill_pid, node_config, peerd_argv

SECRET = "bench-cluster-secret-0123456789"
#: The server stamps a request's end right after its last write to the socket, before its task yields; the OS
#: can still take the server off the CPU between that write and the clock read, so "in service" takes 20 ms off
#: each end as a margin. The strict check, with no margin for overlaps, is tests/test_address_cluster.py.
SLACK = 0.02


async def crawl(graph: SiteGraph, addresses: tuple[str, ...], args, connections: int, tmp: Path) -> dict:
    env = child_env()
    env["PEERCRAWL_CLUSTER_SECRET"] = SECRET
    procs = []
    async with trio.open_nursery() as nursery:
        web = await nursery.start(lambda task_status: serve_web(graph, addresses=addresses, task_status=task_status))
        dns = await nursery.start(serve_dns, graph.zone(addresses))
        seed = None
        try:
            for i in range(args.nodes):
                name = f"n{i}"
                cfg = node_config(tmp / name, web, dns, node_id=name, delay=args.delay, concurrency=64, store="none")
                argv = peerd_argv(cfg) + ["--ip-connections", str(connections)]
                if args.nodes > 1 and seed:
                    argv += ["--join", seed]
                proc = await trio.lowlevel.open_process(argv, env=env if args.nodes > 1 else child_env(),
                                                        stderr=open(tmp / f"{name}.log", "ab"))  # noqa: SIM115
                procs.append(proc)
                if args.nodes > 1:
                    with trio.fail_after(30):
                        while not (tmp / name / "peer.addr").exists():
                            await trio.sleep(0.05)
                    seed = seed or (tmp / name / "peer.addr").read_text().strip()
            with trio.fail_after(600):
                for proc in procs:
                    await proc.wait()
        finally:
            for proc in procs:
                kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
    pages = [r for r in web.log if r.path != "/robots.txt"]
    wall = max(r.end for r in web.log) - min(r.start for r in web.log)
    return {"pages": len(pages), "wall": wall, "rate": len(pages) / wall,
            "in_service": max(max_in_service_per_address(web.log, slack=SLACK).values())}


async def main_async(args) -> None:
    graph = SiteGraph.generate(seed=13, hosts=args.hosts, pages_per_host=args.pages_per_host, links_per_page=8,
                               seed_hosts=8, features=False)
    addresses = tuple(f"127.0.3.{i + 1}" for i in range(args.addresses))
    print(f"web: {args.hosts} hosts x {args.pages_per_host} pages on {args.addresses} addresses "
          f"({args.hosts // args.addresses} hosts per address); per-host delay {args.delay} s; {args.nodes} node(s)")
    results = []
    for connections in args.settings:
        tmp = Path(tempfile.mkdtemp(prefix="bench-address-"))
        try:
            r = await crawl(graph, addresses, args, connections, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        results.append((connections, r))
        ref = results[0][1]["rate"]
        label = "per-host only" if connections == 0 else f"--ip-connections {connections}"
        print(f"{label:22s} pages {r['pages']:5d}  wall {r['wall']:6.2f} s  {r['rate']:7.1f} pages/s  "
              f"max in service per address {r['in_service']:3d}  ratio {r['rate'] / ref:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--addresses", type=int, default=4)
    ap.add_argument("--pages-per-host", type=int, default=12)
    ap.add_argument("--delay", type=float, default=0.25)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--settings", type=lambda s: [int(x) for x in s.split(",")], default=[0, 4, 1])
    trio.run(main_async, ap.parse_args())


if __name__ == "__main__":
    main()
