"""Link extraction from fetched HTML: links, base, canonical, meta robots, title.

Pure and synchronous, safe to run in a worker thread (lexbor parses without the GIL). The page is decoded
first (`peer.crawl.charset`) and handed to selectolax's lexbor parser as UTF-8 bytes, which it reads as UTF-8
whatever a <meta> says.

lexbor is an HTML5 (WHATWG) tree builder, the algorithm browsers run, so the elements found are the ones a
browser's DOM holds: a template's contents, text inside textarea/xmp/iframe and the second of two duplicate
attributes are not links (tests/test_links.py compares with a headless chromium on real documentation pages
and on tricky markup). One CSS selector picks the a/area/base/meta/link/title elements in document order.
On real documentation pages (python3-doc, mean 58 KiB, 180 hrefs) parse plus link selection costs about 0.4x
libxml2's (lxml); see tests/bench/bench_realpages.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser, SelectolaxError

from peer.crawl.charset import decode_to_utf8
from peer.crawl.urls import DEFAULT_MAX_URL_LENGTH, normalize, normalize_all

__all__ = ["MAX_LINKS_PER_PAGE", "MAX_TITLE_CHARS", "Page", "extract", "is_html"]

MAX_TITLE_CHARS = 1024  # a title longer than this is spam or garbage; keep the head of it
MAX_LINKS_PER_PAGE = 10_000  # a page with more is a link farm or a trap; its first links are kept

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
# The elements that matter, in document order: the first base with an href sets the base URL (as the DOM's
# document base URL), the first title is the title, the first canonical link is the canonical.
_SELECTOR = "a[href], area[href], base[href], meta[name], link[rel], title"


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    """What the crawler keeps from one HTML page."""

    links: tuple[str, ...]  # normalized, absolute, unique, in document order; none if nofollow
    canonical: str | None
    noindex: bool
    nofollow: bool
    charset: str  # the Python codec the body was decoded with ("" when the body was not parsed)
    title: str | None
    base: str  # the URL relative links were resolved against (after <base href>)


def is_html(content_type: str | None) -> bool:
    """True for text/html and application/xhtml+xml (parameters and case ignored)."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() in _HTML_TYPES


def _tokens(value: str | None) -> set[str]:
    if not value:
        return set()
    return set(value.lower().replace(",", " ").split())


def extract(
    body: bytes,
    url: str,
    content_type: str | None,
    *,
    max_url_length: int = DEFAULT_MAX_URL_LENGTH,
    max_links: int = MAX_LINKS_PER_PAGE,
) -> Page:
    """Parse an HTML page fetched from `url`; never raises on any body.

    `content_type` None means the server sent none and the body is parsed as HTML anyway; any other
    non-HTML type gives an empty page. ValueError if `url` itself is not a crawlable http(s) URL.
    """
    page_url = normalize(url, max_length=max_url_length)
    if page_url is None:
        raise ValueError(f"cannot extract links of a page whose URL is not crawlable: {url[:200]!r}")
    empty = Page(
        links=(), canonical=None, noindex=False, nofollow=False, charset="", title=None, base=page_url
    )
    if content_type is not None and not is_html(content_type):
        return empty
    data, charset = decode_to_utf8(body, content_type)
    try:
        elements = LexborHTMLParser(data).css(_SELECTOR)
    except (SelectolaxError, ValueError):
        elements = []

    hrefs: list[str] = []
    base_href: str | None = None
    canonical_href: str | None = None
    title: str | None = None
    noindex = nofollow = False
    # An attribute written without a value (`<a href>`) reads as None here and as "" in the DOM: `or ""`.
    for el in elements:
        tag = el.tag
        attrs = el.attributes
        if tag == "a" or tag == "area":
            rel = attrs.get("rel")
            if rel is None or "nofollow" not in _tokens(rel):
                hrefs.append(attrs["href"] or "")
        elif tag == "meta":
            name = attrs["name"]
            if name is not None and name.strip().lower() == "robots":
                directives = _tokens(attrs.get("content"))
                if "none" in directives:
                    noindex = nofollow = True
                noindex = noindex or "noindex" in directives
                nofollow = nofollow or "nofollow" in directives
        elif tag == "link":
            if canonical_href is None and "canonical" in _tokens(attrs["rel"]):
                canonical_href = attrs.get("href")
        elif tag == "base":
            if base_href is None:
                base_href = attrs["href"] or ""
        elif title is None:  # title
            text = " ".join(el.text().split())
            title = text[:MAX_TITLE_CHARS] or None

    base = page_url
    if base_href is not None:
        base = normalize(base_href, page_url, max_length=max_url_length) or page_url
    canonical = None
    if canonical_href is not None:
        canonical = normalize(canonical_href, base, max_length=max_url_length)
    if nofollow:
        links: tuple[str, ...] = ()
    else:
        # Bound the work on link farms: unique hrefs beyond a few times the cap are not even resolved.
        unique = list(dict.fromkeys(hrefs))[: 4 * max_links]
        links = tuple(normalize_all(unique, base, max_length=max_url_length)[:max_links])
    return Page(
        links=links,
        canonical=canonical,
        noindex=noindex,
        nofollow=nofollow,
        charset=charset,
        title=title,
        base=base,
    )
