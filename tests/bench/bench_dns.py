"""Resolver costs: cache hits, and misses against the local DNS server.

Run: python -m tests.bench.bench_dns [--names 2000] [--concurrency 64]

Figures, each beside a reference measured in the same run, as a ratio:
- a cache hit (``await resolver.resolve(name)`` for a cached name) vs a bare ``LruTtlCache.get`` of the same
  key: what the resolver adds on every fetch's path;
- cold look-ups of distinct names (A query over UDP to ``peerlab.localweb.dns_server`` in another process,
  ``--concurrency`` in flight) vs dnspython's own stub resolver (``dns.resolver.Resolver.resolve``) run in
  trio worker threads;
- the wire loop alone, one question and its answer: the node's own (``CachingResolver._ask``: a trio UDP
  socket, retransmission round the servers, answers matched to the question) vs dnspython's asynchronous
  query (``dns.asyncquery.udp`` on its trio backend), and dnspython's asynchronous stub resolver
  (``dns.asyncresolver.Resolver.resolve`` on the trio backend, what discovery uses) vs the node's whole
  look-up. CPU per question and questions per second, measured in one run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import dns.asyncbackend
import dns.asyncquery
import dns.asyncresolver
import dns.message
import dns.name
import dns.rdatatype
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

        # The wire loop alone: the node's own vs dnspython's asyncquery on its trio backend (distinct names).
        backend = dns.asyncbackend.get_backend("trio")

        async def measure(prefix: str, ask) -> tuple[float, float]:
            queue = iter(dns.name.from_text(f"{prefix}{i}.bench.test") for i in range(args.names))

            async def worker() -> None:
                for qname in queue:
                    await ask(qname)

            cpu0, wall0 = time.process_time(), time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(args.concurrency):
                    nursery.start_soon(worker)
            return time.perf_counter() - wall0, time.process_time() - cpu0

        async def own_wire(qname: dns.name.Name) -> None:
            response = await resolver._ask(qname, dns.rdatatype.A)
            assert response.answer, qname

        async def their_wire(qname: dns.name.Name) -> None:
            query = dns.message.make_query(qname, dns.rdatatype.A)
            response = await dns.asyncquery.udp(query, ip, timeout=5.0, port=int(port), backend=backend)
            assert response.answer, qname

        their_wire_wall, their_wire_cpu = await measure("w", their_wire)
        own_wire_wall, own_wire_cpu = await measure("v", own_wire)

        # Whole look-ups (no cache): dnspython's asynchronous stub resolver on trio vs the node's.
        async_stub = dns.asyncresolver.Resolver(configure=False)
        async_stub.nameservers = [ip]
        async_stub.port = int(port)
        async_stub.cache = None
        fresh = CachingResolver([nameserver], allow_private=True)

        async def their_lookup(qname: dns.name.Name) -> None:
            await async_stub.resolve(qname, "A", backend=backend)

        async def own_lookup(qname: dns.name.Name) -> None:
            await fresh.resolve(qname.to_text(omit_final_dot=True))

        their_stub_wall, their_stub_cpu = await measure("s", their_lookup)
        own_lookup_wall, own_lookup_cpu = await measure("t", own_lookup)

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
    print()
    print("one question over UDP: the node's wire loop vs dnspython's dns.asyncquery.udp (trio backend)")
    print(f"{'measure':<34}{'ours':>12}{'asyncquery':>12}{'ratio':>8}")
    print(f"{'questions/s':<34}{n / own_wire_wall:>12.0f}{n / their_wire_wall:>12.0f}"
          f"{their_wire_wall / own_wire_wall:>7.2f}x")
    print(f"{'CPU µs per question':<34}{own_wire_cpu / n * 1e6:>12.0f}{their_wire_cpu / n * 1e6:>12.0f}"
          f"{own_wire_cpu / their_wire_cpu:>7.2f}x")
    print("a whole look-up, no cache: the node's resolver vs dns.asyncresolver.Resolver (trio backend)")
    print(f"{'measure':<34}{'ours':>12}{'asyncres.':>12}{'ratio':>8}")
    print(f"{'look-ups/s':<34}{n / own_lookup_wall:>12.0f}{n / their_stub_wall:>12.0f}"
          f"{their_stub_wall / own_lookup_wall:>7.2f}x")
    print(f"{'CPU µs per look-up':<34}{own_lookup_cpu / n * 1e6:>12.0f}{their_stub_cpu / n * 1e6:>12.0f}"
          f"{own_lookup_cpu / their_stub_cpu:>7.2f}x")
    print(f"resolver stats: {resolver.stats.as_dict()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
