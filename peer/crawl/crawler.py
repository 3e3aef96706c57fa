"""The crawl engine of one node: the politeness scheduler, the fetch workers, and link admission.

Flow of a URL: ``admit()`` (scope, ownership, dedup, frontier) -> the host is woken in the scheduler ->
when its turn comes a worker pops one URL of that host from the frontier, makes sure the origin's robots.txt
is known, fetches, stores, extracts links and admits them, then gives the host back to the scheduler with its
next allowed time. One worker per host at a time is what makes "one connection per host" true.

Speed: most links of a wide crawl were seen before, so the engine remembers which URLs the dedup store has
already answered for (URL -> host, bounded) and counts those as seen without parsing, scope-checking or
looking them up again; the dedup store stays the authority (docs/architecture.md, "Seen-URL memory").

Seams (``peer/crawl/seams.py``): pages come through a ``PageFetcher`` (``peer.fetch.Fetcher`` in a node); who
owns a host, and where links for hosts owned elsewhere go, is the ``Ownership`` it is given (``Solo`` for a node
on its own, the ``Cluster`` in a fleet).

The `Crawler` is one object made of parts, a module each (mixins on the crawler's attributes, set here):
here the composition, the runtime settings, the scheduler's window of hosts, the cluster's hooks, and the run
loop (dispatch of host turns to workers, containment of a turn's defects, drain); `admission` (scope, route,
dedup, queue: the links' hot path), `hostturns` (one host turn: address lane, robots.txt, the request, its
answer), `sitemapturns` (sitemaps named by robots.txt, read in their host's turn), `revisits` (the revisit
schedule's loop and each page's next visit), `pagework` (a page's records and links: inline, in threads or
in worker processes), `renderturns` (a page rendered in a browser, its requests served within the turn),
`responses` (reading a response's headers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from storage import (
    HostState, LruTtlCache, NodeStore, PageStore, QueuedUrl, RevisitRecord, StorageError, StoredPayload,
)

from peer.config import Config
from peer.crawl.addressgate import AddressGate
from peer.crawl.admission import Admission, SeedReport
from peer.crawl.hostturns import HostTurns
from peer.crawl.pagework import PageWork
from peer.crawl.payloads import LocalOriginals, PayloadOriginals
from peer.crawl.pageworkers import PageWorkers
from peer.crawl.renderturns import RenderTurns
from peer.crawl.revisits import Revisits, record_fields
from peer.crawl.robots import RobotsDecision, product_token
from peer.crawl.scheduler import HostScheduler, HostTurn
from peer.crawl.seams import AddressLimits, Ownership, PageFetcher, PageRenderer, Solo
from peer.crawl.settings import CONFIG_VERSION_FOUNDER, CrawlSettings, SettingsFile
from peer.crawl.sitemapturns import SitemapTurns
from peer.crawl.urls import Scope
from peer.render.decision import Decider
from peer.stats import Stats

__all__ = ["Crawler", "SeedReport"]

log = logging.getLogger(__name__)

#: Host turns whose first URLs are taken from the store in one transaction (`Crawler._pop_first`).
_POP_BATCH = 64

#: The scheduler's window is refilled from the host table once this many places are free (or nothing is ready),
#: reading at most _REFILL_READ hosts per read and _REFILL_SCAN per refill.
_REFILL_ROOM = 64
_REFILL_READ = 512
_REFILL_SCAN = 8192
_REFILL_PAUSE = 0.01

#: A host whose arc's hand-off has not arrived is looked at again this often.
_BLOCKED_RECHECK = 0.25


class Crawler(Admission, HostTurns, SitemapTurns, Revisits, PageWork, RenderTurns):
    """The crawl engine of one node (see the module's text); its parts are mixins, one module each."""

    def __init__(
        self,
        cfg: Config,
        *,
        fetcher: PageFetcher,
        store: NodeStore,
        pages: PageStore,
        stats: Stats | None = None,
        ownership: Ownership | None = None,
        limits: AddressLimits | None = None,
        wallclock: Callable[[], float] = time.time,
        settings: CrawlSettings | None = None,
        settings_file: SettingsFile | None = None,
        page_workers: PageWorkers | None = None,
        plugins: Any = None,
        originals: PayloadOriginals | None = None,
        renderer: PageRenderer | None = None,
    ) -> None:
        self.cfg = cfg
        self.fetcher = fetcher
        self.store = store  # seen-set and frontier changed together, atomically
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
        #: Why this node starts no host turn for now, besides a pause (e.g. "upload": the files waiting for
        #: upload fill their bound); set by `hold`, shown in /status.
        self.holds: set[str] = set()
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
        # one crawl-log record per finished URL, spooled with its page (peer/outputs/crawllog.py reads them)
        self.log_urls = (cfg.crawl_log_local != "off" or bool(cfg.crawl_log)) and hasattr(store, "crawl_log")
        self._current: dict[str, QueuedUrl] = {}  # host -> the URL its turn is working on
        #: URLs given up because the node stopped while fetching them, max_crashes times in a row (this run).
        self.dropped_urls: list[str] = []
        # --page-threads N: a page's store and parse run in one of N threads (see _store_and_extract)
        self._page_threads = trio.CapacityLimiter(cfg.page_threads) if cfg.page_threads > 0 else None
        # --page-processes N: the same work in worker processes (peer/crawl/pageworkers.py); the node owns them
        self.page_workers = page_workers
        # the plug-in chain (peer.plugins.Plugins); None or one with nothing for pages: the page path is as
        # without plug-ins (nothing built for them)
        self.plugins = plugins
        # --render: the node's render pool (peer.render.RenderPool), and when a page is worth rendering (the
        # mode, the [hosts."PATTERN"] render rules, what renders found per path pattern)
        self.renderer = renderer
        self.render_decider = Decider(cfg.render, [(pattern, str(value)) for pattern, settings in cfg.hosts
                                                   for key, value in settings if key == "render"])
        # one large page parsed at a time: a 10 MiB page of a quarter of a million links makes a tree and link
        # lists of over 100 MiB, and several at once (as a loaded machine lines them up) break the memory bound
        self._large_parses = trio.CapacityLimiter(1)
        # --revisit: every stored page gets a next visit in the store's schedule (storage/_revisits.py)
        self.schedule = store.revisits if cfg.revisit else None
        # identical payloads across URLs (peer/crawl/payloads.py): who says where a payload was stored first (a
        # node alone answers itself); None with `payload_revisits` off
        self.originals: PayloadOriginals | None = (
            None if not cfg.payload_revisits else originals if originals is not None else LocalOriginals(store.digests))
        self._payload_revisits: dict[str, StoredPayload] = {}  # URL -> the original its record refers to
        self._record_ids: dict[str, str] = {}  # URL -> the record id of its full record just written

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

    def hold(self, reason: str, on: bool) -> None:
        """Start no host turn while any hold is on (the turns under way finish; queues and timers are kept)."""
        if on:
            self.holds.add(reason)
        else:
            self.holds.discard(reason)
        self._wakeup.set()

    # ------------------------------------------------------------------ the scheduler's window of hosts

    def restore(self) -> int:
        """After a restart: in-flight URLs go back to their queues and every host with work is scheduled,
        keeping its saved politeness state (wall-clock times are turned into trio times).

        A URL that was in flight at ``cfg.max_crashes`` stops in a row is dropped instead: it may be what stopped
        the node. It is logged, counted (``errors{kind="crash-loop"}``), recorded in ``dropped_urls`` and taken off
        the revisit schedule (its queued revisit would otherwise never be fetched nor due again)."""
        recovered, dropped = self.frontier.recover_in_flight(max_crashes=self.cfg.max_crashes)
        for item in dropped:
            if self.schedule is not None:
                self.schedule.forget(item.host, item.url)
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

    def unpark(self, which: Callable[[str], bool]) -> int:
        """URLs parked for the hosts `which` names (not for a host whose turn is under way) go back to their
        queues: a hand-off that brings their keys as seen (fetched by the host's previous owner) then discards
        them there. Returns how many."""
        return self._put_back(which)

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
            if self.settings.paused or self.holds:
                # paused or held: no new host turn; the turns under way finish, every queue and timer is kept
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
            if before is not None and before.queued and self.schedule is not None:  # a revisit: due again later
                due = self.wallclock() + before.interval
                self.schedule.put(RevisitRecord(**{**record_fields(before), "due": due, "queued": False}))
        turn.failures += 1
        turn.backoff = min(self.cfg.max_backoff, max(self.cfg.delay, 1.0) * 2 ** min(turn.failures, 16))
        self._schedule_after_request(turn)
        self._save_state(turn)

    def gauges(self) -> dict[str, float]:
        return {
            "queued_urls": float(len(self.frontier)),
            "in_flight": float(self.frontier.in_flight()),
            "hosts_waiting": float(len(self.sched)),
            "hosts_known": float(len(self.sched.turns)),
            "workers_busy": float(self.active),
        }
