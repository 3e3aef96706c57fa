"""A render: a page opened in a tab the pool keeps (a browser context of its own per tab), every request of the
tab paused and handed to the node (``Fetch`` domain), the DOM read once the page has loaded and gone quiet.

A `Tab` renders one page after another: between two renders it is taken to ``about:blank`` and the cookies
and storage of its browser context are cleared, so no cookie or storage crosses from one render to the next,
and the set-up (a context, a target, its domains) is paid once per tab, not per page. A tab whose render failed
is closed, its context disposed.

When a page is read: after its load event, once no request has been paused or served for `QUIET` seconds and
then its DOM has had no change for `DOM_QUIET_MS` milliseconds of the page's own time (a `MutationObserver`
and an idle callback in an isolated world: a page under a loaded machine gets its own time); a request made
meanwhile starts the wait again. The wait after the load event is bounded (`SETTLE_MAX`): a page that changes
its DOM without end is read as it is then.

A render ends by its time limit whatever the page does: a script that never ends is stopped
(``Runtime.terminateExecution``) before the DOM is read; a page that opens windows gets them closed; a tab whose
renderer died (a memory hog past the script heap's bound) ends the render with nothing.
"""

from __future__ import annotations

import base64
import logging
from functools import partial
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from peer.render.cdp import Cdp, CdpClosed, CdpError, CdpOverflow, Event

__all__ = ["TAB_REFUSALS", "BrowserRequest", "RenderFailed", "Rendered", "Served", "Tab", "open_tab", "render_in_tab"]

log = logging.getLogger(__name__)

#: The requests the browser's page makes that the node serves; images, media, fonts, style sheets and the tab's
#: icon build no links or text, so they are refused without a fetch (the politeness budget goes to what builds
#: the page).
SERVED_TYPES = frozenset({"Document", "Script", "XHR", "Fetch", "Other"})
#: The reasons a tab refuses a request without asking the node.
TAB_REFUSALS = ("type", "max-requests")
#: After the load event, the render waits this long without a request paused or being served...
QUIET = 0.2
#: ... then for this long (milliseconds of the page's time) without a change to its DOM.
DOM_QUIET_MS = 100
#: The longest wait for quiet after the load event: a page that never goes quiet is read as it is then.
SETTLE_MAX = 3.0
#: Time kept from the render's limit to stop a script and read the DOM.
FINISH = 2.0


class RenderFailed(Exception):
    """A render ended without a DOM; `kind` says why (``timeout``, ``crashed``, ``navigate``, ``browser``)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass(frozen=True, slots=True, kw_only=True)
class BrowserRequest:
    """One request the page's browser wants made."""

    url: str
    method: str
    headers: dict[str, str]
    resource_type: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """The node's answer to a browser request (`Serve` returns it, or a reason string when it refuses)."""

    status: int
    headers: Sequence[tuple[str, str]]
    body: bytes


#: The node's side of a render: serve one request, or refuse it with a reason (``Fetch.failRequest``).
Serve = Callable[[BrowserRequest], Awaitable["Served | str"]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rendered:
    """What a render made: the DOM as HTML, the requests served and refused (by reason), popups closed."""

    html: str
    served: int
    refused: dict[str, int]
    popups: int
    timed_out: bool


#: Run in the page's isolated world: resolves once the DOM has had no change for DOM_QUIET_MS, at the page's next
#: idle moment.
_DOM_QUIET = """new Promise(function (done) {
  var timer = 0;
  var watch = new MutationObserver(again);
  function again() { clearTimeout(timer); timer = setTimeout(idle, %d); }
  function idle() { watch.disconnect(); requestIdleCallback(function () { done(true); }, {timeout: 200}); }
  watch.observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
  again();
})""" % DOM_QUIET_MS


async def render_in_tab(cdp: Cdp, url: str, serve: Serve, *, time_limit: float,
                        max_requests: int) -> Rendered:
    """Render `url` in a tab of its own, closed after (see the module's text); raises `RenderFailed`."""
    tab = await open_tab(cdp)
    try:
        return await tab.render(url, serve, time_limit=time_limit, max_requests=max_requests)
    finally:
        await tab.close()


async def open_tab(cdp: Cdp) -> Tab:
    """A new tab in a browser context of its own, its domains on; raises `RenderFailed` (``browser``)."""
    try:
        context = str((await cdp.send("Target.createBrowserContext", {"disposeOnDetach": True}))[
            "browserContextId"])
    except (CdpError, CdpClosed, KeyError) as exc:
        raise RenderFailed("browser", str(exc)) from exc
    tab = Tab(cdp, context)
    try:
        with trio.fail_after(FINISH * 5):
            tab.target = str((await cdp.send("Target.createTarget", {
                "url": "about:blank", "browserContextId": context}))["targetId"])
            tab.session = str((await cdp.send("Target.attachToTarget", {
                "targetId": tab.target, "flatten": True}))["sessionId"])
            cdp.listen(tab.session)
            async with trio.open_nursery() as setup:  # the set-up commands at once
                setup.start_soon(partial(cdp.send, "Fetch.enable", {"patterns": [
                    {"urlPattern": "*", "requestStage": "Request"}]}, session=tab.session))
                setup.start_soon(_page_events, cdp, tab.session)
                setup.start_soon(partial(cdp.send, "Target.setAutoAttach", {
                    "autoAttach": True, "waitForDebuggerOnStart": False, "flatten": True}, session=tab.session))
    except BaseException as exc:
        await tab.close()
        if isinstance(exc, (CdpError, CdpClosed, KeyError, trio.TooSlowError)):
            raise RenderFailed("browser", str(exc) or "the tab did not open") from exc
        raise
    return tab


class Tab:
    """A tab the pool renders page after page in (see the module's text). `usable` is False once a render in
    it failed or it could not be cleared: the pool then closes it."""

    def __init__(self, cdp: Cdp, context: str) -> None:
        self.cdp = cdp
        self.context = context
        self.target = ""
        self.session = ""
        self.renders = 0
        self.usable = True
        self._origins: set[str] = set()  # of the pages rendered since the last reset: their storage is cleared

    async def render(self, url: str, serve: Serve, *, time_limit: float, max_requests: int) -> Rendered:
        """Render `url` here; raises `RenderFailed` (and the tab is no longer `usable`)."""
        self.renders += 1
        self._origins.add(_origin(url))
        self.cdp.drain(self.session)  # what the previous page or about:blank left is not this page's
        state = _State(self.cdp, self.session, serve, max_requests)
        ok = False
        try:
            rendered = await _one_error(_run_tab(self.cdp, self.session, self.target, url, state, time_limit))
            ok = True
        except (CdpError, CdpClosed, CdpOverflow) as exc:
            if state.crashed:
                raise RenderFailed("crashed", "the page's renderer died") from exc
            raise RenderFailed("browser", str(exc)) from exc
        finally:
            if not ok:
                self.usable = False
        if rendered.timed_out or state.crashed:
            self.usable = False  # a page stopped by force is not left to run on in a kept tab
        return rendered

    async def reset(self) -> bool:
        """Take the tab to about:blank and clear its context's cookies and storage, ready for the next page;
        False when that failed (the tab is then to be closed)."""
        if not self.usable:
            return False
        with trio.CancelScope(shield=True), trio.move_on_after(FINISH) as late:
            try:
                await self.cdp.send("Page.navigate", {"url": "about:blank"}, session=self.session)
                await self.cdp.send("Storage.clearCookies", {"browserContextId": self.context})
                for origin in self._origins:
                    await self.cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"},
                                        session=self.session)
                self._origins.clear()
            except (CdpError, CdpClosed):
                self.usable = False
        if late.cancelled_caught:
            self.usable = False
        return self.usable

    async def close(self) -> None:
        """Close the tab and dispose its context (whatever state the browser is in: failures change nothing)."""
        self.usable = False
        if self.session:
            self.cdp.forget(self.session)
        with trio.CancelScope(shield=True), trio.move_on_after(FINISH):
            try:
                if self.target:
                    await self.cdp.send("Target.closeTarget", {"targetId": self.target})
                await self.cdp.send("Target.disposeBrowserContext", {"browserContextId": self.context})
            except (CdpError, CdpClosed):
                pass


async def _one_error(work: Awaitable[Rendered]) -> Rendered:
    """The render's own error out of the tab's nursery: its first, as the render's reason."""
    try:
        return await work
    except BaseExceptionGroup as group:
        first: BaseException = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        if isinstance(first, (RenderFailed, CdpError, CdpClosed, CdpOverflow)):
            raise first from None
        raise


async def _run_tab(cdp: Cdp, session: str, frame: str, url: str, state: _State, time_limit: float) -> Rendered:
    deadline = trio.current_time() + time_limit
    async with trio.open_nursery() as nursery:
        nursery.start_soon(state.pump)
        with trio.move_on_at(deadline - FINISH) as waited:
            state.waiting = waited
            answer = await cdp.send("Page.navigate", {"url": url}, session=session)
            if answer.get("errorText"):
                raise RenderFailed("navigate", str(answer["errorText"]))
            state.navigated(str(answer.get("loaderId", "")))
            await state.loaded.wait()
            with trio.move_on_after(SETTLE_MAX):
                await _settle(cdp, session, frame, state)
        timed_out = waited.cancelled_caught and not state.crashed
        if state.crashed:
            raise RenderFailed("crashed", "the page's renderer died")
        with trio.move_on_at(deadline + FINISH) as finishing:
            if timed_out:  # a script may hold the page's thread: stop it so the DOM can be read
                await cdp.send("Runtime.terminateExecution", session=session)
            html = await _outer_html(cdp, session)
        if finishing.cancelled_caught or html is None:
            raise RenderFailed("timeout", f"no DOM within {time_limit} s")
        nursery.cancel_scope.cancel()
    return Rendered(html=html, served=state.served, refused=dict(state.refused), popups=state.popups,
                    timed_out=timed_out)


async def _settle(cdp: Cdp, session: str, frame: str, state: _State) -> None:
    """Wait for the page to go quiet (see the module's text)."""
    try:
        world = (await cdp.send("Page.createIsolatedWorld", {"frameId": frame, "worldName": "peercrawl-settle"},
                                session=session))["executionContextId"]
    except (CdpError, KeyError):
        world = None  # the page's own world then
    while True:
        await state.quiet(QUIET)
        seen = state.paused
        params: dict[str, Any] = {"expression": _DOM_QUIET, "awaitPromise": True, "returnByValue": True}
        if world is not None:
            params["contextId"] = world
        try:
            await cdp.send("Runtime.evaluate", params, session=session)
        except CdpError:
            return  # the page's world is gone (a navigation of its own): read what there is
        if state.paused == seen and not state.serving:
            return


async def _page_events(cdp: Cdp, session: str) -> None:
    await cdp.send("Page.enable", session=session)
    await cdp.send("Page.setLifecycleEventsEnabled", {"enabled": True}, session=session)


async def _outer_html(cdp: Cdp, session: str) -> str | None:
    document = await cdp.send("DOM.getDocument", {"depth": 0}, session=session)
    root = document.get("root", {}).get("nodeId")
    if root is None:
        return None
    answer = await cdp.send("DOM.getOuterHTML", {"nodeId": root}, session=session)
    html = answer.get("outerHTML")
    return html if isinstance(html, str) else None


def _origin(url: str) -> str:
    """scheme://host[:port] of a URL (the page's storage is its origin's)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].split('?', 1)[0].split('#', 1)[0]}"


def _is_icon(url: str) -> bool:
    """The tab's icon, which the browser asks for on its own: it builds nothing."""
    return url.split("?", 1)[0].endswith("/favicon.ico")


class _State:
    """A tab's events: requests served one at a time (the node's politeness spaces them anyway), the load
    event, a crashed renderer, windows the page opened."""

    def __init__(self, cdp: Cdp, session: str, serve: Serve, max_requests: int) -> None:
        self.cdp = cdp
        self.session = session
        self.serve = serve
        self.max_requests = max_requests
        self.loaded = trio.Event()
        self.loader = ""  # the navigation's loader: the load of another document (about:blank) does not count
        self._loads: set[str] = set()
        self.waiting: trio.CancelScope | None = None  # cancelled when the renderer dies
        self.crashed = False
        self.paused = 0  # requests paused so far
        self.serving = False
        self.served = 0
        self.refused: dict[str, int] = {}
        self.popups = 0
        self.last_request = trio.current_time()
        self._requests = 0

    def navigated(self, loader: str) -> None:
        """The navigation's loader is known: its load event may have come already."""
        self.loader = loader
        if loader in self._loads or not loader:
            self._load()

    def _load(self) -> None:
        self.last_request = max(self.last_request, trio.current_time())
        self.loaded.set()

    async def quiet(self, quiet: float) -> None:
        """Wait until no request has been paused or served for `quiet` seconds."""
        while True:
            wait = self.last_request + quiet - trio.current_time()
            if wait <= 0 and not self.serving:
                return
            await trio.sleep(max(wait, 0.02))

    async def pump(self) -> None:
        while True:
            event = await self.cdp.next_event(self.session)
            await self._on(event)

    async def _on(self, event: Event) -> None:
        method, params = event.method, event.params
        if method == "Fetch.requestPaused":
            self.paused += 1
            self.serving = True
            self.last_request = trio.current_time()
            try:
                await self._paused(params)
            finally:
                self.serving = False
                self.last_request = trio.current_time()
        elif method == "Page.lifecycleEvent":
            if params.get("name") == "load":
                loader = str(params.get("loaderId", ""))
                self._loads.add(loader)
                if self.loader and loader == self.loader:
                    self._load()
        elif method in ("Inspector.targetCrashed", "Target.targetCrashed"):
            self.crashed = True
            self.loaded.set()
            if self.waiting is not None:
                self.waiting.cancel()
        elif method == "Page.windowOpen":  # blocked by the browser's flags; counted
            self.popups += 1
        elif method == "Target.attachedToTarget":
            info = params.get("targetInfo", {})
            if info.get("type") == "page":  # a window the page opened
                self.popups += 1
                await self._quietly("Target.closeTarget", {"targetId": info.get("targetId", "")}, session="")

    async def _paused(self, params: dict[str, Any]) -> None:
        request_id = params.get("requestId", "")
        request = params.get("request", {})
        kind = str(params.get("resourceType", "Other"))
        reason: str | None = None
        answer: Served | str | None = None
        if kind not in SERVED_TYPES or _is_icon(str(request.get("url", ""))):
            reason = "type"
        elif self._requests >= self.max_requests:
            reason = "max-requests"
        else:
            self._requests += 1
            headers = request.get("headers", {})
            answer = await self.serve(BrowserRequest(
                url=str(request.get("url", "")), method=str(request.get("method", "GET")),
                headers={str(k): str(v) for k, v in headers.items()} if isinstance(headers, dict) else {},
                resource_type=kind))
            if isinstance(answer, str):
                reason = answer
        if reason is not None or not isinstance(answer, Served):
            reason = reason or "refused"
            self.refused[reason] = self.refused.get(reason, 0) + 1
            await self._quietly("Fetch.failRequest", {"requestId": request_id, "errorReason": "BlockedByClient"})
            return
        self.served += 1
        await self._quietly("Fetch.fulfillRequest", {
            "requestId": request_id, "responseCode": answer.status,
            "responseHeaders": [{"name": k, "value": v} for k, v in answer.headers],
            "body": base64.b64encode(answer.body).decode("ascii"),
        })

    async def _quietly(self, method: str, params: dict[str, Any], *, session: str | None = None) -> None:
        """A command whose failure changes nothing (the request or window is gone already)."""
        try:
            await self.cdp.send(method, params, session=self.session if session is None else session)
        except CdpError:
            pass
