"""robots.txt parsing and matching (RFC 9309), and what a fetch outcome means."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.crawl.robots import (
    MAX_ROBOTS_BYTES,
    ROBOTS_CACHE_SECONDS,
    ROBOTS_RETRY_SECONDS,
    RobotsTxt,
    can_fetch,
    decide,
    parse,
    product_token,
)

URL = "http://foo.bar"


def allowed(robots_txt: str, agent: str, path: str) -> bool:
    return can_fetch(robots_txt, agent, URL + path)


def test_empty_file_and_no_groups_allow_everything() -> None:
    assert allowed("", "FooBot", "/x")
    assert allowed("# only a comment\n", "FooBot", "/x")
    assert parse("") is RobotsTxt.ALLOW_ALL
    assert allowed("user-agent: BarBot\ndisallow: /\n", "FooBot", "/x")


def test_line_syntax_missing_colon_is_accepted() -> None:
    assert not allowed("user-agent: FooBot\ndisallow: /\n", "FooBot", "/x/y")
    assert allowed("foo: FooBot\nbar: /\n", "FooBot", "/x/y")
    assert not allowed("user-agent FooBot\ndisallow /\n", "FooBot", "/x/y")


def test_groups_merge_and_rules_outside_groups_are_ignored() -> None:
    text = (
        "allow: /foo/bar/\n"
        "\n"
        "user-agent: FooBot\n"
        "disallow: /\n"
        "allow: /x/\n"
        "user-agent: BarBot\n"
        "disallow: /\n"
        "allow: /y/\n"
        "\n"
        "\n"
        "allow: /w/\n"
        "user-agent: BazBot\n"
        "\n"
        "user-agent: FooBot\n"
        "allow: /z/\n"
        "disallow: /\n"
    )
    assert allowed(text, "FooBot", "/x/b")
    assert allowed(text, "FooBot", "/z/d")  # second FooBot group merged into the first
    assert not allowed(text, "FooBot", "/y/c")
    assert allowed(text, "BarBot", "/y/c")
    assert allowed(text, "BarBot", "/w/a")  # blank lines do not end a group
    assert not allowed(text, "BarBot", "/z/d")
    assert allowed(text, "BazBot", "/z/d")  # consecutive user-agent lines share a group
    for agent in ("FooBot", "BarBot", "BazBot"):
        assert not allowed(text, agent, "/foo/bar/")


def test_rfc_example_groups() -> None:
    text = (
        "user-agent: ExampleBot\ndisallow: /foo\ndisallow: /bar\n\n"
        "user-agent: ExampleBot\ndisallow: /baz\n\n"
        "user-agent: *\ndisallow: /qux\n"
    )
    for path in ("/foo", "/bar", "/baz"):
        assert not allowed(text, "ExampleBot", path)
    assert allowed(text, "ExampleBot", "/qux")  # the * group does not apply to a named agent
    assert not allowed(text, "OtherBot", "/qux")
    assert allowed(text, "OtherBot", "/foo")


def test_directive_names_and_agent_values_are_case_insensitive() -> None:
    for text in (
        "USER-AGENT: FOO BAR\nALLOW: /x/\nDISALLOW: /\n",
        "uSeR-aGeNt: fOo\nAlLoW: /x/\ndIsAlLoW: /\n",
    ):
        for agent in ("Foo", "foo", product_token("FOO/1.0 (+http://foo.example/bot)")):
            assert allowed(text, agent, "/x/y")
            assert not allowed(text, agent, "/a/b")


@pytest.mark.parametrize(
    ("agent", "token"),
    [
        ("FooBot/1.0", "foobot"),
        ("FooBot", "foobot"),
        ("peercrawl/0.1 (+https://example.org/bot)", "peercrawl"),
        ("  Spaced  ", "spaced"),
        ("", ""),
    ],
)
def test_product_token(agent: str, token: str) -> None:
    assert product_token(agent) == token


def test_agent_match_is_exact_on_the_product_token() -> None:
    text = "user-agent: FooBot\ndisallow: /\nuser-agent: *\nallow: /\n"
    assert not allowed(text, "foobot", "/x")
    assert allowed(text, "FooBotExtra", "/x")
    assert allowed(text, "Foo", "/x")
    # The caller passes a product token; a full User-Agent names no group (the crawler passes its token).
    assert allowed(text, "FooBot/1.0", "/x")
    # A versioned value, or one with a space, in the file names its leading token.
    assert not allowed("user-agent: FooBot/2.1\ndisallow: /\n", "foobot", "/x")
    assert not allowed("user-agent: Foo Bar\ndisallow: /\n", "foo", "/x")
    assert allowed("user-agent: Foo Bar\ndisallow: /\n", "Foo Bar", "/x")


def test_global_group_is_a_fallback_only() -> None:
    text = "user-agent: *\nallow: /\nuser-agent: FooBot\ndisallow: /\n"
    assert not allowed(text, "FooBot", "/x/y")
    assert allowed(text, "BarBot", "/x/y")
    assert allowed("user-agent: FooBot\nallow: /\nuser-agent: BarBot\ndisallow: /\n", "QuxBot", "/x")


def test_paths_are_case_sensitive() -> None:
    assert not allowed("user-agent: FooBot\ndisallow: /x/\n", "FooBot", "/x/y")
    assert allowed("user-agent: FooBot\ndisallow: /X/\n", "FooBot", "/x/y")


@pytest.mark.parametrize(
    ("text", "path", "expected"),
    [
        ("disallow: /x/page.html\nallow: /x/\n", "/x/page.html", False),
        ("allow: /x/page.html\ndisallow: /x/\n", "/x/page.html", True),
        ("allow: /x/page.html\ndisallow: /x/\n", "/x/", False),
        ("disallow: \nallow: \n", "/x/page.html", True),
        ("disallow: /\nallow: /\n", "/x/page.html", True),  # tie: allow wins
        ("disallow: /x/page.html\nallow: /x/page.html\n", "/x/page.html", True),
        ("disallow: /x\nallow: /x/\n", "/x", False),
        ("disallow: /x\nallow: /x/\n", "/x/", True),
        ("allow: /page\ndisallow: /*.html\n", "/page.html", False),
        ("allow: /page\ndisallow: /*.html\n", "/page", True),
        ("allow: /x/page.\ndisallow: /*.html\n", "/x/page.html", True),
        ("allow: /x/page.\ndisallow: /*.html\n", "/x/y.html", False),
        ("allow: /p\ndisallow: /\n", "/page", True),
        ("allow: /folder\ndisallow: /folder\n", "/folder/page", True),
        ("allow: /$\ndisallow: /\n", "/", True),
        ("allow: /$\ndisallow: /\n", "/page.html", False),
    ],
)
def test_longest_match_and_allow_on_ties(text: str, path: str, expected: bool) -> None:
    assert allowed("user-agent: FooBot\n" + text, "FooBot", path) is expected


def test_named_group_does_not_inherit_global_rules() -> None:
    text = "User-agent: *\nDisallow: /x/\nUser-agent: FooBot\nDisallow: /y/\n"
    assert allowed(text, "FooBot", "/x/page")
    assert not allowed(text, "FooBot", "/y/page")


@pytest.mark.parametrize(
    ("rule", "path", "expected"),
    [
        ("allow: /fish", "/fish.html?id=anything", True),
        ("allow: /fish", "/Fish.asp", False),
        ("allow: /fish", "/catfish", False),
        ("allow: /fish", "/?id=fish", False),
        ("allow: /fish*", "/fishheads/yummy.html", True),
        ("allow: /fish/", "/fish", False),
        ("allow: /fish/", "/fish/?salmon", True),
        ("allow: /*.php", "/folder/filename.php?parameters", True),
        ("allow: /*.php", "//folder/any.php.file.html", True),
        ("allow: /*.php", "/index?f=filename.php/", True),
        ("allow: /*.php", "/windows.PHP", False),
        ("allow: /*.php$", "/filename.php", True),
        ("allow: /*.php$", "/filename.php?parameters", False),
        ("allow: /*.php$", "/filename.php/", False),
        ("allow: /*.php$", "/filename.php5", False),
        ("allow: /fish*.php", "/fishheads/catfish.php?parameters", True),
        ("allow: /fish*.php", "/Fish.PHP", False),
        ("allow: /foo/*/qux", "/foo/bar/qux", True),
        ("allow: /foo/*/qux", "/foo/qux", False),
        ("allow: /a**b*$", "/a/x/b/y", True),
        ("allow: /a*b$", "/ab", True),
        ("allow: /a*ba$", "/aba", True),
        ("allow: /a*ba$", "/ab", False),
        ("allow: *.gif$", "/img/x.gif", True),
    ],
)
def test_wildcards_and_end_anchor(rule: str, path: str, expected: bool) -> None:
    text = f"user-agent: FooBot\ndisallow: /\n{rule}\n"
    assert allowed(text, "FooBot", path) is expected


def test_dollar_in_the_middle_is_literal() -> None:
    text = "user-agent: *\ndisallow: /a$b\n"
    assert not allowed(text, "x", "/a$b/c")
    assert allowed(text, "x", "/a")


def test_comments_are_stripped() -> None:
    text = "User-agent: FooBot\n# Disallow: /\nDisallow: /foo/quz#qux\nAllow: /\n"
    assert allowed(text, "FooBot", "/foo/bar")
    assert not allowed(text, "FooBot", "/foo/quz")


@pytest.mark.parametrize(
    ("rule", "path", "expected"),
    [
        # Rules get the reference's normal form (non-ASCII escaped, hex upper-cased); escaped unreserved
        # characters are decoded on both sides (RFC 9309 2.2.2), no other escape is.
        ("disallow: /%7Efoo", "/~foo/x", False),
        ("disallow: /~foo", "/%7Efoo/x", False),
        ("disallow: /%41%2D%5f", "/A-_", False),
        ("disallow: /%2A", "/x", True),  # an escaped "*" is no wildcard
        ("disallow: /a%24", "/a$b", False),  # an escaped "$" is no end anchor
        ("disallow: /%7efoo", "/%7Efoo", False),
        ("disallow: /%2Fx", "//x", True),  # an escaped "/" is not a "/"
        ("disallow: /%2fx", "/%2Fx", False),
        ("disallow: /foo/bar/ツ", "/foo/bar/%E3%83%84", False),
        ("disallow: /foo/bar/%E3%83%84", "/foo/bar/%E3%83%84", False),
        ("disallow: /foo/bar/%E3%83%84", "/foo/bar/ツ", True),  # the path is the caller's to encode
        ("disallow: /foo/bar?qux=taz&baz=http://foo.bar?tar&par", "/foo/bar?qux=taz&baz=http://foo.bar?tar&par", False),
        ("disallow: /a b", "/a%20b", True),
    ],
)
def test_percent_encoding_of_rules(rule: str, path: str, expected: bool) -> None:
    assert allowed(f"user-agent: *\n{rule}\n", "FooBot", path) is expected


def test_robots_txt_is_always_allowed() -> None:
    text = "user-agent: *\ndisallow: /\ndisallow: /robots.txt\n"
    assert allowed(text, "FooBot", "/robots.txt")
    assert not allowed(text, "FooBot", "/robots.txt.bak")
    assert RobotsTxt.DISALLOW_ALL.can_fetch("FooBot", "/robots.txt")
    assert not RobotsTxt.DISALLOW_ALL.can_fetch("FooBot", "/")
    assert RobotsTxt.ALLOW_ALL.can_fetch("FooBot", "/anything")


def test_empty_disallow_allows_everything() -> None:
    assert allowed("user-agent: *\ndisallow:\n", "FooBot", "/x")
    assert allowed("user-agent: *\ndisallow: # nothing\n", "FooBot", "/x")


def test_line_endings_bom_and_typos() -> None:
    for sep in ("\n", "\r\n", "\r"):
        text = sep.join(["User-Agent: foo", "Allow: /some/path", "User-Agent: bar", "", "", "Disallow: /"])
        robots = parse(text)
        assert robots.can_fetch("foo", "/some/path/x")
        assert not robots.can_fetch("bar", "/x")
    assert not parse(b"\xef\xbb\xbfuser-agent: *\ndisallow: /\n").can_fetch("x", "/a")
    assert not parse("\ufeffuser-agent: *\ndisallow: /\n").can_fetch("x", "/a")
    assert not allowed("useragent: *\ndisalow: /\n", "x", "/a")
    assert not allowed("user agent: *\ndissallow: /\n", "x", "/a")
    assert allowed("user-agent: *\nDisallow: private\n", "x", "/private/x")  # no leading "/": matches no path


def test_crawl_delay_and_sitemaps() -> None:
    robots = parse(
        "Sitemap: https://foo.bar/s1.xml\n"
        "user-agent: FooBot\ncrawl-delay: 2.5\ndisallow: /x\n"
        "user-agent: FooBot\nCrawl-delay: 4\nallow: /\n"
        "user-agent: *\ncrawl-delay: 10 # seconds\nallow: /\n"
        "user-agent: SlowBot\ncrawl-delay: abc\nallow: /\n"
        "user-agent: NegBot\ncrawl-delay: -3\nallow: /\n"
        "user-agent: DotBot\ncrawl-delay: .5\nallow: /\n"
        "site-map: https://foo.bar/s2.xml\nSitemap: https://foo.bar/s1.xml\n"
    )
    assert robots.crawl_delay("FooBot") == 4.0  # merged groups: the slowest asked
    assert robots.crawl_delay("Other") == 10.0
    assert robots.crawl_delay("SlowBot") is None
    assert robots.crawl_delay("NegBot") is None
    assert robots.crawl_delay("DotBot") == 0.5
    assert robots.sitemaps == ("https://foo.bar/s1.xml", "https://foo.bar/s2.xml")
    assert parse("user-agent: *\ndisallow: /\n").crawl_delay("x") is None
    # Crawl-delay, like any line that is not a rule, does not end a run of user-agent lines.
    shared = parse("user-agent: FooBot\ncrawl-delay: 3\nuser-agent: *\ndisallow: /\n")
    assert shared.crawl_delay("FooBot") == 3.0 and shared.crawl_delay("other") is None
    assert not shared.can_fetch("FooBot", "/x")


def test_garbage_is_tolerated() -> None:
    text = "\x00\x01garbage line\n:::\n<html><body>Not robots</body></html>\nuser-agent: *\ndisallow /private\n\xff"
    assert allowed(text, "x", "/public")
    assert not allowed(text, "x", "/private/a")
    robots = parse(bytes(range(256)) * 10)
    assert robots.can_fetch("x", "/")


def test_only_the_first_max_bytes_are_read() -> None:
    filler = "# " + "x" * 1000 + "\n"
    head = "user-agent: *\ndisallow: /early\n"
    tail = "disallow: /late\n"
    text = head + filler * (MAX_ROBOTS_BYTES // len(filler) + 1) + tail
    robots = parse(text.encode())
    assert not robots.can_fetch("x", "/early")
    assert robots.can_fetch("x", "/late")
    big = head + "disallow: /mid\n" + filler * (500 * 1024 // len(filler) - 2)
    assert len(big.encode()) < MAX_ROBOTS_BYTES
    assert not parse(big.encode()).can_fetch("x", "/mid")


def test_hostile_wildcards_match_fast_enough() -> None:
    text = "user-agent: *\ndisallow: /" + "a*" * 2000 + "b\n"
    robots = parse(text)
    assert robots.can_fetch("x", "/" + "a" * 5000)
    assert not robots.can_fetch("x", "/" + "a" * 2000 + "b")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.text(max_size=30), st.text(max_size=40))
def test_parse_and_match_never_raise_on_text(text: str, agent: str, path: str) -> None:
    robots = parse(text)
    assert isinstance(robots.can_fetch(agent, "/" + path), bool)
    delay = robots.crawl_delay(agent)
    assert delay is None or delay >= 0


_LINES = st.lists(
    st.sampled_from(
        ["user-agent: *", "user-agent: FooBot", "disallow: /", "disallow: /a*", "allow: /a$", "allow:",
         "crawl-delay: 1", "sitemap: http://x/s", "", "# c", "junk", "disallow /b"]
    ),
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(_LINES, st.binary(max_size=50))
def test_parse_never_raises_on_bytes(lines: list[str], noise: bytes) -> None:
    robots = parse("\n".join(lines).encode() + noise)
    assert robots.can_fetch("FooBot", "/robots.txt")


@pytest.mark.parametrize(
    ("status", "kind", "ttl"),
    [
        (200, "parsed", ROBOTS_CACHE_SECONDS),
        (204, "parsed", ROBOTS_CACHE_SECONDS),
        (301, "allow-all", ROBOTS_CACHE_SECONDS),
        (400, "allow-all", ROBOTS_CACHE_SECONDS),
        (401, "allow-all", ROBOTS_CACHE_SECONDS),
        (403, "allow-all", ROBOTS_CACHE_SECONDS),
        (404, "allow-all", ROBOTS_CACHE_SECONDS),
        (410, "allow-all", ROBOTS_CACHE_SECONDS),
        (429, "disallow-all-retry", ROBOTS_RETRY_SECONDS),
        (500, "disallow-all-retry", ROBOTS_RETRY_SECONDS),
        (503, "disallow-all-retry", ROBOTS_RETRY_SECONDS),
        (None, "disallow-all-retry", ROBOTS_RETRY_SECONDS),
        (100, "disallow-all-retry", ROBOTS_RETRY_SECONDS),
        (600, "disallow-all-retry", ROBOTS_RETRY_SECONDS),
    ],
)
def test_decide_by_status(status: int | None, kind: str, ttl: float) -> None:
    decision = decide(status, b"user-agent: *\ndisallow: /private\n", now=1000.0)
    assert decision.kind == kind
    assert decision.expires_at == 1000.0 + ttl
    robots = decision.robots
    if kind == "parsed":
        assert not robots.can_fetch("x", "/private/a") and robots.can_fetch("x", "/public")
    elif kind == "allow-all":
        assert robots is RobotsTxt.ALLOW_ALL
    else:
        assert robots is RobotsTxt.DISALLOW_ALL


def test_decide_details() -> None:
    assert ROBOTS_CACHE_SECONDS == 86400.0 and ROBOTS_RETRY_SECONDS == 600.0
    assert decide(200, None, now=0.0).robots.can_fetch("x", "/anything")
    too_many = decide(200, b"user-agent: *\ndisallow: /\n", now=5.0, redirects_followed=6)
    assert too_many.kind == "allow-all" and too_many.expires_at == 5.0 + ROBOTS_CACHE_SECONDS
    five = decide(200, b"user-agent: *\ndisallow: /\n", now=5.0, redirects_followed=5)
    assert five.kind == "parsed" and not five.robots.can_fetch("x", "/a")
    with pytest.raises(AttributeError):
        five.kind = "allow-all"  # type: ignore[misc]
