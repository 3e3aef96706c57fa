"""A seen store that grows past its filter's size: the longest commit, with the larger filter built a slice per
commit (the store's way) against the whole build in one commit (``BUILD_SLICE`` past the store's size).

python -m tests.bench.bench_filter_growth [--keys 6000000] [--batch 1000] [--json FILE]

One LMDB `DedupStore` from empty takes ``--keys`` new keys in commits of ``--batch`` (a page's links to one
node), on 2,000 hosts; its filter outgrows itself at about 2.1 and 5.2 million keys. Per setting: every commit's
wall time (``add_new``), the longest and the 99.9th percentile, the commits while a build was under way, and
the run's CPU. Both settings run in this process, one after the other, each on a store of its own.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import storage._dedup as dedup
from storage import DedupStore, host_position, url_key


def grow(path: Path, keys: int, batch: int, build_slice: int) -> dict[str, float]:
    dedup.BUILD_SLICE = build_slice
    positions = [host_position(f"www.site{h}.test") for h in range(2000)]
    times: list[float] = []
    building = 0
    cpu = time.process_time()
    with DedupStore.open(path, map_size=1 << 30) as store:
        for first in range(0, keys, batch):
            chunk = [url_key(positions[i % 2000], f"https://www.site{i % 2000}.test/a/{i}.html")
                     for i in range(first, min(keys, first + batch))]
            t = time.perf_counter()
            store.add_new(chunk)
            times.append(time.perf_counter() - t)
            building += store._building is not None
        filt = store.filter.nbytes
    cpu = time.process_time() - cpu
    shutil.rmtree(path)
    times.sort()
    return {"build_slice": build_slice, "commits": len(times), "longest_ms": times[-1] * 1000,
            "p999_ms": times[int(len(times) * 0.999)] * 1000, "median_ms": times[len(times) // 2] * 1000,
            "commits_while_building": building, "cpu_s": cpu, "filter_bytes": filt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=6_000_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    sliced = dedup.BUILD_SLICE
    root = Path(tempfile.mkdtemp(prefix="bench-filter-growth-"))
    try:
        rows = [grow(root / "whole", args.keys, args.batch, 1 << 62), grow(root / "sliced", args.keys, args.batch,
                                                                          sliced)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    whole, part = rows
    for row in rows:
        label = "whole build in one commit" if row is whole else f"a slice of {sliced:,} keys per commit"
        print(f"{label}: longest commit {row['longest_ms']:.0f} ms, 99.9th percentile {row['p999_ms']:.1f} ms, "
              f"median {row['median_ms']:.2f} ms over {row['commits']:,} commits ({row['commits_while_building']:,} "
              f"while a build went on); CPU {row['cpu_s']:.1f} s; filter {row['filter_bytes'] >> 20} MiB")
    print(f"longest commit, sliced / whole: {part['longest_ms'] / whole['longest_ms']:.3f}; "
          f"CPU {part['cpu_s'] / whole['cpu_s']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
