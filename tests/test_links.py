"""Link extraction and page decoding."""

from __future__ import annotations

import html as html_module
import http.server
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lxml import etree

from peerlab.localweb.graph import SiteGraph, page_path
from peerlab.localweb.render import render
from peer.crawl.charset import charset_of_content_type, decode_to_utf8, lookup
from peer.crawl.links import MAX_TITLE_CHARS, Page, extract, is_html
from peer.crawl.urls import normalize, normalize_all

URL = "http://site.example/dir/page.html"
HTML = "text/html"


def html(body: str, head: str = "") -> bytes:
    return f"<!DOCTYPE html><html><head>{head}</head><body>{body}</body></html>".encode()


def test_links_are_absolute_normalized_unique_and_in_order() -> None:
    page = extract(
        html(
            '<a href="b.html">b</a><a href="/a">a</a><a href="b.html#x">again</a>'
            '<a href="HTTP://Other.Example:80/x/../y">o</a><a href="mailto:x@y">m</a>'
            '<a href="javascript:void(0)">j</a><a>no href</a><area href="/map" />'
            '<a href=" /spaced ">s</a><a href="/a">dup</a>'
        ),
        URL,
        HTML,
    )
    assert page.links == (
        "http://site.example/dir/b.html",
        "http://site.example/a",
        "http://other.example/y",
        "http://site.example/map",
        "http://site.example/spaced",
    )
    assert page.base == URL
    assert page.charset == "utf-8"
    assert not page.noindex and not page.nofollow


def test_base_href_applies_to_all_links_and_canonical() -> None:
    page = extract(
        html('<a href="x">x</a><a href="../y">y</a>', '<base href="/other/sub/"><link rel="canonical" href="c">'),
        URL,
        HTML,
    )
    assert page.base == "http://site.example/other/sub/"
    assert page.links == ("http://site.example/other/sub/x", "http://site.example/other/y")
    assert page.canonical == "http://site.example/other/sub/c"


def test_only_the_first_base_counts_and_a_bad_base_is_ignored() -> None:
    page = extract(html('<a href="x">x</a>', '<base href="/one/"><base href="/two/">'), URL, HTML)
    assert page.links == ("http://site.example/one/x",)
    page = extract(html('<a href="x">x</a>', '<base href="javascript:alert(1)">'), URL, HTML)
    assert page.base == URL and page.links == ("http://site.example/dir/x",)
    page = extract(html('<a href="x">x</a>', "<base target=_blank>"), URL, HTML)
    assert page.base == URL


def test_rel_nofollow_links_are_skipped() -> None:
    page = extract(
        html(
            '<a href="/a" rel="nofollow">a</a><a href="/b" rel="external NoFollow">b</a>'
            '<a href="/c" rel="next">c</a>'
        ),
        URL,
        HTML,
    )
    assert page.links == ("http://site.example/c",)
    assert not page.nofollow


@pytest.mark.parametrize(
    ("content", "noindex", "nofollow"),
    [
        ("noindex", True, False),
        ("nofollow", False, True),
        ("NOINDEX, NOFOLLOW", True, True),
        ("none", True, True),
        ("index,follow", False, False),
        ("noarchive", False, False),
    ],
)
def test_meta_robots(content: str, noindex: bool, nofollow: bool) -> None:
    page = extract(html('<a href="/a">a</a>', f'<meta name="Robots" content="{content}">'), URL, HTML)
    assert page.noindex is noindex
    assert page.nofollow is nofollow
    assert page.links == (() if nofollow else ("http://site.example/a",))


def test_meta_for_other_names_is_ignored() -> None:
    page = extract(html('<a href="/a">a</a>', '<meta name="description" content="nofollow noindex">'), URL, HTML)
    assert not page.nofollow and not page.noindex and page.links


def test_canonical_first_one_wins_and_title_is_collapsed() -> None:
    head = (
        '<link rel="stylesheet" href="/s.css"><link rel="Canonical" href="https://site.example/canon#x">'
        '<link rel="canonical" href="/second"><title>\n  Hello   <b>world</b>\n</title><title>Second</title>'
    )
    page = extract(html("", head), URL, HTML)
    assert page.canonical == "https://site.example/canon"
    assert page.title == "Hello <b>world</b>"
    assert extract(html("", "<title>   </title>"), URL, HTML).title is None
    assert extract(html("", ""), URL, HTML).title is None
    long = extract(html("", "<title>" + "t" * 5000 + "</title>"), URL, HTML)
    assert long.title == "t" * MAX_TITLE_CHARS


def test_links_inside_comments_and_scripts_are_not_links() -> None:
    page = extract(
        html(
            '<!-- <a href="/commented">c</a> -->'
            '<script>var s = \'<a href="/scripted">\';</script><a href="/real">r</a>'
        ),
        URL,
        HTML,
    )
    assert page.links == ("http://site.example/real",)


def test_template_contents_and_raw_text_are_not_links() -> None:
    """As in a browser's DOM: a template's contents are not in the document, textarea/xmp/iframe hold text."""
    page = extract(
        html('<template><a href="/t">t</a></template><textarea><a href="/x"></textarea><xmp><a href="/y"></xmp>'
             '<iframe><a href="/z"></iframe><a href="/first" href="/second">a</a><a href>self</a>'),
        URL,
        HTML,
    )
    assert page.links == ("http://site.example/first", URL)


def test_charset_from_header_wins_over_meta() -> None:
    body = '<html><head><meta charset="utf-8"><title>café</title></head><body><a href="/é">x</a></body></html>'
    page = extract(body.encode("cp1252"), URL, "text/html; charset=ISO-8859-1")
    assert page.charset == "cp1252"
    assert page.title == "café"
    assert page.links == ("http://site.example/%C3%A9",)


def test_charset_from_meta_http_equiv_and_meta_charset() -> None:
    body = '<html><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1251"><title>Привет</title>'
    page = extract(body.encode("cp1251"), URL, "text/html")
    assert page.charset == "cp1251" and page.title == "Привет"
    body = "<html><head><meta charset='koi8-r'><title>Привет</title>"
    page = extract(body.encode("koi8-r"), URL, None)
    assert page.charset == "koi8-r" and page.title == "Привет"


def test_gb2312_is_read_as_gbk() -> None:
    title = "朱镕基 新闻"  # 镕 is in GBK but not in GB2312
    body = f'<html><head><meta charset="gb2312"><title>{title}</title></head><body></body></html>'.encode("gbk")
    page = extract(body, URL, "text/html")
    assert page.charset == "gbk"
    assert page.title == title
    assert extract(body, URL, "text/html; charset=GB2312").title == title


def test_shift_jis_is_detected_when_undeclared() -> None:
    text = "日本語のウェブページです。東京の天気は晴れ、明日は雨が降るでしょう。" * 8
    body = f"<html><head><title>東京の天気</title></head><body><p>{text}</p></body></html>".encode("shift_jis")
    page = extract(body, URL, "text/html")
    assert page.charset in ("cp932", "shift_jis", "shift_jis_2004", "shift_jisx0213")
    assert page.title == "東京の天気"


def test_undeclared_utf8_skips_detection_and_bom_wins() -> None:
    body = "<title>naïve</title>".encode()
    assert decode_to_utf8(body, None) == (body, "utf-8")
    page = extract(b"\xef\xbb\xbf<title>x\xc3\xa9</title>", URL, "text/html; charset=cp1252")
    assert page.charset == "utf-8" and page.title == "xé"
    page = extract("\ufeff<title>wide</title>".encode("utf-16-le"), URL, "text/html")
    assert page.charset == "utf-16-le" and page.title == "wide"


def test_broken_bytes_are_replaced() -> None:
    body = b'<html><head><meta charset="utf-8"><title>ok\xff\xfe end</title></head><body><a href="/a\xffb">x</a>'
    page = extract(body, URL, "text/html")
    assert page.charset == "utf-8"
    assert page.title == "ok\ufffd\ufffd end"
    assert page.links == ("http://site.example/a%EF%BF%BDb",)


def test_unknown_and_dangerous_charsets_are_ignored() -> None:
    assert lookup("utf-7") is None
    assert lookup("base64") is None
    assert lookup("no-such-charset") is None
    assert lookup("GB_2312-80") == "gbk"
    assert lookup("x-sjis") == "cp932"
    assert lookup("US-ASCII") == "cp1252"
    assert charset_of_content_type('text/html; charset="utf-8"') == "utf-8"
    assert charset_of_content_type("text/html") is None
    page = extract("<title>é</title>".encode(), URL, "text/html; charset=utf-7")
    assert page.charset == "utf-8" and page.title == "é"


def test_is_html() -> None:
    assert is_html("text/html")
    assert is_html("TEXT/HTML; charset=utf-8")
    assert is_html("application/xhtml+xml")
    assert not is_html("text/plain")
    assert not is_html("image/png")
    assert not is_html(None)
    assert not is_html("")


def test_non_html_is_not_parsed_and_missing_type_is() -> None:
    body = html('<a href="/a">a</a>')
    page = extract(body, URL, "application/pdf")
    assert page == Page(links=(), canonical=None, noindex=False, nofollow=False, charset="", title=None, base=URL)
    assert extract(body, URL, None).links == ("http://site.example/a",)


def test_empty_and_binary_bodies_do_not_raise() -> None:
    for body in (b"", b"   ", b"\x00" * 100, bytes(range(256)) * 40, b"<" * 10000, b"<a href=" * 1000):
        page = extract(body, URL, "text/html")
        assert page.base == URL
        assert all(link.startswith("http") for link in page.links)
    rng = random.Random(7)
    for _ in range(20):
        blob = rng.randbytes(rng.randrange(1, 5000))
        assert isinstance(extract(blob, URL, None), Page)


def test_a_link_with_a_port_of_thousands_of_digits_is_dropped() -> None:
    body = b'<a href="http://e.com:' + b"1" * 4301 + b'/">x</a><a href="/ok">ok</a>'
    assert extract(body, "http://b.com/", "text/html").links == ("http://b.com/ok",)


def test_bad_page_url_is_the_callers_error() -> None:
    with pytest.raises(ValueError, match="not crawlable"):
        extract(b"<a href='/x'>", "ftp://site.example/", "text/html")


@settings(max_examples=100, deadline=None)
@given(
    st.binary(max_size=2000),
    st.sampled_from([None, "text/html", "text/html; charset=shift_jis", "text/html; charset=bogus"]),
)
def test_extract_never_raises(body: bytes, content_type: str | None) -> None:
    page = extract(body, URL, content_type)
    assert len(set(page.links)) == len(page.links)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30), max_size=10))
def test_extracted_links_are_normal(hrefs: list[str]) -> None:
    anchors = "".join(f'<a href="{html_module.escape(h)}">x</a>' for h in hrefs)
    page = extract(html(anchors), URL, HTML)
    for link in page.links:
        assert normalize(link) == link


def test_links_per_page_are_capped() -> None:
    anchors = "".join(f'<a href="/p{i}">x</a>' for i in range(50))
    page = extract(html(anchors), URL, HTML, max_links=10)
    assert page.links == tuple(f"http://site.example/p{i}" for i in range(10))


@pytest.mark.parametrize(
    ("codec", "text"),
    [
        ("latin-1", "Crème brûlée, pâté, façade, déjà vu, à la française : élève très âgé."),
        ("cp1250", "Zażółć gęślą jaźń. Pogoda w Krakowie jest ładna, jutro będzie padać deszcz."),
        ("cp1251", "Привет, это страница на русском языке. Погода в Москве хорошая."),
        ("gbk", "这是一个中文页面。今天天气很好，明天会下雨。"),
    ],
)
def test_undeclared_single_and_multi_byte_pages_are_detected(codec: str, text: str) -> None:
    body = f"<html><head><title>{text}</title></head><body><p>{text}</p></body></html>".encode(codec)
    page = extract(body, URL, "text/html")
    assert page.title == text


# -- the links found are lxml's, each normalized on its own


def _reference_links(body: bytes, url: str, charset: str) -> list[str]:
    """lxml's own reading of the page (a fresh parser, XPath), each href normalized by itself."""
    root = etree.fromstring(body.decode(charset).encode("utf-8"), etree.HTMLParser(encoding="utf-8"))
    hrefs = root.xpath("//a[not(contains(concat(' ', normalize-space(@rel), ' '), ' nofollow '))]/@href | //area/@href")
    out = [normalize(str(h), url) for h in hrefs]
    return list(dict.fromkeys(u for u in out if u is not None))


@pytest.mark.parametrize("shape", [pytest.param("bench", marks=pytest.mark.slow), "features"])  # bench: 3 s of CPU
def test_links_of_the_local_webs_pages_are_lxmls_each_normalized_alone(shape) -> None:
    """Every page of a web shaped like the crawl benchmark's (log-normal pages, 24-36 links, 20% to other
    hosts) and of the feature-laden test web: `extract` finds exactly the links lxml finds, resolved as
    `normalize` resolves each one alone, in the same order (twice: nothing remembered between pages changes
    them)."""
    if shape == "bench":
        graph = SiteGraph.generate(seed=1, hosts=40, pages_per_host=50, links_per_page=30, page_bytes=14_000,
                                   features=False, cross_host_fraction=0.2, page_bytes_sigma=0.604, links_spread=6)
    else:
        graph = SiteGraph.generate(seed=3, hosts=24, pages_per_host=12)
    compared = 0
    for _ in range(2):
        for spec in graph.hosts:
            for j in range(graph.pages_per_host):
                res = graph.resource(spec.name, page_path(j))
                if res is None or res.kind != "html":
                    continue
                answer = render(graph, res, 8080)
                ctype = dict(answer.headers)[b"content-type"].decode()
                url = f"http://{spec.name}:8080{page_path(j)}"
                page = extract(answer.body, url, ctype)
                if page.nofollow or page.base != normalize(url):
                    continue
                assert list(page.links) == _reference_links(answer.body, url, page.charset), url
                compared += 1
    assert compared > 500


_TRICKY = ["/a", "b.html", "./b.html", "../up.html", "../../x", "//other.example/p", "http://x.example",
           "HTTPS://X.Example:443/a/./b/../c", "https://x.example:8443/q?b=2&a=1#f", "?q=1", "#top", "",
           " /spaced ", "http:rel.html", "http:", "https:rel", "mailto:a@b", "javascript:void(0)", "a\\b",
           "/p%7e/%41", "p?x=%zz", "\t/tab\n", "..", ".", "/", "//", "a:b", "%2e%2e/x", "/café", "ünï.html",
           "http://[::1]:80/x", "http://user:pw@h.example/", "data:text/html,x", "/a#b?c", "x/y/../../z"]
_BASES = ["http://site.example/dir/page.html", "http://site.example/dir/other.html?x=1",
          "https://site.example/dir/page.html", "http://site.example/", "http://site.example:8080/dir/sub/",
          "http://other.example/dir/page.html", "http://site.example/dir/page.html?q=2"]


def test_normalize_all_equals_each_href_normalized_alone() -> None:
    for _ in range(2):
        for base in _BASES:
            expected = list(dict.fromkeys(u for u in (normalize(h, base) for h in _TRICKY) if u is not None))
            assert normalize_all(_TRICKY, base) == expected, base
            assert normalize_all(_TRICKY, base, max_length=30) == [u for u in expected if len(u) <= 30]


# -- the links found are a browser's, on real pages

_DOC_ROOT = "/usr/share/doc"
# What a browser holds as a page's links: the a and area elements with an href, less rel=nofollow (split on
# spaces and commas as `extract` splits it), each resolved by the browser against the document's base URL.
_BROWSER_LINKS = """
const links = [];
for (const e of document.querySelectorAll('a[href], area[href]')) {
    if ((e.getAttribute('rel') || '').toLowerCase().split(/[\\s,]+/).includes('nofollow')) continue;
    try { links.push(new URL(e.getAttribute('href'), document.baseURI).href); } catch (err) {}
}
return links;
"""


# Markup where parsers part ways: template contents (not in the DOM's tree), a duplicate attribute, raw-text
# elements, legacy entities in a query, foster-parented and mis-nested links, character references, NUL,
# foreign content, an unclosed comment.
_TRICKY = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>T1</title></head><body>
<template><a href="/in-template">x</a></template>
<a href="/dup-first" href="/dup-second">d</a>
<textarea><a href="/in-textarea">t</a></textarea>
<xmp><a href="/in-xmp">x</a></xmp>
<iframe><a href="/in-iframe">i</a></iframe>
<noscript><a href="/in-noscript">n</a></noscript>
<a href="/p?x=1&para=2&not=3&copy;=4&amp;y=5">entities</a>
<a href="/q?a=1&notin;b">notin</a>
<a href=/unquoted?x=1&amp;y=2>u</a>
<table><tr><a href="/foster">f</a><td>c</td></tr></table>
<p><a href="/outer"><a href="/inner">nested</a></a>
<a href="&#x2F;hex&#47;dec">num</a>
<a href="/nul&#0;x">nul</a>
<form><a href="/in-form">f</a></form>
<math><a href="/in-math">m</a></math>
<a href = "/spaced-eq" >s</a>
<a HREF="/upper">U</a>
<!-- unclosed comment <a href="/in-comment">
</body></html>
"""


def _real_pages(every: int) -> list[str]:
    """Every `every`-th real HTML document packages ship under /usr/share/doc (python3-doc's, libffi's ...),
    as paths below it."""
    found = []
    for dirpath, _, files in os.walk(_DOC_ROOT):
        found += [os.path.relpath(os.path.join(dirpath, f), _DOC_ROOT) for f in files if f.endswith(".html")]
    return sorted(found)[::every]


@pytest.mark.slow
def test_links_of_real_pages_are_the_links_a_browser_finds() -> None:
    """Real documentation pages (Debian's python3-doc, `apt-get install python3-doc`), served over loopback and
    loaded by a real headless chromium with scripts off (a crawler runs none): `extract` finds exactly the links
    the browser's DOM holds, each resolved by the browser and then normalized, in document order; the title is
    the browser's too."""
    import functools
    import threading

    from tests.support.browser import browser, need_browser

    need_browser()
    paths = _real_pages(every=12)
    if len(paths) < 40:
        pytest.skip("too few real HTML documents: apt-get install python3-doc")
    paths.append(_TRICKY_PATH)
    handler = functools.partial(_QuietHandler, directory=_DOC_ROOT)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    origin = f"http://127.0.0.1:{server.server_address[1]}/"
    compared = links = 0
    try:
        with browser() as driver:
            driver.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
            for path in paths:
                url = origin + path
                driver.get(url)
                seen = [normalize(h) for h in driver.execute_script(_BROWSER_LINKS)]
                expected = list(dict.fromkeys(u for u in seen if u is not None))
                page = extract(_body(path), url, "text/html")
                assert list(page.links) == expected, path
                title = " ".join(driver.title.split())
                assert page.title == (title or None), path
                compared += 1
                links += len(expected)
    finally:
        server.shutdown()
        server.server_close()
    assert compared >= 40 and links > 20 * compared


_TRICKY_PATH = "tricky/markup.html"


def _body(path: str) -> bytes:
    if path == _TRICKY_PATH:
        return _TRICKY.encode()
    with open(f"{_DOC_ROOT}/{path}", "rb") as f:
        return f.read()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """/usr/share/doc as it is, and the tricky page at `_TRICKY_PATH`."""

    def do_GET(self) -> None:
        if self.path == "/" + _TRICKY_PATH:
            body = _TRICKY.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass
