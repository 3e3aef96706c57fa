"""Streaming Content-Encoding decoders with a bound on the decoded size, at every stage.

A crawler must decode gzip, deflate and br bodies, and must not let a small compressed body (a "zip bomb")
expand past the page size limit. Every stage here produces at most the room it is given and keeps the input it
has not used yet (zlib's unconsumed tail, brotli's "cannot accept more data"), so no stage ever inflates more
than one call's room: a chain of codings is pulled through stage by stage, and the fetcher stops reading the
moment the limit is crossed. There is no unbounded `flush()`: the end of a body is more pulls with the room
left. At most two codings are accepted (`gzip, br` is seen in the wild; three is only ever an attack). A stream
that ends early keeps what decoded (browsers are lenient there too); bytes that do not decode raise DecodeError.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import brotli

__all__ = ["MAX_CODINGS", "BodyDecoder", "DecodeError", "make_decoder"]

#: Content codings accepted on one response.
MAX_CODINGS = 2
#: Input held back between stages while the next stage is full: a stage is pulled only while the next one holds
#: less than this, so the bytes waiting between stages stay under this plus one stage's output.
_STAGE_BUFFER = 64 * 1024
#: The most brotli is asked for in one call (it may overshoot what it is asked for by up to about as much).
_BROTLI_STEP = 256 * 1024


class DecodeError(Exception):
    """The server's body does not decode with the Content-Encoding it announced."""


class _Zlib:
    __slots__ = ("_obj", "_raw_deflate", "_input")

    def __init__(self, wbits: int | None) -> None:
        # wbits None: "deflate", decided on the first bytes (zlib-wrapped per RFC 9110, or raw as many servers send).
        self._obj = zlib.decompressobj(wbits) if wbits is not None else None
        self._raw_deflate = wbits is None
        self._input = b""  # received and not yet given to zlib (or given back as its unconsumed tail)

    def feed(self, data: bytes) -> None:
        self._input = self._input + data if self._input else data

    def pending(self) -> int:
        return len(self._input)

    def read(self, limit: int) -> bytes:
        """At most `limit` decoded bytes from the input fed so far."""
        data, self._input = self._input, b""
        obj = self._obj
        if obj is None:
            if len(data) < 2:
                self._input = data  # the first two bytes decide between zlib-wrapped and raw deflate
                return b""
            zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0
            obj = self._obj = zlib.decompressobj(15 if zlib_header else -15)
        if obj.eof:
            return b""  # bytes after the end of the stream are ignored, as browsers do
        try:
            out = obj.decompress(data, max(limit, 1))
        except zlib.error as exc:
            raise DecodeError(f"corrupt {'deflate' if self._raw_deflate else 'gzip'} body: {exc}") from None
        self._input = obj.unconsumed_tail
        return out


class _Brotli:
    __slots__ = ("_obj", "_input", "_spill")

    def __init__(self) -> None:
        self._obj = brotli.Decompressor()
        self._input = b""
        self._spill = b""  # output past the limit of the call that made it (brotli grows its buffer in blocks)

    def feed(self, data: bytes) -> None:
        self._input = self._input + data if self._input else data

    def pending(self) -> int:
        return len(self._input) + len(self._spill)

    def read(self, limit: int) -> bytes:
        limit = max(limit, 1)
        out: list[bytes] = []
        got = 0
        if self._spill:
            piece, self._spill = self._spill[:limit], self._spill[limit:]
            out.append(piece)
            got = len(piece)
        obj = self._obj
        # Asked for a little at a time: brotli stops growing its buffer only once it is past the limit given, so
        # one call with a large limit can return (and hold) nearly twice that.
        while got < limit and not obj.is_finished():
            data = b""
            if self._input and obj.can_accept_more_data():
                data, self._input = self._input, b""
            try:
                piece = obj.process(data, output_buffer_limit=min(limit - got, _BROTLI_STEP))
            except brotli.error as exc:
                raise DecodeError(f"corrupt br body: {exc}") from None
            if not piece:
                if data or (self._input and obj.can_accept_more_data()):
                    continue  # it took input and needs more before it can give output
                break
            if got + len(piece) > limit:
                piece, self._spill = piece[: limit - got], piece[limit - got :]
            out.append(piece)
            got += len(piece)
        if obj.is_finished():
            self._input = b""  # bytes after the end of the stream are ignored, as browsers do
        return out[0] if len(out) == 1 else b"".join(out)


_Stage = _Zlib | _Brotli


class BodyDecoder:
    """Decodes a body through a chain of content codings, the last applied first; bounded at every stage."""

    __slots__ = ("_stages",)

    def __init__(self, stages: list[_Stage]) -> None:
        self._stages = stages

    def decompress(self, data: bytes, limit: int) -> bytes:
        """Feed the next piece of the body; return at most ``limit`` decoded bytes (the room left)."""
        if data:
            self._stages[0].feed(data)
        return self._pull(limit)

    def flush(self, limit: int) -> bytes:
        """At the end of the body: at most ``limit`` more decoded bytes from what is still held.

        A body cut short before its end marker keeps what decoded so far, as browsers do.
        """
        return self._pull(limit)

    def pending(self) -> int:
        """Bytes held inside the chain, not yet decoded to output (non-zero after a full read: more would follow)."""
        return sum(stage.pending() for stage in self._stages)

    def _pull(self, limit: int) -> bytes:
        stages = self._stages
        last = len(stages) - 1
        out: list[bytes] = []
        room = max(limit, 0)
        # Each round moves at most `room` bytes out of each stage; a round with no movement ends it. Rounds are
        # bounded: every round either shrinks the input held or fills the output, which ends the loop.
        for _ in range(1_000_000):
            moved = False
            for index, stage in enumerate(stages):
                if index < last:
                    successor = stages[index + 1]
                    if successor.pending() >= _STAGE_BUFFER:
                        continue  # back-pressure: let the next stage use what it holds first
                    piece = stage.read(room)
                    if piece:
                        successor.feed(piece)
                        moved = True
                else:
                    if room <= 0:
                        break
                    piece = stage.read(room)
                    if piece:
                        out.append(piece)
                        room -= len(piece)
                        moved = True
            if not moved or room <= 0:
                break
        return out[0] if len(out) == 1 else b"".join(out)


_STAGES: dict[str, Callable[[], _Stage]] = {
    "gzip": lambda: _Zlib(47),  # 32 + 15: gzip or zlib header, detected
    "x-gzip": lambda: _Zlib(47),
    "deflate": lambda: _Zlib(None),
    "br": _Brotli,
}


def make_decoder(content_encoding: str) -> BodyDecoder | None:
    """A decoder for a Content-Encoding value, or None for identity; raises DecodeError if unsupported."""
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) > MAX_CODINGS:
        raise DecodeError(
            f"{len(codings)} stacked content-encodings ({', '.join(codings[:8])}); at most {MAX_CODINGS} are accepted"
        )
    stages: list[_Stage] = []
    for coding in reversed(codings):
        factory = _STAGES.get(coding)
        if factory is None:
            raise DecodeError(f"unsupported content-encoding {coding!r}")
        stages.append(factory())
    return BodyDecoder(stages)
