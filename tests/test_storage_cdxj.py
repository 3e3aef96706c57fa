"""CDXJ keys and lines: the fast paths (a remembered authority, JSON written directly) give exactly what the
general ones give (`urlsplit`, `json.dumps`)."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

import pytest

from storage._cdxj import CdxjEntry, cdxj_join, cdxj_line, cdxj_parts, parse_cdxj_line, surt

_WWW = re.compile(r"^www\d*\.")


def surt_reference(url: str) -> str:
    """The key as pywb's default canonicalization makes it, through urlsplit for every URL."""
    parts = urlsplit(url.strip())
    host = _WWW.sub("", (parts.hostname or "").lower().strip("."))
    key = ",".join(reversed(host.split("."))) if host else ""
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and port != {"http": 80, "https": 443}.get(parts.scheme.lower()):
        key += f":{port}"
    key += ")" + (parts.path or "/")
    if parts.query:
        key += "?" + "&".join(sorted(parts.query.split("&")))
    return key.lower()


URLS = [
    "http://www.Example.com/A?b=2&a=1",
    "https://example.com:443/",
    "http://example.com:8080",
    "http://example.com:80/x",
    "http://www2.sub.example.org/x",
    "http://h0001.web.test:57089/p/12.html",
    "http://a.test?q=1",
    "http://a.test#frag",
    "http://a.test/p?z=1&a=2#f?x=1",
    "http://a.test/p#f/g",
    "http://user:pw@a.test:81/x",
    "http://[::1]:8080/x?b&a",
    "http://A.TEST./%7Ex/%C3%A9",
    "https://www.a.test/?",
    "  http://a.test/x  ",
    "http://a.test/x y",
    "http://a.test/\u00e9t\u00e9",
    "http://\u00e9.test/",
    "http://a.test/x\ty",
    "HTTP://A.test/x",
    "ftp://a.test/x",
    "a.test/x",
    "",
    "http://a.test:abc/x",
]


@pytest.mark.parametrize("url", URLS)
def test_surt_is_the_general_key(url: str) -> None:
    assert surt(url) == surt_reference(url)


ENTRIES = [
    CdxjEntry(url="http://a.test/p/1.html", timestamp="20261125230000", filename="peercrawl-1-00001.warc.gz",
              offset=123, length=4567, status=200, mime="text/html", digest="ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
    CdxjEntry(url="http://a.test/\u00e9?b=2&a=1", timestamp="20261125230000", filename="f.warc.gz", offset=0,
              length=1, status=404, mime="text/plain", digest="D", truncated=True),
    CdxjEntry(url="http://a.test/q=\"x\"", timestamp="20261125230000", filename="f.warc.gz", offset=5,
              length=1, status=200, mime="unk", digest="D"),
    CdxjEntry(url="http://a.test/x", timestamp="20261125230000", filename="f\x01.warc.gz", offset=0,
              length=1, status=200, mime="text/html", digest="D", truncated=True),
    CdxjEntry(url="http://a.test/x", timestamp="20261125230000", filename="f.warc.gz", offset=9,
              length=1, status=200, mime="te\\xt", digest="D", truncated=False),
    CdxjEntry(url="http://a.test/back\\slash", timestamp="20261125230000", filename="f.warc.gz", offset=0,
              length=1, status=200, mime="unk", digest="D"),
    CdxjEntry(url="http://a.test/x", timestamp="20261125230000", filename="f\x01.warc.gz", offset=0,
              length=1, status=200, mime="te\u2028xt", digest="D", truncated=True),
]


@pytest.mark.parametrize("entry", ENTRIES)
def test_cdxj_line_is_json_dumps(entry: CdxjEntry) -> None:
    line = cdxj_line(entry)
    key, timestamp, blob = line.rstrip("\n").split(" ", 2)
    fields = {"url": entry.url, "mime": entry.mime, "status": str(entry.status), "digest": entry.digest,
              "length": str(entry.length), "offset": str(entry.offset), "filename": entry.filename}
    if entry.truncated:
        fields["truncated"] = "length"
    assert blob == json.dumps(fields, ensure_ascii=False)
    assert key == surt_reference(entry.url) and timestamp == entry.timestamp
    assert parse_cdxj_line(line) == entry


@pytest.mark.parametrize("entry", ENTRIES)
def test_cdxj_parts_joined_at_their_place_are_the_line(entry: CdxjEntry) -> None:
    """A page worker makes the line without its place; joined in the writer it is `cdxj_line`'s text, or
    None (the writer then calls `cdxj_line`) when a value needs a JSON escape."""
    parts = cdxj_parts(url=entry.url, timestamp=entry.timestamp, length=entry.length, status=entry.status,
                       mime=entry.mime, digest=entry.digest, truncated=entry.truncated)
    escapes = any(c in '"\\' or ord(c) < 0x20 for c in entry.url + entry.mime)
    assert (parts is None) == escapes
    if parts is None:
        return
    line = cdxj_join(parts, entry.offset, entry.filename)
    if any(c in '"\\' or ord(c) < 0x20 for c in entry.filename):
        assert line is None
    else:
        assert line == cdxj_line(entry)
        assert parse_cdxj_line(line) == entry
