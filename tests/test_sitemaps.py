"""Sitemaps: the streaming reader on its own, then real crawls of a loopback web that only a sitemap fully
describes, and real daemons reading hostile sitemaps (a gzip bomb, an index listing itself, a million URLs)
at a bounded cost in memory and bytes read."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from peer.config import load
from peer.crawl.sitemaps import MAX_SITEMAP_BYTES, SitemapReader, may_list, parse_lastmod
from peer.node import Node
from protocol import CODECS, Limits, UrlBatch, UrlEntry, decode_body, encode_body

from .support.crawl import child_env
from .support.sitemap_web import Route, serve_sitemap_web

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def urlset(*entries: tuple[str, str | None]) -> bytes:
    rows = "".join(
        f"<url><loc>{loc}</loc>{f'<lastmod>{mod}</lastmod>' if mod else ''}<priority>0.5</priority></url>"
        for loc, mod in entries
    )
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>{rows}</urlset>'.encode()


def index(*locs: str) -> bytes:
    rows = "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in locs)
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex {NS}>{rows}</sitemapindex>'.encode()


def read_all(data: bytes, piece: int = 7, **kw) -> tuple[list, SitemapReader]:
    reader = SitemapReader(**kw)
    out = []
    for i in range(0, len(data), piece):
        out += reader.feed(data[i : i + piece])
    out += reader.close()
    return out, reader


# --- the reader ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
def test_reader_reads_urlsets_in_any_pieces(compress: bool) -> None:
    doc = urlset(("http://a.test/x", "2024-05-01"), ("  http://a.test/y  ", None), ("http://a.test/z", "bad"))
    data = gzip.compress(doc) if compress else doc
    entries, reader = read_all(data, piece=3)
    assert [(e.loc, e.lastmod, e.is_sitemap) for e in entries] == [
        ("http://a.test/x", parse_lastmod("2024-05-01"), False),
        ("http://a.test/y", None, False),
        ("http://a.test/z", None, False),
    ]
    assert reader.kind == "urlset" and reader.stopped is None and reader.inflated == len(doc)


@pytest.mark.parametrize("split", [None, 3, 5, 40])
def test_a_sitemap_with_a_doctype_is_not_read(split: int | None) -> None:
    """An entity whose text opens an element made lxml's pull parser hand out elements libxml2 had freed (garbage
    tags, "Tried to unregister unknown proxy"): a DOCTYPE, which no sitemap needs, stops the reader before lxml
    sees it, in whatever pieces it comes."""
    body = (b"<?xml version='1.0'?>\n<!DOCTYPE u [<!ENTITY e \"<a:x xmlns:a='y'>\">]>"
            b"<urlset><url><loc>&e;</loc></url><url><loc>http://a.test/p</loc></url></urlset>")
    pieces = [body] if split is None else [body[i:i + split] for i in range(0, len(body), split)]
    for compress in (False, True):
        reader = SitemapReader()
        data = gzip.compress(body) if compress else None
        entries = reader.feed(data) if compress else [e for piece in pieces for e in reader.feed(piece)]
        entries += reader.close()
        assert entries == [] and reader.stopped == "doctype"
    plain = SitemapReader()  # a DOCTYPE-looking text after the root element is only text
    assert [e.loc for e in plain.feed(b"<urlset><url><loc>http://a.test/&lt;!DOCTYPE</loc></url></urlset>")
            + plain.close()] == ["http://a.test/<!DOCTYPE"] and plain.stopped is None


def test_reader_reads_an_index() -> None:
    entries, reader = read_all(index("http://a.test/s1.xml", "http://a.test/s2.xml.gz"))
    assert reader.kind == "sitemapindex"
    assert [(e.loc, e.is_sitemap) for e in entries] == [("http://a.test/s1.xml", True), ("http://a.test/s2.xml.gz", True)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024", 1704067200.0),
        ("2024-02", 1706745600.0),
        ("2024-02-01", 1706745600.0),
        ("2024-02-01T10:30+01:00", 1706779800.0),
        ("2024-02-01T09:30:00Z", 1706779800.0),
        ("2024-02-01T09:30:00.5Z", 1706779800.5),
        ("2024-13", None),
        ("yesterday", None),
        ("", None),
        ("1970-01-01T00:00:00Z", 0.0),
        ("0000", None),
        ("0000-05", None),
        ("1969", None),
        ("1969-12-31", None),
        ("1970-01-01T00:30:00+01:00", None),
        ("0001-01-01T00:00:00Z", None),
    ],
)
def test_lastmod(text: str, expected: float | None) -> None:
    assert parse_lastmod(text) == expected


@pytest.mark.parametrize("lastmod", ["0000", "1969-07-20", "0001-01-01T00:00:00Z"])
def test_a_lastmod_before_1970_reads_as_none_and_the_entry_can_travel_to_a_peer(lastmod: str) -> None:
    # Year 0 raised ValueError out of `feed`; a date before 1970 made a negative lastmod, which no peer message
    # may carry (a batch, hand-off chunk or replica holding it could not be sent).
    reader = SitemapReader()
    entries = reader.feed(urlset(("http://a.test/x", lastmod))) + reader.close()
    assert [(e.loc, e.lastmod) for e in entries] == [("http://a.test/x", None)]
    entry = UrlEntry(url=entries[0].loc, depth=1, found_on="http://a.test/sitemap.xml", hops=0,
                     lastmod=entries[0].lastmod)
    batch = UrlBatch(seq=1, sender="n1", epoch=1, urls=(entry,))
    for codec in CODECS:
        assert decode_body(*encode_body(batch, codec, Limits()), codec, Limits()) == batch


def test_reader_limits_and_refusals() -> None:
    many = urlset(*((f"http://a.test/{i}", None) for i in range(30)))
    entries, reader = read_all(many, piece=100, max_urls=10)
    assert len(entries) == 10 and reader.stopped == "too-many-urls"
    entries, reader = read_all(many, piece=100, max_bytes=400)
    assert reader.stopped == "too-large" and reader.inflated == 400 and len(entries) < 10
    assert read_all(b"<html><body>no</body></html>")[1].stopped == "not-a-sitemap"
    assert read_all(b"\x00\x01garbage")[1].stopped == "not-xml"
    assert read_all(b"\x1f\x8b\x08garbage-after-magic")[1].stopped == "not-xml"
    # entities are not expanded: a billion-laughs document yields nothing and stops
    laughs = b'<?xml version="1.0"?><!DOCTYPE u [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>' \
             b"<urlset><url><loc>&b;</loc></url></urlset>"
    entries, _ = read_all(laughs)
    assert all("aaaa" not in e.loc for e in entries)


@pytest.mark.slow
def test_reader_stops_a_gzip_bomb_at_the_size_limit() -> None:
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(f"<urlset {NS}>".encode())]
    block = (b"<x>" + b" " * 1017 + b"</x>") * 1024  # 1 MiB of elements that are not entries
    parts += [packer.compress(block) for _ in range(128)]  # 128 MiB inflated
    bomb = b"".join(parts) + packer.flush()
    assert len(bomb) < 2**20
    reader = SitemapReader()
    steps = 0
    for i in range(0, len(bomb), 65536):
        reader.feed(bomb[i : i + 65536])
        while reader.backlog:  # one inflate step per call
            reader.feed(b"")
            steps += 1
        if reader.done:
            break
    assert reader.stopped == "too-large" and reader.inflated == MAX_SITEMAP_BYTES and steps >= 40
    # a file of tiny elements is stopped by the element budget, long before its bytes run out
    tiny = f"<urlset {NS}>".encode() + b"<x/>" * 200_000
    entries, reader = read_all(tiny, piece=65536, max_elements=100_000)
    assert reader.stopped == "too-large" and reader.elements == 100_001 and entries == []


@pytest.mark.parametrize(
    ("sitemap", "url", "named_by", "ok"),
    [
        ("http://a.test/dir/sitemap.xml", "http://a.test/dir/page.html", None, True),
        ("http://a.test/dir/sitemap.xml", "http://a.test/dir/sub/page.html", None, True),
        ("http://a.test/dir/sitemap.xml", "http://a.test/other/page.html", None, False),
        ("http://a.test/dir/sitemap.xml", "https://a.test/dir/page.html", None, False),
        ("http://a.test/dir/sitemap.xml", "http://a.test:8080/dir/page.html", None, False),
        ("http://a.test/dir/sitemap.xml", "http://b.test/dir/page.html", None, False),
        ("http://a.test/sitemap.xml", "http://a.test/anything", None, True),
        ("http://a.test/dir/sitemap.xml", "http://a.test/other/page.html", "http://a.test/robots.txt", True),
        ("http://maps.test/a.xml", "http://b.test/x", "http://b.test/robots.txt", True),
        ("http://maps.test/a.xml", "http://c.test/x", "http://b.test/robots.txt", False),
    ],
)
def test_location_rule(sitemap: str, url: str, named_by: str | None, ok: bool) -> None:
    assert may_list(sitemap, url, named_by=named_by) is ok


# --- a real crawl -------------------------------------------------------------------------------------------

PAGE = b"<html><head><title>t</title></head><body>page</body></html>"


def _config(tmp_path: Path, seed: str, **overrides):
    flags = {
        "node_id": "sitemap-node", "data_dir": str(tmp_path / "node"), "control": "127.0.0.1:0",
        "listen": "127.0.0.1:0", "seeds": [seed], "allow_private": True, "delay": 0.02,
        "exit_when_done": True, "store": "none", "connect_timeout": 5.0, "read_timeout": 5.0,
        "total_timeout": 20.0,
    }
    flags.update(overrides)
    return load(env={}, flags=flags)


async def _crawl(site, tmp_path: Path, **overrides):
    """Serve `site(base)` and crawl it with one node to the end."""
    routes: dict[str, Route] = {}
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_sitemap_web, routes)
        routes.update(site(f"http://127.0.0.1:{web.port}"))
        node = Node(_config(tmp_path, web.url("/"), **overrides))
        with trio.fail_after(60):
            await node.run()
        nursery.cancel_scope.cancel()
    return web, node


def _site(b: str) -> dict[str, Route]:
    xml = "application/xml"
    return {
        "/": Route(body=b'<html><body><a href="/linked.html">l</a></body></html>'),
        "/linked.html": Route(body=PAGE),
        "/robots.txt": Route(body=f"User-agent: *\nDisallow: /private/\nSitemap: {b}/sitemap_index.xml\n".encode(),
                             content_type="text/plain"),
        "/sitemap_index.xml": Route(body=index(f"{b}/sitemap_index.xml", f"{b}/maps/a.xml", f"{b}/maps/b.xml.gz"),
                                    content_type=xml),
        "/maps/a.xml": Route(body=urlset((f"{b}/only/a1.html", "2024-05-01T10:00:00Z"), (f"{b}/only/a2.html", None),
                                         (f"{b}/private/p.html", None), (f"{b}/linked.html", None)),
                             content_type=xml),
        # gzip-compressed, listing a page outside its own directory: allowed, as robots.txt named the index
        "/maps/b.xml.gz": Route(body=gzip.compress(urlset((f"{b}/only/b1.html", None), (f"{b}/elsewhere/b2.html", "2023"))),
                                content_type="application/gzip"),
        "/only/a1.html": Route(body=PAGE),
        "/only/a2.html": Route(body=PAGE),
        "/only/b1.html": Route(body=PAGE),
        "/elsewhere/b2.html": Route(body=PAGE),
        "/private/p.html": Route(body=PAGE),
    }


async def test_pages_only_a_sitemap_lists_are_fetched(tmp_path: Path) -> None:
    web, node = await _crawl(_site, tmp_path)
    counts = {p: web.log.count(p) for p in set(web.log)}
    pages = {"/", "/linked.html", "/only/a1.html", "/only/a2.html", "/only/b1.html", "/elsewhere/b2.html"}
    maps = {"/sitemap_index.xml", "/maps/a.xml", "/maps/b.xml.gz"}
    # every page, linked or only listed, once; the sitemaps once each (the index lists itself); nothing else
    assert counts == {p: 1 for p in pages | maps | {"/robots.txt"}}
    st = node.final_status
    assert st["sitemap_fetches"] == 3 and st["sitemap_urls"] == 3 + 4 + 2
    assert st["skipped"].get("robots") == 1  # /private/p.html: listed, refused by robots.txt when its turn came


def _redirecting(b: str) -> dict[str, Route]:
    routes = _site(b)
    routes["/"] = Route(body=b'<html><body><a href="/linked.html">l</a><a href="/moved.html">m</a>'
                             b'<a href="/moved-away.html">m</a></body></html>')
    routes["/moved.html"] = Route(status=301, headers=(("location", f"{b}/target.html"),))
    routes["/moved-away.html"] = Route(status=301, headers=(("location", f"{b}/dropped-target.html"),))
    routes["/target.html"] = Route(body=PAGE)
    routes["/dropped-target.html"] = Route(body=PAGE)
    routes["/dropped-seed.html"] = Route(body=PAGE)
    return routes


async def test_url_filters_see_seeds_redirect_targets_and_sitemap_urls(tmp_path: Path) -> None:
    log = tmp_path / "contexts.jsonl"
    settings = json.dumps({"log": str(log), "drop": ["/dropped-seed.html", "/dropped-target.html", "/a2.html"]})
    routes: dict[str, Route] = {}
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_sitemap_web, routes)
        b = f"http://127.0.0.1:{web.port}"
        routes.update(_redirecting(b))
        cfg = _config(tmp_path, f"{b}/", plugins=(("tests.support.plugin_cases:Contexts", settings),))
        cfg = replace(cfg, seeds=(f"{b}/", f"{b}/dropped-seed.html"))
        node = Node(cfg)
        with trio.fail_after(60):
            await node.run()
        nursery.cancel_scope.cancel()
    calls = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    # seeds: no source, no link; a redirect's target: the URL that redirected, tag "redirect"; what a sitemap
    # lists: the sitemap, tag "sitemap"; a page's links: the page, tag "a"
    assert ("", f"{b}/", None) in calls and ("", f"{b}/dropped-seed.html", None) in calls
    assert (f"{b}/moved.html", f"{b}/target.html", "redirect") in calls
    assert (f"{b}/moved-away.html", f"{b}/dropped-target.html", "redirect") in calls
    assert (f"{b}/maps/a.xml", f"{b}/only/a2.html", "sitemap") in calls
    assert (f"{b}/sitemap_index.xml", f"{b}/maps/a.xml", "sitemap") in calls
    assert (f"{b}/", f"{b}/linked.html", "a") in calls
    fetched = set(web.log)
    assert {"/", "/linked.html", "/target.html", "/only/a1.html", "/only/b1.html"} <= fetched
    assert not fetched & {"/dropped-seed.html", "/dropped-target.html", "/only/a2.html"}
    assert node.final_status["skipped"]["plugin-url-filter"] == 3  # the seed, the redirect's target, a listed page
    assert node.final_status["plugins"]["chain"][0]["errors"] == 0


def _guessed(b: str) -> dict[str, Route]:
    xml = "application/xml"
    return {
        "/": Route(body=PAGE),
        "/sitemap.xml": Route(body=index(f"{b}/dir/child.xml"), content_type=xml),
        # reached from a guessed /sitemap.xml, not from robots.txt: it may list only what is under /dir/
        "/dir/child.xml": Route(body=urlset((f"{b}/dir/ok.html", None), (f"{b}/other/no.html", None)),
                                content_type=xml),
        "/dir/ok.html": Route(body=PAGE),
        "/other/no.html": Route(body=PAGE),
    }


@pytest.mark.parametrize("guess", [False, True])
async def test_sitemap_xml_behind_a_flag_and_the_location_rule(tmp_path: Path, guess: bool) -> None:
    web, node = await _crawl(_guessed, tmp_path, sitemap_xml=guess)
    if not guess:
        assert sorted(web.log) == ["/", "/robots.txt"]
        return
    assert sorted(web.log) == ["/", "/dir/child.xml", "/dir/ok.html", "/robots.txt", "/sitemap.xml"]
    assert node.final_status["skipped"].get("sitemap-location") == 1


@pytest.mark.slow
async def test_lastmod_is_kept_in_the_queued_record(tmp_path: Path) -> None:
    routes: dict[str, Route] = {}
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_sitemap_web, routes)
        routes.update(_site(f"http://127.0.0.1:{web.port}"))
        # Crawl-delay 2: robots.txt at 0 s, "/" at 2 s, the sitemap at 4 s, the pages it lists from 6 s on;
        # the queue is read as soon as the sitemap is in.
        routes["/robots.txt"].body = f"User-agent: *\nCrawl-delay: 2\nSitemap: {web.url('/maps/a.xml')}\n".encode()
        node = Node(_config(tmp_path, web.url("/"), exit_when_done=False))
        await nursery.start(node.run)
        with trio.fail_after(30):
            while node.stats.sitemap_fetches < 1 or node.crawler.frontier.in_flight():
                await trio.sleep(0.01)
        items, _ = node.crawler.frontier.export_arc(0, 0)
        nursery.cancel_scope.cancel()
    queued = {i.url: i for i in items}
    a1, a2 = queued[web.url("/only/a1.html")], queued[web.url("/only/a2.html")]
    assert a1.lastmod == parse_lastmod("2024-05-01T10:00:00Z") and a2.lastmod is None
    assert not a1.sitemap and a1.found_on == web.url("/maps/a.xml") and a1.depth == 1


# --- hostile sitemaps, read by a real daemon ----------------------------------------------------------------

MILLION = 1_000_000


def _bomb() -> bytes:
    """A gzip file of 0.7 MB that inflates to 256 MiB of well-formed XML (elements that are not entries)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [packer.compress(f'<?xml version="1.0"?><urlset {NS}>'.encode())]
    block = (b"<x>" + b" " * 1017 + b"</x>") * 1024
    parts += [packer.compress(block) for _ in range(256)]
    return b"".join(parts) + packer.flush()


def _hostile(b: str) -> dict[str, Route]:
    async def million() -> AsyncIterator[bytes]:
        yield f'<?xml version="1.0"?><urlset {NS}>'.encode()
        for start in range(0, MILLION, 1000):
            yield "".join(f"<url><loc>{b}/m/{i}.html</loc></url>" for i in range(start, start + 1000)).encode()
        yield b"</urlset>"

    return {
        "/": Route(body=PAGE),
        "/robots.txt": Route(body=(f"User-agent: *\nSitemap: {b}/bomb.xml.gz\nSitemap: {b}/self-index.xml\n"
                                   f"Sitemap: {b}/million.xml\n").encode(), content_type="text/plain"),
        "/bomb.xml.gz": Route(body=_bomb(), content_type="application/gzip"),
        "/self-index.xml": Route(body=index(f"{b}/self-index.xml", f"{b}/self-index.xml"), content_type="application/xml"),
        "/million.xml": Route(body=million, content_type="application/xml"),
    }


def _plain(b: str) -> dict[str, Route]:
    return {"/": Route(body=PAGE), "/robots.txt": Route(body=b"User-agent: *\nDisallow:\n", content_type="text/plain")}


async def _daemon(site, tmp_path: Path) -> tuple[object, int, dict]:
    """Run a real peerd over `site` to the end: (web, peak RSS in KiB, its final counters)."""
    routes: dict[str, Route] = {}
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_sitemap_web, routes)
        routes.update(site(f"http://127.0.0.1:{web.port}"))
        argv = [sys.executable, "-m", "peer", "start", "--node-id", "hostile", "--data-dir", str(tmp_path),
                "--control", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--delay", "0.02", "--seed", web.url("/"),
                "--allow-private", "--exit-when-done", "--store", "none", "--max-depth", "0",
                "--log-format", "json"]
        err = open(tmp_path.with_suffix(".log"), "wb")
        proc = subprocess.Popen(argv, env=child_env(), stdout=subprocess.DEVNULL, stderr=err)
        try:
            with trio.fail_after(120):
                _pid, status, _usage = await trio.to_thread.run_sync(os.wait4, proc.pid, 0)
        finally:
            if proc.returncode is None and proc.poll() is None:
                proc.kill()
                proc.wait()
            err.close()
        nursery.cancel_scope.cancel()
    assert os.waitstatus_to_exitcode(status) == 0, tmp_path.with_suffix(".log").read_text()[-3000:]
    final = {}
    for line in tmp_path.with_suffix(".log").read_text().splitlines():
        record = json.loads(line)
        if record.get("message") == "node stopped" or record.get("msg") == "node stopped":
            final = record
    # the node's own peak (VmHWM, in its stopped record): the rusage of a child started by vfork and exec also
    # counts this test process's memory at the spawn
    assert final.get("peak_rss", 0) > 0, final
    return web, final["peak_rss"] // 1024, final


@pytest.mark.slow
async def test_hostile_sitemaps_cost_bounded_memory_and_reads(tmp_path: Path) -> None:
    _web, plain_peak, _ = await _daemon(_plain, tmp_path / "plain")
    web, peak, final = await _daemon(_hostile, tmp_path / "hostile")
    # each sitemap was asked for once: the index that lists itself twice is not read again
    assert sorted(web.log) == ["/", "/bomb.xml.gz", "/million.xml", "/robots.txt", "/self-index.xml"]
    skipped = final["skipped"]
    assert skipped["sitemap-too-large"] == 1  # the bomb: stopped at 50 MB inflated, of 256 MiB
    assert skipped["sitemap-too-many-urls"] == 1  # the million: stopped at 50,000
    assert skipped["depth"] == 50_000  # ... all of which were screened (--max-depth 0 keeps them out)
    million_bytes = len(f"<url><loc>{web.url('/m/999999.html')}</loc></url>") * MILLION
    assert web.bytes_sent["/million.xml"] < million_bytes / 5  # the daemon hung up after its 50,000
    assert peak - plain_peak < 48 * 1024, (plain_peak, peak)  # KiB: neither file was ever held whole
