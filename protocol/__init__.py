"""Pure, sans-I/O wire protocol between peers: frames, codecs, messages, handshake, limits.

A `Connection` turns received bytes into events and messages into bytes; it never touches a socket, a clock or
a random source (the handshake's nonces are passed in). The wire format is specified in docs/protocol.md.
"""

from ._codec import CODECS, decode_body, encode_body
from ._connection import NEED_DATA, Connection, ConnectionClosed, Established, Event, NeedData, Role, State
from ._errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ._frames import COMPRESSIONS, FLAG_ZLIB, HEADER_SIZE, encode_frame
from ._handshake import MIN_SECRET_SIZE, PROTOCOL_VERSION, SUPPORTED_VERSIONS
from ._limits import Limits
from ._messages import (
    MEMBER_STATES,
    NONCE_SIZE,
    PROOF_SIZE,
    PROTOCOL_NAME,
    TYPE_CODES,
    BatchAck,
    Challenge,
    Goodbye,
    Gossip,
    HandoffAck,
    HandoffChunk,
    Hello,
    HostState,
    Member,
    Message,
    Ping,
    Pong,
    ProgressQuery,
    ProgressReport,
    ProbeReply,
    ProbeRequest,
    Reject,
    UrlBatch,
    UrlEntry,
    Welcome,
)

__all__ = [
    "CODECS",
    "COMPRESSIONS",
    "FLAG_ZLIB",
    "HEADER_SIZE",
    "MEMBER_STATES",
    "MIN_SECRET_SIZE",
    "NEED_DATA",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "PROTOCOL_NAME",
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "TYPE_CODES",
    "BatchAck",
    "Challenge",
    "Connection",
    "ConnectionClosed",
    "Established",
    "Event",
    "Gossip",
    "Goodbye",
    "HandoffAck",
    "HandoffChunk",
    "Hello",
    "HostState",
    "Limits",
    "LocalProtocolError",
    "Member",
    "Message",
    "NeedData",
    "Ping",
    "Pong",
    "ProgressQuery",
    "ProgressReport",
    "ProbeReply",
    "ProbeRequest",
    "ProtocolError",
    "Reject",
    "RemoteProtocolError",
    "Role",
    "State",
    "UrlBatch",
    "UrlEntry",
    "Welcome",
    "decode_body",
    "encode_body",
    "encode_frame",
]
