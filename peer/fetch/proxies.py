"""Proxies the fetcher may go through: their URLs, a pool that rotates over them and rests the failing ones, and
the two handshakes that open a tunnel (HTTP CONNECT, SOCKS5 with RFC 1929 user and password).

The node resolves and checks every host name itself before it asks a proxy (`peer.fetch.addresses`), and asks
for the checked address, so a proxy is never a way to reach an address the node may not reach: CONNECT and
``socks5://`` name the address, not the host. ``socks5h://`` names the host (the proxy resolves it, for
networks whose names only the proxy knows), and then only a host the node's own resolver accepted is named;
plain HTTP proxying (``http://`` proxy, ``http://`` URL) sends the absolute URL as HTTP requires, for a host
checked the same way.

Health is checked on use, as the connection pool expires idle connections (no timer task): a proxy that
cannot be reached, or that answers its handshake with garbage, rests for ``retry_after`` seconds while the
others take its turns; when all rest, the one that has rested longest is tried.
"""

from __future__ import annotations

import base64
import ipaddress
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import trio

__all__ = ["Proxy", "ProxyError", "ProxyPool", "ProxyRefused", "http_connect", "parse_proxy", "socks5_connect"]

_SCHEMES = {"http": 3128, "socks5": 1080, "socks5h": 1080}
_MAX_REPLY = 16384  # a CONNECT reply head longer than this is not a proxy's


class ProxyError(Exception):
    """The proxy itself failed: unreachable, closed the connection, or answered its handshake with garbage."""


class ProxyRefused(Exception):
    """The proxy works but would not open this tunnel (the target refused or unreachable, or not allowed)."""


@dataclass(slots=True, eq=False)
class Proxy:
    """One proxy: scheme ``http``, ``socks5`` or ``socks5h``, where it listens, its credentials."""

    scheme: str
    host: str
    port: int
    username: str = ""
    password: str = field(default="", repr=False)
    rest_until: float = 0.0
    uses: int = 0
    failures: int = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"  # never the credentials

    @property
    def remote_dns(self) -> bool:
        return self.scheme == "socks5h"

    def authorization(self) -> str:
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode("ascii")
        return f"Basic {token}"


def parse_proxy(url: str, credentials: tuple[str, str] | None = None) -> Proxy:
    """A proxy from its URL (``http://``, ``socks5://``, ``socks5h://``, user and password optional, else
    ``credentials``); raises ValueError."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"proxy {url!r}: {exc}") from None
    if parts.scheme not in _SCHEMES:
        raise ValueError(f"proxy {parts.scheme}://…: the scheme must be http, socks5 or socks5h")
    if not parts.hostname:
        raise ValueError(f"proxy {parts.scheme}://…: no host")
    if parts.path not in ("", "/") or parts.query:
        raise ValueError(f"proxy {parts.scheme}://{parts.hostname}: a proxy URL has no path")
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    if not user and credentials is not None:
        user, password = credentials
    if parts.scheme.startswith("socks5") and (len(user.encode()) > 255 or len(password.encode()) > 255):
        raise ValueError(f"proxy {parts.scheme}://{parts.hostname}: SOCKS5 user and password are 255 bytes at most")
    return Proxy(parts.scheme, parts.hostname, port or _SCHEMES[parts.scheme], user, password)


class ProxyPool:
    """Proxies taken in turn; one that fails rests for ``retry_after`` seconds (times read by the caller)."""

    def __init__(self, proxies: Sequence[Proxy], *, retry_after: float = 30.0) -> None:
        if not proxies:
            raise ValueError("a proxy pool needs at least one proxy")
        self.proxies = list(proxies)
        self._retry_after = retry_after
        self._next = 0

    def choose(self, now: float) -> Proxy:
        """The next proxy not resting (round robin), else the one that has rested longest."""
        proxies = self.proxies
        for i in range(len(proxies)):
            proxy = proxies[(self._next + i) % len(proxies)]
            if proxy.rest_until <= now:
                self._next = (self._next + i + 1) % len(proxies)
                proxy.uses += 1
                return proxy
        proxy = min(proxies, key=lambda p: p.rest_until)
        proxy.uses += 1
        return proxy

    def any_healthy(self, now: float) -> bool:
        return any(p.rest_until <= now for p in self.proxies)

    def failed(self, proxy: Proxy, now: float) -> None:
        proxy.failures += 1
        proxy.rest_until = now + self._retry_after

    def worked(self, proxy: Proxy) -> None:
        proxy.rest_until = 0.0

    def status(self, now: float) -> list[dict[str, object]]:
        return [{"proxy": p.url, "healthy": p.rest_until <= now, "uses": p.uses, "failures": p.failures}
                for p in self.proxies]


class _Reader:
    """Exact-size reads from a stream, for the handshakes (bounded: they are a few bytes each)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = await self.stream.receive_some(4096)
            if not data:
                raise ProxyError("the proxy closed the connection during its handshake")
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def head(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > _MAX_REPLY:
                raise ProxyError(f"the proxy's CONNECT reply head exceeds {_MAX_REPLY} bytes")
            data = await self.stream.receive_some(4096)
            if not data:
                raise ProxyError("the proxy closed the connection before answering CONNECT")
            self.buf += data
        end = self.buf.index(b"\r\n\r\n") + 4
        head = bytes(self.buf[:end])
        del self.buf[:end]
        return head


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def http_connect(stream: trio.abc.Stream, proxy: Proxy, host: str, port: int) -> None:
    """Ask an HTTP proxy for a tunnel to ``host:port`` (an address the node checked); raises ProxyError or
    ProxyRefused (with the proxy's status)."""
    target = _authority(host, port)
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if proxy.username:
        lines.append(f"Proxy-Authorization: {proxy.authorization()}")
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    reader = _Reader(stream)
    head = await reader.head()
    status_line = head.split(b"\r\n", 1)[0]
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProxyError(f"the proxy answered CONNECT with {status_line[:100]!r}")
    status = int(parts[1])
    if not 200 <= status < 300:
        reason = parts[2].decode("latin-1", "replace") if len(parts) > 2 else ""
        raise ProxyRefused(f"the proxy answered CONNECT with {status} {reason}".rstrip())
    if reader.buf:
        raise ProxyError("the proxy sent bytes after its CONNECT reply, before the tunnel was used")


_SOCKS_REPLIES = {1: "general failure", 2: "not allowed by its rules", 3: "network unreachable",
                  4: "host unreachable", 5: "connection refused", 6: "TTL expired", 7: "command not supported",
                  8: "address type not supported"}


async def socks5_connect(stream: trio.abc.Stream, proxy: Proxy, host: str, port: int) -> None:
    """SOCKS5 (RFC 1928) CONNECT to ``host`` (an address, or for ``socks5h`` a host name), with user and
    password (RFC 1929) when the proxy has them; raises ProxyError or ProxyRefused."""
    methods = b"\x00\x02" if proxy.username else b"\x00"
    await stream.send_all(b"\x05" + bytes([len(methods)]) + methods)
    reader = _Reader(stream)
    version, method = await reader.exactly(2)
    if version != 5:
        raise ProxyError(f"not a SOCKS5 proxy (version byte {version})")
    if method == 0x02 and proxy.username:
        user, password = proxy.username.encode(), proxy.password.encode()
        await stream.send_all(b"\x01" + bytes([len(user)]) + user + bytes([len(password)]) + password)
        _, status = await reader.exactly(2)
        if status != 0:
            raise ProxyError("the SOCKS5 proxy refused the user and password")
    elif method != 0x00:
        raise ProxyError("the SOCKS5 proxy accepts none of the offered methods (none, user and password)"
                         if method == 0xFF else f"the SOCKS5 proxy chose an unoffered method {method}")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        name = host.encode("idna")
        if len(name) > 255:
            raise ProxyRefused(f"host name too long for SOCKS5: {host[:80]}") from None
        dest = b"\x03" + bytes([len(name)]) + name
    else:
        dest = (b"\x01" if address.version == 4 else b"\x04") + address.packed
    await stream.send_all(b"\x05\x01\x00" + dest + struct.pack(">H", port))
    version, reply, _, kind = await reader.exactly(4)
    if version != 5:
        raise ProxyError(f"the SOCKS5 proxy answered with version byte {version}")
    if kind == 1:
        await reader.exactly(4 + 2)
    elif kind == 4:
        await reader.exactly(16 + 2)
    elif kind == 3:
        (length,) = await reader.exactly(1)
        await reader.exactly(length + 2)
    else:
        raise ProxyError(f"the SOCKS5 proxy answered with address type {kind}")
    if reply != 0:
        raise ProxyRefused(f"the SOCKS5 proxy could not connect: {_SOCKS_REPLIES.get(reply, f'error {reply}')}")
    if reader.buf:
        raise ProxyError("the SOCKS5 proxy sent bytes after its reply, before the tunnel was used")


async def proxy_address(proxy: Proxy) -> tuple[socket.AddressFamily, str]:
    """(family, address) of the proxy itself: the operator's setting, resolved by the system (a proxy may well
    sit on a private address; that is the operator's choice, not a link's)."""
    try:
        ip = ipaddress.ip_address(proxy.host)
    except ValueError:
        infos = await trio.socket.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
        if not infos:
            raise ProxyError(f"proxy {proxy.url}: the name does not resolve") from None
        family, _, _, _, sockaddr = infos[0]
        return family, str(sockaddr[0])
    return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET), str(ip)
