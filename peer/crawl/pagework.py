"""A fetched page's storing and extraction, the crawler's CPU-heavy work on a page: its WARC records written (if
its type is stored) and its links extracted, inline, in a page thread (`--page-threads`), or in a page worker
process (`--page-processes`, `peer/crawl/pageworkers.py`), which makes the same records and links. The host
turn (`hostturns`) picks the way for each page; everything the page changes in the stores stays there.

A mixin of `peer.crawl.crawler.Crawler`: it works on the crawler's attributes, set in `Crawler.__init__`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from peer.crawl.links import Page, extract, is_html
from peer.crawl.pageworkers import PageJob, PageResult, PageWorkerError
from peer.crawl.responses import as_decoded
from peer.fetch.http import Response

if TYPE_CHECKING:
    from storage import PageStore, StoredPayload

    from peer.config import Config
    from peer.crawl.payloads import PayloadOriginals

    from peer.crawl.pageworkers import PageWorkers
    from peer.stats import Stats

__all__ = ["THREAD_PARSE_BYTES", "PageWork", "Plugged"]

# the crawler's records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.crawl.crawler")

#: A page larger than this is parsed in a worker thread even without ``parse_in_thread``: a million links take
#: lxml about 0.7 s, longer than the membership probe timeout, and the event loop must keep answering.
THREAD_PARSE_BYTES = 512 * 1024


class Plugged(NamedTuple):
    """A page's work with plug-ins: the bytes stored (None: not stored), the parsed page, what the chain made
    of it (`peer.plugins.Outcome`), the chain's generation, and where its response record went."""

    size: int | None
    page: Page | None
    outcome: Any
    generation: int
    location: tuple[str, int] | None


class PageWork:
    """A page's records and links: inline, in a page thread, or by a page worker process."""

    if TYPE_CHECKING:
        # What this part uses of the Crawler it is mixed into: attributes and its other parts' methods.
        cfg: Config
        _large_parses: trio.CapacityLimiter
        _page_threads: trio.CapacityLimiter | None
        page_workers: PageWorkers | None
        originals: PayloadOriginals | None
        pages: PageStore
        _payload_revisits: dict[str, StoredPayload]
        plugins: Any  # peer.plugins.Plugins, a room above this one (None: no plug-ins)
        _record_ids: dict[str, str]
        stats: Stats
        store_types: tuple[str, ...]

        def _store_payload_revisit(self, resp: Response, original: StoredPayload, now: float) -> int: ...

    def _store_and_extract(self, resp: Response, url: str, ctype: str | None, now: float,
                           digest: str | None = None) -> tuple[int | None, Page | None, tuple[str, int] | None]:
        """A page's CPU-heavy work, in a page thread: digests, gzip and lxml's parse release the GIL, so
        threads carry them on other cores; one hand-off per page. The bytes stored, the page, and where its
        response record went (read in the thread that wrote it)."""
        size, location = self._store_located(resp, ctype, now, digest)
        return size, (extract(resp.body, url, ctype) if is_html(ctype) else None), location

    async def _work_elsewhere(self, resp: Response, url: str, ctype: str | None, now: float,
                              digest: str | None = None) -> tuple[int | None, Page | None, tuple[str, int] | None]:
        """A page's records and links made by a page worker process, the records appended here: the same
        records and links as inline (`_store`, `extract`), and where its response record went. A page that
        killed its workers again and again is counted (``errors{kind="page-worker"}``), logged, and finished
        unstored and without links."""
        assert self.page_workers is not None
        mime = (ctype or "").split(";", 1)[0].strip().lower()
        stored = mime in self.store_types
        full = stored and resp.url not in self._payload_revisits  # a revisit record is written here, by _store
        level = getattr(self.pages, "compress_level", None) if full else None
        parse = is_html(ctype)
        if not parse and level is None:
            size, location = self._store_located(resp, ctype, now, digest)
            return size, None, location
        job = PageJob(url=resp.url, content_type=ctype, body=resp.body, parse=parse, compress_level=level,
                      request_headers=resp.request_headers, status=resp.status, reason=resp.reason,
                      response_headers=as_decoded(resp), ip=resp.ip, fetched_at=now, truncated=resp.truncated,
                      protocol=resp.protocol, digest=digest)
        try:
            result: PageResult = await self.page_workers.process(job)
        except PageWorkerError as exc:
            self.stats.errors["page-worker"] += 1
            log.warning("page given up by the page workers", extra={"url": url, "error": str(exc)})
            return None, None, None
        size = None
        location = None
        if result.written is not None:  # the worker appended the records to its own WARC file
            size, location = result.written or 0, result.location
            if self.originals is not None and result.record_id:
                self._record_ids[resp.url] = result.record_id
        elif result.built is not None:
            size = self.pages.store_built(url=resp.url, status=resp.status, fetched_at=now, built=result.built,
                                          truncated=resp.truncated) or 0
            location = self.pages.last_record()
            if self.originals is not None and result.built.record_id:
                self._record_ids[resp.url] = result.built.record_id
        elif stored:
            # a store that keeps no records (--store none) counts it here
            size, location = self._store_located(resp, ctype, now, digest)
        return size, result.page, location

    def _store(self, resp: Response, ctype: str | None, now: float, digest: str | None = None) -> int | None:
        """Write the page if its type is stored; the bytes written (None when not stored). `digest`: the body's
        payload digest if the host turn computed it (the store does not compute it again). Safe in a page
        thread (the store locks)."""
        mime = (ctype or "").split(";", 1)[0].strip().lower()
        if mime not in self.store_types:
            return None
        original = self._payload_revisits.get(resp.url)
        if original is not None:  # a payload stored before under another URL (peer/crawl/payloads.py)
            return self._store_payload_revisit(resp, original, now)
        written = self.pages.store(
            url=resp.url,
            request_headers=resp.request_headers,
            status=resp.status,
            reason=resp.reason,
            response_headers=as_decoded(resp),
            body=resp.body,
            ip=resp.ip,
            fetched_at=now,
            truncated=resp.truncated,
            protocol=resp.protocol,
            payload_digest=digest,
        )
        if self.originals is not None:
            record_id = self.pages.last_record_id()
            if record_id:
                if len(self._record_ids) > 10_000:  # left by pages whose turn failed after the store: bounded
                    self._record_ids.clear()
                self._record_ids[resp.url] = record_id
        return written or 0

    # ------------------------------------------------------------------ with plug-ins (peer/plugins)

    async def _plugged_work(self, resp: Response, url: str, ctype: str | None, now: float,
                            digest: str | None = None) -> Plugged | None:
        """A page's work when plug-ins run on pages: its links, the chain, then its records if the chain's
        page filters keep it; where parsing runs (a page worker, a page thread, or here). None when the page
        workers gave the page up (counted as without plug-ins)."""
        generation = self.plugins.generation
        if self.page_workers is not None:
            mime = (ctype or "").split(";", 1)[0].strip().lower()
            full = mime in self.store_types and resp.url not in self._payload_revisits
            level = getattr(self.pages, "compress_level", None) if full else None
            job = PageJob(url=resp.url, content_type=ctype, body=resp.body, parse=is_html(ctype),
                          compress_level=level, request_headers=resp.request_headers, status=resp.status,
                          reason=resp.reason, response_headers=as_decoded(resp), ip=resp.ip, fetched_at=now,
                          truncated=resp.truncated, protocol=resp.protocol, plugins=self.plugins.job_part(),
                          digest=digest)
            try:
                result: PageResult = await self.page_workers.process(job)
            except PageWorkerError as exc:
                self.stats.errors["page-worker"] += 1
                log.warning("page given up by the page workers", extra={"url": url, "error": str(exc)})
                return None
            outcome = result.outcome
            size: int | None = None
            location = result.location
            if result.written is not None:
                size = result.written or 0
                if self.originals is not None and result.record_id:
                    self._record_ids[resp.url] = result.record_id
            elif result.built is not None:
                size = self.pages.store_built(url=resp.url, status=resp.status, fetched_at=now, built=result.built,
                                              truncated=resp.truncated) or 0
                location = self.pages.last_record()
                if self.originals is not None and result.built.record_id:
                    self._record_ids[resp.url] = result.built.record_id
            elif outcome.store and mime in self.store_types:
                size, location = self._store_located(resp, ctype, now, digest)
            return Plugged(size, result.page, outcome, generation, location)
        if self._page_threads is not None:
            return await trio.to_thread.run_sync(self._plugged_here, resp, url, ctype, now, generation, digest,
                                                 limiter=self._page_threads)
        if len(resp.body) > THREAD_PARSE_BYTES or self.cfg.parse_in_thread:
            return await trio.to_thread.run_sync(self._plugged_here, resp, url, ctype, now, generation, digest,
                                                 limiter=self._large_parses)
        return self._plugged_here(resp, url, ctype, now, generation, digest)

    def _plugged_here(self, resp: Response, url: str, ctype: str | None, now: float, generation: int,
                      digest: str | None = None) -> Plugged:
        page = extract(resp.body, url, ctype) if is_html(ctype) else None
        outcome = self.plugins.run_page(resp.url, resp.status, as_decoded(resp), resp.body, ctype, now,
                                        None if page is None else page.links, None if page is None else page.base)
        size, location = self._store_located(resp, ctype, now, digest) if outcome.store else (None, None)
        return Plugged(size, page, outcome, generation, location)

    def _store_located(self, resp: Response, ctype: str | None, now: float,
                       digest: str | None = None) -> tuple[int | None, Any]:
        size = self._store(resp, ctype, now, digest)
        return size, (self.pages.last_record() if size is not None else None)
