"""The messages peers exchange, their one-byte type codes, and the field kinds that bound them.

Messages are plain frozen values; they know nothing of frames, codecs or state. The table at the bottom maps
each message to its type code and field kinds (in wire order), which `_codec` uses for both codecs. Handshake
messages (codes below 0x10) are always sent in JSON; everything else in the codec the handshake chose.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypeAlias

from ._schema import Blob, Choice, Flag, HostName, Kind, Many, Maybe, Record, Seconds, Text, UInt
from ._urlcolumns import UrlColumns
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
    "RevisitEntry",
    "TYPE_CODES",
    "HANDSHAKE_CODES",
    "KNOWN_CODES",
    "Ping",
    "Pong",
    "ProbeReply",
    "ProbeRequest",
    "Count",
    "DigestAnswer",
    "DigestAsk",
    "PayloadOriginal",
    "Reject",
    "SeenReplica",
    "SlowHost",
    "Transfer",
    "OutputState",
    "CaptureAsk",
    "CaptureAnswer",
    "StatusQuery",
    "StatusReport",
    "LaneReturn",
    "LaneGrant",
    "LaneAsk",
    "LaneHandover",
    "LaneHandoverAsk",
    "PluginCheck",
    "PluginOff",
    "ControlAsk",
    "ControlAnswer",
    "Settings",
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
    """One URL to crawl: its crawl depth, the page it was found on (None for seeds), redirect hops so far; the
    last modification a sitemap gave for it (epoch seconds, or None), and whether it is a sitemap to read."""

    url: str
    depth: int
    found_on: str | None
    hops: int
    lastmod: float | None = None
    sitemap: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """One node as a view sees it; `state` is one of MEMBER_STATES."""

    node_id: str
    address: str
    weight: int
    incarnation: int
    state: str
    zone: str = ""  # the failure zone the node named, "" for none (protocol version 4 on; older ones omit it)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostState:
    """Politeness state of one host, in durations because the two nodes' clocks are unrelated.

    `crawl_delay`: seconds between fetches in force; `ready_in`: seconds from sending until the next fetch may
    start (covers Crawl-delay and any Retry-After back-off); `failures`: consecutive failures so far; `pages` and
    `bytes`: what was fetched from the host so far, so its budgets hold fleet-wide when it changes owner.
    """

    host: str
    crawl_delay: float
    ready_in: float
    failures: int
    pages: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RevisitEntry:
    """One page's revisit schedule, moving with its host. `due_in`: seconds from sending until it is due
    (durations, as the clocks are unrelated); `queued`: its revisit was queued at the sender. The validators and
    the digest come from its last fetch; `stored_at` (wall clock, what revisit records refer to) and `size` from
    its last full record; `changed`/`unchanged` count its revisits."""

    url: str
    depth: int
    due_in: float
    queued: bool
    interval: float
    etag: str | None
    last_modified: str | None
    digest: str
    stored_at: float
    size: int
    changed: int
    unchanged: int


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


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressWave:
    """Asks `members[0]` for the progress of `members`, a contiguous range of `ring`'s members (sorted by node id),
    answered with one ProgressTally of the same `seq` within `wait` seconds (peer/cluster/core/progress.py). The range
    travels with the wave, so a receiver that holds another ring (a view change under way) still passes the wave
    on to the same members. `finished`: the root has concluded the crawl finished (an idle receiver on `ring`
    concludes it too). `proof`: how many seconds ago the sender last had proof of contact with a strict majority
    of its ring (a wave it counted, or one it received), or None if not within the contact window: the
    receiver's proof too, dated as old (the partition fence)."""

    seq: int
    ring: int
    members: tuple[str, ...]
    wait: float
    finished: bool
    proof: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressTally:
    """The answer to a ProgressWave, over the asked range: how many members answered at all (`heard`, whatever
    ring they hold: the contact the partition fence counts), how many answered on the wave's `ring` (`nodes`),
    how many of those are idle, the sum of their activity counters, and how many have concluded the crawl
    finished. A member on another ring is heard but counts in no other field."""

    seq: int
    ring: int
    heard: int
    nodes: int
    idle: int
    activity: int
    concluded: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Count:
    """A named counter: an error kind, a peer's node id, a status class."""

    name: str
    count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowHost:
    """A host that makes the crawl wait: the seconds between its requests (the larger of the node's delay and
    its Crawl-delay), its current back-off, its consecutive failures and its queued URLs."""

    host: str
    delay: float
    backoff: float
    failures: int
    queued: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Transfer:
    """A hand-off under way at the reporting node: arcs coming from `peer` (`incoming`, `share` of the key space
    still waited for) or going to it (`chunks` not yet acknowledged)."""

    peer: str
    incoming: bool
    share: float
    chunks: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputState:
    """One of the reporting node's outputs (`kind`: upload, webhook, crawl-log, crawl-log-stream) and where it goes:
    whether its last try worked (`error` and `failing_for` when not), what waits (`waiting` files, notices or
    records; `waiting_bytes`), the age of the oldest (`lag`), what went (`done`), failed tries, records dropped
    past the spool's bound, and whether it holds fetching (`paused`)."""

    kind: str
    target: str
    ok: bool
    error: str
    failing_for: float
    waiting: int
    waiting_bytes: int
    lag: float
    done: int
    failures: int
    dropped: int
    paused: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureAsk:
    """Asks a peer for the captures its indexes hold (the cluster's `GET /cdx`): `url` with pywb's `match` type
    (exact, prefix, host, domain), the time range `since`..`until` (14-digit timestamps, inclusive), at most
    `limit`. Answered by a CaptureAnswer with the same `seq`."""

    seq: int
    url: str
    match: str
    since: str
    until: str
    limit: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureAnswer:
    """The captures a node holds for a CaptureAsk, as CDXJ lines (`urlkey timestamp {json}`, the JSON naming the
    node and, once uploaded, the object key); `more` when the frame's bound left some out; `error` when the
    ask was refused."""

    seq: int
    lines: tuple[str, ...]
    more: bool
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginOff:
    """A plug-in a node switched off for failing on most pages: its ``use`` and why (`peer.plugins`)."""

    use: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusQuery:
    """Asks a peer for its detailed status (the dashboard's view of it), answered by a StatusReport."""

    seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusReport:
    """A node's detailed status, for the dashboard any node serves for the whole cluster.

    `history`: pages fetched in each of the last seconds, oldest first. `sent`: URLs sent to each peer so far;
    `sent_recent`: over the last `window` seconds. `idle_for`: seconds since the node last received a page
    (counted from its start if it has none). `rss`: resident memory in bytes. `transfers`: its hand-offs under way.
    """

    seq: int
    pages: int
    bytes: int
    queued: int
    in_flight: int
    hosts_queued: int
    hosts_known: int
    rss: int
    idle_for: float
    errors: tuple[Count, ...]
    dns_hits: int
    dns_misses: int
    robots_hits: int
    robots_misses: int
    history: tuple[int, ...]
    window: float
    sent: tuple[Count, ...]
    sent_recent: tuple[Count, ...]
    slow_hosts: tuple[SlowHost, ...]
    transfers: tuple[Transfer, ...]
    plugins_off: tuple[PluginOff, ...] = ()  # the plug-ins it switched off (version 4 on)
    outputs: tuple[OutputState, ...] = ()  # version 6 on: older peers report none


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
    revisits: tuple[RevisitEntry, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffAck:
    """The chunk is durably stored by the receiver; the sender may drop it."""

    transfer_id: int
    chunk_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffAsk:
    """The sender waits for arcs from the receiver up to `ring` (the id of the sender's current ring): once the
    receiver has adopted that ring, it sends a transfer labelled with it, an empty one if it holds nothing for
    the sender, so that a sender that saw the rings in another order is released without waiting out the time."""

    ring: int


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
class LaneAsk:
    """The sender has hosts waiting on server `address` and asks its owner for up to `want` of its lanes
    (docs/cluster.md, "Per-address limits"); `seq` is echoed by the grant."""

    address: str
    seq: int
    want: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneGrant:
    """Lanes of `address` lent to the receiver in answer to ask `seq`: it may start requests on them until
    `lease` seconds after it sent that ask, each lane no sooner than its `ready_in` seconds after receipt.
    Durations, as the two nodes' clocks are unrelated."""

    address: str
    seq: int
    lanes: tuple[int, ...]
    ready_in: tuple[float, ...]
    lease: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneReturn:
    """Lanes of `address` given back, none with a request in service; each may be used again `ready_in`
    seconds after this was sent (its rest after the last request on it)."""

    address: str
    lanes: tuple[int, ...]
    ready_in: tuple[float, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneHandover:
    """The sender owned `address` until its view changed and lends none of its lanes any more; each lane may
    be lent again `ready_in` seconds after this was sent (its lease's end, or its rest, still to come)."""

    address: str
    ready_in: tuple[float, ...]
    epoch: int = 0  # the sender's view epoch when it stopped lending (version 4 on; 0: not sent)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneHandoverAsk:
    """The sender owns `address` now (its view of `epoch`) and has no hand-over for it: the receiver, its
    previous owner, answers with a LaneHandover of what it knows, if anything (version 4 on)."""

    address: str
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The crawl settings in force (scope rules, budgets, the paused flag), gossiped to every member.

    `version` grows with every runtime change; of two records the higher `(version, digest)` wins everywhere,
    `digest` being a hash of `body`, so members converge on one record whatever the order of arrival. `body`
    is the settings as a JSON object (peer/crawl/settings.py reads and checks it); `origin` names the node
    that made the change.
    """

    version: int
    origin: str
    body: str


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueReplica:
    """Queued URLs the sender owns, for its ring backups to hold durably (`--replicas R`), and the dedup keys of
    URLs it is done with (fetched, refused or given up), whose replicas the backups release; with the politeness
    states of the hosts it fetched since its last message, so a backup that inherits them keeps their timers.

    Acknowledged (`ReplicaAck`, same `seq`) once the receiver has it durably; re-sent until then. Applied in one
    transaction: releases first, then the URLs, so a page's release and the links found on it arrive together.
    `revisits` (version 7 on): the revisit schedules (`--revisit`) of the released pages as they stand when the
    message is made, so the backup that inherits a page revisits it.
    """

    seq: int
    epoch: int
    urls: tuple[UrlEntry, ...]
    released: tuple[bytes, ...]
    hosts: tuple[HostState, ...] = ()
    revisits: tuple[RevisitEntry, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaAck:
    """The `QueueReplica` `seq` is durably held by the sender of this ack."""

    seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginCheck:
    """The plug-in chain a node runs, compared when one joins: the joining node asks (`answer` false) the member
    it joins through, which answers with its own (`answer` true). `chain` describes each plug-in (class,
    version, a digest of its settings) as JSON; `fingerprint` is a hash of it ("" for no plug-in)."""

    seq: int
    fingerprint: str
    chain: str
    answer: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadOriginal:
    """Where a payload was first stored in full: its digest (base32 SHA-1, the CDXJ `digest`), the URL and time
    of the response record that holds it, and that record's `WARC-Record-ID` ("" when not known)."""

    digest: str
    uri: str
    date: float
    record_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DigestAsk:
    """To the owner of payload digests (a digest is a key on the ring, as a host is): which of `digests` were
    stored in full already, and where (answered by a `DigestAnswer` with the same `seq`); and `stored`, payloads
    the sender has just stored in full, for the owner to remember (the first one it hears of stays). Never
    acknowledged: a lost one costs a payload stored in full again, never a payload."""

    seq: int
    digests: tuple[str, ...]
    stored: tuple[PayloadOriginal, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DigestAnswer:
    """The originals the owner knows of the digests asked in `seq` (a digest it does not know is left out)."""

    seq: int
    found: tuple[PayloadOriginal, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlAsk:
    """A control request a node's control endpoint passes on to a peer, for an answer about the whole cluster
    (`peerctl plugins`, `peerctl items`, `peerctl plugins reload`: peer/cluster/core/controlfan.py). `what`
    names the request, `body` is its JSON."""

    seq: int
    what: str
    body: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlAnswer:
    """The answer to a `ControlAsk`: `ok` false when the peer could not do it (`body` then says why); else
    `body` is the answer's JSON."""

    seq: int
    ok: bool
    body: str


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
    | ProgressWave
    | ProgressTally
    | StatusQuery
    | StatusReport
    | CaptureAsk
    | CaptureAnswer
    | HandoffChunk
    | HandoffAck
    | HandoffAsk
    | SeenReplica
    | LaneAsk
    | LaneGrant
    | LaneReturn
    | LaneHandover
    | LaneHandoverAsk
    | Settings
    | QueueReplica
    | ReplicaAck
    | PluginCheck
    | DigestAsk
    | DigestAnswer
    | ControlAsk
    | ControlAnswer
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
_URL_ENTRY = _record(
    UrlEntry, url=_URL, depth=_U32, found_on=Maybe(_URL), hops=_U32, lastmod=Maybe(Seconds()), sitemap=Flag()
)
_MEMBER_V4 = _record(
    Member,
    node_id=Text(),
    address=Text(),
    weight=UInt(1, 0xFFFF_FFFF),
    incarnation=UInt(),
    state=Choice(MEMBER_STATES),
    zone=Text(),
)
# versions 2 and 3 carry no zone: a member read from them has none
_MEMBER = Record(Member, tuple((name, kind) for name, kind in _MEMBER_V4.fields if name != "zone"))
# A seen-URL key: the host's 8-byte ring position and at least one byte of fingerprint (16 bytes today).
_SEEN_KEY = Blob(limit="max_key_length", minimum=9)
_HOST_STATE = _record(HostState, host=HostName(), crawl_delay=Seconds(), ready_in=Seconds(), failures=_U32,
                      pages=UInt(), bytes=UInt())
_COUNT = _record(Count, name=Text(), count=UInt())
_SLOW_HOST = _record(SlowHost, host=HostName(), delay=Seconds(), backoff=Seconds(), failures=_U32, queued=UInt())
_TRANSFER = _record(Transfer, peer=Text(), incoming=Flag(), share=Seconds(), chunks=UInt())
_OUTPUT_STATE = _record(OutputState, kind=Text(), target=Text(), ok=Flag(), error=Text(), failing_for=Seconds(),
                        waiting=UInt(), waiting_bytes=UInt(), lag=Seconds(), done=UInt(), failures=UInt(),
                        dropped=UInt(), paused=Flag())
_REVISIT_ENTRY = _record(
    RevisitEntry, url=_URL, depth=_U32, due_in=Seconds(), queued=Flag(), interval=Seconds(), etag=Maybe(Text()),
    last_modified=Maybe(Text()), digest=Text(), stored_at=Seconds(), size=UInt(), changed=UInt(), unchanged=UInt(),
)
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
    0x27: _record(StatusQuery, seq=UInt()),
    0x28: Record(StatusReport, (  # version 4 adds plugins_off (below)
        ("seq", UInt()),
        ("pages", UInt()),
        ("bytes", UInt()),
        ("queued", UInt()),
        ("in_flight", UInt()),
        ("hosts_queued", UInt()),
        ("hosts_known", UInt()),
        ("rss", UInt()),
        ("idle_for", Seconds()),
        ("errors", Many(_COUNT)),
        ("dns_hits", UInt()),
        ("dns_misses", UInt()),
        ("robots_hits", UInt()),
        ("robots_misses", UInt()),
        ("history", Many(UInt())),
        ("window", Seconds()),
        ("sent", Many(_COUNT)),
        ("sent_recent", Many(_COUNT)),
        ("slow_hosts", Many(_SLOW_HOST)),
        ("transfers", Many(_TRANSFER)),
    )),
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
        revisits=Many(_REVISIT_ENTRY),
    ),
    0x31: _record(HandoffAck, transfer_id=UInt(), chunk_seq=UInt()),
    0x32: _record(SeenReplica, epoch=UInt(), keys=Many(_SEEN_KEY, "max_keys_per_chunk"),
                  hosts=Many(_HOST_STATE)),
    0x29: _record(Settings, version=UInt(), origin=Text(), body=Text("max_settings")),
    0x50: _record(LaneAsk, address=Text("max_address"), seq=UInt(), want=UInt(1, 0xFFFF)),
    0x51: _record(LaneGrant, address=Text("max_address"), seq=UInt(), lanes=Many(UInt(0, 0xFFFF), "max_lanes"),
                  ready_in=Many(Seconds(), "max_lanes"), lease=Seconds()),
    0x52: _record(LaneReturn, address=Text("max_address"), lanes=Many(UInt(0, 0xFFFF), "max_lanes"),
                  ready_in=Many(Seconds(), "max_lanes")),
    0x53: Record(LaneHandover, (("address", Text("max_address")), ("ready_in", Many(Seconds(), "max_lanes")))),
    0x33: Record(QueueReplica, (  # version 7 adds revisits (below)
        ("seq", UInt()),
        ("epoch", UInt()),
        ("urls", UrlList(_URL_ENTRY, "max_urls_per_batch")),
        ("released", Many(Blob(limit="max_key_length"), "max_keys_per_chunk")),
        ("hosts", Many(_HOST_STATE)),
    )),
    0x34: _record(ReplicaAck, seq=UInt()),
    0x40: _record(Goodbye, reason=Text()),
}

# Version 3 differs from 2 only in the msgpack form of URL lists (front-coded columns, protocol/_urlcolumns.py).
_URL_COLUMNS = UrlColumns(_URL_ENTRY, "max_urls_per_batch")
RECORDS_V3: dict[int, Record] = dict(RECORDS)
for _code, _field in ((0x10, "urls"), (0x30, "urls")):
    _old = RECORDS[_code]
    RECORDS_V3[_code] = Record(
        _old.cls, tuple((name, _URL_COLUMNS if name == _field else kind) for name, kind in _old.fields)
    )
# Version 4: a member carries its failure zone (ring/_zones.py).
RECORDS_V4: dict[int, Record] = dict(RECORDS_V3)
RECORDS_V4[0x20] = _record(Gossip, epoch=UInt(), full=Flag(), members=Many(_MEMBER_V4))
# ... and a lane hand-over the view epoch it was sent from (peer/cluster/core/lanes.py)
RECORDS_V4[0x53] = _record(LaneHandover, address=Text("max_address"), ready_in=Many(Seconds(), "max_lanes"),
                           epoch=UInt())
RECORDS_V4[0x54] = _record(LaneHandoverAsk, address=Text("max_address"), epoch=UInt())
# ... and the messages that came with it: progress waves (peer/cluster/core/progress.py), a hand-off ask
RECORDS_V4[0x2A] = _record(ProgressWave, seq=UInt(), ring=UInt(), members=Many(Text()), wait=Seconds(),
                           finished=Flag(), proof=Maybe(Seconds()))
RECORDS_V4[0x2B] = _record(ProgressTally, seq=UInt(), ring=UInt(), heard=_U32, nodes=_U32, idle=_U32,
                           activity=UInt(), concluded=_U32)
RECORDS_V4[0x35] = _record(HandoffAsk, ring=UInt())
# ... and the plug-in chains compared at join (peer/cluster/core/pluginjoin.py)
RECORDS_V4[0x2C] = _record(PluginCheck, seq=UInt(), fingerprint=Text(), chain=Text("max_settings"), answer=Flag())
# ... and what a node tells of its plug-ins: the ones switched off in its status report, control requests
# passed on for the whole cluster (peer/cluster/core/controlfan.py)
_PLUGIN_OFF = _record(PluginOff, use=Text(), reason=Text())
RECORDS_V4[0x28] = Record(StatusReport, (*RECORDS[0x28].fields, ("plugins_off", Many(_PLUGIN_OFF))))
RECORDS_V4[0x2D] = _record(ControlAsk, seq=UInt(), what=Text(), body=Text("max_control"))
RECORDS_V4[0x2E] = _record(ControlAnswer, seq=UInt(), ok=Flag(), body=Text("max_control"))
# ... and payload digests asked of their owner (protocol/_digestasks.py, peer/cluster/core/digests.py)
_DIGEST = Text("max_string")
_ORIGINAL = _record(PayloadOriginal, digest=_DIGEST, uri=_URL, date=Seconds(), record_id=Text())
RECORDS_V4[0x60] = _record(DigestAsk, seq=UInt(), digests=Many(_DIGEST, "max_urls_per_batch"),
                           stored=Many(_ORIGINAL, "max_urls_per_batch"))
RECORDS_V4[0x61] = _record(DigestAnswer, seq=UInt(), found=Many(_ORIGINAL, "max_urls_per_batch"))
# Version 6: a status report carries the node's outputs (upload, webhook, crawl log).
RECORDS_V6: dict[int, Record] = dict(RECORDS_V4)
RECORDS_V6[0x28] = _record(StatusReport, **dict(RECORDS_V4[0x28].fields), outputs=Many(_OUTPUT_STATE))
# ... and the cluster's capture look-up (peer/cluster/core/captures.py)
RECORDS_V6[0x62] = _record(CaptureAsk, seq=UInt(), url=_URL, match=Choice(("exact", "prefix", "host", "domain")),
                           since=Text(), until=Text(), limit=UInt(1, 100_000))
RECORDS_V6[0x63] = _record(CaptureAnswer, seq=UInt(), lines=Many(Text("max_settings")), more=Flag(), error=Text())
# Version 7: a queued-URL replica carries the released pages' revisit schedules (peer/cluster/replicas/).
RECORDS_V7: dict[int, Record] = dict(RECORDS_V6)
RECORDS_V7[0x33] = _record(QueueReplica, **dict(RECORDS_V6[0x33].fields), revisits=Many(_REVISIT_ENTRY))
# protocol version -> its wire table
# Version 5 adds probe datagrams (protocol/_datagram.py); its frames are those of version 4.
RECORDS_BY_VERSION: dict[int, dict[int, Record]] = {2: RECORDS, 3: RECORDS_V3, 4: RECORDS_V4, 5: RECORDS_V4,
                                                    6: RECORDS_V6, 7: RECORDS_V7}
HANDSHAKE_CODES = frozenset({0x01, 0x02, 0x03, 0x04})
# every type code some version has (a frame's version-specific check comes when its body is decoded)
KNOWN_CODES = frozenset(code for table in RECORDS_BY_VERSION.values() for code in table)
TYPE_CODES: dict[type, int] = {
    record.cls: code for table in RECORDS_BY_VERSION.values() for code, record in table.items()
}
