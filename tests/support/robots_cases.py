"""robots.txt conformance cases: RFC 9309's examples and the behaviour of Google's open-source reference
parser (github.com/google/robotstxt), expressed as data: (name, robots.txt, product token, URL, allowed?).

The URLs are given as the reference takes them: already percent-encoded by the caller; the path, params and
query are matched as they are. `tests/test_robots_conformance.py` runs every case against
`peer.crawl.robots.can_fetch`; `python -m tests.bench.bench_robots_conformance` also runs them through Protego.
"""

from __future__ import annotations

from typing import NamedTuple


class Case(NamedTuple):
    name: str
    robots: str | bytes
    agent: str
    url: str
    allowed: bool


def _cases(name: str, robots: str | bytes, agent: str, expected: list[tuple[str, bool]]) -> list[Case]:
    return [Case(f"{name}[{i}]", robots, agent, url, ok) for i, (url, ok) in enumerate(expected)]


FOO_ALL = "user-agent: FooBot\ndisallow: /\n"
B = "http://foo.bar"

CASES: list[Case] = []
add = CASES.extend

# --- a whole run: empty inputs
add(_cases("system-empty-file", "", "FooBot", [("", True)]))
add(_cases("system-empty-agent", FOO_ALL, "", [("", True)]))
add(_cases("system-empty-url-is-root", FOO_ALL, "FooBot", [("", False)]))
add(_cases("system-all-empty", "", "", [("", True)]))

# --- line syntax: "key: value", and Google's missing colon
add(_cases("line-correct", FOO_ALL, "FooBot", [(B + "/x/y", False)]))
add(_cases("line-unknown-keys", "foo: FooBot\nbar: /\n", "FooBot", [(B + "/x/y", True)]))
add(_cases("line-missing-colon", "user-agent FooBot\ndisallow /\n", "FooBot", [(B + "/x/y", False)]))
add(_cases("line-three-words-no-colon", "user-agent FooBot\ndisallow / x\n", "FooBot", [(B + "/x/y", True)]))

# --- groups: consecutive user-agent lines, merged groups, rules outside groups
GROUPS = (
    "allow: /foo/bar/\n\nuser-agent: FooBot\ndisallow: /\nallow: /x/\nuser-agent: BarBot\ndisallow: /\n"
    "allow: /y/\n\n\nallow: /w/\nuser-agent: BazBot\n\nuser-agent: FooBot\nallow: /z/\ndisallow: /\n"
)
add(_cases("groups-foo", GROUPS, "FooBot", [(B + "/x/b", True), (B + "/z/d", True), (B + "/y/c", False),
                                            (B + "/foo/bar/", False)]))
add(_cases("groups-bar", GROUPS, "BarBot", [(B + "/y/c", True), (B + "/w/a", True), (B + "/z/d", False),
                                            (B + "/foo/bar/", False)]))
add(_cases("groups-baz", GROUPS, "BazBot", [(B + "/z/d", True), (B + "/foo/bar/", False)]))

# --- a line that is not user-agent/allow/disallow does not end a group
OTHER_SITEMAP = "User-agent: BarBot\nSitemap: https://foo.bar/sitemap\nUser-agent: *\nDisallow: /\n"
OTHER_UNKNOWN = "User-agent: FooBot\nInvalid-Unknown-Line: unknown\nUser-agent: *\nDisallow: /\n"
OTHER_DELAY = "User-agent: FooBot\nCrawl-delay: 5\nUser-agent: *\nDisallow: /\n"
for label, text in (("sitemap", OTHER_SITEMAP), ("unknown", OTHER_UNKNOWN), ("crawl-delay", OTHER_DELAY)):
    add(_cases(f"group-other-{label}-foo", text, "FooBot", [(B + "/", False)]))
    add(_cases(f"group-other-{label}-bar", text, "BarBot", [(B + "/", False)]))

# --- names of records and agent values are case-insensitive
for label, text in (
    ("upper", "USER-AGENT: FooBot\nALLOW: /x/\nDISALLOW: /\n"),
    ("lower", "user-agent: FooBot\nallow: /x/\ndisallow: /\n"),
    ("camel", "uSeR-aGeNt: FooBot\nAlLoW: /x/\ndIsAlLoW: /\n"),
):
    add(_cases(f"key-case-{label}", text, "FooBot", [(B + "/x/y", True), (B + "/a/b", False)]))
for label, text in (
    ("upper", "User-Agent: FOO BAR\nAllow: /x/\nDisallow: /\n"),
    ("lower", "User-Agent: foo bar\nAllow: /x/\nDisallow: /\n"),
    ("camel", "User-Agent: FoO bAr\nAllow: /x/\nDisallow: /\n"),
):
    for agent in ("Foo", "foo"):
        add(_cases(f"agent-case-{label}-{agent}", text, agent, [(B + "/x/y", True), (B + "/a/b", False)]))

# --- a user-agent value is read up to the first character that cannot be in a product token
UP_TO_SPACE = "User-Agent: *\nDisallow: /\nUser-Agent: Foo Bar\nAllow: /x/\nDisallow: /\n"
add(_cases("agent-up-to-space-token", UP_TO_SPACE, "Foo", [(B + "/x/y", True)]))
add(_cases("agent-up-to-space-whole", UP_TO_SPACE, "Foo Bar", [(B + "/x/y", False)]))
add(_cases("agent-version-in-file", "User-agent: FooBot/2.1\nDisallow: /\n", "FooBot", [(B + "/a", False)]))
add(_cases("agent-star-then-text", "User-agent: * ignored\nDisallow: /\n", "FooBot", [(B + "/a", False)]))
add(_cases("agent-star-glued", "User-agent: *bot\nDisallow: /\n", "FooBot", [(B + "/a", True)]))

# --- the global group is a fallback only
GLOBAL = "user-agent: *\nallow: /\nuser-agent: FooBot\ndisallow: /\n"
ONLY_SPECIFIC = "user-agent: FooBot\nallow: /\nuser-agent: BarBot\ndisallow: /\nuser-agent: BazBot\ndisallow: /\n"
add(_cases("global-empty", "", "FooBot", [(B + "/x/y", True)]))
add(_cases("global-named", GLOBAL, "FooBot", [(B + "/x/y", False)]))
add(_cases("global-fallback", GLOBAL, "BarBot", [(B + "/x/y", True)]))
add(_cases("global-none", ONLY_SPECIFIC, "QuxBot", [(B + "/x/y", True)]))
add(_cases("global-named-empty-group", "user-agent: *\ndisallow: /\nuser-agent: FooBot\n", "FooBot",
           [(B + "/x", True)]))

# --- paths are case-sensitive
add(_cases("path-case-lower", "user-agent: FooBot\ndisallow: /x/\n", "FooBot", [(B + "/x/y", False)]))
add(_cases("path-case-upper", "user-agent: FooBot\ndisallow: /X/\n", "FooBot", [(B + "/x/y", True)]))

# --- the longest match wins; Allow wins a tie
P = B + "/x/page.html"
add(_cases("longest-disallow-longer", "user-agent: FooBot\ndisallow: /x/page.html\nallow: /x/\n", "FooBot",
           [(P, False)]))
add(_cases("longest-allow-longer", "user-agent: FooBot\nallow: /x/page.html\ndisallow: /x/\n", "FooBot",
           [(P, True), (B + "/x/", False)]))
add(_cases("longest-empty-tie", "user-agent: FooBot\ndisallow: \nallow: \n", "FooBot", [(P, True)]))
add(_cases("longest-root-tie", "user-agent: FooBot\ndisallow: /\nallow: /\n", "FooBot", [(P, True)]))
add(_cases("longest-slash", "user-agent: FooBot\ndisallow: /x\nallow: /x/\n", "FooBot",
           [(B + "/x", False), (B + "/x/", True)]))
add(_cases("longest-same-tie", "user-agent: FooBot\ndisallow: /x/page.html\nallow: /x/page.html\n", "FooBot",
           [(P, True)]))
add(_cases("longest-star-1", "user-agent: FooBot\nallow: /page\ndisallow: /*.html\n", "FooBot",
           [(B + "/page.html", False), (B + "/page", True)]))
add(_cases("longest-star-2", "user-agent: FooBot\nallow: /x/page.\ndisallow: /*.html\n", "FooBot",
           [(P, True), (B + "/x/y.html", False)]))
add(_cases("longest-specific-group", "User-agent: *\nDisallow: /x/\nUser-agent: FooBot\nDisallow: /y/\n",
           "FooBot", [(B + "/x/page", True), (B + "/y/page", False)]))

# --- percent-encoding: what matches literally and what is normalized
ENC_QUERY = "User-agent: FooBot\nDisallow: /\nAllow: /foo/bar?qux=taz&baz=http://foo.bar?tar&par\n"
add(_cases("encoding-query", ENC_QUERY, "FooBot", [(B + "/foo/bar?qux=taz&baz=http://foo.bar?tar&par", True)]))
ENC_UTF8 = "User-agent: FooBot\nDisallow: /\nAllow: /foo/bar/\u30c4\n"
add(_cases("encoding-utf8-rule", ENC_UTF8, "FooBot",
           [(B + "/foo/bar/%E3%83%84", True), (B + "/foo/bar/\u30c4", False)]))
ENC_ESCAPED = "User-agent: FooBot\nDisallow: /\nAllow: /foo/bar/%E3%83%84\n"
add(_cases("encoding-escaped-rule", ENC_ESCAPED, "FooBot",
           [(B + "/foo/bar/%E3%83%84", True), (B + "/foo/bar/\u30c4", False)]))
# RFC 9309 2.2.2: an escaped unreserved character (RFC 3986 2.3) is the character itself, in a rule or a URL
ENC_UNRESERVED = "User-agent: FooBot\nDisallow: /\nAllow: /foo/bar/%62%61%7A\n"
add(_cases("encoding-unreserved-decoded", ENC_UNRESERVED, "FooBot",
           [(B + "/foo/bar/baz", True), (B + "/foo/bar/%62%61%7A", True), (B + "/foo/bar/ba%7a", True),
            (B + "/foo/bar/bat", False)]))
add(_cases("encoding-unreserved-rule-side", "User-agent: FooBot\nDisallow: /%7Efoo\n", "FooBot",
           [(B + "/~foo", False), (B + "/~foo/bar", False), (B + "/%7Efoo", False), (B + "/~bar", True)]))
add(_cases("encoding-unreserved-url-side", "User-agent: FooBot\nDisallow: /~foo\n", "FooBot",
           [(B + "/%7Efoo", False), (B + "/%7efoo/x", False), (B + "/%7Ebar", True)]))
add(_cases("encoding-reserved-not-decoded", "User-agent: FooBot\nDisallow: /a%3Fb\n", "FooBot",
           [(B + "/a%3Fb", False), (B + "/a?b", True)]))
# RFC 9309 2.2.3: "%2A" and "%24" in a rule are a literal "*" and "$", not a wildcard and an end anchor
add(_cases("encoding-escaped-star", "User-agent: FooBot\nDisallow: /path/file-with-a-%2A.html\n", "FooBot",
           [(B + "/path/file-with-a-*.html", False), (B + "/path/file-with-a-x.html", True)]))
add(_cases("encoding-escaped-dollar", "User-agent: FooBot\nDisallow: /path/foo-%24\n", "FooBot",
           [(B + "/path/foo-$", False), (B + "/path/foo-$/more", False), (B + "/path/foo-", True)]))
add(_cases("encoding-lower-hex-rule", "User-agent: FooBot\nDisallow: /\nAllow: /a%2fb\n", "FooBot",
           [(B + "/a%2Fb", True), (B + "/a/b", False)]))
add(_cases("encoding-latin1-rule", b"User-agent: FooBot\nDisallow: /\nAllow: /caf\xe9\n", "FooBot",
           [(B + "/caf%E9", True), (B + "/caf%C3%A9", False)]))

# --- special characters: "*", "$" at the end, "#"
add(_cases("special-star", "User-agent: FooBot\nDisallow: /foo/bar/quz\nAllow: /foo/*/qux\n", "FooBot",
           [(B + "/foo/bar/quz", False), (B + "/foo/quz", True), (B + "/foo//quz", True),
            (B + "/foo/bax/quz", True)]))
add(_cases("special-dollar", "User-agent: FooBot\nDisallow: /foo/bar$\nAllow: /foo/bar/qux\n", "FooBot",
           [(B + "/foo/bar", False), (B + "/foo/bar/qux", True), (B + "/foo/bar/", True),
            (B + "/foo/bar/baz", True)]))
add(_cases("special-hash", "User-agent: FooBot\n# Disallow: /\nDisallow: /foo/quz#qux\nAllow: /\n", "FooBot",
           [(B + "/foo/bar", True), (B + "/foo/quz", False)]))
add(_cases("special-dollar-middle", "User-agent: FooBot\nDisallow: /a$b\n", "FooBot",
           [(B + "/a$b", False), (B + "/a", True)]))

# --- Google: an Allow of ".../index.htm[l]" allows its directory too
INDEX = "User-Agent: *\nAllow: /allowed-slash/index.html\nDisallow: /\n"
add(_cases("index-html", INDEX, "foobot", [
    ("http://foo.com/allowed-slash/", True), ("http://foo.com/allowed-slash/index.htm", False),
    ("http://foo.com/allowed-slash/index.html", True), ("http://foo.com/anyother-url", False)]))
add(_cases("index-htm", "User-Agent: *\nAllow: /a/index.htm\nDisallow: /\n", "foobot",
           [("http://foo.com/a/", True), ("http://foo.com/a/x", False)]))
add(_cases("index-disallow-not-widened", "User-Agent: *\nDisallow: /a/index.html\n", "foobot",
           [("http://foo.com/a/", True), ("http://foo.com/a/index.html", False)]))

# --- Google: a line keeps at most 2083 * 8 - 1 bytes
_MAX_LINE = 2083 * 8
_long = "/x/" + "a" * (_MAX_LINE - 3 - len("disallow: ") + 1 - 3)
LONG_DISALLOW = f"user-agent: FooBot\ndisallow: {_long}/qux\n"
add(_cases("long-line-disallow", LONG_DISALLOW, "FooBot", [(B + "/fux", True), (B + _long + "/fux", False)]))
_long_a = "/x/" + "a" * (_MAX_LINE - 3 - len("allow: ") + 1 - 3)
_long_b = "/x/" + "b" * (_MAX_LINE - 3 - len("allow: ") + 1 - 3)
LONG_ALLOW = f"user-agent: FooBot\ndisallow: /\nallow: {_long_a}/qux\nallow: {_long_b}/qux\n"
add(_cases("long-line-allow", LONG_ALLOW, "FooBot",
           [(B + "/", False), (B + _long_a + "/qux", True), (B + _long_b + "/fux", True)]))

# --- Google's documentation: matching on path values
def _doc(name: str, rule: str, expected: list[tuple[str, bool]]) -> None:
    add(_cases(name, f"user-agent: FooBot\ndisallow: /\nallow: {rule}\n", "FooBot",
               [(B + path, ok) for path, ok in expected]))


_FISH = [("/bar", False), ("/fish", True), ("/fish.html", True), ("/fish/salmon.html", True),
         ("/fishheads", True), ("/fishheads/yummy.html", True), ("/fish.html?id=anything", True),
         ("/Fish.asp", False), ("/catfish", False), ("/?id=fish", False)]
_doc("doc-fish", "/fish", _FISH)
_doc("doc-fish-star", "/fish*", _FISH)
_doc("doc-fish-slash", "/fish/", [
    ("/bar", False), ("/fish/", True), ("/fish/salmon", True), ("/fish/?salmon", True),
    ("/fish/salmon.html", True), ("/fish/?id=anything", True), ("/fish", False), ("/fish.html", False),
    ("/Fish/Salmon.html", False)])
_doc("doc-php", "/*.php", [
    ("/bar", False), ("/filename.php", True), ("/folder/filename.php", True),
    ("/folder/filename.php?parameters", True), ("//folder/any.php.file.html", True), ("/filename.php/", True),
    ("/index?f=filename.php/", True), ("/php/", False), ("/index?php", False), ("/windows.PHP", False)])
_doc("doc-php-dollar", "/*.php$", [
    ("/bar", False), ("/filename.php", True), ("/folder/filename.php", True),
    ("/filename.php?parameters", False), ("/filename.php/", False), ("/filename.php5", False),
    ("/php/", False), ("/filename?php", False), ("/aaaphpaaa", False), ("//windows.PHP", False)])
_doc("doc-fish-star-php", "/fish*.php", [
    ("/bar", False), ("/fish.php", True), ("/fishheads/catfish.php?parameters", True), ("/Fish.PHP", False)])
add(_cases("doc-order-1", "user-agent: FooBot\nallow: /p\ndisallow: /\n", "FooBot",
           [("http://example.com/page", True)]))
add(_cases("doc-order-2", "user-agent: FooBot\nallow: /folder\ndisallow: /folder\n", "FooBot",
           [("http://example.com/folder/page", True)]))
add(_cases("doc-order-3", "user-agent: FooBot\nallow: /page\ndisallow: /*.htm\n", "FooBot",
           [("http://example.com/page.htm", False)]))
add(_cases("doc-order-4", "user-agent: FooBot\nallow: /$\ndisallow: /\n", "FooBot",
           [("http://example.com/", True), ("http://example.com/page.html", False)]))

# --- line ends and byte order marks
for label, sep in (("unix", "\n"), ("dos", "\r\n"), ("mac", "\r")):
    text = sep.join(["User-Agent: foo", "Allow: /some/path", "User-Agent: bar", "", "", "Disallow: /"])
    add(_cases(f"line-ends-{label}-foo", text, "foo", [(B + "/some/path", True)]))
    add(_cases(f"line-ends-{label}-bar", text, "bar", [(B + "/x", False)]))
MIXED = "User-Agent: foo\nAllow: /some/path\r\nUser-Agent: bar\n\r\n\nDisallow: /"
add(_cases("line-ends-mixed", MIXED, "bar", [(B + "/x", False)]))
for label, prefix, applies in (
    ("full", b"\xef\xbb\xbf", True), ("partial-2", b"\xef\xbb", True), ("partial-1", b"\xef", True),
    ("broken", b"\xef\x11\xbf", False),
):
    text = prefix + b"User-Agent: foo\nDisallow: /AnyValue\n"
    add(_cases(f"bom-{label}", text, "foo", [(B + "/AnyValue", not applies)]))
add(_cases("bom-in-the-middle", b"User-Agent: foo\n\xef\xbb\xbfDisallow: /AnyValue\n", "foo",
           [(B + "/AnyValue", True)]))

# --- Google's misspellings and key prefixes
add(_cases("typo-useragent", "useragent: FooBot\ndisalow: /\n", "FooBot", [(B + "/a", False)]))
add(_cases("typo-user-agent-space", "user agent: FooBot\ndissallow: /\n", "FooBot", [(B + "/a", False)]))
add(_cases("typo-others", "user-agent: FooBot\ndissalow: /a\ndiasllow: /b\ndisallaw: /c\n", "FooBot",
           [(B + "/a", False), (B + "/b", False), (B + "/c", False), (B + "/d", True)]))

# --- RFC 9309 section 5.1 (simple example) and 5.2 (longest match)
RFC_SIMPLE = (
    "User-Agent: *\nDisallow: *.gif$\nDisallow: /example/\nAllow: /publications/\n\n"
    "User-Agent: foobot\nDisallow:/\nAllow:/example/page.html\nAllow:/example/allowed.gif\n\n"
    "User-Agent: barbot\nUser-Agent: bazbot\nDisallow: /example/page.html\n\n"
    "User-Agent: quxbot\n\nEOF\n"
)
E = "https://www.example.com"
add(_cases("rfc-5.1-foobot", RFC_SIMPLE, "foobot", [
    (E + "/example/page.html", True), (E + "/example/allowed.gif", True), (E + "/example/other.html", False),
    (E + "/", False)]))
add(_cases("rfc-5.1-barbot", RFC_SIMPLE, "barbot", [
    (E + "/example/page.html", False), (E + "/example/other.html", True), (E + "/x.gif", True)]))
add(_cases("rfc-5.1-bazbot", RFC_SIMPLE, "bazbot", [(E + "/example/page.html", False)]))
add(_cases("rfc-5.1-quxbot", RFC_SIMPLE, "quxbot", [(E + "/example/page.html", True), (E + "/a.gif", True)]))
add(_cases("rfc-5.1-other", RFC_SIMPLE, "otherbot", [
    (E + "/a.gif", False), (E + "/example/x", False), (E + "/publications/x", True), (E + "/other", True)]))
RFC_LONGEST = "User-Agent: foobot\nAllow: /example/page/\nDisallow: /example/page/disallowed.gif\n"
add(_cases("rfc-5.2", RFC_LONGEST, "foobot", [
    (E + "/example/page/", True), (E + "/example/page/disallowed.gif", False), (E + "/example/page/x", True)]))
