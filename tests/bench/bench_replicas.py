"""Cost of queued-URL replicas (`--replicas R`, peer/cluster/replicas/queuereplicas.py), each figure beside its reference measured
in the same run.

Run: python -m tests.bench.bench_replicas [--runs N] [--hosts H] [--backup-only] [--held N] [--messages N]

1. crawl: a two-node crawl (weights 100 and 100) of a simulated web, the real `Cluster`s and real `Crawler`s over
   the in-memory network under a mock clock (tests/support/clustersim.py), with `--replicas 1` against
   `--replicas 0`, runs alternated. Figures: process CPU per page fetched, and bytes written on the peer links
   per URL queued (every message: SWIM, batches, hand-offs, seen keys, replicas). The mock clock makes the
   crawl's own waiting free, so the CPU figure is the product's code plus the simulation's (the same in both).
2. disk: bytes the node store grows by per replicated URL held (LMDB data file, allocated blocks), for 100,000
   URLs of the crawl's shape; reference: the frontier's bytes per queued URL for the same URLs.
3. backup: CPU per page of a backup holding `QueueReplica` messages shaped like the benchmark crawl's (per 100 ms
   message: 60 pages' adds, the releases of URLs added 30 messages before, their hosts' states) on a store that
   already holds `--held` replicas: journaled and folded every FOLD_ENTRIES entries (the node's way), against each
   message applied in its own transaction (the way before the journal: `hold(..., fold=True)`), alternated.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import trio

from peer.cluster.replicas.queuereplicas import FOLD_ENTRIES
from storage import HostState, NodeStore, QueuedUrl, queued_url_keys
from tests.bench._cluster_helpers import ByteCounter, CountingStream
from tests.support.clustersim import ClusterSim, make_web, run_simulation

LIMIT = 600.0  # virtual seconds: a crawl that takes longer is an error, not a figure


class _CountingMemoryTransport:
    """A node's `MemoryTransport` whose streams count the bytes written into `counter`."""

    def __init__(self, inner, counter: ByteCounter) -> None:
        self._inner = inner
        self.counter = counter

    async def connect(self, address: str) -> trio.abc.Stream:
        return CountingStream(await self._inner.connect(address), self.counter)

    async def serve(self, handler, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async def counted(stream: trio.abc.Stream) -> None:
            await handler(CountingStream(stream, self.counter))

        await self._inner.serve(counted, task_status=task_status)


def crawl_once(replicas: int, *, seed: int, hosts: int) -> dict[str, float]:
    web = make_web(seed, hosts=hosts, island_hosts=0)
    expected = web.reachable(web.seeds)
    counter = ByteCounter()
    out: dict[str, float] = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, replicas=replicas)
        real = sim.net.transport
        sim.net.transport = lambda address: _CountingMemoryTransport(real(address), counter)  # type: ignore
        cpu0 = time.process_time()
        a = await sim.start(0, 100, seeds=web.seeds)
        await sim.start(1, 100, join=a)
        await sim.until(lambda: all(n.cluster.finished.is_set() for n in sim.running()), limit=LIMIT, step=0.5)
        out["cpu"] = time.process_time() - cpu0
        clusters = [n.cluster for n in sim.running()]
        out["pages"] = len(sim.ledger.fetched())
        out["queued"] = sum(n.stats.urls_new for n in sim.running()) + sum(c.dispatcher.stats.urls_new for c in clusters)
        out["replica_urls"] = sum(c.backups.urls_sent for c in clusters)
        out["lost"] = len(expected - sim.ledger.fetched())
        await sim.stop_all()

    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        run_simulation(lambda nursery: body(nursery, Path(tmp)), seed=seed)
    out["bytes"] = counter.written
    return out


def disk_per_url(count: int = 100_000) -> tuple[float, float]:
    """(bytes per replicated URL held, bytes per queued URL in the frontier), same URLs."""
    items = [QueuedUrl(url=f"http://h{i % 5000:04d}.web.test:8080/p/{i}.html", host=f"h{i % 5000:04d}.web.test",
                       depth=2, hops=0, found_on=f"http://h{(i * 7) % 5000:04d}.web.test:8080/p/{i // 3}.html")
             for i in range(count)]
    keys = queued_url_keys(items)
    with tempfile.TemporaryDirectory(prefix="bench-replicas-disk-") as tmp:
        held = NodeStore.open(Path(tmp) / "held")
        queued = NodeStore.open(Path(tmp) / "queued")
        try:
            base_h, base_q = held.disk_bytes(), queued.disk_bytes()
            for i in range(0, count, 2000):
                held.replicas.hold(list(zip(keys[i:i + 2000], items[i:i + 2000])), [], fold=True)
                queued.frontier.push(items[i:i + 2000])
            held.sync()
            queued.sync()
            return (held.disk_bytes() - base_h) / count, (queued.disk_bytes() - base_q) / count
        finally:
            held.close()
            queued.close()


def _url(i: int) -> QueuedUrl:
    host = f"h{(i * 7919) % 1000:04d}.web.test"
    return QueuedUrl(url=f"http://{host}:8080/p/{i}.html", host=host, depth=2, hops=0,
                     found_on=f"http://{host}:8080/p/{i // 30}.html")


def backup_cpu(held: int, messages: int, *, journaled: bool, per_message: int = 60, lag: int = 30) -> float:
    """µs of CPU per page for a backup holding `messages` messages (see the module docstring, part 3)."""
    first = held + per_message * lag
    with tempfile.TemporaryDirectory(prefix="bench-replicas-backup-") as tmp:
        store = NodeStore.open(Path(tmp) / "b")
        try:
            own = [QueuedUrl(url=f"http://own{i % 500}.test/p{i}", host=f"own{i % 500}.test", depth=1, hops=0,
                             found_on=None) for i in range(held)]
            store.admit(own)  # the backup's own crawl in its seen table
            for i in range(0, first, 5000):
                batch = [_url(n) for n in range(i, min(first, i + 5000))]
                store.replicas.hold(list(zip(queued_url_keys(batch), batch)), [], fold=True)
            plan = []
            for m in range(messages):
                start = first + m * per_message
                adds = [_url(n) for n in range(start, start + per_message)]
                gone = [_url(n) for n in range(start - per_message * lag, start - per_message * (lag - 1))]
                states = [HostState(host=i.host, next_allowed=1.0e9 + m, crawl_delay=0.0, failures=0)
                          for i in {i.host: i for i in gone}.values()][: per_message // 2]
                plan.append((list(zip(queued_url_keys(adds), adds)), queued_url_keys(gone), states))
            replicas = store.replicas
            cpu0 = time.process_time()
            for adds, gone, states in plan:
                fold = not journaled or replicas.journaled + len(adds) + len(gone) + len(states) >= FOLD_ENTRIES
                store.hold_replicas(adds, gone, states, fold=fold)
            replicas.fold()
            cpu = time.process_time() - cpu0
            assert len(replicas) == first  # as many added as released
            return cpu / (messages * per_message) * 1e6
        finally:
            store.close()


def backup(held: int, messages: int, runs: int) -> None:
    ratios = []
    for run in range(runs):
        order = (False, True) if run % 2 == 0 else (True, False)
        got = {journaled: backup_cpu(held, messages, journaled=journaled) for journaled in order}
        ratios.append(got[True] / got[False])
        print(f"backup, {held} replicas held: journaled {got[True]:.2f} µs CPU per page, each message applied at "
              f"once {got[False]:.2f} ({ratios[-1]:.3f}x)", flush=True)
    print(f"backup: journaled / each message at once, per run: {', '.join(f'{r:.3f}' for r in ratios)} "
          f"(median {statistics.median(ratios):.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=400)
    parser.add_argument("--backup-only", action="store_true", help="only part 3 (the backup's CPU per page)")
    parser.add_argument("--held", type=int, default=20_000, help="part 3: replicas the backup holds already")
    parser.add_argument("--messages", type=int, default=1000, help="part 3: messages held per run")
    args = parser.parse_args()
    if args.backup_only:
        backup(args.held, args.messages, args.runs)
        return
    results: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for run in range(args.runs):
        for replicas in (0, 1) if run % 2 == 0 else (1, 0):
            r = crawl_once(replicas, seed=100 + run, hosts=args.hosts)
            results[replicas].append(r)
            print(f"run {run} replicas={replicas}: pages {r['pages']:.0f}, queued {r['queued']:.0f}, "
                  f"cpu {r['cpu']:.2f} s, bytes {r['bytes']:.0f}, replica URLs sent {r['replica_urls']:.0f}, "
                  f"lost {r['lost']:.0f}", flush=True)
    cpu = {k: statistics.median(r["cpu"] / r["pages"] * 1e3 for r in v) for k, v in results.items()}
    wire = {k: statistics.median(r["bytes"] / r["queued"] for r in v) for k, v in results.items()}
    ratios_cpu = [a["cpu"] / a["pages"] / (b["cpu"] / b["pages"]) for a, b in zip(results[1], results[0])]
    ratios_wire = [a["bytes"] / a["queued"] / (b["bytes"] / b["queued"]) for a, b in zip(results[1], results[0])]
    print(f"CPU per page: replicas 1 {cpu[1]:.2f} ms, replicas 0 {cpu[0]:.2f} ms; ratio per run pair "
          f"{', '.join(f'{r:.3f}' for r in ratios_cpu)} (median {statistics.median(ratios_cpu):.3f})")
    print(f"wire bytes per URL queued: replicas 1 {wire[1]:.0f}, replicas 0 {wire[0]:.0f}; ratio per run pair "
          f"{', '.join(f'{r:.3f}' for r in ratios_wire)} (median {statistics.median(ratios_wire):.3f})")
    held, queued = disk_per_url()
    print(f"disk: {held:.0f} bytes per replicated URL held, {queued:.0f} per URL queued in the frontier "
          f"(ratio {held / queued:.2f})")
    backup(args.held, args.messages, args.runs)


if __name__ == "__main__":
    main()
