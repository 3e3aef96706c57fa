"""The node's control endpoint: a small HTTP/1.1 server (h11 over trio) for ``peerctl``, Prometheus and the
dashboard.

Routes are ``(method, path) -> async handler(body: bytes) -> Reply``. Requests are bounded (header size by
h11, body by ``MAX_BODY``, whole request by ``REQUEST_TIMEOUT``) so a stuck or hostile client cannot hold
the node; the endpoint listens on loopback unless the operator says otherwise.

Every request is checked before it reaches a route, because a browser on the operator's machine is a client
too, driven by whatever page it has open (docs/operations.md, "Security model"):

- ``Host`` must name the endpoint as the operator would: an IP literal (the bound address, or any when bound to
  a wildcard address) or ``localhost``, with the bound port. A DNS-rebinding page reaches us under its own name
  and is refused (421).
- ``Origin``, when a browser sends one, must be this endpoint itself; ``Sec-Fetch-Site: cross-site`` is
  refused. A page elsewhere cannot drive the node (403).
- ``Authorization: Bearer <token>`` must carry the node's control token (401 without, compared in constant
  time), except on public routes (``GET /healthz`` for probes, ``GET /`` for a dashboard page that then reads
  the token from its URL fragment and sends the header itself).
- A POST must be ``Content-Type: application/json`` (415): an HTML form or a "simple" cross-site request
  cannot send that without a CORS preflight, which this endpoint never grants.

The token is made at start (``DATA_DIR/control.token``, mode 0600, kept across restarts) unless the operator
sets one; ``peerctl`` reads the same file.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import trio

__all__ = [
    "PUBLIC_ROUTES",
    "TOKEN_FILE",
    "Access",
    "QueryRoute",
    "Reply",
    "json_reply",
    "auth_headers",
    "dashboard_address",
    "load_or_create_token",
    "read_token",
    "serve_control",
]

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20
REQUEST_TIMEOUT = 30.0
TOKEN_FILE = "control.token"
#: Routes served without the token: probes need /healthz, and the dashboard page carries no data of its own.
PUBLIC_ROUTES = frozenset({("GET", "/healthz"), ("GET", "/")})
_LOCAL_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


def load_or_create_token(data_dir: Path, configured: str | None = None) -> str:
    """The control token: `configured` if the operator set one, else the one in DATA_DIR/control.token, made
    (32 random bytes, URL-safe) and written with mode 0600 if there is none. The file always ends up holding
    the token in force, readable by its owner only, so `peerctl --data-dir` and a dashboard link find it."""
    path = data_dir / TOKEN_FILE
    token = configured.strip() if configured else None
    if token is None:
        try:
            existing = path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            existing = ""
        except (OSError, UnicodeDecodeError) as exc:
            raise OSError(f"cannot read the control token {path}: {exc}") from exc
        token = existing if len(existing) >= 32 else secrets.token_urlsafe(32)
    if len(token) < 16 or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError("the control token must be at least 16 printable ASCII characters without spaces")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file keeps its mode through O_CREAT: set it
        os.write(fd, token.encode("ascii") + b"\n")
    finally:
        os.close(fd)
    return token


def auth_headers(data_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The Authorization header for the node whose data dir is `data_dir` (none while it has no token yet)."""
    try:
        token = (Path(data_dir) / TOKEN_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return {}
    return {"authorization": f"Bearer {token}"} if token else {}


def read_token(data_dir: str | os.PathLike[str]) -> str:
    """The running node's control token; OSError if the file cannot be read."""
    return (Path(data_dir) / TOKEN_FILE).read_text(encoding="ascii").strip()


def dashboard_address(address: str, token: str | None) -> str:
    """The dashboard's address for a browser: the control endpoint, the token in the fragment (a browser never
    sends a fragment to a server; the page reads it and sends the token with each API call)."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]", ""):  # listening everywhere: this machine reaches it on loopback
        host = "127.0.0.1"
    return f"http://{host}:{port}/" + (f"#token={token}" if token else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Access:
    """Who may use the endpoint: the token, and what the Host header may say."""

    token: str
    bound_host: str
    port: int
    public: Collection[tuple[str, str]] = field(default=PUBLIC_ROUTES)

    def host_allowed(self, value: str) -> bool:
        host, port = _split_host(value)
        if port is not None and port != self.port:
            return False
        if host.lower() in _LOCAL_NAMES:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a name: what a DNS-rebinding page would send
        bound = self.bound_host.strip("[]")
        try:
            bound_address = ipaddress.ip_address(bound)
        except ValueError:
            return address.is_loopback  # bound by name (localhost): its loopback addresses
        return bound_address.is_unspecified or address == bound_address or (
            bound_address.is_loopback and address.is_loopback
        )

    def origin_allowed(self, origin: str) -> bool:
        scheme, sep, rest = origin.partition("://")
        return scheme == "http" and bool(sep) and "/" not in rest and self.host_allowed(rest)

    def token_ok(self, authorization: str | None) -> bool:
        if not authorization:
            return False
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(value.strip().encode("utf-8", "replace"), self.token.encode("ascii"))


def _split_host(value: str) -> tuple[str, int | None]:
    value = value.strip()
    if value.startswith("["):
        close = value.find("]")
        if close < 0:
            return value, None
        host, rest = value[1:close], value[close + 1 :]
    else:
        host, _, rest = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
        rest = ":" + rest if rest else ""
    if rest.startswith(":") and rest[1:].isascii() and rest[1:].isdigit():
        return host, int(rest[1:])
    return host, None if not rest else -1


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    status: int = 200
    content_type: str = "application/json"
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


def json_reply(obj: Any, status: int = 200) -> Reply:
    return Reply(status=status, body=json.dumps(obj, indent=1, sort_keys=True, default=str).encode() + b"\n")


@dataclass(frozen=True)
class QueryRoute:
    """A GET route that reads its query string (``/cdx?url=...``): `handle` gets it, undecoded."""

    handle: Callable[[str], Awaitable[Reply]]


Handler = Callable[[bytes], Awaitable[Reply]] | QueryRoute


def _refusal(method: str, path: str, req: h11.Request, access: Access | None) -> Reply | None:
    """Why this request may not reach its route (a reply to send instead), or None if it may."""
    if access is None:
        return None
    headers: dict[bytes, str] = {}
    for name, value in req.headers:
        headers.setdefault(name.lower(), value.decode("latin-1"))
    host = headers.get(b"host")
    if host is None or not access.host_allowed(host):
        log.debug("control request refused: Host %r", host)
        return json_reply({"error": f"Host {host!r} is not this endpoint's address; use the address it listens "
                                    "on or localhost"}, 421)
    origin = headers.get(b"origin")
    if (origin is not None and not access.origin_allowed(origin)) or headers.get(b"sec-fetch-site") == "cross-site":
        log.debug("control request refused: Origin %r", origin)
        return json_reply({"error": f"requests from another origin ({origin}) are refused"}, 403)
    if access.token and (method, path) not in access.public and not access.token_ok(headers.get(b"authorization")):
        return Reply(status=401, headers=(("www-authenticate", 'Bearer realm="peercrawl"'),),
                     body=json.dumps({"error": "send Authorization: Bearer <token>; the token is in the node's "
                                               "DATA_DIR/control.token"}).encode() + b"\n")
    if method == "POST":
        ctype = headers.get(b"content-type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            return json_reply({"error": f"a POST must be Content-Type: application/json, got {ctype or 'none'}"},
                              415)
    return None


async def _serve_one(stream: trio.SocketStream, routes: dict[tuple[str, str], Handler],
                     access: Access | None = None) -> None:
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
                method = req.method.decode("ascii", "replace")
                path, _sep, query = req.target.decode("ascii", "replace").partition("?")
                handler = routes.get((method, path))
                reply = _refusal(method, path, req, access)
                if reply is None and handler is None:
                    known = any(p == path for _, p in routes)
                    reply = json_reply({"error": f"{'method not allowed' if known else 'not found'}: {path}"},
                                       405 if known else 404)
                elif reply is None:
                    assert handler is not None  # the branch above took a missing one
                    try:
                        reply = await (handler.handle(query) if isinstance(handler, QueryRoute)
                                       else handler(bytes(body)))
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
        ("x-content-type-options", "nosniff"),
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
    public: Collection[tuple[str, str]] = PUBLIC_ROUTES,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``routes`` on ``host:port``; started() reports the bound port (useful with port 0).

    With a ``token``, every route but the ``public`` ones needs it, and Host, Origin and POST types are
    checked (see the module's docstring); without one, only the Host, Origin and POST checks apply.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    access = Access(token=token or "", bound_host=host, port=bound, public=public)
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, listener, routes, nursery, access)
        task_status.started(bound)


async def _accept_loop(listener: trio.SocketListener, routes, nursery: trio.Nursery, access: Access) -> None:
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE and friends: back off instead of spinning
                log.warning("control accept failed", extra={"error": str(exc)})
                await trio.sleep(0.1)
                continue
            nursery.start_soon(_serve_one, stream, routes, access)
