"""Key formats that make an arc of the ring one contiguous key range (DESIGN decision 7).

Every key that belongs to a host begins with the host's 64-bit ring position (the ring's own definition,
`ring.host_position`), big-endian, so byte order is ring order. An arc [start, end) of the ring is then one range of keys (two when it wraps past zero), and
handing an arc to another node is a range scan. One host's keys also sit together on disk.
"""

from __future__ import annotations

import functools
from hashlib import blake2b

from ring import host_position
from ring import host_position_bytes as ring_position_bytes

__all__ = [
    "RING_SIZE",
    "arc_ranges",
    "host_position",
    "host_position_bytes",
    "host_prefix",
    "in_arc",
    "url_fingerprint",
    "url_key",
]

RING_SIZE = 2**64
_POS_BYTES = 8


def url_fingerprint(url: str) -> bytes:
    """An 8-byte fingerprint of a normalized URL: the first 8 bytes of BLAKE2b(url). The one definition: the
    dedup key, the in-flight key and the dispatcher's recently-routed memory all use it."""
    return blake2b(url.encode("utf-8"), digest_size=8).digest()


def url_key(position: int, url: str) -> bytes:
    """The 16-byte dedup key of a URL: its host's ring position, then its fingerprint."""
    return position.to_bytes(_POS_BYTES, "big") + url_fingerprint(url)


#: `ring.host_position(host)` as 8 big-endian bytes, cached: a crawl meets the same hosts again and again.
host_position_bytes = functools.lru_cache(maxsize=1 << 16)(ring_position_bytes)


@functools.lru_cache(maxsize=1 << 16)
def host_prefix(host: str) -> bytes:
    """The key prefix of everything stored per host: position, host name, NUL.

    The name after the position keeps two hosts apart even if their positions collide, and the NUL (which
    no host name contains) makes the prefix of one host never the prefix of another ("a" vs "ab").
    """
    if not host or "\x00" in host:
        raise ValueError(f"host must be a non-empty name without NUL, got {host!r}")
    return host_position_bytes(host) + host.encode("utf-8") + b"\x00"


def _check_position(name: str, value: int) -> None:
    if not 0 <= value < RING_SIZE:
        raise ValueError(f"{name} must be a ring position in [0, 2**64), got {value}")


def arc_ranges(start: int, end: int) -> list[tuple[bytes, bytes]]:
    """The key ranges of the half-open ring arc [start, end); start == end means the whole ring.

    Each range is `(first, last)`: two 8-byte positions, BOTH INCLUSIVE. A key `k` lies in the range when
    `first <= k[:8] <= last`. Inclusive bounds need no sentinel for position 2**64, which 8 bytes cannot
    hold. A wrapping arc gives two ranges, in key order.
    """
    _check_position("start", start)
    _check_position("end", end)

    def b(p: int) -> bytes:
        return p.to_bytes(_POS_BYTES, "big")

    if start == end:
        return [(b(0), b(RING_SIZE - 1))]
    if start < end:
        return [(b(start), b(end - 1))]
    ranges = []
    if end > 0:
        ranges.append((b(0), b(end - 1)))
    ranges.append((b(start), b(RING_SIZE - 1)))
    return ranges


def in_arc(position: int, start: int, end: int) -> bool:
    """Whether a ring position lies in the half-open arc [start, end) (start == end: the whole ring)."""
    if start == end:
        return True
    if start < end:
        return start <= position < end
    return position >= start or position < end
