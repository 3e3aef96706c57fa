"""The vocabulary of the local web: hosts, resources and links, plus the two URL rules it relies on.

Every link is stored twice: as written in the page (``href``, which may be relative, carry a fragment, dot
segments, upper-case letters or Unicode) and as the normalized target (``host``, ``path``) a correct
crawler must arrive at. The oracle reasons only on the targets, the server only renders the ``href``s.
Absolute hrefs hold the placeholder ``{port}``: the graph is generated before the server picks its port.
"""

from __future__ import annotations

from dataclasses import dataclass

from .robots_spec import RobotsSpec

__all__ = ["PORT", "HostSpec", "Link", "Resource", "idna_host", "make_url", "norm_path"]

#: Placeholder for the server's port inside absolute hrefs and Location headers.
PORT = "{port}"

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# Characters a path and query keep literally (RFC 3986 pchar, "/" and "?"); everything else is encoded.
_LITERAL = _UNRESERVED | frozenset("!$&'()*+,;=:@/?")
_HEX = frozenset("0123456789abcdefABCDEF")


def norm_path(raw: str) -> str:
    """Normalize the percent-encoding of a path (and query): UTF-8, upper-case hex, unreserved decoded.

    ``"/cs/中文.html"`` and ``"/cs/%e4%b8%ad%E6%96%87.html"`` both give ``"/cs/%E4%B8%AD%E6%96%87.html"``;
    ``"/p/%33.html"`` gives ``"/p/3.html"``. Dot segments are not touched here: the generator never
    stores a target with them, and a client resolves them before sending.
    """
    out: list[str] = []
    i = 0
    n = len(raw)
    while i < n:
        ch = raw[i]
        if ch == "%" and i + 2 < n and raw[i + 1] in _HEX and raw[i + 2] in _HEX:
            value = int(raw[i + 1 : i + 3], 16)
            decoded = chr(value)
            out.append(decoded if decoded in _UNRESERVED else f"%{value:02X}")
            i += 3
            continue
        if ch in _LITERAL:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
        i += 1
    return "".join(out)


def idna_host(name: str) -> str:
    """The ASCII (IDNA) form of a host name, lower-case, without a trailing dot."""
    name = name.strip().rstrip(".").lower()
    if name.isascii():
        return name
    return name.encode("idna").decode("ascii")


def make_url(host: str, path: str, port: int | None) -> str:
    """The normalized URL of ``path`` on ``host``; ``port`` None leaves the default port out."""
    authority = host if port is None or port == 80 else f"{host}:{port}"
    return f"http://{authority}{path}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A link in a page (or a redirect's Location): its written form and its normalized target."""

    host: str
    path: str
    href: str
    nofollow: bool = False
    rel: str = ""
    text: str = ""
    #: written by the page's script, not in its HTML: only a crawler that runs scripts (renders) finds it
    scripted: bool = False

    def render_href(self, port: int) -> str:
        return self.href.replace(PORT, str(port))


@dataclass(frozen=True, slots=True, kw_only=True)
class Resource:
    """One thing a URL answers with.

    ``kind`` is ``"html"``, ``"redirect"``, ``"binary"``, ``"huge"`` (a streamed body of ``size`` bytes)
    or ``"missing"`` (404 / 410 with a short body). ``markup`` says how an ordinary page is written: ``""``
    (a list of its links and filler text), ``"gen"`` (generated like a real page, with ``nav`` navigation and
    ``footer`` footer links first and last) or ``"doc"`` (real document ``doc`` of the graph's corpus). ``first_status`` (429 or 503) is what the very first
    request gets, with ``Retry-After: retry_after``; later requests get ``status``. ``delay`` seconds pass
    before the answer starts. ``charset`` is the body's encoding; ``declare`` says where it is named:
    ``"header"`` (Content-Type), ``"meta"`` (``<meta charset>``) or ``"none"``; ``charset_label`` is the
    name written there when it differs from ``charset`` (a page declared GB2312 but holding GBK text).
    """

    host: str
    path: str
    kind: str = "html"
    status: int = 200
    feature: str = ""
    links: tuple[Link, ...] = ()
    location: Link | None = None
    content_type: str = "text/html"
    charset: str = "utf-8"
    charset_label: str = ""
    declare: str = "header"
    text: str = ""
    gzip: bool = False
    meta_nofollow: bool = False
    base_href: str | None = None
    delay: float = 0.0
    first_status: int | None = None
    retry_after: int = 1
    size: int = 0
    body: bytes = b""
    markup: str = ""
    doc: int = -1
    nav: int = 0
    footer: int = 0
    #: where the page's script reads what it writes (its ``scripted`` links and ``script_text``): a page with
    #: one is an empty ``<div id="app">`` and a script (``/js/app.js``) that builds it; "" : a page as written
    script_data: str = ""
    script_text: str = ""

    @property
    def follows_links(self) -> bool:
        """Whether a crawler extracts links from this resource's answer."""
        return self.kind == "html" and self.status == 200 and not self.meta_nofollow


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSpec:
    """A virtual host: its ASCII name (the key everywhere), its written name, its robots and its role."""

    index: int
    name: str
    display: str
    robots: RobotsSpec
    role: str = ""
