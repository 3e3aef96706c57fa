"""The URL-dedup study's table, measured on our backends: time per check, memory per URL, accuracy.

Run: python -m tests.bench.bench_dedup_study [--n 87000 --n 1000000] [--big] [--kinds a,b] [--plot PNG]
                                             [--json FILE]
`--big` adds 10,000,000 URLs for the kinds that fit (the digit trees are skipped there: at 1M they already
take 0.7-1.7 GB, and they grow linearly). Each (kind, n) runs in a fresh subprocess so that resident memory
is that structure's alone. The stream is realistic: host names drawn with a skew, ~70-char URLs, 25% of
checks repeat an earlier URL (mostly a recent one); truth is known exactly from the stream itself, so false
positives and false negatives are counted without a reference set in the measured process. Times cover the
whole call from URL text to answer (hashing included). The reference, measured in the same run, is the
study's hash table: `memory-urls`, a Python set of the URL text; every row shows its ratio to it.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPEAT = 0.25
BATCH = 1000
SINGLES = 20_000
KINDS = ["memory-urls", "memory-md5", "md5-tree", "md5-tree-16", "bloom-1%", "bloom-0.1%", "lmdb", "redis"]
NOT_AT_10M = {"md5-tree", "md5-tree-16"}
WORDS = "news sport world tech blog shop video music photo forum wiki docs help about item story".split()


def rss() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon"):
                out[name] = int(value.split()[0]) * 1024
    return out


class Stream:
    """A deterministic stream of (position, url, truly_new); O(1) memory, so truth costs nothing to keep."""

    def __init__(self, distinct: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.hosts = max(500, distinct // 40)
        self.made = 0  # distinct URLs emitted so far
        # host positions up front, so the measured process allocates nothing for the stream while it runs
        self._positions = [
            int.from_bytes(hashlib.blake2b(self._host(i).encode(), digest_size=8).digest(), "big")
            for i in range(self.hosts)
        ]

    @staticmethod
    def _host(i: int) -> str:
        return f"www.{WORDS[i % len(WORDS)]}{i}.example"

    def url(self, j: int) -> tuple[int, str]:
        h = hashlib.blake2b(j.to_bytes(8, "big"), digest_size=16).digest()
        host_index = int(self.hosts * (h[0] * 256 + h[1] + 1) ** 3 / 65536**3) % self.hosts  # skewed
        host = self._host(host_index)
        pos = self._positions[host_index]
        section, slug = WORDS[h[2] % len(WORDS)], WORDS[h[3] % len(WORDS)]
        query = f"?page={h[5] % 40}" if h[4] < 64 else ""
        return pos, f"https://{host}/{section}/{slug}-{j:x}-{h[6:10].hex()}.html{query}"

    def batch(self, size: int) -> tuple[list[tuple[int, str]], list[bool]]:
        rng, items, truth = self.rng, [], []
        for _ in range(size):
            if self.made and rng.random() < REPEAT:
                if rng.random() < 0.7:
                    j = max(0, self.made - 1 - int(rng.expovariate(1 / 200)))  # a recent URL
                else:
                    j = rng.randrange(self.made)
                truth.append(False)
            else:
                j = self.made
                self.made += 1
                truth.append(True)
            items.append(self.url(j))
        return items, truth


def open_kind(kind: str, distinct: int, tmp: Path, redis_url: str | None):
    from storage import DigitTreeDedup, md5_key, open_dedup

    if kind == "md5-tree-16":  # the study's own tree: 16 hex digits of MD5(url), no host position

        class StudyTree(DigitTreeDedup):
            def add_new_urls(self, items):
                return self.add_new([md5_key(url) for _pos, url in items])

        return StudyTree(key_bytes=8)
    if kind.startswith("bloom-"):
        rate = float(kind.removeprefix("bloom-").rstrip("%")) / 100
        return open_dedup("bloom", None, expected=distinct, fp_rate=rate)
    return open_dedup(kind, tmp / "dedup", redis_url=redis_url, namespace="bench")


def child(kind: str, distinct: int, redis_url: str | None) -> dict:
    """Run one kind at one size in this (fresh) process; return the figures."""
    import storage  # noqa: F401  (imported before the baseline: its modules are not the structure's memory)

    tmp = Path(tempfile.mkdtemp(prefix="dedup-study-"))
    try:
        stream = Stream(distinct)
        warm = Stream(distinct, seed=8)  # one batch's transient objects belong to the baseline, not the store
        for _ in range(2):
            warm.batch(BATCH)
        del warm
        gc.collect()
        before = rss()
        store = open_kind(kind, distinct, tmp, redis_url)
        server_before = store.used_memory() if kind == "redis" else 0
        spent, ops, fp, fn = 0.0, 0, 0, 0
        curve = []  # (distinct stored so far, µs per check over the last tenth)
        tenth, mark, mark_ops, mark_spent, mark_fp = max(1, distinct // 10), 0, 0, 0.0, 0
        fp_last = 0.0  # false positives per new URL over the last tenth: the rate once the structure is full
        while stream.made < distinct:
            items, truth = stream.batch(BATCH)
            t = time.perf_counter()
            answers = store.add_new_urls(items)
            spent += time.perf_counter() - t
            ops += len(items)
            for said, new in zip(answers, truth):
                if said and not new:
                    fn += 1  # said new, was a repeat: the crawler fetches it twice
                elif new and not said:
                    fp += 1  # said seen, was new: the crawler never fetches it
            if stream.made >= min(distinct, (len(curve) + 1) * tenth):
                curve.append((stream.made, (spent - mark_spent) / (ops - mark_ops) * 1e6))
                fp_last = (fp - mark_fp) / (stream.made - mark)
                mark, mark_ops, mark_spent, mark_fp = stream.made, ops, spent, fp
        made = stream.made
        gc.collect()
        after = rss()
        held = {
            "rss": after["VmRSS"] - before["VmRSS"],
            "anon": after["RssAnon"] - before["RssAnon"],
        }
        if kind == "lmdb":
            store.sync()
            held["disk"] = store.disk_bytes()
        if kind == "redis":
            held["server"] = store.used_memory() - server_before
        if hasattr(store, "nbytes"):
            held["structure"] = store.nbytes
        singles = []
        for _ in range(SINGLES // BATCH):
            items, _truth = stream.batch(BATCH)
            singles.extend(items)
        t = time.perf_counter()
        for item in singles:
            store.add_new_urls([item])
        single = (time.perf_counter() - t) / len(singles) * 1e6
        store.close()
        return {
            "kind": kind, "distinct": distinct, "ops": ops, "batched_us": spent / ops * 1e6,
            "single_us": single, "fp": fp, "fp_last": fp_last, "fn": fn, "new": made, "held": held,
            "curve": curve,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def start_redis() -> tuple[subprocess.Popen, str] | None:
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.terminate()
    proc.wait(timeout=10)
    raise SystemExit("redis-server did not start listening within 10 s")


def resident(r: dict) -> int:
    """Resident bytes the structure holds: the server's for Redis, this process's RSS growth otherwise."""
    return r["held"]["server"] if "server" in r["held"] else r["held"]["rss"]


def flush(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushall()
    client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, action="append", help="distinct URLs (repeatable); default 87000, 1000000")
    ap.add_argument("--big", action="store_true", help="also 10,000,000 (several minutes, several GB)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--plot", type=Path, help="write a PNG of µs/check against URLs stored (needs matplotlib)")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "N", "REDIS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, n, url = args.child
        print(json.dumps(child(kind, int(n), None if url == "-" else url)))
        return
    sizes = args.n or [87_000, 1_000_000]
    if args.big:
        sizes.append(10_000_000)
    kinds = args.kinds.split(",")
    server = start_redis() if "redis" in kinds else None
    if "redis" in kinds and server is None:
        print("redis: skipped, redis-server is not installed (apt-get install -y redis-server)")
        kinds.remove("redis")
    results = []
    try:
        for n in sizes:
            print(f"\n== {n:,} distinct URLs, {REPEAT:.0%} of checks repeat, batches of {BATCH:,} ==")
            print(f"{'kind':<12} {'batched µs':>10} {'x set':>6} {'single µs':>9} {'x set':>6} "
                  f"{'resident B/URL':>14} {'x set':>6} {'heap B/URL':>10} {'other B/URL':>14} "
                  f"{'false pos':>10} {'(last 10%)':>10} {'false neg':>9}")
            ref = None
            for kind in kinds:
                if n >= 10_000_000 and kind in NOT_AT_10M:
                    print(f"{kind:<12} skipped at 10M: {'1.7' if kind == 'md5-tree' else '0.7'} GB per million "
                          "URLs at 1M, growing linearly")
                    continue
                if kind == "redis":
                    flush(server[1])
                url = server[1] if kind == "redis" and server else "-"
                out = subprocess.run(
                    [sys.executable, "-m", "tests.bench.bench_dedup_study", "--child", kind, str(n), url],
                    capture_output=True, text=True, check=True,
                )
                r = json.loads(out.stdout)
                results.append(r)
                held = r["held"]
                made = r["new"]  # the last batch may overshoot n by a few hundred
                per = resident(r) / made
                ref = ref or r
                other = ""
                if "disk" in held:
                    other = f"{held['disk'] / made:,.0f} disk"
                elif "server" in held:
                    other = f"{held['rss'] / made:,.0f} client"
                elif "structure" in held:
                    other = f"{held['structure'] / made:,.1f} struct"
                print(f"{kind:<12} {r['batched_us']:>10.2f} {r['batched_us'] / ref['batched_us']:>6.2f} "
                      f"{r['single_us']:>9.2f} {r['single_us'] / ref['single_us']:>6.2f} {per:>14,.1f} "
                      f"{per / (resident(ref) / ref['new']):>6.3f} {held['anon'] / made:>10,.1f} {other:>14} "
                      f"{r['fp'] / made:>10.4%} {r['fp_last']:>10.4%} {r['fn'] / (r['ops'] - made):>9.4%}")
    finally:
        if server:
            server[0].terminate()
            server[0].wait(timeout=10)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    largest = max(r["distinct"] for r in results)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        if r["distinct"] == largest:
            xs, ys = zip(*r["curve"])
            left.plot(xs, ys, marker="o", label=r["kind"])
    left.set(xlabel="distinct URLs stored", ylabel="µs per check-and-insert (batches of 1,000)",
             title=f"Check time as the structure fills ({largest:,} URLs)")
    left.legend(fontsize=8)
    kinds = sorted({r["kind"] for r in results}, key=KINDS.index)
    for n in sorted({r["distinct"] for r in results}):
        row = {r["kind"]: resident(r) / r["new"] for r in results if r["distinct"] == n}
        right.scatter([k for k in kinds if k in row], [row[k] for k in kinds if k in row], label=f"{n:,}")
    right.set_yscale("log")
    right.set(ylabel="resident bytes per URL (log)", title="Memory per distinct URL")
    right.tick_params(axis="x", rotation=45)
    right.legend(title="URLs", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
