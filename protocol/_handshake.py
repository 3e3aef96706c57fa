"""The handshake's arithmetic: choosing what both sides speak, the HMAC proofs of the cluster secret, and the
keys and tags that authenticate every frame after the handshake.

Each side proves it knows the secret by an HMAC-SHA256 over the other side's fresh nonce (and everything said
so far), so a proof recorded from one connection is useless on another, and a proof made in one role cannot
be reflected back in the other role (the labels differ). After the handshake each direction has its own frame
key, derived from the secret and both nonces, and every frame carries a keyed BLAKE2b tag over its sequence
number, header and body, so a frame injected, replayed, reordered or dropped in the middle of a connection is
detected. The exact inputs are in docs/protocol.md.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MIN_SECRET_SIZE",
    "PROTOCOL_VERSION",
    "TAG_SIZE",
    "FrameKeys",
    "frame_keys",
    "frame_tag",
    "SUPPORTED_VERSIONS",
    "choose",
    "initiator_proof",
    "responder_proof",
    "proofs_match",
]

# Version 2 added the per-frame tag; a version-1 peer is refused in the handshake (no common version).
# Version 3 writes URL lists in msgpack as front-coded columns (protocol/_urlcolumns.py); 2 wrote each entry whole.
# Version 4 added failure zones and progress waves; version 5 adds probe datagrams (protocol/_datagram.py) and
# changes nothing on a link: a link of version 5 says that the peer answers probes by datagram. Version 6 adds
# the outputs (upload, webhook, crawl log) to a status report; version 7 the revisit schedules to a queued-URL
# replica.
PROTOCOL_VERSION = 7
SUPPORTED_VERSIONS = (2, 3, 4, 5, 6, PROTOCOL_VERSION)
MIN_SECRET_SIZE = 16
# 16 bytes (128 bits) of keyed BLAKE2b: forging one needs about 2^128 tries, and each wrong try ends the connection.
TAG_SIZE = 16

_RESPONDER_LABEL = b"peercrawl responder proof\x00"
_INITIATOR_LABEL = b"peercrawl initiator proof\x00"
_FRAME_KEY_LABEL = b"peercrawl frame key\x00"
_U16 = struct.Struct("!H")
_U64 = struct.Struct("!Q")
_U32 = struct.Struct("!I")


def _field(text: str) -> bytes:
    data = text.encode("utf-8")
    return _U32.pack(len(data)) + data


def responder_proof(
    secret: bytes,
    *,
    hello_body: bytes,
    nonce: bytes,
    node_id: str,
    version: int,
    codec: str,
    compression: str,
) -> bytes:
    """The responder's proof: binds the initiator's whole Hello (and its nonce) to the responder's choices."""
    message = b"".join(
        (
            _RESPONDER_LABEL,
            hashlib.sha256(hello_body).digest(),
            nonce,
            _field(node_id),
            _U16.pack(version),
            _field(codec),
            _field(compression),
        )
    )
    return hmac.new(secret, message, hashlib.sha256).digest()


def initiator_proof(secret: bytes, *, hello_body: bytes, challenge_body: bytes) -> bytes:
    """The initiator's proof: binds its Hello and the responder's whole Challenge (with its fresh nonce)."""
    message = _INITIATOR_LABEL + hashlib.sha256(hello_body).digest() + hashlib.sha256(challenge_body).digest()
    return hmac.new(secret, message, hashlib.sha256).digest()


def proofs_match(expected: bytes, received: bytes) -> bool:
    """Constant-time comparison, so timing reveals nothing about how much of a forged proof was right."""
    return hmac.compare_digest(expected, received)


def choose(
    offered_versions: Sequence[int],
    offered_codecs: Sequence[str],
    offered_compressions: Sequence[str],
    *,
    versions: Sequence[int],
    codecs: Sequence[str],
    compressions: Sequence[str],
) -> tuple[int, str, str] | str:
    """The responder's choice: the highest common version, and the initiator's first acceptable codec and
    compression. Returns (version, codec, compression), or the reason there is nothing in common."""
    common = set(offered_versions) & set(versions)
    if not common:
        return f"no common protocol version: peer offers {list(offered_versions)}, we speak {list(versions)}"
    codec = next((name for name in offered_codecs if name in codecs), None)
    if codec is None:
        return f"no common codec: peer offers {list(offered_codecs)[:8]}, we accept {list(codecs)}"
    compression = next((name for name in offered_compressions if name in compressions), None)
    if compression is None:
        return f"no common compression: peer offers {list(offered_compressions)[:8]}, we accept {list(compressions)}"
    return max(common), codec, compression


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameKeys:
    """The two frame keys of one connection: for frames the initiator sends, and for frames the responder sends."""

    initiator: bytes
    responder: bytes


def frame_keys(secret: bytes, *, initiator_nonce: bytes, responder_nonce: bytes) -> FrameKeys:
    """Per-connection, per-direction frame keys: HMAC-SHA256 of the secret over a label, the direction and both
    nonces. Both nonces are fresh, so no key is ever used on two connections, and the directions never share one
    (a frame cannot be reflected back to its sender)."""

    def derive(direction: bytes) -> bytes:
        return hmac.new(secret, _FRAME_KEY_LABEL + direction + initiator_nonce + responder_nonce, hashlib.sha256).digest()

    return FrameKeys(initiator=derive(b"initiator\x00"), responder=derive(b"responder\x00"))


def frame_tag(key: bytes, seq: int, code: int, flags: int, body: bytes) -> bytes:
    """The tag of the `seq`-th authenticated frame in one direction (counted from 0): keyed BLAKE2b-128 over
    u64(seq) || type || flags || body. The sequence number is implicit (both sides count), so a replayed,
    dropped or reordered frame fails its check."""
    mac = hashlib.blake2b(key=key, digest_size=TAG_SIZE)
    mac.update(_U64.pack(seq) + bytes((code, flags)))
    mac.update(body)
    return mac.digest()
