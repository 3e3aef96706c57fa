"""Resolver costs: cache hits, and misses against the local DNS server.

Run: python -m tests.bench.bench_dns [--names 2000] [--concurrency 64]

Figures, each beside a reference measured in the same run, as a ratio:
- a cache hit (``await resolver.resolve(name)`` for a cached name) vs a bare ``LruTtlCache.get`` of the same
  key: what the resolver adds on every fetch's path;
- cold look-ups of distinct names (A query over UDP to ``peerlab.localweb.dns_server`` in another process,
  ``--concurrency`` in flight) vs dnspython's own stub resolver (``dns.resolver.Resolver.resolve``) run in
  trio worker threads, the usual way to use it under trio (``dns.asyncresolver`` is asyncio-only).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import dns.resolver
import trio

from peer.fetch.dns import CachingResolver
from storage import LruTtlCache


def start_dns(names: list[str]) -> tuple[str, subprocess.Popen[str], str]:
    fd, zone_path = tempfile.mkstemp(suffix=".zone")
    with os.fdopen(fd, "w") as f:
        f.write("*.bench.test 127.0.0.1\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "peerlab.localweb.dns_server", "--zone-file", zone_path],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"bench_dns: the DNS server did not start (said {line!r})")
    return line.removeprefix("listening "), proc, zone_path


async def run(args: argparse.Namespace) -> None:
    names = [f"n{i}.bench.test" for i in range(args.names)]
    nameserver, proc, zone_path = start_dns(names)
    ip, port = nameserver.rsplit(":", 1)
    try:
        resolver = CachingResolver([nameserver], allow_private=True)

        # Cold look-ups, ours.
        it = iter(names)
        cpu0, wall0 = time.process_time(), time.perf_counter()

        async def ours() -> None:
            for name in it:
                await resolver.resolve(name)

        async with trio.open_nursery() as nursery:
            for _ in range(args.concurrency):
                nursery.start_soon(ours)
        ours_wall, ours_cpu = time.perf_counter() - wall0, time.process_time() - cpu0

        # Cold look-ups, dnspython's stub resolver in threads (other names, so nothing is cached anywhere).
        stub = dns.resolver.Resolver(configure=False)
        stub.nameservers = [ip]
        stub.port = int(port)
        stub.cache = None
        other = iter(f"m{i}.bench.test" for i in range(args.names))
        limiter = trio.CapacityLimiter(args.concurrency)
        cpu0, wall0 = time.process_time(), time.perf_counter()

        async def theirs() -> None:
            for name in other:
                await trio.to_thread.run_sync(stub.resolve, name, "A", limiter=limiter)

        async with trio.open_nursery() as nursery:
            for _ in range(args.concurrency):
                nursery.start_soon(theirs)
        stub_wall, stub_cpu = time.perf_counter() - wall0, time.process_time() - cpu0

        # Cache hits vs a bare cache get.
        rounds = 200_000
        hot = names[: min(1000, len(names))]
        t0 = time.perf_counter()
        for i in range(rounds):
            await resolver.resolve(hot[i % len(hot)])
        hit_us = (time.perf_counter() - t0) / rounds * 1e6
        cache: LruTtlCache[str, str] = LruTtlCache(len(hot))
        for name in hot:
            cache.put(name, "127.0.0.1", 1e18)
        now = trio.current_time()
        t0 = time.perf_counter()
        for i in range(rounds):
            cache.get(hot[i % len(hot)], now)
        get_us = (time.perf_counter() - t0) / rounds * 1e6
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        os.unlink(zone_path)

    n = args.names
    print(f"DNS over UDP to the local server on 127.0.0.1, {n} distinct names, {args.concurrency} in flight")
    print(f"{'measure':<34}{'ours':>12}{'reference':>12}{'ratio':>8}")
    print(f"{'cold look-ups/s':<34}{n / ours_wall:>12.0f}{n / stub_wall:>12.0f}{(n / ours_wall) / (n / stub_wall):>7.2f}x")
    print(f"{'cold CPU µs per look-up':<34}{ours_cpu / n * 1e6:>12.0f}{stub_cpu / n * 1e6:>12.0f}{ours_cpu / stub_cpu:>7.2f}x")
    print(f"{'cache hit µs':<34}{hit_us:>12.2f}{get_us:>12.2f}{hit_us / get_us:>7.2f}x")
    print("references: dnspython's stub resolver in trio threads (cold); a bare LruTtlCache.get (hit)")
    print(f"resolver stats: {resolver.stats.as_dict()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
