"""What a `Handoff` is built with: its tuning (`HandoffConfig`, every default with its reason), the links it sends
on (`HandoffLinks`), and what it asks of the node around it (`HandoffDelegate`, memberlist's delegate: one
protocol, not loose callables; `Alone` for a hand-off on its own, the `Cluster` for a node in a fleet).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from protocol import HostState as WireHostState
from protocol import Message
from storage import HostState, QueuedUrl

from peer.config import DEFAULTS

__all__ = ["Alone", "HandoffConfig", "HandoffDelegate", "HandoffLinks", "Hold"]


class HandoffLinks(Protocol):
    """What the hand-off needs of `PeerLinks`: queue a message for a peer (False if its queue is full)."""

    def send_nowait(self, peer_id: str, message: Message) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffConfig:
    """Hand-off tuning; every default has its reason."""

    # 10,000 keys of 16 bytes is about 200 KB of msgpack: a fifth of the 1 MiB frame limit.
    keys_per_chunk: int = 10_000
    # URL chunks are cut by bytes too: 512 KB of URL text leaves half the frame for framing and fields.
    urls_per_chunk: int = 2_000
    url_bytes_per_chunk: int = 512 * 1024
    # A host state is at most about 280 bytes on the wire: 1,000 of them is under 300 KB.
    hosts_per_chunk: int = 1_000
    # A revisit schedule entry is a URL plus about 120 bytes: 1,000 of them is at most about 2.2 MB of URL text
    # in theory, but typical URLs (under 200 bytes) keep it near 300 KB.
    revisits_per_chunk: int = 1_000
    # Unacknowledged chunks per transfer: enough to keep a link busy, bounded so memory in the link queue is.
    window: int = 8
    # Arcs read from the store at once while a transfer's chunks are made (one read transaction per database),
    # and arcs dropped per write transaction once it completes: a join moves tens of thousands of small arcs,
    # and a few dozen at a time keep each step of the event loop to a few milliseconds.
    arcs_per_read: int = 32
    arcs_per_drop: int = 32
    # A chunk with no ack after this long is sent again (the link layer delivers at most once per connection).
    resend_after: float = 5.0
    # How often `run` looks for chunks to send or re-send.
    interval: float = 0.2
    # A page fetched here whose release waits for its links (`HandoffDelegate.held_keys`) is sent as seen only
    # once its links are safe: the transfer's last chunk waits for that at most this long, and at most two thirds
    # of `wait` (the receiver holds the arc's hosts meanwhile). Its links' owners ack within a round trip, and a
    # lost batch is re-sent after 5 s; but the outbox releases in order, so with 5% of the frames lost a release
    # waited up to 20 s, and with 20% lost the cluster's joins no longer settled within 40 s. Past the limit the
    # keys go as seen all the same: the old owner's death within the limit of the transfer's end is covered
    # (the seconds after a join, when it has mattered), a later one could lose those links again, and sending
    # them as not seen would fetch every such page twice.
    withhold_limit: float = 5.0
    # Gained arcs whose transfer has not come after this long make the node ask their previous owner for it
    # (`HandoffAsk`), and again every `resend_after`: a small transfer on a LAN arrives well within it, so the
    # ask is mostly sent to a previous owner that has nothing for us under our ring (it saw other rings).
    ask_after: float = 0.25
    # A gained arc waits at most this long for its previous owner's transfer: views that reached the two nodes
    # by different paths (or a previous owner that restarted) must not block its hosts forever. The operator's
    # setting handoff_wait: default and reason in peer.config (FIELDS).
    wait: float = DEFAULTS["handoff_wait"]


#: Given a callback, calls it once what an applied chunk queued is held by this node's backups too.
Hold = Callable[[Callable[[], None]], None]


class HandoffDelegate(Protocol):
    """What the hand-off asks of the node around it (memberlist's delegate): one protocol, not loose callables.
    `Alone` is the default for a hand-off on its own (tests); the cluster implements it for a node."""

    def busy_positions(self) -> Iterable[int]:
        """Ring positions of the hosts being fetched here now: a transfer starts once none lies in its arcs, so
        the host states it carries include the last fetch (the politeness rule, docs/cluster.md)."""

    def held_keys(self) -> set[bytes]:
        """Keys of pages fetched here whose release waits for the links they found (`--replicas`): until those
        links are safe elsewhere, only fetching the page again brings them back if this node dies, so a transfer
        must not yet tell the new owner the page was fetched."""

    def applied(self, new: list[QueuedUrl], states: list[HostState]) -> Hold | None:
        """An applied chunk queued `new` and set `states`: wake those hosts, take over their timers. A `Hold`
        when the chunk may not be acknowledged yet (its URLs are on their way to this node's ring backups,
        `--replicas`): the hand-off acknowledges it when the hold calls back."""

    def owner_of(self, host: str) -> str:
        """The owner of `host` under this node's current view. Chunk content for hosts owned elsewhere (the arc
        moved on, or our view is older) is forwarded through the outbox instead of being stored here, where a
        later hand-off of that arc could drop it with the arc."""

    def keys_arrived(self, keys: list[bytes]) -> None:
        """The seen keys of an applied chunk (a sender sends only keys of pages it fetched), to replicate, or to
        pass on to an owner elsewhere."""

    def unpark(self, start: int, end: int) -> None:
        """URLs of hosts in the arc [start, end) that the crawler took from the queue and holds parked (for
        robots.txt, a retry, a hand-off still awaited), not being fetched, go back to the queue: an applied chunk
        whose keys say its sender fetched them then discards them there."""

    def discarded(self, items: list[QueuedUrl]) -> None:
        """URLs queued here that an applied chunk says its sender already fetched: dropped from the frontier
        (their replicas at the backups go too)."""

    def foreign_states(self, states: list[WireHostState]) -> None:
        """Politeness states of an applied chunk for hosts owned elsewhere under this node's ring: not stored
        here (nothing here would hand them on) but passed on to their owner."""

    def departing(self, peer_id: str) -> bool:
        """Whether `peer_id` is leaving gracefully (LEAVING in this node's view): it owns no arc of our ring any
        more, yet it hands off what it holds, and its transfers may wait for arcs it still awaits from us, so
        its `HandoffAsk` is answered as a member's is."""


class Alone:
    """The hand-off's delegate when no cluster is around it: this node owns every host, nothing is busy."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def busy_positions(self) -> Iterable[int]:
        return ()

    def held_keys(self) -> set[bytes]:
        return set()

    def applied(self, new: list[QueuedUrl], states: list[HostState]) -> Hold | None:
        return None

    def owner_of(self, host: str) -> str:
        return self.node_id

    def keys_arrived(self, keys: list[bytes]) -> None:
        pass

    def unpark(self, start: int, end: int) -> None:
        pass

    def discarded(self, items: list[QueuedUrl]) -> None:
        pass

    def foreign_states(self, states: list[WireHostState]) -> None:
        pass

    def departing(self, peer_id: str) -> bool:
        return False
