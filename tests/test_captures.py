"""Captures found in a node's CDXJ indexes as pywb's CDX server finds them (exact, prefix, host, domain, a time
range, a limit), the binary search over closed indexes checked against reading every line, and the `/cdx`
query's parameters and output forms."""

from __future__ import annotations

import json
import random

import pytest

from peer.cli.format import format_captures
from peer.outputs import cdx_body, parse_cdx_query
from storage import CaptureSearch, WarcPageStore, find_captures, surt

HOSTS = ["a.example", "www.a.example", "sub.a.example", "ab.example", "a.example:8080", "b.test"]
PATHS = ["/", "/x", "/x/1", "/x/2?b=1&a=2", "/xy", "/y/z"]


def _urls(rng: random.Random, count: int) -> list[str]:
    return [f"http://{rng.choice(HOSTS)}{rng.choice(PATHS)}" for _ in range(count)]


@pytest.fixture
def warc(tmp_path):
    """Pages in several closed WARC files and one still open, fetched over a few years."""
    rng = random.Random(3)
    pages = WarcPageStore(tmp_path, max_file_bytes=37_000)
    stored = []
    for n, url in enumerate(_urls(rng, 120)):
        at = 1_600_000_000.0 + n * 3_000_000  # a capture every five weeks, 2020 to 2031
        pages.store(url=url, request_headers=[("host", "h")], status=200 if n % 7 else 404, reason="OK",
                    response_headers=[("content-type", "text/html")], body=rng.randbytes(800), ip="127.0.0.1",
                    fetched_at=at)
        stored.append(url)
    assert len(list(tmp_path.glob("*.cdxj"))) >= 2 and len(list(tmp_path.glob("*.cdxj.open"))) == 1
    return tmp_path, stored


def _every_line(directory) -> list[tuple[str, str, dict]]:
    out = []
    for path in sorted(directory.glob("*.cdxj*")):
        for line in path.read_text().splitlines():
            key, ts, blob = line.split(" ", 2)
            out.append((key, ts, json.loads(blob)))
    return sorted(out, key=lambda e: (e[0], e[1]))


@pytest.mark.parametrize("match", ["exact", "prefix", "host", "domain"])
def test_each_match_type_finds_what_reading_every_line_finds(warc, match):
    directory, stored = warc
    every = _every_line(directory)
    for url in sorted(set(stored)):
        key = surt(url)
        authority = key.split(")")[0]
        expected = [e for e in every if {
            "exact": e[0] == key,
            "prefix": e[0].startswith(key),
            "host": e[0].startswith(authority + ")"),
            "domain": e[0].startswith(authority) and e[0][len(authority)] in "),:",
        }[match]]
        found = find_captures(directory, CaptureSearch.of(url, match))
        assert [(c.urlkey, c.timestamp, c.fields) for c in found] == expected, (url, match)
        assert expected  # every stored URL is found by its own query


def test_wildcards_time_range_and_limit(warc):
    directory, _stored = warc
    every = _every_line(directory)
    domain = find_captures(directory, CaptureSearch.of("*.a.example"))
    assert {c.urlkey.split(")")[0] for c in domain} == {"example,a", "example,a,sub", "example,a:8080"}
    assert all(not c.urlkey.startswith("example,ab") for c in domain)  # a sibling host is not a subdomain
    prefix = find_captures(directory, CaptureSearch.of("http://a.example/x*"))
    assert prefix and all(c.urlkey.startswith("example,a)/x") for c in prefix)
    assert {c.urlkey for c in prefix} >= {"example,a)/xy", "example,a)/x/1"}
    # from and to pad down and up: the year 2025 whole
    in_2025 = find_captures(directory, CaptureSearch.of("*.a.example", since="2025", until="2025"))
    assert in_2025 and all(c.timestamp.startswith("2025") for c in in_2025)
    assert len(in_2025) == sum(1 for c in domain if c.timestamp.startswith("2025"))
    limited = find_captures(directory, CaptureSearch.of("b.test", "host", limit=3))
    assert [(c.urlkey, c.timestamp) for c in limited] == [(e[0], e[1]) for e in every if e[0].startswith("test,b)")][:3]
    assert find_captures(directory, CaptureSearch.of("http://nowhere.example/")) == []
    for bad, why in [(dict(url=""), "url is required"), (dict(url="x", match="regex"), "matchType"),
                     (dict(url="x", since="2026-01"), "from must be"), (dict(url="x", limit=0), "limit")]:
        with pytest.raises(ValueError, match=why):
            CaptureSearch.of(**bad)


def test_the_cdx_query_and_its_output_forms():
    look, output = parse_cdx_query("url=http%3A%2F%2Fa.example%2Fx%2A&matchType=exact&limit=5&from=2024&output=json")
    assert look == {"url": "http://a.example/x*", "match": "exact", "since": "2024", "until": "", "limit": 5}
    assert output == "json"
    assert parse_cdx_query("url=a.example")[1] == "cdxj"
    for query, why in [("url=a.example&output=xml", "output must be"), ("url=a.example&limit=x", "limit must be"),
                       ("url=a.example&limit=0", "limit must be"), ("matchType=host", "url is required"),
                       ("url=a.example&matchType=regex", "matchType")]:
        with pytest.raises(ValueError, match=why):
            parse_cdx_query(query)
    line = ('example,a)/x 20260101000000 {"url": "http://a.example/x", "mime": "text/html", "status": "200", '
            '"digest": "sha1:AB", "length": "900", "offset": "4200", "filename": "f.warc.gz", "node": "n1", '
            '"object": "crawls/n1/f.warc.gz"}')
    assert cdx_body([line], "cdxj") == (line + "\n").encode()
    as_json = json.loads(cdx_body([line], "json"))
    assert as_json["urlkey"] == "example,a)/x" and as_json["timestamp"] == "20260101000000"
    assert as_json["object"] == "crawls/n1/f.warc.gz" and as_json["offset"] == "4200"
    assert cdx_body([line], "text").decode().split() == [
        "example,a)/x", "20260101000000", "http://a.example/x", "text/html", "200", "sha1:AB", "900", "4200",
        "f.warc.gz", "n1", "crawls/n1/f.warc.gz"]
    shown = format_captures([as_json, {**as_json, "object": None, "timestamp": "20260102030405"}])
    assert shown.splitlines() == [
        "2026-01-01 00:00:00  200  sha1:AB  http://a.example/x  object crawls/n1/f.warc.gz @4200",
        "2026-01-02 03:04:05  200  sha1:AB  http://a.example/x  n1:f.warc.gz @4200"]
