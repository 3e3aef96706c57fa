"""Sitemaps (sitemaps.org protocol 0.9): a streaming reader and the protocol's location rule.

Pure: no I/O and no clock. The crawler feeds a sitemap's body to `SitemapReader.feed` piece by piece as it
arrives and admits the entries each call returns, so no sitemap is ever held whole in memory:

- gzip: a body starting with the gzip magic is inflated here, at most `STEP` bytes per inflate call, so a
  gzip bomb is stopped after `MAX_SITEMAP_BYTES` of output having never held more than one step of it.
- XML: lxml's pull parser (`etree.XMLPullParser`), fed the pieces; each `<url>` or `<sitemap>` element is
  turned into an entry when it ends, and every finished element is cleared with its earlier siblings, so the
  tree never grows. libxml2's own limits (without `huge_tree`) refuse a text node over 10 MB and nesting deeper
  than 256, which ends such a document as "not-xml". Entities
  are not resolved and nothing is loaded from the network; a document with a DOCTYPE is not read at all
  ("doctype"): no sitemap needs one, and an entity whose text opens an element makes lxml's pull parser (lxml
  6.1, libxml2 2.14) hand out elements libxml2 has freed already (garbage tags, failed assertions). lxml is already a dependency and its parser is
  incremental; the sitemap libraries on PyPI (ultimate-sitemap-parser, advertools) fetch and read a whole
  document at a time, so they cannot keep the memory bound (docs/parsing.md has the reader's figures).
- Limits (the protocol's): at most `MAX_SITEMAP_URLS` entries and `MAX_SITEMAP_BYTES` uncompressed bytes per
  file, and ours: `MAX_SITEMAP_ELEMENTS` XML elements; past any the reader stops (`stopped` names why) and
  keeps what it has returned. One `feed` inflates at most one step; `backlog` says when more is waiting.
- `<lastmod>` (W3C datetime: a year, year-month, date, or date and time with a zone) becomes epoch seconds;
  a value that does not read is dropped, the URL is kept.

Which URLs a sitemap may list (the protocol's rule, `may_list`): those under its own location (same scheme,
host and port, and a path in its directory); a sitemap named by a robots.txt (or reached from one through a
sitemap index) may also list any URL of that robots.txt's origin.
"""

from __future__ import annotations

import calendar
import re
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from lxml import etree

__all__ = [
    "MAX_SITEMAP_BYTES",
    "MAX_SITEMAP_ELEMENTS",
    "MAX_SITEMAP_URLS",
    "SitemapEntry",
    "SitemapReader",
    "may_list",
    "parse_lastmod",
]

MAX_SITEMAP_URLS = 50_000  # sitemaps.org: at most 50,000 URLs per sitemap (and sitemaps per index)
MAX_SITEMAP_BYTES = 50 * 1024 * 1024  # sitemaps.org: at most 50 MB (52,428,800 bytes) uncompressed
#: XML elements read per file at most: 20 per URL the protocol allows (loc, lastmod, changefreq, priority and
#: extension elements such as images). Each costs a few microseconds of Python, so this bounds the CPU a file
#: of tiny elements (the other shape of a bomb) can take, as MAX_SITEMAP_BYTES bounds the bytes.
MAX_SITEMAP_ELEMENTS = 20 * MAX_SITEMAP_URLS
STEP = 1 << 20  # at most this much inflated output per inflate call

_GZIP_MAGIC = b"\x1f\x8b"
_YEAR_MONTH = re.compile(r"(\d{4})(?:-(\d{2}))?")

Stopped = Literal["too-many-urls", "too-large", "not-xml", "not-a-sitemap", "doctype"]
_DOCTYPE = re.compile(rb"<!doctype", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SitemapEntry:
    """One `<url>` (a page) or `<sitemap>` (a child of an index): its location and last modification."""

    loc: str
    lastmod: float | None
    is_sitemap: bool


def parse_lastmod(text: str) -> float | None:
    """A W3C datetime as epoch seconds (UTC when no zone is given), or None when it does not read or falls
    before 1970: a lastmod travels to peers as a non-negative duration (protocol `Seconds`), and no web page
    was modified before the epoch."""
    text = text.strip()
    if not text or len(text) > 64:
        return None
    m = _YEAR_MONTH.fullmatch(text)
    if m is not None:
        year, month = int(m.group(1)), int(m.group(2) or 1)
        if not 1970 <= year or not 1 <= month <= 12:
            return None  # year 0 is not a date either (timegm raises ValueError on it)
        return float(calendar.timegm((year, month, 1, 0, 0, 0)))
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    seconds = when.timestamp()
    return seconds if seconds >= 0 else None


def _origin_and_path(url: str) -> tuple[str, str]:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", url
    slash = rest.find("/")
    if slash < 0:
        return scheme.lower() + "://" + rest.lower(), "/"
    return scheme.lower() + "://" + rest[:slash].lower(), rest[slash:]


def may_list(sitemap_url: str, url: str, *, named_by: str | None = None) -> bool:
    """Whether the sitemap at `sitemap_url` may list `url` (both normalized): `url` is under the sitemap's
    directory on the same origin, or on the origin of `named_by`, the robots.txt URL that named the sitemap."""
    origin, path = _origin_and_path(url)
    if named_by is not None and origin == _origin_and_path(named_by)[0]:
        return True
    s_origin, s_path = _origin_and_path(sitemap_url)
    if origin != s_origin:
        return False
    directory = s_path.split("?", 1)[0]
    directory = directory[: directory.rfind("/") + 1]
    return path.startswith(directory)


def _local(tag: object) -> str:
    if not isinstance(tag, str):
        return ""  # comments and processing instructions
    return tag.rpartition("}")[2]


class SitemapReader:
    """Reads one sitemap or sitemap index fed in pieces; see the module notes."""

    def __init__(
        self,
        *,
        max_urls: int = MAX_SITEMAP_URLS,
        max_bytes: int = MAX_SITEMAP_BYTES,
        max_elements: int = MAX_SITEMAP_ELEMENTS,
    ) -> None:
        self.max_urls = max_urls
        self.max_bytes = max_bytes
        self.max_elements = max_elements
        self.kind: Literal["urlset", "sitemapindex"] | None = None
        self.entries = 0  # entries returned so far
        self.inflated = 0  # uncompressed bytes read so far
        self.stopped: Stopped | None = None
        self._started = False
        self._gunzip: zlib._Decompress | None = None
        self._tail = b""  # compressed input not inflated yet
        self._prolog_end = b""  # the last bytes fed before the root element began (a DOCTYPE split in two)
        self.elements = 0  # XML elements finished so far
        self._parser = etree.XMLPullParser(
            events=("start", "end"), resolve_entities=False, no_network=True, huge_tree=False,
            remove_comments=True, remove_pis=True,
        )
        self._loc: str | None = None
        self._lastmod: float | None = None

    @property
    def done(self) -> bool:
        """True once the reader has stopped (a limit, or a body that is not a sitemap): feed no more."""
        return self.stopped is not None

    def feed(self, data: bytes) -> list[SitemapEntry]:
        """The entries completed by this piece of the body (possibly none)."""
        out: list[SitemapEntry] = []
        if self.stopped is not None or not (data or self._tail):
            return out
        if type(data) is not bytes:
            data = bytes(data)  # h11 hands out bytearrays; lxml takes bytes
        if not self._started:
            self._started = True
            if data[:2] == _GZIP_MAGIC:
                self._gunzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
        gunzip = self._gunzip
        if gunzip is None:
            self._xml(data, out)
            return out
        try:
            piece = gunzip.decompress(self._tail + data if self._tail else data, STEP)
        except zlib.error:
            self.stopped = "not-xml"
            return out
        self._tail = gunzip.unconsumed_tail
        self._xml(piece, out)
        return out

    @property
    def backlog(self) -> bool:
        """True while compressed input fed earlier still waits to be inflated: call `feed(b"")` to go on (one
        step per call, so the caller can let other work run between steps)."""
        return bool(self._tail) and self.stopped is None

    def close(self) -> list[SitemapEntry]:
        """The body ended: the last entries, if the document is complete."""
        out: list[SitemapEntry] = []
        while self.backlog:
            out += self.feed(b"")
        if self.stopped is None and self._started:
            try:
                self._parser.close()
            except etree.XMLSyntaxError:
                self.stopped = "not-xml"
            else:
                self._events(out)
        return out

    def _xml(self, data: bytes, out: list[SitemapEntry]) -> None:
        if not data:
            return
        room = self.max_bytes - self.inflated
        if len(data) > room:
            data = data[:room]
            self.stopped = "too-large"
        self.inflated += len(data)
        if self.kind is None:  # a DOCTYPE can only come before the root element: looked for until it begins
            seen = self._prolog_end + data
            if _DOCTYPE.search(seen) is not None:
                self.stopped = "doctype"
                return
            self._prolog_end = seen[-8:]
        try:
            self._parser.feed(data)
        except etree.XMLSyntaxError:
            self.stopped = "not-xml"
        self._events(out)

    def _events(self, out: list[SitemapEntry]) -> None:
        try:
            for event, elem in self._parser.read_events():
                if not isinstance(elem, etree._Element):
                    continue  # only start and end events are asked for: always elements
                name = _local(elem.tag)
                if event == "start":
                    if self.kind is None:
                        if name not in ("urlset", "sitemapindex"):
                            self.stopped = "not-a-sitemap"
                            return
                        self.kind = name  # type: ignore[assignment]
                    continue
                if name == "loc":
                    self._loc = (elem.text or "").strip() or None
                elif name == "lastmod":
                    self._lastmod = parse_lastmod(elem.text or "")
                elif name in ("url", "sitemap"):
                    if self._loc is not None:
                        if self.entries >= self.max_urls:
                            self.stopped = "too-many-urls"
                            return
                        out.append(SitemapEntry(self._loc, self._lastmod, name == "sitemap"))
                        self.entries += 1
                    self._loc, self._lastmod = None, None
                self.elements += 1
                if self.elements > self.max_elements:
                    self.stopped = "too-large"
                    return
                # Every finished element is emptied and its finished elder siblings dropped, whatever its name,
                # so unknown elements cannot pile up either: the tree holds one open path and a sibling each.
                elem.clear()
                parent = elem.getparent()
                if parent is not None:
                    while elem.getprevious() is not None:
                        del parent[0]
        except etree.XMLSyntaxError:
            self.stopped = "not-xml"
