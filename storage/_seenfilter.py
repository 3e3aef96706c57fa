"""The seen store's filter: a Bloom filter over its keys, in memory, in front of the B-tree.

A link that was never seen (most of those a crawl checks against its store, once the crawler's own memory of
answers has taken the rest) is answered "new" by the filter alone, with no read of the B-tree; the key then goes
to the small staging table (`storage._dedup`), not to a random leaf of the large one. A "maybe" is checked in the
store, so the filter never decides: a false positive costs one look-up, never a lost URL.

It holds bits only, rebuilt from the store's keys when the store opens (numpy, about 10 million keys a second
here) and again when the keys outgrow twice what it was sized for. Sizing: `BITS_PER_KEY` bits for 1.25 times
the keys at open, three bit positions per key (a false-positive rate of 1.7% at the keys it was sized for, 3.1%
at 1.25 times them), at most `MAX_BYTES`. Keys are dedup keys: their last 8 bytes are already a hash of the URL,
so the positions are derived from them without hashing again.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["BITS_PER_KEY", "MAX_BYTES", "SeenFilter"]

BITS_PER_KEY = 8
HASHES = 3
MIN_KEYS = 1 << 20  # a new store's filter: 1 MiB
MAX_BYTES = 1 << 29  # 512 MiB: past 4 * 10^8 keys the bits per key, not the memory, give way
_CHUNK = 1 << 20  # keys hashed at once by `add_packed`


def _capacity_bits(keys: int) -> int:
    bits = BITS_PER_KEY * max(MIN_KEYS, keys + keys // 4)
    return min(bits, MAX_BYTES * 8) // 64 * 64 + 64


class SeenFilter:
    """Bit positions (h1 + i * h2) mod m of a key's URL fingerprint h (h1 = h mod m, h2 = (h >> 33) | 1), for
    i < HASHES: the same figures in Python and in numpy's uint64 (no sum passes 2^64)."""

    __slots__ = ("_array", "_bits", "_m", "capacity")

    def __init__(self, keys: int = 0) -> None:
        self._m = _capacity_bits(keys)
        self._bits = bytearray(self._m // 8)  # read bit by bit in Python (a numpy scalar costs more)
        self._array = np.frombuffer(self._bits, dtype=np.uint8)  # the same bytes, set in bulk
        #: the keys it was sized for; past twice that its owner builds a larger one
        self.capacity = self._m // BITS_PER_KEY

    @property
    def nbytes(self) -> int:
        return len(self._bits)

    def may_contain(self, key: bytes) -> bool:
        """False: the key was never added. True: it may have been (check the store)."""
        h = int.from_bytes(key[-8:], "big")
        m = self._m
        h1 = h % m
        h2 = (h >> 33) | 1
        bits = self._bits
        for _ in range(HASHES):
            if not bits[h1 >> 3] >> (h1 & 7) & 1:
                return False
            h1 = (h1 + h2) % m
        return True

    def add(self, key: bytes) -> None:
        h = int.from_bytes(key[-8:], "big")
        m = self._m
        h1 = h % m
        h2 = (h >> 33) | 1
        bits = self._bits
        for _ in range(HASHES):
            bits[h1 >> 3] |= 1 << (h1 & 7)
            h1 = (h1 + h2) % m

    def add_packed(self, packed: bytes, key_size: int) -> None:
        """Add keys of `key_size` bytes laid end to end (as a cursor gives them, joined), vectorized."""
        if len(packed) % key_size:
            raise ValueError(f"packed keys must be a multiple of {key_size} bytes, got {len(packed)}")
        step = _CHUNK * key_size
        m = np.uint64(self._m)
        for first in range(0, len(packed), step):
            raw = np.frombuffer(packed, dtype=np.uint8, count=min(step, len(packed) - first), offset=first)
            h = raw.reshape(-1, key_size)[:, key_size - 8:].copy().view(">u8").ravel().astype(np.uint64)
            h1 = h % m
            h2 = (h >> np.uint64(33)) | np.uint64(1)
            for _ in range(HASHES):
                np.bitwise_or.at(self._array, (h1 >> np.uint64(3)).astype(np.intp),
                                 (np.uint64(1) << (h1 & np.uint64(7))).astype(np.uint8))
                h1 = (h1 + h2) % m

    def add_all(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self.add(key)
