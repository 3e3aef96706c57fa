"""The messages peers exchange, their one-byte type codes, and the field kinds that bound them.

Messages are plain frozen values; they know nothing of frames, codecs or state. The table at the bottom maps
each message to its type code and field kinds (in wire order), which `_codec` uses for both codecs. Handshake
messages (codes below 0x10) are always sent in JSON; everything else in the codec the handshake chose.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypeAlias

from ._schema import Blob, Choice, Flag, HostName, Kind, Many, Maybe, Record, Seconds, Text, UInt
from ._urllist import UrlList

__all__ = [
    "BatchAck",
    "Challenge",
    "Gossip",
    "Goodbye",
    "HandoffAck",
    "HandoffChunk",
    "Hello",
    "HostState",
    "MEMBER_STATES",
    "Member",
    "Message",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "PROTOCOL_NAME",
    "RECORDS",
    "TYPE_CODES",
    "HANDSHAKE_CODES",
    "Ping",
    "Pong",
    "ProbeReply",
    "ProbeRequest",
    "Reject",
    "SeenReplica",
    "QueueReplica",
    "ReplicaAck",
    "UrlBatch",
    "UrlEntry",
    "Welcome",
]

PROTOCOL_NAME = "peercrawl"
NONCE_SIZE = 32
PROOF_SIZE = 32
MEMBER_STATES = ("alive", "suspect", "leaving", "dead")


# --- parts -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class UrlEntry:
    """One URL to crawl: its crawl depth, the page it was found on (None for seeds), redirect hops so far."""

    url: str
    depth: int
    found_on: str | None
    hops: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """One node as a view sees it; `state` is one of MEMBER_STATES."""

    node_id: str
    address: str
    weight: int
    incarnation: int
    state: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HostState:
    """Politeness state of one host, in durations because the two nodes' clocks are unrelated.

    `crawl_delay`: seconds between fetches in force; `ready_in`: seconds from sending until the next fetch may
    start (covers Crawl-delay and any Retry-After back-off); `failures`: consecutive failures so far.
    """

    host: str
    crawl_delay: float
    ready_in: float
    failures: int


# --- handshake ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """Initiator's opening: what it speaks, who it is, and its fresh nonce."""

    protocol: str = PROTOCOL_NAME
    versions: tuple[int, ...]
    codecs: tuple[str, ...]
    compressions: tuple[str, ...]
    node_id: str
    nonce: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Challenge:
    """Responder's choice of version, codec and compression, its nonce, and its proof of the secret."""

    version: int
    codec: str
    compression: str
    node_id: str
    nonce: bytes
    proof: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome:
    """Initiator's proof of the secret; after it, the connection is established."""

    proof: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Reject:
    """Refusal of the connection (bad proof, nothing in common, or the peer is unwanted); the sender closes."""

    reason: str


# --- URL dispatch ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class UrlBatch:
    """URLs for hosts the receiver owns. `seq` numbers the sender's batches; a re-send keeps its `seq`."""

    seq: int
    sender: str
    epoch: int
    urls: tuple[UrlEntry, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchAck:
    """The batch `seq` is durably handled: `new` queued, `seen` already known, `forwarded` to their owner.

    `epoch` is the receiver's view epoch, so a sender with an older view learns it should fetch gossip.
    """

    seq: int
    new: int
    seen: int
    forwarded: int
    epoch: int


# --- membership --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Gossip:
    """Membership at `epoch`: the whole view when `full`, else only members that changed."""

    epoch: int
    full: bool
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping:
    """Liveness probe; `epoch` is the sender's view epoch so views that drift apart are noticed."""

    seq: int
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong:
    """Answer to the Ping with the same `seq`."""

    seq: int
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeRequest:
    """Indirect probe (SWIM ping-req): please ping `target` for me and answer with a ProbeReply."""

    seq: int
    target: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeReply:
    """Outcome of the ProbeRequest with the same `seq`: whether `target` answered."""

    seq: int
    target: str
    alive: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressQuery:
    """Asks a peer for its crawl progress, answered with a ProgressReport of the same `seq`."""

    seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressReport:
    """A node's crawl progress at the moment it answered, for cluster status and termination detection.

    `idle`: its frontier is empty, nothing is being fetched, and every URL batch and hand-off chunk it sent is
    acknowledged. `activity` grows with everything that could create work (pages fetched, URLs admitted, chunks
    applied): two rounds of reports with every node idle and the same activity mean the crawl is finished.
    `finished`: the node has concluded that (so a peer that asks may conclude it too). `ring` names the ring the
    node uses (a 63-bit hash of its members and weights): two nodes can number the same ring with different view
    epochs, so the rounds compare rings.
    """

    seq: int
    ring: int
    idle: bool
    finished: bool
    activity: int
    pages: int
    queued: int
    urls_received: int
    rate: float


# --- hand-off ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffChunk:
    """One chunk of the arc [arc_start, arc_end) moving to the receiver at view `epoch`.

    Chunks of one transfer are numbered from 0; `last` marks the final one. The sender keeps everything it
    sent until the matching HandoffAck arrives, and re-sends unacknowledged chunks after a reconnect.
    """

    transfer_id: int
    chunk_seq: int
    epoch: int
    arc_start: int
    arc_end: int
    urls: tuple[UrlEntry, ...]
    seen_keys: tuple[bytes, ...]
    hosts: tuple[HostState, ...]
    last: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffAck:
    """The chunk is durably stored by the receiver; the sender may drop it."""

    transfer_id: int
    chunk_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SeenReplica:
    """Seen keys of pages the sender fetched, for the node that would own their positions if the sender left;
    and politeness states of hosts the sender received by hand-off but does not own, for their owner.

    Best effort and never acknowledged: a lost replica costs at most a page fetched again after the sender
    dies, never a URL. The receiver marks the keys seen; they decide nothing while the sender owns the arc.
    A state is merged like a hand-off's (the later ready time wins).
    """

    epoch: int
    keys: tuple[bytes, ...]
    hosts: tuple[HostState, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueReplica:
    """Queued URLs the sender owns, for its ring backups to hold durably (`--replicas R`), and the dedup keys of
    URLs it is done with (fetched, refused or given up), whose replicas the backups release; with the politeness
    states of the hosts it fetched since its last message, so a backup that inherits them keeps their timers.

    Acknowledged (`ReplicaAck`, same `seq`) once the receiver has it durably; re-sent until then. Applied in one
    transaction: releases first, then the URLs, so a page's release and the links found on it arrive together.
    """

    seq: int
    epoch: int
    urls: tuple[UrlEntry, ...]
    released: tuple[bytes, ...]
    hosts: tuple[HostState, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaAck:
    """The `QueueReplica` `seq` is durably held by the sender of this ack."""

    seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodbye:
    """The sender will send nothing more on this connection."""

    reason: str


Message: TypeAlias = (
    Hello
    | Challenge
    | Welcome
    | Reject
    | UrlBatch
    | BatchAck
    | Gossip
    | Ping
    | Pong
    | ProbeRequest
    | ProbeReply
    | ProgressQuery
    | ProgressReport
    | HandoffChunk
    | HandoffAck
    | SeenReplica
    | QueueReplica
    | ReplicaAck
    | Goodbye
)


# --- wire table --------------------------------------------------------------------------------------------


def _record(cls: type, **kinds: Kind) -> Record:
    """A Record for `cls`, checking that `kinds` names exactly its fields in declaration order."""
    names = tuple(field.name for field in fields(cls))
    if tuple(kinds) != names:
        raise TypeError(f"wire fields of {cls.__name__} {tuple(kinds)} do not match its fields {names}")
    return Record(cls, tuple(kinds.items()))


_U32 = UInt(0, 0xFFFF_FFFF)
_URL = Text("max_url_length")
_URL_ENTRY = _record(UrlEntry, url=_URL, depth=_U32, found_on=Maybe(_URL), hops=_U32)
_MEMBER = _record(
    Member,
    node_id=Text(),
    address=Text(),
    weight=UInt(1, 0xFFFF_FFFF),
    incarnation=UInt(),
    state=Choice(MEMBER_STATES),
)
# A seen-URL key: the host's 8-byte ring position and at least one byte of fingerprint (16 bytes today).
_SEEN_KEY = Blob(limit="max_key_length", minimum=9)
_HOST_STATE = _record(HostState, host=HostName(), crawl_delay=Seconds(), ready_in=Seconds(), failures=_U32)
_NONCE = Blob(size=NONCE_SIZE)
_PROOF = Blob(size=PROOF_SIZE)

# type code -> record; codes 0x01-0x0F are the handshake, always JSON and never compressed.
RECORDS: dict[int, Record] = {
    0x01: _record(
        Hello,
        protocol=Choice([PROTOCOL_NAME]),
        versions=Many(UInt(1, 0xFFFF)),
        codecs=Many(Text()),
        compressions=Many(Text()),
        node_id=Text(),
        nonce=_NONCE,
    ),
    0x02: _record(
        Challenge,
        version=UInt(1, 0xFFFF),
        codec=Text(),
        compression=Text(),
        node_id=Text(),
        nonce=_NONCE,
        proof=_PROOF,
    ),
    0x03: _record(Welcome, proof=_PROOF),
    0x04: _record(Reject, reason=Text()),
    0x10: _record(UrlBatch, seq=UInt(), sender=Text(), epoch=UInt(), urls=UrlList(_URL_ENTRY, "max_urls_per_batch")),
    0x11: _record(BatchAck, seq=UInt(), new=_U32, seen=_U32, forwarded=_U32, epoch=UInt()),
    0x20: _record(Gossip, epoch=UInt(), full=Flag(), members=Many(_MEMBER)),
    0x21: _record(Ping, seq=UInt(), epoch=UInt()),
    0x22: _record(Pong, seq=UInt(), epoch=UInt()),
    0x23: _record(ProbeRequest, seq=UInt(), target=Text()),
    0x24: _record(ProbeReply, seq=UInt(), target=Text(), alive=Flag()),
    0x25: _record(ProgressQuery, seq=UInt()),
    0x26: _record(
        ProgressReport,
        seq=UInt(),
        ring=UInt(),
        idle=Flag(),
        finished=Flag(),
        activity=UInt(),
        pages=UInt(),
        queued=UInt(),
        urls_received=UInt(),
        rate=Seconds(),
    ),
    0x30: _record(
        HandoffChunk,
        transfer_id=UInt(),
        chunk_seq=UInt(),
        epoch=UInt(),
        arc_start=UInt(),
        arc_end=UInt(),
        urls=UrlList(_URL_ENTRY, "max_urls_per_batch"),
        seen_keys=Many(_SEEN_KEY, "max_keys_per_chunk"),
        hosts=Many(_HOST_STATE),
        last=Flag(),
    ),
    0x31: _record(HandoffAck, transfer_id=UInt(), chunk_seq=UInt()),
    0x32: _record(SeenReplica, epoch=UInt(), keys=Many(_SEEN_KEY, "max_keys_per_chunk"),
                  hosts=Many(_HOST_STATE)),
    0x33: _record(QueueReplica, seq=UInt(), epoch=UInt(), urls=UrlList(_URL_ENTRY, "max_urls_per_batch"),
                  released=Many(Blob(limit="max_key_length"), "max_keys_per_chunk"), hosts=Many(_HOST_STATE)),
    0x34: _record(ReplicaAck, seq=UInt()),
    0x40: _record(Goodbye, reason=Text()),
}
HANDSHAKE_CODES = frozenset({0x01, 0x02, 0x03, 0x04})
TYPE_CODES: dict[type, int] = {record.cls: code for code, record in RECORDS.items()}
