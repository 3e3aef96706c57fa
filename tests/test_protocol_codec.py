"""Message bodies: round trips in both codecs, and every validation rule on the way out and the way in."""

from __future__ import annotations

import dataclasses

import json
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    CODECS,
    MEMBER_STATES,
    NONCE_SIZE,
    SUPPORTED_VERSIONS,
    TYPE_CODES,
    BatchAck,
    Challenge,
    Goodbye,
    Gossip,
    HandoffAck,
    HandoffAsk,
    HandoffChunk,
    Hello,
    Count,
    DigestAnswer,
    DigestAsk,
    HostState,
    Limits,
    LocalProtocolError,
    Member,
    PayloadOriginal,
    Ping,
    Pong,
    ProgressQuery,
    ProgressReport,
    ProgressTally,
    ProgressWave,
    SlowHost,
    StatusQuery,
    CaptureAnswer,
    CaptureAsk,
    OutputState,
    StatusReport,
    Transfer,
    ProbeReply,
    ProbeRequest,
    Reject,
    RemoteProtocolError,
    RevisitEntry,
    SeenReplica,
    PluginCheck,
    PluginOff,
    ControlAsk,
    ControlAnswer,
    Settings,
    QueueReplica,
    ReplicaAck,
    UrlBatch,
    LaneAsk,
    LaneGrant,
    LaneHandover,
    LaneHandoverAsk,
    LaneReturn,
    UrlEntry,
    Welcome,
    decode_body,
    encode_body,
)

LIMITS = Limits()
U64 = st.integers(0, (1 << 64) - 1)
U32 = st.integers(0, (1 << 32) - 1)
texts = st.text(max_size=24)
urls = st.one_of(
    st.text(max_size=120),
    st.builds(
        "https://{}/{}?q={}".format,
        st.from_regex(r"[a-z0-9-]{1,20}\.[a-z]{2,6}", fullmatch=True),
        st.text(max_size=30),
        st.integers(0, 10**9),
    ),
)
seconds = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)
originals = st.builds(PayloadOriginal, digest=texts, uri=urls, date=seconds, record_id=texts)
url_entries = st.builds(
    UrlEntry, url=urls, depth=U32, found_on=st.none() | urls, hops=U32,
    lastmod=st.none() | st.floats(min_value=0, max_value=4e9, allow_nan=False), sitemap=st.booleans(),
)
members = st.builds(
    Member,
    node_id=texts,
    address=texts,
    weight=st.integers(1, (1 << 32) - 1),
    incarnation=U64,
    state=st.sampled_from(MEMBER_STATES),
)
host_names = st.one_of(
    # an "xn--" label must be punycode that decodes (a URL's host can be no other): those are tested on their own
    st.from_regex(r"[a-z0-9](?:[a-z0-9_-]{0,20}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?){0,4}", fullmatch=True)
    .filter(lambda host: not any(label.startswith("xn--") for label in host.split("."))),
    st.ip_addresses(v=6).map(lambda ip: f"[{ip.compressed}]"),
)
host_states = st.builds(HostState, host=host_names, crawl_delay=seconds, ready_in=seconds, failures=U32,
                        pages=U64, bytes=U64)
counts = st.builds(Count, name=texts, count=U64)
transfers = st.builds(Transfer, peer=texts, incoming=st.booleans(), share=seconds, chunks=U64)
slow_hosts = st.builds(SlowHost, host=host_names, delay=seconds, backoff=seconds, failures=U32, queued=U64)
output_states = st.builds(OutputState, kind=texts, target=texts, ok=st.booleans(), error=texts, failing_for=seconds,
                          waiting=U64, waiting_bytes=U64, lag=seconds, done=U64, failures=U64, dropped=U64,
                          paused=st.booleans())


revisit_entries = st.builds(
    RevisitEntry, url=urls, depth=U32, due_in=seconds, queued=st.booleans(), interval=seconds,
    etag=st.none() | texts, last_modified=st.none() | texts, digest=texts, stored_at=seconds, size=U64,
    changed=U64, unchanged=U64,
)


def tuples(elements: st.SearchStrategy, max_size: int = 6) -> st.SearchStrategy:
    return st.lists(elements, max_size=max_size).map(tuple)


nonces = st.binary(min_size=NONCE_SIZE, max_size=NONCE_SIZE)
MESSAGE_STRATEGIES: dict[type, st.SearchStrategy] = {
    Hello: st.builds(
        Hello,
        versions=tuples(st.integers(1, 0xFFFF)),
        codecs=tuples(texts),
        compressions=tuples(texts),
        node_id=texts,
        nonce=nonces,
    ),
    Challenge: st.builds(
        Challenge,
        version=st.integers(1, 0xFFFF),
        codec=texts,
        compression=texts,
        node_id=texts,
        nonce=nonces,
        proof=nonces,
    ),
    Welcome: st.builds(Welcome, proof=nonces),
    Reject: st.builds(Reject, reason=texts),
    UrlBatch: st.builds(UrlBatch, seq=U64, sender=texts, epoch=U64, urls=tuples(url_entries, 20)),
    BatchAck: st.builds(BatchAck, seq=U64, new=U32, seen=U32, forwarded=U32, epoch=U64),
    Gossip: st.builds(Gossip, epoch=U64, full=st.booleans(), members=tuples(members)),
    Ping: st.builds(Ping, seq=U64, epoch=U64),
    Pong: st.builds(Pong, seq=U64, epoch=U64),
    ProbeRequest: st.builds(ProbeRequest, seq=U64, target=texts),
    ProbeReply: st.builds(ProbeReply, seq=U64, target=texts, alive=st.booleans()),
    ProgressQuery: st.builds(ProgressQuery, seq=U64),
    ProgressReport: st.builds(
        ProgressReport, seq=U64, ring=U64, idle=st.booleans(), finished=st.booleans(), activity=U64,
        pages=U64, queued=U64, urls_received=U64,
        rate=st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False),
    ),
    ProgressWave: st.builds(ProgressWave, seq=U64, ring=U64, members=tuples(texts), wait=seconds,
                            finished=st.booleans(), proof=st.none() | seconds),
    ProgressTally: st.builds(ProgressTally, seq=U64, ring=U64, heard=U32, nodes=U32, idle=U32, activity=U64,
                             concluded=U32),
    StatusQuery: st.builds(StatusQuery, seq=U64),
    CaptureAsk: st.builds(CaptureAsk, seq=U64, url=urls, match=st.sampled_from(["exact", "prefix", "host", "domain"]),
                          since=st.text("0123456789", max_size=14), until=st.text("0123456789", max_size=14),
                          limit=st.integers(1, 100_000)),
    CaptureAnswer: st.builds(CaptureAnswer, seq=U64, lines=tuples(st.text(max_size=300)), more=st.booleans(),
                             error=texts),
    StatusReport: st.builds(
        StatusReport, seq=U64, pages=U64, bytes=U64, queued=U64, in_flight=U64, hosts_queued=U64,
        hosts_known=U64, rss=U64, idle_for=seconds, errors=tuples(counts), dns_hits=U64, dns_misses=U64,
        robots_hits=U64, robots_misses=U64, history=tuples(U64, 30), window=seconds, sent=tuples(counts),
        sent_recent=tuples(counts), slow_hosts=tuples(slow_hosts), transfers=tuples(transfers),
        outputs=tuples(output_states),
    ),
    HandoffChunk: st.builds(
        HandoffChunk,
        transfer_id=U64,
        chunk_seq=U64,
        epoch=U64,
        arc_start=U64,
        arc_end=U64,
        urls=tuples(url_entries),
        seen_keys=tuples(st.binary(min_size=9, max_size=64), 10),
        hosts=tuples(host_states),
        last=st.booleans(),
        revisits=tuples(revisit_entries, 3),
    ),
    HandoffAck: st.builds(HandoffAck, transfer_id=U64, chunk_seq=U64),
    HandoffAsk: st.builds(HandoffAsk, ring=U64),
    SeenReplica: st.builds(SeenReplica, epoch=U64, keys=tuples(st.binary(min_size=9, max_size=64), 10), hosts=tuples(host_states)),
    LaneAsk: st.builds(LaneAsk, address=st.text(max_size=16), seq=U64, want=st.integers(1, 0xFFFF)),
    LaneGrant: st.builds(LaneGrant, address=st.text(max_size=16), seq=U64, lanes=tuples(st.integers(0, 0xFFFF), 8),
                         ready_in=tuples(seconds, 8), lease=seconds),
    LaneReturn: st.builds(LaneReturn, address=st.text(max_size=16), lanes=tuples(st.integers(0, 0xFFFF), 8),
                          ready_in=tuples(seconds, 8)),
    LaneHandover: st.builds(LaneHandover, address=st.text(max_size=16), ready_in=tuples(seconds, 8)),
    LaneHandoverAsk: st.builds(LaneHandoverAsk, address=st.text(max_size=16), epoch=U64),
    Settings: st.builds(Settings, version=U64, origin=texts, body=st.text(max_size=200)),
    QueueReplica: st.builds(QueueReplica, seq=U64, epoch=U64, urls=tuples(url_entries, 20),
                            released=tuples(st.binary(max_size=64), 10), hosts=tuples(host_states),
                            revisits=tuples(revisit_entries, 3)),
    ReplicaAck: st.builds(ReplicaAck, seq=U64),
    PluginCheck: st.builds(PluginCheck, seq=U64, fingerprint=texts, chain=st.text(max_size=200), answer=st.booleans()),
    DigestAsk: st.builds(DigestAsk, seq=U64, digests=tuples(texts, 5), stored=tuples(originals, 5)),
    DigestAnswer: st.builds(DigestAnswer, seq=U64, found=tuples(originals, 5)),
    ControlAsk: st.builds(ControlAsk, seq=U64, what=texts, body=st.text(max_size=200)),
    ControlAnswer: st.builds(ControlAnswer, seq=U64, ok=st.booleans(), body=st.text(max_size=200)),
    Goodbye: st.builds(Goodbye, reason=texts),
}
APP_MESSAGES = st.one_of([s for cls, s in MESSAGE_STRATEGIES.items() if TYPE_CODES[cls] >= 0x10])
ALL_MESSAGES = st.one_of(list(MESSAGE_STRATEGIES.values()))


@pytest.mark.parametrize("codec", CODECS)
def test_a_status_report_carries_the_plugins_switched_off_from_version_4(codec: str) -> None:
    report = StatusReport(seq=1, pages=2, bytes=3, queued=0, in_flight=0, hosts_queued=0, hosts_known=0, rss=5,
                          idle_for=0.5, errors=(), dns_hits=0, dns_misses=0, robots_hits=0, robots_misses=0,
                          history=(), window=1.0, sent=(), sent_recent=(), slow_hosts=(), transfers=(),
                          plugins_off=(PluginOff(use="x:Y", reason="switched off: failed on 20 of 20 pages"),))
    code, body = encode_body(report, codec, LIMITS, 4)
    assert decode_body(code, body, codec, LIMITS, 4) == report
    code, body = encode_body(report, codec, LIMITS, 3)  # an older peer hears of none
    assert decode_body(code, body, codec, LIMITS, 3).plugins_off == ()


def test_every_message_type_has_a_strategy() -> None:
    assert set(MESSAGE_STRATEGIES) == set(TYPE_CODES)


def _round_trips() -> list[tuple[int, type]]:
    """(version, message type) where the type's wire record differs from the previous version's (or it is the first
    version): the codec depends on the version only through its table of records, so a record shared with an
    earlier version (the same object) is covered by that version's round trip."""
    from protocol._messages import RECORDS_BY_VERSION as tables

    pairs = []
    for cls in MESSAGE_STRATEGIES:
        before: object = ...
        for version in SUPPORTED_VERSIONS:
            record = tables[version].get(TYPE_CODES[cls])
            if record is not before:
                pairs.append((version, cls))
            before = record
    return pairs


def _in_version(pair: tuple[int, type]) -> bool:
    from protocol._messages import RECORDS_BY_VERSION as tables

    version, cls = pair
    return TYPE_CODES[cls] in tables[version]


ROUND_TRIPS = [pair for pair in _round_trips() if _in_version(pair)]
CAME_LATER = [pair for pair in _round_trips() if not _in_version(pair)]  # a message type that came later


@pytest.mark.parametrize(("version", "cls"), ROUND_TRIPS, ids=lambda v: getattr(v, "__name__", str(v)))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip(cls: type, version: int, data: st.DataObject) -> None:
    """Each drawn message goes through both codecs (drawing it costs far more than coding it)."""
    message = data.draw(MESSAGE_STRATEGIES[cls])
    expected = message
    if cls is StatusReport and version < 6:  # a report carries its node's outputs from version 6 on
        expected = dataclasses.replace(expected, outputs=())
    if cls is QueueReplica and version < 7:  # a replica carries revisit schedules from version 7 on
        expected = dataclasses.replace(expected, revisits=())
    for codec in CODECS:
        code, body = encode_body(message, codec, LIMITS, version)
        assert code == TYPE_CODES[cls]
        decoded = decode_body(code, body, codec, LIMITS, version)
        assert decoded == expected
        assert type(decoded) is cls
        # Encoding is deterministic: the same message always gives the same bytes.
        assert encode_body(decoded, codec, LIMITS, version) == (code, body)


@pytest.mark.parametrize(("version", "cls"), CAME_LATER, ids=lambda v: getattr(v, "__name__", str(v)))
@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_a_message_type_is_refused_in_a_version_before_it_came(cls: type, version: int, data: st.DataObject) -> None:
    """The refusal depends on the message's type and the version only, not on its fields: a few messages show it."""
    message = data.draw(MESSAGE_STRATEGIES[cls])
    for codec in CODECS:
        with pytest.raises(LocalProtocolError, match="came later"):
            encode_body(message, codec, LIMITS, version)


def test_json_is_readable_and_msgpack_is_positional() -> None:
    batch = UrlBatch(
        seq=7,
        sender="a",
        epoch=3,
        urls=(UrlEntry(url="https://example.com/", depth=1, found_on=None, hops=0),),
    )
    _, js = encode_body(batch, "json", LIMITS)
    assert json.loads(js) == {
        "seq": 7,
        "sender": "a",
        "epoch": 3,
        "urls": [{"url": "https://example.com/", "depth": 1, "found_on": None, "hops": 0, "lastmod": None,
                  "sitemap": False}],
    }
    _, mp = encode_body(batch, "msgpack", LIMITS, version=2)
    assert msgpack.unpackb(mp) == [7, "a", 3, [["https://example.com/", 1, None, 0, None, False]]]
    sitemap = UrlEntry(url="https://example.com/s.xml", depth=0, found_on=None, hops=1, lastmod=5.0, sitemap=True)
    _, mp = encode_body(UrlBatch(seq=8, sender="a", epoch=3, urls=(sitemap,)), "msgpack", LIMITS, version=2)
    assert msgpack.unpackb(mp)[3] == [["https://example.com/s.xml", 0, None, 1, 5.0, True]]
    assert decode_body(TYPE_CODES[UrlBatch], mp, "msgpack", LIMITS, version=2).urls == (sitemap,)
    # version 3: the same lists as front-coded columns (JSON is the same in both versions)
    _, mp = encode_body(batch, "msgpack", LIMITS, version=3)
    assert msgpack.unpackb(mp) == [7, "a", 3, [[0], [20], "https://example.com/", [1], [0], [0], [], [], "", [], []]]
    _, mp = encode_body(UrlBatch(seq=8, sender="a", epoch=3, urls=(sitemap,)), "msgpack", LIMITS, version=3)
    assert msgpack.unpackb(mp)[3][9:] == [[5.0], [True]]
    assert decode_body(TYPE_CODES[UrlBatch], mp, "msgpack", LIMITS, version=3).urls == (sitemap,)
    assert encode_body(batch, "json", LIMITS, version=2) == encode_body(batch, "json", LIMITS, version=3)
    _, welcome = encode_body(Welcome(proof=b"\x00" * 32), "json", LIMITS)
    assert json.loads(welcome) == {"proof": "A" * 43 + "="}


def test_integral_seconds_are_read_as_floats() -> None:
    message = decode_body(TYPE_CODES[Gossip], msgpack.packb([1, True, []]), "msgpack", LIMITS)
    assert message == Gossip(epoch=1, full=True, members=())
    chunk = msgpack.packb([1, 0, 1, 0, 5, [], [], [["h", 2, 0, 1, 3, 0]], True, []])
    decoded = decode_body(TYPE_CODES[HandoffChunk], chunk, "msgpack", LIMITS, version=2)
    assert decoded.hosts == (HostState(host="h", crawl_delay=2.0, ready_in=0.0, failures=1, pages=3),)
    assert type(decoded.hosts[0].crawl_delay) is float


ENTRY = UrlEntry(url="http://a/", depth=0, found_on=None, hops=0)
BAD_OUTGOING = [
    (Ping(seq=-1, epoch=0), "Ping.seq"),
    (Ping(seq=1 << 64, epoch=0), "outside"),
    (Ping(seq=True, epoch=0), "expected an integer"),
    (Pong(seq=1, epoch=1.0), "Pong.epoch"),
    (Goodbye(reason=b"bytes"), "expected a string"),
    (Goodbye(reason="\ud800"), "surrogate"),
    (Goodbye(reason="x" * 1025), "max_string=1024"),
    (Goodbye(reason="é" * 513), "1026 bytes"),
    (Welcome(proof=b"short"), "exactly 32 bytes"),
    (UrlBatch(seq=1, sender="a", epoch=1, urls=[ENTRY]), "expected a tuple"),
    (UrlBatch(seq=1, sender="a", epoch=1, urls=(ENTRY,) * 10_001), "max_urls_per_batch"),
    (UrlBatch(seq=1, sender="a", epoch=1, urls=(ENTRY, "http://b/")), "UrlBatch.urls[1]: expected UrlEntry"),
    (
        UrlBatch(seq=1, sender="a", epoch=1, urls=(UrlEntry(url="h" * 2049, depth=0, found_on=None, hops=0),)),
        "UrlBatch.urls[0].url: string of 2049 bytes exceeds max_url_length",
    ),
    (
        Gossip(epoch=1, full=True, members=(Member(node_id="a", address="b", weight=1, incarnation=0, state="x"),)),
        "Gossip.members[0].state",
    ),
    (
        Gossip(epoch=1, full=True, members=(Member(node_id="a", address="b", weight=0, incarnation=0, state="dead"),)),
        "weight",
    ),
    (Gossip(epoch=1, full=1, members=()), "expected a boolean"),
    (Gossip(epoch=1, full=True, members=[]), "Gossip.members: expected a tuple"),
    (Welcome(proof="x" * 32), "expected bytes"),
    (
        HandoffChunk(
            transfer_id=1,
            chunk_seq=0,
            epoch=1,
            arc_start=0,
            arc_end=1,
            urls=(),
            seen_keys=(b"k" * 65,),
            hosts=(),
            last=True,
        ),
        "max_key_length",
    ),
    (
        HandoffChunk(
            transfer_id=1,
            chunk_seq=0,
            epoch=1,
            arc_start=0,
            arc_end=1,
            urls=(),
            seen_keys=(),
            hosts=(HostState(host="h", crawl_delay=math.nan, ready_in=0.0, failures=0),),
            last=True,
        ),
        "finite",
    ),
    (
        HandoffChunk(
            transfer_id=1,
            chunk_seq=0,
            epoch=1,
            arc_start=0,
            arc_end=1,
            urls=(),
            seen_keys=(),
            hosts=(HostState(host="h", crawl_delay=1.0, ready_in=-1.0, failures=0),),
            last=True,
        ),
        "non-negative",
    ),
    (
        HandoffChunk(
            transfer_id=1,
            chunk_seq=0,
            epoch=1,
            arc_start=0,
            arc_end=1,
            urls=(),
            seen_keys=(),
            hosts=(HostState(host="h", crawl_delay="1", ready_in=0.0, failures=0),),
            last=True,
        ),
        "expected a number of seconds",
    ),
]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(("message", "fragment"), BAD_OUTGOING, ids=lambda v: type(v).__name__)
def test_invalid_outgoing_messages_are_local_errors(message: object, fragment: str, codec: str) -> None:
    with pytest.raises(LocalProtocolError, match="cannot send") as info:
        encode_body(message, codec, LIMITS)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_non_messages_and_unknown_codecs_are_local_errors() -> None:
    with pytest.raises(LocalProtocolError, match="not a protocol message"):
        encode_body(ENTRY, "msgpack", LIMITS)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="unknown codec"):
        encode_body(Ping(seq=1, epoch=1), "xml", LIMITS)


PING = TYPE_CODES[Ping]
BAD_INCOMING = [
    ("json", PING, b'{"seq":1}', "missing ['epoch']"),
    ("json", PING, b'{"seq":1,"epoch":2,"x":3}', "unexpected ['x']"),
    ("json", PING, b'{"seq":1,"seq":1,"epoch":2}', "duplicate key"),
    ("json", PING, b'{"seq":NaN,"epoch":2}', "NaN is not allowed"),
    ("json", PING, b'{"seq":1.0,"epoch":2}', "expected an integer"),
    ("json", PING, b'{"seq":true,"epoch":2}', "expected an integer"),
    ("json", PING, b'{"seq":1,"epoch":2} x', "not valid json"),
    ("json", PING, b'{"seq":1,"epoch":' + b"9" * 5000 + b"}", "not valid json"),
    ("json", PING, b"[1,2]", "expected an object"),
    ("json", PING, b"\xff", "not valid json"),
    ("json", PING, b"[" * 100_000, "not valid json"),
    ("json", TYPE_CODES[Welcome], b'{"proof":"!!"}', "not valid base64"),
    ("json", TYPE_CODES[Welcome], b'{"proof":5}', "expected a base64 string"),
    (
        "json",
        TYPE_CODES[UrlBatch],
        b'{"seq":1,"sender":"a","epoch":1,"urls":[{"url":"u","depth":0,"found_on":null,"x":0}]}',
        "UrlBatch.urls[0]: object fields differ: missing ['hops', 'lastmod', 'sitemap'], unexpected ['x']",
    ),
    ("msgpack", TYPE_CODES[UrlBatch], msgpack.packb([1, "a", 1, [["u", 2**32, None, 0, None, False]]]), "urls[0].depth"),
    ("msgpack", TYPE_CODES[UrlBatch], msgpack.packb([1, "a", 1, [["u", 0, None, 0, -1.0, True]]]), "urls[0].lastmod"),
    ("json", TYPE_CODES[Welcome], b'{"proof":"AAAA"}', "exactly 32 bytes"),
    ("json", TYPE_CODES[Welcome], b'{"proof":"' + b"A" * 100 + b'"}', "too long"),
    ("json", TYPE_CODES[Goodbye], b'{"reason":"\\ud800"}', "surrogate"),
    ("msgpack", PING, msgpack.packb([1, 2]) + b"\x00", "not valid msgpack"),
    ("msgpack", PING, msgpack.packb([1]), "array of 2 fields"),
    ("msgpack", PING, msgpack.packb({"seq": 1, "epoch": 2}), "expected an array"),
    ("msgpack", PING, msgpack.packb([1, -2]), "outside"),
    ("msgpack", PING, msgpack.packb([1, msgpack.ExtType(5, b"x")]), "not valid msgpack"),
    ("msgpack", PING, b"\x92\x01\xd6\xff\x00\x00\x00\x00", "not valid msgpack"),
    ("msgpack", PING, b"\x91" * 5000, "not valid msgpack"),
    ("msgpack", PING, b"\x92\x01", "not valid msgpack"),
    ("msgpack", PING, b"\x92\x01\xc1", "not valid msgpack"),
    ("msgpack", TYPE_CODES[Goodbye], b"\x91\xa2\xc3\x28", "not valid msgpack"),
    ("msgpack", 0x7F, msgpack.packb([]), "unknown message type 0x7f"),
]


@pytest.mark.parametrize(("codec", "code", "body", "fragment"), BAD_INCOMING)
def test_invalid_incoming_bodies_are_remote_errors(codec: str, code: int, body: bytes, fragment: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_body(code, body, codec, LIMITS, version=2)  # the version 2 wire form (columns: test_protocol_urlcolumns)
    assert fragment in str(info.value)


SMALL = Limits(
    max_frame=4096,
    max_urls_per_batch=3,
    max_url_length=20,
    max_string=8,
    max_list=2,
    max_keys_per_chunk=2,
    max_key_length=10,
)
OVER_SMALL_LIMITS = [
    (UrlBatch(seq=1, sender="a", epoch=1, urls=(ENTRY,) * 4), "max_urls_per_batch=3"),
    (
        UrlBatch(seq=1, sender="a", epoch=1, urls=(UrlEntry(url="u" * 21, depth=0, found_on=None, hops=0),)),
        "max_url_length=20",
    ),
    (UrlBatch(seq=1, sender="a", epoch=1, urls=(UrlEntry(url="u", depth=0, found_on="f" * 21, hops=0),)), "found_on"),
    (Goodbye(reason="r" * 9), "max_string=8"),
    (
        Gossip(
            epoch=1, full=True, members=(Member(node_id="a", address="b", weight=1, incarnation=0, state="alive"),) * 3
        ),
        "max_list=2",
    ),
    (
        HandoffChunk(
            transfer_id=1,
            chunk_seq=0,
            epoch=1,
            arc_start=0,
            arc_end=1,
            urls=(),
            seen_keys=(b"k" * 9,) * 3,
            hosts=(),
            last=False,
        ),
        "max_keys_per_chunk=2",
    ),
    (
        HandoffChunk(
            transfer_id=1,
            chunk_seq=0,
            epoch=1,
            arc_start=0,
            arc_end=1,
            urls=(),
            seen_keys=(b"k" * 11,),
            hosts=(),
            last=False,
        ),
        "max_key_length=10",
    ),
]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(("message", "fragment"), OVER_SMALL_LIMITS, ids=lambda v: type(v).__name__)
def test_limits_are_enforced_both_ways(message: object, fragment: str, codec: str) -> None:
    code, body = encode_body(message, codec, LIMITS)  # type: ignore[arg-type]
    with pytest.raises(RemoteProtocolError) as info:
        decode_body(code, body, codec, SMALL)
    assert fragment in str(info.value)
    with pytest.raises(LocalProtocolError) as local:
        encode_body(message, codec, SMALL)  # type: ignore[arg-type]
    assert fragment in str(local.value)


def test_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="max_frame"):
        Limits(max_frame=0)
    with pytest.raises(ValueError, match="4-byte length"):
        Limits(max_frame=1 << 32)
    with pytest.raises(ValueError, match="max_list"):
        Limits(max_list=True)


# The URL-list fast path must agree exactly with the general record code it shortcuts.
from protocol._messages import _URL_ENTRY, RECORDS, RECORDS_BY_VERSION  # noqa: E402
from protocol._schema import Invalid, Many, builder  # noqa: E402
from protocol._urllist import UrlList  # noqa: E402

entry_trees = st.one_of(
    st.lists(st.one_of(st.none(), st.booleans(), st.integers(-2, 2**32 + 1), st.text(max_size=30)), max_size=5),
    st.dictionaries(
        st.sampled_from(["url", "depth", "found_on", "hops", "x"]),
        st.one_of(st.none(), st.booleans(), st.integers(-2, 2**32 + 1), st.text(max_size=30)),
        max_size=5,
    ),
    url_entries.map(lambda e: [e.url, e.depth, e.found_on, e.hops]),
    url_entries.map(lambda e: {"url": e.url, "depth": e.depth, "found_on": e.found_on, "hops": e.hops}),
)


def outcome(kind: object, method: str, value: object, js: bool, limits: Limits) -> object:
    try:
        return getattr(kind, method)(value, js, limits)
    except Invalid as exc:
        return ("invalid", exc.where("urls"), exc.message)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(items=st.lists(entry_trees, max_size=6), js=st.booleans())
def test_url_list_fast_path_loads_exactly_like_the_general_path(items: list[object], js: bool) -> None:
    limits = Limits(max_url_length=20, max_urls_per_batch=5)
    fast = UrlList(_URL_ENTRY, "max_urls_per_batch")
    general = Many(_URL_ENTRY, "max_urls_per_batch")
    assert outcome(fast, "load", items, js, limits) == outcome(general, "load", items, js, limits)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    entries=st.lists(
        st.builds(
            UrlEntry,
            url=st.one_of(urls, st.integers()),
            depth=st.one_of(st.integers(-2, 2**32 + 1), st.booleans()),
            found_on=st.none() | urls,
            hops=st.integers(-2, 2**32 + 1),
        ),
        max_size=6,
    ),
    js=st.booleans(),
)
def test_url_list_fast_path_dumps_exactly_like_the_general_path(entries: list[UrlEntry], js: bool) -> None:
    limits = Limits(max_url_length=20, max_urls_per_batch=5)
    fast = UrlList(_URL_ENTRY, "max_urls_per_batch")
    general = Many(_URL_ENTRY, "max_urls_per_batch")
    value = tuple(entries)
    assert outcome(fast, "dump", value, js, limits) == outcome(general, "dump", value, js, limits)


def test_fast_builders_refuse_classes_that_validate_in_init() -> None:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            assert self.x >= 0

    with pytest.raises(TypeError, match="__post_init__"):
        builder(Checked, ("x",))
    with pytest.raises(TypeError, match="UrlList needs a record"):
        UrlList(RECORDS[TYPE_CODES[Ping]], "max_urls_per_batch")


DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


def test_the_specification_lists_the_codes_and_limits_the_code_uses() -> None:
    text = DOC.read_text(encoding="utf-8")
    codes = {int(code, 16): name for code, name in re.findall(r"^\| (0x[0-9a-f]{2}) \| `(\w+)` \|", text, re.M)}
    assert codes == {code: cls.__name__ for cls, code in TYPE_CODES.items()}
    limits = {
        name: int(value.replace(",", "")) for name, value in re.findall(r"^\| `(max_\w+)` \| ([\d,]+) \|", text, re.M)
    }
    assert limits == {field.name: getattr(LIMITS, field.name) for field in fields(Limits)}


@pytest.mark.parametrize(
    ("host", "fragment"),
    [
        ("", "1-253 characters, got 0"),
        ("a" * 600, "1-253 characters, got 600"),
        (("a" * 63 + ".") * 4 + "com", "1-253 characters, got 259"),
        ("a" * 64 + ".com", "not a lower-case ASCII host name"),
        ("Example.COM", "not a lower-case ASCII host name"),
        ("exa mple.com", "not a lower-case ASCII host name"),
        ("example..com", "label ''"),
        ("-example.com", "not a lower-case ASCII host name"),
        ("bücher.de", "not a lower-case ASCII host name"),
        ("xn--bcher-kv%a.de", "not a lower-case ASCII host name"),
        ("xn--99999999999.de", "does not decode"),
        ("[::1", "IPv6"),
        ("[0:0::1]", "IPv6"),
        ("[example.com]", "IPv6"),
    ],
)
@pytest.mark.parametrize("codec", CODECS)
def test_host_names_from_a_peer_are_held_to_what_a_url_host_can_be(host: str, fragment: str, codec: str) -> None:
    good = HostState(host="h", crawl_delay=1.0, ready_in=0.0, failures=0)
    code, body = encode_body(SeenReplica(epoch=1, keys=(), hosts=(good,)), codec, LIMITS)
    body = body.replace(b'"h"', json.dumps(host).encode()) if codec == "json" else body.replace(
        b"\xa1h", msgpack.packb(host)
    )
    with pytest.raises(RemoteProtocolError, match=re.escape(fragment)) as info:
        decode_body(code, body, codec, LIMITS)
    assert "hosts[0].host" in str(info.value)
    with pytest.raises(LocalProtocolError):
        encode_body(SeenReplica(epoch=1, keys=(), hosts=(HostState(host=host, crawl_delay=1.0, ready_in=0.0,
                                                                        failures=0),)), codec, LIMITS)


@pytest.mark.parametrize(
    "host", ["example.com", "xn--bcher-kva.de", "a-b_c.example", "127.0.0.1", "[::1]", "[2001:db8::1]", "x" * 63]
)
def test_host_names_that_urls_have_pass(host: str) -> None:
    state = HostState(host=host, crawl_delay=1.0, ready_in=0.0, failures=0)
    for codec in CODECS:
        code, body = encode_body(SeenReplica(epoch=1, keys=(b"k" * 16,), hosts=(state,)), codec, LIMITS)
        assert decode_body(code, body, codec, LIMITS).hosts == (state,)


def test_seen_keys_shorter_than_a_ring_position_and_a_fingerprint_are_refused() -> None:
    code, body = encode_body(SeenReplica(epoch=1, keys=(b"k" * 9,)), "msgpack", LIMITS)
    with pytest.raises(RemoteProtocolError, match="at least 9 bytes, got 0"):
        decode_body(code, body.replace(b"\xc4\x09" + b"k" * 9, b"\xc4\x00"), "msgpack", LIMITS)
