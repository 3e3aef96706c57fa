"""The per-page CPU of a node's hot path on real HTML, each part beside its alternatives in the same run.

Run: python -m tests.bench.bench_realpages [--max-pages N] [--max-bytes B] [--repeat R]

The pages are the real HTML documents that Debian packages ship under /usr/share/doc (python3-doc's
documentation, libffi's manual, ...; `apt-get install python3-doc` gives about 780 of them). Each page is read
as served from a made-up host, `http://docs.example/<path under /usr/share/doc>`. Pages larger than
`--max-bytes` (the index pages of several MB) are left out, so that the mean stays near a web page's.

Parts, each timed over the same pages, best of `--repeat` passes, as CPU µs per page and as a ratio to the
first row of its group:
- parse + link selection: the hrefs of a/area (rel=nofollow dropped), base, canonical, meta robots, title, by
  lxml, selectolax's lexbor (what `peer.crawl.links.extract` does, before normalization) and resiliparse;
- URL resolution + normalization of each page's hrefs: `normalize_all` (peer/crawl/urls.py) against ada-url's
  WHATWG resolver (`ada_url.join_url`, which alone does not give the store's normal form);
- WARC records: `build_page_records` (two SHA-1 digests, ISA-L gzip level 1) split into its parts, beside zlib;
- the whole of `extract` per page, for the total.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from lxml import etree

from peer.crawl.links import extract
from peer.crawl.urls import normalize_all
from storage import build_page_records
from storage._warc import exchange_records, gzip_member

DOC_ROOT = Path("/usr/share/doc")
HOST = "http://docs.example/"


def real_pages(max_pages: int, max_bytes: int) -> list[tuple[str, bytes]]:
    """(URL, body) of the real HTML documents packages ship, in a stable order; [] when none is installed."""
    found = sorted(p for p in DOC_ROOT.rglob("*.html") if p.is_file() and not p.is_symlink())
    pages = []
    for path in found:
        body = path.read_bytes()
        if 0 < len(body) <= max_bytes:
            pages.append((HOST + str(path.relative_to(DOC_ROOT)), body))
        if len(pages) >= max_pages:
            break
    return pages


def cpu_us_per_page(fn: Callable[[str, bytes], object], pages: list[tuple[str, bytes]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for url, body in pages:
            fn(url, body)
        best = min(best, time.process_time() - start)
    return best / len(pages) * 1e6


# -- parse + link selection, three parsers --------------------------------------------------------------------

_TAGS = ("a", "area", "base", "meta", "link", "title")
_lxml_parser = etree.HTMLParser(encoding="utf-8", no_network=True)


def lxml_links(url: str, body: bytes) -> list[str]:
    root = etree.fromstring(body, _lxml_parser)
    hrefs = []
    if root is None:
        return hrefs
    for el in root.iter(_TAGS):
        tag = el.tag
        if tag == "a" or tag == "area":
            href = el.get("href")
            if href is not None:
                rel = el.get("rel")
                if rel is None or "nofollow" not in rel.lower():
                    hrefs.append(href)
        elif tag == "title":
            " ".join("".join(el.itertext()).split())
        else:
            el.get("href") or el.get("content")
    return hrefs


def lexbor_links(url: str, body: bytes) -> list[str]:
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(body)
    hrefs = []
    for el in tree.css("a[href], area[href], base[href], meta[name], link[rel], title"):
        tag = el.tag
        attrs = el.attributes
        if tag == "a" or tag == "area":
            rel = attrs.get("rel")
            if rel is None or "nofollow" not in rel.lower():
                hrefs.append(attrs["href"])
        elif tag == "title":
            " ".join(el.text().split())
        else:
            attrs.get("href") or attrs.get("content")
    return hrefs


def resiliparse_links(url: str, body: bytes) -> list[str]:
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse_from_bytes(body, "utf-8")
    hrefs = []
    for el in tree.document.query_selector_all("a[href], area[href], base[href], meta[name], link[rel], title"):
        tag = el.tag
        if tag == "a" or tag == "area":
            rel = el.getattr("rel")
            if rel is None or "nofollow" not in rel.lower():
                hrefs.append(el.getattr("href"))
        elif tag == "title":
            " ".join(el.text.split())
        else:
            el.getattr("href") or el.getattr("content")
    return hrefs


# -- the main ---------------------------------------------------------------------------------------------------


def row(name: str, us: float, ref: float) -> None:
    print(f"  {name:52s} {us:9.1f} µs/page   ratio {us / ref:5.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-pages", type=int, default=2000)
    ap.add_argument("--max-bytes", type=int, default=256 * 1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--resiliparse-pages", type=int, default=30)
    args = ap.parse_args(argv)
    pages = real_pages(args.max_pages, args.max_bytes)
    if not pages:
        raise SystemExit(f"no real HTML under {DOC_ROOT}: apt-get install python3-doc")
    sizes = sorted(len(b) for _, b in pages)
    hrefs = {url: lxml_links(url, body) for url, body in pages}
    n_links = sum(len(h) for h in hrefs.values())
    print(f"{len(pages)} real pages under {DOC_ROOT}: mean {sum(sizes) / len(sizes) / 1024:.1f} KiB, "
          f"median {sizes[len(sizes) // 2] / 1024:.1f} KiB, {n_links / len(pages):.0f} hrefs a page; "
          f"best of {args.repeat}, CPU time")

    print("parse + link selection (hrefs, base, canonical, meta robots, title)")
    ref = cpu_us_per_page(lxml_links, pages, args.repeat)
    row("lxml etree.fromstring + iter(tags)", ref, ref)
    row("selectolax lexbor + css()  [in use]", cpu_us_per_page(lexbor_links, pages, args.repeat), ref)
    # resiliparse's collections are walked from their start on every item (a page of n links costs n² steps):
    # it is measured on the first pages only, beside lxml on the same pages
    few = pages[: args.resiliparse_pages]
    few_ref = cpu_us_per_page(lxml_links, few, args.repeat)
    row(f"resiliparse + query_selector_all() (first {len(few)} pages)",
        cpu_us_per_page(resiliparse_links, few, args.repeat) * ref / few_ref, ref)

    print("URL resolution + normalization of each page's hrefs")
    ref = cpu_us_per_page(lambda url, _: normalize_all(hrefs[url], url), pages, args.repeat)
    row("normalize_all  [in use]", ref, ref)
    try:
        import ada_url
    except ImportError:
        print("  (ada-url not installed: pip install ada-url)")
    else:
        def ada(url: str, _: bytes) -> None:
            join = ada_url.join_url
            for h in dict.fromkeys(hrefs[url]):
                try:
                    join(url, h)
                except ValueError:
                    pass

        row("ada_url.join_url (WHATWG resolution only)", cpu_us_per_page(ada, pages, args.repeat), ref)

    print("WARC records (response + request, SHA-1 digests, gzip members)")
    headers = [("Host", "docs.example"), ("User-Agent", "peercrawl/0.1 (+https://example.org/bot)"),
               ("Accept-Encoding", "gzip")]
    resp_headers = [("Server", "nginx"), ("Date", "Sat, 28 Nov 2026 23:00:00 GMT"),
                    ("Content-Type", "text/html; charset=utf-8"), ("Connection", "keep-alive")]

    def build(url: str, body: bytes, level: int = 1) -> object:
        return build_page_records(url=url, request_headers=headers, status=200, reason="OK",
                                  response_headers=resp_headers + [("Content-Length", str(len(body)))], body=body,
                                  ip="127.0.0.1", fetched_at=1.8e9, compress_level=level)

    ref = cpu_us_per_page(build, pages, args.repeat)
    row("build_page_records, ISA-L level 1  [in use]", ref, ref)
    row("  of which exchange_records (digests, heads)", cpu_us_per_page(
        lambda url, body: exchange_records(url=url, request_headers=headers, status=200, reason="OK",
                                           response_headers=resp_headers, body=body, ip="127.0.0.1",
                                           fetched_at=1.8e9), pages, args.repeat), ref)
    row("  of which one SHA-1 of the body", cpu_us_per_page(lambda _, body: hashlib.sha1(body).digest(), pages,
                                                           args.repeat), ref)
    row("  of which ISA-L gzip level 1 of the body", cpu_us_per_page(lambda _, body: gzip_member((body,), 1),
                                                                    pages, args.repeat), ref)
    row("zlib gzip level 1 of the body (reference)", cpu_us_per_page(
        lambda _, body: zlib.compress(body, 1, wbits=31), pages, args.repeat), ref)
    row("build_page_records, ISA-L level 0", cpu_us_per_page(lambda u, b: build(u, b, 0), pages, args.repeat), ref)
    row("build_page_records, zlib level 6", cpu_us_per_page(lambda u, b: build(u, b, 6), pages, args.repeat), ref)

    print("the whole of extract (decode, parse, select, normalize)")
    ref = cpu_us_per_page(lambda url, body: extract(body, url, "text/html"), pages, args.repeat)
    row("extract  [in use]", ref, ref)
    print(f"({os.cpu_count()} CPUs; figures are CPU time of this one process)")


if __name__ == "__main__":
    main()
