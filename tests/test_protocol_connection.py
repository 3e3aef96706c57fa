"""The connection state machine: the two-party handshake, ordering rules, closing, compression, buffering."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import os
import struct
import zlib
from collections.abc import Iterable

import brotli
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    PROTOCOL_VERSION,
    CODECS,
    COMPRESSIONS,
    FLAG_BROTLI,
    FLAG_ZLIB,
    HEADER_SIZE,
    NEED_DATA,
    TYPE_CODES,
    Challenge,
    Connection,
    ConnectionClosed,
    Established,
    Goodbye,
    Hello,
    Limits,
    LocalProtocolError,
    Ping,
    Pong,
    Reject,
    RemoteProtocolError,
    Role,
    State,
    UrlBatch,
    UrlEntry,
    Welcome,
    encode_body,
    encode_frame,
)
from tests.test_protocol_codec import APP_MESSAGES

SECRET = b"cluster secret, 32 bytes long!!!"
OTHER_SECRET = b"another secret, also long enough"


def counting_nonces(start: int) -> object:
    """An os.urandom stand-in: distinct, reproducible nonces."""
    counter = itertools.count(start)
    return lambda size: next(counter).to_bytes(size, "big")


def make(role: Role, node_id: str, secret: bytes = SECRET, **options: object) -> Connection:
    options.setdefault("nonce", os.urandom)
    return Connection(role, node_id=node_id, secret=secret, **options)  # type: ignore[arg-type]


def drain(conn: Connection, limit: int = 10_000) -> list[object]:
    """Every event until NEED_DATA (or the end of the stream)."""
    events = []
    for _ in range(limit):
        event = conn.next_event()
        if event is NEED_DATA:
            return events
        events.append(event)
        if isinstance(event, ConnectionClosed):
            return events
    raise AssertionError("no NEED_DATA after many events")


def handshake(initiator: Connection, responder: Connection) -> tuple[list[object], list[object]]:
    responder.receive_data(initiator.initiate())
    assert drain(responder) == []
    initiator.receive_data(responder.data_to_send())
    initiator_events = drain(initiator)
    responder.receive_data(initiator.data_to_send())
    return initiator_events, drain(responder)


NONCE_A = bytes(range(32))
NONCE_B = bytes(range(32, 64))


def established(codec: str = "msgpack", compression: str = "none", **options: object) -> tuple[Connection, Connection]:
    """An established pair with fixed nonces, so two pairs share frame keys: a stream sent on one replays on the
    other, and `tagged` forges frames as the initiator would send them."""
    a = make(Role.INITIATOR, "a", codecs=(codec,), compressions=(compression,), nonce=NONCE_A, **options)
    b = make(Role.RESPONDER, "b", **options, codecs=CODECS, compressions=COMPRESSIONS, nonce=NONCE_B)
    events_a, events_b = handshake(a, b)
    assert events_a == [Established(node_id="b", version=PROTOCOL_VERSION, codec=codec, compression=compression)]
    assert events_b == [Established(node_id="a", version=PROTOCOL_VERSION, codec=codec, compression=compression)]
    return a, b


def test_handshake_with_the_right_secret() -> None:
    a = make(Role.INITIATOR, "node-a:7000")
    b = make(Role.RESPONDER, "node-b:7000")
    assert (a.state, b.state) == (State.IDLE, State.IDLE)
    events_a, events_b = handshake(a, b)
    assert events_a == [Established(node_id="node-b:7000", version=PROTOCOL_VERSION, codec="msgpack", compression="none")]
    assert events_b == [Established(node_id="node-a:7000", version=PROTOCOL_VERSION, codec="msgpack", compression="none")]
    assert (a.state, b.state) == (State.ESTABLISHED, State.ESTABLISHED)
    assert (a.peer_node_id, b.peer_node_id) == ("node-b:7000", "node-a:7000")
    b.receive_data(a.send(Ping(seq=1, epoch=4)))
    assert drain(b) == [Ping(seq=1, epoch=4)]
    a.receive_data(b.send(Pong(seq=1, epoch=4)))
    assert drain(a) == [Pong(seq=1, epoch=4)]


def test_wrong_secret_is_caught_by_the_initiator_and_the_responder_is_told() -> None:
    a = make(Role.INITIATOR, "a", OTHER_SECRET)
    b = make(Role.RESPONDER, "b")
    b.receive_data(a.initiate())
    assert drain(b) == []
    a.receive_data(b.data_to_send())
    with pytest.raises(RemoteProtocolError, match="'b' failed to prove the cluster secret"):
        a.next_event()
    assert a.state is State.ERROR
    with pytest.raises(RemoteProtocolError, match="already failed"):
        a.next_event()
    with pytest.raises(LocalProtocolError, match="failed"):
        a.send(Ping(seq=1, epoch=1))
    b.receive_data(a.data_to_send())
    [reject] = drain(b)
    assert isinstance(reject, Reject) and "failed to prove the cluster secret" in reject.reason
    assert b.state is State.CHALLENGE_SENT and b.received_close
    with pytest.raises(LocalProtocolError, match="before the handshake"):
        b.send(Ping(seq=1, epoch=1))


def forged_initiator(nonce: bytes) -> tuple[bytes, bytes]:
    """A Hello frame an attacker without the secret can make, and its body."""
    hello = Hello(versions=(2,), codecs=("msgpack",), compressions=("none",), node_id="mallory", nonce=nonce)
    code, body = encode_body(hello, "json", Limits())
    return encode_frame(code, 0, body), body


def test_responder_rejects_an_initiator_without_the_secret() -> None:
    b = make(Role.RESPONDER, "b")
    hello, _ = forged_initiator(b"\x01" * 32)
    b.receive_data(hello)
    assert drain(b) == []
    assert b.data_to_send()  # the Challenge; the attacker cannot answer it
    code, body = encode_body(Welcome(proof=b"\x00" * 32), "json", Limits())
    b.receive_data(encode_frame(code, 0, body) + ping_frame())
    with pytest.raises(RemoteProtocolError, match="'mallory' failed to prove"):
        b.next_event()
    assert b.state is State.ERROR
    assert b"failed to prove" in b.data_to_send()


def tagged(code: int, flags: int, body: bytes, seq: int = 0) -> bytes:
    """A frame as the initiator of an `established()` pair sends it (its `seq`-th), from the spec's formulas."""
    key = hmac.new(SECRET, b"peercrawl frame key\x00initiator\x00" + NONCE_A + NONCE_B, hashlib.sha256).digest()
    tag = hashlib.blake2b(struct.pack("!Q", seq) + bytes((code, flags)) + body, key=key, digest_size=16).digest()
    return encode_frame(code, flags, body + tag)


def ping_frame() -> bytes:
    code, body = encode_body(Ping(seq=1, epoch=1), "msgpack", Limits())
    return encode_frame(code, 0, body)


def test_replayed_proofs_fail() -> None:
    # Session 1: a real initiator and responder; an eavesdropper records every frame.
    a1 = make(Role.INITIATOR, "a")
    b1 = make(Role.RESPONDER, "b")
    hello1 = a1.initiate()
    b1.receive_data(hello1)
    drain(b1)
    challenge1 = b1.data_to_send()
    a1.receive_data(challenge1)
    drain(a1)
    welcome1 = a1.data_to_send()
    # Replaying the initiator's side against a fresh responder: the responder's new nonce defeats the old proof.
    b2 = make(Role.RESPONDER, "b")
    b2.receive_data(hello1)
    assert drain(b2) == []
    assert b2.data_to_send() != challenge1
    b2.receive_data(welcome1)
    with pytest.raises(RemoteProtocolError, match="failed to prove"):
        b2.next_event()
    # Replaying the responder's side against a fresh initiator: its new nonce defeats the old proof.
    a2 = make(Role.INITIATOR, "a")
    a2.initiate()
    a2.receive_data(challenge1)
    with pytest.raises(RemoteProtocolError, match="failed to prove"):
        a2.next_event()


def test_replay_succeeds_only_if_nonces_repeat_so_they_must_be_fresh() -> None:
    fixed = b"\x07" * 32
    a1 = make(Role.INITIATOR, "a", nonce=fixed)
    b1 = make(Role.RESPONDER, "b", nonce=fixed)
    handshake(a1, b1)
    a2 = make(Role.INITIATOR, "a", nonce=fixed)
    b2 = make(Role.RESPONDER, "b", nonce=fixed)
    b2.receive_data(a2.initiate())
    drain(b2)
    a2.receive_data(b2.data_to_send())
    drain(a2)
    welcome2 = a2.data_to_send()
    a3 = make(Role.INITIATOR, "a", nonce=counting_nonces(1))
    b3 = make(Role.RESPONDER, "b", nonce=counting_nonces(2))
    b3.receive_data(a3.initiate())
    drain(b3)
    b3.data_to_send()
    b3.receive_data(welcome2)
    with pytest.raises(RemoteProtocolError, match="failed to prove"):
        b3.next_event()


def test_reflected_responder_proof_is_not_an_initiator_proof() -> None:
    b = make(Role.RESPONDER, "b", nonce=counting_nonces(5))
    hello, _ = forged_initiator(b"\x02" * 32)
    b.receive_data(hello)
    drain(b)
    challenge_frame = b.data_to_send()
    proof = json.loads(challenge_frame[HEADER_SIZE:])["proof"]  # the responder's own proof, sent back
    b.receive_data(encode_frame(TYPE_CODES[Welcome], 0, f'{{"proof":"{proof}"}}'.encode()))
    with pytest.raises(RemoteProtocolError, match="failed to prove"):
        b.next_event()


def test_negotiation_prefers_the_initiators_order_and_rejects_nothing_in_common() -> None:
    a = make(Role.INITIATOR, "a", codecs=("json", "msgpack"), compressions=("zlib", "none"))
    b = make(Role.RESPONDER, "b", compressions=("none", "zlib"))
    events_a, _ = handshake(a, b)
    assert events_a == [Established(node_id="b", version=PROTOCOL_VERSION, codec="json", compression="zlib")]

    a = make(Role.INITIATOR, "a", codecs=("json",))
    b = make(Role.RESPONDER, "b", codecs=("msgpack",))
    b.receive_data(a.initiate())
    with pytest.raises(RemoteProtocolError, match="no common codec"):
        b.next_event()
    a.receive_data(b.data_to_send())
    [reject] = drain(a)
    assert isinstance(reject, Reject) and "no common codec" in reject.reason
    a.receive_data(b"")
    assert drain(a) == [ConnectionClosed(clean=True)]
    assert a.state is State.CLOSED


def test_version_3_is_chosen_when_both_speak_it_and_2_with_an_older_peer() -> None:
    for offered, accepted, chosen in (((2, 3), (2, 3), 3), ((2,), (2, 3), 2), ((2, 3), (2,), 2)):
        a = make(Role.INITIATOR, "a", versions=offered)
        b = make(Role.RESPONDER, "b", versions=accepted)
        events_a, events_b = handshake(a, b)
        assert events_a == [Established(node_id="b", version=chosen, codec="msgpack", compression="none")]
        assert events_b == [Established(node_id="a", version=chosen, codec="msgpack", compression="none")]
        batch = big_batch(50)
        b.receive_data(a.send(batch))
        assert drain(b) == [batch]  # each side encodes and decodes in the version it agreed
    a = make(Role.INITIATOR, "a", versions=(3,))
    b = make(Role.RESPONDER, "b", versions=(2,))
    b.receive_data(a.initiate())
    with pytest.raises(RemoteProtocolError, match=r"no common protocol version: peer offers \[3\], we speak \[2\]"):
        b.next_event()


def test_no_common_version_is_refused() -> None:
    b = make(Role.RESPONDER, "b")
    hello = Hello(versions=(1, 8), codecs=("msgpack",), compressions=("none",), node_id="future", nonce=bytes(32))
    code, body = encode_body(hello, "json", Limits())
    b.receive_data(encode_frame(code, 0, body))
    with pytest.raises(RemoteProtocolError, match=r"no common protocol version: peer offers \[1, 8\], we speak \[2, 3, 4, 5, 6, 7\]"):
        b.next_event()


def test_no_common_compression_is_refused() -> None:
    a = make(Role.INITIATOR, "a", compressions=("zlib",))
    b = make(Role.RESPONDER, "b")
    b.receive_data(a.initiate())
    with pytest.raises(RemoteProtocolError, match=r"no common compression: peer offers \['zlib'\]"):
        b.next_event()


def test_initiator_refuses_a_choice_it_did_not_offer() -> None:
    a = make(Role.INITIATOR, "a", codecs=("msgpack",))
    a.initiate()
    fake = Challenge(version=2, codec="json", compression="none", node_id="b", nonce=b"\0" * 32, proof=b"\0" * 32)
    code, body = encode_body(fake, "json", Limits())
    a.receive_data(encode_frame(code, 0, body))
    with pytest.raises(RemoteProtocolError, match="which we did not offer"):
        a.next_event()


def test_nothing_but_the_handshake_before_it_completes() -> None:
    b = make(Role.RESPONDER, "b")
    b.receive_data(ping_frame())
    with pytest.raises(RemoteProtocolError, match="before the handshake completed"):
        b.next_event()
    # A Welcome before any Hello, and a Hello to an initiator, are out of order too.
    b = make(Role.RESPONDER, "b")
    code, body = encode_body(Welcome(proof=b"\0" * 32), "json", Limits())
    b.receive_data(encode_frame(code, 0, body))
    with pytest.raises(RemoteProtocolError, match="Welcome to a responder in state idle"):
        b.next_event()
    a = make(Role.INITIATOR, "a")
    a.initiate()
    a.receive_data(forged_initiator(b"\3" * 32)[0])
    with pytest.raises(RemoteProtocolError, match="Hello to a initiator"):
        a.next_event()
    # A second Hello once established is refused.
    a, b = established()
    b.receive_data(forged_initiator(b"\4" * 32)[0])
    with pytest.raises(RemoteProtocolError, match="Hello to a responder in state established"):
        b.next_event()


def test_local_misuse_is_a_local_error() -> None:
    a = make(Role.INITIATOR, "a")
    with pytest.raises(LocalProtocolError, match="before the handshake"):
        a.send(Ping(seq=1, epoch=1))
    a.initiate()
    with pytest.raises(LocalProtocolError, match="idle initiator"):
        a.initiate()
    with pytest.raises(LocalProtocolError, match="idle initiator"):
        make(Role.RESPONDER, "b").initiate()
    with pytest.raises(LocalProtocolError, match="handshake messages itself"):
        a.send(Welcome(proof=b"\0" * 32))
    with pytest.raises(LocalProtocolError, match="role must be a Role"):
        Connection("initiator", node_id="a", secret=SECRET, nonce=os.urandom)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="at least 16 bytes"):
        make(Role.INITIATOR, "a", b"short")
    with pytest.raises(LocalProtocolError, match="codecs must be"):
        make(Role.INITIATOR, "a", codecs=("xml",))
    with pytest.raises(LocalProtocolError, match="compressions must be"):
        make(Role.INITIATOR, "a", compressions=())
    with pytest.raises(LocalProtocolError, match="node_id"):
        make(Role.INITIATOR, "x" * 2000)
    with pytest.raises(LocalProtocolError, match="32 random bytes"):
        make(Role.INITIATOR, "a", nonce=b"too short").initiate()
    with pytest.raises(LocalProtocolError, match="32 random bytes"):
        make(Role.INITIATOR, "a", nonce=lambda n: bytes(n - 1)).initiate()


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=40, deadline=None)
@given(messages=st.lists(APP_MESSAGES, max_size=6), cuts=st.lists(st.integers(1, 64), max_size=50))
def test_stream_fed_whole_byte_by_byte_and_in_chunks(
    codec: str, compression: str, messages: list[object], cuts: list[int]
) -> None:
    messages = [m for m in messages if not isinstance(m, Goodbye)] + [Goodbye(reason="done")]
    a, _ = established(codec, compression, compress_min=16)
    stream = b"".join(a.send(m) for m in messages)  # type: ignore[arg-type]

    def replay(chunks: Iterable[bytes]) -> list[object]:
        _, b = established(codec, compression)
        events: list[object] = []
        for chunk in chunks:
            b.receive_data(chunk)
            events += drain(b)
        b.receive_data(b"")
        return events + drain(b)

    expected = messages + [ConnectionClosed(clean=True)]
    assert replay([stream]) == expected
    assert replay(stream[i : i + 1] for i in range(len(stream))) == expected
    bounds = list(itertools.accumulate(cuts))
    pieces = [stream[i:j] for i, j in zip([0] + bounds, bounds + [len(stream)], strict=True) if stream[i:j]]
    assert replay(pieces) == expected


@pytest.mark.parametrize(
    "garbage",
    [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00\x00\x00\x01\x21", b"\x00\x00\x00\x02\x99\x00", b"\xff\xff"],
)
@pytest.mark.parametrize("codec", CODECS)
def test_trailing_garbage_yields_the_good_events_then_a_remote_error(codec: str, garbage: bytes) -> None:
    a, b = established(codec)
    good = [Ping(seq=1, epoch=2), UrlBatch(seq=3, sender="a", epoch=2, urls=())]
    b.receive_data(b"".join(a.send(m) for m in good) + garbage)
    assert [b.next_event(), b.next_event()] == good
    with pytest.raises(RemoteProtocolError):
        b.next_event()
        b.receive_data(b"")
        b.next_event()


def test_closing() -> None:
    a, b = established()
    b.receive_data(a.send(Goodbye(reason="leaving")))
    assert drain(b) == [Goodbye(reason="leaving")]
    with pytest.raises(LocalProtocolError, match="already sent Goodbye"):
        a.send(Ping(seq=1, epoch=1))
    # The other side may still answer after receiving a Goodbye.
    a.receive_data(b.send(Pong(seq=9, epoch=1)) + b.send(Goodbye(reason="bye")))
    assert drain(a) == [Pong(seq=9, epoch=1), Goodbye(reason="bye")]
    a.receive_data(b"")
    assert drain(a) == [ConnectionClosed(clean=True)]
    assert a.next_event() == ConnectionClosed(clean=True)
    with pytest.raises(LocalProtocolError, match="after the end of the stream"):
        a.receive_data(b"more")
    # A frame after Goodbye is the peer's fault.
    a, b = established()
    b.receive_data(a.send(Goodbye(reason="x")) + ping_frame())
    assert b.next_event() == Goodbye(reason="x")
    with pytest.raises(RemoteProtocolError, match="after its Goodbye"):
        b.next_event()
    # An end of stream without Goodbye is not clean; one inside a frame is an error.
    a, b = established()
    b.receive_data(b"")
    assert drain(b) == [ConnectionClosed(clean=False)]
    a, b = established()
    b.receive_data(a.send(Ping(seq=1, epoch=1))[:-1])
    b.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        b.next_event()


def test_reject_may_be_sent_at_any_time_and_closes_our_side() -> None:
    b = make(Role.RESPONDER, "b")
    frame = b.send(Reject(reason="not now"))
    assert frame[4] == TYPE_CODES[Reject]
    with pytest.raises(LocalProtocolError, match="already sent"):
        b.send(Reject(reason="again"))


def big_batch(n: int = 500) -> UrlBatch:
    urls = tuple(
        UrlEntry(url=f"https://www.example{i % 7}.org/articles/{i}?ref=home", depth=3, found_on=None, hops=0)
        for i in range(n)
    )
    return UrlBatch(seq=1, sender="a", epoch=1, urls=urls)


def test_compression_shrinks_large_frames_and_skips_small_ones() -> None:
    plain_a, _ = established("msgpack", "none")
    zlib_a, zlib_b = established("msgpack", "zlib")
    batch = big_batch()
    plain, packed = plain_a.send(batch), zlib_a.send(batch)
    assert packed[5] == FLAG_ZLIB and plain[5] == 0
    assert len(packed) * 3 < len(plain)
    zlib_b.receive_data(packed)
    assert zlib_b.next_event() == batch
    assert zlib_a.send(Ping(seq=1, epoch=1))[5] == 0  # below compress_min: sent plain
    br_a, br_b = established("msgpack", "br")
    packed_br = br_a.send(batch)
    assert packed_br[5] == FLAG_BROTLI and len(packed_br) < len(packed)
    br_b.receive_data(packed_br)
    assert br_b.next_event() == batch
    assert br_a.send(Ping(seq=1, epoch=1))[5] == 0


def test_compressed_frames_are_checked() -> None:
    body = msgpack.packb([1, 2])
    ping = TYPE_CODES[Ping]
    _, b = established("msgpack", "none")
    b.receive_data(tagged(ping, FLAG_ZLIB, zlib.compress(body)))
    with pytest.raises(RemoteProtocolError, match="compression was not agreed"):
        b.next_event()
    limits = Limits(max_frame=4096)
    cases = [
        (zlib.compress(b"\x00" * 100_000), "inflates past 4094"),  # a bomb: 100 KB from ~100 bytes
        (b"not zlib", "does not inflate"),
        (zlib.compress(body)[:-2], "truncated"),
        (zlib.compress(body) + b"x", "trailing"),
    ]
    for payload, fragment in cases:
        _, b = established("msgpack", "zlib", limits=limits)
        b.receive_data(tagged(ping, FLAG_ZLIB, payload))
        with pytest.raises(RemoteProtocolError, match=fragment):
            b.next_event()
    brotli_cases = [
        (brotli.compress(b"\x00" * 100_000), "unpacks past 4094"),
        (b"not brotli", "does not unpack"),
        (brotli.compress(body)[:-1], "truncated"),
        (brotli.compress(body) + b"x", "does not unpack"),
    ]
    for payload, fragment in brotli_cases:
        _, b = established("msgpack", "br", limits=limits)
        b.receive_data(tagged(ping, FLAG_BROTLI, payload))
        with pytest.raises(RemoteProtocolError, match=fragment):
            b.next_event()
    _, b = established("msgpack", "zlib")
    b.receive_data(tagged(ping, FLAG_BROTLI, brotli.compress(body)))
    with pytest.raises(RemoteProtocolError, match="the agreed compression is 'zlib'"):
        b.next_event()
    _, b = established("msgpack", "zlib")
    b.receive_data(tagged(ping, 0x04, body))
    with pytest.raises(RemoteProtocolError, match="unknown frame flags"):
        b.next_event()
    b = make(Role.RESPONDER, "b")
    b.receive_data(encode_frame(TYPE_CODES[Hello], FLAG_ZLIB, b"{}"))
    with pytest.raises(RemoteProtocolError, match="flags 0x01 on a handshake frame"):
        b.next_event()


def test_frame_limit_bounds_what_we_buffer() -> None:
    limits = Limits(max_frame=1000)
    _, b = established(limits=limits)
    # A header announcing one byte too many is refused after its 4 length bytes.
    b.receive_data((1001).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError, match="frame of 1001 bytes, over the limit of 1000"):
        b.next_event()
    _, b = established(limits=limits)
    b.receive_data((1).to_bytes(4, "big") + b"\x21")
    with pytest.raises(RemoteProtocolError, match="minimum is 2"):
        b.next_event()
    # A frame of exactly the limit is buffered until complete, never beyond.
    _, b = established(limits=limits)
    b.receive_data((1000).to_bytes(4, "big") + b"\x21\x00")
    for _ in range(997):
        assert b.next_event() is NEED_DATA
        b.receive_data(b"\xc0")
    assert b.next_event() is NEED_DATA
    b.receive_data(b"\xc0")
    with pytest.raises(RemoteProtocolError, match="wrong tag"):
        b.next_event()
    # Feeding without draining is refused once a whole frame's worth is buffered.
    a, b = established(limits=limits)
    ping = a.send(Ping(seq=1, epoch=1))
    for _ in range((1000 + HEADER_SIZE) // len(ping) + 1):
        b.receive_data(ping)
    with pytest.raises(LocalProtocolError, match="until NEED_DATA"):
        b.receive_data(ping)


def test_sending_over_the_frame_limit_is_a_local_error() -> None:
    a, _ = established(limits=Limits(max_frame=2000))
    with pytest.raises(LocalProtocolError, match="over the frame limit of 2000"):
        a.send(big_batch(100))


def test_handshake_matches_the_documented_vector_and_an_independent_proof() -> None:
    """docs/protocol.md's worked example (two version 2 nodes), with the proofs recomputed from the spec's formulas."""
    secret = b"correct horse battery staple 123"
    a = make(Role.INITIATOR, "a.example:7070", secret, nonce=bytes(range(32)), versions=(2,))
    b = make(Role.RESPONDER, "b.example:7070", secret, nonce=bytes(range(32, 64)), versions=(2,))
    hello = a.initiate()
    assert hello == bytes.fromhex("000000af0100") + (
        b'{"protocol":"peercrawl","versions":[2],"codecs":["msgpack","json"],"compressions":["none"],'
        b'"node_id":"a.example:7070","nonce":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="}'
    )
    b.receive_data(hello)
    assert drain(b) == []
    challenge = b.data_to_send()

    def text(value: str) -> bytes:
        return struct.pack("!I", len(value.encode())) + value.encode()

    responder_input = (
        b"peercrawl responder proof\x00"
        + hashlib.sha256(hello[6:]).digest()
        + bytes(range(32, 64))
        + text("b.example:7070")
        + struct.pack("!H", 2)
        + text("msgpack")
        + text("none")
    )
    responder_proof = hmac.new(secret, responder_input, hashlib.sha256).digest()
    assert base64.b64encode(responder_proof) == b"vB4dyRMx96fw7qVQaZhGdA4Y7t7hANtIUvHdd/BTQeQ="
    assert challenge == bytes.fromhex("000000bf0200") + (
        b'{"version":2,"codec":"msgpack","compression":"none","node_id":"b.example:7070",'
        b'"nonce":"ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=","proof":"' + base64.b64encode(responder_proof) + b'"}'
    )
    a.receive_data(challenge)
    drain(a)
    welcome = a.data_to_send()
    initiator_input = (
        b"peercrawl initiator proof\x00" + hashlib.sha256(hello[6:]).digest() + hashlib.sha256(challenge[6:]).digest()
    )
    initiator_proof = base64.b64encode(hmac.new(secret, initiator_input, hashlib.sha256).digest())
    assert initiator_proof == b"Q/OPB1SdRS35YiGcWWsEnMZWwU4ExHsTjqNSOzwo5JE="
    assert welcome == bytes.fromhex("0000003a0300") + b'{"proof":"' + initiator_proof + b'"}'
    b.receive_data(welcome)
    assert drain(b) == [Established(node_id="a.example:7070", version=2, codec="msgpack", compression="none")]
    initiator_key = hmac.new(
        secret, b"peercrawl frame key\x00initiator\x00" + bytes(range(64)), hashlib.sha256
    ).digest()
    assert initiator_key.hex() == "d25d07a1d0ac1499be207d73697eddceeb981326fb8f0fbf6a8e2a7d83f6059f"
    ping_tag = hashlib.blake2b(struct.pack("!Q", 0) + bytes((0x21, 0)) + bytes.fromhex("920102"),
                               key=initiator_key, digest_size=16).digest()
    assert a.send(Ping(seq=1, epoch=2)) == bytes.fromhex("000000152100920102") + ping_tag
    assert ping_tag.hex() == "d00dffc49198773bbd98ad2963f221b4"
    batch = UrlBatch(
        seq=5, sender="a", epoch=3, urls=(UrlEntry(url="https://example.com/", depth=1, found_on=None, hops=0),)
    )
    body = bytes.fromhex("9405a161039196b468747470733a2f2f6578616d706c652e636f6d2f01c000c0c2")
    batch_tag = hashlib.blake2b(struct.pack("!Q", 1) + bytes((0x10, 0)) + body, key=initiator_key,
                                digest_size=16).digest()  # the initiator's frame 1
    assert a.send(batch) == bytes.fromhex("0000003310") + b"\x00" + body + batch_tag
    assert batch_tag.hex() == "bc0b458acfb078c5ae62c73025b815fc"


# --- frame authentication and the pre-handshake limit --------------------------------------------------------


def test_every_frame_after_the_handshake_is_tagged_and_checked() -> None:
    a, b = established()
    frames = [a.send(Ping(seq=i, epoch=1)) for i in range(3)]
    # Untouched frames pass, in order.
    b.receive_data(b"".join(frames))
    assert drain(b) == [Ping(seq=i, epoch=1) for i in range(3)]
    # One flipped bit anywhere in the body or the tag ends the connection.
    for position in (6, 8, len(frames[0]) - 1):
        a, b = established()
        frame = bytearray(a.send(Ping(seq=1, epoch=1)))
        frame[position] ^= 0x01
        b.receive_data(bytes(frame))
        with pytest.raises(RemoteProtocolError, match="wrong tag"):
            b.next_event()
        assert b.state is State.ERROR


@pytest.mark.parametrize("attack", ["replay", "reorder", "drop", "inject", "reflect", "other connection"])
def test_replayed_reordered_dropped_injected_or_reflected_frames_are_refused(attack: str) -> None:
    a, b = established()
    one, two = a.send(Ping(seq=1, epoch=1)), a.send(Ping(seq=2, epoch=1))
    if attack == "replay":
        stream, good = one + one, 1
    elif attack == "reorder":
        stream, good = two + one, 0
    elif attack == "drop":
        stream, good = two, 0
    elif attack == "inject":  # a well-formed frame from someone without the keys: a valid body, a made-up tag
        stream, good = one + encode_frame(TYPE_CODES[Ping], 0, bytes.fromhex("920901") + bytes(16)), 1
    elif attack == "reflect":  # the responder's own frame sent back to it
        stream, good = b.send(Ping(seq=7, epoch=1)), 0
    else:  # a frame recorded on another connection of the same two nodes (fresh nonces there)
        a2 = make(Role.INITIATOR, "a", nonce=counting_nonces(100))
        b2 = make(Role.RESPONDER, "b", nonce=counting_nonces(200))
        handshake(a2, b2)
        stream, good = a2.send(Ping(seq=1, epoch=1)), 0
    b.receive_data(stream)
    assert [b.next_event() for _ in range(good)] == [Ping(seq=1, epoch=1)][:good]
    with pytest.raises(RemoteProtocolError, match="wrong tag"):
        b.next_event()
    assert "wrong tag" in drain_reject(a, b)


def drain_reject(a: Connection, b: Connection) -> str:
    """The Reject the failed side queued, as its peer reads it."""
    a.receive_data(b.data_to_send())
    [reject] = drain(a)
    assert isinstance(reject, Reject)
    return reject.reason


def test_a_frame_too_short_for_its_tag_is_refused() -> None:
    _, b = established()
    b.receive_data(encode_frame(TYPE_CODES[Ping], 0, b"\x92\x01\x01"))
    with pytest.raises(RemoteProtocolError, match="too short to hold its tag"):
        b.next_event()


def test_tags_are_checked_before_inflating() -> None:
    """A compressed frame with a wrong tag is refused without being inflated (no bomb runs unauthenticated)."""
    _, b = established("msgpack", "zlib")
    bomb = zlib.compress(b"\x00" * 1_000_000)
    b.receive_data(encode_frame(TYPE_CODES[Ping], FLAG_ZLIB, bomb + bytes(16)))
    with pytest.raises(RemoteProtocolError, match="wrong tag"):
        b.next_event()


def test_before_the_handshake_a_frame_is_at_most_max_handshake_frame() -> None:
    limits = Limits(max_handshake_frame=300)
    for role in (Role.RESPONDER, Role.INITIATOR):
        conn = make(role, "x", limits=limits)
        if role is Role.INITIATOR:
            conn.initiate()
        conn.receive_data((301).to_bytes(4, "big"))
        with pytest.raises(RemoteProtocolError, match="frame of 301 bytes, over the limit of 300"):
            conn.next_event()
    # The default: 4 KiB. A stranger's 1 MiB frame is refused after its 4 length bytes...
    b = make(Role.RESPONDER, "b")
    b.receive_data((1 << 20).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError, match="over the limit of 4096"):
        b.next_event()
    # ... and feeding without draining stops at a handshake frame's worth, not max_frame's.
    b = make(Role.RESPONDER, "b")
    b.receive_data((4096).to_bytes(4, "big") + b"\x01\x00" + b"x" * 4097)
    with pytest.raises(LocalProtocolError, match="until NEED_DATA"):
        b.receive_data(b"x")
    # After the handshake the full frame limit applies, even to frames that arrived behind the Welcome.
    a = make(Role.INITIATOR, "a", nonce=NONCE_A)
    b = make(Role.RESPONDER, "b", nonce=NONCE_B)
    b.receive_data(a.initiate())
    drain(b)
    a.receive_data(b.data_to_send())
    drain(a)
    batch = big_batch(500)
    frame = a.send(batch)
    assert len(frame) > 4096
    b.receive_data(a.data_to_send() + frame)
    assert drain(b) == [Established(node_id="a", version=PROTOCOL_VERSION, codec="msgpack", compression="none"), batch]
