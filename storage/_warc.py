"""WARC/1.1 records built by hand from bytes templates, for the page store's hot path.

A general WARC library builds header objects, parses and re-serialises the HTTP head and streams the body
through its digesters; for a 15 KB page that cost about as much CPU as gzip itself. The records written here
are the same ones (warcio reads them and verifies their digests; the tests check it): a `response` and a
`request` record per page linked by `WARC-Concurrent-To`, a `warcinfo` record at the start of each file,
SHA-1 block and payload digests in base32 as `sha1:<32 chars>`, and an exact `Content-Length`. Each record
is compressed as its own gzip member so that any record can be read from its offset alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import zlib
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import urlsplit

from isal import isal_zlib

__all__ = ["Exchange", "REVISIT_PROFILES", "conversion_record", "exchange_records", "gzip_member", "payload_digest", "revisit_records",
           "warc_date", "warcinfo_record"]

#: WARC 1.1 revisit profiles (section 6.7): the server said "not modified", or the payload was the same.
REVISIT_PROFILES = {
    "server-not-modified": b"http://netpreserve.org/warc/1.1/revisit/server-not-modified",
    "identical-payload-digest": b"http://netpreserve.org/warc/1.1/revisit/identical-payload-digest",
}

_END = b"\r\n\r\n"  # two newlines close every record
# base32 of a 20-byte SHA-1 is 32 characters: four 40-bit groups of four 10-bit pairs each; a table of pairs
# over small integers is faster than base64's (and than shifting one 160-bit integer)
_B32 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"  # RFC 4648 base32
_B32_PAIRS = [bytes((a, b)) for a in _B32 for b in _B32]
_TARGET = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*([^#]*)")


def warc_date(epoch: float) -> str:
    """`WARC-Date` of epoch seconds, UTC with microseconds (WARC/1.1), e.g. `2023-11-14T22:13:20.500000Z`."""
    micros = round(epoch * 1_000_000)
    seconds, micros = divmod(micros, 1_000_000)
    return _second(seconds) + f".{micros:06d}Z"


@lru_cache(maxsize=4)
def _second(seconds: int) -> str:
    """The date and time to the second: the same for every record written within it, so formatted once."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def _sha1(*parts: bytes) -> bytes:
    """`sha1:<base32>` of the parts, as warcio writes WARC-Block-Digest and WARC-Payload-Digest."""
    digest = hashlib.sha1()
    for part in parts:
        digest.update(part)
    d = digest.digest()
    a, b, c, e = (int.from_bytes(d[0:5], "big"), int.from_bytes(d[5:10], "big"), int.from_bytes(d[10:15], "big"),
                  int.from_bytes(d[15:20], "big"))
    p = _B32_PAIRS
    return b"".join((b"sha1:",
                     p[a >> 30], p[(a >> 20) & 1023], p[(a >> 10) & 1023], p[a & 1023],
                     p[b >> 30], p[(b >> 20) & 1023], p[(b >> 10) & 1023], p[b & 1023],
                     p[c >> 30], p[(c >> 20) & 1023], p[(c >> 10) & 1023], p[c & 1023],
                     p[e >> 30], p[(e >> 20) & 1023], p[(e >> 10) & 1023], p[e & 1023]))


_EMPTY_SHA1 = _sha1()


def _record_id() -> bytes:
    """`<urn:uuid:...>` of a random (version 4) UUID."""
    h = os.urandom(16).hex()
    return f"<urn:uuid:{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}>".encode()


def _request_target(url: str) -> str:
    """The request line's target: path and query of an absolute URL (`/` when the path is empty)."""
    match = _TARGET.match(url)
    if match is None:
        parts = urlsplit(url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    target = match.group(1)
    return target if target.startswith("/") else "/" + target


def _one_line(text: str, what: str) -> str:
    if "\r" in text or "\n" in text:
        raise ValueError(f"{what} contains a line break and cannot go into a WARC record: {text[:100]!r}")
    return text


def _http_head(first_line: str, headers: list[tuple[str, str]], what: str) -> bytes:
    """The HTTP head as it went over the wire: header text is latin-1 (as decoded from the wire)."""
    lines = [first_line]
    lines += [f"{name}: {value}" for name, value in headers]
    text = "\r\n".join(lines)
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        _one_line(first_line, f"{what} line")
        for name, value in headers:
            _one_line(f"{name}: {value}", f"{what} header")
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError:
        raw = text.encode("utf-8")
    return raw + _END


def _warc_head(fields: list[tuple[bytes, bytes]], content_length: int) -> bytes:
    lines = [b"WARC/1.1"]
    lines += [name + b": " + value for name, value in fields]
    lines.append(b"Content-Length: " + str(content_length).encode("ascii"))
    return b"\r\n".join(lines) + _END


_RESPONSE_HEAD = (b"WARC/1.1\r\nWARC-Type: response\r\nWARC-Record-ID: %b\r\nWARC-Date: %b\r\n"
                  b"WARC-Payload-Digest: %b\r\nWARC-Block-Digest: %b\r\n%b"
                  b"Content-Type: application/http; msgtype=response\r\nContent-Length: %d\r\n\r\n")
_TRUNCATED = b"WARC-Truncated: length\r\n"
_REQUEST_HEAD = (b"WARC/1.1\r\nWARC-Type: request\r\nWARC-Record-ID: %b\r\nWARC-Date: %b\r\n"
                 b"WARC-Concurrent-To: %b\r\nWARC-Payload-Digest: " + _EMPTY_SHA1 + b"\r\nWARC-Block-Digest: %b\r\n"
                 b"Content-Type: application/http; msgtype=request\r\nContent-Length: %d\r\n\r\n")


class Exchange(NamedTuple):
    """One page's records, uncompressed: the response as parts (its body is not copied), the request whole."""

    response: tuple[bytes, ...]
    request: bytes
    payload_digest: str  # base32 SHA-1 of the body, without the `sha1:` prefix (the CDXJ `digest`)
    record_id: str = ""  # the response (or revisit) record's `WARC-Record-ID`


def exchange_records(*, url: str, request_headers: list[tuple[str, str]], status: int, reason: str,
                     response_headers: list[tuple[str, str]], body: bytes, ip: str | None,
                     fetched_at: float, truncated: bool = False, protocol: str = "http/1.1",
                     digest: str | None = None) -> Exchange:
    """The response and request records of one fetch. A `Transfer-Encoding` header is left out: the body is
    stored de-chunked, and the header would make readers chunk-decode it again. A body cut at the size limit
    (`truncated`) is marked `WARC-Truncated: length` (WARC/1.1 section 5.13), so no reader takes it for the
    whole page. An exchange over another protocol than HTTP/1.1 (`protocol`, its ALPN name: ``h2``) is written
    in the HTTP/1.1 form readers expect, and named in `WARC-Protocol`. `digest`: the body's `payload_digest`
    when the caller has it already (one SHA-1 of the body less); None: computed here."""
    target_uri = _one_line(url, "URL").encode("utf-8")
    date = warc_date(fetched_at).encode("ascii")
    headers = [(k, v) for k, v in response_headers if k.lower() != "transfer-encoding"]
    http = _http_head(f"HTTP/1.1 {status} {reason}".rstrip(), headers, "response")
    payload_digest = _sha1(body) if digest is None else b"sha1:" + digest.encode("ascii")
    response_id = _record_id()
    # The fields in the order `_warc_head` writes them for revisits and warcinfo, formatted in one step: a
    # page's two heads are the same bytes a field list would give, at a third of the cost.
    common = date + b"\r\nWARC-Target-URI: " + target_uri
    if ip:
        common += b"\r\nWARC-IP-Address: " + _one_line(ip, "IP address").encode("ascii")
    if protocol != "http/1.1":
        common += b"\r\nWARC-Protocol: " + _one_line(protocol, "protocol").encode("ascii")
    response_head = _RESPONSE_HEAD % (response_id, common, payload_digest, _sha1(http, body),
                                      _TRUNCATED if truncated else b"", len(http) + len(body))
    request_http = _http_head(f"GET {_request_target(url)} HTTP/1.1", request_headers, "request")
    request_head = _REQUEST_HEAD % (_record_id(), common, response_id, _sha1(request_http), len(request_http))
    return Exchange(
        response=(response_head, http, body, _END),
        request=request_head + request_http + _END,
        payload_digest=payload_digest[5:].decode("ascii"),
        record_id=response_id.decode("ascii"),
    )


def revisit_records(*, url: str, request_headers: list[tuple[str, str]], status: int, reason: str,
                    response_headers: list[tuple[str, str]], ip: str | None, fetched_at: float, profile: str,
                    payload_digest: str, refers_to_uri: str, refers_to_date: float,
                    protocol: str = "http/1.1", refers_to: str = "") -> Exchange:
    """A `revisit` record (its block is the HTTP response head only) and its request record. `payload_digest`
    is the base32 SHA-1 of the payload the record stands for (the original's); `refers_to_*` name the original
    response record, as pywb-style replay looks it up, and `refers_to` its `WARC-Record-ID` when known."""
    if profile not in REVISIT_PROFILES:
        raise ValueError(f"unknown revisit profile {profile!r}; known: {sorted(REVISIT_PROFILES)}")
    target_uri = _one_line(url, "URL").encode("utf-8")
    date = warc_date(fetched_at).encode("ascii")
    common = [(b"WARC-Date", date), (b"WARC-Target-URI", target_uri)]
    if ip:
        common.append((b"WARC-IP-Address", _one_line(ip, "IP address").encode("ascii")))
    if protocol != "http/1.1":
        common.append((b"WARC-Protocol", _one_line(protocol, "protocol").encode("ascii")))
    headers = [(k, v) for k, v in response_headers if k.lower() != "transfer-encoding"]
    http = _http_head(f"HTTP/1.1 {status} {reason}".rstrip(), headers, "response")
    record_id = _record_id()
    fields = [(b"WARC-Type", b"revisit"), (b"WARC-Record-ID", record_id), *common,
              (b"WARC-Profile", REVISIT_PROFILES[profile]),
              *([(b"WARC-Refers-To", _one_line(refers_to, "record id").encode("ascii"))] if refers_to else []),
              (b"WARC-Refers-To-Target-URI", _one_line(refers_to_uri, "URL").encode("utf-8")),
              (b"WARC-Refers-To-Date", warc_date(refers_to_date).encode("ascii"))]
    if payload_digest:
        fields.append((b"WARC-Payload-Digest", b"sha1:" + payload_digest.encode("ascii")))
    fields += [(b"WARC-Block-Digest", _sha1(http)), (b"Content-Type", b"application/http; msgtype=response")]
    head = _warc_head(fields, len(http))
    request_http = _http_head(f"GET {_request_target(url)} HTTP/1.1", request_headers, "request")
    request_head = _warc_head(
        [(b"WARC-Type", b"request"), (b"WARC-Record-ID", _record_id()), *common,
         (b"WARC-Concurrent-To", record_id), (b"WARC-Payload-Digest", _EMPTY_SHA1),
         (b"WARC-Block-Digest", _sha1(request_http)), (b"Content-Type", b"application/http; msgtype=request")],
        len(request_http),
    )
    return Exchange(response=(head, http, _END), request=request_head + request_http + _END,
                    payload_digest=payload_digest, record_id=record_id.decode("ascii"))


def conversion_record(*, url: str, fetched_at: float, body: bytes, content_type: str, refers_to_date: float,
                      software: str = "") -> bytes:
    """A `conversion` record (WARC/1.1 section 6.8): `body` made from the response record of `url` fetched at
    `refers_to_date` (a browser's DOM of the page after its scripts ran), which it names by
    `WARC-Refers-To-Target-URI` and `WARC-Refers-To-Date`, as a revisit record names its original."""
    fields = [(b"WARC-Type", b"conversion"), (b"WARC-Record-ID", _record_id()),
              (b"WARC-Date", warc_date(fetched_at).encode("ascii")),
              (b"WARC-Target-URI", _one_line(url, "URL").encode("utf-8")),
              (b"WARC-Refers-To-Target-URI", _one_line(url, "URL").encode("utf-8")),
              (b"WARC-Refers-To-Date", warc_date(refers_to_date).encode("ascii")),
              (b"WARC-Payload-Digest", _sha1(body)), (b"WARC-Block-Digest", _sha1(body)),
              (b"Content-Type", _one_line(content_type, "content type").encode("ascii"))]
    if software:
        fields.append((b"WARC-Software", _one_line(software, "software").encode("ascii", "replace")))
    return _warc_head(fields, len(body)) + body + _END


def payload_digest(body: bytes) -> str:
    """The base32 SHA-1 of a payload, as `WARC-Payload-Digest` and the CDXJ `digest` write it."""
    return _sha1(body)[5:].decode("ascii")


def warcinfo_record(filename: str, created_at: float, fields: dict[str, str]) -> bytes:
    """The `warcinfo` record that opens a WARC file; `fields` become its `name: value` lines."""
    block = "".join(f"{_one_line(k, 'warcinfo field')}: {_one_line(v, 'warcinfo field')}\r\n"
                    for k, v in fields.items()).encode("utf-8")
    head = _warc_head(
        [(b"WARC-Type", b"warcinfo"), (b"WARC-Record-ID", _record_id()),
         (b"WARC-Filename", _one_line(filename, "file name").encode("utf-8")),
         (b"WARC-Date", warc_date(created_at).encode("ascii")), (b"WARC-Block-Digest", _sha1(block)),
         (b"Content-Type", b"application/warc-fields")],
        len(block),
    )
    return head + block + _END


#: Levels ISA-L handles (0-3). ISA-L's deflate writes standard gzip members about 5x faster than zlib at
#: level 1 (33 vs 164 us for a 15 KB page here) and smaller ones; zlib serves the higher levels.
_ISAL_LEVELS = range(0, 4)


def gzip_member(parts: tuple[bytes, ...] | list[bytes], level: int) -> bytes:
    """`parts` joined and compressed as one complete gzip member.

    One call on the joined bytes: ISA-L's one-shot `compress` costs about 0.7x a compress object fed the same
    parts (the copy of the join is a few µs of a page's ~100; tests/bench/bench_realpages.py)."""
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if level in _ISAL_LEVELS:
        return isal_zlib.compress(data, level, isal_zlib.MAX_WBITS + 16)
    return zlib.compress(data, level, zlib.MAX_WBITS + 16)
