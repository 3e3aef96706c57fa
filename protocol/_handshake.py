"""The handshake's arithmetic: choosing what both sides speak, and the HMAC proofs of the cluster secret.

Each side proves it knows the secret by an HMAC-SHA256 over the other side's fresh nonce (and everything said
so far), so a proof recorded from one connection is useless on another, and a proof made in one role cannot
be reflected back in the other role (the labels differ). The exact inputs are in docs/protocol.md.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence

__all__ = [
    "MIN_SECRET_SIZE",
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "choose",
    "initiator_proof",
    "responder_proof",
    "proofs_match",
]

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (PROTOCOL_VERSION,)
MIN_SECRET_SIZE = 16

_RESPONDER_LABEL = b"peercrawl responder proof\x00"
_INITIATOR_LABEL = b"peercrawl initiator proof\x00"
_U16 = struct.Struct("!H")
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
