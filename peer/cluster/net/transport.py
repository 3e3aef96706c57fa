"""The network seam between peers: `Transport`, and TCP for real.

Everything above this module (peer links, membership, dispatch) sees only `Transport`: `connect(address)` gives
a byte stream, `serve(handler)` runs a listener and reports the address it bound. `TcpTransport` is the real
thing; `peer/cluster/net/memtransport.py`'s `MemoryNetwork` runs many nodes in one `trio.run`, so a cluster can be
simulated under `MockClock`.

A transport may also carry datagrams (`DatagramTransport`: `send_datagram(address, data)`, best effort, and
`serve_datagrams(handler)`): the probes of failure detection travel that way, with no connection to set up
(protocol/_datagram.py). `TcpTransport` sends them over UDP on the node's own port (the same number as its TCP
listener). A transport with no datagrams (TLS between peers) leaves the probes on the links.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import trio

__all__ = [
    "DatagramHandler",
    "DatagramTransport",
    "Handler",
    "TcpTransport",
    "TlsFiles",
    "Transport",
    "TransportError",
    "split_address",
]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.transport")

Handler = Callable[[trio.abc.Stream], Awaitable[None]]


class TransportError(OSError):
    """The network did not let us reach the peer (refused, unreachable, partitioned): not a protocol fault."""


@runtime_checkable
class Transport(Protocol):
    """How a node reaches its peers and is reached by them."""

    async def connect(self, address: str) -> trio.abc.Stream:
        """A stream to the node listening at `address` ("host:port"); TransportError if it cannot be reached."""
        ...

    async def serve(self, handler: Handler, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept connections forever, running `handler(stream)` for each; report the bound address when ready."""
        ...


DatagramHandler = Callable[[bytes, str], Awaitable[None]]


@runtime_checkable
class DatagramTransport(Protocol):
    """A transport that also carries datagrams: one message per packet, no connection, no delivery promise."""

    #: Whether datagrams are on (a transport may have the methods and still not carry them, e.g. under TLS).
    datagrams: bool

    def send_datagram(self, address: str, data: bytes) -> bool:
        """Send `data` to the node at `address` if that can be done without waiting; False if it was dropped here
        (nothing served yet, a full send buffer). Delivery is never promised."""
        ...

    async def serve_datagrams(
        self, handler: DatagramHandler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Receive datagrams forever on the address `serve` bound, awaiting `handler(data, source)` for each."""
        ...


def split_address(address: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"; ValueError naming the address otherwise."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not (sep and host and port.isdigit() and 0 <= int(port) < 65536):
        raise ValueError(f"a peer address must be host:port, got {address!r}")
    return host, int(port)


def _join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- TCP ----------------------------------------------------------------------------------------------------


#: An inbound peer gets this long to complete its TLS handshake.
TLS_HANDSHAKE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    """PEM files for mutual TLS between peers: this node's certificate and key, and the cluster's CA."""

    cert: str
    key: str
    ca: str

    def context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(purpose, cafile=self.ca)
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise TransportError(f"TLS files (cert {self.cert}, key {self.key}, CA {self.ca}): {exc}") from exc
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


class TcpTransport:
    """Peers over TCP. `listen` is "host:port" to bind (port 0: the OS picks one, reported by `serve`)."""

    def __init__(self, listen: str, *, advertise: str | None = None, tls: TlsFiles | None = None) -> None:
        self.listen = listen
        self.advertise = advertise  # what `serve` reports (peers dial it); None: the bound address
        self._host, self._port = split_address(listen)
        if advertise is not None:
            split_address(advertise)
        # Mutual TLS: both ends present a certificate signed by the cluster's CA and check the other's. Peers
        # are dialled by address, so the name in a certificate is not checked: the CA is the trust.
        self._client_ctx = self._server_ctx = None
        if tls is not None:
            self._client_ctx = tls.context(ssl.Purpose.SERVER_AUTH)
            self._server_ctx = tls.context(ssl.Purpose.CLIENT_AUTH)
        # Datagrams over UDP on the listener's port, but not under TLS: they are authenticated by the cluster
        # secret and not encrypted, and a cluster that asked for TLS keeps all its traffic in it.
        self.datagrams = tls is None
        self._bound: tuple[str, int] | None = None  # the TCP listener's (host, port), once serving
        self._udp_send: trio.MemorySendChannel[tuple[bytes, str]] | None = None

    async def connect(self, address: str) -> trio.abc.Stream:
        host, port = split_address(address)
        try:
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise TransportError(f"cannot connect to peer {address}: {exc}") from exc
        if self._client_ctx is not None:
            tls_stream = trio.SSLStream(stream, self._client_ctx, server_hostname=host)
            try:
                await tls_stream.do_handshake()
            except (trio.BrokenResourceError, ssl.SSLError) as exc:
                await trio.aclose_forcefully(tls_stream)
                raise TransportError(f"TLS handshake with peer {address} failed: {exc.__cause__ or exc}") from exc
            stream = tls_stream
        return stream

    async def serve(self, handler: Handler, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            listeners = await trio.open_tcp_listeners(self._port, host=self._host)
        except OSError as exc:
            raise TransportError(f"cannot listen on {self.listen}: {exc}") from exc
        sockname = listeners[0].socket.getsockname()
        self._bound = (sockname[0], sockname[1])
        address = _join_address(sockname[0], sockname[1])
        log.info("peer transport listening on %s", address)
        if self.advertise is not None:
            host, port = split_address(self.advertise)
            address = _join_address(host, port or sockname[1])
        served: list[trio.abc.Listener[trio.abc.Stream]] = list(listeners)
        if self._server_ctx is not None:
            served = [trio.SSLListener(listener, self._server_ctx, https_compatible=False) for listener in listeners]
            handler = self._tls_handler(handler)
        await trio.serve_listeners(handler, served, task_status=_Reporter(task_status, address))

    def send_datagram(self, address: str, data: bytes) -> bool:
        if self._udp_send is None:
            return False
        try:
            self._udp_send.send_nowait((data, address))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    async def serve_datagrams(
        self, handler: DatagramHandler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """UDP on the TCP listener's host and port (call after `serve` reported its address): one socket both
        receives and sends, so a peer sees our datagrams come from our own port. TransportError if it cannot
        bind. Datagrams to send wait in a bounded queue; past it they are dropped, as a full socket buffer
        drops them."""
        if not self.datagrams:
            raise TransportError("this transport carries no datagrams (TLS between peers)")
        if self._bound is None:
            raise RuntimeError("TcpTransport.serve_datagrams() needs serve() to have bound the TCP listener first")
        host, port = self._bound
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        sock = trio.socket.socket(family, trio.socket.SOCK_DGRAM)
        try:
            await sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise TransportError(f"cannot receive datagrams on UDP {_join_address(host, port)}: {exc}") from exc
        send, receive = trio.open_memory_channel[tuple[bytes, str]](DATAGRAM_QUEUE)
        self._udp_send = send
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_datagrams, sock, receive)
                task_status.started()
                while True:
                    try:
                        data, source = await sock.recvfrom(_DATAGRAM_READ)
                    except OSError as exc:  # e.g. an ICMP port unreachable reported on the socket: not ours to end
                        log.debug("UDP receive on %s: %s", _join_address(host, port), exc)
                        continue
                    await handler(data, _join_address(source[0], source[1]))
        finally:
            self._udp_send = None
            send.close()
            sock.close()

    @staticmethod
    async def _send_datagrams(sock: trio.socket.SocketType, queue: trio.MemoryReceiveChannel[tuple[bytes, str]]) -> None:
        # Peer addresses may be names (a pod's DNS name): each is resolved once per _RESOLVED_FOR seconds, not for
        # every datagram. At most _RESOLVED_MAX are kept (the oldest goes first).
        resolved: dict[str, tuple[Any, float]] = {}  # address -> (a socket address, until when)
        flags = trio.socket.AI_V4MAPPED if sock.family == trio.socket.AF_INET6 else 0
        async for data, address in queue:
            try:
                now = trio.current_time()
                entry = resolved.get(address)
                if entry is None or entry[1] <= now:
                    host, port = split_address(address)
                    infos = await trio.socket.getaddrinfo(host, port, sock.family, trio.socket.SOCK_DGRAM, 0, flags)
                    if not infos:
                        raise OSError(f"no {sock.family.name} address for {host}")
                    resolved.pop(address, None)
                    entry = resolved[address] = (infos[0][4], now + _RESOLVED_FOR)
                    if len(resolved) > _RESOLVED_MAX:
                        del resolved[next(iter(resolved))]
                await sock.sendto(data, entry[0])
            except (OSError, ValueError) as exc:  # unreachable, unresolvable, another family: a lost datagram
                log.debug("datagram to %s not sent: %s", address, exc)

    @staticmethod
    def _tls_handler(handler: Handler) -> Handler:
        async def accept(stream: trio.abc.Stream) -> None:
            try:
                with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                    await stream.do_handshake()  # type: ignore[attr-defined]
            except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError) as exc:
                log.debug("inbound TLS handshake refused: %s", exc.__cause__ or exc)
                await trio.aclose_forcefully(stream)
                return
            await handler(stream)

        return accept


class _Reporter:
    """Passes `address` to the caller's task_status instead of the listener list trio reports."""

    def __init__(self, task_status: trio.TaskStatus[str], address: str) -> None:
        self._task_status = task_status
        self._address = address

    def started(self, value: object = None) -> None:
        self._task_status.started(self._address)


#: Datagrams waiting to be sent by one node, and the bytes read for one (MAX_DATAGRAM is 1,200; more is refused).
DATAGRAM_QUEUE = 256
_DATAGRAM_READ = 2048
#: A peer's name is resolved again after this many seconds (a pod that moved gets a new address), and at most
#: this many names are kept (a cluster of thousands of nodes).
_RESOLVED_FOR = 30.0
_RESOLVED_MAX = 8192
