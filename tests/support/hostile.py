"""A hostile web server: one host whose pages are each a known way to hurt a crawler.

It speaks just enough HTTP/1.1 over a real loopback socket (one request per connection, `Connection: close`)
to send answers no well-behaved framework would: a `Retry-After` of digits Python calls digits but `int()`
cannot read, stacked content codings, decompression bombs of every coding, a body far past the size limit, a
page of a quarter of a million links, a redirect loop, garbage headers. The index page links every one of them,
so a crawler seeded with the index meets them all. Every request is logged as its path.

`serve_hostile(task_status=...)` starts it on 127.0.0.1 (port 0 unless given) and reports a `HostileWeb`.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import brotli
import trio

__all__ = ["BOMB_SIZE", "HANG_PATH", "HOSTILE_PAGES", "HostileWeb", "serve_hostile"]

#: What each decompression bomb inflates to: 25 times the default 10 MiB page limit, from a few KB at most.
BOMB_SIZE = 256 << 20
#: Never answered (not linked from the index): a URL that is in flight whenever the node is killed.
HANG_PATH = "/hang.html"
#: Links on /links.html (the page itself is about 8 MB, under the default 10 MiB body limit).
LINK_COUNT = 250_000
_MIB = bytes(1 << 20)


def _raw_deflate_bomb(data_size: int) -> bytes:
    """A raw deflate stream of `data_size` zero bytes, made in milliseconds: one MiB compressed with a full flush
    is a self-contained segment, so the stream is that segment repeated, then an empty final block."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    packer.compress(_MIB)
    packer.flush(zlib.Z_FULL_FLUSH)
    segment = packer.compress(_MIB) + packer.flush(zlib.Z_FULL_FLUSH)
    return segment * (data_size >> 20) + packer.flush()


def _gzip_layers(data_size: int, layers: int) -> bytes:
    """`layers` nested gzip streams of `data_size` zero bytes; the inner one is a correct gzip member."""
    crc = 0
    for _ in range(data_size >> 20):
        crc = zlib.crc32(_MIB, crc)
    body = (
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
        + _raw_deflate_bomb(data_size)
        + struct.pack("<II", crc, data_size & 0xFFFF_FFFF)
    )
    for _ in range(layers - 1):
        body = gzip.compress(body, 9)
    return body


def _brotli_bomb(data_size: int) -> bytes:
    packer = brotli.Compressor(quality=1)
    return b"".join(packer.process(_MIB) for _ in range(data_size >> 20)) + packer.finish()


@dataclass(frozen=True, slots=True)
class Page:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    #: what the page attacks, for test ids and messages
    attack: str


def _html(text: str) -> bytes:
    return f"<!doctype html><html><body>{text}</body></html>".encode()


def _build_pages() -> dict[str, Page]:
    html = ("Content-Type", "text/html; charset=utf-8")
    three_gzip = _gzip_layers(BOMB_SIZE, 3)
    pages = {
        "/retry-arabic.html": Page(503, (html, ("Retry-After", "\u0661\u0662")), _html("busy"),
                                   "Retry-After in Arabic-Indic digits (str.isdigit is true, int() fails)"),
        "/retry-superscript.html": Page(429, (html, ("Retry-After", "\u00b2")), _html("slow down"),
                                        "Retry-After '²' (isdigit is true, int() raises)"),
        "/retry-huge.html": Page(503, (html, ("Retry-After", "9" * 400)), _html("busy"),
                                 "Retry-After of 400 digits"),
        "/gzip3.html": Page(200, (html, ("Content-Encoding", "gzip, gzip, gzip")), three_gzip,
                            f"three stacked gzip codings, {len(three_gzip)} bytes inflating to {BOMB_SIZE}"),
        "/gzip2.html": Page(200, (html, ("Content-Encoding", "gzip, gzip")), _gzip_layers(BOMB_SIZE, 2),
                            "two stacked gzip codings inflating to 256 MiB"),
        "/gzip-br.html": Page(200, (html, ("Content-Encoding", "gzip, br")),
                              brotli.compress(_gzip_layers(BOMB_SIZE, 1)), "gzip then br, inflating to 256 MiB"),
        "/br.html": Page(200, (html, ("Content-Encoding", "br")), _brotli_bomb(BOMB_SIZE), "a br bomb of 256 MiB"),
        "/deflate.html": Page(200, (html, ("Content-Encoding", "deflate")), _raw_deflate_bomb(BOMB_SIZE),
                              "a raw deflate bomb of 256 MiB"),
        "/unknown-coding.html": Page(200, (html, ("Content-Encoding", "zstd, gzip")), b"\x00" * 64,
                                     "an unsupported coding"),
        "/big.html": Page(200, (html,), _html("x" * (24 << 20)), "a 24 MiB body, past the size limit"),
        "/links.html": Page(200, (html,), _html("".join(f'<a href="/trap/{i}">{i}</a>' for i in range(LINK_COUNT))),
                            f"{LINK_COUNT} links on one page"),
        "/loop.html": Page(302, (("Location", "/loop.html"),), b"", "a redirect to itself"),
        "/bad-charset.html": Page(200, (("Content-Type", "text/html; charset=\u00ff\u00fe-nonsense"),),
                                  "<a href='/\udcff'>x</a>".encode("utf-8", "surrogateescape") + b"\xff\xfe\x00",
                                  "a charset that does not exist and bytes that decode in none"),
        "/garbage-headers.html": Page(200, (html, ("Content-Length", "5"), ("Content-Type", "\x01\x02;;;=")),
                                      b"hello", "a control-character Content-Type"),
        # pages that hurt a browser (a node rendering them: tests/test_render_hostile.py)
        "/script-endless.html": Page(200, (html,), _html("<div id='app'></div><script>while (true) {}</script>"),
                                     "a script that never ends"),
        "/script-popups.html": Page(200, (html,), _html(
            "<div id='app'></div><script>for (let i = 0; i < 50; i++) window.open('/popup-' + i + '.html');"
            "document.getElementById('app').innerHTML = '<a href=\"/after-popups.html\">after</a>';</script>"),
            "a script that opens fifty windows, then writes a link"),
        "/after-popups.html": Page(200, (html,), _html("written by the popup page's script"), "a script's link"),
        "/script-memory.html": Page(200, (html,), _html(
            "<div id='app'></div><script>const hoard = []; while (true) hoard.push(new Array(1e7).fill(1.5));"
            "</script>"), "a script that allocates until it is stopped"),
    }
    links = "".join(f'<a href="{path}">{path}</a> ' for path in pages)
    pages["/"] = Page(200, (html,), _html(links), "the index")
    pages["/robots.txt"] = Page(200, (("Content-Type", "text/plain"),), b"User-agent: *\nDisallow: /trap/\n",
                                "robots.txt keeping the link trap out")
    return pages


_PAGES: dict[str, Page] | None = None


def pages() -> dict[str, Page]:
    """The hostile pages, built once per process (about a second)."""
    global _PAGES
    if _PAGES is None:
        _PAGES = _build_pages()
    return _PAGES


HOSTILE_PAGES: Callable[[], dict[str, Page]] = pages


@dataclass
class HostileWeb:
    port: int
    log: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path


async def _serve_one(stream: trio.SocketStream, web: HostileWeb, table: dict[str, Page]) -> None:
    async with stream:
        head = b""
        with trio.move_on_after(10):
            while b"\r\n\r\n" not in head and len(head) < 16384:
                data = await stream.receive_some(4096)
                if not data:
                    return
                head += data
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3:
            return
        path = parts[1]
        web.log.append(path)
        if path == HANG_PATH:
            await trio.sleep_forever()  # a request that never ends: the node is stopped while it is in flight
        page = table.get(path) or Page(404, (("Content-Type", "text/plain"),), b"not here", "not found")
        reason = {200: "OK", 302: "Found", 404: "Not Found", 429: "Too Many Requests", 503: "Service Unavailable"}
        lines = [f"HTTP/1.1 {page.status} {reason.get(page.status, 'X')}"]
        names = {name.lower() for name, _ in page.headers}
        for name, value in page.headers:
            lines.append(f"{name}: {value}")
        if "content-length" not in names:
            lines.append(f"Content-Length: {len(page.body)}")
        lines.append("Connection: close")
        out = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + page.body
        try:
            with trio.move_on_after(30):
                for start in range(0, len(out), 1 << 16):
                    await stream.send_all(out[start : start + (1 << 16)])
        except trio.BrokenResourceError:
            pass  # the crawler stopped reading (a size limit): what it should do


async def serve_hostile(port: int = 0, *, task_status: trio.TaskStatus[HostileWeb] = trio.TASK_STATUS_IGNORED) -> None:
    table = pages()
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    web = HostileWeb(port=listeners[0].socket.getsockname()[1])

    async def handler(stream: trio.SocketStream) -> None:
        await _serve_one(stream, web, table)

    async with trio.open_nursery() as nursery:
        task_status.started(web)
        await trio.serve_listeners(handler, listeners, handler_nursery=nursery)
