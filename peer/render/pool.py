"""A node's render pool: one browser, at most `tabs` renders at once, the browser restarted after `max_pages`
renders, at once when its processes' memory passes `max_rss` (checked while renders run), or when it dies.

The pool keeps its tabs (`peer.render.tabs.Tab`) from one render to the next, each cleared between two pages;
a tab whose render failed is closed and a new one opened for the next render.

`serve_pool` runs the pool in the node's nursery; `RenderPool.render` is what a host turn calls. The browser is
started at the first render; a render that finds no browser (it is starting, or being restarted) waits for it
within the render's own time limit. An attached browser
(`--browser-ws`) is never restarted: only reconnected when its connection drops.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import trio

from peer.render.browser import Browser, open_browser
from peer.render.tabs import RenderFailed, Rendered, Serve, Tab, open_tab

__all__ = ["PoolLimits", "RenderPool"]

log = logging.getLogger(__name__)

#: How often a running render checks the browser's memory.
_RSS_EVERY = 0.25
#: A browser that fails to start is tried again after this long (doubling up to a minute).
_RETRY = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolLimits:
    tabs: int = 2
    max_pages: int = 200
    max_rss: int = 1024 * 2**20
    time_limit: float = 20.0
    max_requests: int = 50


Opener = Callable[[], AbstractAsyncContextManager[Browser]]


class RenderPool:
    """See the module's text. Counters: `renders`, `failures` (by kind), `restarts` (by reason)."""

    def __init__(self, limits: PoolLimits, *, opener: Opener | None = None, chromium: str = "", ws_url: str = "",
                 heap_mib: int = 512, counts: Counter[str] | None = None, workdir: str | None = None) -> None:
        """`workdir`: where launched browsers keep their profiles (see `open_browser`)."""
        self.limits = limits
        self._opener: Opener = opener or (lambda: open_browser(chromium=chromium, ws_url=ws_url, heap_mib=heap_mib,
                                                               workdir=workdir))
        self._tabs = trio.CapacityLimiter(limits.tabs)
        self._browser: Browser | None = None
        self._wanted = trio.Event()
        self._ready = trio.Event()
        self._restart = trio.Event()
        self._idle = trio.Event()
        self._idle.set()
        self._active = 0
        self._kept: list[Tab] = []  # the current browser's tabs between two renders
        self._since_start = 0
        self.attached = bool(ws_url)
        self.renders = 0
        self.failures: Counter[str] = Counter()
        self.restarts: Counter[str] = Counter()
        #: where the node's status reads the browser's figures (``browser-restart-REASON``, ``browser-peak-bytes``)
        self.counts: Counter[str] = counts if counts is not None else Counter()
        self.peak_rss = 0
        self.last_rss = 0
        self.pgid: int | None = None

    async def serve_pool(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a browser running until cancelled, from the first render on (a node whose pages need none
        starts none)."""
        task_status.started()
        await self._wanted.wait()
        pause = _RETRY
        while True:
            running = False
            try:
                async with self._opener() as browser:
                    pause = _RETRY
                    running = True
                    self._browser, self.pgid = browser, browser.pgid
                    self._kept = []
                    self._since_start = 0
                    self._restart = trio.Event()
                    self._ready.set()
                    reason = await self._until_restart(browser)
                    if self._ready.is_set():
                        self._ready = trio.Event()  # new renders wait for the next browser
                    # Past its memory bound the browser goes at once, with the renders under way (each is tried
                    # once more on the next browser): waiting for them would let a page allocating without end
                    # take the browser as far as its script heap's cap. Other restarts let them finish.
                    if reason not in ("died", "memory"):
                        with trio.move_on_after(self.limits.time_limit + 5):
                            await self._idle.wait()
                        if browser.cdp.closed:
                            reason = "died"  # it died while its last renders ran: a death, whatever asked first
                    self._browser = None
                    self._kept = []  # gone with their browser (an attached one disposes them as we detach)
                    self._restarted(reason)
                    running = False  # counted: an error in closing it is not a second death
            except Exception as exc:  # noqa: BLE001 - a browser that cannot start or be reached is retried, the node goes on
                self._browser = None
                if running:
                    # its connection broke under it (the browser died and the websocket's reader failed before
                    # the pool saw the connection closed): a death, and the next browser starts at once
                    if self._ready.is_set():
                        self._ready = trio.Event()
                    self._kept = []
                    self._restarted("died")
                    continue
                self.restarts["start-failed"] += 1
                self.counts["browser-restart-start-failed"] += 1
                log.error("browser: %s", exc)
                await trio.sleep(pause)
                pause = min(60.0, pause * 2)

    def _restarted(self, reason: str) -> None:
        self.restarts[reason] += 1
        self.counts[f"browser-restart-{reason}"] += 1
        log.info("browser restarted", extra={"reason": reason, "renders": self.renders})

    async def _until_restart(self, browser: Browser) -> str:
        while True:
            with trio.move_on_after(_RSS_EVERY):
                await self._restart.wait()
            if browser.cdp.closed:
                return "died"
            if self._active:
                self._check_rss(browser)
            if self._restart.is_set():
                return self._restart_reason
            if not self.attached and self._since_start >= self.limits.max_pages:
                self._request_restart("max-pages")
                return "max-pages"

    _restart_reason = "max-pages"

    def _request_restart(self, reason: str) -> None:
        """Stop handing this browser to new renders now; `serve_pool` restarts it once the running ones end."""
        if not self._restart.is_set():
            self._restart_reason = reason
            self._ready = trio.Event()
            self._restart.set()

    def _check_rss(self, browser: Browser) -> None:
        rss = browser.rss()
        self.last_rss = rss
        self.peak_rss = max(self.peak_rss, rss)
        self.counts["browser-peak-bytes"] = self.peak_rss
        if rss > self.limits.max_rss and not self.attached:
            self._request_restart("memory")

    async def render(self, url: str, serve: Serve) -> Rendered:
        """Render `url` with the pool's browser, its requests served by `serve`; raises `RenderFailed`. A render
        whose browser died under it is tried once more with the next browser."""
        try:
            return await self._render_once(url, serve)
        except RenderFailed as exc:
            if exc.kind != "died":
                raise
            return await self._render_once(url, serve)

    async def _render_once(self, url: str, serve: Serve) -> Rendered:
        limits = self.limits
        self._wanted.set()
        async with self._tabs:
            with trio.move_on_after(limits.time_limit) as waiting:
                while True:
                    ready = self._ready
                    await ready.wait()
                    browser = self._browser
                    if ready is self._ready and browser is not None and not browser.cdp.closed:
                        break
                    await trio.sleep(0.05)  # the browser died a moment ago: its restart is under way
            if waiting.cancelled_caught or browser is None:
                self.failures["no-browser"] += 1
                raise RenderFailed("no-browser", f"no browser within {limits.time_limit} s")
            self._active += 1
            if self._active == 1:
                self._idle = trio.Event()
            self._since_start += 1
            tab: Tab | None = None
            try:
                tab = await self._tab(browser)
                rendered = await tab.render(url, serve, time_limit=limits.time_limit,
                                            max_requests=limits.max_requests)
                self.renders += 1
                return rendered
            except RenderFailed as exc:
                if exc.kind == "browser" and browser.cdp.closed:
                    self.failures["died"] += 1
                    raise RenderFailed("died", str(exc)) from exc
                self.failures[exc.kind] += 1
                if exc.kind == "browser":
                    self._request_restart("unresponsive")
                raise
            finally:
                if tab is not None:
                    await self._release(tab, browser)
                if not self.attached:
                    self._check_rss(browser)
                self._active -= 1
                if self._active == 0:
                    self._idle.set()
                if not self.attached and self._since_start >= limits.max_pages:
                    self._request_restart("max-pages")

    async def _tab(self, browser: Browser) -> Tab:
        """A kept tab of `browser`, else a new one."""
        while self._kept:
            tab = self._kept.pop()
            if tab.cdp is browser.cdp and tab.usable:
                return tab
        return await open_tab(browser.cdp)

    async def _release(self, tab: Tab, browser: Browser) -> None:
        """Keep `tab` for the next render, cleared, while its browser is the pool's and not being restarted;
        else close it."""
        current = browser is self._browser and not self._restart.is_set() and not browser.cdp.closed
        if current and await tab.reset() and browser is self._browser and not self._restart.is_set():
            self._kept.append(tab)
        else:
            await tab.close()

    @property
    def tabs_in_use(self) -> int:
        """Tabs rendering a page now."""
        return self._active

    @property
    def tabs_open(self) -> int:
        """Tabs the browser has open for the pool: rendering now, and kept between two renders."""
        return self._active + len(self._kept)

    def status(self) -> dict[str, object]:
        return {"renders": self.renders, "failures": dict(self.failures), "restarts": dict(self.restarts),
                "browser_rss": self.last_rss, "browser_peak_rss": self.peak_rss, "attached": self.attached,
                "running": self._browser is not None, "tabs_in_use": self._active, "tabs_open": self.tabs_open}
