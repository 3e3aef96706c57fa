"""The node's control endpoint: a small HTTP/1.1 server (h11 over trio) for ``peerctl`` and Prometheus.

Routes are ``(method, path) -> async handler(body: bytes) -> Reply``. Requests are bounded (header size by
h11, body by ``MAX_BODY``, whole request by ``REQUEST_TIMEOUT``) so a stuck or hostile client cannot hold
the node; the endpoint listens on loopback unless the operator says otherwise.

Access: the node writes a fresh random token to ``DATA_DIR/control.token`` (mode 0600) at every start, and every
request must carry ``Authorization: Bearer <token>`` except the routes served in the open: the dashboard page
(``GET /``, static, it holds no data: its script reads the token from the address's fragment, which never
reaches the server, and sends it with each call), the liveness probe ``GET /healthz`` and Prometheus'
``GET /metrics`` (counters only; nothing there changes the node).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import trio

__all__ = ["OPEN_ROUTES", "TOKEN_FILE", "Reply", "dashboard_address", "json_reply", "read_token", "serve_control",
           "write_token"]

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
REQUEST_TIMEOUT = 30.0
#: The control token's file in the data directory.
TOKEN_FILE = "control.token"
#: Routes served without the token: the static dashboard page, the liveness probe, Prometheus' scrape.
OPEN_ROUTES = frozenset({("GET", "/"), ("GET", "/healthz"), ("GET", "/metrics")})


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    status: int = 200
    content_type: str = "application/json"
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


def write_token(data_dir: Path) -> str:
    """A fresh random token, written to ``data_dir/control.token`` readable by its owner only (0600)."""
    token = secrets.token_urlsafe(32)
    path = Path(data_dir) / TOKEN_FILE
    tmp = path.with_name(TOKEN_FILE + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file of that name may have had other bits
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return token


def read_token(data_dir: Path | str) -> str:
    """The running node's control token; OSError if the file cannot be read."""
    return (Path(data_dir) / TOKEN_FILE).read_text().strip()


def dashboard_address(address: str, token: str | None) -> str:
    """The dashboard's address for a browser: the control endpoint, the token in the fragment (never sent)."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]", ""):  # listening everywhere: this machine reaches it on loopback
        host = "127.0.0.1"
    return f"http://{host}:{port}/" + (f"#token={token}" if token else "")


def _authorized(req: h11.Request, token: str) -> bool:
    for name, value in req.headers:
        if name == b"authorization":
            scheme, _, given = value.decode("latin-1").partition(" ")
            return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
    return False


def json_reply(obj: Any, status: int = 200) -> Reply:
    return Reply(status=status, body=json.dumps(obj, indent=1, sort_keys=True, default=str).encode() + b"\n")


Handler = Callable[[bytes], Awaitable[Reply]]


async def _serve_one(stream: trio.SocketStream, routes: dict[tuple[str, str], Handler], token: str | None) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
    try:
        with trio.fail_after(REQUEST_TIMEOUT):
            while True:
                req = None
                body = bytearray()
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        if not data and conn.their_state is h11.IDLE:
                            return
                        conn.receive_data(data)
                        continue
                    if isinstance(event, h11.Request):
                        req = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                        if len(body) > MAX_BODY:
                            raise h11.RemoteProtocolError("request body too large", error_status_hint=413)
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                assert req is not None
                method = req.method.decode()
                path = req.target.decode().split("?", 1)[0]
                handler = routes.get((method, path))
                if token is not None and (method, path) not in OPEN_ROUTES and not _authorized(req, token):
                    reply = json_reply({"error": "unauthorized: send 'Authorization: Bearer TOKEN' with the token in "
                                        f"the node's DATA_DIR/{TOKEN_FILE}"}, 401)
                    reply = Reply(status=401, body=reply.body, headers=(("www-authenticate", "Bearer"),))
                elif handler is None:
                    known = any(p == path for _, p in routes)
                    reply = json_reply({"error": f"{'method not allowed' if known else 'not found'}: {path}"},
                                       405 if known else 404)
                else:
                    try:
                        reply = await handler(bytes(body))
                    except Exception as exc:  # a handler bug must not take the node down
                        log.exception("control handler failed", extra={"path": path})
                        reply = json_reply({"error": f"{type(exc).__name__}: {exc}"}, 500)
                await _send(stream, conn, reply)
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
    except h11.RemoteProtocolError as exc:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                await _send(stream, conn, json_reply({"error": str(exc)}, exc.error_status_hint))
            except (trio.BrokenResourceError, h11.LocalProtocolError):
                pass
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def _send(stream: trio.SocketStream, conn: h11.Connection, reply: Reply) -> None:
    headers = [
        ("content-type", reply.content_type),
        ("content-length", str(len(reply.body))),
        ("server", "peercrawl-control"),
        ("cache-control", "no-store"),
        *reply.headers,
    ]
    data = conn.send(h11.Response(status_code=reply.status, headers=headers))
    data += conn.send(h11.Data(data=reply.body)) + conn.send(h11.EndOfMessage())
    await stream.send_all(data)


async def serve_control(
    host: str,
    port: int,
    routes: dict[tuple[str, str], Handler],
    *,
    token: str | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``routes`` on ``host:port``; started() reports the bound port (useful with port 0). With a ``token``,
    every route but ``OPEN_ROUTES`` answers 401 to a request without ``Authorization: Bearer <token>``."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, routes, token, nursery)
        task_status.started(bound)


async def _accept_loop(listener: trio.SocketListener, routes, token: str | None, nursery: trio.Nursery) -> None:
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE and friends: back off instead of spinning
                log.warning("control accept failed", extra={"error": str(exc)})
                await trio.sleep(0.1)
                continue
            nursery.start_soon(_serve_one, stream, routes, token)
