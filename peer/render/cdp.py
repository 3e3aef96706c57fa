"""The DevTools protocol's message layer: JSON commands with ids, their answers matched, events routed by session.

A `Cdp` runs over any `MessageStream` (a websocket in a node, a trio memory channel pair in the unit tests): one
reader task (`run`) takes every message the browser sends; a command (`send`) waits for the answer with its id;
an event goes to the queue of its session (flat sessions: ``Target.attachToTarget`` with ``flatten``), which the
session's owner reads with `events`. A session's queue is bounded: a page that makes the browser send more
events than its owner reads (a flood of requests) overflows it, and the session's next read raises
`CdpOverflow`, so a hostile page costs its render, never the node's memory.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

__all__ = ["Cdp", "CdpClosed", "CdpError", "CdpOverflow", "Event", "MessageStream", "MAX_MESSAGE"]

#: The longest message taken from the browser: a rendered DOM of 10 MiB in JSON, with room to spare.
MAX_MESSAGE = 64 * 2**20
#: Events a session may have waiting before it is declared overflowed.
SESSION_EVENTS = 4096


class CdpError(Exception):
    """The browser answered a command with an error (its code and message)."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        super().__init__(f"{method}: {error.get('message', error)} ({error.get('code')})")
        self.method = method
        self.code = error.get("code")


class CdpClosed(Exception):
    """The connection to the browser is gone (it died, or it was closed): every waiting command gets this."""


class CdpOverflow(Exception):
    """A session's events were not read as fast as the browser sent them."""


class MessageStream(Protocol):
    """Whole text messages both ways: trio-websocket's connection has this shape."""

    async def send_message(self, message: str) -> None: ...

    async def get_message(self) -> str | bytes: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One event of the browser: its method, its parameters, the session it belongs to ("" : the browser's)."""

    method: str
    params: dict[str, Any]
    session: str = ""


@dataclass(slots=True)
class _Queue:
    events: deque[Event] = field(default_factory=deque)
    ready: trio.Event = field(default_factory=trio.Event)
    overflowed: bool = False


class Cdp:
    """One DevTools connection (see the module's text). `run` must be running for `send` to get answers."""

    def __init__(self, stream: MessageStream, *, session_events: int = SESSION_EVENTS) -> None:
        self._stream = stream
        self._next_id = 0
        self._waiting: dict[int, tuple[str, trio.Event, list[Any]]] = {}
        self._queues: dict[str, _Queue] = {}
        self._session_events = session_events
        self._closed: BaseException | None = None
        self._send_lock = trio.Lock()
        self.messages_in = 0
        self.bad_messages = 0

    @property
    def closed(self) -> bool:
        return self._closed is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read every message until the stream ends; then every waiting command fails with `CdpClosed`."""
        task_status.started()
        try:
            while True:
                try:
                    raw = await self._stream.get_message()
                except trio.Cancelled:
                    raise
                except Exception as exc:  # the websocket closed, the browser died
                    self._close(CdpClosed(f"connection to the browser ended: {exc!r}"))
                    return
                self.receive(raw)
        finally:
            self._close(CdpClosed("the connection's reader stopped"))

    def receive(self, raw: str | bytes) -> None:
        """One message from the browser: an answer wakes its command, an event goes to its session's queue.
        Garbage (not JSON, not an object, an id nobody waits for) is counted and dropped."""
        self.messages_in += 1
        if len(raw) > MAX_MESSAGE:
            self.bad_messages += 1
            return
        try:
            message = json.loads(raw)
        except ValueError:
            self.bad_messages += 1
            return
        if not isinstance(message, dict):
            self.bad_messages += 1
            return
        ident = message.get("id")
        if isinstance(ident, int):
            waiter = self._waiting.pop(ident, None)
            if waiter is None:
                self.bad_messages += 1
                return
            _method, done, box = waiter
            box.append(message)
            done.set()
            return
        method = message.get("method")
        params = message.get("params", {})
        session = message.get("sessionId", "")
        if not isinstance(method, str) or not isinstance(params, dict) or not isinstance(session, str):
            self.bad_messages += 1
            return
        queue = self._queues.get(session)
        if queue is None:
            return  # a session nobody listens to (the browser's own, or one closed already)
        if len(queue.events) >= self._session_events:
            queue.overflowed = True
        else:
            queue.events.append(Event(method=method, params=params, session=session))
        queue.ready.set()

    async def send(self, method: str, params: dict[str, Any] | None = None, *, session: str = "") -> dict[str, Any]:
        """Send one command and wait for its answer's ``result``; raises `CdpError` or `CdpClosed`."""
        if self._closed is not None:
            raise CdpClosed(str(self._closed))
        self._next_id += 1
        ident = self._next_id
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        done = trio.Event()
        box: list[Any] = []
        self._waiting[ident] = (method, done, box)
        try:
            async with self._send_lock:
                try:
                    await self._stream.send_message(json.dumps(message))
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    self._close(CdpClosed(f"connection to the browser ended: {exc!r}"))
            await done.wait()
        finally:
            self._waiting.pop(ident, None)
        answer = box[0]
        if isinstance(answer, BaseException):
            raise CdpClosed(str(answer)) from answer
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {"message": str(answer["error"])}
            raise CdpError(method, error)
        result = answer.get("result", {})
        return result if isinstance(result, dict) else {}

    def listen(self, session: str) -> None:
        """Keep the events of `session` ("" : the browser's own) from now on, for `events`."""
        self._queues.setdefault(session, _Queue())

    def drain(self, session: str) -> None:
        """Drop the events of `session` waiting now (and its overflow): what comes next starts afresh."""
        queue = self._queues.get(session)
        if queue is not None:
            queue.events.clear()
            queue.overflowed = False

    def forget(self, session: str) -> None:
        """Stop keeping `session`'s events (its target is closed)."""
        queue = self._queues.pop(session, None)
        if queue is not None:
            queue.ready.set()

    async def next_event(self, session: str) -> Event:
        """The next event of a session `listen` was called for; raises `CdpOverflow` or `CdpClosed`."""
        queue = self._queues.get(session)
        if queue is None:
            raise CdpClosed(f"no listener for session {session!r}")
        while True:
            if queue.overflowed:
                raise CdpOverflow(f"session {session!r}: more than {self._session_events} events waiting")
            if queue.events:
                return queue.events.popleft()
            if self._closed is not None:
                raise CdpClosed(str(self._closed))
            if self._queues.get(session) is not queue:
                raise CdpClosed(f"session {session!r} forgotten")
            queue.ready = trio.Event()
            await queue.ready.wait()

    async def events(self, session: str) -> AsyncIterator[Event]:
        while True:
            yield await self.next_event(session)

    def _close(self, exc: BaseException) -> None:
        if self._closed is None:
            self._closed = exc
        for _method, done, box in self._waiting.values():
            box.append(exc)
            done.set()
        self._waiting.clear()
        for queue in self._queues.values():
            queue.ready.set()
