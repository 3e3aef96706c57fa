"""One node as its store grows: 10^5 to 10^8 seen URLs, up to 10^7 queued over 10^6 hosts, then a crawl on it.

python -m tests.bench.bench_store_growth [--sizes 100000 1000000 10000000 100000000] [--json FILE]
    [--queued 10000000] [--hosts 1000000] [--seconds 60] [--cgroup-mib 1024] [--evict-every 2] [--dir DIR]
    [--frontier-only]

For each size, in ascending order, one store (the node's own `NodeStore`, under ``node/state`` as a data
directory keeps it) grows to ``seen_urls`` seen keys and ``min(--queued, seen_urls / 10)`` queued URLs (links
outnumber pages ten to one): URL i is on host ``i mod --hosts`` and its key is what the node writes
(`url_key(host position, url)`, put in the order the URLs come, not sorted, as a node admits them); a queued URL
is also seen and goes in through `FrontierStore.push` (the node's queue records). The newest keys are left in the
seen store's staging table as a node that admitted them would have them: ``max(STAGE_MIN, folded / STAGE_SHARE)``
(storage/_dedup.py), so the crawl moves staged keys to the large table as a node past that share does. Each loaded host gets the
politeness state a node writes after a Retry-After of 30 days, so the node holds the queue but does not fetch
it: the crawl is of the local web only, the same web at every size (`--max-active-hosts 0` keeps every loaded
host's turn in memory, so the local web's hosts are never left on disk behind them; its memory is in the RSS).

A copy of the store is then a real node's data directory (``python -m peer start --store none``), which crawls
the real-markup local web (peerlab/localweb, `REAL_WEB`) for ``--seconds``. Memory below the store's size: with
``--cgroup-mib N`` (the default, 1024, where this process may make a memory cgroup: v1 ``/sys/fs/cgroup/memory``
or v2 with the memory controller, as root) the node runs in a cgroup of its own whose limit counts its heap and
the page cache it reads the store into, so the kernel keeps the store's hot pages and evicts the rest (the store
file is dropped from the page cache first, so that every page the node reads is charged to it). Without one
(``--cgroup-mib 0``) the store is kept out of memory two ways: the node's own resident budget
(``store_resident_mib``, which hands the store's mapped pages back) and, every ``--evict-every`` seconds,
`posix_fadvise(DONTNEED)` on the store's data file from outside, which empties the kernel's page cache of every
page of the store no process has mapped (hot pages too). Each read of a page not in the cache is a disk read,
counted by the node's ``/proc/PID/io`` ``read_bytes`` and its major faults.

Each row (printed, and in ``--json``): ``seen_urls``, ``queued_urls``, ``hosts``, ``pages`` (fetched between
the end of a warm-up of ``--seconds`` / 4 after the node's first page, and ``--seconds`` later), ``cpu_ms_per_page`` (the node's user +
system CPU over those pages), ``pages_per_s``, ``rss_mib`` (peak VmRSS), ``disk_bytes_per_seen_url`` (pages of
the seen database / its keys), ``disk_bytes_per_queued_url`` (pages of the frontier's databases / queued
URLs), ``file_bytes`` (the data file), ``disk_reads_per_page`` (read_bytes / 4096 / pages), ``majflt_per_page``,
``links_per_page`` (links found per page), ``disk_reads_per_link``, ``memory_limit`` (which of the two ways kept
the store out of memory), ``staged_urls`` (keys in the seen store's staging table), ``load_s`` and ``start_s`` (from the
node's start to its first page: its restore reads the host table and the loaded hosts' states). The reference for CPU is
the first size's figure in the same run (``cpu_ratio``).

``--load-only`` loads each bulk-loaded size's store into a data directory (``loaded-SIZE`` beside the run's
temporary directory) and stops there. ``--crawl-on DATA_DIR`` crawls on such a directory, after the ``--sizes`` rows
(give one small size for the CPU reference), and adds its row: the load and the crawl can then run apart (a 10^9
load takes most of an hour) and the crawl again with other limits. A crawl marks the local web's URLs seen, so a
directory takes one crawl; a second is refused. The node stops cleanly: its data directory then holds the saved
seen filter, and a node started on it again reads it back.

``--frontier-only`` loads each size's queued URLs alone, as above, and prints where a queued URL's disk bytes
go: each frontier database's pages per queued URL, its average key and value, and how full its leaves are.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from urllib.parse import urlsplit
from contextlib import ExitStack
from hashlib import blake2b
from itertools import islice
from pathlib import Path
from typing import Any

from peerlab.localweb.bench import REAL_WEB, BenchWeb, start_bench_web
from ring import host_position_bytes
from storage import FILTER_FILE, HostState, NodeStore, QueuedUrl, host_position
from storage._dedup import DEDUP_DB, STAGE_MIN, STAGE_SHARE, STAGED_DB
from storage._frontier import FRONTIER_DBS, QUEUE
from tests.bench.bench_crawl import BENCH_DOMAIN, _final_stats, _start_dns, _stop

MiB = 2**20
CHUNK = 200_000  # keys per load transaction
PUSH_BATCH = 20_000
BUCKET_BITS = 6  # the bulk load sorts 64 buckets of keys one at a time
BUCKETS = 1 << BUCKET_BITS
START_LIMIT = 2400.0  # seconds a node may take to start on the store (its first page), at most (10^9 keys: 20 min)
RETRY_AFTER = 30 * 86400.0  # the loaded hosts wait that long: the node holds their URLs and does not fetch them


def host_name(h: int) -> str:
    return f"www.site{h}.example{h % 97}.test"


def url_of(i: int, hosts: int) -> str:
    return f"https://{host_name(i % hosts)}/section-{(i // hosts) % 13}/article/{i}.html"


def staged_share(seen: int) -> int:
    """How many of `seen` keys a node that admitted them holds staged (the rest moved to the large table)."""
    return min(seen, max(STAGE_MIN, seen // (STAGE_SHARE + 1)))


class Loader:
    """Grows one store in steps: seen keys first, then queue records, in the order the URLs come."""

    def __init__(self, store: NodeStore, hosts: int) -> None:
        self.store = store
        self.hosts = hosts
        self.positions = [host_position_bytes(host_name(h)) for h in range(hosts)]
        self.seen = 0
        self.queued = 0

    def grow_seen(self, target: int) -> None:
        """Keys up to `target`, in arrival order; the staged ones of the last size move to the large table first
        and the newest `staged_share(target)` are staged (at most the new ones)."""
        env, db, staged = self.store._env, self.store._env.db(b"seen"), self.store._env.db(b"seen_new")
        positions, hosts = self.positions, self.hosts

        def unstage(txn: Any) -> None:
            keys = list(txn.cursor(staged).iternext(keys=True, values=False))
            txn.cursor(db).putmulti([(key, b"") for key in keys], dupdata=False, overwrite=False)
            txn.drop(staged, delete=False)

        env.write(unstage)
        stage_from = max(self.seen, target - staged_share(target))
        while self.seen < target:
            end = min(target, self.seen + CHUNK, stage_from if self.seen < stage_from else target)
            keys = [positions[i % hosts] + blake2b(url_of(i, hosts).encode(), digest_size=8).digest()
                    for i in range(self.seen, end)]
            pairs = [(key, b"") for key in keys]
            into = db if self.seen < stage_from else staged
            env.write(lambda txn, pairs=pairs, into=into: txn.cursor(into).putmulti(pairs, dupdata=False,
                                                                                  overwrite=False))
            self.seen = end

    def bulk_seen(self, target: int, spool: Path, *, hashed: int = 0) -> None:
        """All `target` seen keys at once into an empty store: made, sorted and appended (full leaf pages, where
        a node's inserts in arrival order leave them about 70% full), for sizes where inserting them one by one
        at random would take hours. The keys go first to BUCKETS files under `spool` by their first byte (ring
        order), then each file is sorted in memory and appended: memory holds one bucket (10^9 keys: 250 MB).

        Key i is on host i mod hosts. The first `hashed` keys are their URLs' keys (the queued URLs: a queued
        URL is seen); the fingerprints of the others, URLs the crawl never meets, are drawn from a seeded
        generator in numpy instead of hashing a made-up URL in Python (which was 85% of a 10^9-key load): the
        same uniform 8 bytes."""
        import numpy as np

        if self.seen:
            raise ValueError("bulk_seen needs an empty store")
        positions, hosts = self.positions, self.hosts
        host_positions = np.frombuffer(b"".join(positions), dtype=">u8").astype(np.uint64)
        draw = np.random.Generator(np.random.PCG64(20261129)).bit_generator.random_raw
        spool.mkdir(parents=True, exist_ok=True)
        stage_from = target - staged_share(target)
        files = [open(spool / f"bucket-{b:03d}", "wb") for b in range(BUCKETS)]  # noqa: SIM115 - closed below
        staged_file = open(spool / "staged", "wb")  # noqa: SIM115 - closed below
        try:
            first = 0
            while first < target:
                step = CHUNK if first < hashed else 10 * CHUNK
                last = min(target, first + step, stage_from if first < stage_from else target,
                           hashed if first < hashed else target)
                if first < hashed:
                    keys = np.frombuffer(b"".join(
                        positions[i % hosts] + blake2b(url_of(i, hosts).encode(), digest_size=8).digest()
                        for i in range(first, last)), dtype=">u8").reshape(-1, 2)
                else:
                    keys = np.empty((last - first, 2), dtype=">u8")
                    keys[:, 0] = host_positions[np.arange(first, last, dtype=np.int64) % hosts]
                    keys[:, 1] = draw(last - first)
                staging, first = first >= stage_from, last
                if staging:
                    staged_file.write(keys.tobytes())
                    continue
                bucket = (keys[:, 0] >> np.uint64(64 - BUCKET_BITS)).astype(np.int64)
                order = np.argsort(bucket, kind="stable")
                bounds = np.searchsorted(bucket[order], np.arange(BUCKETS + 1))
                for b in range(BUCKETS):
                    if bounds[b] < bounds[b + 1]:
                        files[b].write(keys[order[bounds[b]:bounds[b + 1]]].tobytes())
        finally:
            for fh in files:
                fh.close()
            staged_file.close()
        env = self.store._env
        for name, paths in ((b"seen", [spool / f"bucket-{b:03d}" for b in range(BUCKETS)]),
                            (b"seen_new", [spool / "staged"])):
            db = env.db(name)
            for path in paths:
                keys = np.fromfile(path, dtype=">u8").reshape(-1, 2)
                path.unlink()
                keys = keys[np.lexsort((keys[:, 1], keys[:, 0]))]
                for first in range(0, len(keys), 10 * CHUNK):
                    block = keys[first:first + 10 * CHUNK].tobytes()
                    pairs = [(block[j:j + 16], b"") for j in range(0, len(block), 16)]
                    env.write(lambda txn, pairs=pairs, db=db: txn.cursor(db).putmulti(pairs, dupdata=False,
                                                                                      append=True))
        self.seen = target

    def grow_queued(self, target: int) -> None:
        hosts, frontier = self.hosts, self.store.frontier
        wait = time.time() + RETRY_AFTER
        while self.queued < target:
            end = min(target, self.queued + PUSH_BATCH)
            frontier.push([QueuedUrl(url=url_of(i, hosts), host=host_name(i % hosts), depth=1 + i % 5)
                           for i in range(self.queued, end)])
            new_hosts = range(min(self.queued, hosts), min(end, hosts))
            if new_hosts:
                frontier.put_states([HostState(host=host_name(h), next_allowed=wait, pages=1) for h in new_hosts])
            self.queued = end


def evict(path: Path) -> None:
    """Drop the file's pages from the kernel's page cache (those no process maps)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")


def make_cgroup(mib: int) -> Path | None:
    """A memory cgroup of its own with a limit of `mib` MiB (heap and page cache), or None where this process
    cannot make one (not root, no memory controller)."""
    name = f"peercrawl-bench-growth-{os.getpid()}"
    candidates = [(CGROUP_V1, "memory.limit_in_bytes")]
    try:
        if "memory" in (CGROUP_V2 / "cgroup.subtree_control").read_text().split():
            candidates.append((CGROUP_V2, "memory.max"))
    except OSError:
        pass
    for root, limit in candidates:
        path = root / name
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            (path / limit).write_text(str(mib * MiB))
            return path
        except OSError:
            path.rmdir()
    return None


def cgroup_peak_mib(cgroup: Path) -> float | None:
    for name in ("memory.max_usage_in_bytes", "memory.peak"):
        try:
            return int((cgroup / name).read_text()) / MiB
        except (OSError, ValueError):
            continue
    return None


def proc_figures(pid: int) -> dict[str, int]:
    """The process's CPU (clock ticks), major faults, read_bytes and VmRSS."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    out["majflt"] = int(fields[9])
    out["cpu_ticks"] = int(fields[11]) + int(fields[12])
    with open(f"/proc/{pid}/io") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name == "read_bytes":
                out["read_bytes"] = int(value)
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                out["rss"] = int(line.split()[1]) * 1024
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status(port: int, data: Path) -> dict[str, Any]:
    token = (data / "control.token").read_text(encoding="utf-8").strip()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/status", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return dict(json.loads(resp.read()))


def crawl(data: Path, seconds: float, evict_every: float, web: BenchWeb, dns_port: int, workdir: Path,
          profile: Path | None = None, cgroup: Path | None = None) -> dict[str, float]:
    """A real node crawls the local web on the data directory `data`, measured from outside: from its first
    page, a warm-up of `seconds` / 4, then `seconds` measured. With `profile`, the node's CPU is sampled over the
    measured window (tests/bench/_cpuprof) into that file; with `cgroup`, the node runs in that memory cgroup."""
    seeds = workdir / "seeds.txt"
    seeds.write_text("\n".join(web.seeds) + "\n", encoding="utf-8")
    config = workdir / "node.toml"
    config.write_text("max_active_hosts = 0\n", encoding="utf-8")
    log_file = workdir / "node.log"
    control = free_port()
    cmd = [sys.executable, "-m", "peer", "start", "--config", str(config), "--node-id", "bench-growth",
           "--listen", "127.0.0.1:0", "--control", f"127.0.0.1:{control}", "--seeds-file", str(seeds),
           "--allow-host", BENCH_DOMAIN, "--allow-host", "test", "--allow-private",
           "--nameserver", f"127.0.0.1:{dns_port}", "--delay", "0", "--ip-connections", "0",
           "--concurrency", "256", "--data-dir", str(data), "--store", "none", "--log-format", "json",
           "--log-level", "info"]
    env = dict(os.environ)
    if profile is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "_cpuprof"),
                                             *filter(None, [env.get("PYTHONPATH")])])
        env["BENCH_CPU_PROFILE"] = str(profile)
        env["BENCH_CPU_PROFILE_WINDOW"] = "1"
    data_file = data / "state" / "data.mdb"
    tick = os.sysconf("SC_CLK_TCK")
    peak_rss = 0
    first_page: float | None = None
    start: dict[str, Any] | None = None
    last: dict[str, Any] = {}
    with open(log_file, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
    if cgroup is not None:  # before the node opens its store: every page of it the node reads is charged there
        (cgroup / "cgroup.procs").write_text(str(proc.pid))
    t0 = time.perf_counter()
    next_evict = t0
    # /status is read once a second until the first page, then only at the window's two ends: its answer costs
    # the node time that grows with the hosts in its window (the slow-host list), which is not the crawl's
    try:
        while proc.poll() is None and time.perf_counter() - t0 < START_LIMIT + 1.25 * seconds:
            now = time.perf_counter()
            if evict_every > 0 and now >= next_evict:
                evict(data_file)
                next_evict = now + evict_every
            try:
                fig = proc_figures(proc.pid)
                peak_rss = max(peak_rss, fig["rss"])
                due = (first_page is None or (start is None and now - first_page >= seconds / 4)
                       or (start is not None and now - start["t"] >= seconds))
                st = status(control, data) if due else None
                # the window's CPU leaves out both /status answers (the bench's requests, not the crawl's): the
                # start is read after its answer, the end before (no page is fetched while the node answers)
                after = proc_figures(proc.pid) if st is not None and start is None else fig
            except (OSError, ValueError):
                time.sleep(0.25)
                continue
            if st is not None:
                sample = {**after, "pages": int(st.get("pages", 0)),
                          "links": int(st.get("links_found", 0)), "t": time.perf_counter()}
                if first_page is None:
                    if sample["pages"] > 0:
                        first_page = now
                elif start is None:
                    start = sample
                    if profile is not None:
                        proc.send_signal(signal.SIGUSR1)
                else:
                    last = sample
                    break
            time.sleep(0.5 if first_page is not None else 1.0)
    finally:
        if profile is not None and proc.poll() is None:
            proc.send_signal(signal.SIGUSR2)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    final = _final_stats(log_file)
    if not final or start is None or not last or last["pages"] <= start["pages"]:
        tail = log_file.read_text(errors="replace").splitlines()[-5:]
        raise SystemExit("bench_store_growth: the node crawled nothing measurable; last log lines:\n"
                         + "\n".join(tail))
    pages = last["pages"] - start["pages"]
    links = max(1, last["links"] - start["links"])
    return {
        "start_s": round(first_page - t0, 1),
        "pages": pages,
        "cpu_ms_per_page": (last["cpu_ticks"] - start["cpu_ticks"]) / tick * 1000 / pages,
        "pages_per_s": pages / (last["t"] - start["t"]),
        "rss_mib": peak_rss / MiB,
        "disk_reads_per_page": (last["read_bytes"] - start["read_bytes"]) / 4096 / pages,
        "majflt_per_page": (last["majflt"] - start["majflt"]) / pages,
        "links_per_page": (last["links"] - start["links"]) / pages,
        "disk_reads_per_link": (last["read_bytes"] - start["read_bytes"]) / 4096 / links,
    }


def measure(args: argparse.Namespace, store: NodeStore, loader: Loader, size: int, root: Path, web: BenchWeb,
            dns_port: int, rows: list[dict[str, Any]], *, bulk: bool) -> dict[str, Any]:
    """Grow the store to `size` seen URLs, copy it to a node's data directory, crawl on it, and give the row."""
    t = time.perf_counter()
    if bulk:
        loader.bulk_seen(size, root / "spool", hashed=min(args.queued, size // 10))
    else:
        loader.grow_seen(size)
    loader.grow_queued(min(args.queued, size // 10))
    store.sync()
    load_s = time.perf_counter() - t
    row: dict[str, Any] = {
        "seen_urls": len(store.dedup), "queued_urls": len(store.frontier), "hosts": min(args.hosts, size),
        "load": "sorted, appended" if bulk else "in arrival order", "load_s": round(load_s, 1),
        "disk_bytes_per_seen_url": store.seen_bytes() / max(1, len(store.dedup)),
        "disk_bytes_per_queued_url": store.frontier_bytes() / max(1, len(store.frontier)),
        "file_bytes": store.disk_bytes(), "staged_urls": store.dedup.staged(),
        "memory_limit": (f"cgroup {args.cgroup_mib} MiB" if args.cgroup_mib else
                         f"store_resident_mib 256 + fadvise every {args.evict_every:g} s"),
    }
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)
    if bulk:  # this store is not grown further: the node crawls on it, with no copy (10^9 keys: 27 GB)
        store.close()
        # the keys were appended past the store's filter, so the filter its close saved lacks them: the node
        # builds its own from the keys, as at a first start
        (root / "base" / "state" / FILTER_FILE).unlink(missing_ok=True)
        if args.load_only:
            loaded = root.parent / f"loaded-{size}"
            shutil.rmtree(loaded, ignore_errors=True)
            (root / "base").rename(loaded)
            row["loaded"] = str(loaded)
            print(f"{row['seen_urls']:>12,} seen {row['queued_urls']:>11,} queued: loaded in {load_s:.0f} s into "
                  f"{loaded} ({row['disk_bytes_per_seen_url']:.1f} B/seen, "
                  f"{row['disk_bytes_per_queued_url']:.0f} B/queued); crawl on it with --crawl-on", flush=True)
            return row
        (root / "base").rename(run)
    else:
        shutil.copytree(root / "base", run)
        evict(root / "base" / "state" / "data.mdb")
    crawl_measured(args, run, root, web, dns_port, f"cpu-{size}", row)
    shutil.rmtree(run, ignore_errors=True)
    row["cpu_ratio"] = row["cpu_ms_per_page"] / (rows[0] if rows else row)["cpu_ms_per_page"]
    print(f"{row['seen_urls']:>12,} seen {row['queued_urls']:>11,} queued: "
          f"{row['cpu_ms_per_page']:6.2f} ms CPU/page ({row['cpu_ratio']:.2f}x), "
          f"{row['pages_per_s']:5.0f} pages/s, RSS {row['rss_mib']:5.0f} MiB, "
          f"{row['disk_bytes_per_seen_url']:5.1f} B/seen, {row['disk_bytes_per_queued_url']:5.0f} "
          f"B/queued, {row['disk_reads_per_page']:.2f} reads/page ({row['majflt_per_page']:.2f} "
          f"majflt, {row['disk_reads_per_link']:.3f}/link), {row['links_per_page']:.0f} links/page; "
          f"{row['memory_limit']}; loaded in {load_s:.0f} s ({row['load']}), "
          f"first page after {row['start_s']:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps([*rows, row], indent=1) + "\n", encoding="utf-8")
    return row


def crawl_measured(args: argparse.Namespace, data: Path, root: Path, web: BenchWeb, dns_port: int,
                   profile_name: str, row: dict[str, Any]) -> None:
    """`crawl` on the data dir `data`, its store file first dropped from the page cache, in a memory cgroup of
    ``--cgroup-mib`` (none at 0), sampled into ``--cpu-profile``/`profile_name`: its figures go into `row`."""
    evict(data / "state" / "data.mdb")
    profile = None
    if args.cpu_profile is not None:
        args.cpu_profile.mkdir(parents=True, exist_ok=True)
        profile = args.cpu_profile / profile_name
    cgroup = make_cgroup(args.cgroup_mib) if args.cgroup_mib else None
    if args.cgroup_mib and cgroup is None:
        raise SystemExit(f"bench_store_growth: cannot make a memory cgroup of {args.cgroup_mib} MiB here")
    try:
        row.update(crawl(data, args.seconds, args.evict_every, web, dns_port, root, profile, cgroup))
    finally:
        if cgroup is not None:
            row["cgroup_peak_mib"] = cgroup_peak_mib(cgroup)
            cgroup.rmdir()


def crawl_on(args: argparse.Namespace, data: Path, root: Path, web: BenchWeb, dns_port: int) -> dict[str, Any]:
    """The row of a crawl on the data dir `data` that `--load-only` loaded, no node having crawled on it yet: its
    counts are read from the store file read-only (opening it as a NodeStore would take the seen filter a clean
    stop saved)."""
    import lmdb

    env = lmdb.open(str(data / "state"), readonly=True, lock=False, max_dbs=64, subdir=True)
    try:
        with env.begin() as txn:
            def entries(name: bytes) -> int:
                return int(txn.stat(env.open_db(name, txn=txn, create=False))["entries"])

            staged = entries(STAGED_DB)
            seen = entries(DEDUP_DB) + staged
            queued = entries(QUEUE)
            host = urlsplit(web.seeds[0]).hostname or ""
            prefix = host_position(host).to_bytes(8, "big")
            for name in (DEDUP_DB, STAGED_DB):
                cur = txn.cursor(env.open_db(name, txn=txn, create=False))
                if cur.set_range(prefix) and cur.key()[:8] == prefix:
                    raise SystemExit(f"bench_store_growth: {data} was crawled on already (URLs of the local web's "
                                     f"{host} are seen there): load a store again with --load-only")
    finally:
        env.close()
    row: dict[str, Any] = {"seen_urls": seen, "queued_urls": queued, "staged_urls": staged, "load": "kept",
                           "memory_limit": f"cgroup {args.cgroup_mib} MiB" if args.cgroup_mib else "none"}
    try:
        crawl_measured(args, data, root, web, dns_port, f"cpu-kept-{seen}", row)
    finally:
        shutil.copy(root / "node.log", data / "bench-node.log")
    print(f"{seen:>12,} seen {queued:>11,} queued (loaded): {row['cpu_ms_per_page']:6.2f} ms CPU/page, "
          f"{row['pages_per_s']:5.0f} pages/s, RSS {row['rss_mib']:5.0f} MiB, {row['disk_reads_per_page']:.2f} "
          f"reads/page ({row['disk_reads_per_link']:.3f}/link), first page after {row['start_s']:.0f} s; "
          f"{row['memory_limit']}", flush=True)
    return row


def frontier_bytes(args: argparse.Namespace, size: int, where: Path) -> None:
    """Queue a size's URLs alone, as `measure` does, and print each frontier database's share of a queued URL's
    disk bytes: its pages (branch + leaf + overflow) per queued URL, its average key and value, and how full its
    leaves are (entries with LMDB's 10 bytes of node header and slot against the leaves' space)."""
    with NodeStore.open(where, map_size=1 << 30, max_map_size=1 << 40) as store:
        t = time.perf_counter()
        Loader(store, args.hosts).grow_queued(min(args.queued, size // 10))
        load_s = time.perf_counter() - t
        queued = len(store.frontier)
        env = store._env
        parts = []
        with env.read() as txn:
            for name in FRONTIER_DBS:
                st = txn.stat(env.db(name))
                if not st["entries"]:
                    continue
                sample = list(islice(txn.cursor(env.db(name)), 100_000))
                key = sum(len(k) for k, _ in sample) / len(sample)
                value = sum(len(v) for _, v in sample) / len(sample)
                pages = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
                fill = (key + value + 10) * st["entries"] / (st["leaf_pages"] * (st["psize"] - 16))
                parts.append(f"{name.decode()} {pages * st['psize'] / queued:.1f} (key {key:.1f}, value {value:.1f}, "
                             f"leaves {fill:.0%} full)")
        print(f"{queued:>11,} queued over {min(args.hosts, queued):,} hosts: "
              f"{store.frontier_bytes() / queued:.1f} disk B/queued = " + " + ".join(parts)
              + f"; loaded in {load_s:.0f} s", flush=True)
    shutil.rmtree(where, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**5, 10**6, 10**7, 10**8])
    parser.add_argument("--queued", type=int, default=10**7, help="queued URLs at most (seen / 10 below that)")
    parser.add_argument("--hosts", type=int, default=10**6)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the node crawls at each size")
    parser.add_argument("--cgroup-mib", type=int, default=None,
                        help="the node's memory cgroup limit (heap + page cache; 0: none). Default: 1024 where "
                             "a memory cgroup can be made here, else 0")
    parser.add_argument("--evict-every", type=float, default=None,
                        help="seconds between evictions of the store from the page cache (0: never). Default: 2 "
                             "without a cgroup, 0 with one")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go (default: a temp dir)")
    parser.add_argument("--bulk-from", type=int, default=10**8,
                        help="sizes from this one on start from an empty store whose seen keys are appended sorted")
    parser.add_argument("--json", type=Path, default=None, help="write the rows there")
    parser.add_argument("--load-only", action="store_true",
                        help="load each bulk-loaded size's store into DIR/loaded-SIZE beside the run's temp dir "
                             "(10^9 keys: 28 GB) and crawl nothing, for --crawl-on")
    parser.add_argument("--frontier-only", action="store_true",
                        help="load only each size's queued URLs (no seen keys, no crawl) and print where their "
                             "disk bytes go, per database")
    parser.add_argument("--crawl-on", type=Path, default=None, metavar="DATA_DIR",
                        help="no load: crawl on this data dir (one --load-only loaded, not crawled on yet) after "
                             "the --sizes rows, and add its row")
    parser.add_argument("--cpu-profile", type=Path, default=None, metavar="DIR",
                        help="sample the node's CPU over each measured window into DIR/cpu-SEEN (tests/bench/_cpuprof)")
    args = parser.parse_args()
    if args.cgroup_mib is None:
        probe = make_cgroup(1024)
        args.cgroup_mib = 1024 if probe is not None else 0
        if probe is not None:
            probe.rmdir()
    if args.evict_every is None:
        args.evict_every = 0.0 if args.cgroup_mib else 2.0
    root = Path(tempfile.mkdtemp(prefix="bench-growth-", dir=args.dir))
    if args.frontier_only:
        try:
            for size in sorted(args.sizes):
                frontier_bytes(args, size, root / f"frontier-{size}")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    rows: list[dict[str, Any]] = []
    try:
        with ExitStack() as stack:
            web = stack.enter_context(start_bench_web(**REAL_WEB))  # type: ignore[arg-type]
            dns, dns_port = _start_dns(dict(web.zone), root)
            stack.callback(_stop, dns)
            grown = sorted(size for size in args.sizes if size < args.bulk_from)
            if grown:
                with NodeStore.open(root / "base" / "state", map_size=1 << 30, max_map_size=1 << 40) as store:
                    loader = Loader(store, args.hosts)
                    for size in grown:
                        rows.append(measure(args, store, loader, size, root, web, dns_port, rows, bulk=False))
                shutil.rmtree(root / "base", ignore_errors=True)
            for size in sorted(size for size in args.sizes if size >= args.bulk_from):
                with NodeStore.open(root / "base" / "state", map_size=1 << 30, max_map_size=1 << 40) as store:
                    loader = Loader(store, args.hosts)
                    rows.append(measure(args, store, loader, size, root, web, dns_port, rows, bulk=True))
                shutil.rmtree(root / "base", ignore_errors=True)
            if args.crawl_on is not None:
                row = crawl_on(args, args.crawl_on, root, web, dns_port)
                row["cpu_ratio"] = row["cpu_ms_per_page"] / (rows[0] if rows else row)["cpu_ms_per_page"]
                rows.append(row)
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    finally:
        if not os.environ.get("BENCH_GROWTH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
