"""Streaming Content-Encoding decoders with a bound on the decoded size.

A crawler must decode gzip, deflate and br bodies, and must not let a small compressed body (a "zip bomb")
expand past the page size limit: every decoder here takes the room left and produces at most about that much,
so the fetcher can stop reading the moment the limit is crossed. A stream that ends early keeps what decoded
(browsers are lenient there too); bytes that do not decode raise DecodeError.
"""

from __future__ import annotations

import zlib

import brotli

__all__ = ["BodyDecoder", "DecodeError", "make_decoder"]


class DecodeError(Exception):
    """The server's body does not decode with the Content-Encoding it announced."""


class _Zlib:
    __slots__ = ("_obj", "_raw_deflate")

    def __init__(self, wbits: int | None) -> None:
        # wbits None: "deflate", decided on the first bytes (zlib-wrapped per RFC 9110, or raw as many servers send).
        self._obj = zlib.decompressobj(wbits) if wbits is not None else None
        self._raw_deflate = wbits is None

    def decompress(self, data: bytes, limit: int) -> bytes:
        obj = self._obj
        if obj is None:
            if not data:
                return b""
            zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0
            obj = self._obj = zlib.decompressobj(15 if zlib_header else -15)
        try:
            return obj.decompress(data, max(limit, 1))
        except zlib.error as exc:
            raise DecodeError(f"corrupt {'deflate' if self._raw_deflate else 'gzip'} body: {exc}") from None

    def flush(self, limit: int) -> bytes:
        if self._obj is None:
            return b""
        try:
            return self._obj.flush()
        except zlib.error as exc:
            raise DecodeError(f"corrupt compressed body: {exc}") from None


class _Brotli:
    __slots__ = ("_obj",)

    def __init__(self) -> None:
        self._obj = brotli.Decompressor()

    def decompress(self, data: bytes, limit: int) -> bytes:
        try:
            return self._obj.process(data, output_buffer_limit=max(limit, 1))
        except brotli.error as exc:
            raise DecodeError(f"corrupt br body: {exc}") from None

    def flush(self, limit: int) -> bytes:
        return b""


class BodyDecoder:
    """Decodes a body through a chain of content codings, the last applied first."""

    __slots__ = ("_stages",)

    def __init__(self, stages: list[_Zlib | _Brotli]) -> None:
        self._stages = stages

    def decompress(self, data: bytes, limit: int) -> bytes:
        """Decode the next piece; ``limit`` is the room left, and the output is about that size at most."""
        for stage in self._stages:
            data = stage.decompress(data, limit)
        return data

    def flush(self, limit: int) -> bytes:
        """Whatever is left at the end of the body.

        A body cut short before its end marker keeps what decoded so far, as browsers do.
        """
        out = b""
        for stage in self._stages:
            out = stage.decompress(out, limit) if out else b""
            out += stage.flush(limit)
        return out


_STAGES = {
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
    stages = []
    for coding in reversed(codings):
        factory = _STAGES.get(coding)
        if factory is None:
            raise DecodeError(f"unsupported content-encoding {coding!r}")
        stages.append(factory())
    return BodyDecoder(stages)
