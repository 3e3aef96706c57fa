"""Wire cost of URL batches: bytes per URL and URLs per second (encode + decode), msgpack vs JSON, protocol
versions 2 (entries) and 3 (front-coded URL columns), with and without zlib or brotli, for batches of 1,000 realistic URLs.
Run: python -m tests.bench.bench_protocol [--batches N]

Two batch shapes: "random referrer" gives every entry a referrer drawn at random (nearly every entry's
referrer is unique in its batch: the worst case), "crawl-shaped" is what a dispatcher sends, the 2-5 links a
page has for one owner side by side with their one referrer, and each batch sorted by URL as the dispatcher
sorts it.

The reference, measured in the same run, is the design's original message: a bare JSON list of URL strings
(json.dumps + json.loads, no framing, no depth/found_on/hops, no validation). Ratios are against it. A second
line, the floor, is bare msgpack of the same four fields per entry without framing or checks.
"""

from __future__ import annotations

import argparse
import json
import random
import string
import time
from collections.abc import Callable

from protocol import NEED_DATA, Connection, Role, UrlBatch, UrlEntry

SECRET = b"benchmark cluster secret 32 byte"
TLDS = ["com", "org", "net", "de", "co.uk", "io", "fr", "jp", "edu", "gov", "info", "ru", "com.br", "nl"]
WORDS = (
    "news sport world article blog post category tag product item shop cart search archive page user profile "
    "video image gallery docs guide help support about contact 2023 2024 review forum thread topic wiki static "
    "assets en de fr index story local business tech science health travel food music events jobs"
).split()
EXTENSIONS = ["", "", "", ".html", ".htm", ".php", ".aspx", "/", ".pdf", ".jpg"]
QUERY_KEYS = ["id", "page", "q", "ref", "utm_source", "utm_medium", "sort", "lang", "p", "sessionid", "s", "cat"]


def make_hosts(rng: random.Random, count: int) -> list[str]:
    hosts = []
    for _ in range(count):
        name = rng.choice(WORDS) + rng.choice(["", "-", ""]) + rng.choice(WORDS)
        name += str(rng.randrange(100)) if rng.random() < 0.2 else ""
        prefix = rng.choice(["www.", "www.", "", "blog.", "shop.", "en.", "m.", "news."])
        hosts.append(f"{prefix}{name}.{rng.choice(TLDS)}")
    return hosts


def make_url(rng: random.Random, host: str) -> str:
    scheme = "https" if rng.random() < 0.85 else "http"
    segments = [rng.choice(WORDS) for _ in range(rng.randint(0, 4))]
    if rng.random() < 0.3:
        segments.append("".join(rng.choices(string.ascii_lowercase + "-", k=rng.randint(8, 40))).strip("-") or "x")
    if rng.random() < 0.2:
        segments.append(str(rng.randrange(10**7)))
    path = "/" + "/".join(segments) + (rng.choice(EXTENSIONS) if segments else "")
    query = ""
    if rng.random() < 0.35:
        params = rng.sample(QUERY_KEYS, rng.randint(1, 3))
        values = [
            rng.choice([str(rng.randrange(10**5)), rng.choice(WORDS), "".join(rng.choices(string.hexdigits, k=16))])
            for _ in params
        ]
        query = "?" + "&".join(f"{k}={v}" for k, v in zip(params, values, strict=True))
    return f"{scheme}://{host}{path}{query}"


def crawl_batches(seed: int, batches: int, size: int) -> list[UrlBatch]:
    """Batches as a dispatcher sends them: each page's 2-5 links for this owner together, sorted by URL."""
    rng = random.Random(seed)
    hosts = make_hosts(rng, 400)
    sources = make_hosts(rng, 100)
    out = []
    for seq in range(batches):
        entries: list[UrlEntry] = []
        while len(entries) < size:
            page = make_url(rng, rng.choice(sources))
            depth = rng.randint(0, 11)
            for _ in range(rng.randint(2, 5)):
                entries.append(
                    UrlEntry(url=make_url(rng, rng.choice(hosts)), depth=depth + 1, found_on=page,
                             hops=0 if rng.random() < 0.95 else rng.randint(1, 3))
                )
        ordered = tuple(sorted(entries[:size], key=lambda entry: entry.url))
        out.append(UrlBatch(seq=seq, sender="crawler-a.example:7070", epoch=17, urls=ordered))
    return out


def make_batches(seed: int, batches: int, size: int) -> list[UrlBatch]:
    rng = random.Random(seed)
    hosts = make_hosts(rng, 400)
    out = []
    for seq in range(batches):
        entries = []
        for _ in range(size):
            host = rng.choice(hosts)
            source = rng.choice(hosts)
            entries.append(
                UrlEntry(
                    url=make_url(rng, host),
                    depth=rng.randint(1, 12),
                    found_on=make_url(rng, source),
                    hops=0 if rng.random() < 0.95 else rng.randint(1, 3),
                )
            )
        out.append(UrlBatch(seq=seq, sender="crawler-a.example:7070", epoch=17, urls=tuple(entries)))
    return out


def pair(codec: str, compression: str, level: int, version: int = 3) -> tuple[Connection, Connection]:
    counter = iter(range(1, 1000))
    nonce = lambda size: next(counter).to_bytes(size, "big")  # noqa: E731 - deterministic stand-in
    a = Connection(
        Role.INITIATOR,
        node_id="a",
        secret=SECRET,
        nonce=nonce,
        codecs=(codec,),
        compressions=(compression,),
        compress_level=level,
        versions=(version,),
    )
    b = Connection(Role.RESPONDER, node_id="b", secret=SECRET, nonce=nonce, compressions=(compression,))
    b.receive_data(a.initiate())
    assert b.next_event() is NEED_DATA
    a.receive_data(b.data_to_send())
    a.next_event()
    b.receive_data(a.data_to_send())
    b.next_event()
    return a, b


def best_of(repeats: int, run: Callable[[], int]) -> tuple[float, int]:
    """Minimum wall time of `repeats` runs (the least disturbed by the other tenants), and the bytes sent."""
    best = float("inf")
    size = 0
    for _ in range(repeats):
        start = time.perf_counter()
        size = run()
        best = min(best, time.perf_counter() - start)
    return best, size


def measure_protocol(
    batches: list[UrlBatch], codec: str, compression: str, level: int, version: int = 3
) -> tuple[float, int]:
    a, b = pair(codec, compression, level, version)

    def run() -> int:
        total = 0
        for batch in batches:
            frame = a.send(batch)
            total += len(frame)
            b.receive_data(frame)
            if b.next_event() != batch:
                raise AssertionError("round trip changed the batch")
        return total

    return best_of(5, run)


def measure_reference(batches: list[UrlBatch]) -> tuple[float, int]:
    plain = [[entry.url for entry in batch.urls] for batch in batches]

    def run() -> int:
        total = 0
        for urls in plain:
            data = json.dumps(urls).encode()
            total += len(data)
            if len(json.loads(data)) != len(urls):
                raise AssertionError("reference round trip lost URLs")
        return total

    return best_of(5, run)


def measure_floor(batches: list[UrlBatch]) -> tuple[float, int]:
    """msgpack of the same four fields per entry with no framing and no checks: what the codec alone costs."""
    import msgpack

    trees = [[[e.url, e.depth, e.found_on, e.hops] for e in batch.urls] for batch in batches]

    def run() -> int:
        total = 0
        for tree in trees:
            data = msgpack.packb(tree)
            total += len(data)
            if len(msgpack.unpackb(data)) != len(tree):
                raise AssertionError("floor round trip lost URLs")
        return total

    return best_of(5, run)


def report(title: str, batches: list[UrlBatch]) -> None:
    urls = sum(len(b.urls) for b in batches)
    url_bytes = sum(len(e.url) for b in batches for e in b.urls) / urls
    found_bytes = sum(len(e.found_on or "") for b in batches for e in b.urls) / urls
    referrers = sum(len({e.found_on for e in b.urls}) for b in batches) / urls
    print(
        f"== {title}: {len(batches)} batches x {len(batches[0].urls)} URLs; mean URL {url_bytes:.1f} bytes, mean "
        f"found_on {found_bytes:.1f} bytes (each entry carries both), {referrers:.2f} distinct referrers per URL\n"
    )
    ref_time, ref_bytes = measure_reference(batches)
    ref_rate = urls / ref_time
    rows = [("reference: JSON list of URL strings", ref_bytes / urls, ref_rate)]
    floor_time, floor_bytes = measure_floor(batches)
    rows.append(("floor: bare msgpack of the 4 fields, unchecked", floor_bytes / urls, urls / floor_time))
    results = {}
    for codec, version in (("msgpack", 2), ("msgpack", 3), ("json", 3)):
        for compression, level in (("none", 0), ("zlib", 1), ("zlib", 6), ("br", 0)):
            seconds, size = measure_protocol(batches, codec, compression, level, version)
            packing = {"none": "no compression", "zlib": f"zlib level {level}", "br": "brotli quality 5"}
            label = f"{codec} v{version} + {packing[compression]}"
            results[(codec, version, compression, level)] = (size / urls, seconds / urls)
            rows.append((label, size / urls, urls / seconds))
    print(
        f"{'encoding (full entries: url, depth, found_on, hops)':<52} {'bytes/URL':>9} {'vs ref':>7} "
        f"{'URLs/s':>10} {'vs ref':>7}"
    )
    for label, per_url, rate in rows:
        print(
            f"{label:<52} {per_url:>9.1f} {per_url / (ref_bytes / urls):>7.2f} {rate:>10,.0f} {rate / ref_rate:>7.2f}"
        )
    print("\ncompression pays when the link is slower than (bytes saved per URL) / (extra CPU seconds per URL):")
    for codec, version in (("msgpack", 3), ("json", 3)):
        plain_bytes, plain_time = results[(codec, version, "none", 0)]
        for compression, level in (("zlib", 1), ("zlib", 6), ("br", 0)):
            packed_bytes, packed_time = results[(codec, version, compression, level)]
            extra = packed_time - plain_time
            saved = plain_bytes - packed_bytes
            breakeven = saved * 8 / extra / 1e6 if extra > 0 else float("inf")
            print(
                f"  {codec} v{version} {compression} {level or ''}: saves {saved:.1f} bytes/URL for "
                f"{extra * 1e6:.2f} us/URL -> pays below {breakeven:,.0f} Mbit/s"
            )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20, help="batches of --size URLs per measurement")
    parser.add_argument("--size", type=int, default=1000, help="URLs per batch")
    args = parser.parse_args()
    report("crawl-shaped", crawl_batches(seed=1, batches=args.batches, size=args.size))
    report("random referrer", make_batches(seed=1, batches=args.batches, size=args.size))


if __name__ == "__main__":
    main()
