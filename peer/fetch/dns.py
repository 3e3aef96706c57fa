"""The node's own DNS resolver: asynchronous under trio, cached, merged, and careful about where it points.

A crawler resolves every host it owns, many of them once and some thousands of times, so the node keeps its
own cache (a bounded LRU with TTLs clamped to a sane range, failures cached too) instead of leaning on the
system resolver, which would block a thread per look-up. This module builds and parses messages with
dnspython and moves them over trio UDP sockets itself (TCP when an answer is truncated); docs/fetching.md has
the measurement against dnspython's own asynchronous query on trio. The address returned is the one the HTTP
fetcher connects to: a name is resolved once, and an answer pointing into a private, loopback or link-local
range is refused here, which protects the HTTP stack too.
"""

from __future__ import annotations

import ipaddress
import math
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import trio

from peer.config import DEFAULTS
from peer.fetch.addresses import ip_literal, refusal_reason
from peer.fetch.errors import (
    DnsError,
    DnsTimeout,
    NoAddress,
    NxDomain,
    RefusedAddress,
    ServFail,
    SocketsExhausted,
)
from storage import LruTtlCache

__all__ = ["CachingResolver", "DnsError", "DnsStats", "Resolver", "parse_nameserver", "system_nameservers"]

_RETRY_INTERVAL = 1.0  # first UDP retransmission after 1 s, doubling per round over all servers
_MAX_CNAME_CHAIN = 8
_MAX_UDP_MESSAGE = 65535


class Resolver(Protocol):
    """What the fetcher needs from DNS: one IP (as text) for a host name."""

    async def resolve(self, host: str) -> str: ...


@dataclass(slots=True)
class DnsStats:
    """Counters: cache hits and misses, questions sent, and failures raised by their error's label."""

    hits: int = 0
    misses: int = 0
    queries: int = 0
    failures: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"hits": self.hits, "misses": self.misses, "queries": self.queries, "failures": dict(self.failures)}


@dataclass(frozen=True, slots=True, kw_only=True)
class _Failure:
    """A cached negative answer."""

    error: type[DnsError]
    message: str


class _TcpRetryFailed(Exception):
    """Asking again over TCP after a truncated UDP answer failed (the message says how)."""


class _NoSocket(Exception):
    """The node could not open a UDP socket (out of file descriptors or buffers): this look-up fails, cached
    briefly like any transient failure; the node goes on."""


class _Lookup:
    """One in-flight query that other callers asking for the same name wait on."""

    __slots__ = ("done", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: str | _Failure | None = None  # None: the querying task was cancelled


def parse_nameserver(text: str) -> tuple[str, int]:
    """``"ADDR[:PORT]"`` (``"[v6]:PORT"`` for IPv6) to ``(ip, port)``; raises ValueError with one line."""
    host, port = text.strip(), 53
    try:
        if host.startswith("["):
            host, _, rest = host[1:].partition("]")
            if rest:
                port = int(rest.removeprefix(":"))
        elif host.count(":") == 1:
            host, port_text = host.split(":")
            port = int(port_text)
        ip = str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError(f"name server {text!r} is not ADDR[:PORT] with an IP address") from None
    if not 0 < port < 65536:
        raise ValueError(f"name server {text!r} has port {port} outside 1-65535")
    return ip, port


def system_nameservers(path: str = "/etc/resolv.conf") -> list[tuple[str, int]]:
    """The name servers listed in resolv.conf, or 127.0.0.1 when it lists none (the libc default)."""
    servers = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    try:
                        servers.append((str(ipaddress.ip_address(parts[1].split("%")[0])), 53))
                    except ValueError:
                        continue
    except OSError:
        pass
    return servers or [("127.0.0.1", 53)]


class CachingResolver:
    """A trio DNS resolver with a bounded LRU cache, negative caching and merged concurrent look-ups.

    ``nameservers`` are ``"ADDR[:PORT]"`` texts (empty: those of /etc/resolv.conf). Positive answers are
    cached for their TTL clamped to ``[min_ttl, max_ttl]``; NXDOMAIN and names without an address for
    ``negative_ttl``; SERVFAIL and time-outs (often transient) for ``transient_ttl`` (at most ``negative_ttl``):
    long enough to answer the burst of look-ups of a name that failed at once, short enough that a retry a few
    seconds later (a robots.txt or a page asked again after its back-off) asks the name servers again. A look-up
    gives up after ``timeout`` seconds, retransmitting over UDP in between. Addresses in private, loopback,
    link-local, unspecified, multicast or reserved ranges raise ``RefusedAddress`` unless
    ``allow_private``.
    """

    def __init__(
        self,
        nameservers: Sequence[str] = (),
        *,
        cache_size: int = DEFAULTS["dns_cache_size"],
        min_ttl: float = DEFAULTS["dns_min_ttl"],
        max_ttl: float = DEFAULTS["dns_max_ttl"],
        negative_ttl: float = 300.0,
        transient_ttl: float = 1.0,
        timeout: float = 5.0,
        allow_private: bool = False,
    ) -> None:
        if not 0 <= min_ttl <= max_ttl:
            raise ValueError(f"min_ttl {min_ttl} and max_ttl {max_ttl} must satisfy 0 <= min_ttl <= max_ttl")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self._servers = [parse_nameserver(s) for s in nameservers] if nameservers else system_nameservers()
        self._server_set = frozenset(self._servers)
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        # cache_size 0: no cache and no merging of concurrent look-ups (every call asks; for studies)
        self._cache: LruTtlCache[str, str | _Failure] | None = LruTtlCache(cache_size) if cache_size else None
        self._inflight: dict[str, _Lookup] = {}
        self._min_ttl = min_ttl
        self._max_ttl = max_ttl
        self._negative_ttl = negative_ttl
        if transient_ttl < 0:
            raise ValueError(f"transient_ttl must be >= 0, got {transient_ttl}")
        self._transient_ttl = min(negative_ttl, transient_ttl)
        self._timeout = timeout
        self._allow_private = allow_private
        self.stats = DnsStats()

    @property
    def nameservers(self) -> list[tuple[str, int]]:
        return list(self._servers)

    @property
    def cache(self) -> LruTtlCache[str, str | _Failure] | None:
        """The cache itself, so a hand-off can ``export`` the entries of the hosts that move."""
        return self._cache

    async def resolve(self, host: str) -> str:
        """One IP address (as text) for ``host``; raises DnsError. IP literals are returned as they are."""
        name = host.lower().rstrip(".")
        literal = ip_literal(name)
        if literal is not None:
            await trio.lowlevel.checkpoint()
            return self._deliver(name, literal)
        if name == "localhost" or name.endswith(".localhost"):
            # RFC 6761: localhost names are loopback and never sent to a name server.
            await trio.lowlevel.checkpoint()
            return self._deliver(name, "127.0.0.1")
        if self._cache is None:
            self.stats.misses += 1
            result, _ttl = await self._look_up(name)
            return self._deliver(name, result)
        cached = self._cache.get(name, trio.current_time())
        if cached is not None:
            # A hit returns without a checkpoint: it is on every fetch's path, and the fetch yields anyway.
            self.stats.hits += 1
            return self._deliver(name, cached)
        self.stats.misses += 1
        while (lookup := self._inflight.get(name)) is not None:
            await lookup.done.wait()
            if lookup.result is not None:
                return self._deliver(name, lookup.result)
            # The task that was asking was cancelled before it had an answer: ask again.
        lookup = _Lookup()
        self._inflight[name] = lookup
        try:
            result, ttl = await self._look_up(name)
            self._cache.put(name, result, trio.current_time() + ttl)
            lookup.result = result
        finally:
            del self._inflight[name]
            lookup.done.set()
        return self._deliver(name, result)

    def _deliver(self, name: str, result: str | _Failure) -> str:
        if isinstance(result, _Failure):
            self._count_failure(result.error.label)
            raise result.error(result.message)
        if not self._allow_private:
            reason = refusal_reason(result)
            if reason is not None:
                self._count_failure(RefusedAddress.label)
                raise RefusedAddress(
                    f"{name} resolves to {result}, a {reason} address; refused (private addresses not allowed)",
                )
        return result

    def _count_failure(self, label: str) -> None:
        self.stats.failures[label] = self.stats.failures.get(label, 0) + 1

    async def _look_up(self, name: str) -> tuple[str | _Failure, float]:
        """Ask the name servers for an A record, then AAAA; the result and how long to cache it."""
        if not name.isascii():
            try:
                name = name.encode("idna").decode("ascii")
            except UnicodeError:
                return _Failure(error=NxDomain, message=f"{name!r} is not a valid host name"), self._negative_ttl
        try:
            qname = dns.name.from_text(name)
        except dns.exception.DNSException:
            return _Failure(error=NxDomain, message=f"{name!r} is not a valid host name"), self._negative_ttl
        with trio.move_on_after(self._timeout):
            ips: list[str] = []
            ttl = math.inf
            for rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
                try:
                    response = await self._ask(qname, rdtype)
                except _TcpRetryFailed as exc:
                    return _Failure(error=ServFail, message=f"{name}: {exc}"), self._transient_ttl
                except _NoSocket as exc:
                    return _Failure(error=SocketsExhausted, message=f"{name}: {exc}"), self._transient_ttl
                rcode = response.rcode()
                if rcode == dns.rcode.NXDOMAIN:
                    return _Failure(error=NxDomain, message=f"{name}: no such domain (NXDOMAIN)"), self._negative_ttl
                if rcode != dns.rcode.NOERROR:
                    text = dns.rcode.to_text(rcode)
                    message = f"{name}: the name server answered {text}"
                    return _Failure(error=ServFail, message=message), self._transient_ttl
                ips, ttl = _addresses(response, qname, rdtype)
                if ips:
                    break
            if not ips:
                message = f"{name}: the name exists but has no A or AAAA record"
                return _Failure(error=NoAddress, message=message), self._negative_ttl
            return self._choose(ips), min(max(ttl, self._min_ttl), self._max_ttl)
        servers = ", ".join(f"{ip}:{port}" for ip, port in self._servers)
        message = f"{name}: no answer from {servers} within {self._timeout:g} s"
        return _Failure(error=DnsTimeout, message=message), self._transient_ttl

    def _choose(self, ips: list[str]) -> str:
        """The first usable address: the first public one unless private ones are allowed."""
        if not self._allow_private:
            for ip in ips:
                if refusal_reason(ip) is None:
                    return ip
        return ips[0]

    async def _ask(self, qname: dns.name.Name, rdtype: dns.rdatatype.RdataType) -> dns.message.Message:
        """Send one question over UDP, retransmitting round the servers, until a matching answer arrives."""
        self.stats.queries += 1
        query = dns.message.make_query(qname, rdtype)
        wire = query.to_wire()
        sockets: dict[int, trio.socket.SocketType] = {}
        try:
            attempt = 0
            while True:
                server = self._servers[attempt % len(self._servers)]
                family = socket.AF_INET6 if ":" in server[0] else socket.AF_INET
                sock = sockets.get(family)
                if sock is None:
                    try:
                        sock = sockets[family] = trio.socket.socket(family, socket.SOCK_DGRAM)
                    except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: this name fails now, the node goes on
                        raise _NoSocket(f"cannot open a DNS socket: {exc.strerror or exc}") from exc
                try:
                    await sock.sendto(wire, server)
                except OSError:
                    pass  # unreachable right now; the next round tries again
                with trio.move_on_after(_RETRY_INTERVAL * 2 ** (attempt // len(self._servers))):
                    response, peer = await self._receive_answer(sockets, query)
                    if response.flags & dns.flags.TC:
                        return await self._ask_tcp(query, peer)
                    return response
                attempt += 1
        finally:
            for sock in sockets.values():
                sock.close()

    async def _receive_answer(
        self, sockets: dict[int, trio.socket.SocketType], query: dns.message.Message
    ) -> tuple[dns.message.Message, tuple[str, int]]:
        """The next datagram that answers ``query`` from one of our servers (others are ignored)."""
        if len(sockets) == 1:
            (sock,) = sockets.values()
            return await _receive_on(sock, query, self._server_set)
        async with trio.open_nursery() as nursery:
            got: list[tuple[dns.message.Message, tuple[str, int]]] = []

            async def listen(sock: trio.socket.SocketType) -> None:
                got.append(await _receive_on(sock, query, self._server_set))
                nursery.cancel_scope.cancel()

            for sock in sockets.values():
                nursery.start_soon(listen, sock)
        return got[0]

    async def _ask_tcp(self, query: dns.message.Message, server: tuple[str, int]) -> dns.message.Message:
        """Ask again over TCP after a truncated UDP answer."""
        wire = query.to_wire()
        where = f"{server[0]}:{server[1]}"
        try:
            stream = await trio.open_tcp_stream(*server)
        except OSError as exc:
            raise _TcpRetryFailed(f"cannot connect to {where} over TCP after a truncated answer: {exc}") from None
        async with stream:
            try:
                await stream.send_all(len(wire).to_bytes(2, "big") + wire)
                buf = bytearray()
                while len(buf) < 2 or len(buf) < 2 + int.from_bytes(buf[:2], "big"):
                    chunk = await stream.receive_some(_MAX_UDP_MESSAGE)
                    if not chunk:
                        raise _TcpRetryFailed(f"{where} closed the TCP connection before answering")
                    buf += chunk
                response = dns.message.from_wire(bytes(buf[2 : 2 + int.from_bytes(buf[:2], "big")]))
            except (trio.BrokenResourceError, dns.exception.DNSException) as exc:
                raise _TcpRetryFailed(f"bad answer from {where} over TCP: {exc}") from None
        if not query.is_response(response):
            raise _TcpRetryFailed(f"{where} answered another question over TCP")
        return response


async def _receive_on(
    sock: trio.socket.SocketType, query: dns.message.Message, servers: frozenset[tuple[str, int]]
) -> tuple[dns.message.Message, tuple[str, int]]:
    while True:
        try:
            data, peer = await sock.recvfrom(_MAX_UDP_MESSAGE)
        except ConnectionError:
            continue  # an ICMP error for an earlier datagram; keep listening until the deadline
        source = (peer[0], peer[1])
        if source not in servers:
            continue  # not from a server we asked: ignore (spoofing or a stray packet)
        try:
            response = dns.message.from_wire(data)
        except dns.exception.DNSException:
            continue
        if query.is_response(response):
            return response, source


def _addresses(
    response: dns.message.Message, qname: dns.name.Name, rdtype: dns.rdatatype.RdataType
) -> tuple[list[str], float]:
    """The addresses for ``qname`` (following a CNAME chain in the answer) and the smallest TTL on the way."""
    ttl = math.inf
    target = qname
    for _ in range(_MAX_CNAME_CHAIN):
        rrset = response.get_rrset(response.answer, target, dns.rdataclass.IN, rdtype)
        if rrset is not None:
            return [rdata.address for rdata in rrset], min(ttl, rrset.ttl)
        cname = response.get_rrset(response.answer, target, dns.rdataclass.IN, dns.rdatatype.CNAME)
        if cname is None:
            break
        ttl = min(ttl, cname.ttl)
        target = cname[0].target
    return [], ttl
