"""Fixed 64-bit hashes for ring positions.

Every process on every machine must place a host and a node's points at the same positions, so nothing here
may depend on Python's per-process salted ``hash()`` or on the machine's byte order.

- A host's position is the BLAKE2b digest (8 bytes, big-endian) of its UTF-8 bytes.
- A node's points are the consecutive 8-byte big-endian words of SHAKE-128 over a domain prefix and the node
  id. The stream is extendable: the first ``k`` points of a node are the same whatever ``k`` is, so raising a
  node's weight only adds points of that node (keys move only to it) and lowering it only removes them.
"""

from __future__ import annotations

import sys
from array import array
from hashlib import blake2b, shake_128

__all__ = ["RING_SPACE", "host_position", "node_points"]

#: Size of the ring: positions are the integers 0 <= p < 2**64.
RING_SPACE = 1 << 64

_POINT_DOMAIN = b"peercrawl ring points v1\x00"
_BIG_ENDIAN_HOST = sys.byteorder == "big"


def host_position_bytes(host: str) -> bytes:
    """The ring position of ``host`` as 8 big-endian bytes: the first 8 bytes of BLAKE2b(host), the one
    definition of where a host sits (storage keys start with these bytes, so byte order is ring order)."""
    return blake2b(host.encode(), digest_size=8).digest()


def host_position(host: str) -> int:
    """The 64-bit unsigned ring position of ``host`` (the caller passes the lower-case IDNA host, no port)."""
    return int.from_bytes(host_position_bytes(host), "big")


def node_points(node_id: str, count: int) -> array[int]:
    """The first ``count`` ring positions of ``node_id``, unsorted, as an ``array('Q')``."""
    if count < 0:
        raise ValueError(f"point count must be >= 0, got {count}")
    points = array("Q")
    points.frombytes(shake_128(_POINT_DOMAIN + node_id.encode()).digest(8 * count))
    if not _BIG_ENDIAN_HOST:
        points.byteswap()
    return points
