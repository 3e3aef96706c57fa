"""Keep-alive HTTP/1.1 connections and the per-origin pool the fetcher draws them from.

The pool is keyed by origin (scheme, host, port) and bounds both the connections in use per origin (one by
default: politeness) and the idle ones kept for reuse, per origin and in total, so a crawl over a million
hosts does not hold a million sockets. Bookkeeping is O(1) per request: an origin's slot is a semaphore,
idle connections sit in a per-origin list and in one insertion-ordered dict that is the global LRU.

Idle connections expire as data, not by a timer task: every take and every return of a connection first
closes those idle longer than the idle timeout (oldest first, so the cost is the number closed), as
httpcore does on each request. A pool nobody uses keeps its idle sockets until its next use or its close.
"""

from __future__ import annotations

import resource
import socket
import ssl

import trio

from peer.fetch.h2client import H2Session
from peer.fetch.proxies import Proxy, ProxyError, http_connect, proxy_address, socks5_connect

__all__ = ["Connection", "ConnectionPool", "Origin", "OriginKey", "default_max_idle_total", "open_connection"]

OriginKey = tuple[str, str, int]  # (scheme, host, port)


class Connection:
    """One TCP (or TLS) connection; `max_head` bounds each response head read on it (`peer.fetch.h1`)."""

    __slots__ = ("absolute_form", "h2", "idle_since", "ip", "key", "max_head", "proxy", "proxy_headers", "raw",
                 "requests", "sock", "stream", "tls")

    def __init__(
        self,
        key: OriginKey,
        raw: socket.socket,
        sock: trio.socket.SocketType,
        stream: trio.abc.Stream,
        ip: str,
        tls: bool,
        max_head: int,
    ) -> None:
        self.key = key
        self.raw = raw  # the stdlib socket, for a cheap liveness peek
        self.sock = sock
        self.stream = stream
        self.max_head = max_head
        self.ip = ip
        self.tls = tls
        self.idle_since = 0.0
        self.requests = 0  # completed exchanges on this connection
        self.h2: H2Session | None = None  # HTTP/2 when the server chose it by ALPN
        self.proxy: Proxy | None = None
        self.absolute_form = False  # plain HTTP through an HTTP proxy: absolute-form targets
        self.proxy_headers: list[tuple[str, str]] = []  # sent to that proxy with each request, never recorded

    @property
    def protocol(self) -> str:
        """The ALPN name of what the connection speaks: ``h2`` or ``http/1.1``."""
        return "http/1.1" if self.h2 is None else "h2"

    def close(self) -> None:
        """Close at once (no TLS close_notify: the peer learns from the FIN)."""
        self.sock.close()

    async def send_all(self, data: bytes) -> None:
        """Send ``data``; raises trio.BrokenResourceError if the connection is gone."""
        if self.tls:
            await self.stream.send_all(data)
            return
        # Plain TCP: a request fits the socket buffer, so one non-blocking send almost always does it all.
        try:
            sent = self.raw.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"send failed: {exc}") from exc
        if sent < len(data):
            await self.stream.send_all(memoryview(data)[sent:])

    async def receive_some(self, max_bytes: int) -> bytes | bytearray:
        """Up to ``max_bytes`` (b"" at end of stream); always a checkpoint; raises trio.BrokenResourceError."""
        if self.tls:
            return await self.stream.receive_some(max_bytes)
        raw = self.raw
        try:
            try:
                data = raw.recv(max_bytes)
            except BlockingIOError:
                while True:
                    await trio.lowlevel.wait_readable(raw)
                    try:
                        return raw.recv(max_bytes)
                    except BlockingIOError:
                        continue  # a spurious wake-up
            await trio.lowlevel.checkpoint()  # data was waiting: still let others run and cancellation in
            return data
        except OSError as exc:
            raise trio.BrokenResourceError(f"receive failed: {exc}") from exc

    def looks_alive(self) -> bool:
        """False if the server has closed an idle connection (or, for plain HTTP, sent unasked-for bytes)."""
        try:
            data = self.raw.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        # TLS 1.3 servers may send session tickets after the handshake: bytes waiting are fine there.
        return bool(data) and self.tls


async def open_connection(
    key: OriginKey, ip: str, host: str, ssl_context: ssl.SSLContext | None, max_head: int,
    proxy: Proxy | None = None,
) -> Connection:
    """Connect to ``ip`` (already resolved and checked: no second look-up), with TLS and SNI for ``host`` if given
    a context; HTTP/2 when the context offers it by ALPN and the server chooses it. Through ``proxy`` when given:
    a tunnel to ``ip`` (or, for ``socks5h``, to ``host``), or for plain HTTP through an HTTP proxy, a connection
    to the proxy that carries absolute-form requests.

    Raises OSError (connect), ssl.SSLError / trio.BrokenResourceError (TLS handshake), ProxyError (the proxy
    failed) or ProxyRefused (the proxy would not open the tunnel).
    """
    if proxy is None:
        family, where = (socket.AF_INET6 if ":" in ip else socket.AF_INET), (ip, key[2])
    else:
        family, proxy_ip = await proxy_address(proxy)
        where = (proxy_ip, proxy.port)
    raw = socket.socket(family, socket.SOCK_STREAM)
    raw.setblocking(False)
    sock = trio.socket.from_stdlib_socket(raw)
    absolute_form = False
    try:
        try:
            await sock.connect(where)
        except OSError as exc:
            if proxy is None:
                raise
            raise ProxyError(f"cannot connect to proxy {proxy.url}: {exc.strerror or exc}") from exc
        stream: trio.abc.Stream = trio.SocketStream(sock)  # sets TCP_NODELAY
        if proxy is not None:
            try:
                if proxy.scheme == "http":
                    if ssl_context is None:
                        absolute_form = True
                    else:
                        await http_connect(stream, proxy, ip, key[2])
                else:
                    await socks5_connect(stream, proxy, host if proxy.remote_dns else ip, key[2])
            except (trio.BrokenResourceError, OSError) as exc:
                raise ProxyError(f"proxy {proxy.url} broke the connection during its handshake") from exc
        if ssl_context is not None:
            tls_stream = trio.SSLStream(stream, ssl_context, server_hostname=host, https_compatible=True)
            await tls_stream.do_handshake()
            stream = tls_stream
    except BaseException:
        sock.close()
        raise
    conn = Connection(key, raw, sock, stream, ip, ssl_context is not None, max_head)
    if ssl_context is not None and stream.selected_alpn_protocol() == "h2":  # type: ignore[attr-defined]
        conn.h2 = H2Session(max_head=max_head)
    if proxy is not None:
        conn.proxy = proxy
        conn.absolute_form = absolute_form
        if absolute_form and proxy.username:
            conn.proxy_headers = [("proxy-authorization", proxy.authorization())]
    return conn


class Origin:
    """Per-origin state: the slot semaphore, idle connections (most recent last), and users holding or waiting."""

    __slots__ = ("idle", "sem", "users")

    def __init__(self, max_connections: int) -> None:
        self.sem = trio.Semaphore(max_connections)
        self.idle: list[Connection] = []
        self.users = 0


#: Idle connections kept at most whatever the descriptor limit (a kernel socket each, a few KiB at rest).
MAX_IDLE_TOTAL = 16_384


def default_max_idle_total() -> int:
    """Idle connections to keep in all: a quarter of the file-descriptor limit (at least 8, at most
    `MAX_IDLE_TOTAL`), so the fetches in flight, peer links and stores keep the other three quarters.

    It was at most 1,024 before; a crawl that visits more hosts than that in turn (the wide benchmark web's
    2,000 at delay 0) then closed an idle connection and opened a new one for most pages: about 100 µs of the
    node's CPU per page, and a TCP handshake each for the server."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_IDLE_TOTAL
    return max(8, min(MAX_IDLE_TOTAL, soft // 4))


class ConnectionPool:
    """Origin slots and idle connections; callers hold a slot while they use a connection."""

    def __init__(
        self, *, max_connections_per_origin: int, max_idle_per_origin: int, max_idle_total: int, idle_timeout: float
    ) -> None:
        if max_connections_per_origin < 1:
            raise ValueError(f"max_connections_per_origin must be at least 1, got {max_connections_per_origin}")
        self._max_per_origin = max_connections_per_origin
        self._max_idle_per_origin = max_idle_per_origin
        self._max_idle_total = max_idle_total
        self._idle_timeout = idle_timeout
        self._origins: dict[OriginKey, Origin] = {}
        self._idle: dict[Connection, None] = {}  # global LRU: oldest first

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    @property
    def origin_count(self) -> int:
        return len(self._origins)

    async def acquire(self, key: OriginKey) -> Origin:
        """Wait for a slot on ``key``'s origin; pair with ``release``. Not a checkpoint when a slot is free."""
        origin = self._origins.get(key)
        if origin is None:
            origin = self._origins[key] = Origin(self._max_per_origin)
        origin.users += 1
        try:
            origin.sem.acquire_nowait()  # the common case: no wait, and no extra trip through the scheduler
        except trio.WouldBlock:
            pass
        else:
            return origin
        try:
            await origin.sem.acquire()
        except BaseException:
            origin.users -= 1
            self._forget_if_unused(key, origin)
            raise
        return origin

    def release(self, key: OriginKey, origin: Origin) -> None:
        origin.sem.release()
        origin.users -= 1
        self._forget_if_unused(key, origin)

    def take_idle(self, origin: Origin, now: float) -> Connection | None:
        """The most recently used idle connection that is still usable, or None. Expires idle connections."""
        self.sweep(now)
        idle = origin.idle
        while idle:
            conn = idle.pop()
            del self._idle[conn]
            if now - conn.idle_since < self._idle_timeout and conn.looks_alive():
                return conn
            conn.close()
        return None

    def put_idle(self, origin: Origin, conn: Connection, now: float) -> None:
        """Keep ``conn`` for reuse (the caller still holds the origin's slot), or close it if over a limit.
        Expires idle connections."""
        self.sweep(now)
        if len(origin.idle) >= self._max_idle_per_origin:
            conn.close()
            return
        conn.idle_since = now
        origin.idle.append(conn)
        self._idle[conn] = None
        if len(self._idle) > self._max_idle_total:
            self._evict(next(iter(self._idle)))

    def sweep(self, now: float) -> int:
        """Close idle connections older than the idle timeout; returns how many. Called on every take and put."""
        closed = 0
        while self._idle:
            conn = next(iter(self._idle))
            if now - conn.idle_since < self._idle_timeout:
                break  # the rest are younger: the dict is in release order
            self._evict(conn)
            closed += 1
        return closed

    def close_all(self) -> None:
        for conn in list(self._idle):
            self._evict(conn)

    def _evict(self, conn: Connection) -> None:
        del self._idle[conn]
        origin = self._origins.get(conn.key)
        if origin is not None:
            origin.idle.remove(conn)
            self._forget_if_unused(conn.key, origin)
        conn.close()

    def _forget_if_unused(self, key: OriginKey, origin: Origin) -> None:
        if origin.users == 0 and not origin.idle and self._origins.get(key) is origin:
            del self._origins[key]
