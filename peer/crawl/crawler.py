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

import trio

from storage import HostState, LruTtlCache, QueuedUrl, StorageError

from peer.config import Config
from peer.crawl.links import extract, is_html
from peer.crawl.robots import RobotsDecision, decide
from peer.crawl.scheduler import HostScheduler, HostTurn
from peer.crawl.seams import Link, Ownership, PageFetcher, Solo
from peer.crawl.urls import Scope, host_of_normalized, normalize, origin_of_normalized
from peer.fetch.dns import DnsError
from peer.fetch.http import FetchError, Response
from peer.stats import Stats

__all__ = ["Crawler", "Link"]

log = logging.getLogger(__name__)

#: How many refused (robots/limits) URLs one host turn may skip before yielding, so a host with thousands
#: of disallowed URLs cannot hog a worker.
_SKIP_BUDGET = 256
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
_RETRY_STATUSES = frozenset((429, 503))
_RETRY_ERRORS = frozenset(("connect", "timeout"))
#: URLs remembered as already answered by the dedup store (about 200 B each: 200,000 is about 40 MiB).
#: Past it the memory starts over; the dedup store stays the authority, so that only costs look-ups.
_SEEN_CACHE_SIZE = 200_000


#: A page larger than this is parsed in a worker thread even without ``parse_in_thread``: a million links take
#: lxml about 0.7 s, longer than the membership probe timeout, and the event loop must keep answering.
_THREAD_PARSE_BYTES = 512 * 1024

#: A host whose arc's hand-off has not arrived is looked at again this often.
_BLOCKED_RECHECK = 0.25


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
        wallclock: Callable[[], float] = time.time,
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
        self.scope = Scope(
            allowed_hosts=cfg.allowed_hosts,
            denied_hosts=cfg.denied_hosts,
            max_depth=None if cfg.max_depth < 0 else cfg.max_depth,
            max_url_length=cfg.max_url_length,
        )
        self.sched = HostScheduler()
        self.robots: LruTtlCache[str, RobotsDecision] = LruTtlCache(cfg.robots_cache_size)
        self._robots_failures: dict[str, int] = {}
        self._pending: dict[str, QueuedUrl] = {}  # host -> URL popped but parked while its robots.txt came in
        self._retries: dict[str, int] = {}
        self._wakeup = trio.Event()
        self._seen: dict[str, str] = {}  # URL -> host, for URLs the dedup store has answered for
        self.done = trio.Event()
        self.active = 0
        self._draining = False
        self.store_types = tuple(t.lower() for t in cfg.store_types)
        self._current: dict[str, QueuedUrl] = {}  # host -> the URL its turn is working on
        #: URLs given up because the node stopped while fetching them, max_crashes times in a row (this run).
        self.dropped_urls: list[str] = []

    # ------------------------------------------------------------------ admission

    def admit(self, links: Iterable[Link]) -> tuple[int, int]:
        """Scope-check, route, dedup and queue links. Returns (new, already seen) for the links owned here."""
        batch = _Batch()
        for link in links:
            self._screen(batch, link.url, link.depth, link.hops, link.found_on)
        return self._commit(batch)

    def _screen_found(self, batch: _Batch, urls: Sequence[str], depth: int, found_on: str) -> None:
        """Screen the links of one page, without a ``Link`` per URL: the crawl's hottest loop.

        Most links of a wide crawl were seen before; a URL the dedup store already answered for, on a host
        this node still owns, is counted as seen without being parsed, scope-checked or looked up again.
        """
        seen = self._seen
        owns = self.owns
        max_depth = self.scope.max_depth
        if max_depth is not None and depth > max_depth:
            seen = {}  # the scope check must name the reason, as without the cache
        hits = 0
        for url in urls:
            host = seen.get(url)
            if host is not None and (owns is None or owns(host)):
                hits += 1
                continue
            self._screen(batch, url, depth, 0, found_on)
        batch.seen += hits

    def _screen(self, batch: _Batch, url: str, depth: int, hops: int, found_on: str | None) -> None:
        host = host_of_normalized(url)
        reason = self.scope.check(url, host, depth)
        if reason is not None:
            self.stats.skipped[reason] += 1
            return
        if self.owns is not None and not self.owns(host):
            self.ownership.route(host, Link(url, depth, hops, found_on))
            return
        batch.cands.append(QueuedUrl(url=url, host=host, depth=depth, hops=hops, found_on=found_on))

    def _commit(self, batch: _Batch, done: QueuedUrl | None = None) -> tuple[int, int]:
        """One store transaction: mark the batch seen, queue the new URLs and (with ``done``) clear the page
        they were found on from in-flight, all together, so a crash can lose none of it. New URLs wake their
        hosts."""
        cands = batch.cands
        if done is not None:
            routed = self.ownership.take_routed()
            items = self.store.finish(done, cands, routed) if routed else self.store.finish(done, cands)
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
        """Drop the in-memory record of URLs the dedup store has answered for. Call it whenever the dedup
        store may forget URLs (a re-crawl policy deleting keys); ownership changes need no call."""
        self._seen.clear()

    def seed(self, urls: Sequence[str]) -> int:
        links = []
        for raw in urls:
            url = normalize(raw.strip(), max_length=self.cfg.max_url_length)
            if url is None:
                log.warning("seed is not a crawlable http(s) URL, skipped", extra={"seed": raw})
                continue
            links.append(Link(url, 0))
        new, _ = self.admit(links)
        return new

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
        now, wall = trio.current_time(), self.wallclock()
        for st in self.frontier.states():
            t = self.sched.turn(st.host)
            t.next_allowed = now + max(0.0, st.next_allowed - wall)
            t.crawl_delay, t.backoff, t.failures, t.pages = st.crawl_delay, st.backoff, st.failures, st.pages
        for host, _count in self.frontier.hosts():
            self.sched.wake(host, now)
        self._wakeup.set()
        return recovered

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
            t = self.sched.turn(st.host)
            t.next_allowed = max(t.next_allowed, now + max(0.0, st.next_allowed - wall))
            t.crawl_delay = max(t.crawl_delay, st.crawl_delay)
            t.failures, t.pages = st.failures, max(t.pages, st.pages)
        self.wake_hosts(items)

    def rewake(self) -> int:
        """After a view change: schedule every host with queued URLs that this node may now fetch."""
        now = trio.current_time()
        owns = self.owns
        self.release_moved()
        n = 0
        for host, _count in self.frontier.hosts():
            if owns is None or owns(host):
                n += self.sched.wake(host, now)
        self._wakeup.set()
        return n

    def release_moved(self) -> int:
        """URLs parked (waiting for robots.txt or a retry) for hosts this node no longer owns go back to their
        queues, so the hand-off of their arc carries them. A busy host keeps its URL until its turn ends."""
        owns = self.owns
        if owns is None:
            return 0
        back = []
        for host in list(self._pending):
            t = self.sched.turns.get(host)
            if not owns(host) and not (t is not None and t.busy):
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
            task_status.started()
            async with send:
                await self._dispatch(send)
            nursery.cancel_scope.cancel()

    def is_done(self) -> bool:
        return len(self.frontier) == 0 and self.frontier.in_flight() == 0 and self.active == 0

    async def drain(self, timeout: float) -> bool:
        """Stop starting host turns and wait up to ``timeout`` for the fetches under way to finish, so a
        clean stop re-fetches nothing after a restart. True if nothing was left in progress."""
        self._draining = True
        self._wakeup.set()
        with trio.move_on_after(timeout):
            while self.active:
                await trio.sleep(0.01)
        return self.active == 0

    async def _dispatch(self, send: trio.MemorySendChannel[HostTurn]) -> None:
        sched = self.sched
        while True:
            if self._draining:
                await trio.sleep_forever()
            now = trio.current_time()
            turn = sched.pop_ready(now)
            if turn is not None:
                if turn.next_allowed > now:  # a hand-off moved its timer after it was queued
                    sched.release(turn, now, more_work=True)
                elif self.owns is not None and not self.owns(turn.host):
                    self._let_go(turn)
                elif self.ownership.blocked(turn.host):
                    turn.next_allowed = now + _BLOCKED_RECHECK
                    sched.release(turn, now, more_work=True)
                else:
                    await send.send(turn)
                continue
            if self.is_done():
                self.done.set()
                if self.stop_when_done:
                    return
            nxt = sched.next_time()
            self._wakeup = trio.Event()
            with trio.move_on_after(1.0 if nxt is None else max(0.0, nxt - now)):
                await self._wakeup.wait()

    async def _worker(self, recv: trio.MemoryReceiveChannel[HostTurn]) -> None:
        async with recv:
            async for turn in recv:
                self.active += 1
                try:
                    await self._host_turn(turn)
                except Exception as exc:  # noqa: BLE001 - one host's input must not end the node
                    self._contain(turn, exc)
                finally:
                    self._current.pop(turn.host, None)
                    self.active -= 1
                    if self.owns is not None and turn.host in self._pending and not self.owns(turn.host):
                        self.frontier.requeue([self._pending.pop(turn.host)])  # moved: into the hand-off
                    more = turn.host in self._pending or self.frontier.queued(turn.host) > 0
                    self.sched.release(turn, trio.current_time(), more_work=more)
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
        turn.failures += 1
        turn.backoff = min(self.cfg.max_backoff, max(self.cfg.delay, 1.0) * 2 ** min(turn.failures, 16))
        self._schedule_after_request(turn)
        self._save_state(turn)

    # ------------------------------------------------------------------ one host turn

    async def _host_turn(self, turn: HostTurn) -> None:
        host = turn.host
        for _ in range(_SKIP_BUDGET):
            item = self._pending.pop(host, None) or self.frontier.pop(host)
            if item is None:
                return
            self._current[host] = item
            if self.cfg.max_pages_per_host >= 0 and turn.pages >= self.cfg.max_pages_per_host:
                self.stats.skipped["max-pages-per-host"] += 1
                self.frontier.done(item)
                self.ownership.fetched(item)
                continue
            origin = origin_of_normalized(item.url)
            decision = self.robots.get(origin, self.wallclock())
            if decision is None:
                # The robots.txt request is this host's request for this turn; the URL waits for the next.
                self._pending[host] = item
                await self._fetch_robots(turn, origin)
                return
            path = _path_of(item.url, origin)
            if not decision.robots.can_fetch(self.user_agent, path):
                self.stats.skipped["robots" if decision.kind == "parsed" else "robots-unavailable"] += 1
                self.frontier.done(item)
                self.ownership.fetched(item)
                continue
            await self._fetch_page(turn, item)
            return

    def _schedule_after_request(self, turn: HostTurn, *, extra: float = 0.0) -> None:
        delay = max(self.cfg.delay, turn.crawl_delay, turn.backoff, extra)
        turn.next_allowed = trio.current_time() + delay

    def _save_state(self, turn: HostTurn) -> None:
        wall_next = self.wallclock() + max(0.0, turn.next_allowed - trio.current_time())
        self.frontier.put_state(
            HostState(
                host=turn.host,
                next_allowed=wall_next,
                crawl_delay=turn.crawl_delay,
                backoff=turn.backoff,
                failures=turn.failures,
                pages=turn.pages,
            )
        )

    async def _fetch_robots(self, turn: HostTurn, origin: str) -> None:
        url = origin + "/robots.txt"
        status: int | None = None
        body: bytes | None = None
        hops = 0
        self.stats.robots_fetches += 1
        try:
            while True:
                resp = await self.fetcher.fetch(url, headers=(("user-agent", self.user_agent),))
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
            self.stats.errors[f"robots-{getattr(exc, 'kind', 'error')}"] += 1
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
        delay = decision.robots.crawl_delay(self.user_agent)
        turn.crawl_delay = float(delay) if delay else 0.0
        turn.backoff = 0.0
        self._schedule_after_request(turn)
        self._save_state(turn)

    async def _fetch_page(self, turn: HostTurn, item: QueuedUrl) -> None:
        stats = self.stats
        try:
            resp = await self.fetcher.fetch(item.url, headers=(("user-agent", self.user_agent),))
        except (FetchError, DnsError) as exc:
            kind = getattr(exc, "kind", "error")
            stats.errors[kind] += 1
            if kind in _RETRY_ERRORS and self._retry(turn, item):
                return
            self.frontier.done(item)
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
        turn.pages += 1
        turn.failures = 0
        turn.backoff = 0.0
        batch = _Batch()
        if status in _REDIRECTS:
            location = _header(resp, "location")
            target = normalize(location, item.url, max_length=self.cfg.max_url_length) if location else None
            if target is not None:
                if item.hops + 1 <= self.cfg.max_redirect_hops:
                    self._screen(batch, target, item.depth, item.hops + 1, item.url)
                else:
                    stats.skipped["redirect-hops"] += 1
        elif 200 <= status < 300:
            ctype = _header(resp, "content-type")
            self._store(resp, ctype)
            if is_html(ctype):
                if self.cfg.parse_in_thread or len(resp.body) > _THREAD_PARSE_BYTES:
                    page = await trio.to_thread.run_sync(extract, resp.body, item.url, ctype)
                else:
                    page = extract(resp.body, item.url, ctype)
                stats.links_found += len(page.links)
                if not page.nofollow:
                    self._screen_found(batch, page.links, item.depth + 1, item.url)
        self._commit(batch, done=item)
        self.ownership.fetched(item)
        self._retries.pop(item.url, None)
        self._schedule_after_request(turn)
        self._save_state(turn)

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

    def _store(self, resp: Response, ctype: str | None) -> None:
        mime = (ctype or "").split(";", 1)[0].strip().lower()
        if mime not in self.store_types:
            return
        self.pages.store(
            url=resp.url,
            request_headers=resp.request_headers,
            status=resp.status,
            reason=resp.reason,
            response_headers=_as_decoded(resp),
            body=resp.body,
            ip=resp.ip,
            fetched_at=self.wallclock(),
            truncated=resp.truncated,
        )
        self.stats.stored += 1

    def gauges(self) -> dict[str, float]:
        return {
            "queued_urls": float(len(self.frontier)),
            "in_flight": float(self.frontier.in_flight()),
            "hosts_waiting": float(len(self.sched)),
            "hosts_known": float(len(self.sched.turns)),
            "workers_busy": float(self.active),
        }


_DECODED_DROP = frozenset(("content-encoding", "transfer-encoding", "content-length"))


def _as_decoded(resp: Response) -> list[tuple[str, str]]:
    """Response headers that describe the body as stored: the fetcher hands us the body with its
    Content-Encoding undone and de-chunked, so those headers go and Content-Length is the stored length."""
    if not any(k in _DECODED_DROP for k, _ in resp.headers):
        return resp.headers
    headers = [(k, v) for k, v in resp.headers if k not in _DECODED_DROP]
    headers.append(("content-length", str(len(resp.body))))
    return headers


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
