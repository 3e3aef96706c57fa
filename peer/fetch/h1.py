"""HTTP/1.1 for the fetcher's client side, sans I/O: a request's bytes, and a reader that turns the bytes of one
response into its head, body pieces and end.

h11 did this before; on a crawl of 15 KB pages its general state machine (events, both roles, every state
transition checked) cost about 85 µs of CPU per page, a tenth of the node's. The fetcher needs one narrow
client: it sends a request and reads one response at a time on a connection, and reuses the connection only
after a whole, well-framed response. This module is that client (about 15 µs per page) and accepts what h11
accepted, by the same grammar (RFC 9112, h11's ABNF): the status line, header lines (obsolete line folding
joined, a bare LF taken for CRLF), Content-Length (equal repeats allowed, conflicting ones refused),
`Transfer-Encoding: chunked` and no other transfer coding, a body read to the end of the stream when neither
frames it, 1xx responses skipped, no body after HEAD, 204 or 304. Every size is bounded: the head (and each
chunk header and the trailer section) by `max_head`; the body is the caller's to bound, piece by piece.

Header names come out in lower case and values without surrounding blanks, both decoded as latin-1, as h11
gave them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["END", "NEED_DATA", "Head", "HeadTooLarge", "LocalProtocolError", "RemoteProtocolError", "ResponseReader",
           "request_bytes"]

# h11's ABNF (RFC 9110 / 9112)
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+"
_FIELD_VALUE = rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?"
_STATUS_LINE = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: ((?:[ \t]|[^\x00\s])*))?")
_HEADER_LINE = re.compile(rb"(" + _TOKEN + rb"):[ \t]*(" + _FIELD_VALUE + rb")[ \t]*")
_HEADER_LINES = re.compile(rb"^(" + _TOKEN + rb"):[ \t]*(" + _FIELD_VALUE + rb")[ \t]*\r?$", re.M)
_CHUNK_HEADER = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*")
_BLANK_LINE = re.compile(rb"\n\r?\n")
_LINE_END = re.compile(rb"\r?\n")
_TOKEN_RE = re.compile(_TOKEN.decode("ascii"))
_FIELD_VALUE_RE = re.compile(_FIELD_VALUE.decode("latin-1"))
_TARGET_RE = re.compile(r"[\x21-\x7e]+")
_MAX_CONTENT_LENGTH_DIGITS = 20


class LocalProtocolError(Exception):
    """We were asked to send something that is not a valid HTTP/1.1 request (our fault)."""


class RemoteProtocolError(Exception):
    """The server sent something that is not a valid HTTP/1.1 response (its fault)."""


class HeadTooLarge(RemoteProtocolError):
    """The response head (or a chunk header, or the trailer section) is longer than the reader's `max_head`."""


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: `ResponseReader.next_event`: more bytes are needed before anything more can be said.
NEED_DATA: Final = _Sentinel("NEED_DATA")
#: `ResponseReader.next_event`: the response is complete.
END: Final = _Sentinel("END")


@dataclass(frozen=True, slots=True, kw_only=True)
class Head:
    """A final (non-1xx) response's status line and headers."""

    http_version: str
    status: int
    reason: str
    headers: list[tuple[str, str]]  # names lower case, values stripped; as received, in order


_header_blocks: dict[tuple[tuple[str, str], ...], bytes] = {}
_HEADER_BLOCKS_MAX = 4096  # distinct header lists remembered (one per origin and header set): a few MiB at most


def request_bytes(method: str, target: str, headers: Sequence[tuple[str, str]], content: bytes = b"") -> bytes:
    """The bytes of one request. Raises LocalProtocolError for a method, target or header that HTTP/1.1 cannot
    carry (a control character, a line break, a space in the target) or a header list without exactly one Host.

    A header list once checked is remembered as its encoded block, so a crawl's requests (the same few headers
    per host) are checked once per host."""
    if _TOKEN_RE.fullmatch(method) is None:
        raise LocalProtocolError(f"illegal method {method[:100]!r}")
    if _TARGET_RE.fullmatch(target) is None:
        raise LocalProtocolError(f"illegal request target {target[:200]!r}")
    key = tuple(headers)
    block = _header_blocks.get(key)
    if block is None:
        block = _header_block(key)
        if len(_header_blocks) >= _HEADER_BLOCKS_MAX:
            _header_blocks.clear()
        _header_blocks[key] = block
    return b"".join((method.encode("ascii"), b" ", target.encode("ascii"), b" HTTP/1.1\r\n", block, content))


def _header_block(headers: tuple[tuple[str, str], ...]) -> bytes:
    hosts = 0
    lines = []
    for name, value in headers:
        if _TOKEN_RE.fullmatch(name) is None:
            raise LocalProtocolError(f"illegal header name {name[:100]!r}")
        if _FIELD_VALUE_RE.fullmatch(value) is None:
            raise LocalProtocolError(f"illegal value of header {name}: {value[:200]!r}")
        hosts += name.lower() == "host"
        try:
            lines.append(f"{name}: {value}\r\n".encode("latin-1"))
        except UnicodeEncodeError:
            raise LocalProtocolError(f"header {name} is not latin-1: {value[:200]!r}") from None
    if hosts != 1:
        raise LocalProtocolError("a request needs exactly one Host header" if hosts else "missing Host header")
    lines.append(b"\r\n")
    return b"".join(lines)


# body framing
_NONE, _LENGTH, _CHUNKED, _TO_CLOSE = range(4)
# reader states
_HEAD, _BODY, _CHUNK_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _DONE = range(7)


class ResponseReader:
    """Reads one response to a request made with `method`. Feed it bytes with `receive_data` (b"" at the end of
    the stream) and take events with `next_event`: a `Head` once, then body pieces (`bytes`), then `END`;
    `NEED_DATA` whenever it has nothing more to give yet. Raises RemoteProtocolError on anything malformed or
    cut short; the connection is then unusable.

    After `END`, `reusable` says whether the connection may carry another request: HTTP/1.1, no
    `Connection: close`, a body framed by its length or chunks, and nothing after the response."""

    __slots__ = ("_buf", "_chunk_left", "_eof", "_framing", "_head_req", "_keep_alive", "_left", "_max_head",
                 "_scanned", "_state")

    def __init__(self, method: str, *, max_head: int) -> None:
        self._head_req = method == "HEAD"
        self._max_head = max_head
        self._buf: bytes | bytearray = b""
        self._eof = False
        self._state = _HEAD
        self._framing = _NONE
        self._left = 0  # body bytes still to come (Content-Length framing)
        self._chunk_left = 0  # bytes of the current chunk still to come
        self._keep_alive = False
        # How far the buffer was searched for the end of a line or block: a head dripped in byte by byte is
        # searched once through, not once per byte.
        self._scanned = 0

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def reusable(self) -> bool:
        return self._state == _DONE and self._keep_alive and not self._buf and not self._eof

    def receive_data(self, data: bytes | bytearray) -> None:
        if data:
            if self._eof:
                raise RemoteProtocolError("data after the end of the stream")
            buf = self._buf
            if not buf:
                self._buf = data  # the usual case: nothing waiting, no copy
            elif type(buf) is bytearray:
                buf += data  # a head (or chunk line) arriving in pieces: grown in place, not copied each time
            else:
                self._buf = bytearray(buf) + data
        else:
            self._eof = True

    def next_event(self) -> Head | bytes | _Sentinel:
        while True:
            state = self._state
            if state == _BODY:
                buf = self._buf
                if self._framing == _LENGTH:
                    if buf:
                        piece = self._take(self._left)
                        self._left -= len(piece)
                        if not self._left:
                            self._state = _DONE
                        return piece
                    if self._eof:
                        raise RemoteProtocolError("the server closed the connection before the end of the body")
                    return NEED_DATA
                # read to the end of the stream
                if buf:
                    self._buf = b""
                    return buf if type(buf) is bytes else bytes(buf)
                if self._eof:
                    self._state = _DONE
                    return END
                return NEED_DATA
            if state == _DONE:
                return END
            if state == _HEAD:
                head = self._read_head()
                if head is None:
                    return NEED_DATA
                if head.status >= 200:
                    return head
                continue  # 1xx: informational, the final response follows
            if state == _CHUNK_LINE:
                line = self._line("chunk header")
                if line is None:
                    return NEED_DATA
                match = _CHUNK_HEADER.fullmatch(line)
                if match is None:
                    raise RemoteProtocolError(f"illegal chunk header {line[:100]!r}")
                size = int(match.group(1), 16)
                if size:
                    self._chunk_left = size
                    self._state = _CHUNK_DATA
                else:
                    self._state = _TRAILER
                continue
            if state == _CHUNK_DATA:
                buf = self._buf
                if not buf:
                    if self._eof:
                        raise RemoteProtocolError("the server closed the connection inside a chunk")
                    return NEED_DATA
                piece = self._take(self._chunk_left)
                self._chunk_left -= len(piece)
                if not self._chunk_left:
                    self._state = _CHUNK_END
                return piece
            if state == _CHUNK_END:
                buf = self._buf
                if len(buf) < 2:
                    if buf and buf != b"\r":
                        raise RemoteProtocolError(f"malformed chunk end {buf[:10]!r}")
                    if self._eof:
                        raise RemoteProtocolError("the server closed the connection inside a chunk")
                    return NEED_DATA
                if buf[:2] != b"\r\n":
                    raise RemoteProtocolError(f"malformed chunk end {buf[:10]!r}")
                self._buf = buf[2:]
                self._state = _CHUNK_LINE
                continue
            if state == _TRAILER:
                if self._buf[:2] == b"\r\n" or self._buf[:1] == b"\n":  # no trailer fields
                    self._buf = self._buf[2 if self._buf[:1] == b"\r" else 1:]
                    self._state = _DONE
                    return END
                block = self._block("trailer section")
                if block is None:
                    return NEED_DATA
                _headers(block)  # checked as header lines, then dropped
                self._state = _DONE
                return END
            raise AssertionError(f"reader in unknown state {state}")  # pragma: no cover

    def _read_head(self) -> Head | None:
        block = self._block("response head")
        if block is None:
            return None
        end = block.find(b"\n")
        status_line, rest = (block, b"") if end < 0 else (block[:end], block[end + 1:])
        if status_line[-1:] == b"\r":
            status_line = status_line[:-1]
        match = _STATUS_LINE.fullmatch(status_line)
        if match is None:
            raise RemoteProtocolError(f"illegal status line {status_line[:200]!r}")
        version, status = match.group(1), int(match.group(2))
        headers = _headers(rest)
        head = Head(http_version=version.decode("ascii"), status=status,
                    reason=(match.group(3) or b"").decode("latin-1"), headers=headers)
        if status < 200:
            if status == 101:
                raise RemoteProtocolError("the server switched protocols, which was not asked for")
            return head  # the state stays _HEAD
        self._frame(head)
        return head

    def _frame(self, head: Head) -> None:
        """Decide how the body is framed (RFC 9112 section 6.3) and whether the connection may be reused."""
        transfer = None
        lengths: set[str] = set()
        close = head.http_version < "1.1"
        for name, value in head.headers:
            if name == "transfer-encoding":
                if transfer is not None:
                    raise RemoteProtocolError("multiple Transfer-Encoding headers")
                transfer = value.lower()
                if transfer != "chunked":
                    raise RemoteProtocolError(f"unsupported Transfer-Encoding {value[:100]!r} (only chunked)")
            elif name == "content-length":
                lengths.update(v.strip() for v in value.split(","))
            elif name == "connection" and "close" in (v.strip().lower() for v in value.split(",")):
                close = True
        if head.status in (204, 304) or self._head_req:
            self._framing, self._state = _NONE, _DONE
        elif transfer is not None:
            self._framing, self._state = _CHUNKED, _CHUNK_LINE
        elif lengths:
            if len(lengths) != 1:
                raise RemoteProtocolError("conflicting Content-Length headers")
            length = lengths.pop()
            if not length.isdigit() or not length.isascii() or len(length) > _MAX_CONTENT_LENGTH_DIGITS:
                raise RemoteProtocolError(f"bad Content-Length {length[:30]!r}")
            self._left = int(length)
            self._framing = _LENGTH
            self._state = _BODY if self._left else _DONE
        else:
            self._framing, self._state = _TO_CLOSE, _BODY
            close = True
        self._keep_alive = not close

    def _block(self, what: str) -> bytes | None:
        """Lines up to a blank line, taken off the buffer (without the blank line); None if it has not all
        come yet. A block over `max_head` bytes is refused."""
        buf = self._buf
        match = _BLANK_LINE.search(buf, max(0, self._scanned - 2))  # a match may start up to 2 bytes back
        if match is None:
            if len(buf) > self._max_head:
                raise HeadTooLarge(f"{what} exceeds {self._max_head} bytes")
            if self._eof:
                raise RemoteProtocolError(f"the server closed the connection inside the {what}")
            self._scanned = len(buf)
            return None
        if match.start() > self._max_head:
            raise HeadTooLarge(f"{what} exceeds {self._max_head} bytes")
        self._scanned = 0
        self._buf = buf[match.end():]
        block = bytes(buf[: match.start()])
        return block[:-1] if block[-1:] == b"\r" else block

    def _take(self, left: int) -> bytes:
        """Up to `left` bytes of the buffer (not empty), removed from it: a piece of the body."""
        buf = self._buf
        if len(buf) <= left:
            self._buf = b""
            piece = buf
        else:
            self._buf = buf[left:]
            piece = buf[:left]
        return piece if type(piece) is bytes else bytes(piece)

    def _line(self, what: str) -> bytes | None:
        buf = self._buf
        end = buf.find(b"\n", self._scanned)
        if end < 0:
            if len(buf) > self._max_head:
                raise HeadTooLarge(f"{what} exceeds {self._max_head} bytes")
            if self._eof:
                raise RemoteProtocolError(f"the server closed the connection inside a {what}")
            self._scanned = len(buf)
            return None
        if end > self._max_head:
            raise HeadTooLarge(f"{what} exceeds {self._max_head} bytes")
        self._scanned = 0
        self._buf = buf[end + 1:]
        return bytes(buf[: end - 1] if buf[end - 1:end] == b"\r" else buf[:end])


def _headers(block: bytes) -> list[tuple[str, str]]:
    """The header fields of a block of lines (CRLF or LF between them)."""
    if not block:
        return []
    # the usual block: every line a header field, matched in one pass
    fields = _HEADER_LINES.findall(block)
    if len(fields) == block.count(b"\n") + 1:
        return [(name.decode("ascii").lower(), value.decode("latin-1")) for name, value in fields]
    lines = _LINE_END.split(block)
    out: list[tuple[str, str]] = []
    folded = False
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            folded = True
            break
        match = _HEADER_LINE.fullmatch(line)
        if match is None:
            raise RemoteProtocolError(f"illegal header line {line[:200]!r}")
        out.append((match.group(1).decode("ascii").lower(), match.group(2).decode("latin-1")))
    if not folded:
        return out
    return _headers(b"\n".join(_unfold(lines)))


def _unfold(lines: list[bytes]) -> list[bytes]:
    """Obsolete line folding (RFC 9112 section 5.2): a line starting with blanks continues the one before."""
    out: list[bytes] = []
    for line in lines:
        stripped = line.lstrip(b" \t")
        if len(stripped) != len(line):
            if not out:
                raise RemoteProtocolError("a continuation line at the start of the headers")
            out[-1] += b" " + stripped
        else:
            out.append(line)
    return out
