"""The network seam between peers: TCP for real, an in-memory network for simulations.

Everything above this module (peer links, membership, dispatch) sees only `Transport`: `connect(address)` gives
a byte stream, `serve(handler)` runs a listener and reports the address it bound. `TcpTransport` is the real
thing. `MemoryNetwork` runs many nodes in one `trio.run`, so a cluster can be simulated under `MockClock`.

A transport may also carry datagrams (`DatagramTransport`: `send_datagram(address, data)`, best effort, and
`serve_datagrams(handler)`): the probes of failure detection travel that way, with no connection to set up
(protocol/_datagram.py). `TcpTransport` sends them over UDP on the node's own port (the same number as its TCP
listener); the memory network delivers them after its delay, loses them at its loss probability and never
across a partition. A transport with no datagrams (TLS between peers) leaves the probes on the links.

The in-memory network models faults where a real network shows them to a TCP user: at the connection (a
partition refuses new connections and breaks existing ones; a link can break at random) and at delivery (each
write arrives after an added delay, in order). It can also lose or duplicate single messages on a connection
that stays up, which a real TCP connection never does: it stands for the loss and duplication an
application-level protocol must survive anyway, a message lost with a connection that broke after it was
written, a resend after a lost acknowledgement. A byte stream cannot do that by cutting bytes without
corrupting its framing, but peer frames are length-prefixed (docs/protocol.md section 1), so a pipe that knows
the framing drops or repeats whole frames. Frames after the handshake carry a tag over an implicit sequence
number, which makes a dropped or repeated frame end its connection (as it must on a real network); so that
the simulation can still stand for a peer that lost a message, a network given the cluster `secret` plays a
middle-man holding it: it reads the nonces from the handshake, derives the frame keys, and tags each frame it
delivers again with the sequence number the receiver expects. The handshake frames, `Reject` and `Goodbye` are
never dropped or repeated, so connections still form and close as they would.
Every random choice comes from the network's injected `random.Random`; no wall clock is read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import ssl
from base64 import b64decode
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import trio

from protocol import (
    TAG_SIZE,
    TYPE_CODES,
    Challenge,
    FrameKeys,
    Goodbye,
    Hello,
    Limits,
    Reject,
    Welcome,
    encode_frame,
    frame_keys,
    frame_tag,
)

__all__ = [
    "DatagramHandler",
    "DatagramTransport",
    "Handler",
    "MemoryNetwork",
    "MemoryStream",
    "MemoryTransport",
    "TcpTransport",
    "TlsFiles",
    "Transport",
    "TransportError",
    "split_address",
]

log = logging.getLogger(__name__)

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
        if self._server_ctx is not None:
            listeners = [trio.SSLListener(listener, self._server_ctx, https_compatible=False) for listener in listeners]
            handler = self._tls_handler(handler)
        await trio.serve_listeners(handler, listeners, task_status=_Reporter(task_status, address))

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
        send, receive = trio.open_memory_channel[tuple[bytes, str]](_DATAGRAM_QUEUE)
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
        resolved: dict[str, tuple[object, float]] = {}
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
_DATAGRAM_QUEUE = 256
_DATAGRAM_READ = 2048
#: A peer's name is resolved again after this many seconds (a pod that moved gets a new address), and at most
#: this many names are kept (a cluster of thousands of nodes).
_RESOLVED_FOR = 30.0
_RESOLVED_MAX = 8192


# --- in memory ----------------------------------------------------------------------------------------------


#: Frames a message fault never touches: the handshake (Hello, Challenge, Welcome), Reject and Goodbye, so
#: connections still form and close as they would.
_UNTOUCHED_TYPES = frozenset(TYPE_CODES[cls] for cls in (Hello, Challenge, Welcome, Reject, Goodbye))
_HANDSHAKE_TYPES = frozenset(TYPE_CODES[cls] for cls in (Hello, Challenge, Welcome, Reject))
_HELLO, _CHALLENGE = TYPE_CODES[Hello], TYPE_CODES[Challenge]
#: A length field above this cannot be a peer frame (the protocol's default limit): the stream is not framed.
_MAX_FRAME = Limits().max_frame
_LENGTH_SIZE = 4


class _Pipe:
    """One direction of a memory connection: writes arrive in order, each after the network's delay.

    While the network loses or duplicates messages, the pipe cuts what is written into frames (a 4-byte
    big-endian length, then that many bytes) and passes on only complete frames, each dropped, kept, or
    repeated as the network draws; a frame split across writes is held until its last byte is written. A pipe
    begins cutting at the first write after a message fault is switched on, so that write must begin a frame
    (PeerLinks writes whole frames only). A length no peer frame can have (below 2, above the protocol's frame
    limit) means the stream is not framed: the pipe then passes everything on untouched for the rest of its
    life, and so the reader sees the bad length as it would have.
    """

    def __init__(self, network: MemoryNetwork, capacity: int, link: _MemoryLink | None = None, index: int = 0) -> None:
        self._network = network
        self._link = link
        self._index = index  # 0: the dialer's writes (the protocol's initiator), 1: the listener's
        self._delivered = 0  # tagged frames delivered: the sequence number the reader expects next
        self._send, self._receive = trio.open_memory_channel[tuple[float, bytes]](capacity)
        self._last_due = -math.inf
        self._pending = b""
        self._partial = bytearray()  # the start of a frame whose end has not been written yet
        self._unframed = False

    async def write(self, data: bytes) -> None:
        network = self._network
        retag = network.secret is not None and self._link is not None
        if (network.message_faults or self._partial or retag) and not self._unframed:
            data = self._cut(data)
            if not data:
                return
        due = max(self._last_due, trio.current_time() + network.draw_delay())
        self._last_due = due
        await self._send.send((due, data))

    def _cut(self, data: bytes) -> bytes:
        """The complete frames of what was written so far, after the network's message faults."""
        buffer = self._partial
        buffer += data
        out = bytearray()
        offset = 0
        while len(buffer) - offset >= _LENGTH_SIZE:
            length = int.from_bytes(buffer[offset : offset + _LENGTH_SIZE], "big")
            if not 2 <= length <= _MAX_FRAME:
                self._unframed = True  # not peer frames: deliver the rest as written
                out += buffer[offset:]
                offset = len(buffer)
                break
            size = _LENGTH_SIZE + length
            if len(buffer) - offset < size:
                break
            frame = buffer[offset : offset + size]
            offset += size
            code = frame[_LENGTH_SIZE]
            keys = self._keys(code, frame)
            copies = 1 if code in _UNTOUCHED_TYPES else self._network.draw_copies()
            if keys is None or code in _HANDSHAKE_TYPES:
                out += frame * copies
                continue
            key = keys.initiator if self._index == 0 else keys.responder
            flags, body = frame[_LENGTH_SIZE + 1], bytes(frame[_LENGTH_SIZE + 2 : -TAG_SIZE])
            for _ in range(copies):
                out += encode_frame(code, flags, body + frame_tag(key, self._delivered, code, flags, body))
                self._delivered += 1
        del buffer[:offset]
        return bytes(out)

    def _keys(self, code: int, frame: bytearray) -> FrameKeys | None:
        """The connection's frame keys once both nonces went by (recorded from Hello and Challenge)."""
        link, secret = self._link, self._network.secret
        if link is None or secret is None:
            return None
        if code in (_HELLO, _CHALLENGE):
            try:
                nonce = b64decode(json.loads(bytes(frame[_LENGTH_SIZE + 2 :]))["nonce"])
            except (ValueError, KeyError, TypeError):
                return None
            link.nonces[0 if code == _HELLO else 1] = nonce
            link.keys = None
        if link.keys is None and all(link.nonces):
            link.keys = frame_keys(secret, initiator_nonce=link.nonces[0], responder_nonce=link.nonces[1])
        return link.keys

    def write_eof(self) -> None:
        if self._partial:
            # The writer ended inside a frame: the reader gets that tail (and sees the stream end inside a frame)
            # if there is room, else the tail is lost with the end of the connection.
            with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                self._send.send_nowait((max(self._last_due, trio.current_time()), bytes(self._partial)))
            self._partial.clear()
        self._send.close()

    async def read(self, max_bytes: int) -> bytes:
        if not self._pending:
            try:
                due, self._pending = await self._receive.receive()
            except trio.EndOfChannel:
                return b""
            await trio.sleep_until(due)
        data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    def close(self) -> None:
        self._send.close()
        self._receive.close()


class _MemoryLink:
    """Both directions of one connection between two addresses."""

    def __init__(self, network: MemoryNetwork, dialer: str, listener: str, capacity: int) -> None:
        self.network = network
        self.ends = (dialer, listener)
        self.pipes = (_Pipe(network, capacity, self, 0), _Pipe(network, capacity, self, 1))
        self.nonces: list[bytes | None] = [None, None]  # the initiator's and the responder's, as they go by
        self.keys: FrameKeys | None = None
        self.broken = False
        self.closed_ends = 0

    def break_(self) -> None:
        self.broken = True
        for pipe in self.pipes:
            pipe.close()
        self.network._links.discard(self)


class _Conflict:
    """Raises trio.BusyResourceError when two tasks use one side of a stream at once, as trio's streams do."""

    def __init__(self, message: str) -> None:
        self._message = message
        self._held = False

    def __enter__(self) -> None:
        if self._held:
            raise trio.BusyResourceError(self._message)
        self._held = True

    def __exit__(self, *exc_info: object) -> None:
        self._held = False


class MemoryStream(trio.abc.HalfCloseableStream):
    """One end of an in-memory connection; a broken link raises trio.BrokenResourceError like a reset socket."""

    def __init__(self, link: _MemoryLink, side: int) -> None:
        self._link = link
        self._side = side
        self._out = link.pipes[side]
        self._in = link.pipes[1 - side]
        self._closed = False
        self._eof_sent = False
        self._sending = _Conflict("another task is already sending on this stream")
        self._receiving = _Conflict("another task is already receiving on this stream")

    @property
    def local_address(self) -> str:
        return self._link.ends[self._side]

    @property
    def remote_address(self) -> str:
        return self._link.ends[1 - self._side]

    def _check(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this memory stream was closed")
        if self._link.broken:
            raise trio.BrokenResourceError("the memory link broke (partition or injected fault)")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with self._sending:
            self._check()
            if self._eof_sent:
                raise trio.ClosedResourceError("send_eof() was already called on this stream")
            await trio.lowlevel.checkpoint()
            if not data:
                return
            if self._link.network.draw_break():
                self._link.break_()
            self._check()
            self._link.network.sent_bytes[self._link.ends[self._side]] += len(data)
            try:
                await self._out.write(bytes(data))
            except (trio.ClosedResourceError, trio.BrokenResourceError) as exc:
                self._check()
                raise trio.BrokenResourceError("the memory link closed") from exc

    async def wait_send_all_might_not_block(self) -> None:
        self._check()
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        with self._sending:
            self._check()
            await trio.lowlevel.checkpoint()
            if not self._eof_sent:
                self._eof_sent = True
                self._out.write_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        with self._receiving:
            self._check()
            try:
                data = await self._in.read(max_bytes or 65536)
            except trio.ClosedResourceError as exc:
                self._check()
                raise trio.BrokenResourceError("the memory link closed") from exc
            self._check()
            return data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            # Closing our end: the peer reads the end of the stream; nothing more goes either way.
            self._out.write_eof()
            self._in.close()
            self._link.closed_ends += 1
            if self._link.closed_ends == 2:
                self._link.network._links.discard(self._link)
        await trio.lowlevel.checkpoint()


class MemoryNetwork:
    """A simulated network of `MemoryTransport`s, with faults driven by the injected `rng`.

    - `delay` + uniform(0, `jitter`) seconds are added to each write (order is kept, as TCP keeps it).
    - `break_probability`: the chance that any write breaks its connection (both ends see a reset).
    - `loss_probability`: the chance that a frame (any but the handshake's, Reject and Goodbye) is dropped while
      its connection stays up; `duplicate_probability`: the chance that it is delivered twice, the copy right
      behind it. One draw per frame decides both (their sum is at most 1); counted in `lost` and `duplicated`.
      With both at 0 the pipes cut nothing: the bytes pass as written, at no cost.
    - `partition(...)` / `block(a, b)`: blocked pairs cannot connect, and their open connections break.
    The fault settings are plain attributes: set them to 0 to stop the faults.
    """

    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        delay: float = 0.0,
        jitter: float = 0.0,
        break_probability: float = 0.0,
        loss_probability: float = 0.0,
        duplicate_probability: float = 0.0,
        capacity: int = 64,
        secret: bytes | None = None,
    ) -> None:
        self.rng = rng or random.Random(0)
        # The cluster secret, when the network may play a middle-man that holds it (see the module docstring).
        self.secret = secret
        self.delay = delay
        self.jitter = jitter
        self.break_probability = break_probability
        self.loss_probability = loss_probability
        self.duplicate_probability = duplicate_probability
        self.capacity = capacity
        self._listeners: dict[str, trio.MemorySendChannel[trio.abc.Stream]] = {}
        self._blocked: set[frozenset[str]] = set()
        self._links: set[_MemoryLink] = set()
        self.connects = 0
        self.breaks = 0
        self.lost = 0  # frames dropped by `loss_probability`
        self.duplicated = 0  # frames delivered twice by `duplicate_probability`
        self.sent_bytes: Counter[str] = Counter()  # bytes written per sending address (what a node pays in wire)
        self._datagram_listeners: dict[str, trio.MemorySendChannel[tuple[float, bytes, str]]] = {}
        self.datagrams = 0  # datagrams sent (delivered or not)
        self.datagrams_lost = 0  # of them, lost to `loss_probability`, a partition, or nobody listening

    def transport(self, address: str) -> MemoryTransport:
        """The transport of the node that listens at `address` on this network."""
        split_address(address)
        return MemoryTransport(self, address)

    # -- faults -------------------------------------------------------------------------------------------

    def draw_delay(self) -> float:
        return self.delay + (self.rng.uniform(0.0, self.jitter) if self.jitter > 0 else 0.0)

    def draw_break(self) -> bool:
        if self.break_probability > 0 and self.rng.random() < self.break_probability:
            self.breaks += 1
            return True
        return False

    @property
    def message_faults(self) -> bool:
        """Whether single messages are lost or duplicated now (pipes then cut their bytes into frames)."""
        return self.loss_probability > 0 or self.duplicate_probability > 0

    def draw_copies(self) -> int:
        """How many times the next frame is delivered: 0 (lost), 1, or 2 (duplicated)."""
        if not self.message_faults:
            return 1
        loss, duplicate = self.loss_probability, self.duplicate_probability
        draw = self.rng.random()
        if draw < loss:
            self.lost += 1
            return 0
        if draw < loss + duplicate:
            self.duplicated += 1
            return 2
        return 1

    def block(self, a: str, b: str) -> None:
        """Cut `a` from `b` (both ways): connecting fails and open connections between them break."""
        self._blocked.add(frozenset((a, b)))
        self.break_links(a, b)

    def partition(self, *groups: Iterable[str]) -> None:
        """Block every pair of addresses that lie in different groups."""
        sets = [list(group) for group in groups]
        for i, left in enumerate(sets):
            for right in sets[i + 1 :]:
                for a in left:
                    for b in right:
                        self.block(a, b)

    def heal(self) -> None:
        """Lift every partition (connections broken by it stay broken; peers reconnect)."""
        self._blocked.clear()

    def blocked(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self._blocked

    def break_links(self, a: str, b: str | None = None) -> int:
        """Break the open connections of `a` (with `b` only, if given); returns how many broke."""
        doomed = [link for link in self._links if a in link.ends and (b is None or b in link.ends)]
        for link in doomed:
            link.break_()
        self.breaks += len(doomed)
        return len(doomed)

    # -- used by MemoryTransport --------------------------------------------------------------------------

    def _send_datagram(self, source: str, address: str, data: bytes) -> bool:
        """Deliver `data` after the network's delay, unless the network loses it (its loss probability, a
        partition, nobody listening, a full receive queue): a datagram's fate, silent to the sender."""
        self.datagrams += 1
        self.sent_bytes[source] += len(data)
        accept = self._datagram_listeners.get(address)
        lost = accept is None or self.blocked(source, address)
        copies = 0 if lost else self.draw_copies()
        for _ in range(copies):
            try:
                accept.send_nowait((trio.current_time() + self.draw_delay(), data, source))  # type: ignore[union-attr]
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                copies = 0
                break
        if not copies:
            self.datagrams_lost += 1
        return True

    async def _connect(self, source: str, address: str) -> trio.abc.Stream:
        await trio.sleep(self.draw_delay())
        if self.blocked(source, address):
            raise TransportError(f"cannot connect to peer {address}: unreachable (partitioned from {source})")
        accept = self._listeners.get(address)
        if accept is None:
            raise TransportError(f"cannot connect to peer {address}: connection refused (nothing listening)")
        link = _MemoryLink(self, source, address, self.capacity)
        self._links.add(link)
        try:
            accept.send_nowait(MemoryStream(link, 1))
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            link.break_()
            raise TransportError(f"cannot connect to peer {address}: connection refused (backlog full)") from None
        self.connects += 1
        return MemoryStream(link, 0)


class MemoryTransport:
    """The transport of one simulated node at `address` on a `MemoryNetwork`."""

    datagrams = True

    def __init__(self, network: MemoryNetwork, address: str) -> None:
        self.network = network
        self.address = address

    def send_datagram(self, address: str, data: bytes) -> bool:
        return self.network._send_datagram(self.address, address, data)

    async def serve_datagrams(
        self, handler: DatagramHandler, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Receive the datagrams sent to this node's address, each at its due time, in the order sent."""
        network = self.network
        if self.address in network._datagram_listeners:
            raise TransportError(f"cannot receive datagrams on {self.address}: the address is in use")
        send, receive = trio.open_memory_channel[tuple[float, bytes, str]](_DATAGRAM_QUEUE)
        network._datagram_listeners[self.address] = send
        try:
            task_status.started()
            async with receive:
                async for due, data, source in receive:
                    await trio.sleep_until(due)
                    await handler(data, source)
        finally:
            if network._datagram_listeners.get(self.address) is send:
                del network._datagram_listeners[self.address]
            send.close()

    async def connect(self, address: str) -> trio.abc.Stream:
        return await self.network._connect(self.address, address)

    async def serve(self, handler: Handler, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        network = self.network
        if self.address in network._listeners:
            raise TransportError(f"cannot listen on {self.address}: the address is in use")
        send, receive = trio.open_memory_channel[trio.abc.Stream](16)
        network._listeners[self.address] = send
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(self.address)
                async with receive:
                    async for stream in receive:
                        nursery.start_soon(handler, stream)
        finally:
            if network._listeners.get(self.address) is send:
                del network._listeners[self.address]
            send.close()
            # A node that stops serving is gone: its connections reset, as a killed process's would.
            network.break_links(self.address)
