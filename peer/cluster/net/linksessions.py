"""One connection between two peers, from its first bytes to its end: the handshake (as initiator or responder,
with the caps on handshakes under way), then a writer that batches the link's queued messages into frames and a
reader that hands every message to the node, until the connection ends, says goodbye or is superseded by the
pair's other connection (docs/cluster.md, "Peer links").

A mixin of `peer.cluster.net.peerlinks.PeerLinks`: it works on its attributes, set in `PeerLinks.__init__`.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import trio

from protocol import (
    DATAGRAM_VERSION,
    NEED_DATA,
    Connection,
    ConnectionClosed,
    Established,
    Event,
    Goodbye,
    LocalProtocolError,
    Message,
    Reject,
    RemoteProtocolError,
    Role,
    State,
)

if TYPE_CHECKING:
    from collections import Counter
    from collections.abc import Awaitable, Callable

    from protocol import Limits


__all__ = ["IO_ERRORS", "LinkError", "Session", "Sessions"]

# the links' records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.peerlinks")

IO_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class LinkError(Exception):
    """A link to a peer could not be established: unreachable, refused, or it failed the handshake."""


class Session:
    """One established connection."""

    def __init__(self, conn: Connection, stream: trio.abc.Stream, peer_id: str, dialer: str) -> None:
        self.conn = conn
        self.stream = stream
        self.peer_id = peer_id
        self.dialer = dialer
        self.scope = trio.CancelScope()
        self.lock = trio.Lock()
        self.established_at = trio.current_time()
        self.superseded = False
        self.evict = False  # asked to close as the least recently used idle link (PeerLinks.max_links)
        self.wait_scope: trio.CancelScope | None = None  # the writer's wait for the next message, while it waits
        self.idle_checked = -math.inf  # when the writer last found the link idle but busy
        self.written = False  # whether the writer has written a batch on this connection yet

    async def write(self, data: bytes) -> None:
        if data:
            async with self.lock:
                await self.stream.send_all(data)

    async def goodbye(self, reason: str, timeout: float, sent: Counter[str] | None = None,
                      sent_bytes: Counter[str] | None = None) -> None:
        """Send Goodbye if the connection can still take it; never raises, never waits longer than `timeout`.
        `sent` and `sent_bytes`: the links' counters of messages and bytes sent by kind, counted in if it is sent."""
        with trio.move_on_after(timeout) as scope:
            scope.shield = True
            try:
                if not self.conn.sent_close and self.conn.state is State.ESTABLISHED:
                    frame = self.conn.send(Goodbye(reason=reason))
                    await self.write(frame)
                    if sent is not None and sent_bytes is not None:
                        sent["Goodbye"] += 1
                        sent_bytes["Goodbye"] += len(frame)
            except (*IO_ERRORS, LocalProtocolError):
                pass


class Sessions:
    """The connections of the peer links: accepted, handshaken, run. A `link` is a `PeerLink`
    (peer/cluster/net/peerlinks.py), which holds the peer's queue and its current `Session`."""

    if TYPE_CHECKING:
        # What this part uses of the PeerLinks it is mixed into: attributes and its other parts' methods.
        _codecs: tuple[str, ...]
        _compressions: tuple[str, ...]
        # LinkConfig and PeerLink live in peerlinks, the module that composes this part: named as Any here so
        # the part does not import its composer
        config: Any
        datagram_peers: dict[str, bool]
        handler_errors: int
        handshake_failures: int
        _limits: Limits
        _links: dict[str, Any]
        node_id: str
        _nonce: Callable[[int], bytes]
        _on_message: Callable[[str, Message], Awaitable[None]]
        received_kinds: Counter[str]
        sent_kinds: Counter[str]
        sent_kind_bytes: Counter[str]
        dialled_for: Counter[str]
        refused: Counter[str]
        _secret: bytes
        _unauthenticated: int
        _unauthenticated_by_source: Counter[str]
        _versions: tuple[int, ...]

        def _close_idle(self, link: Any, session: Session) -> bool: ...
        def _idle_deadline(self, link: Any, session: Session) -> float: ...
        def link(self, peer_id: str, address: str | None = None) -> Any: ...

    async def _accept(self, stream: trio.abc.Stream) -> None:
        """Transport handler: handshake as responder, then run the connection as the link to that peer.

        Connections still in their handshake are capped in all and per source address; past a cap one is
        closed at once, unread. Refusals are counted in `refused` and logged at debug level."""
        source = _source_of(stream)
        config = self.config
        if self._unauthenticated >= config.max_unauthenticated:
            reason = "capacity"
        elif self._unauthenticated_by_source[source] >= config.max_unauthenticated_per_source:
            reason = "per-source"
        else:
            reason = ""
        if reason:
            self.refused[reason] += 1
            log.debug("inbound connection from %s refused: too many handshakes under way (%s)", source, reason)
            await trio.aclose_forcefully(stream)
            return
        self._unauthenticated += 1
        self._unauthenticated_by_source[source] += 1
        try:
            with trio.fail_after(config.handshake_timeout):
                session = await self._handshake(stream, Role.RESPONDER, expected=None)
        except (LinkError, trio.TooSlowError) as exc:
            self.refused["handshake"] += 1
            log.debug("inbound connection from %s to %s refused: %s", source, self.node_id, exc)
            await trio.aclose_forcefully(stream)
            return
        finally:
            self._unauthenticated -= 1
            self._unauthenticated_by_source[source] -= 1
            if self._unauthenticated_by_source[source] <= 0:
                del self._unauthenticated_by_source[source]
        existing = self._links.get(session.peer_id)
        link = existing if existing is not None else self.link(session.peer_id)
        await self._run_session(link, session)

    async def _handshake(self, stream: trio.abc.Stream, role: Role, *, expected: str | None) -> Session:
        conn = Connection(
            role,
            node_id=self.node_id,
            secret=self._secret,
            nonce=self._nonce,
            limits=self._limits,
            versions=self._versions,
            codecs=self._codecs,
            compressions=self._compressions,
        )
        try:
            if role is Role.INITIATOR:
                hello = conn.initiate()
                await stream.send_all(hello)
                self._count_handshake(len(hello))
            event = await _next_event(conn, stream, on_reply=self._count_handshake)
            if isinstance(event, Reject):
                raise LinkError(f"peer refused the connection: {event.reason}")
            if not isinstance(event, Established):
                raise LinkError(f"peer closed the connection during the handshake ({type(event).__name__})")
            peer_id = event.node_id
            problem = None
            if peer_id == self.node_id:
                problem = f"peer claims our own node id {peer_id!r}"
            elif expected is not None and peer_id != expected:
                problem = f"expected node {expected!r} at this address, reached {peer_id!r}"
            if problem is not None:
                reject = conn.send(Reject(reason=problem))
                await stream.send_all(reject)
                self._count_handshake(len(reject))
                raise LinkError(problem)
        except RemoteProtocolError as exc:
            self.handshake_failures += 1
            await trio.aclose_forcefully(stream)
            raise LinkError(f"handshake failed: {exc}") from exc
        except (LinkError, *IO_ERRORS) as exc:
            if isinstance(exc, LinkError):
                self.handshake_failures += 1
            await trio.aclose_forcefully(stream)
            if isinstance(exc, LinkError):
                raise
            raise LinkError(f"connection lost during the handshake: {exc}") from exc
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        dialer = self.node_id if role is Role.INITIATOR else peer_id
        if event.version < DATAGRAM_VERSION:
            self.datagram_peers[peer_id] = False  # an older version: it takes no datagrams, probe it over links
        return Session(conn, stream, peer_id, dialer)

    def _count_handshake(self, size: int) -> None:
        """Frames the connection made itself were written (Hello, Challenge, Welcome, a Reject): kind "handshake"."""
        self.sent_kinds["handshake"] += 1
        self.sent_kind_bytes["handshake"] += size

    async def _run_session(self, link: Any, session: Session, adopted: bool | None = None) -> None:
        """Run one established connection as `link`'s current one until it ends or is superseded."""
        timeout = self.config.goodbye_timeout
        try:
            if adopted is None:
                adopted = link._adopt(session, settle=self.config.handshake_timeout)
            if adopted:
                with session.scope:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._writer, link, session)
                        await self._reader(link, session)
                        nursery.cancel_scope.cancel()
            if not adopted or session.superseded:
                # The duplicate of a connection we keep: tell the peer, and still deliver what it wrote on this
                # one before it heard, so the rule costs no messages.
                await session.goodbye("duplicate link", timeout, self.sent_kinds, self.sent_kind_bytes)
                with trio.move_on_after(timeout):
                    await self._reader(link, session)
        finally:
            link._release(session)
            await trio.aclose_forcefully(session.stream)

    async def _writer(self, link: Any, session: Session) -> None:
        while True:
            if link._carry:
                batch, link._carry = link._carry, []
            else:
                got: list[Message] = []
                with trio.move_on_at(self._idle_deadline(link, session)) as session.wait_scope:
                    try:
                        got.append(await link._recv_q.receive())
                    except (trio.EndOfChannel, trio.ClosedResourceError):
                        # The link was forgotten and its queue is drained: say goodbye, give the peer a moment to
                        # answer.
                        await session.goodbye(link._goodbye_reason, self.config.goodbye_timeout, self.sent_kinds,
                                              self.sent_kind_bytes)
                        session.scope.deadline = min(session.scope.deadline,
                                                     trio.current_time() + self.config.goodbye_timeout)
                        return
                    finally:
                        session.wait_scope = None
                if not got:
                    if self._close_idle(link, session):
                        # Idle (or the least recently used past the cap): say so; the peer answers and neither
                        # side dials again until it has something to send. What the peer wrote meanwhile is
                        # still read until its answer or the goodbye timeout.
                        await session.goodbye("idle", self.config.goodbye_timeout, self.sent_kinds,
                                              self.sent_kind_bytes)
                        session.scope.deadline = min(session.scope.deadline,
                                                     trio.current_time() + self.config.goodbye_timeout)
                        return
                    continue
                batch = got
            while len(batch) < 64:
                try:
                    batch.append(link._recv_q.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
            if session.conn.sent_close or session.superseded:
                # This connection is ending (it said Goodbye, or a duplicate replaced it): keep the batch for the
                # next one instead of failing it here.
                link._carry = batch + link._carry
                return
            frames = []
            kinds = []
            for message in batch:
                try:
                    frames.append(session.conn.send(message))
                except LocalProtocolError as exc:
                    link.dropped += 1
                    log.error("message to %s dropped, it is invalid: %s", link.peer_id, exc)
                    continue
                kinds.append(type(message).__name__)
            try:
                await session.write(b"".join(frames))
            except IO_ERRORS:
                link._carry = batch + link._carry  # maybe partly delivered: a duplicate is harmless, a loss not
                session.scope.cancel()
                return
            except trio.Cancelled:
                link._carry = batch + link._carry
                raise
            link.sent += len(frames)
            if not session.written:
                session.written = True
                if session.dialer == self.node_id and kinds:
                    self.dialled_for[kinds[0]] += 1
            sent, sent_bytes = self.sent_kinds, self.sent_kind_bytes
            for kind, frame in zip(kinds, frames, strict=True):
                sent[kind] += 1
                sent_bytes[kind] += len(frame)

    async def _reader(self, link: Any, session: Session) -> None:
        conn, stream = session.conn, session.stream
        while True:
            try:
                event = await _next_event(conn, stream, session, self._count_handshake)
            except RemoteProtocolError as exc:
                log.warning("peer %s broke the protocol, connection closed: %s", link.peer_id, exc)
                return
            except IO_ERRORS:
                return
            if isinstance(event, ConnectionClosed):
                return
            if isinstance(event, Reject):
                log.warning("peer %s rejected the connection: %s", link.peer_id, event.reason)
                return
            if isinstance(event, Goodbye):
                if event.reason == "idle":
                    link._dormant = True  # the peer found the link idle: dial again only to send
                await session.goodbye("goodbye", self.config.goodbye_timeout, self.sent_kinds, self.sent_kind_bytes)
                return
            if isinstance(event, Established):
                continue
            link.received += 1
            self.received_kinds[type(event).__name__] += 1
            link.last_active = trio.current_time()
            try:
                await self._on_message(link.peer_id, event)
            except Exception as exc:  # noqa: BLE001 - one peer's message must not end the node
                self.handler_errors += 1
                log.error("handling %s from peer %s failed; connection closed", type(event).__name__,
                          link.peer_id, exc_info=exc)
                return


async def _next_event(conn: Connection, stream: trio.abc.Stream, session: Session | None = None,
                      on_reply: Callable[[int], None] | None = None) -> Event:
    """docs/protocol.md section 7: flush what the connection made after every step; read only on NEED_DATA.
    `on_reply` is told the size of each such write (handshake replies, a Reject)."""
    while True:
        try:
            event = conn.next_event()
        finally:
            if out := conn.data_to_send():
                if session is not None:
                    await session.write(out)
                else:
                    await stream.send_all(out)
                if on_reply is not None:
                    on_reply(len(out))
        if event is not NEED_DATA:
            return event
        # Before the handshake completes, read no more than a handshake frame at a time: a stranger's
        # connection then costs a few KiB, however much it sends.
        data = await stream.receive_some(65536 if conn.state is State.ESTABLISHED else _HANDSHAKE_READ)
        conn.receive_data(data if isinstance(data, bytes) else bytes(data))


#: Bytes read at a time during the handshake.
_HANDSHAKE_READ = 4096


def _source_of(stream: trio.abc.Stream) -> str:
    """The peer's address without its port (the unit of the per-source cap); "?" when the stream has none."""
    inner = getattr(stream, "transport_stream", stream)  # under TLS, the TCP stream
    sock = getattr(inner, "socket", None)
    if sock is None:
        return "?"
    try:
        peer = sock.getpeername()
    except OSError:
        return "?"
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)
