"""The DevTools message layer (peer/render/cdp.py) and one render's event handling (peer/render/tabs.py), over
trio memory channels: a scripted browser answers commands and sends events, as chromium does."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import trio
import trio.testing

from peer.render.cdp import Cdp, CdpClosed, CdpError, CdpOverflow
from peer.render.tabs import BrowserRequest, RenderFailed, Served, render_in_tab


class Pipe:
    """One side of a message stream made of two memory channels."""

    def __init__(self, send: trio.MemorySendChannel[str], receive: trio.MemoryReceiveChannel[str]) -> None:
        self._send, self._receive = send, receive

    async def send_message(self, message: str) -> None:
        await self._send.send(message)

    async def get_message(self) -> str:
        return await self._receive.receive()


def pipes() -> tuple[Pipe, Pipe, trio.MemorySendChannel[str]]:
    a_send, b_receive = trio.open_memory_channel[str](100)
    b_send, a_receive = trio.open_memory_channel[str](100)
    return Pipe(a_send, a_receive), Pipe(b_send, b_receive), b_send


async def test_answers_are_matched_to_their_commands_in_any_order() -> None:
    node, browser, _ = pipes()
    cdp = Cdp(node)
    async with trio.open_nursery() as nursery:
        await nursery.start(cdp.run)
        results: dict[str, Any] = {}

        async def ask(method: str) -> None:
            results[method] = await cdp.send(method, {"x": method})

        nursery.start_soon(ask, "A.one")
        nursery.start_soon(ask, "B.two")
        first = json.loads(await browser.get_message())
        second = json.loads(await browser.get_message())
        # answered in the reverse order, with garbage between
        await browser.send_message("not json")
        await browser.send_message(json.dumps([1, 2]))
        await browser.send_message(json.dumps({"id": 999, "result": {}}))
        await browser.send_message(json.dumps({"id": second["id"], "result": {"got": second["params"]["x"]}}))
        await browser.send_message(json.dumps({"id": first["id"], "result": {"got": first["params"]["x"]}}))
        await trio.testing.wait_all_tasks_blocked()
        assert results == {"A.one": {"got": "A.one"}, "B.two": {"got": "B.two"}}
        assert cdp.bad_messages == 3
        nursery.cancel_scope.cancel()


async def test_an_error_answer_raises_and_a_closed_stream_fails_every_waiting_command() -> None:
    node, browser, browser_send = pipes()
    cdp = Cdp(node)
    async with trio.open_nursery() as nursery:
        await nursery.start(cdp.run)
        errors: list[CdpError] = []

        async def closes() -> None:
            try:
                await cdp.send("Target.closeTarget")
            except CdpError as exc:
                errors.append(exc)

        nursery.start_soon(closes)
        msg = json.loads(await browser.get_message())
        await browser.send_message(json.dumps({"id": msg["id"], "error": {"code": -32000, "message": "No target"}}))
        await trio.testing.wait_all_tasks_blocked()
        assert [(e.code, str(e)) for e in errors] == [(-32000, "Target.closeTarget: No target (-32000)")]
        failed: list[BaseException] = []

        async def waits() -> None:
            try:
                await cdp.send("Page.navigate", {"url": "http://a/"})
            except CdpClosed as exc:
                failed.append(exc)

        nursery.start_soon(waits)
        await browser.get_message()
        await browser_send.aclose()  # the browser died
        await trio.testing.wait_all_tasks_blocked()
        assert len(failed) == 1 and cdp.closed
        with pytest.raises(CdpClosed):
            await cdp.send("Page.enable")


async def test_events_go_to_their_session_and_an_unread_flood_overflows_it() -> None:
    node, browser, _ = pipes()
    cdp = Cdp(node, session_events=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(cdp.run)
        cdp.listen("S1")
        await browser.send_message(json.dumps({"method": "Page.loadEventFired", "params": {}, "sessionId": "S1"}))
        await browser.send_message(json.dumps({"method": "Page.loadEventFired", "params": {}, "sessionId": "S9"}))
        event = await cdp.next_event("S1")
        assert (event.method, event.session) == ("Page.loadEventFired", "S1")
        for _ in range(5):
            await browser.send_message(json.dumps({"method": "Fetch.requestPaused", "params": {},
                                                   "sessionId": "S1"}))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(CdpOverflow):
            await cdp.next_event("S1")
        nursery.cancel_scope.cancel()


class ScriptedBrowser:
    """A browser that opens a tab, asks for the page, one script and an image, fires the load event half a second
    later, makes a late request (a script's XHR) while the node's first DOM-quiet check runs (each takes 0.1 s of
    the page's time), and hands back the DOM it was given; it records the node's answers to its requests."""

    def __init__(self, pipe: Pipe, dom: str, *, hang: bool = False) -> None:
        self.pipe, self.dom, self.hang = pipe, dom, hang
        self.fulfilled: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        self.methods: list[str] = []
        self.checks = 0

    async def event(self, method: str, params: dict[str, Any]) -> None:
        await self.pipe.send_message(json.dumps({"method": method, "params": params, "sessionId": "S"}))

    async def later(self, seconds: float, message: dict[str, Any]) -> None:
        await trio.sleep(seconds)
        await self.pipe.send_message(json.dumps(message))

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            await self._run(nursery)

    async def _run(self, nursery: trio.Nursery) -> None:
        while True:
            msg = json.loads(await self.pipe.get_message())
            method, ident = msg["method"], msg["id"]
            self.methods.append(method)
            result: dict[str, Any] = {}
            if method == "Target.createBrowserContext":
                result = {"browserContextId": "C"}
            elif method == "Target.createTarget":
                result = {"targetId": "T"}
            elif method == "Target.attachToTarget":
                result = {"sessionId": "S"}
            elif method == "Page.navigate":
                await self.event("Fetch.requestPaused", {"requestId": "1", "resourceType": "Document",
                                                         "request": {"url": msg["params"]["url"], "method": "GET",
                                                                     "headers": {}}})
                await self.event("Fetch.requestPaused", {"requestId": "2", "resourceType": "Script",
                                                         "request": {"url": "http://a/app.js", "method": "GET",
                                                                     "headers": {"Accept": "*/*"}}})
                await self.event("Fetch.requestPaused", {"requestId": "3", "resourceType": "Image",
                                                         "request": {"url": "http://a/i.png", "method": "GET"}})
                await self.event("Page.lifecycleEvent", {"name": "load", "loaderId": "L0"})  # the blank page's
                if not self.hang:
                    nursery.start_soon(self.later, 0.5, {"method": "Page.lifecycleEvent", "sessionId": "S",
                                                         "params": {"name": "load", "loaderId": "L1"}})
                result = {"frameId": "F", "loaderId": "L1"}
            elif method == "Page.createIsolatedWorld":
                result = {"executionContextId": 7}
            elif method == "Runtime.evaluate":
                assert msg["params"]["contextId"] == 7 and msg["params"]["awaitPromise"]
                self.checks += 1
                if self.checks == 1:
                    await self.event("Fetch.requestPaused", {"requestId": "4", "resourceType": "XHR", "request": {
                        "url": "http://a/data.json", "method": "GET", "headers": {}}})
                nursery.start_soon(self.later, 0.1, {"id": ident, "result": {"result": {"value": True}}})
                continue
            elif method == "Fetch.fulfillRequest":
                self.fulfilled.append(msg["params"])
            elif method == "Fetch.failRequest":
                self.failed.append(msg["params"])
            elif method == "DOM.getDocument":
                if self.hang and "Runtime.terminateExecution" not in self.methods:
                    continue  # the page's thread is busy: no answer until its script is stopped
                result = {"root": {"nodeId": 1}}
            elif method == "DOM.getOuterHTML":
                result = {"outerHTML": self.dom}
            await self.pipe.send_message(json.dumps({"id": ident, "result": result}))


async def serve(request: BrowserRequest) -> Served | str:
    if request.url.endswith("app.js"):
        return "robots"
    return Served(status=200, headers=[("content-type", "text/html")], body=b"<p>page</p>")


async def test_a_render_serves_the_page_refuses_by_rule_and_reads_the_dom(autojump_clock: trio.abc.Clock) -> None:
    node, browser_pipe, _ = pipes()
    cdp = Cdp(node)
    browser = ScriptedBrowser(browser_pipe, "<html><a href='/x'>x</a></html>")
    async with trio.open_nursery() as nursery:
        await nursery.start(cdp.run)
        nursery.start_soon(browser.run)
        start = trio.current_time()
        rendered = await render_in_tab(cdp, "http://a/", serve, time_limit=10, max_requests=5)
        assert rendered.html == "<html><a href='/x'>x</a></html>"
        assert rendered.served == 2 and rendered.refused == {"robots": 1, "type": 1} and not rendered.timed_out
        assert [base64.b64decode(f["body"]) for f in browser.fulfilled] == [b"<p>page</p>"] * 2
        assert {f["requestId"] for f in browser.failed} == {"2", "3"}
        # the navigation's load (not the blank page's before it) at 0.5, quiet 0.2, a DOM check that saw the late
        # request (0.7 to 0.8), quiet again from that request (to 0.9), a DOM check that saw none (to 1.0)
        assert browser.checks == 2
        assert trio.current_time() - start == pytest.approx(0.5 + 0.2 + 0.1 + 0.1 + 0.1)
        assert browser.methods[-2:] == ["Target.closeTarget", "Target.disposeBrowserContext"]
        nursery.cancel_scope.cancel()


async def test_a_page_that_never_loads_is_stopped_at_its_time_limit(autojump_clock: trio.abc.Clock) -> None:
    node, browser_pipe, _ = pipes()
    cdp = Cdp(node)
    browser = ScriptedBrowser(browser_pipe, "<html>partial</html>", hang=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(cdp.run)
        nursery.start_soon(browser.run)
        start = trio.current_time()
        rendered = await render_in_tab(cdp, "http://a/", serve, time_limit=10, max_requests=5)
        assert rendered.timed_out and rendered.html == "<html>partial</html>"
        assert trio.current_time() - start == pytest.approx(10 - 2.0)
        assert "Runtime.terminateExecution" in browser.methods
        nursery.cancel_scope.cancel()


async def test_a_browser_that_dies_mid_render_fails_the_render(autojump_clock: trio.abc.Clock) -> None:
    node, browser_pipe, browser_send = pipes()
    cdp = Cdp(node)
    async with trio.open_nursery() as nursery:
        await nursery.start(cdp.run)

        async def dies() -> None:
            await browser_pipe.get_message()
            await browser_send.aclose()

        nursery.start_soon(dies)
        with pytest.raises(RenderFailed) as failed:
            await render_in_tab(cdp, "http://a/", serve, time_limit=10, max_requests=5)
        assert failed.value.kind == "browser"
