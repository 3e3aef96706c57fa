"""A page rendered in a browser, within its host's turn (`--render`, docs/rendering.md): the decision
(`peer.render.decision`), the render (`PageRenderer`: the node's `peer.render.RenderPool`), every request of the
browser served here as a request of the turn, and what the render found: the links of the rendered DOM beside
the HTML's, the DOM stored as a `conversion` record after the page's response, the plug-ins run on the DOM.

Rules of a browser request (each refusal is ``Fetch.failRequest`` and counted, ``render{kind="refused-REASON"}``):
the page itself is answered with the response the turn already has (no second fetch); any other URL must be a
GET or HEAD (``method``) on the turn's own host (``other-host``; ``not-owner`` when another node owns that host),
with its origin's robots.txt known and allowing it (``robots``), within the host's byte budget; it then waits for
the host's next allowed time (``--delay``, Crawl-delay, back-off), goes out on the turn's address lane through
the node's fetcher (SSRF defences, body and decoding limits), is written to the WARC file whatever its type, and
sets the host's next allowed time as any request of the turn does.

A mixin of `peer.crawl.crawler.Crawler`: it works on the crawler's attributes, set in `Crawler.__init__`.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from storage import QueuedUrl

from peer.crawl.links import Page, extract, is_html
from peer.crawl.pagework import Plugged
from peer.crawl.responses import RETRY_STATUSES, as_decoded, retry_after
from peer.crawl.scheduler import HostTurn
from peer.crawl.urls import host_of_normalized, normalize, origin_of_normalized
from peer.fetch.errors import DnsError, FetchError
from peer.fetch.http import Response
from peer.render.decision import Decider, signals
from peer.render.tabs import TAB_REFUSALS, BrowserRequest, RenderFailed, Served

if TYPE_CHECKING:
    from collections.abc import Callable

    from storage import LruTtlCache, PageStore

    from peer.config import Config
    from peer.crawl.robots import RobotsDecision
    from peer.crawl.seams import PageRenderer
    from peer.crawl.settings import CrawlSettings
    from peer.stats import Stats

__all__ = ["RenderTurns"]

log = logging.getLogger("peer.crawl.crawler")

_RENDERED_TYPE = "text/html; charset=utf-8"


class RenderTurns:
    """A page's render within its host's turn (see the module's text)."""

    if TYPE_CHECKING:
        cfg: Config
        owns: Callable[[str], bool] | None
        pages: PageStore
        plugins: Any
        renderer: PageRenderer | None
        render_decider: Decider
        robots: LruTtlCache[str, RobotsDecision]
        robots_agent: str
        settings: CrawlSettings
        stats: Stats
        store_types: tuple[str, ...]
        user_agent: str
        wallclock: Callable[[], float]

        async def _fetch(self, host: str, url: str, **kw: Any) -> Response: ...
        def _schedule_after_request(self, turn: HostTurn, *, extra: float = 0.0) -> None: ...
        def _store_located(self, resp: Response, ctype: str | None, now: float) -> tuple[int | None, Any]: ...

    async def _render_work(self, turn: HostTurn, item: QueuedUrl, resp: Response, ctype: str | None,
                           now: float) -> tuple[int | None, Page | None, Plugged | None, Any] | None:
        """The page's work when the decision renders it: (bytes stored, its page with the rendered links, the
        plug-ins' outcome, where its response record went); None when it is not rendered or its render failed (the page then goes the usual
        way, unrendered; the failure is counted, ``render{kind="failed-KIND"}``)."""
        if self.renderer is None or not is_html(ctype):
            return None
        origin = origin_of_normalized(item.url)
        path = item.url[len(origin):] or "/"
        decider = self.render_decider
        reason = decider.decide(turn.host, path, resp.body)
        counts = self.stats.render
        counts["learned-skipped"] = decider.counts["learned"]
        if reason is None:
            return None
        # the page's own request counts for the host's politeness from now on: the browser's wait after it
        self._schedule_after_request(turn)
        try:
            rendered = await self.renderer.render(item.url, partial(self._serve_browser, turn, item, resp))
        except RenderFailed as exc:
            counts[f"failed-{exc.kind}"] += 1
            log.info("render failed, the page goes as its HTML", extra={"url": item.url, "error": str(exc)})
            return None
        counts["rendered"] += 1
        counts[f"reason-{reason}"] += 1
        counts["timed-out"] += rendered.timed_out
        counts["popups-closed"] += rendered.popups
        for reason in TAB_REFUSALS:  # refused by the tab itself; the node counts its own refusals as it serves
            counts[f"refused-{reason}"] += rendered.refused.get(reason, 0)
        dom = rendered.html.encode("utf-8")
        raw = extract(resp.body, item.url, ctype)
        page = extract(dom, item.url, _RENDERED_TYPE)
        known = set(raw.links)
        new = tuple(link for link in page.links if link not in known)
        counts["new-links"] += len(new)
        links = () if page.nofollow else raw.links + new
        page = dataclasses.replace(page, links=links)
        self.render_decider.learn(turn.host, path, new_links=len(new), text_before=signals(resp.body).text,
                                  text_after=signals(dom).text)
        plugged: Plugged | None = None
        store = True
        if self.plugins is not None and self.plugins.active:  # the chain sees the page as the browser built it
            generation = self.plugins.generation
            outcome = self.plugins.run_page(resp.url, resp.status, as_decoded(resp), dom, _RENDERED_TYPE, now,
                                            page.links, page.base)
            store = outcome.store
        size, location = self._store_located(resp, ctype, now) if store else (None, None)
        if size is not None:
            size += self.pages.store_conversion(url=item.url, fetched_at=self.wallclock(), body=dom,
                                                content_type=_RENDERED_TYPE, refers_to_date=now)
        if self.plugins is not None and self.plugins.active:
            plugged = Plugged(size, page, outcome, generation, location)
        return size, page, plugged, location

    async def _serve_browser(self, turn: HostTurn, item: QueuedUrl, page: Response,
                             request: BrowserRequest) -> Served | str:
        """One request of the browser rendering `item`, by the rules of the module's text."""
        counts = self.stats.render
        reason = await self._browser_request(turn, item, page, request)
        if isinstance(reason, str):
            counts[f"refused-{reason}"] += 1
        else:
            counts["requests-served"] += 1
        return reason

    async def _browser_request(self, turn: HostTurn, item: QueuedUrl, page: Response,
                               request: BrowserRequest) -> Served | str:
        if request.method not in ("GET", "HEAD"):
            return "method"
        url = normalize(request.url, max_length=self.settings.max_url_length)
        if url is None:
            return "url"
        if url == item.url:
            return Served(status=page.status, headers=as_decoded(page), body=page.body)
        host = host_of_normalized(url)
        if host != turn.host:
            return "not-owner" if self.owns is not None and not self.owns(host) else "other-host"
        origin = origin_of_normalized(url)
        decision = self.robots.get(origin, self.wallclock())
        if decision is None or not decision.robots.can_fetch(self.robots_agent, url[len(origin):] or "/"):
            return "robots"
        if 0 <= self.settings.max_bytes_per_host <= turn.bytes:
            return "max-bytes-per-host"
        await trio.sleep_until(turn.next_allowed)  # the host's politeness, as between two turns
        headers = [("user-agent", self.user_agent)]
        headers += [(k.lower(), v) for k, v in request.headers.items() if k.lower() in ("accept", "referer")]
        try:
            resp = await self._fetch(turn.host, url, headers=tuple(headers))
        except (FetchError, DnsError) as exc:
            self.stats.errors[f"render-{exc.label}"] += 1
            self._schedule_after_request(turn)
            return "fetch-failed"
        self.stats.bytes += len(resp.body)
        turn.bytes += len(resp.body)
        if resp.status in RETRY_STATUSES:  # the host asks for a pause: every request of the turn waits it
            wait = retry_after(resp, self.wallclock())
            turn.backoff = min(self.cfg.max_backoff, wait if wait is not None else max(self.cfg.delay, 1.0))
        self._schedule_after_request(turn)
        self._store_fetched(resp, self.wallclock())
        return Served(status=resp.status, headers=as_decoded(resp), body=resp.body)

    def _store_fetched(self, resp: Response, now: float) -> None:
        """A browser request's response in the WARC file, whatever its type (a replay needs the scripts)."""
        self.pages.store(url=resp.url, request_headers=resp.request_headers, status=resp.status,
                         reason=resp.reason, response_headers=as_decoded(resp), body=resp.body, ip=resp.ip,
                         fetched_at=now, truncated=resp.truncated, protocol=resp.protocol)
