"""Persistent authenticated links between peers, one per pair of nodes, over any `Transport`.

Each peer gets a `PeerLink`: a bounded queue of outgoing messages and at most one live connection that speaks
`protocol.Connection` (HMAC handshake on the cluster secret first). A link redials with exponential back-off and
jitter while it is wanted, and keeps its queue across reconnects; a message that was being written when a
connection broke may be lost, so the layers above treat delivery as at-most-once and acknowledge what matters
(URL batches, hand-off chunks), as SWIM already does for probes.

Both nodes may dial each other at the same moment. Each then briefly holds two connections and both keep the
same one by a rule that needs no coordination: the connection dialled by the lower node id wins; the other is
closed with Goodbye("duplicate link"). A connection from the same dialer replaces the older one (the dialer
redials only when it saw its connection die), and so does any connection that arrives after the current one
has settled (older than the handshake timeout), because the peer dials only when its side of the link is gone.

Links are bounded (docs/cluster.md, "Bounding links"). A connection with no traffic either way for
`idle_timeout` seconds closes with Goodbye("idle"), and past `max_links` live connections the least recently
used idle one closes first; a link whose peer the `busy` predicate names (unacknowledged URL batches, an
awaited hand-off) is never closed for idleness. Either side of an idle-closed link dials again only when it has
something to send: the link object, its counters and its (empty) queue stay, but no task runs for it. A link
dials while it has something to send, or until its first idle close (a link never closed for idleness
reconnects as soon as its connection breaks, as before).

Datagrams (protocol version 5). When the transport carries them (`DatagramTransport`, LinkConfig.datagrams), the
probes and the partial gossip of membership may go without a link: `send_datagram` writes one authenticated datagram
(protocol/_datagram.py), and datagrams that arrive go to `on_datagram(peer_id, message)`. A peer is known to take
datagrams once one came from it (`datagram_peers[peer] is True`), and known not to when a link to it agreed on a
version before 5 (False); the membership sends probes to a peer not known either way by datagram and, if no
answer comes, over its link too, so a cluster being upgraded loses no probes.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from protocol import (
    CODECS,
    MIN_SECRET_SIZE,
    Limits,
    LocalProtocolError,
    Message,
    RemoteProtocolError,
    SUPPORTED_VERSIONS,
    Role,
    datagram_key,
    decode_datagram,
    encode_datagram,
)

from peer.cluster.net.linksessions import LinkError, Session, Sessions
from peer.cluster.net.transport import DatagramTransport, Transport, TransportError
from peer.config import DEFAULTS

__all__ = ["LinkConfig", "LinkError", "MessageHandler", "PeerLink", "PeerLinks"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.peerlinks")

MessageHandler = Callable[[str, Message], Awaitable[None]]





@dataclass(frozen=True, slots=True, kw_only=True)
class LinkConfig:
    """Link tuning; every default has its reason."""

    # Messages waiting per peer: enough for bursts of gossip and batches; beyond it senders feel back-pressure.
    queue_size: int = 256
    # A healthy peer answers a handshake within milliseconds; 5 s covers a loaded machine.
    handshake_timeout: float = 5.0
    # First redial after 100 ms, doubling to at most 10 s: quick after a blip, cheap for a node that is gone.
    backoff_initial: float = 0.1
    backoff_max: float = 10.0
    # Time given to a Goodbye (and the peer's answer) before the connection is simply closed.
    goodbye_timeout: float = 1.0
    # Inbound connections still in their handshake, in all and per source address. A cluster dials a node once
    # per peer (a few at once after a restart); past these, a stranger's flood is refused at accept, so what it
    # can make us hold is bounded: 256 x (4 KiB frame limit + one 4 KiB read) is about 2 MiB.
    max_unauthenticated: int = 256
    max_unauthenticated_per_source: int = 16
    # The operator's settings (default and reason in peer.config FIELDS): 0 turns each bound off.
    idle_timeout: float = DEFAULTS["link_idle_timeout"]
    max_links: int = DEFAULTS["max_links"]
    # Membership's probes and partial gossip by datagram when the transport carries them: a node of a large cluster
    # probes a different peer every second, and over a link each probe would first cost a handshake (docs/cluster.md,
    # "What a node pays for each additional peer"). The operator's peer_datagrams.
    datagrams: bool = True

    def __post_init__(self) -> None:
        if self.queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {self.queue_size}")
        if self.max_unauthenticated < 1 or self.max_unauthenticated_per_source < 1:
            raise ValueError("max_unauthenticated and max_unauthenticated_per_source must be at least 1")
        if self.idle_timeout < 0 or self.max_links < 0:
            raise ValueError(f"idle_timeout and max_links must be >= 0 (0: no bound), got {self.idle_timeout!r} "
                             f"and {self.max_links!r}")
        for name in ("handshake_timeout", "backoff_initial", "backoff_max", "goodbye_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)!r}")


class PeerLink:
    """The link to one peer: its outgoing queue and its current connection, if any."""

    def __init__(self, owner: PeerLinks, peer_id: str, address: str | None) -> None:
        self.peer_id = peer_id
        self.address = address
        self._owner = owner
        self._send_q, self._recv_q = trio.open_memory_channel[Message](owner.config.queue_size)
        self._current: Session | None = None
        self._changed = trio.Event()
        self._closing = False
        self._goodbye_reason = "closing"
        self._dial_scope = trio.CancelScope()
        self._done = trio.Event()  # set while no dialer task runs for the link
        self._done.set()
        self._maintained = False  # a dialer task runs for the link
        self._dormant = False  # closed for idleness: dial again only when there is something to send
        self.last_active = trio.current_time()  # when a message was last queued or received
        # Messages taken from the queue by a connection that ended before writing them (it was superseded by a
        # duplicate, or said Goodbye): the next connection sends them first, so a closing connection loses none.
        self._carry: list[Message] = []
        self.sent = 0
        self.received = 0
        self.dropped = 0
        self.connects = 0
        self.idle_closes = 0  # connections this side closed for idleness (or as the least recently used)

    @property
    def connected(self) -> bool:
        return self._current is not None

    @property
    def dialer(self) -> str | None:
        """The node that dialled the current connection (the lower id, after a simultaneous dial), or None."""
        return None if self._current is None else self._current.dialer

    @property
    def closing(self) -> bool:
        return self._closing

    def send_nowait(self, message: Message) -> bool:
        """Queue `message`; False (and counted as dropped) if the queue is full or the link is closing."""
        try:
            self._send_q.send_nowait(message)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.dropped += 1
            return False
        self._used()
        return True

    async def send(self, message: Message) -> None:
        """Queue `message`, waiting for room; LinkError if the link is closing."""
        try:
            await self._send_q.send(message)
        except trio.ClosedResourceError:
            raise LinkError(f"the link to {self.peer_id} is closing") from None
        self._used()

    @property
    def pending(self) -> bool:
        """Whether messages wait to be written (queued, or carried over from a connection that ended)."""
        return bool(self._carry) or self._recv_q.statistics().current_buffer_used > 0

    def _used(self) -> None:
        self.last_active = trio.current_time()
        self._dormant = False
        self._owner._maintain_if_needed(self)

    # -- session bookkeeping ------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _adopt(self, new: Session, settle: float) -> bool:
        """Whether `new` becomes the current connection (see the module docstring for the rule)."""
        current = self._current
        if current is not None:
            if self._closing:
                return False
            preferred = min(self._owner.node_id, self.peer_id)
            settled = trio.current_time() - current.established_at >= settle
            if not (new.dialer == current.dialer or new.dialer == preferred or settled):
                return False
            current.superseded = True
            current.scope.cancel()
        else:
            self._owner._live += 1
        self._current = new
        self.connects += 1
        self.last_active = trio.current_time()
        self._notify()
        self._owner._enforce_cap()
        return True

    def _release(self, session: Session) -> None:
        if self._current is session:
            self._current = None
            self._owner._live -= 1
            self._notify()
            self._owner._maintain_if_needed(self)

    def _set_address(self, address: str | None) -> None:
        if address is not None and address != self.address:
            self.address = address
            self._notify()
            self._owner._maintain_if_needed(self)

    def _wants_dialer(self) -> bool:
        """Whether a dialer task has work: no connection, an address, and something to send (or, for a link
        never closed for idleness, the wish to stay connected)."""
        if self._current is not None or self.address is None:
            return False
        if self._closing:  # a forgotten link dials once more only to deliver what was queued before
            return self._recv_q.statistics().current_buffer_used > 0
        return self.pending or not self._dormant


class PeerLinks(Sessions):
    """Every link of one node: serves inbound connections, dials outbound ones, delivers what arrives.

    Run it with `await nursery.start(links.run)` (reports the bound address); messages from peers go to
    `on_message(peer_id, message)`, awaited in the connection's reader (so a slow handler slows that peer).
    """

    def __init__(
        self,
        *,
        node_id: str,
        secret: bytes,
        transport: Transport,
        on_message: MessageHandler,
        rng: random.Random,
        config: LinkConfig | None = None,
        limits: Limits | None = None,
        nonce: Callable[[int], bytes] = os.urandom,
        busy: Callable[[str], bool] | None = None,
        address_of: Callable[[str], str | None] | None = None,
        on_datagram: MessageHandler | None = None,
        # what this node speaks: every version it knows, unless held to older ones (as a node of that version is)
        versions: Sequence[int] = SUPPORTED_VERSIONS,
        codecs: Sequence[str] = CODECS,
        # brotli first: with protocol version 2's URL columns, about 29 bytes per URL instead of 128 unpacked
        compressions: Sequence[str] = ("br", "zlib", "none"),
    ) -> None:
        if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_SIZE:
            raise ValueError(f"cluster_secret must be at least {MIN_SECRET_SIZE} bytes")
        self.node_id = node_id
        self.config = config or LinkConfig()
        self.address: str | None = None
        self._secret = secret
        self._transport = transport
        self._on_message = on_message
        self._rng = rng
        self._limits = limits or Limits()
        self._nonce = nonce
        self._versions = tuple(versions)
        self._codecs = tuple(codecs)
        self._compressions = tuple(compressions)
        self._links: dict[str, PeerLink] = {}
        self._nursery: trio.Nursery | None = None
        #: Whether a peer's link carries what must not be cut for idleness (the Cluster's `link_busy`).
        self.busy: Callable[[str], bool] = busy or _never
        # Where a peer listens, for a link learned from an inbound connection that must dial to send (after
        # its idle close): the membership's view.
        self._address_of: Callable[[str], str | None] = address_of or _nowhere
        self._live = 0  # links with a connection
        #: Connections closed for idleness, and as the least recently used past `max_links`.
        self.idle_closes = 0
        self.evictions = 0
        self.handshake_failures = 0
        #: Inbound connections refused before or during the handshake, by reason ("handshake", "capacity",
        #: "per-source"); each is logged at debug level only, so a fuzzer or a flood cannot flood the log.
        self.refused: collections.Counter[str] = collections.Counter()
        #: Connections closed because handling a peer's message raised (the node goes on).
        self.handler_errors = 0
        #: Messages received from peers, by type (what a node pays for each kind of traffic).
        self.received_kinds: collections.Counter[str] = collections.Counter()
        #: Messages and bytes written to peers, by kind: a message's type, "handshake" for the frames of a
        #: connection's handshake (and a Reject), a datagram's type with " (datagram)" after it.
        self.sent_kinds: collections.Counter[str] = collections.Counter()
        self.sent_kind_bytes: collections.Counter[str] = collections.Counter()
        #: Connections this node dialled, by the kind of the first message written on them (what a new link was
        #: opened for).
        self.dialled_for: collections.Counter[str] = collections.Counter()
        self._unauthenticated = 0
        self._unauthenticated_by_source: collections.Counter[str] = collections.Counter()
        self._on_datagram = on_datagram
        self._datagram_key = datagram_key(secret)
        self._datagrams = False  # datagrams are being served (set by run)
        #: peer -> True once a datagram came from it, False when a link to it agreed on a version before 5.
        self.datagram_peers: dict[str, bool] = {}
        self.datagrams_sent = 0
        self.datagrams_received = 0
        #: Datagrams refused (not ours, a wrong tag, malformed), each logged at debug level only.
        self.datagrams_refused = 0

    # -- service ------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve and maintain links until cancelled; reports the address the transport bound."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                self.address = await nursery.start(self._transport.serve, self._accept)
                await self._serve_datagrams(nursery)
                task_status.started(self.address)
                await trio.sleep_forever()
            finally:
                self._nursery = None

    async def _serve_datagrams(self, nursery: trio.Nursery) -> None:
        transport = self._transport
        if not (self.config.datagrams and self._on_datagram is not None and isinstance(transport, DatagramTransport)
                and transport.datagrams):
            return
        try:
            await nursery.start(transport.serve_datagrams, self._receive_datagram)
        except TransportError as exc:
            log.warning("%s: probes go over links only: %s", self.node_id, exc)
            return
        self._datagrams = True

    # -- public API ---------------------------------------------------------------------------------------

    @property
    def datagrams(self) -> bool:
        """Whether this node sends and receives datagrams."""
        return self._datagrams

    def send_datagram(self, peer_id: str, message: Message, *, address: str | None = None) -> bool:
        """Send `message` (a probe, or a partial gossip that fits) to `peer_id` as one datagram; False if it could not be sent here (no
        datagrams, no address known, a full send queue). Delivery is never promised."""
        if not self._datagrams:
            return False
        address = address or self._address_of(peer_id)
        if address is None:
            return False
        try:
            data = encode_datagram(message, key=self._datagram_key, sender=self.node_id, recipient=peer_id,
                                   limits=self._limits)
        except LocalProtocolError as exc:  # not a datagram's message, or too large for one: the caller uses the link
            log.debug("%s to %s not sent as a datagram: %s", type(message).__name__, peer_id, exc)
            return False
        assert isinstance(self._transport, DatagramTransport)
        if not self._transport.send_datagram(address, data):
            return False
        self.datagrams_sent += 1
        kind = f"{type(message).__name__} (datagram)"
        self.sent_kinds[kind] += 1
        self.sent_kind_bytes[kind] += len(data)
        return True

    async def _receive_datagram(self, data: bytes, source: str) -> None:
        try:
            peer_id, message = decode_datagram(data, key=self._datagram_key, recipient=self.node_id,
                                               limits=self._limits)
            if peer_id == self.node_id:
                raise RemoteProtocolError(f"datagram claims our own node id {peer_id!r}")
        except RemoteProtocolError as exc:
            self.datagrams_refused += 1
            log.debug("datagram from %s to %s refused: %s", source, self.node_id, exc)
            return
        self.datagrams_received += 1
        self.datagram_peers[peer_id] = True
        self.received_kinds[type(message).__name__] += 1
        assert self._on_datagram is not None
        try:
            await self._on_datagram(peer_id, message)
        except Exception as exc:  # noqa: BLE001 - one peer's datagram must not end the node
            self.handler_errors += 1
            log.error("handling datagram %s from peer %s failed", type(message).__name__, peer_id, exc_info=exc)

    def link(self, peer_id: str, address: str | None = None) -> PeerLink:
        """The link to `peer_id`, created (and dialled, once its address is known) if needed."""
        if peer_id == self.node_id:
            raise ValueError(f"a node does not link to itself ({peer_id!r})")
        link = self._links.get(peer_id)
        if link is None:
            if self._nursery is None:
                raise RuntimeError("PeerLinks.run() is not running")
            link = PeerLink(self, peer_id, address)
            self._links[peer_id] = link
            self._maintain_if_needed(link)
        else:
            link._set_address(address)
        return link

    def get(self, peer_id: str) -> PeerLink | None:
        return self._links.get(peer_id)

    def send_nowait(self, peer_id: str, message: Message, *, address: str | None = None) -> bool:
        """Queue `message` for `peer_id` without waiting; False if its queue is full."""
        return self.link(peer_id, address).send_nowait(message)

    async def send(self, peer_id: str, message: Message, *, address: str | None = None) -> None:
        """Queue `message` for `peer_id`, waiting for room in its queue."""
        await self.link(peer_id, address).send(message)

    def connected_peers(self) -> list[str]:
        return sorted(peer_id for peer_id, link in self._links.items() if link.connected)

    @property
    def live(self) -> int:
        """Links with a connection now (what `max_links` bounds)."""
        return self._live

    def forget(self, peer_id: str, reason: str = "forgotten") -> None:
        """Stop keeping a link to `peer_id`: what is queued is written, then Goodbye(reason), then it closes."""
        self.datagram_peers.pop(peer_id, None)
        link = self._links.pop(peer_id, None)
        if link is None:
            return
        link._closing = True
        link._goodbye_reason = reason
        link._send_q.close()
        if link._recv_q.statistics().current_buffer_used == 0:
            link._dial_scope.cancel()  # nothing to deliver: no point finishing a dial in progress
        link._notify()
        self._maintain_if_needed(link)

    async def close_all(self, reason: str) -> None:
        """Gracefully close every link (queued messages first, then Goodbye). Bounded: a dial in progress gets
        the handshake timeout, a Goodbye the goodbye timeout."""
        links = list(self._links.values())
        for link in links:
            self.forget(link.peer_id, reason)
        with trio.move_on_after(self.config.handshake_timeout + 2 * self.config.goodbye_timeout):
            for link in links:
                while link._current is not None or not link._done.is_set():
                    with trio.move_on_after(self.config.goodbye_timeout):
                        await link._changed.wait()

    async def introduce(self, address: str) -> str:
        """Connect to whoever listens at `address` (a seed), adopt the connection as its link; its node id."""
        try:
            with trio.fail_after(self.config.handshake_timeout):
                stream = await self._transport.connect(address)
                session = await self._handshake(stream, Role.INITIATOR, expected=None)
        except TransportError as exc:
            raise LinkError(str(exc)) from exc
        except trio.TooSlowError:
            raise LinkError(f"peer at {address} did not complete the handshake in time") from None
        link = self.link(session.peer_id, address)
        # Adopt now, before the link's dialer first runs, so it does not dial a second connection.
        adopted = link._adopt(session, settle=self.config.handshake_timeout)
        assert self._nursery is not None
        self._nursery.start_soon(self._run_session, link, session, adopted)
        return session.peer_id

    # -- internals ----------------------------------------------------------------------------------------

    def backoff(self, failures: int) -> float:
        """Seconds to wait after `failures` consecutive failures: doubling from the initial delay up to the
        maximum, times a random factor in [0.5, 1] so that peers that failed together do not retry together."""
        base = min(self.config.backoff_max, self.config.backoff_initial * 2 ** max(0, failures - 1))
        return base * self._rng.uniform(0.5, 1.0)

    def _maintain_if_needed(self, link: PeerLink) -> None:
        """Start `link`'s dialer task if it has work and none runs; it ends when the work is gone (a connection
        is up, or nothing is to be sent over a link closed for idleness), so an idle link costs no task."""
        if link.address is None and link._current is None and link.pending:
            link.address = self._address_of(link.peer_id)
        if link._maintained or self._nursery is None or not link._wants_dialer():
            return
        link._maintained = True
        link._done = trio.Event()
        self._nursery.start_soon(self._maintain, link)

    async def _maintain(self, link: PeerLink) -> None:
        """Dial `link` while it wants a connection and has none; back off on failures."""
        try:
            await self._dial_loop(link)
        finally:
            link._maintained = False
            link._done.set()
            link._notify()
            if not link._closing and self._links.get(link.peer_id) is link:
                self._maintain_if_needed(link)  # work that arrived as the loop ended

    async def _dial_loop(self, link: PeerLink) -> None:
        failures = 0
        while True:
            if not link._wants_dialer():
                return
            address = link.address
            assert address is not None
            session: Session | None = None
            link._dial_scope = trio.CancelScope()
            with link._dial_scope:
                try:
                    with trio.fail_after(self.config.handshake_timeout):
                        stream = await self._transport.connect(address)
                        session = await self._handshake(stream, Role.INITIATOR, expected=link.peer_id)
                except (LinkError, TransportError, trio.TooSlowError) as exc:
                    log.debug("link %s -> %s (%s): %s", self.node_id, link.peer_id, address, exc)
            if link._closing:
                if session is not None:  # deliver the queue, then Goodbye
                    await self._run_session(link, session)
                break
            if session is None:
                failures += 1
            else:
                started = trio.current_time()
                await self._run_session(link, session)
                if link._dormant:  # closed for idleness, not failed: dial at once if something waits, or end
                    failures = 0
                    continue
                lasted = trio.current_time() - started
                failures = 1 if lasted >= self.config.backoff_max else failures + 1
            with trio.move_on_after(self.backoff(failures)):  # back off, unless forgotten or connected meanwhile
                while link._current is None and not link._closing:
                    await link._changed.wait()

    def _enforce_cap(self) -> None:
        """Past `max_links` live connections, ask the least recently used idle ones to close (a link with
        something queued, or busy, is never chosen: the cap is then exceeded until one is idle). Only the links
        waiting for a message are candidates, and they are asked whether they are idle (queued messages, the
        `busy` predicate) in order of last use until enough are found: a node at the cap pays a sort of its
        waiting links per new connection, not a question to each."""
        cap = self.config.max_links
        if not cap or self._live <= cap:
            return
        closing = 0
        waiting = []
        for link in self._links.values():
            session = link._current
            if session is None:
                continue
            if session.evict or session.conn.sent_close:
                closing += 1
            elif session.wait_scope is not None:
                waiting.append(link)
        excess = self._live - closing - cap
        if excess <= 0:
            return
        waiting.sort(key=lambda link: link.last_active)
        for link in waiting:
            if link.pending or self.busy(link.peer_id):
                continue
            session = link._current
            assert session is not None and session.wait_scope is not None
            session.evict = True
            session.wait_scope.cancel()
            excess -= 1
            if excess <= 0:
                return

    def _idle_deadline(self, link: PeerLink, session: Session) -> float:
        idle = self.config.idle_timeout
        return max(link.last_active, session.idle_checked) + idle if idle else math.inf

    def _close_idle(self, link: PeerLink, session: Session) -> bool:
        """Whether the writer, having waited in vain for a message, should close the connection now."""
        if link.pending or link._closing:
            return False
        now = trio.current_time()
        due = bool(self.config.idle_timeout) and now >= self._idle_deadline(link, session)
        if not (due or session.evict):
            return False
        if self.busy(link.peer_id):
            session.evict = False
            session.idle_checked = now
            return False
        if session.evict:
            self.evictions += 1
        else:
            self.idle_closes += 1
        link.idle_closes += 1
        link._dormant = True
        return True


def _never(peer_id: str) -> bool:
    return False


def _nowhere(peer_id: str) -> str | None:
    return None
