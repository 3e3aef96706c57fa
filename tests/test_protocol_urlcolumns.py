"""Version 2's URL columns: exact round trips in any order, and every malformed column is the peer's fault."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import TYPE_CODES, HandoffChunk, Limits, RemoteProtocolError, UrlBatch, UrlEntry, decode_body, encode_body

LIMITS = Limits(max_urls_per_batch=50, max_url_length=64, max_frame=64 * 1024)
BATCH = TYPE_CODES[UrlBatch]

# A small alphabet makes URLs share prefixes of every length; some non-ASCII to cover the general path.
urls = st.text(alphabet="hta:/.ex-é1", max_size=30).map(lambda tail: "http://" + tail)
entries = st.builds(
    UrlEntry,
    url=urls,
    depth=st.integers(0, 2**32 - 1),
    found_on=st.none() | urls,
    hops=st.integers(0, 2**32 - 1),
    lastmod=st.none() | st.floats(0, 4e9),
    sitemap=st.booleans(),
)
batches = st.builds(
    UrlBatch,
    seq=st.integers(0, 2**64 - 1),
    sender=st.text(max_size=10),
    epoch=st.integers(0, 2**64 - 1),
    urls=st.lists(entries, max_size=50).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(batch=batches, sort=st.booleans())
def test_round_trip_keeps_every_entry_in_order(batch: UrlBatch, sort: bool) -> None:
    if sort:
        batch = UrlBatch(seq=batch.seq, sender=batch.sender, epoch=batch.epoch,
                         urls=tuple(sorted(batch.urls, key=lambda e: e.url)))
    code, body = encode_body(batch, "msgpack", LIMITS, version=3)
    assert decode_body(code, body, "msgpack", LIMITS, version=3) == batch
    assert decode_body(*encode_body(batch, "msgpack", LIMITS, version=2), "msgpack", LIMITS, version=2) == batch


def _tree(urls: list) -> bytes:
    return msgpack.packb([1, "a", 1, urls], use_bin_type=True)


GOOD = [[0, 8], [8, 2], "http://a/b", [1, 2], [0, 0], [1, 1], [0], [9], "http://r/", [], []]


def test_the_hand_built_columns_decode() -> None:
    batch = decode_body(BATCH, _tree(GOOD), "msgpack", LIMITS, version=3)
    assert batch.urls == (
        UrlEntry(url="http://a", depth=1, found_on="http://r/", hops=0),
        UrlEntry(url="http://a/b", depth=2, found_on="http://r/", hops=0),
    )


def _with(index: int, value: object) -> list:
    columns = list(GOOD)
    columns[index] = value
    return columns


@pytest.mark.parametrize(
    ("columns", "fragment"),
    [
        (GOOD[:8], "array of 11 columns"),
        ({"x": 1}, "array of 11 columns"),
        (_with(0, [0, 9]), "prefix length 9 is not in 0..8"),
        (_with(0, [-1, 8]), "prefix length -1"),
        (_with(0, [0]), "columns differ in length"),
        (_with(1, [8, 9]), "suffix runs past the end"),
        (_with(2, "http://a/bxx"), "2 characters of text left over"),
        (_with(1, [8, 60]), "exceeds max_url_length=64"),
        (_with(2, b"http://a/b"), "expected two arrays and a string"),
        (_with(3, [1, 2 ** 32]), "urls[1].depth"),
        (_with(3, "12"), "column depth: expected an array"),
        (_with(5, [1, 2]), "not an index into the 1 referrers"),
        (_with(5, [1, True]), "not an index"),
        (_with(6, [0, 0, 0]), "referrer table longer"),
        (_with(7, [9, 1]), "1 prefix lengths for 2 suffix sizes"),
        ([[0] * 51, [0] * 51, "", [0] * 51, [0] * 51, [0] * 51, [], [], "", [], []], "exceeds max_urls_per_batch=50"),
        (_with(9, [1.0]), "lastmod and sitemap must each be empty or one per entry"),
        (_with(10, [True, "x"]), "urls[1]"),
    ],
)
def test_malformed_columns_are_remote_errors(columns: object, fragment: str) -> None:
    with pytest.raises(RemoteProtocolError, match="UrlBatch.urls") as info:
        decode_body(BATCH, _tree(columns), "msgpack", LIMITS, version=3)  # type: ignore[arg-type]
    assert fragment in str(info.value)


def test_a_version_2_list_is_refused_in_version_3_and_the_reverse() -> None:
    one = UrlBatch(seq=1, sender="a", epoch=1, urls=(UrlEntry(url="http://a/", depth=0, found_on=None, hops=0),))
    code, body = encode_body(one, "msgpack", LIMITS, version=2)
    with pytest.raises(RemoteProtocolError, match="array of 11 columns"):
        decode_body(code, body, "msgpack", LIMITS, version=3)
    code, body = encode_body(one, "msgpack", LIMITS, version=3)
    with pytest.raises(RemoteProtocolError, match="urls"):
        decode_body(code, body, "msgpack", LIMITS, version=2)


column_values = st.one_of(
    st.lists(st.integers(-2, 80), max_size=6),
    st.text(alphabet="ab/é", max_size=40),
    st.none(),
    st.integers(-1, 3),
    st.binary(max_size=8),
)


@settings(max_examples=500, deadline=None)
@given(columns=st.lists(column_values, min_size=10, max_size=12), code=st.sampled_from([BATCH, TYPE_CODES[HandoffChunk]]))
def test_arbitrary_columns_decode_or_raise_remote_errors(columns: list, code: int) -> None:
    if code == BATCH:
        body = _tree(columns)
    else:
        body = msgpack.packb([1, 0, 1, 0, 5, columns, [], [], True], use_bin_type=True)
    try:
        message = decode_body(code, body, "msgpack", LIMITS, version=3)
    except RemoteProtocolError:
        return
    assert all(len(entry.url.encode()) <= LIMITS.max_url_length for entry in message.urls)  # type: ignore[union-attr]


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=400))
def test_any_bytes_decode_or_raise_remote_errors(body: bytes) -> None:
    try:
        decode_body(BATCH, body, "msgpack", LIMITS, version=3)
    except RemoteProtocolError:
        pass


def test_sorting_a_batch_shrinks_its_columns() -> None:
    hosts = [f"https://www.host{i}.example.org" for i in range(20)]
    entries = tuple(
        UrlEntry(url=f"{hosts[i * 7 % 20]}/section/{i % 5}/article-{i}", depth=2, found_on=f"{hosts[i % 3]}/p{i // 4}",
                 hops=0)
        for i in range(200)
    )
    limits = Limits()
    plain = UrlBatch(seq=1, sender="a", epoch=1, urls=entries)
    ordered = UrlBatch(seq=1, sender="a", epoch=1, urls=tuple(sorted(entries, key=lambda e: e.url)))
    v1 = len(encode_body(plain, "msgpack", limits, version=2)[1])
    v2 = len(encode_body(plain, "msgpack", limits, version=3)[1])
    v2_sorted = len(encode_body(ordered, "msgpack", limits, version=3)[1])
    assert v2_sorted < v2 < v1
    assert v2_sorted * 2 < v1
