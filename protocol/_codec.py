"""Message bodies in the two codecs: msgpack (compact, the default) and JSON (readable, the design's origin).

`encode_body` checks the message against the limits and raises LocalProtocolError if we are about to send
something a peer must reject; `decode_body` parses a peer's bytes with bounded parsers and raises only
RemoteProtocolError, whatever the bytes were.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack

from ._errors import LocalProtocolError, RemoteProtocolError
from ._limits import Limits
from ._handshake import PROTOCOL_VERSION
from ._messages import RECORDS_BY_VERSION, TYPE_CODES, Message
from ._schema import Invalid

__all__ = ["CODECS", "decode_body", "encode_body"]

CODECS = ("msgpack", "json")

_JSON_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate key in a JSON object")
    return obj


_JSON_DECODER = json.JSONDecoder(object_pairs_hook=_unique_object, parse_constant=_reject_constant)


def encode_body(
    message: Message, codec: str, limits: Limits, version: int = PROTOCOL_VERSION
) -> tuple[int, bytes]:
    """Return (type code, body bytes) for `message` in protocol `version`; LocalProtocolError if it is not a
    valid message."""
    records = RECORDS_BY_VERSION.get(version)
    if records is None:
        raise LocalProtocolError(f"unknown protocol version {version!r}; we speak {sorted(RECORDS_BY_VERSION)}")
    code = TYPE_CODES.get(type(message))
    if code is None:
        raise LocalProtocolError(f"cannot send {type(message).__name__}: it is not a protocol message")
    js = codec == "json"
    if not js and codec != "msgpack":
        raise LocalProtocolError(f"unknown codec {codec!r}; expected one of {CODECS}")
    record = records.get(code)
    if record is None:
        raise LocalProtocolError(f"cannot send {type(message).__name__} in protocol version {version}: it came later")
    try:
        tree = record.dump(message, js, limits)
    except Invalid as exc:
        where = exc.where(type(message).__name__)
        raise LocalProtocolError(f"cannot send {where}: {exc.message}") from None
    if js:
        return code, _JSON_ENCODER.encode(tree).encode("utf-8")
    return code, msgpack.packb(tree, use_bin_type=True)


def decode_body(code: int, body: bytes, codec: str, limits: Limits, version: int = PROTOCOL_VERSION) -> Message:
    """Parse and validate a peer's frame body in protocol `version` (agreed in the handshake, so ours to
    know); RemoteProtocolError on anything that is not a valid message."""
    records = RECORDS_BY_VERSION.get(version)
    if records is None:
        raise LocalProtocolError(f"unknown protocol version {version!r}; we speak {sorted(RECORDS_BY_VERSION)}")
    record = records.get(code)
    if record is None:
        raise RemoteProtocolError(f"peer sent unknown message type 0x{code:02x}")
    name = record.cls.__name__
    js = codec == "json"
    try:
        if js:
            tree = _JSON_DECODER.decode(body.decode("utf-8"))
        else:
            tree = msgpack.unpackb(
                body,
                raw=False,
                strict_map_key=True,
                max_str_len=limits.max_frame,
                max_bin_len=limits.max_frame,
                max_ext_len=0,  # no extension types, the timestamp included
            )
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException) as exc:
        raise RemoteProtocolError(f"peer sent a {name} that is not valid {codec}: {exc}") from exc
    try:
        message: Message = record.load(tree, js, limits)
        return message
    except Invalid as exc:
        raise RemoteProtocolError(f"peer sent an invalid {exc.where(name)}: {exc.message}") from None
