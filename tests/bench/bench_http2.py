"""HTTP/2 against HTTP/1.1 on the same TLS web, idle HTTP/2 connections' memory, and a crawl through proxies.

Run: python -m tests.bench.bench_http2 [--hosts 64] [--pages 20] [--rounds 3] [--idle 10000] [--concurrency 32]

The web is Debian's nginx with HTTP/2 over TLS (tests/support/tlsweb.py: the generated site, 15 KB pages, a CA
of its own), every host name resolved to 127.0.0.1 by a stub (no DNS in the figures). Three parts, each with
its reference measured in the same run:

1. CPU per page: the fetcher fetches every page of every host (``--concurrency`` hosts at a time, one request
   in flight per host, pages in turn), HTTP/2 offered and not, in alternating rounds; the best round of each
   is kept. CPU is this process's (nginx runs in its own), so the figure is the client's cost per page.
2. Idle connections: ``--idle`` hosts (``N.idle.test``, one certificate for ``*.idle.test``) each fetched once
   and the connection left idle in the pool; the growth of RSS (and of the Python heap, tracemalloc) divided by
   the connections, for HTTP/2 and for HTTP/1.1 (the reference: a TLS connection with no HTTP/2 state).
3. A crawl through proxies: part 1's crawl direct, through tinyproxy (CONNECT) and through dante (SOCKS5):
   pages/s and CPU per page, each beside the direct figure.
"""

from __future__ import annotations

import argparse
import gc
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import trio

from peer.fetch.http import Fetcher
from peer.fetch.policy import HostPolicies
from tests.support.realproxies import dante, tinyproxy
from tests.support.tlsweb import start_tls_web

UA = "peercrawl-bench/1 (+http://127.0.0.1/)"


class LoopbackResolver:
    async def resolve(self, host: str) -> str:
        return "127.0.0.1"


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def crawl(urls_by_host: Sequence[list[str]], policies: HostPolicies, concurrency: int) -> tuple[int, float,
                                                                                                      float, set[str]]:
    """Fetch every URL, hosts ``concurrency`` at a time; (pages, wall s, CPU s, protocols seen)."""
    pages = 0
    protocols: set[str] = set()
    queue = list(urls_by_host)
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies, max_idle_total=len(urls_by_host) + 8,
                       idle_timeout=600) as fetcher:

        async def worker() -> None:
            nonlocal pages
            while queue:
                for url in queue.pop():
                    resp = await fetcher.fetch(url)
                    assert resp.status == 200, (url, resp.status)
                    protocols.add(resp.protocol)
                    pages += 1

        wall, cpu = time.perf_counter(), time.process_time()
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        return pages, time.perf_counter() - wall, time.process_time() - cpu, protocols


async def idle_memory(port: int, ca_file: Path, count: int, http2: bool, heap: bool) -> tuple[float, int]:
    """RSS KiB per idle connection (or with ``heap``, Python heap KiB per idle connection, traced by
    tracemalloc, whose own bookkeeping would swell RSS), and the connections held."""
    policies = HostPolicies.build(http2=http2, proxy=(), tls={"tls_ca_file": str(ca_file)}, hosts=[])
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies, max_idle_total=count + 8,
                       idle_timeout=3600) as fetcher:
        # warm up: the context, the modules, the first connection's one-off allocations
        await fetcher.fetch(f"https://warm.idle.test:{port}/")
        gc.collect()
        rss0 = _rss_kib()
        if heap:
            tracemalloc.start()
        heap0 = tracemalloc.get_traced_memory()[0]
        sem = trio.Semaphore(64)

        async def one(i: int) -> None:
            async with sem:
                resp = await fetcher.fetch(f"https://h{i}.idle.test:{port}/")
                assert resp.protocol == ("h2" if http2 else "http/1.1")

        async with trio.open_nursery() as nursery:
            for i in range(count):
                nursery.start_soon(one, i)
        gc.collect()
        held = fetcher.pool.idle_count - 1
        grown = (tracemalloc.get_traced_memory()[0] - heap0) / 1024 if heap else _rss_kib() - rss0
        tracemalloc.stop()
    return grown / held, held


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--pages", type=int, default=20, help="pages per host")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--idle", type=int, default=10_000, help="idle connections to hold")
    parser.add_argument("--idle-child", choices=["h2", "http/1.1"], help=argparse.SUPPRESS)
    parser.add_argument("--heap", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.idle_child:  # one idle measurement in a fresh process: no memory left over from another mode
        resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
        per, held = trio.run(idle_memory, args.port, Path(args.ca), args.idle, args.idle_child == "h2", args.heap)
        print(f"{per} {held}")
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    idle = min(args.idle, hard - 512)
    if idle < args.idle:
        print(f"idle connections: {idle:,} (the descriptor limit is {hard:,})")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with start_tls_web(root / "web", hosts=args.hosts, pages_per_host=args.pages, h2_only_fraction=0,
                           proxy_only_fraction=0, extra_names=["*.idle.test"], max_connections=idle + 1024) as web:
            ca = str(web.ca.ca_file)
            urls = [[f"https://{spec.name}:{web.port}" + (f"/p/{j}.html" if j else "/") for j in range(args.pages)]
                    for spec in web.graph.hosts]
            best: dict[bool, tuple[int, float, float]] = {}
            for _ in range(args.rounds):
                for http2 in (True, False):
                    policies = HostPolicies.build(http2=http2, proxy=(), tls={"tls_ca_file": ca}, hosts=[])
                    pages, wall, cpu, protocols = trio.run(crawl, urls, policies, args.concurrency)
                    assert protocols == {"h2" if http2 else "http/1.1"}
                    if http2 not in best or cpu < best[http2][2]:
                        best[http2] = (pages, wall, cpu)
            print(f"== CPU per page, {args.hosts} hosts x {args.pages} pages of 15 KB over TLS, "
                  f"{args.concurrency} hosts at a time, best of {args.rounds} rounds")
            h1 = best[False][2] / best[False][0] * 1e6
            for http2, (pages, wall, cpu) in sorted(best.items(), reverse=True):
                per = cpu / pages * 1e6
                print(f"{'HTTP/2' if http2 else 'HTTP/1.1':>9}: {per:6.0f} µs CPU per page, {pages / wall:6.0f} "
                      f"pages/s ({per / h1:.2f}x HTTP/1.1's CPU)")

            print(f"== idle connections ({idle:,} each, one page fetched on each first)")
            figures: dict[tuple[bool, bool], tuple[float, int]] = {}
            for heap in (False, True):
                for http2 in (False, True):
                    out = subprocess.run(
                        [sys.executable, "-m", "tests.bench.bench_http2", "--idle-child", "h2" if http2 else "http/1.1",
                         "--port", str(web.port), "--ca", ca, "--idle", str(min(idle, 1000) if heap else idle),
                         *(["--heap"] if heap else [])], check=True, capture_output=True, text=True).stdout
                    per, held = out.split()
                    figures[(http2, heap)] = (float(per), int(held))
            for http2 in (False, True):
                (rss, held), (heap, heap_held) = figures[(http2, False)], figures[(http2, True)]
                print(f"{'HTTP/2' if http2 else 'HTTP/1.1':>9}: {rss:5.1f} KiB RSS per idle connection ({held:,} "
                      f"held); {heap:5.1f} KiB of it Python heap ({heap_held:,} traced)")
            print(f"   HTTP/2's own state: {figures[(True, False)][0] - figures[(False, False)][0]:+.1f} KiB RSS, "
                  f"{figures[(True, True)][0] - figures[(False, True)][0]:+.1f} KiB heap per connection beyond an "
                  "HTTP/1.1 TLS connection")

            print(f"== a crawl through proxies ({args.hosts} hosts x {args.pages} pages, HTTP/2 inside the tunnel)")
            with tinyproxy(root) as http_proxy, dante(root) as socks:
                modes = {"direct": [], "tinyproxy CONNECT": [f"http://127.0.0.1:{http_proxy.port}"],
                         "dante SOCKS5": [f"socks5://127.0.0.1:{socks.port}"]}
                results = {}
                for name, proxy in modes.items():
                    policies = HostPolicies.build(http2=True, proxy=proxy, tls={"tls_ca_file": ca}, hosts=[])
                    pages, wall, cpu, _ = trio.run(crawl, urls, policies, args.concurrency)
                    results[name] = (pages / wall, cpu / pages * 1e6)
            direct_rate, direct_cpu = results["direct"]
            for name, (rate, cpu_per) in results.items():
                print(f"{name:>18}: {rate:6.0f} pages/s ({rate / direct_rate:.2f}x direct), {cpu_per:5.0f} µs "
                      f"CPU per page ({cpu_per / direct_cpu:.2f}x direct)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


if __name__ == "__main__":
    main()
