"""A Bloom filter dedup backend (`bloom`): a fixed bit array sized up front, about 1.2 bytes a URL at 1%.

Sizing follows the textbook: for `expected` keys and a target false-positive rate p, m = -n ln p / (ln 2)^2
bits and k = (m / n) ln 2 hashes. The k bit positions come from double hashing of one blake2b digest of the
key (Kirsch and Mitzenmacher: h1 + i h2 is as good as k independent hashes), so a check costs one hash call.

A false positive answers "seen" for a URL that never was, and the crawler then never fetches it: a Bloom
filter LOSES about p of the new URLs (more once it holds more than `expected`). It keeps no keys, so it can
neither list nor drop an arc: a node on it cannot hand its seen-URL record to a new owner, and `scan` and
`delete` raise `DedupUnsupported`. It can take a hand-off (`insert`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Self

from ._dedup_alt import DedupUnsupported, UrlKeyedMixin, _MemoryBase, check_key

__all__ = ["BloomDedup", "bloom_size"]

_MAX_BITS = 2**40  # 128 GiB of bits: anything larger is a typo in --expected


def bloom_size(expected: int, fp_rate: float) -> tuple[int, int]:
    """(m bits, k hashes) for `expected` keys at false-positive rate `fp_rate`; m is rounded up to bytes."""
    if not isinstance(expected, int) or expected < 1:
        raise ValueError(f"expected must be a positive count of URLs, got {expected!r}")
    if not 0.0 < fp_rate < 1.0:
        raise ValueError(f"fp_rate must be between 0 and 1 exclusive, got {fp_rate!r}")
    bits = math.ceil(-expected * math.log(fp_rate) / math.log(2) ** 2)
    bits = max(64, (bits + 7) // 8 * 8)
    if bits > _MAX_BITS:
        raise ValueError(f"a Bloom filter for {expected:,} URLs at {fp_rate} would take {bits // 8:,} bytes")
    hashes = max(1, round(bits / expected * math.log(2)))
    return bits, hashes


class BloomDedup(UrlKeyedMixin, _MemoryBase):
    """Check-and-insert over a bit array in a bytearray; may answer "seen" wrongly, never "new" wrongly."""

    def __init__(self, *, expected: int, fp_rate: float) -> None:
        self.expected = expected
        self.fp_rate = fp_rate
        self.bits, self.hashes = bloom_size(expected, fp_rate)
        self._array = bytearray(self.bits // 8)
        self._count = 0

    @classmethod
    def open(cls, path: object = None, *, expected: int = 10_000_000, fp_rate: float = 0.001) -> Self:
        return cls(expected=expected, fp_rate=fp_rate)

    @property
    def nbytes(self) -> int:
        return len(self._array)

    def estimated_fp_rate(self) -> float:
        """The false-positive rate now, (1 - e^(-k n / m))^k, with n the keys accepted so far."""
        return (1.0 - math.exp(-self.hashes * self._count / self.bits)) ** self.hashes

    def add_new(self, keys: Sequence[bytes]) -> list[bool]:
        """True where the key was (apparently) new; its bits are then set. A false positive gives False."""
        for key in keys:
            if key.__class__ is not bytes or len(key) != 16:
                check_key(key)
        bits = self._array
        m = self.bits
        k = self.hashes
        blake = hashlib.blake2b
        out = []
        added = 0
        for key in keys:
            digest = blake(key, digest_size=16).digest()
            h1 = int.from_bytes(digest[:8], "little")
            h2 = int.from_bytes(digest[8:], "little") | 1
            missing = []
            for i in range(k):
                p = (h1 + i * h2) % m
                mask = 1 << (p & 7)
                if not bits[p >> 3] & mask:
                    missing.append((p >> 3, mask))
            if missing:
                for byte, mask in missing:
                    bits[byte] |= mask
                added += 1
                out.append(True)
            else:
                out.append(False)
        self._count += added
        return out

    def insert(self, keys: Iterable[bytes]) -> int:
        return sum(self.add_new(list(keys)))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes) or len(key) != 16:
            return False
        digest = hashlib.blake2b(key, digest_size=16).digest()
        h1 = int.from_bytes(digest[:8], "little")
        h2 = int.from_bytes(digest[8:], "little") | 1
        bits = self._array
        m = self.bits
        for i in range(self.hashes):
            p = (h1 + i * h2) % m
            if not bits[p >> 3] & (1 << (p & 7)):
                return False
        return True

    def __len__(self) -> int:
        """Keys accepted as new: the true count of distinct keys offered, less the false positives."""
        return self._count

    def scan(self, start: int, end: int) -> Iterator[bytes]:
        raise DedupUnsupported("dedup kind 'bloom' keeps bits, not keys, so it cannot list an arc for a hand-off")

    def delete(self, start: int, end: int) -> int:
        raise DedupUnsupported("dedup kind 'bloom' cannot remove keys (bits are shared), so it cannot drop an arc")
