"""Storage benchmark: dedup checks/s, bytes on disk and memory per URL, frontier rates, WARC cost per page.

Run: python -m tests.bench.bench_storage [--n 1000000] [--n 10000000] [--batch 1000]
         [--parts dedup,frontier,warc] [--dir DIR]
Every figure is printed beside a reference measured in the same run (a Python set for dedup, a plain
gzip.compress of the same bytes for WARC, and warcio building the same two records, as the store once did),
with the ratio.
"""

from __future__ import annotations

import argparse
import gzip
import io
import random
import shutil
import tempfile
import time
import zlib
from pathlib import Path

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from storage import DedupStore, FrontierStore, NodeStore, QueuedUrl, WarcPageStore
from storage._warc import exchange_records, gzip_member


def rss() -> dict[str, int]:
    """Resident memory of this process in bytes: anonymous (heap) and file-backed (mapped LMDB pages)."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[name] = int(value.split()[0]) * 1024
    return out


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def key_batches(seed: int, n: int, batch: int):
    rng = random.Random(seed)
    for start in range(0, n, batch):
        size = min(batch, n - start)
        raw = rng.randbytes(16 * size)
        yield [raw[i : i + 16] for i in range(0, 16 * size, 16)]


def bench_dedup(n: int, batch: int, root: Path) -> None:
    print(f"\n== dedup store, {n:,} URLs, batches of {batch:,} ==")
    base = rss()
    path = root / f"dedup-{n}"
    store = DedupStore.open(path)

    def run(label: str, seed: int, count: int, expect_new: float) -> float:
        spent = 0.0
        new = 0
        for keys in key_batches(seed, count, batch):
            t = time.perf_counter()
            result = store.add_new(keys)
            spent += time.perf_counter() - t
            new += sum(result)
        assert abs(new / count - expect_new) < 0.01, (label, new, count)
        print(f"  {label:<38} {count / spent:>12,.0f} checks/s")
        return count / spent

    insert_rate = run("insert (all new)", 1, n, 1.0)
    store.sync()
    dup_rate = run("check (all seen)", 1, min(n, 1_000_000), 0.0)
    # a realistic mix: 1 in 5 links new
    spent = 0.0
    rng = random.Random(9)
    mixed = min(n, 1_000_000)
    seen_batches = key_batches(1, mixed, batch)
    for keys in key_batches(2, mixed, batch):
        old = next(seen_batches)
        mix = old[: batch * 4 // 5] + keys[: batch // 5]
        rng.shuffle(mix)
        t = time.perf_counter()
        store.add_new(mix)
        spent += time.perf_counter() - t
    mix_rate = (mixed // batch) * (batch * 4 // 5 + batch // 5) / spent
    print(f"  {'check (80% seen, 20% new)':<38} {mix_rate:>12,.0f} checks/s")
    store.sync()
    disk = store.disk_bytes()
    mem = rss()
    print(f"  bytes on disk per URL                  {disk / len(store):>12.1f}  ({mib(disk)} for {len(store):,})")
    print(f"  RSS {mib(mem['VmRSS'])} (anonymous {mib(mem['RssAnon'] - base['RssAnon'])} grown, "
          f"file-backed LMDB pages {mib(mem['RssFile'] - base['RssFile'])}: page cache, reclaimable)")
    store.close()
    shutil.rmtree(path)

    # reference: a Python set doing the same batched check-and-insert, same keys
    before = rss()["RssAnon"]
    seen: set[bytes] = set()
    spent = 0.0
    for keys in key_batches(1, n, batch):
        t = time.perf_counter()
        out = []
        for key in keys:
            if key in seen:
                out.append(False)
            else:
                seen.add(key)
                out.append(True)
        spent += time.perf_counter() - t
    set_rate = n / spent
    set_mem = rss()["RssAnon"] - before
    print(f"  reference: Python set insert           {set_rate:>12,.0f} checks/s, {mib(set_mem)} anonymous memory")
    print(f"  ratio LMDB/set: insert {insert_rate / set_rate:.2f}, all-seen {dup_rate / set_rate:.2f}, "
          f"mixed {mix_rate / set_rate:.2f}; memory set/LMDB-anonymous "
          f"{set_mem / max(1, mem['RssAnon'] - base['RssAnon']):.1f}x")
    del seen


def bench_frontier(n: int, root: Path) -> None:
    hosts = max(1, n // 50)
    print(f"\n== frontier store, {n:,} URLs over {hosts:,} hosts ==")
    path = root / f"frontier-{n}"
    base = rss()
    spent = 0.0
    with FrontierStore.open(path) as frontier:
        for start in range(0, n, 1000):
            items = [QueuedUrl(url=f"http://h{i % hosts}.test/page/{i}", host=f"h{i % hosts}.test", depth=i % 4)
                     for i in range(start, min(n, start + 1000))]
            t = time.perf_counter()
            frontier.push(items)
            spent += time.perf_counter() - t
        print(f"  push (batches of 1,000)                {n / spent:>12,.0f} URLs/s")
        frontier.sync()
        mem = rss()
        print(f"  {len(frontier):,} queued: {frontier.disk_bytes() / n:.0f} bytes on disk per URL; RSS "
              f"{mib(mem['VmRSS'])} (anonymous grown {mib(mem['RssAnon'] - base['RssAnon'])})")
        pops = min(n, 100_000)
        t = time.perf_counter()
        for i in range(pops):
            item = frontier.pop(f"h{i % hosts}.test")
            frontier.done(item)
        dt = time.perf_counter() - t
        print(f"  pop + done (one transaction each)      {pops / dt:>12,.0f} pairs/s")
        t = time.perf_counter()
        for i in range(0, pops, 100):
            got = frontier.pop_many([f"h{(i + j) % hosts}.test" for j in range(100)])
            frontier.done_many([g for g in got if g is not None])
        dt = time.perf_counter() - t
        print(f"  pop_many + done_many (100 per call)    {pops / dt:>12,.0f} pairs/s")
    shutil.rmtree(path)

    # the engine's loop: pop a page, admit its 30 links (most already seen) and finish it atomically
    path = root / f"node-{n}"
    with NodeStore.open(path) as node:
        node.admit([QueuedUrl(url=f"http://h{i % 1000}.test/{i}", host=f"h{i % 1000}.test", depth=1)
                    for i in range(50_000)])
        rng = random.Random(5)
        pages = 10_000
        link_sets = [[QueuedUrl(url=f"http://h{m % 1000}.test/{m}", host=f"h{m % 1000}.test", depth=2)
                      for m in (rng.randrange(60_000) for _ in range(30))] for _ in range(pages)]
        t = time.perf_counter()
        for i in range(pages):
            page = node.frontier.pop(f"h{i % 1000}.test")
            node.finish(page, link_sets[i])
        dt = time.perf_counter() - t
        print(f"  NodeStore pop + finish(30 links)       {pages / dt:>12,.0f} pages/s "
              f"({dt / pages * 1e6:.0f} µs per page)")
    shutil.rmtree(path)


def html_page(rng: random.Random, size: int) -> bytes:
    words = ["crawler", "ring", "node", "the", "of", "and", "page", "host", "link", "data", "store", "peer"]
    parts = ["<html><head><title>bench</title></head><body>"]
    length = 0
    while length < size:
        if rng.random() < 0.1:
            s = f'<a href="http://h{rng.randrange(1000)}.test/p/{rng.randrange(50)}.html">link {rng.randrange(99)}</a> '
        else:
            s = " ".join(rng.choice(words) for _ in range(8)) + f" {rng.randrange(10**6)}. "
        parts.append(s)
        length += len(s)
    parts.append("</body></html>")
    return "".join(parts).encode()


def warcio_page(url: str, req: list[tuple[str, str]], headers: list[tuple[str, str]], body: bytes,
                level: int) -> int:
    """The same response and request records built by warcio and gzipped per record (the store's old path)."""
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=False, warc_version="1.1")
    warc_headers = {"WARC-Date": "2023-11-14T22:13:20.000000Z", "WARC-IP-Address": "127.0.0.1"}
    resp = writer.create_warc_record(url, "response", payload=io.BytesIO(body), length=len(body),
                                     http_headers=StatusAndHeaders("200 OK", headers, protocol="HTTP/1.1"),
                                     warc_headers_dict=warc_headers)
    req_http = StatusAndHeaders("GET /p HTTP/1.1", req, protocol="", is_http_request=True)
    request = writer.create_warc_record(url, "request", http_headers=req_http, warc_headers_dict=dict(warc_headers))
    request.rec_headers.add_header("WARC-Concurrent-To", resp.rec_headers.get_header("WARC-Record-ID"))
    size = 0
    for record in (resp, request):
        buf.seek(0)
        buf.truncate()
        writer.write_record(record)
        comp = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS + 16)
        size += len(comp.compress(buf.getvalue()) + comp.flush())
    return size


def bench_warc(root: Path, pages: int = 1000, rounds: int = 3) -> None:
    print(f"\n== WARC page store, {pages:,} pages of ~15 KB, best of {rounds} interleaved rounds ==")
    rng = random.Random(1)
    bodies = [html_page(rng, 15_000) for _ in range(200)]
    headers = [("Content-Type", "text/html; charset=utf-8"), ("Server", "bench")]
    req = [("Host", "h.test"), ("User-Agent", "peercrawl/0.1"), ("Accept-Encoding", "gzip")]

    def fetch(i: int) -> dict:
        return {"url": f"http://h{i % 1000}.test/p/{i}.html", "request_headers": req, "status": 200, "reason": "OK",
                "response_headers": headers, "body": bodies[i % 200], "ip": "127.0.0.1",
                "fetched_at": 1_700_000_000.0 + i}

    def by_hand(i: int, level: int) -> None:
        records = exchange_records(**fetch(i))
        gzip_member(records.response, level)
        gzip_member((records.request,), level)

    best: dict[tuple[str, int], float] = {}
    sizes: dict[int, int] = {}

    def measure(key: tuple[str, int], step) -> None:
        t = time.perf_counter()
        for i in range(pages):
            step(i)
        best[key] = min(best.get(key, float("inf")), (time.perf_counter() - t) / pages)

    for _round in range(rounds):
        for level in (1, 6, 9):
            measure(("gzip", level), lambda i, lv=level: gzip.compress(bodies[i % 200], compresslevel=lv))
            measure(("warcio", level), lambda i, lv=level: warcio_page(
                f"http://h{i % 1000}.test/p/{i}.html", req, headers, bodies[i % 200], lv))
            measure(("hand", level), lambda i, lv=level: by_hand(i, lv))
            directory = root / f"warc-{level}"
            with WarcPageStore(directory, compress_level=level) as store:
                measure(("store", level), lambda i, st=store: st.store(**fetch(i)))
            sizes[level] = sum(f.stat().st_size for f in directory.glob("*.warc.gz"))
            shutil.rmtree(directory)
    print("  per page, µs: gzip.compress(body) | records + gzip: warcio, by hand | WarcPageStore.store (records,\n"
          "  gzip, CDXJ line, two writes); ratios to gzip.compress of the same body at the same level")
    for level in (1, 6, 9):
        ref = best[("gzip", level)]
        old, new, dt = best[("warcio", level)], best[("hand", level)], best[("store", level)]
        print(f"  level {level}: {ref * 1e6:>5.0f} | {old * 1e6:>5.0f} ({old / ref:.2f}x), {new * 1e6:>5.0f} "
              f"({new / ref:.2f}x) | {dt * 1e6:>5.0f} ({dt / ref:.2f}x) | "
              f"{sizes[level] / pages:,.0f} bytes/page on disk")


def bench_compression(pages: int = 1000, rounds: int = 3) -> None:
    """The WARC store's gzip members by library and level, and whether a second thread compresses in parallel.

    Each page is its response record (~15 KB) compressed as one gzip member, the store's unit of work. Every
    library here writes standard gzip members (warcio reads them: tests/test_storage_pages.py). Reference:
    zlib level 1, same run. The thread rows compress the same pages split between two threads: the wall time
    against one thread shows how much of the work runs outside the GIL (2 cores: at best 0.5x).
    """
    from concurrent.futures import ThreadPoolExecutor

    from isal import isal_zlib

    libraries = {"zlib": zlib, "isal": isal_zlib}
    try:
        import zlib_ng.zlib_ng as zng  # optional: pip install zlib-ng
        libraries["zlib-ng"] = zng
    except ImportError:
        pass
    print(f"\n== WARC gzip members by library and level, {pages:,} response records of ~15 KB, best of {rounds} ==")
    rng = random.Random(2)
    bodies = [html_page(rng, 15_000) for _ in range(200)]
    records = [exchange_records(url=f"http://h{i}.test/p/{i}.html", request_headers=[("Host", "h.test")],
                                status=200, reason="OK", response_headers=[("Content-Type", "text/html")],
                                body=bodies[i % 200], ip="127.0.0.1", fetched_at=1_700_000_000.0 + i).response
               for i in range(pages)]
    raw = sum(sum(len(p) for p in r) for r in records) / pages

    def member(lib, level: int, parts) -> int:
        comp = lib.compressobj(level, lib.DEFLATED, lib.MAX_WBITS + 16)
        return sum(len(comp.compress(p)) for p in parts) + len(comp.flush())

    cases = [("zlib", 1), ("zlib", 6), ("isal", 0), ("isal", 1), ("isal", 2), ("isal", 3)]
    if "zlib-ng" in libraries:
        cases += [("zlib-ng", 1), ("zlib-ng", 6)]
    best: dict[tuple[str, int], float] = {}
    size: dict[tuple[str, int], float] = {}
    threaded: dict[tuple[str, int], float] = {}
    pool = ThreadPoolExecutor(2)
    for _ in range(rounds):
        for name, level in cases:
            lib = libraries[name]
            t = time.perf_counter()
            total = sum(member(lib, level, r) for r in records)
            best[(name, level)] = min(best.get((name, level), 1e9), (time.perf_counter() - t) / pages)
            size[(name, level)] = total / pages
            halves = (records[: pages // 2], records[pages // 2 :])
            t = time.perf_counter()
            list(pool.map(lambda part, lib=lib, level=level: sum(member(lib, level, r) for r in part), halves))
            threaded[(name, level)] = min(threaded.get((name, level), 1e9), (time.perf_counter() - t) / pages)
    pool.shutdown()
    ref = best[("zlib", 1)]
    print(f"  record {raw:,.0f} bytes before compression; per page: µs (vs zlib 1), bytes, wall with 2 threads")
    for key in cases:
        print(f"  {key[0]:>8} level {key[1]}: {best[key] * 1e6:6.1f} µs ({best[key] / ref:.2f}x) "
              f"{size[key]:7,.0f} bytes ({size[key] / raw:.2f} of the record)  2 threads: "
              f"{threaded[key] / best[key]:.2f}x the wall of one")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="URLs (repeatable; default 1,000,000)")
    parser.add_argument("--batch", type=int, default=1000, help="dedup batch size (default 1,000)")
    parser.add_argument("--parts", default="dedup,frontier,warc,compress", help="comma-separated parts to run")
    parser.add_argument("--dir", help="where to put the stores (default: a temporary directory)")
    args = parser.parse_args()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-storage-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        parts = set(args.parts.split(","))
        for n in args.n or [1_000_000]:
            if "dedup" in parts:
                bench_dedup(n, args.batch, root)
            if "frontier" in parts:
                bench_frontier(n, root)
        if "warc" in parts:
            bench_warc(root)
        if "compress" in parts:
            bench_compression()
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\npeak RSS {mib(rss()['VmHWM'])}")


if __name__ == "__main__":
    main()
