"""`peer.fetch.h2client.H2Session` without a socket: an `h2` server connection in memory answers it, and the
session's events are the same whether the server's bytes come whole or byte by byte."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from peer.fetch import h1
from peer.fetch.h2client import H2Session, StreamRefused

HEADERS = [("host", "a.test"), ("user-agent", "t/1"), ("accept", "*/*"), ("connection", "keep-alive")]


def pair(**options: int) -> tuple[H2Session, h2.connection.H2Connection]:
    session = H2Session(max_head=65536, **options)
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    server.receive_data(session.outgoing())
    session.receive_data(server.data_to_send())
    assert session.next_event() is h1.NEED_DATA  # settings only
    server.receive_data(session.outgoing())
    return session, server


def ask(session: H2Session, server: h2.connection.H2Connection, path: str = "/") -> tuple[int, dict[bytes, bytes]]:
    request = [e for e in server.receive_data(session.request("GET", "https", path, HEADERS))
               if isinstance(e, h2.events.RequestReceived)]
    assert len(request) == 1
    return request[0].stream_id, dict(request[0].headers)


def read(session: H2Session, data: bytes, *, byte_by_byte: bool) -> list[object]:
    events: list[object] = []
    for piece in ([data[i:i + 1] for i in range(len(data))] if byte_by_byte else [data]):
        session.receive_data(piece)
        while (event := session.next_event()) is not h1.NEED_DATA:
            events.append(event)
            if event is h1.END:
                return events
    return events


@pytest.mark.parametrize("byte_by_byte", [False, True])
def test_a_response_whole_or_byte_by_byte(byte_by_byte: bool) -> None:
    session, server = pair()
    sid, request = ask(session, server, "/p?q=1")
    assert request[b":authority"] == b"a.test" and request[b":path"] == b"/p?q=1" and b"connection" not in request
    assert b"host" not in request and request[b"user-agent"] == b"t/1"
    server.send_headers(sid, [(b":status", b"404"), (b"content-type", b"text/html"), (b"x-a", b"1")])
    server.send_data(sid, b"hello ")
    server.send_data(sid, b"world", end_stream=True)
    events = read(session, server.data_to_send(), byte_by_byte=byte_by_byte)
    head = events[0]
    assert isinstance(head, h1.Head) and (head.status, head.reason, head.http_version) == (404, "Not Found", "2")
    assert head.headers == [("content-type", "text/html"), ("x-a", "1")]
    assert b"".join(e for e in events if isinstance(e, bytes)) == b"hello world" and events[-1] is h1.END
    assert session.reusable


def test_reuse_ends_after_max_requests_and_after_goaway() -> None:
    session, server = pair(max_requests=2)
    for n in range(2):
        sid, _ = ask(session, server)
        server.send_headers(sid, [(b":status", b"200")], end_stream=True)
        assert read(session, server.data_to_send(), byte_by_byte=False)[-1] is h1.END
        assert session.reusable is (n == 0)
    session, server = pair()
    sid, _ = ask(session, server)
    server.send_headers(sid, [(b":status", b"200")], end_stream=True)
    server.close_connection(last_stream_id=sid)
    read(session, server.data_to_send(), byte_by_byte=False)
    session.receive_data(b"")
    assert not session.reusable


def test_refused_and_reset_streams() -> None:
    session, server = pair()
    sid, _ = ask(session, server)
    server.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
    with pytest.raises(StreamRefused):
        read(session, server.data_to_send(), byte_by_byte=False)
    session, server = pair()
    sid, _ = ask(session, server)
    server.send_headers(sid, [(b":status", b"200")])
    server.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
    with pytest.raises(h1.RemoteProtocolError, match="CANCEL") as reset:
        read(session, server.data_to_send(), byte_by_byte=False)
    assert not isinstance(reset.value, StreamRefused)  # a head came: not safe to send again


def test_a_ping_flood_is_cut_and_the_pings_answered_until_then() -> None:
    session, server = pair(max_control_frames=50)
    ask(session, server)
    for i in range(60):
        server.ping(b"%08d" % i)
    with pytest.raises(h1.RemoteProtocolError, match="control frames"):
        read(session, server.data_to_send(), byte_by_byte=False)
    acks = [e for e in server.receive_data(session.outgoing()) if isinstance(e, h2.events.PingAckReceived)]
    assert 0 < len(acks) <= 60


def test_garbage_from_the_server_is_its_fault() -> None:
    session, _ = pair()
    session.request("GET", "https", "/", HEADERS)
    with pytest.raises(h1.RemoteProtocolError):
        session.receive_data(b"HTTP/1.1 200 OK\r\n\r\n" * 4)
        session.next_event()


def test_an_oversized_frame_is_refused_before_it_is_buffered() -> None:
    session, server = pair()
    sid, _ = ask(session, server)
    server.send_headers(sid, [(b":status", b"200")])
    session.receive_data(server.data_to_send())
    assert isinstance(session.next_event(), h1.Head)
    claim = (1 << 24) - 1  # the largest length a frame header can claim
    with pytest.raises(h1.RemoteProtocolError, match="frame larger"):
        session.receive_data(claim.to_bytes(3, "big") + b"\x00\x00" + sid.to_bytes(4, "big") + bytes(20_000))


def test_requests_http_cannot_carry_are_ours() -> None:
    session, _ = pair()
    with pytest.raises(h1.LocalProtocolError):
        session.request("GET", "https", "/", [("user-agent", "t")])  # no Host
    with pytest.raises(h1.LocalProtocolError):
        session.request("GET", "https", "/", [("host", "a.test"), ("x", "a\r\nb")])
