"""Memory at scale: one node's store loaded with 10,000,000 queued URLs over 1,000,000 hosts, and what stays in RAM.

python -m tests.bench.bench_memory [--urls 10000000] [--hosts 1000000] [--dir DIR]

The URLs go in directly through the store (`NodeStore.admit`: dedup check and frontier push in one
transaction, batches of 10,000, as a peer's batches or a hand-off arrive), no crawl. At 1e5, 1e6 and 1e7
queued (each checkpoint that fits `--urls`) it prints:

- push: µs per URL (wall and CPU) over the batches since the previous checkpoint (the reference is the first
  checkpoint's figure, in the same run: flat means a ratio near 1);
- pop: µs per URL for `pop` + `done` (one transaction each, as the engine's fetch loop does) on 2,000 URLs of
  random hosts, which are then pushed back;
- memory: the process's VmRSS split into anonymous memory (Python objects, what the node owns) and file-backed
  pages (LMDB's map: the kernel's page cache, evicted under pressure), and the store's bytes on disk.

Then the in-memory structures of a running node that grow with hosts or URLs, each filled to the size this
web would give it and measured (bytes per entry from the growth of anonymous RSS): the scheduler's per-host
state and heap (`peer.crawl.scheduler.HostScheduler`), without a window (every host with work in memory) and
with the node's window (`--window`, default `max_active_hosts`) at host counts below and past it, and the
crawler's seen-URL memory at its bound. The reference for those is a Python set of the same number of URL
strings; bytes are Python allocations still held (tracemalloc).

With ``--crawl SECONDS`` the loaded store then crawls: a real node process (``python -m peer start --store
warc``) opens it as its data directory and crawls for that long, beside the benchmark web (nginx, ``--web-hosts``
x 50 pages; the loaded hosts resolve to the same nginx, which answers them 404). The node's VmRSS, split into
anonymous memory and file-backed pages (LMDB's map, the WARC files), is sampled from ``/proc/PID/status``
twice a second; printed are its peaks against the 1 GB target, the node's own peak (VmHWM, from its "node
stopped" line) and the pages it fetched.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from contextlib import ExitStack
from pathlib import Path

from peer.config import DEFAULTS
from peer.crawl.scheduler import HostScheduler
from peerlab.localweb.bench import BenchWeb, start_bench_web
from storage import NodeStore, QueuedUrl
from tests.bench.bench_crawl import BENCH_DOMAIN, _final_stats, _start_dns, _stop

GB = 10**9

CHECKPOINTS = (100_000, 1_000_000, 10_000_000)
BATCH = 10_000
POPS = 2_000


def rss(pid: int | str = "self") -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[name] = int(value.split()[0]) * 1024
    return out


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def host_name(h: int) -> str:
    return f"www.site{h}.example{h % 97}.test"


def url_of(i: int, hosts: int, origin: str = "https://{}") -> tuple[str, str]:
    """URL i: host i mod `hosts` (so every host gets its share), a path shaped like a real site's; `origin`
    formats the host into scheme, host and port."""
    h = i % hosts
    host = host_name(h)
    return f"{origin.format(host)}/section-{(i // hosts) % 13}/article/{i}.html", host


def load(store: NodeStore, urls: int, hosts: int, origin: str = "https://{}") -> list[dict[str, float]]:
    rows = []
    rng = random.Random(7)
    done = 0
    spent = cpu = 0.0
    last = 0
    checkpoints = sorted({c for c in CHECKPOINTS if c < urls} | {urls})
    for checkpoint in checkpoints:
        while done < checkpoint:
            n = min(BATCH, checkpoint - done)
            items = []
            for i in range(done, done + n):
                url, host = url_of(i, hosts, origin)
                items.append(QueuedUrl(url=url, host=host, depth=1 + i % 5))
            t, c = time.perf_counter(), time.process_time()
            store.admit(items)
            spent += time.perf_counter() - t
            cpu += time.process_time() - c
            done += n
        push_us = spent / (done - last) * 1e6
        push_cpu = cpu / (done - last) * 1e6
        spent, cpu, last = 0.0, 0.0, done
        # pop + done on random hosts (one transaction each, as the fetch loop), then push the URLs back
        sample = [host_name(rng.randrange(min(hosts, done))) for _ in range(POPS)]
        t, c = time.perf_counter(), time.process_time()
        popped = []
        for host in sample:
            item = store.frontier.pop(host)
            if item is not None:
                store.frontier.done(item)
                popped.append(item)
        pop_us = (time.perf_counter() - t) / max(1, len(popped)) * 1e6
        pop_cpu = (time.process_time() - c) / max(1, len(popped)) * 1e6
        store.frontier.push(popped)
        store.sync()
        gc.collect()
        mem = rss()
        rows.append({
            "queued": len(store.frontier), "hosts": min(hosts, done), "push_us": push_us, "pop_us": pop_us,
            "push_cpu": push_cpu, "pop_cpu": pop_cpu,
            "rss": mem["VmRSS"], "anon": mem["RssAnon"], "file": mem["RssFile"], "disk": store.disk_bytes(),
        })
        r = rows[-1]
        first = rows[0]
        print(f"  {r['queued']:>12,} queued on {r['hosts']:>9,} hosts:\n"
              f"      push     {push_us:7.1f} µs/URL wall, {push_cpu:6.1f} CPU ({push_cpu / first['push_cpu']:.2f}x "
              f"the first checkpoint's CPU)\n"
              f"      pop+done {pop_us:7.1f} µs/URL wall, {pop_cpu:6.1f} CPU ({pop_cpu / first['pop_cpu']:.2f}x)\n"
              f"      RSS {mib(r['rss'])} = anonymous {mib(r['anon'])} + LMDB pages {mib(r['file'])}; "
              f"disk {r['disk'] / r['queued']:.0f} B/URL", flush=True)
    return rows


def grown(build) -> tuple[object, int]:
    """What `build()` returns and the bytes of Python memory it holds (tracemalloc: exact, and not fooled by
    memory an earlier structure freed to the allocator)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        thing = build()
        gc.collect()
        return thing, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def in_memory(hosts: int, seen_bound: int, window: int) -> None:
    print(f"\n== in-memory structures that grow with hosts or URLs ({hosts:,} hosts) ==")

    def scheduler(n: int, max_active: int) -> HostScheduler:
        """Every one of `n` hosts woken with work, as a crawl that found them would (those beyond the window
        are refused and stay on disk)."""
        s = HostScheduler(max_active=max_active)
        for h in range(n):
            s.wake(host_name(h), 0.0)
        return s

    def url_set(n: int) -> set[str]:
        return {url_of(i, hosts)[0] for i in range(n)}

    ref, ref_bytes = grown(lambda: url_set(hosts))
    print(f"  reference: a Python set of {hosts:,} URL strings      {ref_bytes / hosts:6.0f} B each "
          f"({mib(ref_bytes)})")
    del ref
    sched, sched_bytes = grown(lambda: scheduler(hosts, 0))
    print(f"  scheduler, no window: every host waiting (HostTurn + heap)  {sched_bytes / hosts:6.0f} B per host "
          f"({mib(sched_bytes)}; {sched_bytes / ref_bytes:.2f}x the set)")
    del sched
    for n in sorted({max(1, window // 2), window, 2 * window, 5 * window, hosts}):
        if n > hosts:
            continue
        sched, sched_bytes = grown(lambda n=n: scheduler(n, window))
        print(f"  scheduler, window {window:,}: {n:>9,} hosts with work -> {len(sched.turns):>9,} in memory, "
              f"{mib(sched_bytes):>8} ({sched_bytes / n:6.0f} B per host; {sched_bytes / len(sched.turns):4.0f} B "
              f"per resident)", flush=True)
        del sched
    seen, seen_bytes = grown(lambda: {url_of(i, hosts)[0]: host_name(i % hosts) for i in range(seen_bound)})
    print(f"  crawler seen-URL memory at its bound ({seen_bound:,})    {seen_bytes / seen_bound:6.0f} B per URL "
          f"({mib(seen_bytes)})")
    del seen


def crawl(data: Path, seconds: float, web: BenchWeb, dns_port: int, workdir: Path) -> None:
    """A real node on the loaded data directory crawls for `seconds`; its memory is sampled from outside."""
    print(f"\n== a node crawls for {seconds:.0f} s with the loaded store as its data directory ==")
    seeds = workdir / "seeds.txt"
    seeds.write_text("\n".join(web.seeds) + "\n", encoding="utf-8")
    log_file = workdir / "node.log"
    cmd = [sys.executable, "-m", "peer", "start", "--node-id", "bench-memory", "--listen", "127.0.0.1:0",
           "--control", "127.0.0.1:0", "--seeds-file", str(seeds), "--allow-host", BENCH_DOMAIN,
           "--allow-host", "test", "--allow-private", "--nameserver", f"127.0.0.1:{dns_port}",
           "--delay", "0", "--ip-connections", "0", "--concurrency", "256", "--data-dir", str(data),
           "--store", "warc", "--log-format", "json", "--log-level", "info"]
    peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    samples = 0
    t0 = time.perf_counter()
    with open(log_file, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    try:
        while proc.poll() is None and time.perf_counter() - t0 < seconds:  # bounded by `seconds`
            try:
                mem = rss(proc.pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            samples += 1
            for name in peak:
                peak[name] = max(peak[name], mem.get(name, 0))
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    wall = time.perf_counter() - t0
    final = _final_stats(log_file)
    if not final:
        tail = log_file.read_text(errors="replace").splitlines()[-5:]
        raise SystemExit("bench_memory: the node left no 'node stopped' line; last log lines:\n" + "\n".join(tail))
    pages = int(final.get("pages", 0))
    hwm = int(final.get("peak_rss", 0))
    print(f"  {pages:,} pages fetched in {wall:.0f} s ({pages / wall:.0f} pages/s), "
          f"{int(final.get('stored', 0)):,} stored; {samples} samples of /proc/{proc.pid}/status")
    print(f"  the store's mapped pages handed back {int(final.get('store_releases', 0))} times "
          f"(store_resident_mib {DEFAULTS['store_resident_mib']}); 4xx answers (the loaded hosts) "
          f"{int(final.get('status', {}).get('4xx', 0)):,}, 2xx (the web's pages) "
          f"{int(final.get('status', {}).get('2xx', 0)):,}; robots.txt fetches {int(final.get('robots_fetches', 0)):,}")
    print(f"  peak VmRSS {mib(peak['VmRSS'])} (target <= {GB / 2**20:,.0f} MiB: "
          f"{'met' if peak['VmRSS'] <= GB else 'NOT met'}); peak anonymous {mib(peak['RssAnon'])}, "
          f"peak file-backed (LMDB map, WARC) {mib(peak['RssFile'])}; the node's own VmHWM {mib(hwm)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=10_000_000)
    parser.add_argument("--hosts", type=int, default=1_000_000)
    parser.add_argument("--seen-bound", type=int, default=200_000, help="the crawler's seen-URL memory bound")
    parser.add_argument("--dir", type=Path, default=None, help="where the LMDB store goes (default: a temp dir)")
    parser.add_argument("--skip-store", action="store_true", help="only the in-memory structures")
    parser.add_argument("--crawl", type=float, default=0.0, metavar="SECONDS",
                        help="then a real node crawls for SECONDS with the loaded store as its data directory")
    parser.add_argument("--web-hosts", type=int, default=200, help="hosts of the benchmark web for --crawl")
    parser.add_argument("--window", type=int, default=DEFAULTS["max_active_hosts"],
                        help="the scheduler's window of hosts in memory (max_active_hosts)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-memory-", dir=args.dir))
    try:
        if not args.skip_store:
            print(f"== one node's store: {args.urls:,} URLs over {args.hosts:,} hosts, admitted {BATCH:,} at a time ==")
            start = time.perf_counter()
            with ExitStack() as stack:
                origin = "https://{}"
                if args.crawl > 0:  # the web first: the loaded URLs name its port
                    web = stack.enter_context(start_bench_web(hosts=args.web_hosts, pages_per_host=50))
                    zone = dict(web.zone)
                    zone["*.test"] = "127.0.0.1"  # the loaded hosts (www.siteN.exampleM.test): nginx answers 404
                    dns, dns_port = _start_dns(zone, root)
                    stack.callback(_stop, dns)
                    origin = f"http://{{}}:{web.port}"
                # where a node's data directory keeps it (peer.crawl.seenstores.open_node_store)
                with NodeStore.open(root / "node" / "state", map_size=1 << 30, max_map_size=1 << 40) as store:
                    rows = load(store, args.urls, args.hosts, origin)
                print(f"  loaded in {time.perf_counter() - start:.0f} s; peak RSS (VmHWM) {mib(rss()['VmHWM'])}; "
                      f"last: {rows[-1]['queued']:,} queued")
                if args.crawl > 0:
                    crawl(root / "node", args.crawl, web, dns_port, root)
        in_memory(args.hosts, args.seen_bound, args.window)
    finally:
        if not os.environ.get("BENCH_MEMORY_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
