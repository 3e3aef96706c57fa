"""The plug-in API: what a plug-in is given (`FetchedPage`, `Link`), what it answers (`Decision`, items), and
the four kinds (`UrlFilter`, `PageFilter`, `Extractor`, `ItemSink`) as Protocols: a class is of a kind by the
method it defines (``filter``, ``decide``, ``extract``, ``write``), nothing to inherit.

A plug-in class is built once per process with its settings as keyword arguments (the TOML table of its
``[[plugins]]`` entry, without ``use``); a bad setting is a `TypeError` or `ValueError` from its constructor,
which the node refuses at start with the plug-in's name. ``version`` (a class attribute, default "0") goes into
the chain's fingerprint, so nodes running two versions of a plug-in do not crawl together.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from lxml import etree, html

from peer.crawl.charset import decode_to_utf8

__all__ = ["Decision", "Extractor", "FetchedPage", "ItemSink", "Link", "PageFilter", "UrlFilter"]

_local = threading.local()


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """The context of one link on a page: the ``<a>`` or ``<area>`` element it came from."""

    href: str  # as written in the page
    text: str  # the anchor text, whitespace collapsed ("" for <area>)
    tag: str  # "a" or "area"
    rel: frozenset[str]  # the rel tokens, lower-case


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """A page filter's answer: keep the page's WARC records (``store``) and queue its links (``follow``)."""

    store: bool = True
    follow: bool = True


KEEP = Decision()


def _parser() -> etree.HTMLParser:
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = html.HTMLParser(encoding="utf-8", no_network=True)
        _local.parser = parser
    return parser


class FetchedPage:
    """A fetched page as the plug-ins see it. ``text`` is the body decoded (the charset found as the crawler
    finds it: header, BOM, ``<meta>``); ``tree`` the parsed HTML (an `lxml.html` element, so ``cssselect`` and
    ``xpath`` work), built once on first use, or None when the body is not HTML or does not parse."""

    __slots__ = ("_text", "_tree", "_utf8", "body", "content_type", "fetched_at", "headers", "status", "url")

    def __init__(self, *, url: str, status: int, headers: Sequence[tuple[str, str]], body: bytes,
                 content_type: str | None, fetched_at: float) -> None:
        self.url = url
        self.status = status
        self.headers: Mapping[str, str] = {k.lower(): v for k, v in headers}
        self.body = body
        self.content_type = content_type
        self.fetched_at = fetched_at
        self._utf8: bytes | None = None
        self._text: str | None = None
        self._tree: Any = False  # False: not built yet

    @property
    def mime(self) -> str:
        """The content type without its parameters, lower-case ("" when the server sent none)."""
        return (self.content_type or "").split(";", 1)[0].strip().lower()

    def _decoded(self) -> bytes:
        if self._utf8 is None:
            self._utf8, _charset = decode_to_utf8(self.body, self.content_type)
        return self._utf8

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self._decoded().decode("utf-8", "replace")
        return self._text

    @property
    def tree(self) -> Any:
        if self._tree is False:
            self._tree = None
            if self.mime in ("", "text/html", "application/xhtml+xml"):
                try:
                    self._tree = etree.fromstring(self._decoded(), _parser())
                except (etree.LxmlError, ValueError):
                    self._tree = None
        return self._tree

    @property
    def tree_built(self) -> bool:
        """Whether the tree was built for this page (a test's and the benchmark's question)."""
        return self._tree is not False

    def links(self) -> list[Link]:
        """The page's ``<a href>`` and ``<area href>`` with their context, in document order."""
        root = self.tree
        if root is None:
            return []
        found = []
        for el in root.iter("a", "area"):
            href = el.get("href")
            if href is None:
                continue
            text = " ".join("".join(el.itertext()).split()) if el.tag == "a" else ""
            found.append(Link(href=href, text=text, tag=el.tag,
                              rel=frozenset((el.get("rel") or "").lower().replace(",", " ").split())))
        return found


@runtime_checkable
class UrlFilter(Protocol):
    """Decides each link of a page before it is queued: the URL (possibly rewritten) or None to drop it."""

    def filter(self, source_url: str, url: str, link: Link | None) -> str | None: ...


@runtime_checkable
class PageFilter(Protocol):
    """Decides whether a fetched page is stored and its links followed; None: no opinion (the next decides).
    ``needs_tree = True`` asks for ``page.tree`` to be built before the chain runs."""

    def decide(self, page: FetchedPage) -> Decision | None: ...


@runtime_checkable
class Extractor(Protocol):
    """Items (plain dicts of JSON values) from a page."""

    def extract(self, page: FetchedPage) -> Iterable[Mapping[str, Any]] | None: ...


@runtime_checkable
class ItemSink(Protocol):
    """Where exported items go: ``write`` gets them in order and returns once they are durable there."""

    def write(self, items: Sequence[Mapping[str, Any]]) -> None: ...
