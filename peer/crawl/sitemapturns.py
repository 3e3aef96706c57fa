"""Sitemaps, the crawler's part: the Sitemap lines of a robots.txt (and `/sitemap.xml` with `--sitemap-xml` when
it names none) are queued as sitemap records for their hosts' owners, and a sitemap's host turn streams it
through `peer/crawl/sitemaps.py` (gzip, indexes, the protocol's limits), admitting what it may list a batch at a
time through the same scope, ownership and dedup path as links (docs/parsing.md, "Sitemaps").

A mixin of `peer.crawl.crawler.Crawler`: it works on the crawler's attributes, set in `Crawler.__init__`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from storage import QueuedUrl

from peer.crawl.admission import Batch
from peer.crawl.responses import REDIRECTS, RETRY_STATUSES, header, retry_after
from peer.crawl.robots import RobotsDecision
from peer.crawl.scheduler import HostTurn
from peer.crawl.sitemaps import MAX_SITEMAP_BYTES, SitemapEntry, SitemapReader, may_list
from peer.crawl.urls import normalize
from peer.fetch.errors import TRANSIENT, DnsError, FetchError

if TYPE_CHECKING:
    from collections.abc import Callable

    from storage import FrontierStore, RevisitRecord

    from peer.config import Config
    from peer.crawl.seams import Ownership
    from peer.crawl.settings import CrawlSettings
    from peer.fetch.http import Response
    from peer.stats import Stats

__all__ = ["SitemapTurns"]

#: Sitemap entries admitted in one store transaction while a sitemap streams in.
_SITEMAP_BATCH = 1000
#: Sitemap lines of one robots.txt that are read (a file naming thousands is not a site's own list).
_MAX_NAMED_SITEMAPS = 64


class SitemapTurns:
    """Queueing the sitemaps a robots.txt names, and reading one in its host's turn."""

    if TYPE_CHECKING:
        # What this part uses of the Crawler it is mixed into: attributes and its other parts' methods.
        cfg: Config
        frontier: FrontierStore
        ownership: Ownership
        _retries: dict[str, int]
        settings: CrawlSettings
        stats: Stats
        user_agent: str
        wallclock: Callable[[], float]

        def _commit(self, batch: Batch, done: QueuedUrl | None = None, revisit: RevisitRecord | None = None,
                    turn: HostTurn | None = None) -> tuple[int, int]: ...
        async def _fetch(self, host: str, url: str, **kw) -> Response: ...
        def _retry(self, turn: HostTurn, item: QueuedUrl, *, retry_after: float | None = None) -> bool: ...
        def _save_state(self, turn: HostTurn) -> None: ...
        def _schedule_after_request(self, turn: HostTurn, *, extra: float = 0.0) -> None: ...
        def _screen(self, batch: Batch, url: str, depth: int, hops: int, found_on: str | None,
                    lastmod: float | None = None, sitemap: bool = False) -> None: ...
        plugins: Any  # peer.plugins.Plugins, a room above this one (None: no plug-ins)

        def _filter_urls(self, source: str, urls: list[str], tag: str | None) -> list[str | None]: ...

    def _admit_sitemaps(self, origin: str, decision: RobotsDecision) -> None:
        """Queue the sitemaps a robots.txt names (and, with ``sitemap_xml``, /sitemap.xml when it names none)
        as sitemap items for their hosts' owners: read in the host's turn like any request."""
        if not self.cfg.sitemaps or decision.kind == "disallow-all-retry":
            return
        robots_url = origin + "/robots.txt"
        named = decision.robots.sitemaps[:_MAX_NAMED_SITEMAPS]
        batch = Batch()
        for raw in named:
            url = normalize(raw, robots_url, max_length=self.settings.max_url_length)
            if url is None:
                self.stats.skipped["sitemap-bad-url"] += 1
                continue
            self._screen(batch, url, 0, 0, robots_url, sitemap=True)
        if not named and self.cfg.sitemap_xml:
            self._screen(batch, origin + "/sitemap.xml", 0, 0, None, sitemap=True)
        if batch.cands:
            self._commit(batch)

    async def _fetch_sitemap(self, turn: HostTurn, item: QueuedUrl) -> None:
        """Read one sitemap or sitemap index as it streams in, admitting what it may list a batch at a time
        (the same scope, ownership and dedup path as links; robots.txt is checked when each URL's turn comes)."""
        stats = self.stats
        sink = _SitemapSink(self, item)
        headers = (("user-agent", self.user_agent), ("accept-encoding", "identity"))
        stats.sitemap_fetches += 1
        try:
            resp = await self._fetch(turn.host, item.url, headers=headers, sink=sink)
        except (FetchError, DnsError) as exc:
            stats.errors[f"sitemap-{exc.label}"] += 1
            if isinstance(exc, TRANSIENT) and self._retry(turn, item):
                return
            sink.flush()
            self.frontier.done(item)
            turn.failures += 1
            self._schedule_after_request(turn)
            self._save_state(turn)
            return
        status = resp.status
        stats.status[f"{status // 100}xx"] += 1
        if status in RETRY_STATUSES and self._retry(turn, item, retry_after=retry_after(resp, self.wallclock())):
            return
        turn.failures = 0
        turn.backoff = 0.0
        batch = Batch()
        if status in REDIRECTS:
            location = header(resp, "location")
            target = normalize(location, item.url, max_length=self.settings.max_url_length) if location else None
            if target is not None and item.hops + 1 <= self.cfg.max_redirect_hops:
                if (target := self._filter_urls(item.url, [target], "redirect")[0]) is not None:
                    self._screen(batch, target, item.depth, item.hops + 1, item.found_on, sitemap=True)
            elif target is not None:
                stats.skipped["redirect-hops"] += 1
        elif 200 <= status < 300:
            sink.finish(batch)
        self._schedule_after_request(turn)
        self._commit(batch, done=item, turn=turn)
        self.ownership.fetched(item)
        self._retries.pop(item.url, None)

    def _screen_listed(self, batch: Batch, sitemap: QueuedUrl, entries: Sequence[SitemapEntry]) -> None:
        """Screen what a sitemap lists: the protocol's location rule, then the links' path."""
        named_by = sitemap.found_on if sitemap.found_on and sitemap.found_on.endswith("/robots.txt") else None
        max_length = self.settings.max_url_length
        skipped = self.stats.skipped
        self.stats.sitemap_urls += len(entries)
        listed: list[tuple[str, SitemapEntry]] = []
        for entry in entries:
            url = normalize(entry.loc, sitemap.url, max_length=max_length)
            if url is None:
                skipped["sitemap-bad-url"] += 1
            elif not may_list(sitemap.url, url, named_by=named_by):
                skipped["sitemap-location"] += 1
            else:
                listed.append((url, entry))
        if self.plugins is not None and listed:
            answers = self._filter_urls(sitemap.url, [url for url, _entry in listed], "sitemap")
            listed = [(url, entry) for url, (_found, entry) in zip(answers, listed) if url is not None]
        for url, entry in listed:
            if entry.is_sitemap:
                if sitemap.hops + 1 > self.cfg.max_redirect_hops:
                    skipped["sitemap-nesting"] += 1
                else:
                    self._screen(batch, url, sitemap.depth, sitemap.hops + 1, named_by or sitemap.url, sitemap=True)
            else:
                self._screen(batch, url, sitemap.depth + 1, 0, sitemap.url, entry.lastmod)


class _SitemapSink:
    """The body sink of one sitemap fetch (``peer.fetch.http.BodySink``): only a 2xx body is read; its pieces
    go through a `SitemapReader`, and what it lists is admitted every `_SITEMAP_BATCH` entries, so neither
    the document nor its list is ever held whole."""

    __slots__ = ("crawler", "item", "reader", "pending", "max_bytes")

    def __init__(self, crawler: SitemapTurns, item: QueuedUrl) -> None:
        self.crawler = crawler
        self.item = item
        self.reader = SitemapReader()
        self.pending: list[SitemapEntry] = []
        self.max_bytes = MAX_SITEMAP_BYTES  # on the wire; the reader bounds the inflated size the same

    def head(self, status: int, headers: list[tuple[str, str]]) -> bool:
        return 200 <= status < 300

    async def write(self, piece: bytes) -> bool:
        reader = self.reader
        self.pending += reader.feed(piece)
        while reader.backlog:  # a compressed piece inflating to many steps: let other fetches run between them
            if len(self.pending) >= _SITEMAP_BATCH:
                self.flush()
            await trio.sleep(0)
            self.pending += reader.feed(b"")
        if len(self.pending) >= _SITEMAP_BATCH:
            self.flush()
        return not reader.done

    def flush(self) -> None:
        """Admit the entries read so far in one store transaction."""
        if self.pending:
            batch = Batch()
            self.crawler._screen_listed(batch, self.item, self.pending)
            self.pending = []
            self.crawler._commit(batch)

    def finish(self, batch: Batch) -> None:
        """The body ended: the last entries go into `batch` (committed with the sitemap's own record)."""
        self.pending += self.reader.close()
        self.crawler._screen_listed(batch, self.item, self.pending)
        self.pending = []
        if self.reader.stopped is not None:
            self.crawler.stats.skipped[f"sitemap-{self.reader.stopped}"] += 1
