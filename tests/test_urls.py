"""URL normalization, resolution, the partition key and crawl scope."""

from __future__ import annotations

from urllib.parse import urljoin

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.crawl.urls import (
    DEFAULT_BINARY_SUFFIXES,
    Scope,
    host_of,
    normalize,
    normalize_all,
    origin_of,
    path_and_query_of,
)
from protocol import HostState as WireHostState
from protocol import Limits, SeenReplica, encode_body

BASE = "http://h.example/a/b/c.html?q=1"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # scheme and host case, default ports
        ("HTTP://Example.COM/Path", "http://example.com/Path"),
        ("http://example.com:80/", "http://example.com/"),
        ("https://example.com:443/x", "https://example.com/x"),
        ("http://example.com:443/x", "http://example.com:443/x"),
        ("https://example.com:0080/x", "https://example.com:80/x"),
        ("http://example.com:/x", "http://example.com/x"),
        # empty path, empty query, fragment, trailing dot on the host
        ("http://example.com", "http://example.com/"),
        ("http://example.com?", "http://example.com/"),
        ("http://example.com?a=1", "http://example.com/?a=1"),
        ("http://example.com/x#frag", "http://example.com/x"),
        ("http://example.com./x", "http://example.com/x"),
        # dot segments
        ("http://e.com/a/./b/../c", "http://e.com/a/c"),
        ("http://e.com/a/b/..", "http://e.com/a/"),
        ("http://e.com/../../x", "http://e.com/x"),
        ("http://e.com/a/%2E%2E/b", "http://e.com/b"),
        ("http://e.com/a//b", "http://e.com/a//b"),
        # percent-encoding: decode unreserved, upper-case hex, escape the rest as UTF-8
        ("http://e.com/%7efoo", "http://e.com/~foo"),
        ("http://e.com/%41%2f%3a", "http://e.com/A%2F%3A"),
        ("http://e.com/a b", "http://e.com/a%20b"),
        ("http://e.com/ä?q=ö", "http://e.com/%C3%A4?q=%C3%B6"),
        ("http://e.com/100%", "http://e.com/100%25"),
        ("http://e.com/%zz", "http://e.com/%25zz"),
        ("http://e.com/a|b", "http://e.com/a%7Cb"),
        ("http://e.com/?a=b&c=d/e", "http://e.com/?a=b&c=d/e"),
        # IDNA
        ("http://Bücher.example/", "http://xn--bcher-kva.example/"),
        ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example/"),
        ("http://BÜCHER.example/", "http://xn--bcher-kva.example/"),
        ("http://%65xample.com/", "http://example.com/"),
        # IPv6 and credentials
        ("http://[0:0::1]:8080/x", "http://[::1]:8080/x"),
        ("http://user:secret@example.com/", "http://example.com/"),
        # what browsers drop or fix
        ("  http://e.com/a\n\tb  ", "http://e.com/ab"),
        ("http:\\\\e.com\\a\\b?x=\\", "http://e.com/a/b?x=%5C"),
    ],
)
def test_normalize_absolute(url: str, expected: str) -> None:
    assert normalize(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/",
        "mailto:someone@example.com",
        "javascript:alert(1)",
        "data:text/html,hi",
        "http://",
        "http:///x",
        "http://a..b/",
        "http://exa mple.com/",
        "http://e.com:99999/",
        "http://e.com:0/",
        "http://e.com:8o/",
        "http://[::1/",
        "http://[zz::1]/",
        "http://[fe80::1%25eth0]/",  # a zone names an interface of the client, not a host
        "http://[fe80::1%25%3F]/",  # ... and may hold "?", which made "http://[fe80::1%?]/"
        "http://[::1%25%20]:8080/x",
        "http://" + "a" * 64 + ".com/",
        "http://xn--.com/",
        "http://a-.example.com/",  # a label may not end or begin with a hyphen: no peer could be sent its host
        "http://-a.example.com/",
        "relative/path",
        "/absolute/path",
        "",
    ],
)
def test_normalize_rejects(url: str) -> None:
    assert normalize(url) is None


@pytest.mark.parametrize("digits", ["1" * 6, "1" * 4301, "0" * 5000 + "1" * 4301])
def test_a_port_of_thousands_of_digits_is_refused_not_raised(digits: str) -> None:
    # int() refuses more than 4,300 digits; a link may hold four times the URL length limit before it is refused
    assert normalize(f"http://e.com:{digits}/") is None
    assert normalize(f"//e.com:{digits}/x", "https://b.com/") is None
    assert normalize_all([f"http://e.com:{digits}/", "/ok"], "http://b.com/") == ["http://b.com/ok"]


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("g", "http://h.example/a/b/g"),
        ("./g", "http://h.example/a/b/g"),
        ("g/", "http://h.example/a/b/g/"),
        ("/g", "http://h.example/g"),
        ("//g.example/x", "http://g.example/x"),
        ("?y", "http://h.example/a/b/c.html?y"),
        ("g?y", "http://h.example/a/b/g?y"),
        ("#s", "http://h.example/a/b/c.html?q=1"),
        ("", "http://h.example/a/b/c.html?q=1"),
        (".", "http://h.example/a/b/"),
        ("..", "http://h.example/a/"),
        ("../g", "http://h.example/a/g"),
        ("../../../g", "http://h.example/g"),
        ("g;x=1/../y", "http://h.example/a/b/y"),
        ("http:g", "http://h.example/a/b/g"),
        ("https:g", None),
        ("HTTPS://Other.example", "https://other.example/"),
        ("\\\\other.example\\x", "http://other.example/x"),
        ("mailto:x@y", None),
        ("a:b", None),
    ],
)
def test_resolve_against_base(ref: str, expected: str | None) -> None:
    assert normalize(ref, BASE) == expected


def test_max_length() -> None:
    url = "http://e.com/" + "a" * 100
    assert normalize(url, max_length=len(url)) == url
    assert normalize(url, max_length=len(url) - 1) is None
    assert normalize("http://e.com/" + "%41" * 5000, max_length=2048) is None


def test_invalid_base_only_resolves_absolute_refs() -> None:
    assert normalize("/x", "mailto:a@b") is None
    assert normalize("http://e.com/x", "not a url") == "http://e.com/x"


def test_normalize_all_dedups_and_keeps_order() -> None:
    hrefs = ["/b", "/a", "/b", "#top", "javascript:void(0)", "/a#x", "/a/../b", "c"]
    assert normalize_all(hrefs, BASE) == [
        "http://h.example/b",
        "http://h.example/a",
        "http://h.example/a/b/c.html?q=1",
        "http://h.example/a/b/c",
    ]


def test_host_origin_and_target() -> None:
    assert host_of("HTTP://Bücher.Example:8080/x?y") == "xn--bcher-kva.example"
    assert host_of("http://[::1]:81/") == "[::1]"
    assert origin_of("HTTPS://E.com:443/a") == "https://e.com"
    assert origin_of("http://E.com:8080/a") == "http://e.com:8080"
    assert path_and_query_of("http://e.com") == "/"
    assert path_and_query_of("http://e.com/a/%7e?b=c#d") == "/a/~?b=c"
    with pytest.raises(ValueError, match="not a crawlable"):
        host_of("ftp://e.com/")


def test_agrees_with_urljoin_on_plain_links() -> None:
    base = "http://h.example/dir/page.html"
    for ref in ["/p/1.html", "../q/2.html?x=3", "sub/4.html", "http://o.example/5.html", "?page=2"]:
        assert normalize(ref, base) == urljoin(base, ref)


_URL_CHARS = st.sampled_from(
    list("aZ09-._~!$&'()*+,;=:@/?#[]%% \\\t|<>\"{}^`") + ["%41", "%7e", "%2F", "%zz", "..", "./", "ä", "ツ", "\x00"]
)
_HOSTS = st.sampled_from(
    ["example.com", "EXAMPLE.com.", "bücher.de", "[::1]", "127.0.0.1", "a-b_c.example", "%65x.com", "xn--bcher-kva.de",
     "a-.example", "-a.example", "x.-.example"]
)


@st.composite
def _urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "Https"]))
    port = draw(st.sampled_from(["", ":80", ":443", ":8080", ":0081"]))
    tail = "".join(draw(st.lists(_URL_CHARS, max_size=25)))
    return f"{scheme}://{draw(_HOSTS)}{port}{tail}"


@settings(max_examples=200, deadline=None)
@given(_urls())
def test_normalize_is_idempotent_on_url_like_input(url: str) -> None:
    once = normalize(url)
    if once is not None:
        assert normalize(once) == once
        assert normalize(once, BASE) == once
        assert once.startswith(("http://", "https://"))
        assert "#" not in once and " " not in once
        # a queued URL's host must travel: hand-off chunks, replicas and reports carry it
        host = host_of(once)
        state = WireHostState(host=host, crawl_delay=0.0, ready_in=0.0, failures=0)
        assert encode_body(SeenReplica(epoch=1, keys=(), hosts=(state,)), "msgpack", Limits())


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.sampled_from([None, BASE, "https://x.example", "bogus"]))
def test_normalize_is_idempotent_on_any_text(text: str, base: str | None) -> None:
    once = normalize(text, base)
    if once is not None:
        assert normalize(once) == once
        assert once.isascii()


def test_scope_reasons() -> None:
    scope = Scope(
        allowed_hosts=["example.com", "*.other.org"],
        denied_hosts=["private.example.com"],
        max_depth=2,
        max_url_length=80,
        max_path_segments=5,
        max_repeated_segment=2,
    )
    ok = "http://www.example.com/a/b"
    assert scope.check(ok, "www.example.com", 2) is None
    assert scope.check("http://example.com/", "example.com", 0) is None
    assert scope.check("http://x.other.org/", "x.other.org", 0) is None
    assert scope.check("http://other.org/", "other.org", 0) == "not-allowed-host"
    assert scope.check("http://notexample.com/", "notexample.com", 0) == "not-allowed-host"
    assert scope.check("http://a.private.example.com/", "a.private.example.com", 0) == "denied-host"
    assert scope.check(ok, "www.example.com", 3) == "depth"
    assert scope.check("http://example.com/" + "x" * 80, "example.com", 0) == "too-long"
    assert scope.check("http://example.com/img/a.JPG?s=1", "example.com", 0) == "suffix"
    assert scope.check("http://example.com/a/b/c/d/e/f", "example.com", 0) == "trap-too-many-segments"
    assert scope.check("http://example.com/a/b/a/c/a", "example.com", 0) == "trap-repeated-segment"
    assert scope.check("http://example.com/a/b/a/c", "example.com", 0) is None
    assert scope.check("http://example.com/a.jpg/page?x=.pdf", "example.com", 0) is None


def test_scope_defaults_and_bad_pattern() -> None:
    scope = Scope()
    assert scope.check("http://any.example/x.html", "any.example", 10**6) is None
    assert scope.check("http://any.example/x.tar.gz", "any.example", 0) == "suffix"
    assert ".pdf" in DEFAULT_BINARY_SUFFIXES
    assert Scope(deny_suffixes=()).check("http://e.com/x.pdf", "e.com", 0) is None
    assert Scope(allowed_hosts=["Bücher.de"]).check("http://xn--bcher-kva.de/", "xn--bcher-kva.de", 0) is None
    with pytest.raises(ValueError, match="invalid host pattern"):
        Scope(denied_hosts=["bad host"])


@given(st.sampled_from([
    "http://Example.COM:80/a/../b?q=1#f", "https://bücher.example/x y", "http://[::1]:8080/p",
    "http://h.test:8123", "HTTPS://a.b.c/%7euser/", "http://user:pw@host.example:81/x?y#z",
]) | st.text(max_size=60).map(lambda t: "http://h.example/" + t))
def test_fast_host_and_origin_agree_on_normalized_urls(raw):
    from peer.crawl.urls import host_of_normalized, origin_of_normalized

    url = normalize(raw)
    if url is None:
        return
    assert host_of_normalized(url) == host_of(url)
    assert origin_of_normalized(url) == origin_of(url)


_REF_CHARS = st.sampled_from(
    list("aZ09-._~!$&'()*+,;=@/?#[]%%\\|<>\"{}^`") + ["%41", "%7e", "%2F", "%zz", "..", "./", "ä", "ツ", "p/", ".html"]
)
# and what real hrefs add: spaces and tabs, fragments, absolute URLs
_HREF_CHARS = st.one_of(_REF_CHARS, st.sampled_from([" ", "\t", "#", "#x", "http://o.example/", "https://O.example:443"]))
_BASES = st.sampled_from([BASE, "http://h.example", "http://h.example/", "http://h.example:8080/a/b/?q",
                          "http://h.example/a/b/c.html?"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_REF_CHARS, max_size=12).map("".join), _BASES)
def test_relative_paths_resolve_as_the_general_split_does(ref: str, base: str) -> None:
    """A reference with no ":" takes the relative-path shortcut; "http:REF" against an http base is read by the
    general split as the same relative reference (RFC 3986 section 5.2.2, the browsers' habit), so both must
    agree."""
    if ":" not in ref and not ref.startswith("//"):
        assert normalize(ref, base) == normalize("http:" + ref, base)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_HREF_CHARS, max_size=10).map("".join), max_size=8), _BASES)
def test_normalize_all_is_normalize_of_each(refs: list[str], base: str) -> None:
    """The batch's shortcut for paths already in normal form gives what `normalize` gives for each alone."""
    expected = list(dict.fromkeys(url for url in (normalize(r, base) for r in refs) if url is not None))
    assert normalize_all(refs, base) == expected
    assert normalize_all(refs, base, max_length=30) == list(
        dict.fromkeys(url for url in (normalize(r, base, max_length=30) for r in refs) if url is not None))


def test_normalize_all_shortcut_cases() -> None:
    refs = ["/p/1.html", "p/2.html", "p/3.html?x=1", "/p/4.html?", "//o.example/5", "./6", "../7", "/a/./8",
            "?9", "p:10", "/p/11%41", "/p/12 x", "p/13#frag", "/p/14?a=[1]", "", "#top", "#", "p/15 #f", "p/16\t#f",
            "p\\17#f\\g", "../18#f", "http://o.example/19#f", "http://O.example/20#f", " #f", "?21#f", "/22#" + "f" * 9000]
    assert normalize_all(refs, BASE) == [u for u in dict.fromkeys(normalize(r, BASE) for r in refs) if u]
    assert normalize_all(["/x", "http://o.example/y", "z"], "bogus") == ["http://o.example/y"]


def test_normalize_all_absolute_shortcut_cases() -> None:
    refs = ["http://o.example/p/1.html", "https://o.example:443/x?a=1", "http://o.example:8080", "http://o.example",
            "http://o.example:0080/y", "http://o.example:99999/z", "http://o..example/", "http://o.example./q",
            "http://-o.example/", "http://o.example/a/../b", "http://o.example/%41", "http://o.example?x",
            "http://o.example/p?", "http://" + "a" * 64 + ".example/", "http://xn--bcher-kva.example/",
            "http://xn--zz.example/", "https://o.example/ok?q=[1]&r=:", "httpx://o.example/", "http://O.example/"]
    assert normalize_all(refs, BASE) == [u for u in dict.fromkeys(normalize(r, BASE) for r in refs) if u]
    assert normalize_all(refs, BASE, max_length=24) == [
        u for u in dict.fromkeys(normalize(r, BASE, max_length=24) for r in refs) if u]


_ABS_REFS = st.builds(lambda scheme, host, port, tail: f"{scheme}://{host}{port}{tail}",
                      st.sampled_from(["http", "https"]),
                      st.sampled_from(["o.example", "a-b.example", "127.0.0.1", "o.example.", "x..y", "xn--zz.de"]),
                      st.sampled_from(["", ":80", ":443", ":8080", ":0081", ":70000", ":"]),
                      st.lists(_REF_CHARS, max_size=10).map("".join))


@settings(max_examples=300, deadline=None)
@given(st.lists(_ABS_REFS, max_size=6), _BASES)
def test_normalize_all_is_normalize_of_each_absolute(refs: list[str], base: str) -> None:
    expected = list(dict.fromkeys(url for url in (normalize(r, base) for r in refs) if url is not None))
    assert normalize_all(refs, base) == expected
