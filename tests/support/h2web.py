"""A small HTTP/2 web over TLS on loopback, written with the `h2` library over trio: well-behaved by default,
hostile on request. Each path is a behaviour:

- ``/``: an index linking every path below and ``/ok`` (a small page without links);
- any other path: 200 with ``PAGE`` (gzip if ``?enc=gzip``), ``/big``: ``BIG`` bytes in many DATA frames,
  ``/bomb``: a gzip body that inflates to 256 MiB;
- ``/settings-flood``, ``/ping-flood``: a million SETTINGS (or PING) frames before an answer that never comes;
- ``/huge-header``: a response header block of 1 MiB (one header, split over CONTINUATION frames);
- ``/endless-continuation``: HEADERS without END_HEADERS, then CONTINUATION frames until the client leaves;
- ``/reset``: RST_STREAM (INTERNAL_ERROR) on every request; ``/refuse``: REFUSED_STREAM;
- ``/goaway``: GOAWAY naming stream 0 (the request was not processed), then close.

``serve_h2web(server_context, task_status=...)`` reports an `H2Web` with the port and a log of (host, path, alpn).
The server offers ALPN ``h2`` and ``http/1.1``; an HTTP/1.1 client gets a minimal 200 over HTTP/1.1, or with
``h2_only`` a closed connection.
"""

from __future__ import annotations

import functools
import gzip
import ssl
import struct
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import hpack
import trio

__all__ = ["BIG", "HOSTILE_PATHS", "OK_PAGE", "PAGE", "H2Web", "serve_h2web"]

PAGE = b"<html><body>" + b"".join(b"<a href='/p%d'>link %d</a>\n" % (i, i) for i in range(600)) + b"</body></html>"
BIG = 3 * 2**20
HOSTILE_PATHS = ("/settings-flood", "/ping-flood", "/huge-header", "/endless-continuation", "/reset", "/refuse",
                 "/goaway")
OK_PAGE = b"<html><body><p>fine</p></body></html>"
INDEX = (b"<html><body>" + b"".join(b"<a href='%s'>%s</a>\n" % (p.encode(), p.encode()) for p in HOSTILE_PATHS)
         + b"<a href='/ok'>ok</a></body></html>")


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


@functools.cache
def _bomb() -> bytes:
    from tests.support.hostile import BOMB_SIZE, _gzip_layers

    return _gzip_layers(BOMB_SIZE, 1)


@dataclass
class H2Web:
    port: int = 0
    h2_only: bool = False
    log: list[tuple[str, str, str]] = field(default_factory=list)
    connections: int = 0
    active: int = 0
    max_active_streams: int = 0
    sent_frames: int = 0

    async def handle(self, stream: trio.SSLStream) -> None:
        self.connections += 1
        try:
            await stream.do_handshake()
            alpn = stream.selected_alpn_protocol()
            if alpn != "h2":
                if not self.h2_only:
                    await self._h1(stream)
                return  # an HTTP/2-only server: nothing for a client that did not offer h2
                return
            await self._h2(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            pass
        finally:
            with trio.move_on_after(1):
                await stream.aclose()

    async def _h1(self, stream: trio.SSLStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        line = data.split(b"\r\n", 1)[0].decode()
        host = next((v.strip() for k, _, v in (h.partition(":") for h in data.decode().split("\r\n")[1:])
                     if k.lower() == "host"), "")
        self.log.append((host, line.split(" ")[1], "http/1.1"))
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(PAGE) + PAGE)

    async def _h2(self, stream: trio.SSLStream) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        await stream.send_all(conn.data_to_send())
        open_streams: set[int] = set()
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    headers = dict(event.headers)
                    path = headers[b":path"].decode()
                    self.log.append((headers[b":authority"].decode(), path, "h2"))
                    open_streams.add(event.stream_id)
                    self.max_active_streams = max(self.max_active_streams, len(open_streams))
                    if await self._respond(conn, stream, event.stream_id, path) is False:
                        return
                    open_streams.discard(event.stream_id)
            out = conn.data_to_send()
            if out:
                await stream.send_all(out)

    async def _respond(self, conn: h2.connection.H2Connection, stream: trio.SSLStream, sid: int,
                       path: str) -> bool | None:
        name = path.split("?")[0]
        if name == "/settings-flood" or name == "/ping-flood":
            await stream.send_all(conn.data_to_send())
            if name == "/settings-flood":
                one = _frame(0x4, 0, 0, struct.pack(">HI", 0x3, 100))  # SETTINGS MAX_CONCURRENT_STREAMS
            else:
                one = _frame(0x6, 0, 0, b"12345678")
            block = one * 1000
            for _ in range(1000):
                await stream.send_all(block)
                self.sent_frames += 1000
            return False
        if name == "/huge-header":
            await stream.send_all(conn.data_to_send())
            block = hpack.Encoder().encode([(b":status", b"200"), (b"x-huge", b"a" * 2**20)], huffman=False)
            pieces = [block[i:i + 16384] for i in range(0, len(block), 16384)]
            frames = [_frame(0x1, 0x1 | (0x4 if len(pieces) == 1 else 0), sid, pieces[0])]  # END_STREAM
            frames += [_frame(0x9, 0x4 if i == len(pieces) - 1 else 0, sid, p) for i, p in enumerate(pieces[1:], 1)]
            for frame in frames:
                await stream.send_all(frame)
            return False
        if name == "/endless-continuation":
            await stream.send_all(conn.data_to_send())
            # :status 200, literal without indexing, then CONTINUATION frames of a never-ending header value
            await stream.send_all(_frame(0x1, 0, sid, b"\x88"))
            piece = _frame(0x9, 0, sid, b"\x00\x01a\x7f" + b"\x00" * 16000)
            for _ in range(10_000):
                await stream.send_all(piece)
                self.sent_frames += 1
            return False
        if name == "/reset":
            conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
            await stream.send_all(conn.data_to_send())
            return None
        if name == "/refuse":
            conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            await stream.send_all(conn.data_to_send())
            return None
        if name == "/goaway":
            conn.close_connection(h2.errors.ErrorCodes.NO_ERROR, last_stream_id=0)
            await stream.send_all(conn.data_to_send())
            return False
        if name == "/bomb":
            conn.send_headers(sid, [(b":status", b"200"), (b"content-type", b"text/html"),
                                    (b"content-encoding", b"gzip")])
            await self._send_body(conn, stream, sid, _bomb())
            return None
        body = {"/big": BIG * b"x", "/": INDEX, "/ok": OK_PAGE, "/robots.txt": b"User-agent: *\nAllow: /\n"}.get(
            name, PAGE)
        headers = [(b":status", b"200"), (b"content-type", b"text/html")]
        if path.endswith("enc=gzip"):
            body = gzip.compress(body)
            headers.append((b"content-encoding", b"gzip"))
        conn.send_headers(sid, headers)
        await self._send_body(conn, stream, sid, body)
        return None

    async def _send_body(self, conn: h2.connection.H2Connection, stream: trio.SSLStream, sid: int,
                         body: bytes) -> None:
        """Send ``body`` as flow control allows, waiting for WINDOW_UPDATEs as a real server does."""
        view = memoryview(body)
        while True:
            window = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if window > 0 and view:
                piece, view = view[:window], view[window:]
                conn.send_data(sid, bytes(piece), end_stream=not view)
                await stream.send_all(conn.data_to_send())
                continue
            if not view:
                if body == b"":
                    conn.end_stream(sid)
                    await stream.send_all(conn.data_to_send())
                return
            data = await stream.receive_some(65536)
            if not data:
                return
            conn.receive_data(data)
            out = conn.data_to_send()
            if out:
                await stream.send_all(out)


async def serve_h2web(server_context: ssl.SSLContext, *, h2_only: bool = False,
                      task_status: trio.TaskStatus[H2Web] = trio.TASK_STATUS_IGNORED) -> None:
    server_context.set_alpn_protocols(["h2", "http/1.1"])
    web = H2Web(h2_only=h2_only)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    web.port = listeners[0].socket.getsockname()[1]

    async def handler(sock: trio.SocketStream) -> None:
        await web.handle(trio.SSLStream(sock, server_context, server_side=True))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        task_status.started(web)
