"""Framing: a 4-byte big-endian length, a type byte, a flags byte, then the body; and optional compression.

The length counts everything after itself (type + flags + body), so a frame is `4 + length` bytes. The reader
rejects a length above `Limits.max_frame` as soon as the 4 length bytes arrive, which is what bounds the
memory a peer can make us hold. Decompression is bounded by the same limit, so a small frame cannot inflate
into a large one.

Two compressions may be agreed: zlib (RFC 1950) and brotli (RFC 7932). A frame's flags say which one packed
it. Brotli at quality 5 makes version 2's URL columns about 10% smaller than zlib at any level, and smaller than
zstd at levels up to 19, for about 1.3 us of CPU per URL (tests/bench/bench_protocol.py; docs/protocol.md).
"""

from __future__ import annotations

import struct
import zlib

import brotli

from ._errors import RemoteProtocolError

__all__ = [
    "COMPRESSIONS",
    "FLAG_BROTLI",
    "FLAG_ZLIB",
    "FLAGS",
    "HEADER_SIZE",
    "FrameReader",
    "compress",
    "decompress",
    "encode_frame",
]

HEADER_SIZE = 6
FLAG_ZLIB = 0x01
FLAG_BROTLI = 0x02
COMPRESSIONS = ("none", "zlib", "br")
# compression -> the frame flag that marks a body packed with it
FLAGS = {"zlib": FLAG_ZLIB, "br": FLAG_BROTLI}
# brotli quality 5: the knee of size against CPU for URL columns (4: +2% bytes; 6-9: -1% for 1.1-13x the CPU)
BROTLI_QUALITY = 5
_LENGTH = struct.Struct("!I")
_HEADER = struct.Struct("!IBB")


def encode_frame(code: int, flags: int, body: bytes) -> bytes:
    """One frame on the wire."""
    return _HEADER.pack(len(body) + 2, code, flags) + body


def compress(body: bytes, level: int, compression: str = "zlib") -> bytes:
    """`body` packed with `compression` ("zlib" at `level`, or "br" at BROTLI_QUALITY)."""
    if compression == "br":
        return bytes(brotli.compress(body, quality=BROTLI_QUALITY))
    return zlib.compress(body, level)


def decompress(data: bytes, max_size: int, compression: str = "zlib") -> bytes:
    """Unpack a zlib stream (RFC 1950) or brotli stream (RFC 7932) of at most `max_size` bytes;
    RemoteProtocolError otherwise."""
    if compression == "br":
        return _unbrotli(data, max_size)
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, max_size)
    except zlib.error as exc:
        raise RemoteProtocolError(f"peer sent a compressed frame that does not inflate: {exc}") from exc
    if inflater.unconsumed_tail:
        raise RemoteProtocolError(f"peer sent a compressed frame that inflates past {max_size} bytes")
    if not inflater.eof or inflater.unused_data:
        raise RemoteProtocolError("peer sent a compressed frame that is truncated or has trailing bytes")
    return out


def _unbrotli(data: bytes, max_size: int) -> bytes:
    decompressor = brotli.Decompressor()
    try:
        # the output buffer stops growing at the limit: a small frame cannot unpack into a large one
        out = decompressor.process(data, output_buffer_limit=max_size + 1)
    except brotli.error as exc:
        raise RemoteProtocolError(f"peer sent a compressed frame that does not unpack: {exc}") from exc
    if len(out) > max_size or (not decompressor.is_finished() and not decompressor.can_accept_more_data()):
        raise RemoteProtocolError(f"peer sent a compressed frame that unpacks past {max_size} bytes")
    if not decompressor.is_finished():
        raise RemoteProtocolError("peer sent a compressed frame that is truncated")
    return bytes(out)


class FrameReader:
    """Accumulates bytes and cuts them into (type code, flags, body) frames."""

    __slots__ = ("_buffer", "max_frame")

    def __init__(self, max_frame: int) -> None:
        self._buffer = bytearray()
        # The largest frame length accepted; the connection raises it from the handshake limit once established.
        self.max_frame = max_frame

    def __len__(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_frame(self) -> tuple[int, int, bytes] | None:
        """The next complete frame, or None if more bytes are needed."""
        buffer = self._buffer
        if len(buffer) < 4:
            return None
        (length,) = _LENGTH.unpack_from(buffer)
        if length < 2:
            raise RemoteProtocolError(f"peer sent a frame length of {length}; the minimum is 2")
        if length > self.max_frame:
            raise RemoteProtocolError(f"peer sent a frame of {length} bytes, over the limit of {self.max_frame}")
        if len(buffer) < 4 + length:
            return None
        code = buffer[4]
        flags = buffer[5]
        body = bytes(buffer[HEADER_SIZE : 4 + length])
        del buffer[: 4 + length]
        return code, flags, body
