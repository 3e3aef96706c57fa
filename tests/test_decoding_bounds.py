"""Content decoding is bounded at every stage, for every coding and every pair of codings.

The attack (issue: "stacked content encodings defeat the decompression limit"): `gzip, gzip, gzip` under 2 KB
took a node from 44 MB to 2.1 GB, because a capped stage left an unconsumed tail that an unbounded `flush()`
inflated whole. Here each decoder is fed real bombs and must never return more than the room it was given,
never hold more than a bounded amount, and still decode honest bodies exactly, however they are cut.
"""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.fetch.decoding import MAX_CODINGS, DecodeError, make_decoder
from tests.support.hostile import BOMB_SIZE, _brotli_bomb, _gzip_layers, _raw_deflate_bomb

ENCODERS = {
    "gzip": lambda data: gzip.compress(data, 6),
    "deflate": lambda data: zlib.compress(data, 6),  # zlib-wrapped, as RFC 9110 says
    "br": lambda data: brotli.compress(data, quality=5),
}
LIMIT = 10 << 20  # the crawler's default page limit


def encode(data: bytes, codings: list[str]) -> bytes:
    for coding in codings:  # listed in the order applied, as Content-Encoding lists them
        data = ENCODERS[coding](data)
    return data


def decode_all(header: str, body: bytes, cuts: list[int], room: int = 1 << 30) -> bytes:
    decoder = make_decoder(header)
    assert decoder is not None
    out = bytearray()
    start = 0
    for cut in [*cuts, len(body)]:
        piece = decoder.decompress(body[start : start + cut], room)
        assert len(piece) <= room
        out += piece
        start += cut
        if start >= len(body):
            break
    for _ in range(10_000):
        tail = decoder.flush(room)
        assert len(tail) <= room
        if not tail:
            break
        out += tail
    return bytes(out)


CODING_CHAINS = [[c] for c in ENCODERS] + [[a, b] for a in ENCODERS for b in ENCODERS]


@pytest.mark.parametrize("chain", CODING_CHAINS, ids=lambda chain: ",".join(chain))
@settings(max_examples=15, deadline=None)
@given(data=st.binary(max_size=20_000) | st.builds(lambda n, b: b * n, st.integers(0, 5000), st.binary(min_size=1, max_size=20)),
       cuts=st.lists(st.integers(1, 3000), max_size=20))
def test_honest_bodies_decode_exactly_however_they_are_cut(chain: list[str], data: bytes, cuts: list[int]) -> None:
    assert decode_all(", ".join(chain), encode(data, chain), cuts) == data


def test_more_than_two_codings_are_refused() -> None:
    assert MAX_CODINGS == 2
    with pytest.raises(DecodeError, match="3 stacked content-encodings .* at most 2"):
        make_decoder("gzip, gzip, gzip")
    with pytest.raises(DecodeError, match="unsupported content-encoding 'zstd'"):
        make_decoder("zstd, gzip")
    assert make_decoder("identity") is None and make_decoder("") is None
    assert make_decoder("gzip, identity, br") is not None  # identity is no coding


BOMBS = {
    "gzip": lambda: _gzip_layers(BOMB_SIZE, 1),
    "gzip, gzip": lambda: _gzip_layers(BOMB_SIZE, 2),
    "gzip, br": lambda: brotli.compress(_gzip_layers(BOMB_SIZE, 1)),
    "br": lambda: _brotli_bomb(BOMB_SIZE),
    "br, gzip": lambda: gzip.compress(_brotli_bomb(BOMB_SIZE)),
    "deflate": lambda: _raw_deflate_bomb(BOMB_SIZE),
    "deflate, gzip": lambda: gzip.compress(_raw_deflate_bomb(BOMB_SIZE)),
}


@pytest.mark.parametrize("header", list(BOMBS))
def test_a_bomb_yields_at_most_the_room_and_holds_a_bounded_amount(header: str) -> None:
    """The fetcher's loop: feed 64 KiB reads, ask for the room left plus one byte, stop past the limit."""
    body = BOMBS[header]()
    decoder = make_decoder(header)
    assert decoder is not None
    tracemalloc.start()
    try:
        size = 0
        for start in range(0, len(body), 65536):
            piece = decoder.decompress(body[start : start + 65536], LIMIT - size + 1)
            assert len(piece) <= LIMIT - size + 1
            size += len(piece)
            del piece
            if size > LIMIT:
                break
        else:
            tail = decoder.flush(LIMIT - size + 1)
            assert len(tail) <= LIMIT - size + 1
            size += len(tail)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size == LIMIT + 1, f"{header}: the bomb must fill the room and be cut, got {size}"
    # The output itself is up to LIMIT (held by the caller); everything the decoder holds on top stays small.
    assert peak < 2.5 * LIMIT, f"{header}: peak {peak / 2**20:.1f} MiB while decoding to {LIMIT / 2**20:.0f} MiB"


def test_flush_never_inflates_a_held_tail_whole() -> None:
    """The old defect: after a capped read, flush() inflated what was left without a bound."""
    body = _gzip_layers(BOMB_SIZE, 2)
    decoder = make_decoder("gzip, gzip")
    assert decoder is not None
    first = decoder.decompress(body, 1000)
    assert len(first) == 1000
    assert decoder.pending() > 0  # the rest is held, not decoded
    tail = decoder.flush(5000)
    assert len(tail) == 5000
    assert decoder.flush(0) == b""


def test_corrupt_bodies_raise_decode_error() -> None:
    for header in ("gzip", "br", "deflate", "gzip, br"):
        decoder = make_decoder(header)
        assert decoder is not None
        with pytest.raises(DecodeError):
            decoder.decompress(b"\x1f\x8b\x08\x00" + bytes(range(256)) * 4, 1 << 20)
            decoder.flush(1 << 20)
