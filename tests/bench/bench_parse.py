"""Parsing costs per page: link extraction, URL normalization, robots.txt matching.

Run: python -m tests.bench.bench_parse

Each figure is printed beside a reference measured in the same run on the same input, as a ratio:
- extract() of a 15 KB page with 30 links vs a bare lxml.html.fromstring() of the same bytes;
- normalize_all() per link vs urllib.parse.urljoin() plus a naive normalization (urlsplit, lower-case
  scheme and host, default port dropped, fragment dropped);
- RobotsTxt.can_fetch() vs urllib.robotparser.RobotFileParser.can_fetch() on the same file and paths.
The crawl's CPU budget is 1.4 ms per page; extraction should stay well under 0.4 ms of it.
"""

from __future__ import annotations

import random
import timeit
import urllib.robotparser
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit, urlunsplit

from lxml import html as lxml_html

from peer.crawl.links import extract
from peer.crawl.robots import parse, product_token
from peer.crawl.urls import normalize_all

_WORDS = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore "
    "et dolore magna aliqua crawler ring peer host page link"
).split()


def make_page(seed: int, n_links: int = 30, size: int = 15_000) -> tuple[bytes, list[str]]:
    """A page like the bench web's: head with meta/link/script, 30 links of mixed kinds, text filler."""
    rng = random.Random(seed)
    hrefs = []
    for i in range(n_links):
        kind = i % 5
        if kind == 0:
            hrefs.append(f"/p/{rng.randrange(50)}.html")
        elif kind == 1:
            hrefs.append(f"../q/{rng.randrange(50)}.html?ref={i}")
        elif kind == 2:
            hrefs.append(f"http://host{rng.randrange(1000)}.example.com/p/{rng.randrange(50)}.html")
        elif kind == 3:
            hrefs.append(f"page{rng.randrange(50)}.html#section-{i}")
        else:
            hrefs.append(f"/p/{rng.randrange(50)}.html")  # a repeated-looking site link
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n",
        f"<title>Page {seed} of the bench web</title>\n",
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
        f'<link rel="stylesheet" href="/static/site.css"><link rel="canonical" href="/p/{seed}.html">\n',
        "<script>function f(a) { return a < 2 && a > 0; }</script>\n</head>\n<body>\n<div class=\"nav\">\n",
    ]
    for i, href in enumerate(hrefs):
        text = " ".join(rng.choice(_WORDS) for _ in range(10))
        parts.append(
            f'<div class="item"><h3>Item {i}</h3><p class="lead">{text} '
            f'<a href="{href}" class="lnk">link {i}</a> {text}</p></div>\n'
        )
    body = "".join(parts)
    filler = []
    length = len(body)
    while length < size - 60:
        line = "<p>" + " ".join(rng.choice(_WORDS) for _ in range(14)) + "</p>\n"
        filler.append(line)
        length += len(line)
    return (body + "".join(filler) + "</div></body></html>\n").encode(), hrefs


def naive_normalize(url: str) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.lower()
    if (parts.scheme == "http" and netloc.endswith(":80")) or (parts.scheme == "https" and netloc.endswith(":443")):
        netloc = netloc.rsplit(":", 1)[0]
    return urlunsplit((parts.scheme.lower(), netloc, parts.path or "/", parts.query, ""))


def best_us(fn: Callable[[], object], number: int, repeat: int = 5) -> float:
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def row(name: str, ours: float, ref_name: str, ref: float, unit: str) -> None:
    print(f"{name:34s} {ours:8.2f} {unit}   {ref_name:38s} {ref:8.2f} {unit}   ratio {ours / ref:5.2f}")


ROBOTS = "\n".join(
    ["User-agent: Googlebot", "Disallow: /nogoogle/", ""]
    + ["User-agent: *"]
    + [f"Disallow: /private{i}/" for i in range(20)]
    + ["Disallow: /search", "Disallow: /*?sessionid=", "Disallow: /*.pdf$", "Allow: /private3/public/", ""]
    + ["Sitemap: http://host.example.com/sitemap.xml"]
)


def main() -> None:
    pages = [make_page(seed) for seed in range(40)]
    urls = [f"http://host{seed}.example.com/d/x/page{seed}.html" for seed in range(40)]
    body = pages[0][0]
    print(f"page: {len(body)} bytes, {len(pages[0][1])} links")

    n = 300
    ours = best_us(lambda: [extract(b, u, "text/html") for (b, _), u in zip(pages, urls)], n // 40 + 1)
    ref = best_us(lambda: [lxml_html.fromstring(b) for b, _ in pages], n // 40 + 1)
    row("extract (per page)", ours / len(pages), "lxml.html.fromstring (per page)", ref / len(pages), "us")

    links = sum(len(dict.fromkeys(h)) for _, h in pages)
    ours = best_us(lambda: [normalize_all(h, u) for (_, h), u in zip(pages, urls)], 20)
    ref = best_us(
        lambda: [[naive_normalize(urljoin(u, x)) for x in dict.fromkeys(h)] for (_, h), u in zip(pages, urls)], 20
    )
    row("normalize_all (per link)", ours / links, "urljoin + naive normalize (per link)", ref / links, "us")

    ours_robots = parse(ROBOTS)
    ref_robots = urllib.robotparser.RobotFileParser()
    ref_robots.parse(ROBOTS.splitlines())
    paths = ["/p/1.html", "/private7/x", "/private3/public/y", "/a/b?sessionid=3", "/doc.pdf", "/search?q=x"]
    agent = "peercrawl/0.1 (+https://example.org/bot)"
    token = product_token(agent)
    ours = best_us(lambda: [ours_robots.can_fetch(token, p) for p in paths], 2000)
    ref = best_us(lambda: [ref_robots.can_fetch(agent, "http://host.example.com" + p) for p in paths], 2000)
    row("RobotsTxt.can_fetch (per path)", ours / len(paths), "urllib.robotparser (per path)", ref / len(paths), "us")
    ours = best_us(lambda: parse(ROBOTS), 500)
    ref = best_us(lambda: urllib.robotparser.RobotFileParser().parse(ROBOTS.splitlines()), 500)
    row("robots parse (per file)", ours, "urllib.robotparser parse (per file)", ref, "us")

    text = "日本語のウェブページです。東京の天気は晴れ、明日は雨が降るでしょう。" * 150
    sjis = f"<html><head><title>t</title></head><body><p>{text}</p></body></html>".encode("shift_jis")
    ours = best_us(lambda: extract(sjis, urls[0], "text/html"), 20, repeat=3)
    ref = best_us(lambda: lxml_html.fromstring(sjis), 20, repeat=3)
    row(f"extract undeclared SJIS {len(sjis) // 1024} KiB", ours, "lxml.html.fromstring (same bytes)", ref, "us")


if __name__ == "__main__":
    main()
