"""URL normalization, resolution against a base, and the partition key.

Every URL the crawler stores, routes or deduplicates goes through `normalize`, so two spellings of one
resource become one string: the dedup store and the ring (which partitions by `host_of`) both depend on
it. It runs once per link on every page, so it is written for speed: `urllib.parse.urljoin` plus a
normalization pass costs several microseconds per link, while here an ordinary link takes one regex match,
a cached authority and a character-class check. Resolution follows RFC 3986 section 5.2 with the browser
habits that real pages rely on (backslashes as slashes, tabs and newlines dropped, "http:path" relative to
an http base).

`Scope` decides which normalized URLs the crawl may visit (host patterns, binary suffixes, depth and trap
guards); it lives here because it reads URLs in exactly the form `normalize` writes them.

Choices: only http and https; credentials ("user:pass@") are dropped because a crawler never sends them;
an empty query ("?") is dropped; a host's trailing dot is dropped; inputs longer than four times the
length limit are refused without being parsed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import unquote

import idna

from peer.config import DEFAULTS

__all__ = [
    "DEFAULT_BINARY_SUFFIXES",
    "Scope",
    "DEFAULT_MAX_URL_LENGTH",
    "host_of",
    "host_of_normalized",
    "normalize",
    "normalize_all",
    "normalize_path_query",
    "normalize_percent",
    "origin_of",
    "origin_of_normalized",
    "path_and_query_of",
]

DEFAULT_MAX_URL_LENGTH: int = DEFAULTS["max_url_length"]  # the setting's default (peer.config): traps, junk

_DEFAULT_PORTS = {"http": "80", "https": "443"}
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

# RFC 3986 appendix B, without the fragment (it is cut off before matching).
_SPLIT = re.compile(r"(?:([A-Za-z][A-Za-z0-9+.\-]*):)?(?://([^/?]*))?([^?]*)(?:\?(.*))?", re.S)
# A path or query made only of characters that need no escaping and holding no "%": already normal.
_CLEAN = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?\[\]]*")
# Pieces the slow path rewrites: a percent escape, a lone "%", or a run of characters to escape.
_PCT_PIECE = re.compile(r"%([0-9A-Fa-f]{2})|%|[^A-Za-z0-9\-._~!$&'()*+,;=:@/?\[\]%]+")
_ASCII_HOST = re.compile(r"[a-z0-9_\-.]+")
_PORT = re.compile(r"[0-9]*")
_STRIP = "".join(chr(c) for c in range(0x21))
_TAB_NEWLINE = re.compile(r"[\t\n\r]")
# An absolute http(s) URL of a lower-case host and a path (and query) in normal form: group 1 is the scheme and
# authority, group 2 the path and query (empty for none).
_SIMPLE_ABSOLUTE = re.compile(
    r"(https?://[a-z0-9.\-]+(?::[0-9]+)?)((?:/[A-Za-z0-9\-._~!$&'()*+,;=@/]*(?:\?[A-Za-z0-9\-._~!$&'()*+,;=:@/?\[\]]+)?)?)"
)
# A reference that resolves by concatenation: an absolute path ("/a/b", not "//host") or a relative one (not
# starting with ".", "/" or "?"), of characters that need no escaping and no ":" (which could start a scheme),
# with an optional non-empty query; "/." (dot segments) is checked apart.
_SIMPLE_REF = re.compile(r"(?:/(?!/)|(?![./?]))[A-Za-z0-9\-._~!$&'()*+,;=@/]*(?:\?[A-Za-z0-9\-._~!$&'()*+,;=:@/?\[\]]+)?")


class _Base(NamedTuple):
    scheme: str
    hostport: str
    path: str
    query: str | None
    directory: str  # the path up to and including its last "/"
    origin: str  # "scheme://host[:port]"


def _pct_piece(m: re.Match[str]) -> str:
    hex_digits = m.group(1)
    if hex_digits is not None:
        ch = chr(int(hex_digits, 16))
        return ch if ch in _UNRESERVED else "%" + hex_digits.upper()
    text = m.group(0)
    if text == "%":
        return "%25"
    return "".join(["%%%02X" % b for b in text.encode("utf-8", "surrogatepass")])


def _pct(text: str) -> str:
    """Percent-encoding normal form: unreserved decoded, hex upper-cased, the rest escaped as UTF-8."""
    if "%" not in text and _CLEAN.fullmatch(text):
        return text
    return _PCT_PIECE.sub(_pct_piece, text)


def _remove_dots(path: str) -> str:
    """RFC 3986 section 5.2.4 for an absolute path."""
    if "/." not in path:
        return path
    out: list[str] = []
    segments = path[1:].split("/")
    for seg in segments:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    if segments[-1] in (".", ".."):
        out.append("")
    return "/" + "/".join(out)


def _path(path: str) -> str:
    if not path:
        return "/"
    if path[0] != "/":
        path = "/" + path
    if "%" not in path and "/." not in path and _CLEAN.fullmatch(path):
        return path
    return _remove_dots(_pct(path))


def _query(query: str | None) -> str:
    if not query:
        return ""
    return "?" + _pct(query)


@lru_cache(maxsize=8192)
def _host(host: str) -> str | None:
    if "%" in host:
        try:
            host = _unquote_host(host)
        except UnicodeDecodeError:
            return None
    if host.startswith("["):
        if not host.endswith("]"):
            return None
        try:
            address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
        # A zone ("fe80::1%eth0", RFC 6874) names an interface of the client, not a host of the web, and may hold
        # any character but "%" ("?", "/", " "): the URL it made would not read back as itself.
        return None if address.scope_id is not None else "[" + address.compressed + "]"
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    try:
        if not host.isascii():
            host = idna.encode(host, uts46=True).decode("ascii")
        elif "xn--" in host:
            idna.decode(host)  # an A-label must decode, or the host is not valid
    except (idna.IDNAError, UnicodeError, ValueError):
        return None
    if not host or len(host) > 253 or not _ASCII_HOST.fullmatch(host):
        return None
    for label in host.split("."):
        # no leading or trailing hyphen (RFC 952/1123): the wire protocol refuses such a host (protocol/_schema.py),
        # and a URL that is queued must be one its node can hand off, replicate and report
        if not label or len(label) > 63 or label[0] == "-" or label[-1] == "-":
            return None
    return host


def _unquote_host(host: str) -> str:
    return unquote(host, encoding="utf-8", errors="strict")


@lru_cache(maxsize=8192)
def _authority(authority: str, scheme: str) -> str | None:
    """Normalized "host[:port]" of an authority, or None when it is not a usable host."""
    at = authority.rfind("@")
    if at >= 0:
        authority = authority[at + 1 :]
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            return None
        host_part, rest = authority[: close + 1], authority[close + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:] if rest else ""
    else:
        host_part, _, port = authority.partition(":")
    if not _PORT.fullmatch(port):
        return None
    host = _host(host_part)
    if host is None:
        return None
    if port:
        port = port.lstrip("0") or "0"
        # the length first: int() refuses more than 4,300 digits (ValueError), and a link may hold 8,000
        if len(port) > 5 or int(port) > 65535 or port == "0":
            return None
        if port != _DEFAULT_PORTS[scheme]:
            return host + ":" + port
    return host


def _clean(ref: str) -> str:
    """Drop what browsers drop: surrounding controls and spaces, tabs and newlines, the fragment;
    read backslashes before the query as slashes."""
    ref = ref.strip(_STRIP)
    if "\t" in ref or "\n" in ref or "\r" in ref:
        ref = _TAB_NEWLINE.sub("", ref)
    hash_at = ref.find("#")
    if hash_at >= 0:
        ref = ref[:hash_at]
    if "\\" in ref:
        q = ref.find("?")
        if q < 0:
            ref = ref.replace("\\", "/")
        else:
            ref = ref[:q].replace("\\", "/") + ref[q:]
    return ref


def _resolve(ref: str, base: _Base | None, max_length: int) -> str | None:
    if len(ref) > 4 * max_length:
        return None
    if (
        not ref
        or ref[0] <= " "
        or ref[-1] <= " "
        or "#" in ref
        or "\\" in ref
        or "\n" in ref
        or "\t" in ref
        or "\r" in ref
    ):
        ref = _clean(ref)
    if ref[:1] == "/" and ref[1:2] != "/":
        # The common case on real pages: an absolute path on the page's own host.
        if base is None:
            return None
        prefix, tail = base.origin, ref
    elif ref.startswith("http://") or ref.startswith("https://"):
        # The next most common: an absolute URL in lower-case scheme.
        start = 7 if ref[4] == ":" else 8
        end = len(ref)
        for sep in "/?":
            i = ref.find(sep, start)
            if 0 <= i < end:
                end = i
        hostport = _authority(ref[start:end], ref[: start - 3])
        if hostport is None:
            return None
        prefix, tail = ref[:start] + hostport, ref[end:]
    elif ref and ":" not in ref and ref[0] != "?" and ref[0] != "/":
        # A relative path ("p/2.html", "../up"): with no ":" anywhere it has no scheme, and it starts with no
        # authority or query, so it is the base's directory followed by the reference (dot segments and an
        # empty query are normalized below, as for any other tail).
        if base is None:
            return None
        prefix, tail = base.origin, base.directory + ref
    else:
        m = _SPLIT.match(ref)
        assert m is not None  # every group is optional, so the pattern matches any string
        scheme, authority, path, query = m.groups()
        if scheme is not None:
            scheme = scheme.lower()
            if scheme != "http" and scheme != "https":
                return None
            if authority is None:
                # "http:page.html": relative to a base of the same scheme, as browsers read it.
                if base is None or base.scheme != scheme:
                    return None
                scheme = None
        if authority is not None:
            if scheme is None:
                if base is None:
                    return None
                scheme = base.scheme
            hostport = _authority(authority, scheme)
            if hostport is None:
                return None
            prefix = scheme + "://" + hostport
        else:
            if base is None:
                return None
            prefix = base.origin
            if not path:
                path = base.path
                if query is None:
                    query = base.query
            elif path[0] != "/":
                path = base.directory + path
        tail = path + "?" + query if query else path
    if (
        not tail
        or tail[0] != "/"
        or "%" in tail
        or "/." in tail
        or tail[-1] == "?"
        or not _CLEAN.fullmatch(tail)
    ):
        path, _, query = tail.partition("?")
        tail = _path(path) + _query(query)
    result = prefix + tail
    if len(result) > max_length:
        return None
    return result


@lru_cache(maxsize=8192)
def _simple_prefix(scheme_authority: str) -> str | None:
    """"scheme://host[:port]" normalized, of a `_SIMPLE_ABSOLUTE` match's first group; None if not a usable host."""
    scheme, _, authority = scheme_authority.partition("://")
    hostport = _authority(authority, scheme)
    return None if hostport is None else scheme + "://" + hostport


@lru_cache(maxsize=256)
def _parse_base(base: str) -> _Base | None:
    absolute = _resolve(base, None, 1 << 30)
    if absolute is None:
        return None
    scheme, _, rest = absolute.partition("://")
    cut = len(rest)
    for sep in "/?":
        i = rest.find(sep)
        if 0 <= i < cut:
            cut = i
    hostport, tail = rest[:cut], rest[cut:]
    path, sep, query = tail.partition("?")
    directory = path[: path.rfind("/") + 1]
    return _Base(scheme, hostport, path, query if sep else None, directory, scheme + "://" + hostport)


def normalize(url: str, base: str | None = None, *, max_length: int = DEFAULT_MAX_URL_LENGTH) -> str | None:
    """The absolute normal form of `url` (resolved against `base`), or None if it is not crawlable."""
    parsed_base = _parse_base(base) if base is not None else None
    return _resolve(url, parsed_base, max_length)


def normalize_all(
    hrefs: Iterable[str], base: str, *, max_length: int = DEFAULT_MAX_URL_LENGTH
) -> list[str]:
    """Normalize a page's hrefs against its base: unique results in first-seen order, failures dropped.

    Duplicate hrefs (a page links to its home page many times) are removed before resolution.
    """
    parsed_base = _parse_base(base)
    seen: dict[str, None] = {}
    origin, directory = (parsed_base.origin, parsed_base.directory) if parsed_base is not None else ("", "")
    simple = _SIMPLE_REF.fullmatch
    simple_absolute = _SIMPLE_ABSOLUTE.fullmatch
    page_itself: str | None = None
    for href in dict.fromkeys(hrefs):
        hash_at = href.find("#")
        if hash_at < 0:
            is_simple = simple(href) if origin and href else None
        else:
            # Most links of real pages carry a fragment ("#top", "os.html#os.walk"). Cut it first: when what is
            # left is in a shortcut's form (no space, control or backslash before the "#"), `_resolve` would cut
            # it to the same string and go on as below; anything else goes to `_resolve` whole, which cleans it.
            if len(href) > 4 * max_length:
                continue
            ref = href[:hash_at]
            if not ref:
                # "#x": the base itself (its path and query), the same for every such href of the page
                if page_itself is None:
                    page_itself = _resolve("", parsed_base, max_length) or ""
                if page_itself:
                    seen[page_itself] = None
                continue
            is_simple = simple(ref)  # one match serves both the cut and the shortcut below
            if is_simple or (ref[:4] == "http" and simple_absolute(ref)):
                href = ref
        if origin and is_simple and "/." not in href:
            # a path (and query) already in normal form: joined to the base as it stands, as _resolve would
            url = origin + href if href[0] == "/" else origin + directory + href
            if len(url) > max_length:
                continue
        elif href[:4] == "http" and (m := simple_absolute(href)) is not None and "/." not in href:
            # an absolute URL whose path is in normal form: only its authority needs normalizing (remembered)
            prefix = _simple_prefix(m.group(1))
            if prefix is None:
                continue
            url = prefix + (m.group(2) or "/")
            if len(url) > max_length:
                continue
        else:
            resolved = _resolve(href, parsed_base, max_length)
            if resolved is None:
                continue
            url = resolved
        seen[url] = None
    return list(seen)


def _split_normal(url: str) -> tuple[str, str, str]:
    """(scheme, host[:port], path?query) of `url`, normalizing it first; ValueError if it is not http(s)."""
    normal = normalize(url)
    if normal is None:
        raise ValueError(f"not a crawlable http(s) URL: {url[:200]!r}")
    scheme, _, rest = normal.partition("://")
    slash = rest.find("/")
    return scheme, rest[:slash], rest[slash:]


def host_of(url: str) -> str:
    """The partition key: lower-case IDNA host without port (IPv6 literals keep their brackets)."""
    _, hostport, _ = _split_normal(url)
    if hostport.startswith("["):
        return hostport[: hostport.index("]") + 1]
    return hostport.partition(":")[0]


def origin_of(url: str) -> str:
    """"scheme://host[:port]" (default port omitted): the key of robots.txt and connection pools."""
    scheme, hostport, _ = _split_normal(url)
    return scheme + "://" + hostport


def host_of_normalized(url: str) -> str:
    """``host_of`` for a URL that ``normalize`` already returned: a plain split, no re-normalizing (the
    crawler's hot path, where every URL it holds is normalized; about 0.3 µs instead of 3)."""
    start = url.index("://") + 3
    end = url.find("/", start)
    hostport = url[start:end] if end >= 0 else url[start:]
    if hostport.startswith("["):
        return hostport[: hostport.index("]") + 1]
    return hostport.partition(":")[0]


def origin_of_normalized(url: str) -> str:
    """``origin_of`` for a URL that ``normalize`` already returned (no re-normalizing)."""
    start = url.index("://") + 3
    end = url.find("/", start)
    return url[:end] if end >= 0 else url


def path_and_query_of(url: str) -> str:
    """The request target of `url` ("/path?query"), as robots.txt rules are matched against it."""
    return _split_normal(url)[2]


def normalize_percent(text: str) -> str:
    """Percent-encoding normal form of any URL part: unreserved decoded, hex upper-cased, rest escaped."""
    return _pct(text)


def normalize_path_query(target: str) -> str:
    """Percent-encoding and dot-segment normal form of a request target such as "/a/../%7Eb?q"."""
    path, sep, query = target.partition("?")
    return _path(path) + ("?" + _pct(query) if sep else "")


DEFAULT_BINARY_SUFFIXES: tuple[str, ...] = (
    # images
    ".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".ico", ".tif", ".tiff", ".svg", ".avif", ".heic",
    # audio and video
    ".mp3", ".mp4", ".m4a", ".m4v", ".avi", ".mov", ".wmv", ".flv", ".mkv", ".webm", ".wav", ".ogg",
    ".flac", ".aac", ".mpg", ".mpeg",
    # archives, packages, executables, disk images
    ".zip", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar", ".tar", ".zst", ".exe", ".msi", ".dmg", ".iso",
    ".bin", ".apk", ".deb", ".rpm", ".jar", ".dll", ".so",
    # documents and fonts
    ".pdf", ".doc", ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".odt", ".ods", ".odp", ".woff", ".woff2",
    ".ttf", ".otf", ".eot",
)


class _HostPatterns:
    """"example.com" matches that host and its subdomains; "*.example.com" only its subdomains."""

    __slots__ = ("_with_self", "_subdomains_only")

    def __init__(self, patterns: Iterable[str]) -> None:
        self._with_self: set[str] = set()
        self._subdomains_only: set[str] = set()
        for pattern in patterns:
            text = pattern.strip()
            target = self._with_self
            if text.startswith("*."):
                text, target = text[2:], self._subdomains_only
            host = _host(text)
            if host is None:
                raise ValueError(f"invalid host pattern in the scope configuration: {pattern!r}")
            target.add(host)

    def __bool__(self) -> bool:
        return bool(self._with_self or self._subdomains_only)

    def matches(self, host: str) -> bool:
        if host in self._with_self:
            return True
        dot = host.find(".")
        while dot >= 0:
            suffix = host[dot + 1 :]
            if suffix in self._with_self or suffix in self._subdomains_only:
                return True
            dot = host.find(".", dot + 1)
        return False


class _UrlPatterns:
    """Regular expressions searched in a normalized URL (each compiled on its own, so groups keep their numbers)."""

    __slots__ = ("_compiled",)

    def __init__(self, patterns: Iterable[str], name: str) -> None:
        compiled = []
        for pattern in patterns:
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise ValueError(f"invalid {name} pattern {pattern!r}: {exc}") from exc
        self._compiled = tuple(compiled)

    def __bool__(self) -> bool:
        return bool(self._compiled)

    def search(self, url: str) -> bool:
        return any(p.search(url) for p in self._compiled)


class Scope:
    """Which normalized URLs the crawl may visit; `check` names the first rule a URL breaks."""

    __slots__ = (
        "_allowed",
        "_denied",
        "_include",
        "_exclude",
        "_suffixes",
        "max_query_params",
        "max_depth",
        "max_url_length",
        "max_path_segments",
        "max_repeated_segment",
    )

    def __init__(
        self,
        *,
        allowed_hosts: Iterable[str] = (),
        denied_hosts: Iterable[str] = (),
        include: Iterable[str] = (),
        exclude: Iterable[str] = (),
        max_query_params: int | None = None,
        deny_suffixes: Iterable[str] = DEFAULT_BINARY_SUFFIXES,
        max_depth: int | None = None,
        max_url_length: int = DEFAULT_MAX_URL_LENGTH,
        max_path_segments: int = 64,
        max_repeated_segment: int = 3,
    ) -> None:
        self._allowed = _HostPatterns(allowed_hosts)
        self._denied = _HostPatterns(denied_hosts)
        self._include = _UrlPatterns(include, "include")
        self._exclude = _UrlPatterns(exclude, "exclude")
        self.max_query_params = max_query_params
        self._suffixes = tuple(s.lower() for s in deny_suffixes)
        self.max_depth = max_depth
        self.max_url_length = max_url_length
        self.max_path_segments = max_path_segments
        self.max_repeated_segment = max_repeated_segment

    def check(self, url: str, host: str, depth: int, *, sitemap: bool = False) -> str | None:
        """None if `url` (normalized, on `host`, found at `depth`) is in scope, else a short reason. A sitemap
        is not judged by its suffix (".xml.gz" is a sitemap's usual name, not a binary to skip) nor by the include
        patterns (it is a list of pages, not a page: each page it lists is judged by them)."""
        if len(url) > self.max_url_length:
            return "too-long"
        if self._denied and self._denied.matches(host):
            return "denied-host"
        if self._allowed and not self._allowed.matches(host):
            return "not-allowed-host"
        if self.max_depth is not None and depth > self.max_depth:
            return "depth"
        if self.max_query_params is not None:
            query = url.find("?")
            if query >= 0 and sum(1 for p in url[query + 1:].split("&") if p) > self.max_query_params:
                return "too-many-params"
        if self._exclude and self._exclude.search(url):
            return "excluded"
        if self._include and not sitemap and not self._include.search(url):
            return "not-included"
        start = url.find("/", url.find("//") + 2)
        if start < 0:
            return None
        end = url.find("?", start)
        path = url[start:] if end < 0 else url[start:end]
        if self._suffixes and not sitemap and path.lower().endswith(self._suffixes):
            return "suffix"
        segments = [s for s in path.split("/") if s]
        if len(segments) > self.max_path_segments:
            return "trap-too-many-segments"
        if len(segments) > self.max_repeated_segment:
            counts: dict[str, int] = {}
            for seg in segments:
                n = counts.get(seg, 0) + 1
                if n > self.max_repeated_segment:
                    return "trap-repeated-segment"
                counts[seg] = n
        return None
