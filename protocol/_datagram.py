"""Datagrams (protocol version 5): the probes and gossip of membership without a connection.

SWIM's probes are small, frequent and go round-robin over every member, so a node of a large cluster talks to a
different peer every second. Over a connection, each of those first costs a handshake (three frames, about 440
bytes, two HMAC proofs); as a datagram a Ping costs one packet of about 35 bytes. Gossip of changed records goes
to a few random members each round, so at scale it too meets a new peer at nearly every send. memberlist does
the same: probes, acks and gossip over UDP, full state over TCP.

A datagram is one message, whole, in msgpack, authenticated by the cluster secret:

    "PD" | version u8 (5) | type u8 | sender length u8 | sender (UTF-8) | body | tag (16 bytes)

- Only `DATAGRAM_TYPES` travel this way (Ping, Pong, ProbeRequest, ProbeReply, Gossip); the rest keep their
  links, and so does a Gossip too large for one datagram (a full view, or many changes at once).
- `tag` is keyed BLAKE2b-128 under the datagram key (HMAC-SHA256 of the secret over a label) over the
  recipient's node id (length-prefixed, not sent: the receiver knows its own) and every byte before the tag. So
  a datagram forged without the secret, altered, or meant for another node is refused; the recipient's id in the
  tag keeps one node's datagram from being replayed to another.
- There is no connection, so no sequence number protects against a replay to the same recipient. What a replay
  can do is bounded and harmless: a replayed Ping is answered once (to the sender's address in the view, never to
  the packet's source), a replayed Pong or ProbeReply matches no probe in progress (sequence numbers only grow),
  a replayed ProbeRequest costs one Ping (indirect probes in flight are capped), and a replayed Gossip carries
  records the merge already holds or has superseded (records only move up: ring/_view.py).
- A datagram is at most `MAX_DATAGRAM` bytes (below an Ethernet MTU with IP and UDP headers), checked on both
  sides; the body obeys the same `Limits` as a frame's.

Pure: bytes in, messages out; no socket, clock or randomness.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from ._codec import decode_body, encode_body
from ._errors import LocalProtocolError, RemoteProtocolError
from ._handshake import TAG_SIZE
from ._limits import Limits
from ._messages import TYPE_CODES, Gossip, Message, Ping, Pong, ProbeReply, ProbeRequest

__all__ = [
    "DATAGRAM_TYPES",
    "DATAGRAM_VERSION",
    "MAX_DATAGRAM",
    "datagram_key",
    "decode_datagram",
    "encode_datagram",
]

#: The protocol version that brought datagrams; a datagram names it in its third byte.
DATAGRAM_VERSION = 5
#: 1,200 bytes: under a 1,500-byte Ethernet MTU less IPv6 and UDP headers, so a datagram is never fragmented.
MAX_DATAGRAM = 1200
DATAGRAM_TYPES: tuple[type, ...] = (Ping, Pong, ProbeRequest, ProbeReply, Gossip)

_MAGIC = b"PD"
_HEADER = struct.Struct("!2sBBB")  # magic, version, type, sender length
_KEY_LABEL = b"peercrawl datagram key\x00"
_CODES = frozenset(TYPE_CODES[cls] for cls in DATAGRAM_TYPES)
#: A node id in a datagram fits its one-byte length.
_MAX_SENDER = 255


def datagram_key(secret: bytes) -> bytes:
    """The key of every datagram in a cluster: HMAC-SHA256 of the secret over a label of its own, so it is never a
    handshake proof or a frame key."""
    return hmac.new(secret, _KEY_LABEL, hashlib.sha256).digest()


def _tag(key: bytes, recipient: bytes, signed: bytes) -> bytes:
    mac = hashlib.blake2b(key=key, digest_size=TAG_SIZE)
    mac.update(struct.pack("!H", len(recipient)) + recipient)
    mac.update(signed)
    return mac.digest()


def encode_datagram(message: Message, *, key: bytes, sender: str, recipient: str, limits: Limits) -> bytes:
    """The datagram carrying `message` from `sender` to `recipient`; LocalProtocolError if it may not travel as a
    datagram (its type, an invalid message, a sender id over 255 bytes, or a size over MAX_DATAGRAM)."""
    if not isinstance(message, DATAGRAM_TYPES):
        raise LocalProtocolError(f"{type(message).__name__} does not travel as a datagram, only over a link")
    sender_bytes = sender.encode("utf-8")
    if not sender_bytes or len(sender_bytes) > _MAX_SENDER:
        raise LocalProtocolError(f"a datagram's sender id must be 1-{_MAX_SENDER} bytes, got {len(sender_bytes)}")
    code, body = encode_body(message, "msgpack", limits, DATAGRAM_VERSION)
    signed = _HEADER.pack(_MAGIC, DATAGRAM_VERSION, code, len(sender_bytes)) + sender_bytes + body
    if len(signed) + TAG_SIZE > MAX_DATAGRAM:
        raise LocalProtocolError(f"{type(message).__name__} makes a datagram of {len(signed) + TAG_SIZE} bytes, over "
                                 f"{MAX_DATAGRAM}")
    return signed + _tag(key, recipient.encode("utf-8"), signed)


def decode_datagram(data: bytes, *, key: bytes, recipient: str, limits: Limits) -> tuple[str, Message]:
    """(sender id, message) of a datagram meant for `recipient`; RemoteProtocolError, saying why, for anything
    else (not a datagram, another version or type, a wrong tag, an invalid body)."""
    if len(data) > MAX_DATAGRAM:
        raise RemoteProtocolError(f"datagram of {len(data)} bytes, over the limit of {MAX_DATAGRAM}")
    if len(data) < _HEADER.size + 1 + TAG_SIZE:
        raise RemoteProtocolError(f"datagram of {len(data)} bytes is too short to be one")
    magic, version, code, size = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise RemoteProtocolError("not a peer datagram (bad magic)")
    if version != DATAGRAM_VERSION:
        raise RemoteProtocolError(f"datagram of protocol version {version}; we speak {DATAGRAM_VERSION}")
    if code not in _CODES:
        raise RemoteProtocolError(f"datagram of type 0x{code:02x}, which does not travel as a datagram")
    signed, tag = data[:-TAG_SIZE], data[-TAG_SIZE:]
    if size < 1 or _HEADER.size + size > len(signed):
        raise RemoteProtocolError(f"datagram's sender length {size} does not fit its {len(data)} bytes")
    # The tag first: nothing of a datagram forged without the secret is parsed further.
    if not hmac.compare_digest(tag, _tag(key, recipient.encode("utf-8"), signed)):
        raise RemoteProtocolError("datagram with a wrong tag: forged, altered, or meant for another node")
    try:
        sender = signed[_HEADER.size : _HEADER.size + size].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"datagram's sender id is not UTF-8: {exc}") from None
    return sender, decode_body(code, signed[_HEADER.size + size :], "msgpack", limits, DATAGRAM_VERSION)
