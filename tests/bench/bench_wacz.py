"""`peerctl export --wacz`: how fast a crawl is packed, against copying the same WARC files in the same run.

Run: ``python -m tests.bench.bench_wacz [--pages 20000] [--hosts 200]``

A node's data dir is made by the node's own page store (``storage.open_page_store``) from real pages: the
python3-doc HTML (the local web's real-markup corpus, when installed; generated pages otherwise), each stored
as a 200 response of one of ``--hosts`` hosts. Then, timed: a plain copy of the WARC files (the reference:
reading and writing the same bytes) and their SHA-256 (which the manifest needs), the whole crawl packed into a WACZ, and one host's captures packed.
The figures are MB/s of WARC bytes and the ratio of each export's time to the copy's.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
import time
from pathlib import Path

from peerlab.localweb.corpus import load_corpus
from storage import open_page_store, pack_wacz


def make_crawl(data_dir: Path, pages: int, hosts: int) -> int:
    corpus = load_corpus()
    bodies = ([d.render(["/"] * d.link_slots, "/").encode() for d in corpus.documents] if corpus is not None
              else [(f"<html><body><p>{'lorem ipsum ' * (300 + i)}</p></body></html>").encode() for i in range(50)])
    store = open_page_store("warc", data_dir / "warc", max_file_bytes=64 << 20)
    start = 1_700_000_000.0
    for i in range(pages):
        url = f"http://h{i % hosts:04d}.example.test/p/{i // hosts}.html"
        store.store(url=url, request_headers=[("user-agent", "bench")], status=200, reason="OK",
                    response_headers=[("content-type", "text/html; charset=utf-8")], body=bodies[i % len(bodies)],
                    ip="192.0.2.1", fetched_at=start + i * 0.01)
    store.close()
    return sum(p.stat().st_size for p in (data_dir / "warc").glob("*.warc.gz"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=20_000)
    parser.add_argument("--hosts", type=int, default=200)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-wacz-"))
    try:
        size = make_crawl(tmp / "node", args.pages, args.hosts)
        copy_dir = tmp / "copy"
        copy_dir.mkdir()
        started = time.perf_counter()
        for warc in sorted((tmp / "node" / "warc").glob("*.warc.gz")):
            shutil.copyfile(warc, copy_dir / warc.name)
        copy = time.perf_counter() - started
        started = time.perf_counter()
        for warc in sorted((tmp / "node" / "warc").glob("*.warc.gz")):
            with open(warc, "rb") as fh:
                hashlib.file_digest(fh, "sha256")
        digest = time.perf_counter() - started
        started = time.perf_counter()
        whole = pack_wacz([tmp / "node"], tmp / "crawl.wacz")
        packed = time.perf_counter() - started
        started = time.perf_counter()
        host = pack_wacz([tmp / "node"], tmp / "host.wacz", host="h0000.example.test")
        one_host = time.perf_counter() - started
        mb = size / 1e6
        print(f"crawl: {args.pages} pages, {args.hosts} hosts, {mb:.1f} MB of WARC in "
              f"{len(list((tmp / 'node' / 'warc').glob('*.warc.gz')))} file(s)")
        print(f"copy of the WARC files (reference): {copy:.2f} s, {mb / copy:.0f} MB/s")
        print(f"SHA-256 of the WARC files (what the manifest needs): {digest:.2f} s, {mb / digest:.0f} MB/s")
        print(f"export --wacz, whole crawl: {packed:.2f} s, {mb / packed:.0f} MB/s, {packed / copy:.2f} x the copy "
              f"({whole.records} captures, {whole.bytes / 1e6:.1f} MB packed)")
        print(f"export --wacz --host (1 host of {args.hosts}): {one_host:.2f} s, {host.records} captures, "
              f"{one_host / copy:.2f} x the copy of the whole crawl")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
