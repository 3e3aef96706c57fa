"""HTTP/2 for the fetcher's client side, sans I/O, over the `h2` library: one request at a time on a
connection, read through the same interface as `peer.fetch.h1.ResponseReader` (``receive_data``,
``next_event`` giving a `h1.Head`, body pieces, then `h1.END`; `h1.NEED_DATA` when it needs bytes), plus
``outgoing()``, the bytes the connection owes the server (settings and ping acknowledgements, window
updates), sent by the caller after each read.

Politeness is the pool's: an origin's connection carries one request in flight, whatever the server's
``SETTINGS_MAX_CONCURRENT_STREAMS``. Every size is bounded:

- the header list by ``max_head`` (advertised as ``SETTINGS_MAX_HEADER_LIST_SIZE`` and enforced by the HPACK
  decoder), a header block's CONTINUATION frames by h2's own cap (64 frames);
- a body by flow control: the stream's window is ``window`` bytes, and a piece is acknowledged (its window
  given back) when the caller takes it, so at most a window is ever buffered, and the caller's body and
  decompression limits apply piece by piece as over HTTP/1.1;
- frames that carry no response (SETTINGS, PING, PRIORITY, WINDOW_UPDATE, unknown types) by
  ``max_control_frames`` per response: a server that floods them is cut off (a protocol error) instead of
  being answered forever;
- a frame by the advertised ``SETTINGS_MAX_FRAME_SIZE`` (16 KiB), checked as its bytes arrive (h2 would
  buffer a frame whole, up to 16 MiB, before checking its length);
- a connection's life by ``max_requests`` (h2 remembers every closed stream; a fresh connection forgets).

A GOAWAY that leaves the request unprocessed, or a stream refused (``REFUSED_STREAM``) before any answer,
raise `StreamRefused`: the request may go again on a new connection. Any other reset is a protocol error.
"""

from __future__ import annotations

from http import HTTPStatus

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from peer.fetch import h1

__all__ = ["H2Session", "StreamRefused"]

_HOP_BY_HOP = frozenset({"host", "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade",
                         "te"})
_CONTROL_EVENTS = (h2.events.RemoteSettingsChanged, h2.events.SettingsAcknowledged, h2.events.PingReceived,
                   h2.events.PingAckReceived, h2.events.WindowUpdated, h2.events.PriorityUpdated,
                   h2.events.UnknownFrameReceived, h2.events.AlternativeServiceAvailable)
_REASONS = {s.value: s.phrase for s in HTTPStatus}
# Outbound headers are checked by `h1.request_bytes` (the HTTP/1.1 grammar, and its check remembered per header
# list), names lower-cased and hop-by-hop fields left out here: h2's own pass over them would repeat that work
# on every request. What the server sends is checked by h2.
_CONFIG = h2.config.H2Configuration(client_side=True, header_encoding=None, validate_inbound_headers=True,
                                    normalize_inbound_headers=True, validate_outbound_headers=False,
                                    normalize_outbound_headers=False)


class _SmallQueue(list[object]):
    """A list with the deque methods h2's settings and hpack's header table use. A `collections.deque` always
    takes a 64-slot block (about 760 bytes); an idle connection's settings and tables hold some sixteen of
    them, which made an idle HTTP/2 connection about 12 KiB heavier than this does."""

    __slots__ = ()

    def popleft(self) -> object:
        return self.pop(0)

    def appendleft(self, item: object) -> None:
        self.insert(0, item)


class _FrameDispatch:
    """h2's table from a frame's class to the connection's handler, looked up per frame instead of held: h2
    builds a dict of twelve bound methods per connection (about 1.3 KiB); this is one small object."""

    __slots__ = ("conn",)

    _HANDLERS = {cls: handler.__name__
                 for cls, handler in h2.connection.H2Connection(_CONFIG)._frame_dispatch_table.items()}

    def __init__(self, conn: h2.connection.H2Connection) -> None:
        self.conn = conn

    def __getitem__(self, cls: type) -> object:
        return getattr(self.conn, self._HANDLERS[cls])


def _compact(conn: h2.connection.H2Connection) -> None:
    """Shrink what an idle connection holds: closed streams dropped (h2 drops them when it counts open streams),
    the settings' and header tables' deques made lists."""
    conn.open_outbound_streams  # noqa: B018 - the property's side effect is the clean-up
    for settings in (conn.local_settings, conn.remote_settings):
        table = settings._settings
        for key, values in table.items():
            if type(values) is not _SmallQueue:
                table[key] = _SmallQueue(values)  # type: ignore[assignment]  # h2 annotates a deque; a list has the methods it calls
    for header_table in (conn.encoder.header_table, conn.decoder.header_table):
        if type(header_table.dynamic_entries) is not _SmallQueue:
            header_table.dynamic_entries = _SmallQueue(header_table.dynamic_entries)  # type: ignore[assignment]  # hpack annotates a deque; likewise


class StreamRefused(h1.RemoteProtocolError):
    """The server did not process the request (GOAWAY past it, or REFUSED_STREAM): safe to send again."""


class H2Session:
    """One HTTP/2 connection's protocol state; a request at a time (`request`), its response read as events."""

    __slots__ = ("_conn", "_control", "_ended", "_events", "_goaway", "_head", "_max_control", "_max_requests",
                 "_requests", "_stream", "_window", "max_head")

    def __init__(self, *, max_head: int, window: int = 1 << 20, max_control_frames: int = 1000,
                 max_requests: int = 1000) -> None:
        conn = h2.connection.H2Connection(_CONFIG)
        conn._frame_dispatch_table = _FrameDispatch(conn)  # type: ignore[assignment]  # h2 only indexes it
        conn.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1,  # nothing may be pushed or opened by the server
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: max_head,
        })
        conn.initiate_connection()
        conn.increment_flow_control_window(window)  # the connection's window: one stream's plus the default
        conn.decoder.max_header_list_size = max_head  # before the server acknowledges our settings too
        conn.decoder.max_allowed_table_size = 4096
        self._conn = conn
        self.max_head = max_head
        self._window = window
        self._max_control = max_control_frames
        self._max_requests = max_requests
        self._requests = 0
        self._stream = 0
        self._events: list[object] = []
        self._head: h1.Head | None = None
        self._ended = True
        self._goaway: int | None = None  # the server's last stream id, once it sent GOAWAY
        self._control = 0

    @property
    def reusable(self) -> bool:
        return self._ended and self._goaway is None and self._requests < self._max_requests and (
            self._conn.state_machine.state is not h2.connection.ConnectionState.CLOSED)

    def request(self, method: str, scheme: str, target: str, headers: list[tuple[str, str]],
                content: bytes = b"") -> bytes:
        """Open a stream for one request (the previous response must be over); returns the bytes to send.
        ``headers`` are the HTTP/1.1 list (with Host): Host becomes ``:authority`` and hop-by-hop fields are
        left out. Raises h1.LocalProtocolError for a request HTTP/2 cannot carry."""
        if not self._ended:
            raise h1.LocalProtocolError("the previous response on this connection is not over")
        h1.request_bytes(method, target, headers)  # the grammar's checks (remembered per header list)
        authority = ""
        fields: list[tuple[bytes, bytes]] = []
        for name, value in headers:
            lower = name.lower()
            if lower == "host":
                authority = value
            elif lower not in _HOP_BY_HOP:
                fields.append((lower.encode("latin-1"), value.encode("latin-1")))
        if not authority:
            raise h1.LocalProtocolError("missing Host header")
        pseudo = [(b":method", method.encode("ascii")), (b":authority", authority.encode("latin-1")),
                  (b":scheme", scheme.encode("ascii")), (b":path", target.encode("ascii"))]
        conn = self._conn
        try:
            stream = conn.get_next_available_stream_id()
            conn.send_headers(stream, pseudo + fields, end_stream=not content)
            if content:
                if len(content) > conn.local_flow_control_window(stream):
                    raise h1.LocalProtocolError("a request body larger than the server's flow-control window")
                step = conn.max_outbound_frame_size
                for i in range(0, len(content), step):
                    conn.send_data(stream, content[i:i + step], end_stream=i + step >= len(content))
        except (h2.exceptions.ProtocolError, UnicodeEncodeError, ValueError) as exc:
            raise h1.LocalProtocolError(f"cannot send this request over HTTP/2: {exc}") from exc
        self._stream = stream
        self._requests += 1
        self._ended = False
        self._head = None
        self._events = []
        self._control = 0
        return conn.data_to_send()

    def outgoing(self) -> bytes:
        return self._conn.data_to_send()

    def receive_data(self, data: bytes | bytearray) -> None:
        if not data:
            if not self._ended:
                self._events.append(_Eof())
            return
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.DenialOfServiceError as exc:
            raise h1.HeadTooLarge(f"HTTP/2 header block: {exc}") from exc
        except h2.exceptions.ProtocolError as exc:
            if "header list" in str(exc).lower() or "too large" in str(exc).lower():
                raise h1.HeadTooLarge(f"HTTP/2 header list exceeds {self.max_head} bytes") from exc
            raise h1.RemoteProtocolError(f"HTTP/2: {exc}") from exc
        # h2 checks a frame's length only once the whole frame is in: a header claiming 16 MiB would be buffered
        # whole first. What is left after the complete frames is one partial frame: its header says its length.
        pending = self._conn.incoming_buffer._data
        if len(pending) >= 3 and int.from_bytes(pending[:3], "big") > self._conn.max_inbound_frame_size:
            raise h1.RemoteProtocolError(f"HTTP/2 frame larger than the {self._conn.max_inbound_frame_size} bytes "
                                         "allowed")
        self._events.extend(events)

    def next_event(self) -> h1.Head | bytes | h1._Sentinel:
        events = self._events
        while events:
            event = events.pop(0)
            stream = getattr(event, "stream_id", None)
            if isinstance(event, _CONTROL_EVENTS):
                self._control += 1
                if self._control > self._max_control:
                    self._conn.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
                    raise h1.RemoteProtocolError(
                        f"HTTP/2: over {self._max_control} control frames (SETTINGS, PING, ...) for one response")
                continue
            if isinstance(event, h2.events.ConnectionTerminated):
                self._goaway = event.last_stream_id or 0
                if self._stream > self._goaway and self._head is None:
                    raise StreamRefused(f"HTTP/2 GOAWAY ({_code(event.error_code)}) before the request was "
                                        "processed")
                if event.error_code not in (0, None):
                    raise h1.RemoteProtocolError(f"HTTP/2 GOAWAY: {_code(event.error_code)}")
                continue
            if isinstance(event, _Eof):
                if self._head is None and self._goaway is not None:
                    raise StreamRefused("the server closed the HTTP/2 connection before answering")
                raise h1.RemoteProtocolError("the server closed the HTTP/2 connection mid-response")
            if stream != self._stream or self._ended:
                continue  # an old stream's late frames
            if isinstance(event, h2.events.ResponseReceived):
                self._head = _head(event.headers)
                return self._head
            if isinstance(event, h2.events.DataReceived):
                if event.flow_controlled_length:
                    self._conn.acknowledge_received_data(event.flow_controlled_length, stream)
                if self._head is None:
                    raise h1.RemoteProtocolError("HTTP/2 DATA before the response headers")
                if event.data:
                    return event.data
                continue
            if isinstance(event, h2.events.StreamEnded):
                if self._head is None:
                    raise h1.RemoteProtocolError("HTTP/2 stream ended without a response")
                self._ended = True
                self._head = None  # the caller has it; an idle connection holds nothing of the response
                _compact(self._conn)
                return h1.END
            if isinstance(event, h2.events.StreamReset):
                self._ended = True
                if event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM and self._head is None:
                    raise StreamRefused("HTTP/2 stream refused by the server")
                raise h1.RemoteProtocolError(f"HTTP/2 stream reset by the server ({_code(event.error_code)})")
            # InformationalResponseReceived, TrailersReceived, priority and the like: nothing to give
        return h1.NEED_DATA


class _Eof:
    __slots__ = ()


def _code(code: object) -> str:
    try:
        return h2.errors.ErrorCodes(code).name  # type: ignore[arg-type]
    except ValueError:
        return f"error {code}"


def _head(raw: list[tuple[bytes, bytes]]) -> h1.Head:
    status = 0
    headers: list[tuple[str, str]] = []
    for name, value in raw:
        if name == b":status":
            status = int(value)
        elif name[:1] != b":":
            headers.append((name.decode("latin-1"), value.decode("latin-1")))
    return h1.Head(http_version="2", status=status, reason=_REASONS.get(status, ""), headers=headers)
