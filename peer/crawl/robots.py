"""robots.txt per RFC 9309: a tolerant parser, the matcher, and what a fetch outcome means.

Pure: no I/O and no clock; the engine fetches /robots.txt (following up to five redirects), then hands
the status and body to `decide` together with the current time.

Parsing is tolerant the way large crawlers are, because real files are messy: a UTF-8 BOM, CR, LF or CRLF
line ends, comments, a missing colon ("Disallow /x"), common misspellings ("useragent", "disalow"), rules
before any user-agent line (ignored), blank lines inside a group (harmless), and anything else is skipped.
Only the first `MAX_ROBOTS_BYTES` are read (the RFC asks for at least 500 KiB).

Matching (RFC 9309 section 2.2): consecutive user-agent lines share one group and every group naming our
product token is merged; the "*" group applies only when none names us. Our product token is the first
word of our User-Agent before "/", compared case-insensitively with the part of each user-agent value made
of letters, "-" and "_". The longest matching pattern wins and Allow wins a tie; "*" matches any run of
characters, "$" at the end anchors. Both sides are put into the same percent-encoding normal form as
`peer.crawl.urls` (unreserved characters decoded, hex upper-cased, non-ASCII escaped as UTF-8), so "/%7Efoo" and
"/~foo" are one path. /robots.txt itself is always allowed.

Patterns are matched with a linear left-to-right scan of their literal pieces, never with a regex, so a
hostile file full of stars cannot make matching slow.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar, Literal

from peer.crawl.urls import normalize, normalize_path_query, normalize_percent

__all__ = [
    "MAX_ROBOTS_BYTES",
    "MAX_ROBOTS_REDIRECTS",
    "ROBOTS_CACHE_SECONDS",
    "ROBOTS_RETRY_SECONDS",
    "RobotsDecision",
    "RobotsTxt",
    "can_fetch",
    "decide",
    "parse",
    "product_token",
]

MAX_ROBOTS_BYTES = 512 * 1024  # RFC 9309 2.5: parse at least 500 KiB
ROBOTS_CACHE_SECONDS = 24 * 3600.0  # RFC 9309 2.4: do not use a cached copy for more than 24 hours
MAX_ROBOTS_REDIRECTS = 5  # RFC 9309 2.3.1.2: follow at least five consecutive redirects
ROBOTS_RETRY_SECONDS = 600.0  # an unreachable robots.txt is asked again after ten minutes

_USER_AGENT_KEYS = frozenset({"user-agent", "useragent", "user agent"})
_ALLOW_KEYS = frozenset({"allow"})
_DISALLOW_KEYS = frozenset({"disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw"})
_CRAWL_DELAY_KEYS = frozenset({"crawl-delay", "crawldelay", "crawl delay"})
_SITEMAP_KEYS = frozenset({"sitemap", "site-map"})

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_AGENT_TOKEN = re.compile(r"[A-Za-z_\-]+")
_DELAY = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def product_token(user_agent: str) -> str:
    """Our product token: the first word of the User-Agent before "/", lower-cased ("FooBot/1.0" -> "foobot")."""
    words = user_agent.split()
    return words[0].split("/", 1)[0].lower() if words else ""


class _Rule:
    """One Allow or Disallow line, pre-split for matching."""

    __slots__ = ("allow", "length", "pieces", "anchored")

    def __init__(self, pattern: str, allow: bool) -> None:
        self.allow = allow
        self.anchored = pattern.endswith("$")
        body = pattern[:-1] if self.anchored else pattern
        # Percent-normalize each literal piece on its own so "*" keeps its meaning.
        pieces = [normalize_percent(p) for p in body.split("*")]
        if pieces[0] and not pieces[0].startswith("/"):
            pieces[0] = "/" + pieces[0]  # "Disallow: private" reads as meant: "/private"
        self.pieces = pieces
        # "Most octets" (RFC 9309 2.2.2), counted on the normalized pattern so spellings do not matter.
        self.length = sum(map(len, pieces)) + len(pieces) - 1 + self.anchored

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
    """A parsed robots.txt; `can_fetch` answers for one user agent and one request target."""

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

    def _select(self, user_agent: str) -> tuple[list[_Rule], float | None]:
        token = product_token(user_agent)
        cached = self._selected.get(token)
        if cached is not None:
            return cached
        group = self._groups.get(token) if token else None
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

    def can_fetch(self, user_agent: str, path_and_query: str) -> bool:
        """True if `user_agent` may fetch `path_and_query` (the "/path?query" part of a URL)."""
        target = normalize_path_query(path_and_query or "/")
        if target == "/robots.txt" or target.startswith("/robots.txt?"):
            return True
        if self._disallow_all:
            return False
        for rule in self._select(user_agent)[0]:
            if rule.matches(target):
                return rule.allow
        return True

    def crawl_delay(self, user_agent: str) -> float | None:
        """Seconds between requests asked of `user_agent`, or None if the file names none."""
        return self._select(user_agent)[1]

    def __repr__(self) -> str:
        if self is RobotsTxt.DISALLOW_ALL:
            return "RobotsTxt.DISALLOW_ALL"
        if self is RobotsTxt.ALLOW_ALL:
            return "RobotsTxt.ALLOW_ALL"
        return f"RobotsTxt(agents={sorted(self._groups)}, global={self._global is not None})"


RobotsTxt.ALLOW_ALL = RobotsTxt()
RobotsTxt.DISALLOW_ALL = RobotsTxt(disallow_all=True)


def _split_line(line: str) -> tuple[str, str] | None:
    hash_at = line.find("#")
    if hash_at >= 0:
        line = line[:hash_at]
    line = line.strip()
    if not line:
        return None
    key, colon, value = line.partition(":")
    if not colon:
        # "Disallow /x": accepted when the line is exactly a key and a value.
        parts = line.split()
        if len(parts) != 2:
            return None
        key, value = parts
    return " ".join(key.split()).lower(), value.strip()


def _agent_of(value: str) -> str | None:
    """The product token a user-agent line names: "*" for the global group, None if it names nothing."""
    if value.startswith("*") and (len(value) == 1 or value[1].isspace()):
        return "*"
    m = _AGENT_TOKEN.match(value)
    return m.group(0).lower() if m else None


def _parse_delay(value: str) -> float | None:
    m = _DELAY.match(value)
    if m is None:
        return None
    delay = float(m.group(0))
    return delay if math.isfinite(delay) else None


def parse(text: str | bytes) -> RobotsTxt:
    """Parse a robots.txt body (bytes are read as UTF-8, bad bytes replaced); never raises on content."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text[:MAX_ROBOTS_BYTES])
        text = data.decode("utf-8", "replace")
    else:
        text = text[:MAX_ROBOTS_BYTES]
    if text.startswith("\ufeff"):
        text = text[1:]

    groups: dict[str, _Group] = {}
    global_group: _Group | None = None
    sitemaps: dict[str, None] = {}
    current: list[_Group] = []  # the groups the lines being read belong to
    in_agent_lines = False  # True while reading consecutive user-agent lines

    for line in _LINE_BREAK.split(text):
        split = _split_line(line)
        if split is None:
            continue
        key, value = split
        if key in _USER_AGENT_KEYS:
            if not in_agent_lines:
                current = []
                in_agent_lines = True
            agent = _agent_of(value)
            if agent == "*":
                if global_group is None:
                    global_group = _Group()
                group = global_group
            elif agent is not None:
                group = groups.setdefault(agent, _Group())
            else:
                continue
            if all(g is not group for g in current):
                current.append(group)
        elif key in _ALLOW_KEYS or key in _DISALLOW_KEYS:
            in_agent_lines = False
            if not value:
                continue  # "Disallow:" with nothing after it allows everything: no rule
            for group in current:
                group.rules.append(_Rule(value, key in _ALLOW_KEYS))
        elif key in _CRAWL_DELAY_KEYS:
            in_agent_lines = False
            delay = _parse_delay(value)
            if delay is None:
                continue
            for group in current:
                # Several Crawl-delay lines for one agent: the slowest is the polite reading.
                if group.crawl_delay is None or delay > group.crawl_delay:
                    group.crawl_delay = delay
        elif key in _SITEMAP_KEYS:
            if value:
                sitemaps[value] = None
        # Any other line is ignored and does not end a run of user-agent lines.

    if not groups and global_group is None:
        return RobotsTxt(sitemaps=tuple(sitemaps)) if sitemaps else RobotsTxt.ALLOW_ALL
    return RobotsTxt(groups, global_group, tuple(sitemaps))


def can_fetch(robots_txt: str, user_agent: str, url: str) -> bool:
    """May `user_agent` fetch `url` under the robots.txt text `robots_txt`? (For tests and tools.)"""
    target = url
    normal = normalize(url)
    if normal is not None:
        rest = normal.partition("://")[2]
        target = rest[rest.find("/") :]
    return parse(robots_txt).can_fetch(user_agent, target)


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
