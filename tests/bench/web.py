"""How fast the benchmark web serves, so it is never the bottleneck of a crawl benchmark.

Run: ``python -m tests.bench.web [--hosts 1000] [--pages 50] [--requests 30000] [--concurrency 64]``

Serves 1,000 hosts x 50 pages (about 15 KB, 30 links each) with nginx and, as the reference measured in
the same run, with the multi-process Python fallback server; loads each with the same client (h11 over
trio, one keep-alive connection per host like a polite crawler, ``--concurrency`` hosts at a time) and
prints requests/s and the server's CPU time per request (all its processes), with the ratios. The
crawler's target is 1,000-2,000 pages/s; the last line says what share of one core the web needs for it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

import h11
import psutil
import trio

from peerlab.localweb.bench import BenchWeb, nginx_binary, start_bench_web
from peerlab.localweb.graph import page_path


def _cpu_seconds(web: BenchWeb) -> float:
    total = 0.0
    for proc in web.processes:
        try:
            p = psutil.Process(proc.pid)
            for q in [p, *p.children(recursive=True)]:
                t = q.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


async def _load(web: BenchWeb, requests: int, concurrency: int, time_limit: float) -> tuple[int, int, float]:
    """Fetch robots.txt then every page of host after host until ``requests`` are done; (requests, bytes, s)."""
    hosts: Iterator[str] = iter([h.name for h in web.graph.hosts] * 1000)
    paths = ["/robots.txt"] + [page_path(j) for j in range(web.graph.pages_per_host)]
    done = 0
    received = 0

    async def worker() -> None:
        nonlocal done, received
        for host in hosts:
            if done >= requests:
                return
            stream = await trio.open_tcp_stream("127.0.0.1", web.port)
            conn = h11.Connection(h11.CLIENT)
            try:
                for path in paths:
                    if done >= requests:
                        return
                    if conn.our_state is h11.DONE:
                        conn.start_next_cycle()
                    req = h11.Request(method="GET", target=path, headers=[("Host", host), ("User-Agent", "bench")])
                    await stream.send_all(conn.send(req) + conn.send(h11.EndOfMessage()))
                    while True:
                        event = conn.next_event()
                        if event is h11.NEED_DATA:
                            conn.receive_data(await stream.receive_some(1 << 17))
                        elif isinstance(event, h11.Response):
                            if event.status_code != 200:
                                raise RuntimeError(f"{host}{path} answered {event.status_code}")
                        elif isinstance(event, h11.Data):
                            received += len(event.data)
                        elif isinstance(event, h11.EndOfMessage):
                            break
                    done += 1
            finally:
                await stream.aclose()

    start = time.perf_counter()
    with trio.move_on_after(time_limit):
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
    return done, received, time.perf_counter() - start


def measure(server: str, args: argparse.Namespace, requests: int) -> dict[str, float]:
    t0 = time.perf_counter()
    with start_bench_web(hosts=args.hosts, pages_per_host=args.pages, links_per_page=args.links,
                         page_bytes=args.page_bytes, server=server, workers=args.workers) as web:
        ready = time.perf_counter() - t0
        cpu0, client0 = _cpu_seconds(web), time.process_time()
        done, received, wall = trio.run(_load, web, requests, args.concurrency, args.time_limit)
        server_cpu, client_cpu = _cpu_seconds(web) - cpu0, time.process_time() - client0
    return {"ready_s": ready, "requests": done, "mb": received / 1e6, "wall_s": wall, "rps": done / wall,
            "server_us": server_cpu / done * 1e6, "client_us": client_cpu / done * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.web", description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--pages", type=int, default=50)
    p.add_argument("--links", type=int, default=30)
    p.add_argument("--page-bytes", type=int, default=15_000)
    p.add_argument("--workers", type=int, default=2, help="server processes (nginx workers or Python servers)")
    p.add_argument("--requests", type=int, default=30_000, help="requests against nginx")
    p.add_argument("--reference-requests", type=int, default=10_000, help="requests against the Python server")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--time-limit", type=float, default=120.0, help="seconds per server, at most")
    args = p.parse_args()
    rows = {}
    if nginx_binary() is not None:
        rows["nginx"] = measure("nginx", args, args.requests)
    else:
        print("nginx is not installed (apt-get install -y nginx-light): only the Python server is measured")
    rows["python"] = measure("python", args, args.reference_requests)
    print(f"web: {args.hosts} hosts x {args.pages} pages, {args.page_bytes} B pages, {args.links} links; "
          f"client: 1 process, {args.concurrency} keep-alive connections, one host each")
    print(f"{'server':8} {'ready s':>8} {'requests':>9} {'MB':>7} {'req/s':>8} {'server CPU us/req':>18} "
          f"{'client CPU us/req':>18}")
    for name, r in rows.items():
        print(f"{name:8} {r['ready_s']:8.1f} {r['requests']:9.0f} {r['mb']:7.1f} {r['rps']:8.0f} "
              f"{r['server_us']:18.1f} {r['client_us']:18.1f}")
    if "nginx" in rows:
        n, py = rows["nginx"], rows["python"]
        print(f"nginx / python: {n['rps'] / py['rps']:.2f}x the requests/s, "
              f"{py['server_us'] / n['server_us']:.1f}x less server CPU per request")
    best = rows.get("nginx", rows["python"])
    for rate in (1000, 2000):
        print(f"at {rate} pages/s the web needs {rate * best['server_us'] / 1e6:.0%} of one core")


if __name__ == "__main__":
    main()
