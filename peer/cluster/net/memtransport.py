"""The in-memory network: many nodes in one `trio.run`, so a cluster can be simulated under `MockClock`
(`MemoryNetwork`, its `MemoryTransport` per node, `MemoryStream` per connection), behind the same `Transport`
seam as TCP (peer/cluster/net/transport.py). Datagrams arrive after the network's delay, are lost at its loss
probability and never cross a partition.

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
import math
import random
from base64 import b64decode
from collections import Counter
from collections.abc import Iterable

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

from peer.cluster.net.transport import (
    DATAGRAM_QUEUE, DatagramHandler, Handler, TransportError, split_address,
)

__all__ = ["MemoryNetwork", "MemoryStream", "MemoryTransport"]


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
        initiator, responder = link.nonces
        if link.keys is None and initiator and responder:
            link.keys = frame_keys(secret, initiator_nonce=initiator, responder_nonce=responder)
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
        self.network._drop(self)


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
                self._link.network._drop(self._link)
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
        #: the open connections of each address, so that breaking one node's costs its connections, not all of them
        self._links_of: dict[str, set[_MemoryLink]] = {}
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
        doomed = [link for link in self._links_of.get(a, ()) if b is None or b in link.ends]
        for link in doomed:
            link.break_()
        self.breaks += len(doomed)
        return len(doomed)

    def _drop(self, link: _MemoryLink) -> None:
        """`link` is closed or broken: no longer open."""
        self._links.discard(link)
        for end in link.ends:
            links = self._links_of.get(end)
            if links is not None:
                links.discard(link)
                if not links:
                    del self._links_of[end]

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
        for end in link.ends:
            self._links_of.setdefault(end, set()).add(link)
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
        send, receive = trio.open_memory_channel[tuple[float, bytes, str]](DATAGRAM_QUEUE)
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
