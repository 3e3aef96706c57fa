"""robots.txt per RFC 9309, read exactly as Google's open-source reference parser reads it; the matcher;
and what a fetch outcome means.

Pure: no I/O and no clock; the engine fetches /robots.txt (following up to five redirects), then hands
the status and body to `decide` together with the current time.

Reading the file (byte for byte the reference's rules):
- Only the first `MAX_ROBOTS_BYTES` are read (the RFC asks for at least 500 KiB). A UTF-8 byte order mark,
  or any leading part of one, is skipped at the very start. CR, LF and CRLF end lines; a line keeps at most
  `MAX_LINE_BYTES` bytes and the rest of it is dropped (the rule is cut, not thrown away).
- "#" starts a comment. A line is "key: value"; without a colon, "key value" is accepted when the line is
  exactly two words. Keys are recognised by their beginning, case-insensitively, with the reference's list of
  common misspellings ("useragent", "user agent", "disalow", ...), so "Disallowed:" is a Disallow line.
- Consecutive user-agent lines open one group; an Allow or Disallow line ends the run of user-agent lines,
  any other line (Sitemap, Crawl-delay, unknown keys) does not. Rules before any user-agent line are ignored.
- A user-agent value names the product token made of its leading letters, "-" and "_" ("Foo Bar" and
  "FooBot/2.1" name "foo" and "foobot"); "*", alone or followed by a space, names the global group.

Matching (RFC 9309 section 2.2):
- The agent given to `can_fetch` is a product token ("FooBot"), compared case-insensitively with the tokens
  the file names; every group naming it is merged; the "*" group applies only when none names it. The
  crawler passes `product_token(its User-Agent)`.
- Patterns are put in the reference's normal form: bytes outside US-ASCII are percent-encoded and the hex
  digits of existing escapes are upper-cased. Then, on both sides (RFC 9309 2.2.2), an escaped unreserved
  character (letters, digits, "-", ".", "_", "~") is the character itself, so "/%7Efoo" and "/~foo" match each
  other; other escapes stay as they are ("%2F" is not "/"). In a pattern, "%2A" and "%24" are a literal "*"
  and "$", neither a wildcard nor an end anchor (RFC 9309 2.2.3). Otherwise the path is matched as given: the
  crawler's URLs are already in normal form (`peer.crawl.urls`).
- The longest matching pattern (in octets of what is matched, "*" and "$" counted) wins and Allow wins a
  tie; an empty pattern never decides. "*" matches any run of characters, "$" at the end anchors. An Allow
  pattern whose last segment starts with "index.htm" also allows its directory exactly ("Allow:
  /a/index.html" allows "/a/").
- /robots.txt itself is always allowed.

Patterns are matched with a linear left-to-right scan of their literal pieces, never with a regex, so a
hostile file full of stars cannot make matching slow.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar, Literal

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_ROBOTS_BYTES",
    "MAX_ROBOTS_REDIRECTS",
    "ROBOTS_CACHE_SECONDS",
    "ROBOTS_RETRY_SECONDS",
    "RobotsDecision",
    "RobotsTxt",
    "can_fetch",
    "decide",
    "decode_unreserved",
    "escape_pattern",
    "parse",
    "path_params_query",
    "product_token",
]

MAX_ROBOTS_BYTES = 512 * 1024  # RFC 9309 2.5: parse at least 500 KiB
MAX_LINE_BYTES = 2083 * 8 - 1  # the reference keeps this much of a line (8 x the longest browser URL, less a NUL)
ROBOTS_CACHE_SECONDS = 24 * 3600.0  # RFC 9309 2.4: do not use a cached copy for more than 24 hours
MAX_ROBOTS_REDIRECTS = 5  # RFC 9309 2.3.1.2: follow at least five consecutive redirects
ROBOTS_RETRY_SECONDS = 600.0  # an unreachable robots.txt is asked again after ten minutes

_USER_AGENT_KEYS = (b"user-agent", b"useragent", b"user agent")
_ALLOW_KEYS = (b"allow",)
_DISALLOW_KEYS = (b"disallow", b"dissallow", b"dissalow", b"disalow", b"diasllow", b"disallaw")
_SITEMAP_KEYS = (b"sitemap", b"site-map")
_CRAWL_DELAY_KEYS = (b"crawl-delay", b"crawldelay", b"crawl delay")

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_AGENT_TOKEN = re.compile(rb"[A-Za-z_\-]*")
_DELAY = re.compile(rb"\d+(?:\.\d*)?|\.\d+")
_ESCAPE = re.compile(rb"%[0-9A-Fa-f]{2}|[\x80-\xff]")
_ASCII_SPACE = b" \t\n\r\x0b\x0c"
#: An escape of an unreserved character (RFC 3986 2.3: ALPHA, DIGIT, "-", ".", "_", "~"), either hex case.
_UNRESERVED_ESCAPE = re.compile(r"%(?:3[0-9]|[46][1-9A-Fa-f]|[57][0-9Aa]|2[DEde]|5[Ff]|7[Ee])")
_BOM = b"\xef\xbb\xbf"


def product_token(user_agent: str) -> str:
    """Our product token: the first word of the User-Agent before "/", lower-cased ("FooBot/1.0" -> "foobot")."""
    words = user_agent.split()
    return words[0].split("/", 1)[0].lower() if words else ""


def _escape_one(m: re.Match[bytes]) -> bytes:
    s = m.group(0)
    return s.upper() if len(s) == 3 else b"%%%02X" % s[0]


def escape_pattern(pattern: bytes | str) -> str:
    """The reference's normal form of a rule: non-ASCII octets percent-encoded, escapes' hex upper-cased.

    "/SanJoséSellers" -> "/SanJos%C3%A9Sellers", "%aa" -> "%AA"; nothing is decoded.
    """
    raw = pattern.encode("utf-8", "surrogateescape") if isinstance(pattern, str) else pattern
    return _ESCAPE.sub(_escape_one, raw).decode("ascii")


def _decode_one(m: re.Match[str]) -> str:
    return chr(int(m.group(0)[1:], 16))


def decode_unreserved(text: str) -> str:
    """`text` with its escapes of unreserved characters decoded ("/%7Efoo" -> "/~foo"), once; other escapes kept."""
    return _UNRESERVED_ESCAPE.sub(_decode_one, text) if "%" in text else text


def path_params_query(url: str) -> str:
    """The part of `url` robots rules are matched against: path, params and query; no scheme, authority or
    fragment; always starting with "/", and "/" when there is none (the reference's GetPathParamsQuery)."""
    start = 2 if url.startswith("//") else 0
    early = _find_first(url, "/?;", start)
    proto = url.find("://", start)
    if proto < 0 or (early >= 0 and early < proto):
        proto_end = start
    else:
        proto_end = proto + 3
    path_start = _find_first(url, "/?;", proto_end)
    if path_start < 0:
        return "/"
    hash_at = url.find("#", start)
    if 0 <= hash_at < path_start:
        return "/"
    path = url[path_start : hash_at if hash_at >= 0 else len(url)]
    return path if path.startswith("/") else "/" + path


def _find_first(s: str, chars: str, start: int) -> int:
    found = [i for i in (s.find(c, start) for c in chars) if i >= 0]
    return min(found) if found else -1


class _Rule:
    """One Allow or Disallow line in normal form, pre-split for matching."""

    __slots__ = ("allow", "length", "pieces", "anchored")

    def __init__(self, pattern: str, allow: bool) -> None:
        self.allow = allow
        pattern = decode_unreserved(pattern)
        # "most octets" (RFC 9309 2.2.2) of what is matched: an escaped "*" or "$" is one
        self.length = len(pattern) - 2 * (pattern.count("%2A") + pattern.count("%24"))
        self.anchored = pattern.endswith("$")
        body = pattern[:-1] if self.anchored else pattern
        # "*" splits the pieces and "$" anchors; "%2A" and "%24" are the literal characters within a piece
        self.pieces = [piece.replace("%2A", "*").replace("%24", "$") if "%" in piece else piece
                       for piece in body.split("*")]

    def matches(self, path: str) -> bool:
        pieces = self.pieces
        first = pieces[0]
        if len(pieces) == 1:
            return path == first if self.anchored else path.startswith(first)
        if not path.startswith(first):
            return False
        pos = len(first)
        last = len(pieces) - 1
        for i in range(1, last):
            piece = pieces[i]
            if piece:
                found = path.find(piece, pos)
                if found < 0:
                    return False
                pos = found + len(piece)
        tail = pieces[last]
        if self.anchored:
            return len(path) - len(tail) >= pos and path.endswith(tail)
        return not tail or path.find(tail, pos) >= 0


class _Group:
    __slots__ = ("rules", "crawl_delay")

    def __init__(self) -> None:
        self.rules: list[_Rule] = []
        self.crawl_delay: float | None = None


class RobotsTxt:
    """A parsed robots.txt; `can_fetch` answers for one product token and one request target."""

    ALLOW_ALL: ClassVar[RobotsTxt]
    DISALLOW_ALL: ClassVar[RobotsTxt]

    __slots__ = ("_groups", "_global", "_disallow_all", "_selected", "sitemaps")

    def __init__(
        self,
        groups: dict[str, _Group] | None = None,
        global_group: _Group | None = None,
        sitemaps: tuple[str, ...] = (),
        *,
        disallow_all: bool = False,
    ) -> None:
        self._groups = groups or {}
        self._global = global_group
        self._disallow_all = disallow_all
        self._selected: dict[str, tuple[list[_Rule], float | None]] = {}
        self.sitemaps = sitemaps

    def _select(self, agent: str) -> tuple[list[_Rule], float | None]:
        token = agent.lower()
        cached = self._selected.get(token)
        if cached is not None:
            return cached
        group = self._groups.get(token)
        if group is None:
            group = self._global
        if group is None:
            selected: tuple[list[_Rule], float | None] = ([], None)
        else:
            # Longest pattern first, Allow before Disallow on equal length: the first match decides.
            rules = sorted(group.rules, key=lambda r: (-r.length, not r.allow))
            selected = (rules, group.crawl_delay)
        if len(self._selected) < 64:
            self._selected[token] = selected
        return selected

    def can_fetch(self, agent: str, path_and_query: str) -> bool:
        """True if the product token `agent` may fetch `path_and_query` (the "/path?query" of a URL in normal
        form; see the module notes)."""
        target = decode_unreserved(path_and_query) if path_and_query else "/"
        if target == "/robots.txt" or target.startswith("/robots.txt?"):
            return True
        if self._disallow_all:
            return False
        for rule in self._select(agent)[0]:
            if rule.matches(target):
                return rule.allow
        return True

    def crawl_delay(self, agent: str) -> float | None:
        """Seconds between requests asked of the product token `agent`, or None if the file names none."""
        return self._select(agent)[1]

    def __repr__(self) -> str:
        if self is RobotsTxt.DISALLOW_ALL:
            return "RobotsTxt.DISALLOW_ALL"
        if self is RobotsTxt.ALLOW_ALL:
            return "RobotsTxt.ALLOW_ALL"
        return f"RobotsTxt(agents={sorted(self._groups)}, global={self._global is not None})"


RobotsTxt.ALLOW_ALL = RobotsTxt()
RobotsTxt.DISALLOW_ALL = RobotsTxt(disallow_all=True)


def _split_line(line: bytes) -> tuple[bytes, bytes] | None:
    """(lower-cased key, value) of one line, or None when it holds no record."""
    hash_at = line.find(b"#")
    if hash_at >= 0:
        line = line[:hash_at]
    line = line.strip(_ASCII_SPACE)
    colon = line.find(b":")
    if colon >= 0:
        key, value = line[:colon], line[colon + 1 :]
    else:
        # "Disallow /x": accepted when the line is exactly two runs of non-blanks separated by blanks.
        parts = line.replace(b"\t", b" ").split(b" ")
        words = [p for p in parts if p]
        if len(words) != 2:
            return None
        key, value = words
    key = key.strip(_ASCII_SPACE)
    if not key:
        return None
    return key.lower(), value.strip(_ASCII_SPACE)


def _agent_of(value: bytes) -> str:
    """The product token a user-agent line names: "*" for the global group (possibly "")."""
    if value[:1] == b"*" and (len(value) == 1 or value[1:2] in (b" ", b"\t", b"\n", b"\r", b"\x0b", b"\x0c")):
        return "*"
    m = _AGENT_TOKEN.match(value)
    return m.group(0).decode("ascii").lower() if m else ""


def _parse_delay(value: bytes) -> float | None:
    m = _DELAY.match(value)
    if m is None:
        return None
    delay = float(m.group(0))
    return delay if math.isfinite(delay) else None


def _lines(data: bytes) -> list[bytes]:
    bom = 0
    while bom < len(_BOM) and bom < len(data) and data[bom] == _BOM[bom]:
        bom += 1
    return [line[:MAX_LINE_BYTES] for line in _LINE_BREAK.split(data[bom:])]


def parse(text: str | bytes) -> RobotsTxt:
    """Parse a robots.txt body (text is read as its UTF-8 bytes); never raises on content."""
    if isinstance(text, str):
        data = text.encode("utf-8", "surrogateescape")[:MAX_ROBOTS_BYTES]
    else:
        data = bytes(text[:MAX_ROBOTS_BYTES])

    groups: dict[str, _Group] = {}
    global_group: _Group | None = None
    sitemaps: dict[str, None] = {}
    current: list[_Group] = []  # the groups the lines being read belong to
    in_agent_lines = False  # True while reading consecutive user-agent lines

    for line in _lines(data):
        split = _split_line(line)
        if split is None:
            continue
        key, value = split
        if key.startswith(_USER_AGENT_KEYS):
            if not in_agent_lines:
                current = []
                in_agent_lines = True
            agent = _agent_of(value)
            if agent == "*":
                if global_group is None:
                    global_group = _Group()
                group = global_group
            else:
                group = groups.setdefault(agent, _Group())
            if all(g is not group for g in current):
                current.append(group)
        elif key.startswith(_ALLOW_KEYS) or key.startswith(_DISALLOW_KEYS):
            if not current:
                continue  # a rule before any user-agent line belongs to no group
            in_agent_lines = False
            allow = key.startswith(_ALLOW_KEYS)
            pattern = escape_pattern(value)
            if not pattern:
                continue  # an empty pattern matches with no weight: it never decides
            rules = [_Rule(pattern, allow)]
            if allow:
                slash = pattern.rfind("/")
                if slash >= 0 and pattern.startswith("/index.htm", slash):
                    rules.append(_Rule(pattern[: slash + 1] + "$", True))  # "index.htm[l]" is its directory
            for group in current:
                group.rules.extend(rules)
        elif key.startswith(_SITEMAP_KEYS):
            if value:
                sitemaps[value.decode("utf-8", "replace")] = None
        elif key.startswith(_CRAWL_DELAY_KEYS):
            delay = _parse_delay(value)
            if delay is None:
                continue
            for group in current:
                # Several Crawl-delay lines for one agent: the slowest is the polite reading.
                if group.crawl_delay is None or delay > group.crawl_delay:
                    group.crawl_delay = delay
        # Any other line is ignored; like Crawl-delay and Sitemap it does not end a run of user-agent lines.

    if not groups and global_group is None:
        return RobotsTxt(sitemaps=tuple(sitemaps)) if sitemaps else RobotsTxt.ALLOW_ALL
    return RobotsTxt(groups, global_group, tuple(sitemaps))


def can_fetch(robots_txt: str | bytes, agent: str, url: str) -> bool:
    """May the product token `agent` fetch `url` under the robots.txt `robots_txt`? The URL is used as given
    (its path, params and query), the way the reference's OneAgentAllowedByRobots reads it."""
    return parse(robots_txt).can_fetch(agent, path_params_query(url))


@dataclass(frozen=True, slots=True, kw_only=True)
class RobotsDecision:
    """What a robots.txt fetch means for the host, and until when it holds."""

    robots: RobotsTxt
    expires_at: float
    kind: Literal["parsed", "allow-all", "disallow-all-retry"]


def decide(
    status: int | None, body: bytes | None, *, now: float, redirects_followed: int = 0
) -> RobotsDecision:
    """Turn the outcome of fetching /robots.txt into rules and an expiry time (RFC 9309 section 2.3.1).

    - more than `MAX_ROBOTS_REDIRECTS` redirects followed, whatever the final status: unavailable
      (RFC 2.3.1.2), allow all for 24 hours.
    - 2xx: parse the body; valid for 24 hours.
    - 3xx: the engine follows up to five redirects; a redirect it did not follow (the limit reached, or
      no usable Location) means "unavailable" (RFC 2.3.1.2): allow all, for 24 hours.
    - 429: "Too Many Requests" is the server asking us to slow down, so it is read like a 5xx (as Google
      does), not like other 4xx: disallow all and ask again later.
    - other 4xx: unavailable, so allow all (RFC 2.3.1.3), for 24 hours.
    - 5xx, a network error (status None) or a nonsensical status: unreachable, so disallow all and ask
      again after ten minutes (RFC 2.3.1.4). The RFC lets a crawler treat a robots.txt unreachable for 30
      days as unavailable; we do not: a server that has failed for a month has nothing to crawl, and
      staying disallowed can never break a site's rules.
    """
    if redirects_followed > MAX_ROBOTS_REDIRECTS:
        return RobotsDecision(
            robots=RobotsTxt.ALLOW_ALL, expires_at=now + ROBOTS_CACHE_SECONDS, kind="allow-all"
        )
    if status is not None and 200 <= status < 300:
        return RobotsDecision(
            robots=parse(body or b""), expires_at=now + ROBOTS_CACHE_SECONDS, kind="parsed"
        )
    if status is not None and (300 <= status < 400 or (400 <= status < 500 and status != 429)):
        return RobotsDecision(
            robots=RobotsTxt.ALLOW_ALL, expires_at=now + ROBOTS_CACHE_SECONDS, kind="allow-all"
        )
    return RobotsDecision(
        robots=RobotsTxt.DISALLOW_ALL, expires_at=now + ROBOTS_RETRY_SECONDS, kind="disallow-all-retry"
    )
