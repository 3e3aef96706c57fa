"""One host turn, the crawler's fetch path: a worker holds the host, takes a lane of its server address
(`--ip-connections`), pops one URL (checked against the budgets and the scope in force), makes sure the origin's
robots.txt is known (else fetching it is this turn's request and the URL waits, parked, for the next turn),
then makes the turn's one request: a page (a conditional GET for a revisit), or a sitemap (`sitemapturns`).
A page's answer is read here: redirects and retries (back-off, Retry-After), its storing and links (`pagework`),
its next visit (`revisits`), and the commit of it all with its links and its host's state (`admission`).

A mixin of `peer.crawl.crawler.Crawler`: it works on the crawler's attributes, set in `Crawler.__init__`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import trio

from storage import HostState, QueuedUrl, RevisitRecord, payload_digest

from peer.crawl.addressgate import Lane
from peer.crawl.admission import Batch
from peer.crawl.links import Page, extract, is_html
from peer.crawl.pagework import THREAD_PARSE_BYTES, Plugged
from peer.crawl.responses import REDIRECTS, RETRY_STATUSES, header, retry_after
from peer.crawl.revisits import record_fields
from peer.crawl.robots import decide
from peer.crawl.scheduler import HostTurn
from peer.crawl.urls import host_of_normalized, normalize, origin_of_normalized
from peer.fetch.errors import TRANSIENT, DnsError, FetchError
from peer.fetch.http import Response

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from storage import FrontierStore, LruTtlCache, PageStore, RevisitSchedule, StoredPayload

    from peer.config import Config
    from peer.crawl.pageworkers import PageWorkers
    from peer.crawl.payloads import PayloadOriginals
    from peer.crawl.robots import RobotsDecision
    from peer.crawl.scheduler import HostScheduler
    from peer.crawl.seams import AddressLimits, Ownership, PageFetcher, PageRenderer
    from peer.crawl.settings import CrawlSettings
    from peer.crawl.urls import Scope
    from peer.stats import Stats

__all__ = ["HostTurns"]

#: How many refused (robots/limits) URLs one host turn may skip before it gives up its worker, so a host with
#: thousands of disallowed URLs cannot hog one; each skip is a checkpoint too (a robots.txt of many wildcard
#: rules makes one check cost up to 0.1 s on a long path: 256 of them held the event loop for half a minute).
_SKIP_BUDGET = 256


class HostTurns:
    """A host turn: its address lane, its URL, its robots.txt, its one request and what the answer means."""

    if TYPE_CHECKING:
        # What this part uses of the Crawler it is mixed into: attributes and its other parts' methods.
        _address_waiters: dict[str, set[str]]
        cfg: Config
        _current: dict[str, QueuedUrl]
        fetcher: PageFetcher
        frontier: FrontierStore
        gate: AddressLimits
        _large_parses: trio.CapacityLimiter
        originals: PayloadOriginals | None
        log_urls: bool
        ownership: Ownership
        pages: PageStore
        store: Any
        _page_threads: trio.CapacityLimiter | None
        page_workers: PageWorkers | None
        plugins: Any  # peer.plugins.Plugins, a room above this one (None: no plug-ins)
        _payload_revisits: dict[str, StoredPayload]
        _pending: dict[str, QueuedUrl]
        _pinned: dict[str, str]
        renderer: PageRenderer | None
        _requests: dict[str, int]
        _retries: dict[str, int]
        robots: LruTtlCache[str, RobotsDecision]
        robots_agent: str
        _robots_failures: dict[str, int]
        sched: HostScheduler
        schedule: RevisitSchedule | None
        scope: Scope
        settings: CrawlSettings
        stats: Stats
        user_agent: str
        _wakeup: trio.Event
        wallclock: Callable[[], float]

        def _admit_sitemaps(self, origin: str, decision: RobotsDecision) -> None: ...
        def _commit(self, batch: Batch, done: QueuedUrl | None = None, revisit: RevisitRecord | None = None,
                    turn: HostTurn | None = None, extracted: Sequence[dict[str, Any]] = (),
                    logged: Sequence[Any] | None = None) -> tuple[int, int]: ...
        async def _plugged_work(self, resp: Response, url: str, ctype: str | None, now: float,
                                digest: str | None = None) -> Plugged | None: ...
        async def _fetch_sitemap(self, turn: HostTurn, item: QueuedUrl) -> None: ...
        async def _render_work(self, turn: HostTurn, item: QueuedUrl, resp: Response, ctype: str | None,
                               now: float) -> tuple[int | None, Page | None, Plugged | None, Any] | None: ...
        def _next_visit(self, item: QueuedUrl, before: RevisitRecord | None, resp: Response, *, changed: bool | None,
                        now: float, digest: str | None = None, size: int | None = None) -> RevisitRecord: ...
        async def _payload_original(self, resp: Response, ctype: str | None, digest: str) -> StoredPayload | None: ...
        def _payload_stored(self, resp: Response, digest: str, now: float) -> None: ...
        def _screen(self, batch: Batch, url: str, depth: int, hops: int, found_on: str | None,
                    lastmod: float | None = None, sitemap: bool = False) -> None: ...
        def _screen_found(self, batch: Batch, urls: Sequence[str], depth: int, found_on: str) -> None: ...
        def _filter_urls(self, source: str, urls: list[str], tag: str | None) -> list[str | None]: ...
        def _store(self, resp: Response, ctype: str | None, now: float, digest: str | None = None) -> int | None: ...
        def _store_and_extract(self, resp: Response, url: str, ctype: str | None, now: float, digest: str | None = None
                               ) -> tuple[int | None, Page | None, tuple[str, int] | None]: ...
        def _store_revisit(self, resp: Response, before: RevisitRecord, profile: str, now: float) -> None: ...
        async def _work_elsewhere(self, resp: Response, url: str, ctype: str | None, now: float, digest: str | None = None
                                  ) -> tuple[int | None, Page | None, tuple[str, int] | None]: ...

    # ------------------------------------------------------------------ the address lane and the request

    async def _gated_turn(self, turn: HostTurn) -> bool:
        """A host turn under the per-address limits: take a lane of the host's current address (from the node's
        DNS cache, so a host whose address changes moves to the new address's lanes), make the turn's request
        to that address, give the lane back. With no lane free the host waits without a worker: until a lane
        has rested, or (all in service) parked until one is given back. True if parked."""
        host = turn.host
        try:
            address = await self.fetcher.address(host)
        except DnsError:
            await self._host_turn(turn)  # the fetch fails on the same DNS error and is handled as usual
            return False
        now = trio.current_time()
        got = self.gate.try_acquire(address, now)
        if not isinstance(got, Lane):
            self.stats.address_waits += 1
            if math.isinf(got):
                self._address_waiters.setdefault(address, set()).add(host)
                return True
            turn.next_allowed = max(turn.next_allowed, got)
            return False
        self._pinned[host] = address
        self._requests[host] = 0
        try:
            await self._host_turn(turn)
        finally:
            used = self._requests.pop(host, 0) > 0
            self._pinned.pop(host, None)
            end = trio.current_time()
            self.gate.release(got, end, used=used)
            self.address_ready(address)
        return False

    def hosts_parked(self) -> int:
        """Hosts with work that wait, without a worker or a place in the heap, for a lane of their server
        address (`address_ready` wakes them)."""
        return sum(len(hosts) for hosts in self._address_waiters.values())

    def address_ready(self, address: str) -> None:
        """A lane of `address` was given back here or arrived from its owner: the hosts parked on it try again
        (those that find no lane park again)."""
        waiters = self._address_waiters.pop(address, None)
        if waiters:
            now = trio.current_time()
            for host in waiters:
                self.sched.wake(host, now)
            self._wakeup.set()

    async def _fetch(self, host: str, url: str, **kw) -> Response:
        """One request of a host turn: counted for the address lane, and sent to the address the lane is for
        when the URL is on the turn's host."""
        if host in self._requests:
            self._requests[host] += 1
        address = self._pinned.get(host)
        if address is not None and host_of_normalized(url) == host:
            return await self.fetcher.fetch(url, address=address, **kw)
        return await self.fetcher.fetch(url, **kw)

    # ------------------------------------------------------------------ one host turn

    async def _host_turn(self, turn: HostTurn) -> None:
        host = turn.host
        for _ in range(_SKIP_BUDGET):
            item = self._pending.pop(host, None) or self.frontier.pop(host)
            if item is None:
                return
            self._current[host] = item
            before = self.schedule.get(host, item.url) if self.schedule is not None and not item.sitemap else None
            refused = self._refused_at_pop(turn, item, revisit=before is not None)
            if refused is not None:
                self.stats.skipped[refused] += 1
                self.frontier.done(item)
                if before is not None and self.schedule is not None:
                    self.schedule.forget(host, item.url)  # out of scope now: off the schedule
                self.ownership.fetched(item)
                await trio.sleep(0)
                continue
            origin = origin_of_normalized(item.url)
            decision = self.robots.get(origin, self.wallclock())
            if decision is None:
                # The robots.txt request is this host's request for this turn; the URL waits for the next.
                self._pending[host] = item
                await self._fetch_robots(turn, origin)
                return
            path = _path_of(item.url, origin)
            if not decision.robots.can_fetch(self.robots_agent, path):
                why = "robots" if decision.kind == "parsed" else "robots-unavailable"
                self.stats.skipped[why] += 1
                if self.log_urls:  # Heritrix's codes: -9998 precluded by robots.txt, -61 robots.txt unreachable
                    at = self.wallclock()
                    code = -9998 if decision.kind == "parsed" else -61
                    self.store.crawl_log.put((_log_record(at, code, -1, item, "-", at, 0.0, None, why, None),))
                self.frontier.done(item)
                if before is not None and self.schedule is not None:
                    self.schedule.forget(host, item.url)  # robots.txt as it is now forbids it
                self.ownership.fetched(item)
                await trio.sleep(0)
                continue
            if item.sitemap:
                await self._fetch_sitemap(turn, item)
            else:
                await self._fetch_page(turn, item, before)
            return

    def _refused_at_pop(self, turn: HostTurn, item: QueuedUrl, *, revisit: bool = False) -> str | None:
        """Why a popped URL is not fetched after all: the host's budget is spent, or the scope changed since it
        was queued (the settings in force are checked at pop time, so a narrowed scope drops what is queued).
        Budgets count distinct pages: a revisit of a page already fetched is not refused by them."""
        settings = self.settings
        if not revisit:
            if 0 <= settings.max_pages_per_host <= turn.pages:
                return "max-pages-per-host"
            if 0 <= settings.max_bytes_per_host <= turn.bytes:
                return "max-bytes-per-host"
        reason = self.scope.check(item.url, turn.host, item.depth, sitemap=item.sitemap)
        return None if reason is None else f"{reason}-at-pop"

    def _schedule_after_request(self, turn: HostTurn, *, extra: float = 0.0) -> None:
        delay = max(self.cfg.delay, turn.crawl_delay, turn.backoff, extra)
        turn.next_allowed = trio.current_time() + delay

    def _save_state(self, turn: HostTurn) -> None:
        self.frontier.put_state(self._state_of(turn))

    def _state_of(self, turn: HostTurn) -> HostState:
        """The host's politeness state as the store keeps it (its next allowed time on the wall clock)."""
        return HostState(
            host=turn.host,
            next_allowed=self.wallclock() + max(0.0, turn.next_allowed - trio.current_time()),
            crawl_delay=turn.crawl_delay,
            backoff=turn.backoff,
            failures=turn.failures,
            pages=turn.pages,
            bytes=turn.bytes,
        )

    async def _fetch_robots(self, turn: HostTurn, origin: str) -> None:
        url = origin + "/robots.txt"
        status: int | None = None
        body: bytes | None = None
        hops = 0
        self.stats.robots_fetches += 1
        try:
            while True:
                resp = await self._fetch(turn.host, url, headers=(("user-agent", self.user_agent),))
                status, body = resp.status, resp.body
                location = header(resp, "location")
                if resp.status in REDIRECTS and location and hops < 5:
                    target = normalize(location, url)
                    if target is None:
                        break
                    url, hops = target, hops + 1
                    continue
                break
        except (FetchError, DnsError) as exc:
            status, body = None, None
            self.stats.errors[f"robots-{exc.label}"] += 1
        if status is not None and status in REDIRECTS:
            status = 404  # more than 5 redirects: RFC 9309 says treat as unavailable (allow all)
        decision = decide(status, body, now=self.wallclock(), redirects_followed=hops)
        if decision.kind == "disallow-all-retry":
            # robots.txt unreachable (5xx / network): the host is off limits for now. Retry with back-off a
            # few times before accepting "disallow all" until the decision expires, so a flaky server does
            # not cost us its whole site, and a dead one does not stall the crawl forever.
            failures = self._robots_failures.get(origin, 0) + 1
            if failures <= self.cfg.max_retries:
                self._robots_failures[origin] = failures
                turn.backoff = min(self.cfg.max_backoff, max(self.cfg.delay, 1.0) * 2**failures)
                self._schedule_after_request(turn)
                self._save_state(turn)
                return
        self._robots_failures.pop(origin, None)
        self.robots.put(origin, decision, decision.expires_at)
        self._admit_sitemaps(origin, decision)
        delay = decision.robots.crawl_delay(self.robots_agent)
        turn.crawl_delay = float(delay) if delay else 0.0
        turn.backoff = 0.0
        self._schedule_after_request(turn)
        self._save_state(turn)

    async def _fetch_page(self, turn: HostTurn, item: QueuedUrl, before: RevisitRecord | None = None) -> None:
        stats = self.stats
        headers: tuple[tuple[str, str], ...] = (("user-agent", self.user_agent),)
        if before is not None:  # a revisit: a conditional GET with what the last answer gave
            if before.etag:
                headers += (("if-none-match", before.etag),)
            if before.last_modified:
                headers += (("if-modified-since", before.last_modified),)
        began, clock = self.wallclock(), trio.current_time()
        try:
            resp = await self._fetch(turn.host, item.url, headers=headers)
        except (FetchError, DnsError) as exc:
            stats.errors[exc.label] += 1
            if isinstance(exc, TRANSIENT) and self._retry(turn, item):
                return
            if self.log_urls:  # given up: its crawl-log record, in a commit of its own
                self.store.crawl_log.put((_log_record(
                    self.wallclock(), _FAILED.get(exc.label, -2) if isinstance(exc, FetchError) else -1, -1, item,
                    "-", began, trio.current_time() - clock, None, exc.label, None),))
            self.frontier.done(item)
            if before is not None and self.schedule is not None:  # given up: due again after the same interval
                due = self.wallclock() + before.interval
                self.schedule.put(RevisitRecord(**{**record_fields(before), "due": due, "queued": False}))
            self.ownership.fetched(item)
            turn.failures += 1
            self._schedule_after_request(turn)
            self._save_state(turn)
            return
        took = trio.current_time() - clock
        stats.pages += 1
        stats.bytes += len(resp.body)
        status = resp.status
        stats.status[f"{status // 100}xx"] += 1
        if status in RETRY_STATUSES and self._retry(turn, item, retry_after=retry_after(resp, self.wallclock())):
            return
        if before is None:  # budgets count distinct pages, not revisits
            turn.pages += 1
            turn.bytes += len(resp.body)
        else:
            stats.revisits += 1
            if before.queued:  # how late the revisit came against its schedule
                stats.revisit_lateness.append(self.wallclock() - before.due)
        turn.failures = 0
        turn.backoff = 0.0
        batch = Batch()
        revisit: RevisitRecord | None = None
        plugged: Plugged | None = None
        extracted: list[dict] = []
        record_at: tuple[str, int] | None = None  # the WARC file and offset of the page's response record
        digest: str | None = None
        now = self.wallclock()  # the time of the records written for this fetch, and of its schedule
        if status == 304 and before is not None:
            self._store_revisit(resp, before, "server-not-modified", now)
            stats.revisits_unchanged += 1
            stats.revisits_not_modified += 1
            revisit = self._next_visit(item, before, resp, changed=False, now=now)
        elif before is not None and not 200 <= status < 300:
            if status >= 500:
                revisit = self._next_visit(item, before, resp, changed=None, now=now)
            elif self.schedule is not None:
                self.schedule.forget(item.host, item.url)  # gone or moved: its new place is a link like any
        if status in REDIRECTS:
            location = header(resp, "location")
            target = normalize(location, item.url, max_length=self.settings.max_url_length) if location else None
            if target is not None:
                if item.hops + 1 > self.cfg.max_redirect_hops:
                    stats.skipped["redirect-hops"] += 1
                elif (target := self._filter_urls(item.url, [target], "redirect")[0]) is not None:
                    self._screen(batch, target, item.depth, item.hops + 1, item.url)
        elif 200 <= status < 300:
            ctype = header(resp, "content-type")
            # one SHA-1 of the body for all who need it: the revisit schedule, the payload's original, the crawl
            # log, and the WARC record (the page store takes it rather than hashing the body again)
            digest = (payload_digest(resp.body) if self.schedule is not None or self.originals is not None
                      or (self.log_urls and resp.body) else None)
            page: Page | None = None
            if before is not None and before.digest == digest:
                # the same payload again: a revisit record, and its links are those found the first time
                self._store_revisit(resp, before, "identical-payload-digest", now)
                stats.revisits_unchanged += 1
                revisit = self._next_visit(item, before, resp, changed=False, now=now)
            else:
                # a payload stored before under another URL: its record refers to that copy (`_store` writes it)
                original = None if digest is None else await self._payload_original(resp, ctype, digest)
                try:
                    size, page, plugged, record_at = await self._page_work(turn, resp, item, ctype, now, digest)
                finally:
                    self._payload_revisits.pop(resp.url, None)
                if original is None and size is not None and digest is not None:
                    self._payload_stored(resp, digest, now)
                stats.stored += size is not None and original is None
                if self.schedule is not None:
                    if size is None:  # a content type not stored is not revisited
                        if before is not None:
                            self.schedule.forget(item.host, item.url)
                    elif original is not None:
                        # its record is a revisit: a later unchanged fetch asks the digest's owner again, so
                        # that its record, too, refers to the full copy (digest "": no same-URL match)
                        unknown = before is None or not before.digest
                        stats.revisits_changed += before is not None and not unknown and before.digest != digest
                        revisit = self._next_visit(item, before, resp, changed=None if unknown else True,
                                                   now=now, digest="", size=size)
                    else:
                        stats.revisits_changed += before is not None
                        revisit = self._next_visit(item, before, resp, changed=True if before else None,
                                                   now=now, digest=digest, size=size)
            if page is not None:
                stats.links_found += len(page.links)
                links, follow = page.links, not page.nofollow
                if plugged is not None:  # the plug-ins' page filters and URL filters
                    follow = follow and plugged.outcome.follow
                    if plugged.outcome.links is not None:
                        links = plugged.outcome.links
                if follow:
                    self._screen_found(batch, links, item.depth + 1, item.url)
            if plugged is not None:
                extracted = self._plugged_items(plugged, item.url, now)
        self._schedule_after_request(turn)
        logged = None
        if self.log_urls:
            if digest is None and resp.body:
                digest = payload_digest(resp.body)
            logged = _log_record(self.wallclock(), status, len(resp.body), item, header(resp, "content-type") or "-",
                                 began, took, digest, _annotations(resp, before), record_at)
        # the host's state, the page's items and its crawl-log record in the same transaction
        self._commit(batch, done=item, revisit=revisit, turn=turn, extracted=extracted, logged=logged)
        self.ownership.fetched(item)
        self._retries.pop(item.url, None)

    async def _page_work(self, turn: HostTurn, resp: Response, item: QueuedUrl, ctype: str | None, now: float,
                         digest: str | None = None
                         ) -> tuple[int | None, Page | None, Plugged | None, tuple[str, int] | None]:
        """A page's records and links, where its work runs: rendered in a browser (renderturns), with
        plug-ins, in a page worker, in a page thread, or here. The bytes stored (None: not stored), the parsed
        page, the plug-ins' outcome, and where the page's response record went (its WARC file and offset).
        `digest`: the body's payload digest if computed already, which the records take."""
        if self.renderer is not None:
            rendered = await self._render_work(turn, item, resp, ctype, now)
            if rendered is not None:  # the DOM's links, the plug-ins on the rendered page
                return rendered
        if self.plugins is not None and self.plugins.active:
            plugged = await self._plugged_work(resp, item.url, ctype, now, digest)
            if plugged is None:
                return None, None, None, None
            return plugged.size, plugged.page, plugged, plugged.location
        if self.page_workers is not None:
            size, page, record_at = await self._work_elsewhere(resp, item.url, ctype, now, digest)
            return size, page, None, record_at
        if self._page_threads is not None:
            size, page, record_at = await trio.to_thread.run_sync(
                self._store_and_extract, resp, item.url, ctype, now, digest, limiter=self._page_threads
            )
            return size, page, None, record_at
        size = self._store(resp, ctype, now, digest)
        record_at = self.pages.last_record() if size is not None else None
        page = None
        if is_html(ctype):
            if len(resp.body) > THREAD_PARSE_BYTES:
                page = await trio.to_thread.run_sync(extract, resp.body, item.url, ctype, limiter=self._large_parses)
            elif self.cfg.parse_in_thread:
                page = await trio.to_thread.run_sync(extract, resp.body, item.url, ctype)
            else:
                page = extract(resp.body, item.url, ctype)
        return size, page, None, record_at

    def _plugged_items(self, plugged: Plugged, url: str, now: float) -> list[dict]:
        """Count the chain's outcome on a page, and its items with their page: URL, fetch time, WARC record."""
        plugins = self.plugins
        outcome = plugged.outcome
        # failures and switch-offs are errors of the node's count too: the dashboard, the metrics and the
        # cluster's status reports show them (the reasons are in /status, `plugins`)
        off = plugins.record(outcome, url, plugged.generation)
        errors = self.stats.errors
        for _index, kind, _what in outcome.failures:
            errors[f"plugin-{kind}"] += 1
        if off:
            errors["plugin-switched-off"] += off
        if not outcome.items:
            return []
        names = plugins.chain.names if plugged.generation == plugins.generation else None
        warc = None if plugged.location is None else {"file": plugged.location[0], "offset": plugged.location[1]}
        self.stats.items += len(outcome.items)
        return [{**item, "_page": url, "_fetched_at": now, "_warc": warc,
                 "_plugin": names[index] if names is not None else index} for index, item in outcome.items]

    def _retry(self, turn: HostTurn, item: QueuedUrl, *, retry_after: float | None = None) -> bool:
        """Re-queue after a transient failure with per-host exponential back-off. False once retries are spent."""
        attempts = self._retries.get(item.url, 0) + 1
        if attempts > self.cfg.max_retries:
            self._retries.pop(item.url, None)
            self.stats.errors["gave-up"] += 1
            return False
        self._retries[item.url] = attempts
        if len(self._retries) > 100_000:
            self._retries.clear()
        turn.failures += 1
        base = max(self.cfg.delay, 1.0) * (2 ** min(turn.failures, 16))
        turn.backoff = min(self.cfg.max_backoff, retry_after if retry_after is not None else base)
        self.stats.retries += 1
        self._pending[turn.host] = item  # keeps its in-flight record; fetched again on the host's next turn
        self._schedule_after_request(turn)
        self._save_state(turn)
        return True


def _path_of(url: str, origin: str) -> str:
    path = url[len(origin):]
    return path or "/"


#: The crawl log's status for a fetch that got no answer, by the error's label: Heritrix's codes (-4 timeout,
#: -2 connection failed; -1 DNS, which `DnsError` gives).
_FAILED = {"timeout": -4, "connect": -2, "refused-address": -2, "tls": -2, "tls-certificate": -2,
           "tls-version": -2, "proxy": -2, "protocol": -3, "too-large": -3}


def _discovery_path(item: QueuedUrl) -> str:
    """The hops from the URL's seed as Heritrix writes them: one L per link, one R per redirect; "-" for a seed,
    and a count before the last 20 hops of a longer path."""
    if item.depth == 0 and item.hops == 0:
        return "-"
    hops = item.depth + item.hops
    if hops > 20:
        return f"{hops - 20}+" + ("L" * item.depth + "R" * item.hops)[-20:]
    return "L" * item.depth + "R" * item.hops


def _annotations(resp: Response, before: RevisitRecord | None) -> str:
    notes = []
    if before is not None:
        notes.append("revisit")
    if resp.truncated:
        notes.append("truncated")
    if resp.protocol != "http/1.1":
        notes.append(resp.protocol)
    return ",".join(notes) or "-"


#: Content-Type values seen lately and their MIME types (a crawl sees a handful; cleared past a bound).
_MIME_TYPES: dict[str, str] = {}


def _log_record(at: float, status: int, size: int, item: QueuedUrl, mime: str, began: float, took: float,
                digest: str | None, annotations: str, location: tuple[str, int] | None) -> list[Any]:
    """A crawl-log record's fields (`storage.LOG_FIELDS`; times as they are, the log writes them to the ms)."""
    kind = _MIME_TYPES.get(mime)
    if kind is None:
        if len(_MIME_TYPES) >= 256:
            _MIME_TYPES.clear()
        kind = _MIME_TYPES[mime] = mime.split(";", 1)[0].strip().lower() or "-"
    return [at, status, size, item.url, _discovery_path(item), item.found_on or "-", kind, began, int(took * 1000),
            "-" if digest is None else "sha1:" + digest, annotations,
            "" if location is None else location[0], -1 if location is None else location[1]]
