"""The fuzz invariant: whatever bytes a peer sends, we get events or RemoteProtocolError, in bounded memory."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    CODECS,
    COMPRESSIONS,
    HEADER_SIZE,
    NEED_DATA,
    SUPPORTED_VERSIONS,
    TYPE_CODES,
    ConnectionClosed,
    Goodbye,
    Limits,
    ProgressReport,
    Reject,
    RemoteProtocolError,
    Role,
    decode_body,
    encode_frame,
)
from tests.test_protocol_codec import APP_MESSAGES
from tests.test_protocol_connection import established, forged_initiator, make

LIMITS = Limits(max_frame=64 * 1024)


def feed_all(conn: object, chunks: list[bytes]) -> list[object]:
    """Feed chunks, draining after each; returns events. Only RemoteProtocolError may escape."""
    events: list[object] = []
    for chunk in [c for c in chunks if c] + [b""]:
        conn.receive_data(chunk)  # type: ignore[attr-defined]
        for _ in range(100_000):
            event = conn.next_event()  # type: ignore[attr-defined]
            if event is NEED_DATA or isinstance(event, ConnectionClosed):
                break
            events.append(event)
        assert len(conn._reader) <= LIMITS.max_frame + HEADER_SIZE + len(chunk)  # type: ignore[attr-defined]
    return events


def survives(conn: object, chunks: list[bytes]) -> None:
    try:
        feed_all(conn, chunks)
    except RemoteProtocolError:
        return


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=200), max_size=8))
def test_arbitrary_bytes_to_a_fresh_responder(chunks: list[bytes]) -> None:
    survives(make(Role.RESPONDER, "b", limits=LIMITS), chunks)


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=200), max_size=8))
def test_arbitrary_bytes_to_an_initiator_awaiting_its_challenge(chunks: list[bytes]) -> None:
    a = make(Role.INITIATOR, "a", limits=LIMITS)
    a.initiate()
    survives(a, chunks)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=150, deadline=None)
@given(chunks=st.lists(st.binary(min_size=1, max_size=300), max_size=6))
def test_arbitrary_bytes_to_an_established_connection(codec: str, compression: str, chunks: list[bytes]) -> None:
    _, b = established(codec, compression, limits=LIMITS)
    survives(b, chunks)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("compression", ["zlib", "br"])
@settings(max_examples=150, deadline=None)
@given(
    code=st.sampled_from(sorted(TYPE_CODES.values()) + [0x00, 0x05, 0xFF]),
    flags=st.sampled_from([0, 0, 0, 1, 2, 3]),
    body=st.binary(max_size=300),
)
def test_well_framed_random_bodies(codec: str, compression: str, code: int, flags: int, body: bytes) -> None:
    _, b = established(codec, compression, limits=LIMITS)
    survives(b, [encode_frame(code, flags, body)])


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("compression", ["zlib", "br"])
@settings(max_examples=200, deadline=None)
@given(
    messages=st.lists(APP_MESSAGES, min_size=1, max_size=4),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from("fid"), st.integers(0, 255)), max_size=4),
)
def test_mutated_valid_streams(
    codec: str, compression: str, messages: list[object], edits: list[tuple[int, str, int]]
) -> None:
    a, b = established(codec, compression, limits=LIMITS, compress_min=64)
    stream = bytearray(b"".join(a.send(m) for m in messages if not isinstance(m, Goodbye)))  # type: ignore
    for position, operation, value in edits:
        at = position % (len(stream) + 1)
        if operation == "f" and at < len(stream):
            stream[at] ^= value or 1
        elif operation == "i":
            stream.insert(at, value)
        elif operation == "d" and at < len(stream):
            del stream[at]
    survives(b, [bytes(stream)])


# Structured trees reach the validator with well-formed msgpack/JSON of the wrong shape.
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=40),
)
trees = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=10) | st.dictionaries(st.text(max_size=10), inner, max_size=10),
    max_leaves=40,
)


def to_json(tree: object) -> object:
    if isinstance(tree, bytes):
        return tree.hex()
    if isinstance(tree, list):
        return [to_json(x) for x in tree]
    if isinstance(tree, dict):
        return {k: to_json(v) for k, v in tree.items()}
    return tree


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(code=st.sampled_from(sorted(TYPE_CODES.values())), tree=trees)
def test_arbitrary_trees_decode_or_raise_remote_errors(code: int, tree: object) -> None:
    bodies = [("msgpack", msgpack.packb(tree, use_bin_type=True)), ("json", json.dumps(to_json(tree)).encode())]
    for version in SUPPORTED_VERSIONS:
        for codec, body in bodies:
            try:
                message = decode_body(code, body, codec, LIMITS, version)
            except RemoteProtocolError:
                continue
            assert TYPE_CODES[type(message)] == code


@pytest.mark.parametrize("digits", [309, 400, 4299])  # 4,300 digits: the most int() reads
def test_a_json_integer_too_large_for_a_float_is_the_peers_error(digits: int) -> None:
    # JSON integers have no size; one past 1.8e308 in a seconds field made float() raise OverflowError
    report = {"seq": 1, "ring": 1, "idle": True, "finished": False, "activity": 1, "pages": 1, "queued": 1,
              "urls_received": 1, "rate": 0}
    body = json.dumps(report).replace('"rate": 0', '"rate": 1' + "0" * digits).encode()
    for version in SUPPORTED_VERSIONS:
        with pytest.raises(RemoteProtocolError, match=r"ProgressReport\.rate: an integer of \d+ bits"):
            decode_body(TYPE_CODES[ProgressReport], body, "json", LIMITS, version)


def test_a_peer_streaming_an_oversized_frame_is_cut_off_at_the_header() -> None:
    _, b = established(limits=LIMITS)
    b.receive_data((LIMITS.max_frame + 1).to_bytes(4, "big") + b"\x10\x00" + b"x" * 1000)
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        b.next_event()
    sent = b.data_to_send()
    assert sent[4] == TYPE_CODES[Reject]


def test_a_slow_peer_never_makes_us_hold_more_than_one_frame() -> None:
    a, b = established(limits=LIMITS)
    hello_sized = forged_initiator(b"\x09" * 32)[0]
    assert len(hello_sized) < LIMITS.max_frame
    # A frame just under the limit, dribbled in 1 KiB pieces, then a second one: the buffer stays bounded.
    frame = encode_frame(TYPE_CODES[Goodbye], 0, b"\xa0" + b"\x00" * (LIMITS.max_frame - 3))
    peak = 0
    for start in range(0, len(frame), 1024):
        b.receive_data(frame[start : start + 1024])
        peak = max(peak, len(b._reader))
        try:
            if b.next_event() is not NEED_DATA:
                break
        except RemoteProtocolError:
            break
    assert peak <= LIMITS.max_frame + 4


@settings(max_examples=200, deadline=None)
@given(
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from("fid"), st.integers(0, 255)), min_size=1, max_size=3
    ),
)
def test_mutated_handshakes(edits: list[tuple[int, str, int]]) -> None:
    stream = bytearray(forged_initiator(b"\x05" * 32)[0])
    for position, operation, value in edits:
        at = position % (len(stream) + 1)
        if operation == "f" and at < len(stream):
            stream[at] ^= value or 1
        elif operation == "i":
            stream.insert(at, value)
        elif operation == "d" and at < len(stream):
            del stream[at]
    survives(make(Role.RESPONDER, "b", limits=LIMITS), [bytes(stream)])
