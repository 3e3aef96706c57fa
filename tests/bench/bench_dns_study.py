"""The cached asynchronous DNS study (issue 7) reproduced on our resolver: what a cache and asynchrony buy.

Run: python -m tests.bench.bench_dns_study [--lookups 1000000] [--names 100000] [--concurrency 100]
                                          [--blocking-seconds 40] [--async-prefix 100000] [--plots docs/img]

The study (a C crawler, 2009) resolved 1,000,000 host names drawn from a crawl through a 50,000-entry LRU
cache refreshed every 1,800 s, and reported 2-3x from the cache, about 1.5x from asynchrony and 3-5x from
both. Here the trace is a Zipf draw (exponent ``--zipf``) over ``--names`` names; the name server is
``peerlab.localweb.dns_server`` in its own process, behind ``tests.bench._delay_proxy`` (another process)
adding ``--delay`` seconds each way, so this process's CPU is the client's alone. Four resolvers:

1. blocking: dnspython's stub ``dns.resolver.Resolver`` pointed at the proxy, one look-up at a time. It
   stands in for ``socket.getaddrinfo``, which reads /etc/resolv.conf and cannot be pointed at a port;
2. blocking with our cache: ``storage.LruTtlCache`` in front of (1);
3. asynchronous: ``peer.fetch.dns.CachingResolver`` with its cache and its merging of concurrent look-ups
   bypassed (every look-up asks the server), ``--concurrency`` look-ups in flight;
4. asynchronous with the cache: ``CachingResolver`` as the node uses it, same concurrency.

(1) and (2) are timed on a prefix of the trace for ``--blocking-seconds`` each and extrapolated per look-up
to the whole trace: (2)'s extrapolation replays the whole trace through the same cache on a virtual clock
that advances by the measured cost of a hit or a miss, so TTL expiry during the hours such a run would take
is counted. (3) runs on ``--async-prefix`` look-ups, (4) on the whole trace. A sweep of (3) over
``--sweep`` concurrencies shows the bound: look-ups/s <= concurrency / round-trip time.
Figures are printed beside variant (1), measured in the same run, as a ratio.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import dns.exception
import dns.resolver
import numpy as np
import psutil
import trio

from peer.fetch.dns import CachingResolver, DnsError
from storage import LruTtlCache

_ZONE_SUFFIX = "zipf.test"
_ADDRESS = "127.0.0.1"


@dataclass(slots=True, kw_only=True)
class Result:
    """One variant's run: what was measured, and the whole-trace figures derived from it."""

    name: str
    lookups: int  # look-ups actually run
    wall: float  # seconds for them
    cpu: float  # client CPU seconds (user + sys) for them
    hits: int = 0
    queries: int = 0  # questions sent to the name server
    failures: int = 0
    server_cpu: float = 0.0  # DNS server + proxy CPU seconds during the run
    udp_drops: int = 0  # datagrams the kernel dropped for a full receive buffer during the run (machine-wide)
    extrapolated: bool = False
    full_rate: float = 0.0  # look-ups/s over the whole trace (measured or extrapolated)
    full_cpu_us: float = 0.0  # client CPU µs per look-up over the whole trace
    full_hit_rate: float = 0.0
    progress: list[tuple[float, int]] = field(default_factory=list)  # (seconds, look-ups done)


def zipf_trace(lookups: int, names: int, exponent: float, seed: int) -> list[int]:
    """``lookups`` name indices drawn with P(rank k) proportional to 1 / k**exponent."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, names + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(lookups), side="right")
    return np.minimum(ranks, names - 1).tolist()


def replay(trace: Sequence[int], size: int, ttl: float, hit_cost: float, miss_cost: float) -> tuple[int, float]:
    """Hits of ``trace`` through an LRU/TTL cache on a virtual clock; returns (hits, virtual seconds)."""
    cache: LruTtlCache[int, bool] = LruTtlCache(size)
    now, hits = 0.0, 0
    for key in trace:
        if cache.get(key, now) is None:
            now += miss_cost
            cache.put(key, True, now + ttl)
        else:
            hits += 1
            now += hit_cost
    return hits, now


class Services:
    """The DNS server and the delaying proxy, each its own process; ``nameserver`` is the proxy."""

    def __init__(self, ttl: int, delay: float) -> None:
        fd, self._zone = tempfile.mkstemp(suffix=".zone")
        with os.fdopen(fd, "w") as f:
            f.write(f"*.{_ZONE_SUFFIX} {_ADDRESS}\n")
        self.procs: list[subprocess.Popen[str]] = []
        server = self._start([sys.executable, "-m", "peerlab.localweb.dns_server", "--zone-file", self._zone,
                              "--ttl", str(ttl)])
        proxy = self._start([sys.executable, "-m", "tests.bench._delay_proxy", "--upstream", server,
                             "--delay", str(delay)])
        self.nameserver = proxy
        self.ip, port = proxy.rsplit(":", 1)
        self.port = int(port)
        self._ps = [psutil.Process(p.pid) for p in self.procs]

    def _start(self, argv: list[str]) -> str:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("listening "):
            self.close()
            raise SystemExit(f"bench_dns_study: {argv[2]} did not start (said {line!r})")
        return line.removeprefix("listening ")

    def cpu(self) -> float:
        """CPU seconds used so far by the server and the proxy together."""
        return sum(sum(p.cpu_times()[:2]) for p in self._ps)

    def close(self) -> list[str]:
        """Stop both processes; their last words (the proxy's counters)."""
        said = []
        for proc in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate(timeout=10)
            said += [line for line in out.splitlines() if line.strip()]
        os.unlink(self._zone)
        return said


def udp_receive_buffer_drops() -> int:
    """Linux's machine-wide count of UDP datagrams dropped because a socket's receive buffer was full."""
    try:
        with open("/proc/net/snmp", encoding="ascii") as f:
            rows = [line.split() for line in f if line.startswith("Udp:")]
        return int(rows[1][rows[0].index("RcvbufErrors")])
    except (OSError, ValueError, IndexError):
        return 0


def _name(index: int) -> str:
    return f"h{index}.{_ZONE_SUFFIX}"


def run_blocking(
    services: Services, trace: Sequence[int], seconds: float, cache_size: int, ttl: float
) -> tuple[Result, float, float]:
    """Variant (1) or, with ``cache_size``, (2) for ``seconds``; also the mean wall cost of a hit and a miss."""
    stub = dns.resolver.Resolver(configure=False)
    stub.nameservers = [services.ip]
    stub.port = services.port
    stub.cache = None
    stub.lifetime = 5.0
    cache: LruTtlCache[str, str] | None = LruTtlCache(cache_size) if cache_size else None
    hits = queries = failures = done = 0
    hit_wall = miss_wall = 0.0
    progress: list[tuple[float, int]] = []
    drops0, server0 = udp_receive_buffer_drops(), services.cpu()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    deadline = wall0 + seconds
    next_sample = wall0
    for index in trace:
        t0 = time.perf_counter()
        if t0 >= deadline:
            break
        if t0 >= next_sample:
            progress.append((t0 - wall0, done))
            next_sample += 0.5
        name = _name(index)
        if cache is not None and cache.get(name, time.monotonic()) is not None:
            hits += 1
            hit_wall += time.perf_counter() - t0
        else:
            queries += 1
            try:
                answer = stub.resolve(name, "A")
                ip = answer[0].address
                if cache is not None:
                    served = answer.rrset.ttl if answer.rrset is not None else ttl
                    life = min(max(served, 60.0), ttl)
                    cache.put(name, ip, time.monotonic() + life)
            except dns.exception.DNSException:
                failures += 1
            miss_wall += time.perf_counter() - t0
        done += 1
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    progress.append((wall, done))
    label = "(2) blocking + cache" if cache is not None else "(1) blocking"
    result = Result(name=label, lookups=done, wall=wall, cpu=cpu, hits=hits, queries=queries, failures=failures,
                    server_cpu=services.cpu() - server0, extrapolated=True, progress=progress,
                    udp_drops=udp_receive_buffer_drops() - drops0)
    misses = done - hits
    return result, hit_wall / hits if hits else 0.0, miss_wall / misses if misses else 0.0


async def run_async(
    services: Services, trace: Sequence[int], concurrency: int, cached: bool, cache_size: int, seconds: float
) -> Result:
    """Variant (3) or (4): ``concurrency`` tasks take look-ups from ``trace`` until it ends or ``seconds`` pass."""
    # cache_size 0: the resolver keeps no cache and merges no concurrent look-ups (every call asks)
    resolver = CachingResolver([services.nameserver], cache_size=cache_size if cached else 0, allow_private=True)
    it = iter(trace)
    done = failures = 0
    progress: list[tuple[float, int]] = []
    drops0, server0 = udp_receive_buffer_drops(), services.cpu()
    cpu0, start = time.process_time(), trio.current_time()
    deadline = start + seconds

    async def worker() -> None:
        nonlocal done, failures
        for index in it:
            try:
                await resolver.resolve(_name(index))
            except DnsError:
                failures += 1
            done += 1
            if trio.current_time() >= deadline:
                return

    async def sampler() -> None:
        while True:
            progress.append((trio.current_time() - start, done))
            await trio.sleep(0.5)

    async with trio.open_nursery() as outer:
        outer.start_soon(sampler)
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker)
        outer.cancel_scope.cancel()
    wall, cpu = trio.current_time() - start, time.process_time() - cpu0
    progress.append((wall, done))
    label = "(4) async + cache" if cached else "(3) async"
    return Result(name=label, lookups=done, wall=wall, cpu=cpu, hits=resolver.stats.hits,
                  queries=resolver.stats.queries, failures=failures, server_cpu=services.cpu() - server0,
                  progress=progress, udp_drops=udp_receive_buffer_drops() - drops0)


def finish_measured(result: Result) -> None:
    """Whole-trace figures of a run that covered what it claims (no extrapolation beyond its own rate)."""
    result.full_rate = result.lookups / result.wall
    result.full_cpu_us = result.cpu / result.lookups * 1e6
    result.full_hit_rate = result.hits / result.lookups


def print_report(args: argparse.Namespace, results: list[Result], sweep: list[Result], rtt: float,
                 no_ttl_hit_rate: float) -> None:
    base = results[0].full_rate
    print(f"DNS study: {args.lookups:,} look-ups, Zipf s={args.zipf} over {args.names:,} names, "
          f"cache {args.cache:,} LRU TTL {args.ttl} s, +{args.delay * 1000:g} ms each way "
          f"(one blocking look-up: {rtt * 1000:.1f} ms), async concurrency {args.concurrency}")
    head = (f"{'variant':<22}{'ran':>10}{'wall s':>9}{'look-ups/s':>12}{'vs (1)':>9}"
            f"{'CPU µs/lu':>11}{'hit rate':>10}{'queries':>10}{'srv CPU µs/q':>14}  basis")
    print(head)
    for r in results:
        basis = "prefix, extrapolated" if r.extrapolated else (
            "whole trace" if r.lookups == args.lookups else "prefix, measured")
        srv = r.server_cpu / r.queries * 1e6 if r.queries else 0.0
        print(f"{r.name:<22}{r.lookups:>10,}{r.wall:>9.1f}{r.full_rate:>12,.0f}{r.full_rate / base:>8.1f}x"
              f"{r.full_cpu_us:>11.1f}{r.full_hit_rate:>9.1%}{r.queries:>10,}{srv:>14.0f}  {basis}")
        if r.failures or r.udp_drops:
            print(f"{'':<22}failed look-ups: {r.failures}; UDP datagrams dropped (full receive buffer): {r.udp_drops}")
    print(f"reference: variant (1), measured in this run; LRU hit rate of the whole trace without expiry "
          f"{no_ttl_hit_rate:.1%}")
    print("sweep of (3), asynchronous without cache:")
    print(f"{'in flight':>10}{'look-ups/s':>12}{'bound c/RTT':>13}{'of bound':>10}{'CPU µs/lu':>11}"
          f"{'srv CPU µs/q':>14}{'UDP drops':>11}")
    for c, r in zip(args.sweep, sweep):
        bound = c / rtt
        srv = r.server_cpu / r.queries * 1e6 if r.queries else 0.0
        print(f"{c:>10}{r.full_rate:>12,.0f}{bound:>13,.0f}{r.full_rate / bound:>9.0%}{r.full_cpu_us:>11.1f}"
              f"{srv:>14.0f}{r.udp_drops:>11,}")


def plot(directory: str, results: list[Result], sweep: list[Result], concurrencies: list[int], rtt: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    names = [r.name for r in results]
    colours = ["#888888", "#4c72b0", "#dd8452", "#55a868"]
    base = results[0].full_rate

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    bars = left.bar(names, [r.full_rate for r in results], color=colours)
    left.set_yscale("log")
    left.set_ylabel("look-ups per second (whole trace)")
    left.set_title("Throughput (hatched: extrapolated from a prefix)")
    for bar, r in zip(bars, results):
        if r.extrapolated:
            bar.set_hatch("//")
        left.annotate(f"{r.full_rate / base:,.1f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      ha="center", va="bottom", fontsize=9)
    bars = right.bar(names, [r.full_cpu_us for r in results], color=colours)
    right.set_ylabel("client CPU µs per look-up")
    right.set_title("Client CPU (user + sys) per look-up")
    for bar, r in zip(bars, results):
        right.annotate(f"{r.full_cpu_us:,.1f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                       ha="center", va="bottom", fontsize=9)
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "dns_variants.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.loglog(concurrencies, [r.full_rate for r in sweep], "o-", label="(3) async, measured")
    ax.loglog(concurrencies, [c / rtt for c in concurrencies], "--", color="grey", label="bound: in flight / RTT")
    ax.set_xlabel("look-ups in flight")
    ax.set_ylabel("look-ups per second")
    ax.set_title(f"Asynchrony is bounded by concurrency / RTT ({rtt * 1000:.0f} ms)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "dns_concurrency.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r, colour in zip(results, colours):
        xs = [t for t, _ in r.progress]
        ys = [max(n, 1) for _, n in r.progress]
        ax.plot(xs, ys, color=colour, label=f"{r.name} ({'prefix' if r.extrapolated else 'measured'})")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("look-ups done")
    ax.set_title("Look-ups completed over time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(directory, "dns_progress.png"), dpi=110)
    plt.close(fig)


async def main_async(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    trace = zipf_trace(args.lookups, args.names, args.zipf, args.seed)
    no_ttl_hits, _ = replay(trace, args.cache, float("inf"), 0.0, 0.0)
    print(f"trace of {len(trace):,} look-ups ({len(set(trace)):,} distinct names) ready in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    services = Services(int(args.ttl), args.delay)
    try:
        blocking, _, rtt = run_blocking(services, trace, args.blocking_seconds, 0, args.ttl)
        finish_measured(blocking)
        blocking.full_rate = 1 / rtt if rtt else 0.0
        print(f"(1) done: {blocking.lookups:,} look-ups in {blocking.wall:.1f} s", flush=True)

        cached, hit_cost, miss_cost = run_blocking(services, trace, args.blocking_seconds, args.cache, args.ttl)
        hits, seconds = replay(trace, args.cache, args.ttl, hit_cost, miss_cost)
        cached.full_rate = len(trace) / seconds
        cpu_hit, cpu_miss = _split_cpu(cached, blocking)
        cached.full_cpu_us = (hits * cpu_hit + (len(trace) - hits) * cpu_miss) / len(trace) * 1e6
        cached.full_hit_rate = hits / len(trace)
        print(f"(2) done: {cached.lookups:,} look-ups in {cached.wall:.1f} s; whole trace would take "
              f"{seconds / 3600:.1f} h", flush=True)

        uncached = await run_async(services, trace[: args.async_prefix], args.concurrency, False, args.cache,
                                   args.async_seconds)
        finish_measured(uncached)
        print(f"(3) done: {uncached.lookups:,} look-ups in {uncached.wall:.1f} s", flush=True)

        full = await run_async(services, trace, args.concurrency, True, args.cache, args.async_seconds)
        finish_measured(full)
        print(f"(4) done: {full.lookups:,} look-ups in {full.wall:.1f} s", flush=True)

        sweep = []
        for c in args.sweep:
            r = await run_async(services, trace, c, False, args.cache, args.sweep_seconds)
            finish_measured(r)
            sweep.append(r)
    finally:
        said = services.close()
    results = [blocking, cached, uncached, full]
    print_report(args, results, sweep, rtt, no_ttl_hits / len(trace))
    print("; ".join(said))
    if args.plots:
        plot(args.plots, results, sweep, args.sweep, rtt)
        print(f"plots: {args.plots}/dns_variants.png, dns_concurrency.png, dns_progress.png")


def _split_cpu(cached: Result, blocking: Result) -> tuple[float, float]:
    """CPU seconds per hit and per miss of (2): a miss costs what a look-up of (1) did; hits take the rest."""
    cpu_miss = blocking.cpu / blocking.lookups
    misses = cached.lookups - cached.hits
    cpu_hit = max(cached.cpu - misses * cpu_miss, 0.0) / cached.hits if cached.hits else 0.0
    return cpu_hit, cpu_miss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lookups", type=int, default=1_000_000, help="length of the trace")
    parser.add_argument("--names", type=int, default=100_000, help="distinct names the trace draws from")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of name popularity")
    parser.add_argument("--cache", type=int, default=50_000, help="cache entries (the study's 50,000)")
    parser.add_argument("--ttl", type=float, default=1800.0, help="TTL served and cap on caching (s)")
    parser.add_argument("--delay", type=float, default=0.02, help="latency added each way (s)")
    parser.add_argument("--concurrency", type=int, default=100, help="look-ups in flight for (3) and (4)")
    parser.add_argument("--blocking-seconds", type=float, default=40.0, help="time given to (1) and to (2)")
    parser.add_argument("--async-prefix", type=int, default=100_000, help="look-ups run by (3)")
    parser.add_argument("--async-seconds", type=float, default=300.0, help="time cap for (3) and for (4)")
    parser.add_argument("--sweep", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 100, 300, 1000],
                        help="concurrencies for the sweep of (3), comma-separated")
    parser.add_argument("--sweep-seconds", type=float, default=5.0, help="time per sweep point")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--plots", default="docs/img", help="directory for the PNGs ('' for none)")
    args = parser.parse_args(argv)
    if args.cache < 1 or args.names < 1 or args.lookups < 1 or min(args.sweep) < 1 or args.concurrency < 1:
        parser.error("--lookups, --names, --cache, --concurrency and --sweep values must be at least 1")
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
