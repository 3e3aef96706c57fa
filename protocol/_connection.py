"""One peer connection as a state machine, in the manner of h11: bytes in, events out, no I/O.

The caller feeds received bytes with `receive_data`, pulls events with `next_event` until NEED_DATA, writes the
bytes that `initiate`, `send` and `data_to_send` return, and closes the socket when told. Nothing but the
handshake is accepted until both sides have proved the cluster secret; the handshake's replies are made here
(they need the secret) and wait in `data_to_send`.

Before the handshake completes a frame may be at most `Limits.max_handshake_frame` bytes, so a stranger who has
proved nothing can make us hold only a few KiB. After it, every application frame carries a tag (keyed
BLAKE2b-128, one key per direction derived from the secret and both nonces, over an implicit sequence number),
checked before the body is inflated or decoded: a frame injected into the stream, replayed, reordered or
dropped ends the connection with a RemoteProtocolError.

    initiator                                   responder
    initiate() -> Hello          ---------->    (queues Challenge or Reject)
                                 <----------    Challenge   [proof of the secret, over our nonce]
    Established; queues Welcome  ---------->    Established [after checking our proof, over its nonce]
    send(UrlBatch) ...           <--------->    send(BatchAck) ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal, TypeAlias

from ._codec import CODECS, decode_body, encode_body
from ._errors import LocalProtocolError, RemoteProtocolError
from ._frames import COMPRESSIONS, FLAGS, HEADER_SIZE, FrameReader, compress, decompress, encode_frame
from ._handshake import (
    MIN_SECRET_SIZE,
    SUPPORTED_VERSIONS,
    TAG_SIZE,
    choose,
    frame_keys,
    frame_tag,
    initiator_proof,
    proofs_match,
    responder_proof,
)
from ._limits import Limits
from ._messages import HANDSHAKE_CODES, KNOWN_CODES, NONCE_SIZE, Challenge, Goodbye, Hello, Message, Reject, Welcome
from ._schema import Invalid, Text

__all__ = ["NEED_DATA", "Connection", "ConnectionClosed", "Established", "Event", "NeedData", "Role", "State"]


class Role(Enum):
    INITIATOR = "initiator"
    RESPONDER = "responder"


class State(Enum):
    IDLE = "idle"  # nothing exchanged yet
    HELLO_SENT = "hello-sent"  # initiator: waiting for the Challenge
    CHALLENGE_SENT = "challenge-sent"  # responder: waiting for the Welcome
    ESTABLISHED = "established"  # both proofs checked (from this side's point of view)
    CLOSED = "closed"  # the peer's stream ended
    ERROR = "error"  # the peer broke the protocol; only closing is left


class NeedData(Enum):
    NEED_DATA = "NEED_DATA"


NEED_DATA: Literal[NeedData.NEED_DATA] = NeedData.NEED_DATA


@dataclass(frozen=True, slots=True, kw_only=True)
class Established:
    """The handshake succeeded: who the peer is and what was agreed."""

    node_id: str
    version: int
    codec: str
    compression: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionClosed:
    """The peer's byte stream ended; `clean` if it said Goodbye or Reject first."""

    clean: bool


Event: TypeAlias = Message | Established | ConnectionClosed

_HANDSHAKE_TYPES = (Hello, Challenge, Welcome)


class Connection:
    """The protocol state of one connection, from one side (`role`)."""

    def __init__(
        self,
        role: Role,
        *,
        node_id: str,
        secret: bytes,
        nonce: bytes | Callable[[int], bytes],
        limits: Limits | None = None,
        codecs: Sequence[str] = CODECS,
        compressions: Sequence[str] = ("none",),
        versions: Sequence[int] = SUPPORTED_VERSIONS,
        compress_level: int = 1,
        compress_min: int = 512,
    ) -> None:
        if not isinstance(role, Role):
            raise LocalProtocolError(f"role must be a Role, got {role!r}")
        if type(secret) is not bytes or len(secret) < MIN_SECRET_SIZE:
            raise LocalProtocolError(f"the cluster secret must be at least {MIN_SECRET_SIZE} bytes")
        self._check_choices("codecs", codecs, CODECS)
        self._check_choices("compressions", compressions, COMPRESSIONS)
        self._check_choices("versions", versions, SUPPORTED_VERSIONS)
        self.role = role
        self.node_id = node_id
        self.limits = limits or Limits()
        self._secret = secret
        self._nonce_source = nonce
        self._codecs = tuple(codecs)
        self._compressions = tuple(compressions)
        self._versions = tuple(versions)
        self._compress_level = compress_level
        self._compress_min = compress_min
        self._reader = FrameReader(min(self.limits.max_handshake_frame, self.limits.max_frame))
        self._outgoing = bytearray()
        self._state = State.IDLE
        self._error: str | None = None
        self._eof = False
        self._hello_body = b""
        self._challenge_body = b""
        self._nonce = b""
        self._peer_nonce = b""
        self._send_key = b""  # the frame keys, set when established
        self._receive_key = b""
        self._send_seq = 0  # authenticated frames sent / received so far: the next frame's sequence number
        self._receive_seq = 0
        self.peer_node_id: str | None = None
        self.version: int | None = None
        self.codec: str | None = None
        self.compression: str | None = None
        self.sent_close = False  # we sent Goodbye or Reject: nothing more may be sent
        self.received_close = False  # the peer sent Goodbye or Reject: nothing more may arrive
        try:
            Text().dump(node_id, True, self.limits)
        except Invalid as exc:
            raise LocalProtocolError(f"node_id: {exc.message}") from None

    @staticmethod
    def _check_choices(what: str, given: Sequence[object], known: Sequence[object]) -> None:
        if not given or any(item not in known for item in given):
            raise LocalProtocolError(f"{what} must be a non-empty selection of {list(known)}, got {list(given)}")

    @property
    def state(self) -> State:
        return self._state

    # --- sending -------------------------------------------------------------------------------------------

    def initiate(self) -> bytes:
        """The initiator's Hello frame; call once, first."""
        if self.role is not Role.INITIATOR or self._state is not State.IDLE:
            raise LocalProtocolError(
                f"initiate() is for an idle initiator; this is a {self.role.value} in state {self._state.value}"
            )
        self._nonce = self._draw_nonce()
        hello = Hello(
            versions=self._versions,
            codecs=self._codecs,
            compressions=self._compressions,
            node_id=self.node_id,
            nonce=self._nonce,
        )
        code, self._hello_body = encode_body(hello, "json", self.limits)
        self._state = State.HELLO_SENT
        return encode_frame(code, 0, self._hello_body)

    def send(self, message: Message) -> bytes:
        """The frame for `message`. Reject may be sent at any time; other messages only once established."""
        name = type(message).__name__
        if self._state is State.ERROR:
            raise LocalProtocolError(f"cannot send {name}: the connection failed ({self._error})")
        if self.sent_close:
            raise LocalProtocolError(f"cannot send {name}: we already sent Goodbye or Reject")
        if isinstance(message, _HANDSHAKE_TYPES):
            raise LocalProtocolError(f"cannot send {name}: the connection makes handshake messages itself")
        if isinstance(message, Reject):
            code, body = encode_body(message, "json", self.limits)
            self.sent_close = True
            return encode_frame(code, 0, body)
        if self._state is not State.ESTABLISHED:
            raise LocalProtocolError(f"cannot send {name} before the handshake completes (state {self._state.value})")
        assert self.codec is not None
        assert self.version is not None
        code, body = encode_body(message, self.codec, self.limits, self.version)
        if len(body) + 2 + TAG_SIZE > self.limits.max_frame:
            raise LocalProtocolError(
                f"cannot send {name}: it encodes to {len(body) + 2 + TAG_SIZE} bytes with its tag, over the frame "
                f"limit of {self.limits.max_frame}; send it in smaller parts"
            )
        flags = 0
        flag = FLAGS.get(self.compression or "none")
        if flag is not None and len(body) >= self._compress_min:
            packed = compress(body, self._compress_level, self.compression or "none")
            if len(packed) < len(body):
                body, flags = packed, flag
        if isinstance(message, Goodbye):
            self.sent_close = True
        tag = frame_tag(self._send_key, self._send_seq, code, flags, body)
        self._send_seq += 1
        return encode_frame(code, flags, body + tag)

    def data_to_send(self) -> bytes:
        """Bytes the connection produced on its own (handshake replies, a Reject after an error); write them."""
        out = bytes(self._outgoing)
        self._outgoing.clear()
        return out

    # --- receiving -----------------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Add bytes from the peer; b"" means the peer closed its side. Drain events before feeding more."""
        if self._eof:
            raise LocalProtocolError("receive_data() after the end of the stream was already fed")
        if not data:
            self._eof = True
            return
        if len(self._reader) > self._reader.max_frame + HEADER_SIZE:
            raise LocalProtocolError("call next_event() until NEED_DATA before feeding more data")
        self._reader.feed(data)

    def next_event(self) -> Event | Literal[NeedData.NEED_DATA]:
        """The next event, or NEED_DATA. RemoteProtocolError if the peer broke the protocol."""
        if self._state is State.ERROR:
            raise RemoteProtocolError(f"the connection already failed: {self._error}")
        try:
            while True:
                event = self._step()
                if event is not None:
                    return event
        except RemoteProtocolError as exc:
            self._fail(str(exc))
            raise

    def _step(self) -> Event | Literal[NeedData.NEED_DATA] | None:
        """Process at most one frame; None when it was a handshake frame with nothing to report."""
        frame = self._reader.next_frame()
        if frame is None:
            if not self._eof:
                return NEED_DATA
            if len(self._reader):
                raise RemoteProtocolError("peer closed the connection in the middle of a frame")
            self._state = State.CLOSED
            return ConnectionClosed(clean=self.received_close)
        code, flags, body = frame
        if code not in KNOWN_CODES:
            raise RemoteProtocolError(f"peer sent a frame of unknown type 0x{code:02x}")
        if self.received_close:
            raise RemoteProtocolError(f"peer sent a frame of type 0x{code:02x} after its Goodbye or Reject")
        if code in HANDSHAKE_CODES:
            if flags:
                raise RemoteProtocolError(f"peer set flags 0x{flags:02x} on a handshake frame")
            return self._handshake(code, body)
        if self._state is not State.ESTABLISHED:
            raise RemoteProtocolError(f"peer sent a frame of type 0x{code:02x} before the handshake completed")
        if len(body) < TAG_SIZE:
            raise RemoteProtocolError(f"peer sent a frame of type 0x{code:02x} too short to hold its tag")
        body, tag = body[:-TAG_SIZE], body[-TAG_SIZE:]
        if not proofs_match(frame_tag(self._receive_key, self._receive_seq, code, flags, body), tag):
            raise RemoteProtocolError(
                f"frame {self._receive_seq} (type 0x{code:02x}) from the peer has a wrong tag: it was altered, "
                "injected, replayed or reordered"
            )
        self._receive_seq += 1
        if flags:
            agreed = FLAGS.get(self.compression or "none")
            if flags not in FLAGS.values():
                raise RemoteProtocolError(f"peer set unknown frame flags 0x{flags:02x}")
            if agreed is None:
                raise RemoteProtocolError("peer sent a compressed frame, but compression was not agreed")
            if flags != agreed:
                raise RemoteProtocolError(
                    f"peer sent a frame with flags 0x{flags:02x}, but the agreed compression is {self.compression!r}"
                )
            body = decompress(body, self.limits.max_frame - 2, self.compression or "none")
        assert self.codec is not None and self.version is not None
        message = decode_body(code, body, self.codec, self.limits, self.version)
        if isinstance(message, Goodbye):
            self.received_close = True
        return message

    def _handshake(self, code: int, body: bytes) -> Event | None:
        message = decode_body(code, body, "json", self.limits)
        if isinstance(message, Reject):
            self.received_close = True
            return message
        if isinstance(message, Hello) and self.role is Role.RESPONDER and self._state is State.IDLE:
            self._on_hello(message, body)
            return None
        if isinstance(message, Challenge) and self.role is Role.INITIATOR and self._state is State.HELLO_SENT:
            return self._on_challenge(message, body)
        if isinstance(message, Welcome) and self.role is Role.RESPONDER and self._state is State.CHALLENGE_SENT:
            return self._on_welcome(message)
        raise RemoteProtocolError(
            f"peer sent {type(message).__name__} to a {self.role.value} in state {self._state.value}"
        )

    def _on_hello(self, hello: Hello, body: bytes) -> None:
        self.peer_node_id = hello.node_id
        choice = choose(
            hello.versions,
            hello.codecs,
            hello.compressions,
            versions=self._versions,
            codecs=self._codecs,
            compressions=self._compressions,
        )
        if isinstance(choice, str):
            raise RemoteProtocolError(choice)
        self.version, self.codec, self.compression = choice
        self._hello_body = body
        self._peer_nonce = hello.nonce
        self._nonce = self._draw_nonce()
        proof = responder_proof(
            self._secret,
            hello_body=body,
            nonce=self._nonce,
            node_id=self.node_id,
            version=self.version,
            codec=self.codec,
            compression=self.compression,
        )
        challenge = Challenge(
            version=self.version,
            codec=self.codec,
            compression=self.compression,
            node_id=self.node_id,
            nonce=self._nonce,
            proof=proof,
        )
        code, self._challenge_body = encode_body(challenge, "json", self.limits)
        self._outgoing += encode_frame(code, 0, self._challenge_body)
        self._state = State.CHALLENGE_SENT

    def _on_challenge(self, challenge: Challenge, body: bytes) -> Established:
        self.peer_node_id = challenge.node_id
        self._peer_nonce = challenge.nonce
        if (
            challenge.version not in self._versions
            or challenge.codec not in self._codecs
            or challenge.compression not in self._compressions
        ):
            raise RemoteProtocolError(
                f"peer chose version {challenge.version}, codec {challenge.codec!r}, compression "
                f"{challenge.compression!r}, which we did not offer"
            )
        expected = responder_proof(
            self._secret,
            hello_body=self._hello_body,
            nonce=challenge.nonce,
            node_id=challenge.node_id,
            version=challenge.version,
            codec=challenge.codec,
            compression=challenge.compression,
        )
        if not proofs_match(expected, challenge.proof):
            raise RemoteProtocolError(f"peer {challenge.node_id!r} failed to prove the cluster secret")
        self.version, self.codec, self.compression = challenge.version, challenge.codec, challenge.compression
        welcome = Welcome(proof=initiator_proof(self._secret, hello_body=self._hello_body, challenge_body=body))
        code, welcome_body = encode_body(welcome, "json", self.limits)
        self._outgoing += encode_frame(code, 0, welcome_body)
        return self._establish()

    def _on_welcome(self, welcome: Welcome) -> Established:
        expected = initiator_proof(self._secret, hello_body=self._hello_body, challenge_body=self._challenge_body)
        if not proofs_match(expected, welcome.proof):
            raise RemoteProtocolError(f"peer {self.peer_node_id!r} failed to prove the cluster secret")
        return self._establish()

    def _establish(self) -> Established:
        self._state = State.ESTABLISHED
        self._reader.max_frame = self.limits.max_frame
        if self.role is Role.INITIATOR:
            keys = frame_keys(self._secret, initiator_nonce=self._nonce, responder_nonce=self._peer_nonce)
            self._send_key, self._receive_key = keys.initiator, keys.responder
        else:
            keys = frame_keys(self._secret, initiator_nonce=self._peer_nonce, responder_nonce=self._nonce)
            self._send_key, self._receive_key = keys.responder, keys.initiator
        assert self.peer_node_id is not None and self.version is not None
        assert self.codec is not None and self.compression is not None
        return Established(
            node_id=self.peer_node_id, version=self.version, codec=self.codec, compression=self.compression
        )

    def _fail(self, reason: str) -> None:
        """Enter ERROR and, unless we already closed, queue a Reject telling the peer why."""
        self._state = State.ERROR
        self._error = reason
        if not self.sent_close:
            self.sent_close = True
            limit = min(self.limits.max_string, 512)
            reason = f"{self.node_id} refused the connection: {reason}"
            short = reason.encode("utf-8", "backslashreplace")[:limit].decode("utf-8", "ignore")
            code, body = encode_body(Reject(reason=short), "json", self.limits)
            self._outgoing += encode_frame(code, 0, body)

    def _draw_nonce(self) -> bytes:
        source = self._nonce_source
        value = source(NONCE_SIZE) if callable(source) else source
        if type(value) is not bytes or len(value) != NONCE_SIZE:
            raise LocalProtocolError(f"the nonce must be {NONCE_SIZE} random bytes (pass os.urandom or bytes)")
        return value
