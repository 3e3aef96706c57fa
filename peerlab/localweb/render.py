"""Turning resources into HTTP answers: status, headers and body bytes, for a given port.

Shared by the live server and the static writer so both serve the very same bytes. Pages of the real-markup
web are written by ``markup.render_page`` (generated) or ``corpus.Document.render`` (python3-doc's pages);
on the filler web, page padding comes
from one filler text per graph (sliced at a place fixed by the URL), which keeps rendering cheap for
tens of thousands of pages while every page stays distinct and deterministic.
"""

from __future__ import annotations

import gzip
import html
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from .markup import render_page
from .model import Resource, make_url

if TYPE_CHECKING:
    from .graph import SiteGraph

__all__ = ["Answer", "filler", "gzip_body", "huge_chunks", "render", "render_robots"]

_WORDS = (
    "crawler", "peer", "ring", "host", "page", "link", "robots", "delay", "frontier", "fetch", "node", "weight",
    "arc", "epoch", "batch", "queue", "store", "index", "parse", "charset", "redirect", "gzip", "trap", "seed",
    "graph", "zone", "socket", "stream",
)
_FILLER_BYTES = 1 << 17
SERVER = b"peercrawl-localweb"


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """A complete HTTP answer, body included (all but the huge page, which is streamed)."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


@lru_cache(maxsize=8)
def filler(seed: int) -> str:
    """The padding text of the graph generated with ``seed``: ASCII words, about 128 KiB."""
    rng = random.Random(f"{seed}:filler")
    words: list[str] = []
    size = 0
    while size < _FILLER_BYTES:
        word = rng.choice(_WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def _pad(seed: int, key: str, n: int) -> str:
    if n <= 0:
        return ""
    text = filler(seed)
    room = len(text) - 1
    out: list[str] = []
    offset = zlib.crc32(key.encode("utf-8")) % room
    while n > 0:
        piece = text[offset : offset + n]
        out.append(piece)
        n -= len(piece)
        offset = 0
    return "".join(out)


def _html(graph: SiteGraph, res: Resource, port: int) -> str:
    if res.markup == "doc":
        assert graph.corpus is not None
        document = graph.corpus.documents[res.doc]
        hrefs = [link.render_href(port) for link in res.links]
        page = document.render(hrefs[: document.link_slots], make_url(res.host, res.path, port))
        extra = hrefs[document.link_slots:]  # a feature web's hub links to its feature hosts
        if not extra:
            return page
        extra_items = "".join(f'<li><a href="{html.escape(h)}">{html.escape(h)}</a></li>' for h in extra)
        at = page.rfind("</body>")
        at = len(page) if at < 0 else at
        return page[:at] + f"<ul>{extra_items}</ul>\n" + page[at:]
    if res.markup == "gen":
        return render_page(seed=graph.seed, key=f"{res.host}{res.path}", host=res.host,
                           size=res.size, nav=res.nav, footer=res.footer,
                           hrefs=[link.render_href(port) for link in res.links])
    head = []
    label = res.charset_label or res.charset
    if res.declare == "meta":
        if label.lower() == "gb2312":
            head.append(f'<meta http-equiv="Content-Type" content="text/html; charset={label}">')
        else:
            head.append(f'<meta charset="{label}">')
    if res.meta_nofollow:
        head.append('<meta name="robots" content="nofollow">')
    if res.base_href is not None:
        head.append(f'<base href="{html.escape(res.base_href)}">')
    items = []
    if res.script_data:  # a page its script builds: an empty mount, the script, what the HTML itself holds
        plain = "".join(f'<a href="{html.escape(link.render_href(port))}">{html.escape(link.text or link.path)}</a>\n'
                        for link in res.links if not link.scripted)
        return (f"<!DOCTYPE html>\n<html><head><title>{res.host}{html.escape(res.path)}</title>"
                f'<script src="/js/app.js" data-src="{html.escape(res.script_data)}" defer></script></head>\n'
                f'<body><div id="app"></div>\n{plain}</body></html>\n')
    for link in res.links:
        rel = f' rel="{link.rel}"' if link.rel else ""
        items.append(f'<li><a href="{html.escape(link.render_href(port))}"{rel}>{html.escape(link.text or link.path)}</a></li>')
    doc = (
        f"<!DOCTYPE html>\n<html><head>{''.join(head)}<title>{res.host}{html.escape(res.path)}</title></head>\n"
        f"<body><h1>{html.escape(res.path)}</h1>\n<p>{html.escape(res.text)}</p>\n<ul>\n" + "\n".join(items) + "\n</ul>\n"
    )
    tail = "</p></body></html>\n"
    pad = res.size - len(doc) - len(tail) - 3
    return doc + "<p>" + _pad(graph.seed, res.host + res.path, pad) + tail


def render(graph: SiteGraph, res: Resource, port: int) -> Answer:
    """The answer ``res`` gets once past any first-request 429/503 (not for ``kind == "huge"``)."""
    if res.kind == "redirect" and res.location is not None:
        location = res.location.render_href(port).encode("utf-8")
        body = b"<html><body>moved</body></html>\n"
        return Answer(status=res.status, body=body, headers=(
            (b"location", location), (b"content-type", b"text/html; charset=utf-8")))
    if res.kind == "missing":
        body = f"<html><body>{res.status} {html.escape(res.path)}</body></html>\n".encode()
        return Answer(status=res.status, body=body, headers=((b"content-type", b"text/html; charset=utf-8"),))
    if res.kind == "binary":
        return Answer(status=res.status, body=res.body, headers=((b"content-type", res.content_type.encode()),))
    body = res.body if res.body else _html(graph, res, port).encode(res.charset)  # a structured page: as written
    ctype = res.content_type
    if res.declare == "header":
        ctype += f"; charset={res.charset_label or res.charset}"
    return Answer(status=res.status, body=body, headers=((b"content-type", ctype.encode()),))


def gzip_body(body: bytes) -> bytes:
    """gzip with a zero timestamp, so the same page always compresses to the same bytes."""
    return gzip.compress(body, compresslevel=6, mtime=0)


def render_robots(graph: SiteGraph, host: str, path: str) -> Answer | None:
    """The answer for ``/robots.txt`` (or the target of its redirect) on ``host``; None if not robots."""
    spec = graph.robots(host)
    if spec is None:
        return None
    text = ((b"content-type", b"text/plain; charset=utf-8"),)
    if path == "/robots.txt":
        if spec.status == 200:
            return Answer(status=200, headers=text, body=spec.render())
        if spec.redirect_path is not None:
            return Answer(status=spec.status, headers=((b"location", spec.redirect_path.encode()),) + text,
                          body=b"moved\n")
        return Answer(status=spec.status, headers=text, body=f"robots.txt answers {spec.status}\n".encode())
    if spec.redirect_path is not None and path == spec.redirect_path:
        return Answer(status=200, headers=text, body=spec.render())
    return None


def huge_chunks(graph: SiteGraph, res: Resource, chunk: int = 1 << 16) -> Iterator[bytes]:
    """The huge page's body, ``res.size`` bytes in chunks: an HTML head, then filler."""
    head = b"<!DOCTYPE html>\n<html><head><title>huge</title></head><body><p>"
    block = filler(graph.seed).encode("ascii")
    remaining = res.size
    first = head[:remaining]
    if first:
        yield first
        remaining -= len(first)
    while remaining > 0:
        piece = block[: min(chunk, remaining)]
        yield piece
        remaining -= len(piece)
