"""One render: a page opened in a tab of its own (in a browser context of its own: no cookie or storage crosses
from one render to the next), every request of the tab paused and handed to the node (``Fetch`` domain), the
DOM read once the page has loaded and its requests have settled, the tab and its context closed.

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

__all__ = ["BrowserRequest", "RenderFailed", "Rendered", "Served", "render_in_tab"]

log = logging.getLogger(__name__)

#: The requests the browser's page makes that the node serves; images, media, fonts, style sheets and the tab's
#: icon build no links or text, so they are refused without a fetch (the politeness budget goes to what builds
#: the page).
SERVED_TYPES = frozenset({"Document", "Script", "XHR", "Fetch", "Other"})
#: After the load event and the browser's network idle, the render waits this long without a request before it
#: reads the DOM.
SETTLE = 0.3
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


async def render_in_tab(cdp: Cdp, url: str, serve: Serve, *, time_limit: float,
                        max_requests: int) -> Rendered:
    """Render `url` in a new tab of `cdp`'s browser (see the module's text); raises `RenderFailed`."""
    try:
        context = (await cdp.send("Target.createBrowserContext", {"disposeOnDetach": True}))["browserContextId"]
    except (CdpError, CdpClosed, KeyError) as exc:
        raise RenderFailed("browser", str(exc)) from exc
    try:
        return await _render_in_context(cdp, context, url, serve, time_limit=time_limit, max_requests=max_requests)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(FINISH):
            try:
                await cdp.send("Target.disposeBrowserContext", {"browserContextId": context})
            except (CdpError, CdpClosed):
                pass


async def _render_in_context(cdp: Cdp, context: str, url: str, serve: Serve, *, time_limit: float,
                             max_requests: int) -> Rendered:
    try:
        target = (await cdp.send("Target.createTarget", {"url": "about:blank", "browserContextId": context}))[
            "targetId"]
        session = (await cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
    except (CdpError, CdpClosed, KeyError) as exc:
        raise RenderFailed("browser", str(exc)) from exc
    cdp.listen(session)
    state = _State(cdp, session, serve, max_requests)
    try:
        return await _one_error(_run_tab(cdp, session, url, state, time_limit))
    except (CdpError, CdpClosed, CdpOverflow) as exc:
        if state.crashed:
            raise RenderFailed("crashed", "the page's renderer died") from exc
        raise RenderFailed("browser", str(exc)) from exc
    finally:
        cdp.forget(session)
        with trio.CancelScope(shield=True), trio.move_on_after(FINISH):
            try:
                await cdp.send("Target.closeTarget", {"targetId": target})
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


async def _run_tab(cdp: Cdp, session: str, url: str, state: _State, time_limit: float) -> Rendered:
    deadline = trio.current_time() + time_limit
    async with trio.open_nursery() as nursery:
        nursery.start_soon(state.pump)
        async with trio.open_nursery() as setup:  # the set-up commands at once
            setup.start_soon(partial(cdp.send, "Fetch.enable", {"patterns": [
                {"urlPattern": "*", "requestStage": "Request"}]}, session=session))
            setup.start_soon(_page_events, cdp, session)
            setup.start_soon(partial(cdp.send, "Target.setAutoAttach", {
                "autoAttach": True, "waitForDebuggerOnStart": False, "flatten": True}, session=session))
        with trio.move_on_at(deadline - FINISH) as waited:
            answer = await cdp.send("Page.navigate", {"url": url}, session=session)
            if answer.get("errorText"):
                raise RenderFailed("navigate", str(answer["errorText"]))
            state.loader = str(answer.get("loaderId", ""))
            await state.loaded.wait()
            await state.idle.wait()  # the browser's own "network idle": 500 ms without a request in flight
            await state.settled(SETTLE)
        timed_out = waited.cancelled_caught
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
        self.idle = trio.Event()
        self.loader = ""  # the navigation's loader: the idle of the first, blank document does not count
        self.crashed = False
        self.served = 0
        self.refused: dict[str, int] = {}
        self.popups = 0
        self.last_request = trio.current_time()
        self._requests = 0

    async def settled(self, quiet: float) -> None:
        """Wait until no request has been paused for `quiet` seconds."""
        while True:
            wait = self.last_request + quiet - trio.current_time()
            if wait <= 0:
                return
            await trio.sleep(wait)

    async def pump(self) -> None:
        while True:
            event = await self.cdp.next_event(self.session)
            await self._on(event)

    async def _on(self, event: Event) -> None:
        method, params = event.method, event.params
        if method == "Fetch.requestPaused":
            self.last_request = trio.current_time()
            await self._paused(params)
            self.last_request = trio.current_time()
        elif method == "Page.loadEventFired":
            self.loaded.set()
        elif method == "Page.lifecycleEvent":
            if params.get("name") == "networkIdle" and self.loader and params.get("loaderId") == self.loader:
                self.idle.set()
        elif method in ("Inspector.targetCrashed", "Target.targetCrashed"):
            self.crashed = True
            self.loaded.set()
            self.idle.set()
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
