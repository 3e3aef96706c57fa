"""The crawl engine of one node: the politeness scheduler, the fetch workers, and link admission.

Flow of a URL: ``admit()`` (scope, ownership, dedup, frontier) -> the host is woken in the scheduler ->
when its turn comes a worker pops one URL of that host from the frontier, makes sure the origin's robots.txt
is known, fetches, stores, extracts links and admits them, then gives the host back to the scheduler with its
next allowed time. One worker per host at a time is what makes "one connection per host" true.

Speed: most links of a wide crawl were seen before, so the engine remembers which URLs the dedup store has
already answered for (URL -> host, bounded) and counts those as seen without parsing, scope-checking or
looking them up again; the dedup store stays the authority (docs/benchmarks.md has the profile).

Seams (``peer/crawl/seams.py``): pages come through a ``PageFetcher`` (``peer.fetch.Fetcher`` in a node); who
owns a host, and where links for hosts owned elsewhere go, is the ``Ownership`` it is given (``Solo`` for a node
on its own, the ``Cluster`` in a fleet).
"""

from __future__ import annotations

import email.utils
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import trio

from storage import HostState, LruTtlCache, QueuedUrl, RevisitRecord, StorageError, payload_digest

from peer.config import Config
from peer.crawl.addressgate import AddressGate, Lane
from peer.crawl.links import Page, extract, is_html
from peer.crawl.pageworkers import PageJob, PageResult, PageWorkerError, PageWorkers
from peer.crawl.robots import RobotsDecision, decide, product_token
from peer.crawl.scheduler import HostScheduler, HostTurn
from peer.crawl.seams import AddressLimits, Ownership, PageFetcher, Solo
from peer.crawl.settings import CONFIG_VERSION_FOUNDER, CrawlSettings, SettingsFile
from peer.crawl.sitemaps import MAX_SITEMAP_BYTES, SitemapEntry, SitemapReader, may_list
from peer.crawl.urls import Scope, host_of_normalized, normalize, origin_of_normalized
from peer.fetch.errors import TRANSIENT, DnsError, FetchError
from peer.fetch.http import Response
from peer.stats import Stats

__all__ = ["Crawler", "SeedReport"]

log = logging.getLogger(__name__)

#: How many refused (robots/limits) URLs one host turn may skip before it gives up its worker, so a host with
#: thousands of disallowed URLs cannot hog one; each skip is a checkpoint too (a robots.txt of many wildcard
#: rules makes one check cost up to 0.1 s on a long path: 256 of them held the event loop for half a minute).
_SKIP_BUDGET = 256
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
_RETRY_STATUSES = frozenset((429, 503))
#: URLs remembered as already answered by the dedup store (about 200 B each: 200,000 is about 40 MiB).
#: Past it the memory starts over; the dedup store stays the authority, so that only costs look-ups.
_SEEN_CACHE_SIZE = 200_000
#: Host turns whose first URLs are taken from the store in one transaction (`Crawler._pop_first`).
_POP_BATCH = 64


#: A page larger than this is parsed in a worker thread even without ``parse_in_thread``: a million links take
#: lxml about 0.7 s, longer than the membership probe timeout, and the event loop must keep answering.
_THREAD_PARSE_BYTES = 512 * 1024

#: The scheduler's window is refilled from the host table once this many places are free (or nothing is ready),
#: reading at most _REFILL_READ hosts per read and _REFILL_SCAN per refill.
_REFILL_ROOM = 64
_REFILL_READ = 512
_REFILL_SCAN = 8192
_REFILL_PAUSE = 0.01

#: A host whose arc's hand-off has not arrived is looked at again this often.
_BLOCKED_RECHECK = 0.25
#: The revisit schedule is read this often, and at most this many due pages are queued per read (a few reads
#: per tick when more are due).
_REVISIT_TICK = 1.0
_REVISIT_MIN_SLEEP = 0.02
_REVISIT_BATCH = 1000
_REVISIT_READS = 10


@dataclass(frozen=True, slots=True)
class SeedReport:
    """What became of seeds added at runtime: queued here, already seen here, sent to their owners, refused."""

    new: int
    seen: int
    routed: int
    out_of_scope: dict[str, int]
    invalid: list[str]

    def as_dict(self) -> dict:
        return {"new": self.new, "seen": self.seen, "routed": self.routed, "out_of_scope": self.out_of_scope,
                "invalid": self.invalid}


#: Sitemap entries admitted in one store transaction while a sitemap streams in.
_SITEMAP_BATCH = 1000
#: Sitemap lines of one robots.txt that are read (a file naming thousands is not a site's own list).
_MAX_NAMED_SITEMAPS = 64


class _Batch:
    """Links screened for one store transaction: what to queue if new, and seen-cache hits."""

    __slots__ = ("cands", "seen")

    def __init__(self) -> None:
        self.cands: list[QueuedUrl] = []
        self.seen = 0


class Crawler:
    def __init__(
        self,
        cfg: Config,
        *,
        fetcher: PageFetcher,
        store,
        pages,
        stats: Stats | None = None,
        ownership: Ownership | None = None,
        limits: AddressLimits | None = None,
        wallclock: Callable[[], float] = time.time,
        settings: CrawlSettings | None = None,
        settings_file: SettingsFile | None = None,
        page_workers: PageWorkers | None = None,
    ) -> None:
        self.cfg = cfg
        self.fetcher = fetcher
        self.store = store  # storage.NodeStore: seen-set and frontier changed together, atomically
        self.frontier = store.frontier
        self.dedup = store.dedup
        self.pages = pages
        self.stats = stats or Stats()
        self.ownership: Ownership = ownership if ownership is not None else Solo()
        # None on a node on its own: the hot loops then skip the look-up (every host is ours)
        self.owns: Callable[[str], bool] | None = None if self.ownership.solo else self.ownership.owns
        # a cluster node keeps running (work can arrive from peers): the cluster decides when the crawl ends
        self.stop_when_done = cfg.exit_when_done and self.ownership.solo
        self.wallclock = wallclock
        self.user_agent = cfg.full_user_agent()
        self.robots_agent = product_token(self.user_agent)  # the name robots.txt groups are matched against
        # scope, budgets and the paused flag: changed at runtime by `adopt` (the cluster gossips them)
        self.settings = settings if settings is not None else CrawlSettings.from_config(cfg, origin="", joining=False)
        self.settings_file = settings_file
        self.scope: Scope = self.settings.scope()
        # the window of hosts in memory (Mercator's bounded back queues): the rest wait in the frontier's host
        # table on disk, brought in round the ring as room frees (`_refill`)
        self.sched = HostScheduler(max_active=cfg.max_active_hosts, recall=self._recall,
                                   quantum=cfg.host_window_turns)
        self._refill_at: str | None = None  # the host table is read on from here (ring order)
        self._lap_spills = 0  # the scheduler's spill count when the current lap of the host table began
        self._refill_room = max(1, min(_REFILL_ROOM, cfg.max_active_hosts // 16))
        # per-address politeness (peer/crawl/addressgate.py): lanes per server address, and the hosts parked
        # until a lane of their address is given back
        self.gate: AddressLimits = limits if limits is not None else AddressGate(cfg.ip_connections, cfg.ip_delay)
        self._address_waiters: dict[str, set[str]] = {}
        self._pinned: dict[str, str] = {}  # host -> the address its turn's request must go to
        self._requests: dict[str, int] = {}  # host -> requests made in its current turn
        self.robots: LruTtlCache[str, RobotsDecision] = LruTtlCache(cfg.robots_cache_size)
        self._robots_failures: dict[str, int] = {}
        self._pending: dict[str, QueuedUrl] = {}  # host -> URL popped but parked while its robots.txt came in
        self._retries: dict[str, int] = {}
        self._wakeup = trio.Event()
        # URL -> host, for URLs the dedup store has answered for; URL -> "" for URLs routed to another owner.
        # Valid under one ring: an ownership whose `owns` answers change calls `forget_seen` (seams.Ownership).
        self._seen: dict[str, str] = {}
        self.done = trio.Event()
        self.active = 0
        self._draining = False
        self.store_types = tuple(t.lower() for t in cfg.store_types)
        self._current: dict[str, QueuedUrl] = {}  # host -> the URL its turn is working on
        #: URLs given up because the node stopped while fetching them, max_crashes times in a row (this run).
        self.dropped_urls: list[str] = []
        # --page-threads N: a page's store and parse run in one of N threads (see _store_and_extract)
        self._page_threads = trio.CapacityLimiter(cfg.page_threads) if cfg.page_threads > 0 else None
        # --page-processes N: the same work in worker processes (peer/crawl/pageworkers.py); the node owns them
        self.page_workers = page_workers
        # one large page parsed at a time: a 10 MiB page of a quarter of a million links makes a tree and link
        # lists of over 100 MiB, and several at once (as a loaded machine lines them up) break the memory bound
        self._large_parses = trio.CapacityLimiter(1)
        # --revisit: every stored page gets a next visit in the store's schedule (storage/_revisits.py)
        self.schedule = store.revisits if cfg.revisit else None

    # ------------------------------------------------------------------ admission

    def admit(self, items: Iterable[QueuedUrl]) -> tuple[int, int]:
        """Scope-check, route, dedup and queue normalized URLs (their host is taken from the URL). Returns
        (new, already seen) for the URLs owned here."""
        batch = _Batch()
        for item in items:
            self._screen(batch, item.url, item.depth, item.hops, item.found_on, item.lastmod, item.sitemap)
        return self._commit(batch)

    def _screen_found(self, batch: _Batch, urls: Sequence[str], depth: int, found_on: str) -> None:
        """Screen the links of one page, without a record per URL: the crawl's hottest loop.

        Most links of a wide crawl were seen before; a URL the dedup store already answered for, on a host
        this node still owns, is counted as seen without being parsed, scope-checked or looked up again.
        """
        seen = self._seen
        max_depth = self.scope.max_depth
        if max_depth is not None and depth > max_depth:
            seen = {}  # the scope check must name the reason, as without the cache
        hits = repeats = 0
        for url in urls:
            host = seen.get(url)
            if host is not None:  # answered for under the current ring (the ownership clears it at a change)
                if host:
                    hits += 1
                else:  # routed to its owner recently: dropped, as the dispatcher's recently-sent filter would
                    repeats += 1
                continue
            self._screen(batch, url, depth, 0, found_on)
        batch.seen += hits
        self.stats.routed_repeats += repeats

    def _screen(
        self,
        batch: _Batch,
        url: str,
        depth: int,
        hops: int,
        found_on: str | None,
        lastmod: float | None = None,
        sitemap: bool = False,
    ) -> None:
        host = host_of_normalized(url)
        reason = self.scope.check(url, host, depth, sitemap=sitemap)
        if reason is not None:
            self.stats.skipped[reason] += 1
            return
        item = QueuedUrl(url=url, host=host, depth=depth, hops=hops, found_on=found_on, lastmod=lastmod, sitemap=sitemap)
        if self.owns is not None and not self.owns(host):
            self.ownership.route(item)
            seen = self._seen
            if len(seen) >= _SEEN_CACHE_SIZE:
                seen.clear()
            seen[url] = ""  # routed: a repeat on a later page is dropped before it is screened again
            return
        batch.cands.append(item)

    def _commit(self, batch: _Batch, done: QueuedUrl | None = None,
                revisit: RevisitRecord | None = None, turn: HostTurn | None = None) -> tuple[int, int]:
        """One store transaction: mark the batch seen, queue the new URLs and (with ``done``) clear the page
        they were found on from in-flight and save its host's politeness state (``turn``), all together, so a
        crash can lose none of it. New URLs wake their hosts."""
        cands = batch.cands
        if revisit is not None:
            assert done is not None
            items = self.store.finish_revisit(done, revisit, cands, self.ownership.take_routed(),
                                              state=self._state_of(turn) if turn is not None else None)
        elif done is not None:
            routed = self.ownership.take_routed()
            state = self._state_of(turn) if turn is not None else None
            items = (self.store.finish(done, cands, routed, state=state) if routed
                     else self.store.finish(done, cands, state=state))
        else:
            items = self.store.admit(cands) if cands else []
        if cands:
            seen = self._seen
            if len(seen) + len(cands) > _SEEN_CACHE_SIZE:
                seen.clear()
            for c in cands:
                seen[c.url] = c.host
        seen_before = batch.seen + len(cands) - len(items)
        if items:
            self.ownership.queued(items)
            now = trio.current_time()
            wake = self.sched.wake
            for item in items:
                wake(item.host, now)
            self._wakeup.set()
        self.stats.urls_new += len(items)
        self.stats.urls_seen += seen_before
        return len(items), seen_before

    def forget_seen(self) -> None:
        """Drop the in-memory record of URLs the dedup store has answered for and of URLs routed elsewhere.
        Call it whenever the dedup store may forget URLs (a re-crawl policy deleting keys) and whenever the
        ownership's `owns` answers change (a new ring): a hit is then trusted without asking `owns`."""
        self._seen.clear()

    def seed(self, urls: Sequence[str]) -> int:
        return self.add_seeds(urls).new

    def add_seeds(self, urls: Sequence[str]) -> SeedReport:
        """Seeds (at start or at runtime): checked against the scope in force, queued here if this node owns
        their host, else routed to the owner (whose store decides whether they are new)."""
        batch = _Batch()
        invalid: list[str] = []
        refused: dict[str, int] = {}
        routed = 0
        for raw in urls:
            url = normalize(raw.strip(), max_length=self.settings.max_url_length)
            if url is None:
                log.warning("seed is not a crawlable http(s) URL, skipped", extra={"seed": raw[:200]})
                invalid.append(raw[:200])
                continue
            host = host_of_normalized(url)
            reason = self.scope.check(url, host, 0)
            if reason is not None:
                refused[reason] = refused.get(reason, 0) + 1
                self.stats.skipped[reason] += 1
                continue
            if self.owns is not None and not self.owns(host):
                self.ownership.route(QueuedUrl(url=url, host=host, depth=0))
                routed += 1
                continue
            batch.cands.append(QueuedUrl(url=url, host=host, depth=0))
        new, seen = self._commit(batch)
        return SeedReport(new=new, seen=seen, routed=routed, out_of_scope=refused, invalid=invalid)

    # ------------------------------------------------------------------ runtime settings

    def adopt(self, settings: CrawlSettings) -> bool:
        """Crawl by `settings` if they outrank those in force (True then). Queued URLs are checked against
        the new scope as they are popped; a pause stops new host turns and lets those under way finish."""
        if settings.rank() <= self.settings.rank():
            return False
        scope = settings.scope()
        old, self.settings, self.scope = self.settings, settings, scope
        if self.settings_file is not None and settings.version > CONFIG_VERSION_FOUNDER:
            self.settings_file.save(settings)
        if old.paused != settings.paused:
            log.info("crawl paused" if settings.paused else "crawl resumed",
                     extra={"version": settings.version, "origin": settings.origin})
        if old.body() != settings.body():
            log.info("crawl settings changed", extra={"version": settings.version, "origin": settings.origin,
                                                      "settings": settings.body()})
        self._wakeup.set()
        return True

    @property
    def paused(self) -> bool:
        return self.settings.paused

    def restore(self) -> int:
        """After a restart: in-flight URLs go back to their queues and every host with work is scheduled,
        keeping its saved politeness state (wall-clock times are turned into trio times).

        A URL that was in flight at ``cfg.max_crashes`` stops in a row is dropped instead: it may be what stopped
        the node. It is logged, counted (``errors{kind="crash-loop"}``) and recorded in ``dropped_urls``."""
        recovered, dropped = self.frontier.recover_in_flight(max_crashes=self.cfg.max_crashes)
        for item in dropped:
            self.stats.errors["crash-loop"] += 1
            self.dropped_urls.append(item.url)
            log.error("URL dropped: it was being fetched at %d stops of the node in a row", self.cfg.max_crashes,
                      extra={"url": item.url, "host": item.host})
        self._wake_queued()
        self._wakeup.set()
        return recovered

    def _recall(self, host: str) -> HostTurn:
        """A host entering the scheduler's window: its turn from the politeness state saved after its last request
        (wall-clock times turned into trio times), so leaving the window and coming back loses none of it."""
        turn = HostTurn(host)
        st = self.frontier.get_state(host)
        if st is not None:
            turn.next_allowed = trio.current_time() + max(0.0, st.next_allowed - self.wallclock())
            turn.crawl_delay, turn.backoff, turn.failures = st.crawl_delay, st.backoff, st.failures
            turn.pages, turn.bytes = st.pages, st.bytes
        return turn

    def _wake_queued(self) -> int:
        """Schedule the hosts with queued URLs that this node may fetch, in ring order, until the window is full
        (the rest wait on disk for `_refill`)."""
        now = trio.current_time()
        owns, sched = self.owns, self.sched
        n = 0
        for host, _count in self.frontier.hosts():
            if owns is not None and not owns(host):
                continue
            if host not in sched.turns and sched.room() <= 0:
                sched.spill()
                break
            n += sched.wake(host, now)
        return n

    def _refill(self, now: float) -> int:
        """Bring hosts with work from the frontier's host table into the scheduler's window while it has room,
        reading the table in ring order from where the last call stopped, round and round, so every host on
        disk gets its place in turn. A lap of the table during which no host was left on disk ends the spill.
        Reads at most `_REFILL_SCAN` hosts per call. Returns the hosts woken."""
        sched, owns = self.sched, self.owns
        woke = scanned = 0
        wrapped = False
        while sched.spilled and scanned < _REFILL_SCAN:
            room = sched.room()
            if room <= 0:
                break
            rows = self.frontier.hosts_after(self._refill_at, min(_REFILL_READ, room + 16))
            if not rows:  # the end of the table: a lap is done
                if sched.spills == self._lap_spills:
                    sched.spilled = False  # nothing was left on disk since the lap began
                self._refill_at, self._lap_spills = None, sched.spills
                if wrapped:
                    break
                wrapped = True
                continue
            for host, _count in rows:
                scanned += 1
                self._refill_at = host
                if host in sched.turns or (owns is not None and not owns(host)):
                    continue
                if sched.wake(host, now):
                    woke += 1
                    if sched.room() <= 0:
                        break
        return woke

    # ------------------------------------------------------------------ the cluster's hooks

    def wake_hosts(self, items: Iterable[QueuedUrl]) -> None:
        """URLs were queued outside a page commit (a peer's batch, a hand-off): schedule their hosts."""
        now = trio.current_time()
        woke = False
        for item in items:
            woke = self.sched.wake(item.host, now) or woke
        if woke:
            self._wakeup.set()

    def take_over(self, items: Sequence[QueuedUrl], states: Sequence[HostState]) -> None:
        """A hand-off arrived: adopt the hosts' politeness timers (never earlier than ours), then wake them."""
        now, wall = trio.current_time(), self.wallclock()
        for st in states:
            t = self.sched.turns.get(st.host)
            if t is None:
                continue  # not in the window: the store holds its merged state, read when it comes in
            t.next_allowed = max(t.next_allowed, now + max(0.0, st.next_allowed - wall))
            t.crawl_delay = max(t.crawl_delay, st.crawl_delay)
            t.failures, t.pages, t.bytes = st.failures, max(t.pages, st.pages), max(t.bytes, st.bytes)
        self.wake_hosts(items)

    def rewake(self) -> int:
        """After a view change: schedule every host with queued URLs that this node may now fetch."""
        self.release_moved()
        n = self._wake_queued()
        self._wakeup.set()
        return n

    def release_moved(self) -> int:
        """URLs parked (waiting for robots.txt or a retry) for hosts this node no longer owns go back to their
        queues, so the hand-off of their arc carries them. A busy host keeps its URL until its turn ends."""
        owns = self.owns
        if owns is None:
            return 0
        return self._put_back(lambda host: not owns(host))

    def _put_back(self, which: Callable[[str], bool]) -> int:
        """URLs parked for the hosts `which` names, but not for a host whose turn is under way, go back to their
        queues. Returns how many."""
        back = []
        for host in list(self._pending):
            t = self.sched.turns.get(host)
            if which(host) and not (t is not None and t.busy):
                back.append(self._pending.pop(host))
        return self.frontier.requeue(back)

    def busy_hosts(self) -> list[str]:
        """Hosts with a request under way (or a turn being worked): a hand-off of their arc waits for them."""
        return [t.host for t in self.sched.turns.values() if t.busy]

    def _let_go(self, turn: HostTurn) -> None:
        """The host is no longer ours: its parked URL goes back to the queue, from which the hand-off takes it."""
        parked = self._pending.pop(turn.host, None)
        if parked is not None:
            self.frontier.requeue([parked])
        self.sched.release(turn, trio.current_time(), more_work=False)
        self.stats.skipped["host-moved"] += 1

    # ------------------------------------------------------------------ the run loop

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Dispatch host turns to ``cfg.concurrency`` workers until cancelled (or until done, when
        ``cfg.exit_when_done``)."""
        send, recv = trio.open_memory_channel[HostTurn](0)
        async with trio.open_nursery() as nursery:
            for _ in range(self.cfg.concurrency):
                nursery.start_soon(self._worker, recv.clone())
            recv.close()
            if self.schedule is not None:
                nursery.start_soon(self._revisit_loop)
            task_status.started()
            async with send:
                await self._dispatch(send)
            nursery.cancel_scope.cancel()

    def is_done(self) -> bool:
        """Nothing queued, in flight or being worked; with revisits, a crawl with pages scheduled never is."""
        if self.schedule is not None and len(self.schedule):
            return False
        return len(self.frontier) == 0 and self.frontier.in_flight() == 0 and self.active == 0

    # ------------------------------------------------------------------ revisits

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
            etag=_header(resp, "etag") or (before.etag if before else None),
            last_modified=_header(resp, "last-modified") or (before.last_modified if before else None),
            digest=digest if digest is not None else (before.digest if before else ""),
            stored_at=now if digest is not None else (before.stored_at if before else 0.0),
            size=size if size is not None else (before.size if before else 0),
            changed=(before.changed if before else 0) + (changed is True),
            unchanged=(before.unchanged if before else 0) + (changed is False),
        )

    def _store_revisit(self, resp: Response, before: RevisitRecord, profile: str, now: float) -> None:
        written = self.pages.store_revisit(
            url=resp.url, request_headers=resp.request_headers, status=resp.status, reason=resp.reason,
            response_headers=_as_decoded(resp), ip=resp.ip, fetched_at=now, profile=profile,
            payload_digest=before.digest, refers_to_uri=before.url, refers_to_date=before.stored_at)
        self.stats.revisit_bytes += written
        self.stats.revisit_bytes_saved += max(0, before.size - written)

    def revisit_status(self) -> dict:
        """What `peerctl status` shows of the schedule."""
        if self.schedule is None:
            return {"enabled": False}
        return {"enabled": True, "scheduled": len(self.schedule), "waiting": self.schedule.waiting(),
                "next_due": [{"in": round(due - self.wallclock(), 1), "url": url}
                             for due, url in self.schedule.next_due(5)]}

    async def drain(self, timeout: float) -> bool:
        """Stop starting host turns and wait up to ``timeout`` for the fetches under way to finish, so a
        clean stop re-fetches nothing after a restart. True if nothing was left in progress. URLs parked for a
        later turn (taken with others for turns not started, or waiting for their host's robots.txt) go back to
        their queues: in flight at the stop, each would count as a crash against it at the next start."""
        self._draining = True
        self._wakeup.set()
        with trio.move_on_after(timeout):
            while self.active:
                await trio.sleep(0.01)
        self._put_back(lambda host: True)
        return self.active == 0

    async def _dispatch(self, send: trio.MemorySendChannel[HostTurn]) -> None:
        sched = self.sched
        while True:
            if self._draining:
                await trio.sleep_forever()
            if self.settings.paused:
                # paused: no new host turn; the turns under way finish, every queue and timer is kept
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            now = trio.current_time()
            if sched.spilled and sched.room() >= self._refill_room:
                self._refill(now)
            turns = self._ready_turns(now)
            if turns:
                self._pop_first(turns)
                for turn in turns:
                    if self._draining:  # not started: its first URL goes back to its queue (drain)
                        sched.release(turn, trio.current_time(), more_work=True)
                    else:
                        await send.send(turn)
                continue
            if self.is_done():
                self.done.set()
                if self.stop_when_done:
                    return
            nxt = sched.next_time()
            wait = 1.0 if nxt is None else max(0.0, nxt - now)
            if sched.spilled and sched.room() > 0 and self._refill(now) == 0 and sched.spilled:
                wait = min(wait, _REFILL_PAUSE)  # the table is read on after a pause (a lap is bounded per call)
            elif sched.next_time() != nxt:
                continue  # the refill brought hosts in
            self._wakeup = trio.Event()
            with trio.move_on_after(wait):
                await self._wakeup.wait()

    def _ready_turns(self, now: float) -> list[HostTurn]:
        """The host turns that may start now, as many as there are idle workers (at most _POP_BATCH). A ready
        host that may not start after all goes back to the scheduler (its timer moved by a hand-off, moved to
        another node, or its arc's hand-off still awaited)."""
        sched = self.sched
        turns: list[HostTurn] = []
        turn = sched.pop_ready(now)
        room = min(_POP_BATCH, max(1, self.cfg.concurrency - self.active))
        while turn is not None:
            if turn.next_allowed > now:  # a hand-off moved its timer after it was queued
                sched.release(turn, now, more_work=True)
            elif self.owns is not None and not self.owns(turn.host):
                self._let_go(turn)
            elif self.ownership.blocked(turn.host):
                turn.next_allowed = now + _BLOCKED_RECHECK
                sched.release(turn, now, more_work=True)
            else:
                turns.append(turn)
            if len(turns) >= room:
                break
            turn = sched.pop_ready(now)
        return turns

    def _pop_first(self, turns: list[HostTurn]) -> None:
        """Take the first URL of each of these turns in one store transaction, not one each: the turn finds it
        parked, as a URL waiting for its robots.txt (a host's pop is a durable write, and its commit cost about
        as much as the pop itself)."""
        hosts = [t.host for t in turns if t.host not in self._pending]
        if len(hosts) < 2:
            return  # the turn pops its own
        for host, item in zip(hosts, self.frontier.pop_many(hosts)):
            if item is not None:
                self._pending[host] = item

    async def _worker(self, recv: trio.MemoryReceiveChannel[HostTurn]) -> None:
        async with recv:
            async for turn in recv:
                self.active += 1
                parked = False
                try:
                    if self.gate.active:
                        parked = await self._gated_turn(turn)
                    else:
                        await self._host_turn(turn)
                except Exception as exc:  # noqa: BLE001 - one host's input must not end the node
                    self._contain(turn, exc)
                finally:
                    self._current.pop(turn.host, None)
                    self.active -= 1
                    if self.owns is not None and turn.host in self._pending and not self.owns(turn.host):
                        self.frontier.requeue([self._pending.pop(turn.host)])  # moved: into the hand-off
                    pending = turn.host in self._pending
                    more = not parked and (pending or self.frontier.queued(turn.host) > 0)
                    # it may leave the window (its state is saved; its URLs are on disk) unless a URL is parked
                    self.sched.release(turn, trio.current_time(), more_work=more, may_leave=not pending)
                    self._wakeup.set()

    def _contain(self, turn: HostTurn, exc: Exception) -> None:
        """An unexpected exception in one host's turn: log it with the URL, count it, finish the URL and back the
        host off, so whatever the host sent costs that URL and a pause of that host, never the node. A storage
        fault is the disk's, not the host's: it still ends the node (with its message)."""
        if isinstance(exc, StorageError):
            raise exc
        item = self._current.get(turn.host)
        self.stats.errors["internal"] += 1
        log.error("internal error in the turn of host %s; URL finished, host backed off", turn.host,
                  exc_info=exc, extra={"host": turn.host, "url": item.url if item is not None else None})
        if item is not None:
            if self._pending.get(turn.host) == item:
                del self._pending[turn.host]
            self._retries.pop(item.url, None)
            self.frontier.done(item)
            before = self.schedule.get(turn.host, item.url) if self.schedule is not None else None
            if before is not None and before.queued:  # a revisit: due again after its interval, not forgotten
                due = self.wallclock() + before.interval
                self.schedule.put(RevisitRecord(**{**_record_fields(before), "due": due, "queued": False}))
        turn.failures += 1
        turn.backoff = min(self.cfg.max_backoff, max(self.cfg.delay, 1.0) * 2 ** min(turn.failures, 16))
        self._schedule_after_request(turn)
        self._save_state(turn)

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
                if before is not None:
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
                self.stats.skipped["robots" if decision.kind == "parsed" else "robots-unavailable"] += 1
                self.frontier.done(item)
                if before is not None:
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
                location = _header(resp, "location")
                if resp.status in _REDIRECTS and location and hops < 5:
                    target = normalize(location, url)
                    if target is None:
                        break
                    url, hops = target, hops + 1
                    continue
                break
        except (FetchError, DnsError) as exc:
            status, body = None, None
            self.stats.errors[f"robots-{exc.label}"] += 1
        if status is not None and status in _REDIRECTS:
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
        try:
            resp = await self._fetch(turn.host, item.url, headers=headers)
        except (FetchError, DnsError) as exc:
            stats.errors[exc.label] += 1
            if isinstance(exc, TRANSIENT) and self._retry(turn, item):
                return
            self.frontier.done(item)
            if before is not None:  # given up this time: due again after the same interval, not forgotten
                due = self.wallclock() + before.interval
                self.schedule.put(RevisitRecord(**{**_record_fields(before), "due": due, "queued": False}))
            self.ownership.fetched(item)
            turn.failures += 1
            self._schedule_after_request(turn)
            self._save_state(turn)
            return
        stats.pages += 1
        stats.bytes += len(resp.body)
        status = resp.status
        stats.status[f"{status // 100}xx"] += 1
        if status in _RETRY_STATUSES and self._retry(turn, item, retry_after=_retry_after(resp, self.wallclock())):
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
        batch = _Batch()
        revisit: RevisitRecord | None = None
        now = self.wallclock()  # the time of the records written for this fetch, and of its schedule
        if status == 304 and before is not None:
            self._store_revisit(resp, before, "server-not-modified", now)
            stats.revisits_unchanged += 1
            stats.revisits_not_modified += 1
            revisit = self._next_visit(item, before, resp, changed=False, now=now)
        elif before is not None and not 200 <= status < 300:
            if status >= 500:
                revisit = self._next_visit(item, before, resp, changed=None, now=now)
            else:
                self.schedule.forget(item.host, item.url)  # gone or moved: its new place is a link like any
        if status in _REDIRECTS:
            location = _header(resp, "location")
            target = normalize(location, item.url, max_length=self.settings.max_url_length) if location else None
            if target is not None:
                if item.hops + 1 <= self.cfg.max_redirect_hops:
                    self._screen(batch, target, item.depth, item.hops + 1, item.url)
                else:
                    stats.skipped["redirect-hops"] += 1
        elif 200 <= status < 300:
            ctype = _header(resp, "content-type")
            digest = payload_digest(resp.body) if self.schedule is not None else None
            page: Page | None = None
            if before is not None and before.digest == digest:
                # the same payload again: a revisit record, and its links are those found the first time
                self._store_revisit(resp, before, "identical-payload-digest", now)
                stats.revisits_unchanged += 1
                revisit = self._next_visit(item, before, resp, changed=False, now=now)
            else:
                if self.page_workers is not None:
                    size, page = await self._work_elsewhere(resp, item.url, ctype, now)
                elif self._page_threads is not None:
                    size, page = await trio.to_thread.run_sync(
                        self._store_and_extract, resp, item.url, ctype, now, limiter=self._page_threads
                    )
                else:
                    size = self._store(resp, ctype, now)
                    if is_html(ctype):
                        if len(resp.body) > _THREAD_PARSE_BYTES:
                            page = await trio.to_thread.run_sync(extract, resp.body, item.url, ctype,
                                                                 limiter=self._large_parses)
                        elif self.cfg.parse_in_thread:
                            page = await trio.to_thread.run_sync(extract, resp.body, item.url, ctype)
                        else:
                            page = extract(resp.body, item.url, ctype)
                stats.stored += size is not None
                if self.schedule is not None:
                    if size is None:  # a content type not stored is not revisited
                        if before is not None:
                            self.schedule.forget(item.host, item.url)
                    else:
                        stats.revisits_changed += before is not None
                        revisit = self._next_visit(item, before, resp, changed=True if before else None,
                                                   now=now, digest=digest, size=size)
            if page is not None:
                stats.links_found += len(page.links)
                if not page.nofollow:
                    self._screen_found(batch, page.links, item.depth + 1, item.url)
        self._schedule_after_request(turn)
        self._commit(batch, done=item, revisit=revisit, turn=turn)  # the host's state in the same transaction
        self.ownership.fetched(item)
        self._retries.pop(item.url, None)

    # ------------------------------------------------------------------ sitemaps

    def _admit_sitemaps(self, origin: str, decision: RobotsDecision) -> None:
        """Queue the sitemaps a robots.txt names (and, with ``sitemap_xml``, /sitemap.xml when it names none)
        as sitemap items for their hosts' owners: read in the host's turn like any request."""
        if not self.cfg.sitemaps or decision.kind == "disallow-all-retry":
            return
        robots_url = origin + "/robots.txt"
        named = decision.robots.sitemaps[:_MAX_NAMED_SITEMAPS]
        batch = _Batch()
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
        if status in _RETRY_STATUSES and self._retry(turn, item, retry_after=_retry_after(resp, self.wallclock())):
            return
        turn.failures = 0
        turn.backoff = 0.0
        batch = _Batch()
        if status in _REDIRECTS:
            location = _header(resp, "location")
            target = normalize(location, item.url, max_length=self.settings.max_url_length) if location else None
            if target is not None and item.hops + 1 <= self.cfg.max_redirect_hops:
                self._screen(batch, target, item.depth, item.hops + 1, item.found_on, sitemap=True)
            elif target is not None:
                stats.skipped["redirect-hops"] += 1
        elif 200 <= status < 300:
            sink.finish(batch)
        self._schedule_after_request(turn)
        self._commit(batch, done=item, turn=turn)
        self.ownership.fetched(item)
        self._retries.pop(item.url, None)

    def _screen_listed(self, batch: _Batch, sitemap: QueuedUrl, entries: Sequence[SitemapEntry]) -> None:
        """Screen what a sitemap lists: the protocol's location rule, then the links' path."""
        named_by = sitemap.found_on if sitemap.found_on and sitemap.found_on.endswith("/robots.txt") else None
        max_length = self.settings.max_url_length
        skipped = self.stats.skipped
        self.stats.sitemap_urls += len(entries)
        for entry in entries:
            url = normalize(entry.loc, sitemap.url, max_length=max_length)
            if url is None:
                skipped["sitemap-bad-url"] += 1
            elif not may_list(sitemap.url, url, named_by=named_by):
                skipped["sitemap-location"] += 1
            elif entry.is_sitemap:
                if sitemap.hops + 1 > self.cfg.max_redirect_hops:
                    skipped["sitemap-nesting"] += 1
                else:
                    self._screen(batch, url, sitemap.depth, sitemap.hops + 1, named_by or sitemap.url, sitemap=True)
            else:
                self._screen(batch, url, sitemap.depth + 1, 0, sitemap.url, entry.lastmod)

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

    def _store_and_extract(self, resp: Response, url: str, ctype: str | None,
                           now: float) -> tuple[int | None, Page | None]:
        """A page's CPU-heavy work, in a page thread: digests, gzip and lxml's parse release the GIL, so
        threads carry them on other cores; one hand-off per page."""
        size = self._store(resp, ctype, now)
        return size, (extract(resp.body, url, ctype) if is_html(ctype) else None)

    async def _work_elsewhere(self, resp: Response, url: str, ctype: str | None,
                              now: float) -> tuple[int | None, Page | None]:
        """A page's records and links made by a page worker process, the records appended here: the same
        records and links as inline (`_store`, `extract`). A page that killed its workers again and again is
        counted (``errors{kind="page-worker"}``), logged, and finished unstored and without links."""
        assert self.page_workers is not None
        mime = (ctype or "").split(";", 1)[0].strip().lower()
        stored = mime in self.store_types
        level = getattr(self.pages, "compress_level", None) if stored else None
        parse = is_html(ctype)
        if not parse and level is None:
            return self._store(resp, ctype, now), None
        job = PageJob(url=resp.url, content_type=ctype, body=resp.body, parse=parse, compress_level=level,
                      request_headers=resp.request_headers, status=resp.status, reason=resp.reason,
                      response_headers=_as_decoded(resp), ip=resp.ip, fetched_at=now, truncated=resp.truncated)
        try:
            result: PageResult = await self.page_workers.process(job)
        except PageWorkerError as exc:
            self.stats.errors["page-worker"] += 1
            log.warning("page given up by the page workers", extra={"url": url, "error": str(exc)})
            return None, None
        size: int | None = None
        if result.written is not None:  # the worker appended the records to its own WARC file
            size = result.written or 0
        elif result.built is not None:
            size = self.pages.store_built(url=resp.url, status=resp.status, fetched_at=now, built=result.built,
                                          truncated=resp.truncated) or 0
        elif stored:
            size = self._store(resp, ctype, now)  # a store that keeps no records (--store none) counts it here
        return size, result.page

    def _store(self, resp: Response, ctype: str | None, now: float) -> int | None:
        """Write the page if its type is stored; the bytes written (None when not stored). Safe in a page
        thread (the store locks)."""
        mime = (ctype or "").split(";", 1)[0].strip().lower()
        if mime not in self.store_types:
            return None
        written = self.pages.store(
            url=resp.url,
            request_headers=resp.request_headers,
            status=resp.status,
            reason=resp.reason,
            response_headers=_as_decoded(resp),
            body=resp.body,
            ip=resp.ip,
            fetched_at=now,
            truncated=resp.truncated,
        )
        return written or 0

    def gauges(self) -> dict[str, float]:
        return {
            "queued_urls": float(len(self.frontier)),
            "in_flight": float(self.frontier.in_flight()),
            "hosts_waiting": float(len(self.sched)),
            "hosts_known": float(len(self.sched.turns)),
            "workers_busy": float(self.active),
        }


class _SitemapSink:
    """The body sink of one sitemap fetch (``peer.fetch.http.BodySink``): only a 2xx body is read; its pieces
    go through a `SitemapReader`, and what it lists is admitted every `_SITEMAP_BATCH` entries, so neither
    the document nor its list is ever held whole."""

    __slots__ = ("crawler", "item", "reader", "pending", "max_bytes")

    def __init__(self, crawler: Crawler, item: QueuedUrl) -> None:
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
            batch = _Batch()
            self.crawler._screen_listed(batch, self.item, self.pending)
            self.pending = []
            self.crawler._commit(batch)

    def finish(self, batch: _Batch) -> None:
        """The body ended: the last entries go into `batch` (committed with the sitemap's own record)."""
        self.pending += self.reader.close()
        self.crawler._screen_listed(batch, self.item, self.pending)
        self.pending = []
        if self.reader.stopped is not None:
            self.crawler.stats.skipped[f"sitemap-{self.reader.stopped}"] += 1


_DECODED_DROP = frozenset(("content-encoding", "transfer-encoding", "content-length"))


def _as_decoded(resp: Response) -> list[tuple[str, str]]:
    """Response headers that describe the body as stored: the fetcher hands us the body with its
    Content-Encoding undone and de-chunked, so those headers go and Content-Length is the stored length."""
    if not any(k in _DECODED_DROP for k, _ in resp.headers):
        return resp.headers
    headers = [(k, v) for k, v in resp.headers if k not in _DECODED_DROP]
    headers.append(("content-length", str(len(resp.body))))
    return headers


def _record_fields(record: RevisitRecord) -> dict:
    return {name: getattr(record, name) for name in RevisitRecord.__slots__}


def _header(resp: Response, name: str) -> str | None:
    for key, value in resp.headers:
        if key == name:
            return value
    return None


def _path_of(url: str, origin: str) -> str:
    path = url[len(origin):]
    return path or "/"


def _retry_after(resp: Response, now: float) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None when absent or unreadable."""
    value = _header(resp, "retry-after")
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        # str.isdigit is true of other scripts' digits and of '²', which int() cannot read or reads as a number
        # the server did not mean: only ASCII delta-seconds count, and a huge one is capped (by max_backoff later).
        if not value.isascii():
            return None
        return float(int(value[:12]))
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when - now) if math.isfinite(when) else None
