"""Revisits (`--revisit`), the crawler's part: the loop that queues due pages on the hosts this node owns, each
page's next visit after a fetch (the interval halves when it changed, doubles when it did not), the WARC
`revisit` record of an unchanged page, and what `peerctl status` shows of the schedule. The schedule itself is
the store's (`storage/_revisits.py`); the host turn (`hostturns`) makes the conditional GET and calls these.

A mixin of `peer.crawl.crawler.Crawler`: it works on the crawler's attributes, set in `Crawler.__init__`.
"""

from __future__ import annotations

import trio
from typing import TYPE_CHECKING

from storage import QueuedUrl, RevisitRecord, StoredPayload

from peer.crawl.payloads import MIN_PAYLOAD
from peer.crawl.responses import as_decoded, header
from peer.fetch.http import Response

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from storage import NodeStore, PageStore, RevisitSchedule

    from peer.config import Config
    from peer.crawl.payloads import PayloadOriginals
    from peer.crawl.seams import Ownership
    from peer.crawl.settings import CrawlSettings
    from peer.stats import Stats

__all__ = ["Revisits", "record_fields"]

#: The revisit schedule is read this often, and at most this many due pages are queued per read (a few reads
#: per tick when more are due).
_REVISIT_TICK = 1.0
_REVISIT_MIN_SLEEP = 0.02
_REVISIT_BATCH = 1000
_REVISIT_READS = 10


class Revisits:
    """The crawler's revisit schedule: queue what is due, and plan each page's next visit."""

    if TYPE_CHECKING:
        # What this part uses of the Crawler it is mixed into: attributes and its other parts' methods.
        cfg: Config
        _draining: bool
        ownership: Ownership
        owns: Callable[[str], bool] | None
        originals: PayloadOriginals | None
        pages: PageStore
        _payload_revisits: dict[str, StoredPayload]
        _record_ids: dict[str, str]
        store_types: tuple[str, ...]
        schedule: RevisitSchedule | None
        settings: CrawlSettings
        stats: Stats
        store: NodeStore
        wallclock: Callable[[], float]

        def wake_hosts(self, items: Iterable[QueuedUrl]) -> None: ...

    async def _revisit_loop(self) -> None:
        """Queue due revisits when the soonest one is due, looking at least once a tick (a hand-off or a fetch
        may bring sooner ones) and at most every _REVISIT_MIN_SLEEP."""
        assert self.schedule is not None
        while True:
            soonest = self.schedule.next_due(1)
            wait = _REVISIT_TICK if not soonest else soonest[0][0] - self.wallclock()
            await trio.sleep(min(_REVISIT_TICK, max(_REVISIT_MIN_SLEEP, wait)))
            if not (self.settings.paused or self._draining):
                self.queue_due()

    def queue_due(self) -> int:
        """Queue the pages whose revisit is due, on hosts this node owns and may fetch now; wake their hosts."""
        assert self.schedule is not None
        owns, ownership = self.owns, self.ownership

        def may(host: str) -> bool:
            return (owns is None or owns(host)) and not ownership.blocked(host)

        total = 0
        for _ in range(_REVISIT_READS):
            items = self.store.queue_due(self.wallclock(), _REVISIT_BATCH, may)
            total += len(items)
            if items:
                self.wake_hosts(items)
            if len(items) < _REVISIT_BATCH:
                break
        return total

    def _next_visit(self, item: QueuedUrl, before: RevisitRecord | None, resp: Response, *, changed: bool | None,
                    now: float, digest: str | None = None, size: int | None = None) -> RevisitRecord:
        """The page's schedule after this fetch. The interval halves when the page changed and doubles when it
        did not (within --revisit-min/--revisit-max); a first visit starts at the minimum. `digest`/`size` are
        given when a full record was written now."""
        lo, hi = self.cfg.revisit_min, self.cfg.revisit_max
        if before is None:
            interval = lo
        elif changed is None:
            interval = before.interval
        else:
            interval = max(lo, before.interval / 2) if changed else min(hi, before.interval * 2)
        return RevisitRecord(
            url=item.url, host=item.host, depth=item.depth, due=now + interval, interval=interval,
            etag=header(resp, "etag") or (before.etag if before else None),
            last_modified=header(resp, "last-modified") or (before.last_modified if before else None),
            digest=digest if digest is not None else (before.digest if before else ""),
            stored_at=now if digest is not None else (before.stored_at if before else 0.0),
            size=size if size is not None else (before.size if before else 0),
            changed=(before.changed if before else 0) + (changed is True),
            unchanged=(before.unchanged if before else 0) + (changed is False),
        )

    def _store_revisit(self, resp: Response, before: RevisitRecord, profile: str, now: float) -> None:
        written = self.pages.store_revisit(
            url=resp.url, request_headers=resp.request_headers, status=resp.status, reason=resp.reason,
            response_headers=as_decoded(resp), ip=resp.ip, fetched_at=now, profile=profile,
            payload_digest=before.digest, refers_to_uri=before.url, refers_to_date=before.stored_at,
            protocol=resp.protocol)
        self.stats.revisit_bytes += written
        self.stats.revisit_bytes_saved += max(0, before.size - written)

    # ------------------------------------------------------------------ identical payloads across URLs

    async def _payload_original(self, resp: Response, ctype: str | None, digest: str) -> StoredPayload | None:
        """The original a page's record is to refer to, if its payload was stored in full before (by any node:
        the digest's owner answers) under another URL or time; None: the page is stored in full. While the
        page's work runs, `_store` finds it in `_payload_revisits` and writes the revisit record instead."""
        originals = self.originals
        if originals is None or resp.truncated or len(resp.body) < MIN_PAYLOAD:
            return None
        if (ctype or "").split(";", 1)[0].strip().lower() not in self.store_types:
            return None
        self.stats.payload_lookups += 1
        original = await originals.original(digest)
        if original is None:
            return None
        self._payload_revisits[resp.url] = original
        return original

    def _store_payload_revisit(self, resp: Response, original: StoredPayload, now: float) -> int:
        """The revisit record of a page whose payload is `original`'s (profile identical-payload-digest)."""
        written = self.pages.store_revisit(
            url=resp.url, request_headers=resp.request_headers, status=resp.status, reason=resp.reason,
            response_headers=as_decoded(resp), ip=resp.ip, fetched_at=now, profile="identical-payload-digest",
            payload_digest=original.digest, refers_to_uri=original.uri, refers_to_date=original.date,
            protocol=resp.protocol, refers_to=original.record_id)
        stats = self.stats
        stats.payload_revisits += 1
        stats.payload_revisit_bytes += written
        stats.payload_bytes_not_stored += len(resp.body)
        return written

    def _payload_stored(self, resp: Response, digest: str, now: float) -> None:
        """A page was stored in full: the digest's owner learns where (a later copy refers to this one)."""
        record_id = self._record_ids.pop(resp.url, "")
        if self.originals is not None and not resp.truncated and len(resp.body) >= MIN_PAYLOAD:
            self.originals.stored(StoredPayload(digest, resp.url, now, record_id))

    def revisit_status(self) -> dict:
        """What `peerctl status` shows of the schedule."""
        if self.schedule is None:
            return {"enabled": False}
        return {"enabled": True, "scheduled": len(self.schedule), "waiting": self.schedule.waiting(),
                "next_due": [{"in": round(due - self.wallclock(), 1), "url": url}
                             for due, url in self.schedule.next_due(5)]}


def record_fields(record: RevisitRecord) -> dict:
    return {name: getattr(record, name) for name in RevisitRecord.__slots__}
