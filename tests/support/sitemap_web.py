"""A small HTTP/1.1 server on loopback for the sitemap tests: fixed routes, bodies that may be generated
while they are sent (a million-URL sitemap is never built in memory), and a log of every request path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import h11
import trio

__all__ = ["Route", "SitemapWeb", "serve_sitemap_web"]

Body = bytes | Callable[[], AsyncIterator[bytes]]


@dataclass
class Route:
    status: int = 200
    body: Body = b""
    content_type: str = "text/html"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class SitemapWeb:
    routes: dict[str, Route]
    port: int = 0
    log: list[str] = field(default_factory=list)
    bytes_sent: dict[str, int] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    conn.receive_data(data)
                    if not data:
                        return
                    continue
                if isinstance(event, h11.Request):
                    path = event.target.decode("ascii")
                    self.log.append(path)
                    await self._answer(conn, stream, path)
                    if conn.our_state is not h11.DONE:
                        return
                elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    if event is h11.PAUSED and conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                        conn.start_next_cycle()
                        continue
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError,
                h11.LocalProtocolError):
            return
        finally:
            await stream.aclose()

    async def _answer(self, conn: h11.Connection, stream: trio.SocketStream, path: str) -> None:
        route = self.routes.get(path) or Route(404, b"not here", "text/plain")
        headers = [("content-type", route.content_type), *route.headers]
        if isinstance(route.body, bytes):
            headers.append(("content-length", str(len(route.body))))
        else:
            headers.append(("transfer-encoding", "chunked"))
        await stream.send_all(conn.send(h11.Response(status_code=route.status, headers=headers)))
        sent = 0
        if isinstance(route.body, bytes):
            await stream.send_all(conn.send(h11.Data(data=route.body)))
            sent = len(route.body)
        else:
            async for piece in route.body():
                await stream.send_all(conn.send(h11.Data(data=piece)))
                sent += len(piece)
                self.bytes_sent[path] = sent
        self.bytes_sent[path] = sent
        await stream.send_all(conn.send(h11.EndOfMessage()))


async def serve_sitemap_web(routes: dict[str, Route], *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    web = SitemapWeb(routes)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    web.port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, web.handle, listeners)
        task_status.started(web)
