"""The fetcher's HTTP/1.1 client (peer.fetch.h1), without sockets: each response whole, byte by byte and with
bytes after it; and, response by response, the same head, body and verdict as h11 (the reference it replaces)."""

from __future__ import annotations

import h11
import pytest

from peer.fetch import h1

MAX_HEAD = 4096


def read(data: bytes, method: str = "GET", *, step: int = 0, eof: bool = True,
         max_head: int = MAX_HEAD) -> tuple[h1.Head, bytes, h1.ResponseReader]:
    """Feed `data` (all at once, or `step` bytes at a time), then the end of the stream if `eof`, until END."""
    reader = h1.ResponseReader(method, max_head=max_head)
    pieces = [data] if not step else [data[i:i + step] for i in range(0, len(data), step)]
    head = None
    body = []
    for _ in range(3 * len(data) + 10):
        event = reader.next_event()
        if event is h1.NEED_DATA:
            if pieces:
                reader.receive_data(pieces.pop(0))
            elif eof:
                reader.receive_data(b"")
                eof = False
            else:
                raise AssertionError("the reader wants more data than the response has")
        elif event is h1.END:
            assert head is not None
            return head, b"".join(body), reader
        elif isinstance(event, h1.Head):
            assert head is None, "two heads"
            head = event
        else:
            assert isinstance(event, bytes) and event
            body.append(event)
    raise AssertionError("no END")


def with_h11(data: bytes, method: str = "GET") -> tuple[int, list[tuple[str, str]], bytes, bool] | str:
    """What h11 makes of the response: (status, headers, body, reusable), or "error"."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
    conn.send(h11.Request(method=method, target="/", headers=[("host", "a.test")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")
    head = None
    body = b""
    try:
        for _ in range(len(data) + 10):
            event = conn.next_event()
            if isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in head.headers]
                return head.status_code, headers, body, conn.our_state is h11.DONE and conn.their_state is h11.DONE
            elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return "error"
    except h11.RemoteProtocolError:
        return "error"
    return "error"


def with_h1(data: bytes, method: str = "GET") -> tuple[int, list[tuple[str, str]], bytes, bool] | str:
    try:
        head, body, reader = read(data, method, eof=False)
    except (h1.RemoteProtocolError, AssertionError):
        try:
            head, body, reader = read(data, method, eof=True)
        except h1.RemoteProtocolError:
            return "error"
        return head.status, head.headers, body, False
    return head.status, head.headers, body, reader.reusable


PAGE = b"<html><a href='/x'>x</a></html>" * 20
RESPONSES = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(PAGE) + PAGE,
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 404 Not Found\r\nX-Empty:\r\nX-Spaces:   padded value  \r\nContent-Length: 2\r\n\r\nno",
    b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
    b"HTTP/1.1 200 OK\r\nX-Folded: one\r\n  two\r\n\tthree\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\nContent-Length: 99\r\n\r\n2\r\nok\r\n0\r\nX-Trailer: t\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n00002\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nread until the server closes",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nConnection: keep-alive, close\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 301 Moved\r\nLocation: /there\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nSet-Cookie: \xe9t\xe9=\xff\r\nContent-Length: 2\r\n\r\nok",
    # malformed: each is an error for both
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"HTTP/1.1 OK\r\n\r\n",
    b"ICY 200 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nNoColon\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n X-Lead: fold at start\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Nul: a\x00b\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-CR: a\rb\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-Mixed: a\nX-Ends: b\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",
    b"",
    b"garbage",
]


# Where h1 differs from h11, on purpose: it keeps header fields as they came (h11 merged repeated Content-Length
# fields and lower-cased Transfer-Encoding's value), and a body read to the close never leaves the connection
# reusable.
DIFFERENT = {
    1: (200, [("content-length", "5"), ("content-length", "5")], b"hello", True),
    2: (200, [("content-length", "5, 5")], b"hello", True),
    10: (200, [("transfer-encoding", "CHUNKED"), ("content-length", "99")], b"ok", True),
    12: (200, [("content-type", "text/plain")], b"read until the server closes", False),
}


@pytest.mark.parametrize("n", range(len(RESPONSES)))
def test_same_verdict_as_h11(n: int) -> None:
    data = RESPONSES[n]
    if n in DIFFERENT:
        assert with_h1(data) == DIFFERENT[n]
        h11_status, _h, h11_body, _r = with_h11(data)
        assert (h11_status, h11_body) == DIFFERENT[n][::2]
    else:
        assert with_h1(data) == with_h11(data)


@pytest.mark.parametrize("data", [r for r in RESPONSES if with_h11(r) != "error"])
def test_byte_by_byte_gives_what_whole_gives(data: bytes) -> None:
    whole = read(data)
    drip = read(data, step=1)
    assert (drip[0], drip[1]) == (whole[0], whole[1])


def test_head_fields() -> None:
    head, body, reader = read(b"HTTP/1.1 404 Not Found Here\r\nContent-Type: text/html; charset=x\r\n"
                              b"X-Pad:  a b  \r\nContent-Length: 2\r\n\r\nno", eof=False)
    assert head == h1.Head(http_version="1.1", status=404, reason="Not Found Here",
                           headers=[("content-type", "text/html; charset=x"), ("x-pad", "a b"),
                                    ("content-length", "2")])
    assert body == b"no" and reader.done and reader.reusable


def test_bytes_after_the_response_make_the_connection_unusable() -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"
    head, body, reader = read(data, eof=False)
    assert body == b"ok" and reader.done and not reader.reusable


def test_a_response_read_to_the_close_is_never_reusable() -> None:
    head, body, reader = read(b"HTTP/1.1 200 OK\r\n\r\nall of it", eof=True)
    assert body == b"all of it" and not reader.reusable


def test_head_request_has_no_body() -> None:
    head, body, reader = read(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", "HEAD", eof=False)
    assert head.status == 200 and body == b"" and reader.reusable


def test_switching_protocols_is_refused() -> None:
    with pytest.raises(h1.RemoteProtocolError, match="switched protocols"):
        read(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n")


@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n",  # the head
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 5000,  # a head that never ends
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;" + b"e" * 5000 + b"\r\nok\r\n0\r\n\r\n",  # chunk line
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: " + b"t" * 5000 + b"\r\n\r\n",  # trailers
])
def test_heads_chunk_lines_and_trailers_are_bounded(data: bytes) -> None:
    for step in (0, 100):
        with pytest.raises(h1.HeadTooLarge):
            read(data, step=step)


def test_a_long_body_is_given_in_pieces_as_it_arrives() -> None:
    reader = h1.ResponseReader("GET", max_head=MAX_HEAD)
    reader.receive_data(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    assert isinstance(reader.next_event(), h1.Head)
    assert reader.next_event() == b"abc"
    assert reader.next_event() is h1.NEED_DATA
    reader.receive_data(b"defghijKLM")
    assert reader.next_event() == b"defghij"
    assert reader.next_event() is h1.END and not reader.reusable  # "KLM" came after the response


def test_request_bytes() -> None:
    data = h1.request_bytes("GET", "/p/1.html?q=1", [("host", "a.test:8080"), ("user-agent", "bot/1 (+x)")])
    assert data == b"GET /p/1.html?q=1 HTTP/1.1\r\nhost: a.test:8080\r\nuser-agent: bot/1 (+x)\r\n\r\n"
    post = h1.request_bytes("POST", "/f", [("host", "a.test"), ("content-length", "3")], b"abc")
    assert post.endswith(b"content-length: 3\r\n\r\nabc")
    # the same bytes as h11 writes
    conn = h11.Connection(h11.CLIENT)
    headers = [("host", "a.test"), ("accept", "*/*"), ("if-none-match", '"e1"')]
    expected = conn.send(h11.Request(method="GET", target="/a", headers=headers)) + conn.send(h11.EndOfMessage())
    assert h1.request_bytes("GET", "/a", headers) == expected
    # a header value read from a response (latin-1) goes back as it came, which h11 refused
    assert b'if-none-match: "e\xe9"' in h1.request_bytes("GET", "/", [("host", "a"), ("if-none-match", '"e\xe9"')])


@pytest.mark.parametrize(("method", "target", "headers"), [
    ("GET", "/a b", [("host", "a")]),
    ("GET", "/a\x00", [("host", "a")]),
    ("GET", "", [("host", "a")]),
    ("G T", "/", [("host", "a")]),
    ("GET", "/", []),
    ("GET", "/", [("host", "a"), ("Host", "b")]),
    ("GET", "/", [("host", "a"), ("x-bad", "line\r\nInjected: yes")]),
    ("GET", "/", [("host", "a"), ("bad name", "x")]),
    ("GET", "/", [("host", "a"), ("x", "\u20ac")]),
])
def test_requests_http_cannot_carry_are_refused(method: str, target: str, headers: list[tuple[str, str]]) -> None:
    with pytest.raises(h1.LocalProtocolError):
        h1.request_bytes(method, target, headers)
    for _ in range(2):  # a refused header list is not remembered as good
        with pytest.raises(h1.LocalProtocolError):
            h1.request_bytes(method, target, headers)


def test_a_large_head_dripped_byte_by_byte() -> None:
    """A head arriving a byte at a time (a hostile or slow server) is read whole; the buffer grows in place and
    is searched once through, and the body pieces that follow are bytes."""
    fields = [(f"x-field-{i}", "v" * 40) for i in range(300)]
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(f"{n}: {v}\r\n".encode() for n, v in fields)
    data = head + b"Transfer-Encoding: chunked\r\n\r\n" + b"5;" + b"e" * 300 + b"\r\nhello\r\n0\r\n\r\n"
    got, body, reader = read(data, step=1, eof=False, max_head=65536)
    assert got.headers == [*fields, ("transfer-encoding", "chunked")]
    assert body == b"hello" and reader.reusable
    pieces = []
    reader = h1.ResponseReader("GET", max_head=65536)
    for byte in (data[i:i + 1] for i in range(len(data))):
        reader.receive_data(byte)
        while (event := reader.next_event()) is not h1.NEED_DATA and event is not h1.END:
            if not isinstance(event, h1.Head):
                pieces.append(event)
    assert pieces and all(type(p) is bytes for p in pieces) and b"".join(pieces) == b"hello"
