"""Ring benchmark: owner lookup speed, build cost and balance, each beside a reference measured in this run.

Run: ``python -m tests.bench.bench_ring`` (add ``--quick`` to skip the 1,000-node build and the balance sweep).

- lookup: median ns per ``Ring.owner(host)`` on the design ring, against blake2b alone (the hash every lookup
  must pay) and a bare ``bisect.bisect_right`` on a plain list of the same points;
- build: seconds and resident memory for the design ring (4 nodes) and 1,000 nodes;
- balance: worst relative key-space error over the design's three configurations, for several points per
  weight, with the design's node names and with random node names.
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import random
import statistics
import sys
import time

import psutil

from ring import Ring, host_position

DESIGN_STAGES = [{"A": 150, "B": 80, "C": 200, "D": 40}, {"A": 150, "B": 80, "D": 40},
                 {"A": 150, "B": 80, "D": 40, "E": 300}]


def per_call_ns(function, arguments: list, rounds: int = 15) -> float:
    """Median over ``rounds`` of the mean ns per call across ``arguments`` (loop overhead subtracted)."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for argument in arguments:
            function(argument)
        elapsed = time.perf_counter_ns() - start
        start = time.perf_counter_ns()
        for argument in arguments:
            pass
        samples.append((elapsed - (time.perf_counter_ns() - start)) / len(arguments))
    return statistics.median(samples)


def lookups() -> None:
    ring = Ring(DESIGN_STAGES[0])
    rng = random.Random(1)
    hosts = [f"www.host{rng.getrandbits(32)}.example.com" for _ in range(20000)]
    positions = [host_position(h) for h in hosts]
    arcs = ring.arcs()
    points = list(ring._points)  # the same points, as a plain list of ints
    blake = hashlib.blake2b

    owner = per_call_ns(ring.owner, hosts)
    owner_at = per_call_ns(ring.owner_at, positions)
    hash_only = per_call_ns(lambda h: int.from_bytes(blake(h.encode(), digest_size=8).digest(), "big"), hosts)
    bare_bisect = per_call_ns(lambda p: bisect.bisect_right(points, p), positions)
    print(f"lookup on the design ring ({ring.point_count:,} points, {len(arcs):,} arcs), median ns per call:")
    print(f"  Ring.owner(host)           {owner:7.0f} ns   target <= 1000 ns")
    print(f"  Ring.owner_at(position)    {owner_at:7.0f} ns")
    print(f"  ref: blake2b of the host   {hash_only:7.0f} ns   owner / hash    = {owner / hash_only:.2f}")
    print(f"  ref: bare bisect (list)    {bare_bisect:7.0f} ns   owner_at / bisect = {owner_at / bare_bisect:.2f}")


def build(weights: dict[str, int], label: str, ppw: int | None = None) -> None:
    gc.collect()
    process = psutil.Process()
    before = process.memory_info().rss
    start = time.perf_counter()
    ring = Ring(weights) if ppw is None else Ring(weights, points_per_weight=ppw)
    seconds = time.perf_counter() - start
    resident = (process.memory_info().rss - before) / 2**20
    print(f"  {label:<44} {ring.point_count:>11,} points  {seconds:7.2f} s  "
          f"{seconds / ring.point_count * 1e9:6.0f} ns/point  +{resident:6.0f} MiB rss")
    del ring


def builds(quick: bool) -> None:
    print("build (rss growth includes memory the sort frees but the allocator keeps):")
    build(DESIGN_STAGES[0], "design, 4 nodes (A..D), P=1000")
    if quick:
        return
    rng = random.Random(2)
    fleet = {f"node{i:04d}.example.net:7000": rng.randint(1, 10) for i in range(1000)}
    build(fleet, "1,000 nodes, weights 1-10, P=1000")
    fleet = {f"node{i:04d}.example.net:7000": rng.randint(40, 300) for i in range(1000)}
    build(fleet, "1,000 nodes, weights 40-300, P=50", ppw=50)


def worst_error(stages: list[dict[str, int]], ppw: int) -> float:
    worst = 0.0
    for weights in stages:
        ring = Ring(weights, points_per_weight=ppw)
        targets = ring.weight_shares()
        worst = max(worst, max(abs(share / targets[node] - 1) for node, share in ring.shares().items()))
    return worst


def balance(trials: int) -> None:
    print(f"balance: worst |key share / weight share - 1| over the 3 design configurations; random names: "
          f"{trials} sets, median and max")
    rng = random.Random(3)
    for ppw in (1, 10, 100, 300, 1000):
        design = worst_error(DESIGN_STAGES, ppw)
        errors = []
        for _ in range(trials):
            names = {old: f"10.0.{rng.randrange(256)}.{rng.randrange(256)}:{rng.randrange(1024, 65536)}"
                     for old in "ABCDE"}
            stages = [{names[node]: w for node, w in weights.items()} for weights in DESIGN_STAGES]
            errors.append(worst_error(stages, ppw))
        print(f"  P={ppw:<5} design names {design:6.2%}   random names median {statistics.median(errors):6.2%}"
              f"  max {max(errors):6.2%}")


def main() -> None:
    quick = "--quick" in sys.argv
    lookups()
    builds(quick)
    if not quick:
        balance(trials=10)


if __name__ == "__main__":
    main()
