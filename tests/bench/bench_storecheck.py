"""The cost of the store check a start does after a run that did not stop cleanly (`peerd check` does the same).

Run: python -m tests.bench.bench_storecheck [--urls 1000000] [--hosts 20000] [--dir DIR]

Builds a node store of `--urls` queued URLs on `--hosts` hosts (each URL marked seen and queued, with its host's
count, as `NodeStore.admit` stores them), then times `check_store_in_child` (the child's whole life: start,
imports, the walk of every database and the search of every key from the root) against the reference measured
in the same run: a plain in-process cursor walk of the same databases reading every key and value (no search,
no child). The page cache is warm for both (the reference runs first and reads every page).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import lmdb

from storage import NodeStore, QueuedUrl, check_store_in_child


def build(path: Path, urls: int, hosts: int, batch: int = 10_000) -> None:
    store = NodeStore.open(path)
    for start in range(0, urls, batch):
        store.admit([QueuedUrl(url=f"https://h{i % hosts}.example/page/{i}", host=f"h{i % hosts}.example", depth=1)
                     for i in range(start, min(urls, start + batch))])
    store.sync()
    store.close()


def plain_walk(path: Path) -> tuple[int, int, float]:
    """Reference: every key and value of every database read by one cursor walk each, in this process."""
    started = time.perf_counter()
    env = lmdb.open(str(path), readonly=True, max_dbs=24, readahead=False)
    keys = size = 0
    with env.begin() as txn:
        names = [key for key, _ in txn.cursor()]
        for name in names:
            db = env.open_db(name, txn=txn, create=False)
            for key, value in txn.cursor(db):
                keys += 1
                size += len(key) + len(value)
    env.close()
    return keys, size, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=1_000_000)
    parser.add_argument("--hosts", type=int, default=20_000)
    parser.add_argument("--dir", type=Path, default=None, help="where to build the store (default: a temp dir)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        path = root / "state"
        started = time.perf_counter()
        build(path, args.urls, args.hosts)
        file_bytes = (path / "data.mdb").stat().st_size
        print(f"store: {args.urls:,} URLs on {args.hosts:,} hosts, data.mdb {file_bytes / 1e6:,.1f} MB "
              f"(built in {time.perf_counter() - started:.1f} s)")
        keys, size, ref = plain_walk(path)
        started = time.perf_counter()
        check = check_store_in_child(path, timeout=3600)
        spent = time.perf_counter() - started
        assert check.keys >= keys, (check.keys, keys)
        print(f"reference, plain cursor walk in process: {keys:,} keys, {size / 1e6:,.1f} MB in {ref:.2f} s "
              f"({keys / ref:,.0f} keys/s, {file_bytes / 1e6 / ref:,.1f} MB/s of data.mdb)")
        print(f"check in a child (walk + search of every key): {check.keys:,} keys, {check.bytes / 1e6:,.1f} MB in "
              f"{spent:.2f} s, {check.seconds:.2f} s of it reading ({check.keys / spent:,.0f} keys/s, "
              f"{file_bytes / 1e6 / spent:,.1f} MB/s of data.mdb; {spent / ref:.2f}x the reference); the child's "
              f"peak RSS {check.peak_rss / 2**20:,.0f} MiB (VmHWM; mapped pages handed back past 64 MiB)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
