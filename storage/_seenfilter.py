"""The seen store's filter: a Bloom filter over its keys, in memory, in front of the B-tree.

A link that was never seen (most of those a crawl checks against its store, once the crawler's own memory of
answers has taken the rest) is answered "new" by the filter alone, with no read of the B-tree; the key then goes
to the small staging table (`storage._dedup`), not to a random leaf of the large one. A "maybe" is checked in the
store, so the filter never decides: a false positive costs one look-up, never a lost URL.

It holds bits only, rebuilt from the store's keys when the store opens (numpy, about 10 million keys a second
here) and again when the keys outgrow twice what it was sized for, unless it is at its size cap. Sizing:
`BITS_PER_KEY` bits for 1.25 times the keys at open, three bit positions per key (a false-positive rate of 1.7% at
the keys it was sized for, 3.1% at 1.25 times them), at most `max_bytes` (`MAX_BYTES` by default). Keys are dedup
keys: their last 8 bytes are already a hash of the URL, so the positions are derived from them without hashing
again.

`save` writes the bits to a file with a stamp of the store they describe, `load` reads them back only when the
stamp and the checksum match: a node stopped cleanly starts without reading every key.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from hashlib import blake2b
from pathlib import Path

import numpy as np

__all__ = ["BITS_PER_KEY", "MAX_BYTES", "SeenFilter", "SeenFilterFileError"]

BITS_PER_KEY = 8
HASHES = 3
MIN_KEYS = 1 << 20  # a new store's filter: 1 MiB
MAX_BYTES = 1 << 29  # 512 MiB: past 4 * 10^8 keys the bits per key, not the memory, give way
_CHUNK = 1 << 20  # keys hashed at once by `add_packed`
_MAGIC = b"PCSEENF1"
_HEADER = struct.Struct(">8sQQQ16s")  # magic, stamp length, bits m, cap in bytes, BLAKE2b-128 of stamp and bits
_IO_CHUNK = 1 << 24  # bytes read or written, and hashed, at once


class SeenFilterFileError(Exception):
    """A saved filter cannot be used: missing, torn, altered, or of another store or size."""


def _max_bits(max_bytes: int) -> int:
    if max_bytes < 8:
        raise ValueError(f"a seen filter needs at least 8 bytes, got max_bytes={max_bytes}")
    return max_bytes * 8 // 64 * 64


def _capacity_bits(keys: int, max_bytes: int = MAX_BYTES) -> int:
    bits = BITS_PER_KEY * max(MIN_KEYS, keys + keys // 4)
    return min(bits // 64 * 64 + 64, _max_bits(max_bytes))


class SeenFilter:
    """Bit positions (h1 + i * h2) mod m of a key's URL fingerprint h (h1 = h mod m, h2 = (h >> 33) | 1), for
    i < HASHES: the same figures in Python and in numpy's uint64 (no sum passes 2^64)."""

    __slots__ = ("_array", "_bits", "_m", "capacity", "max_bytes")

    def __init__(self, keys: int = 0, *, max_bytes: int = MAX_BYTES, _bits: bytearray | None = None) -> None:
        self.max_bytes = max_bytes
        self._m = _capacity_bits(keys, max_bytes) if _bits is None else len(_bits) * 8
        # read bit by bit in Python (a numpy scalar costs more)
        self._bits = bytearray(self._m // 8) if _bits is None else _bits
        self._array = np.frombuffer(self._bits, dtype=np.uint8)  # the same bytes, set in bulk
        #: the keys it was sized for; past twice that its owner builds a larger one, unless it is at its cap
        self.capacity = self._m // BITS_PER_KEY

    @property
    def nbytes(self) -> int:
        return len(self._bits)

    @property
    def at_cap(self) -> bool:
        """Whether it is as large as `max_bytes` lets it be: a rebuild would give the same size."""
        return self._m >= _max_bits(self.max_bytes)

    def outgrown(self, keys: int) -> bool:
        """Whether a store of `keys` keys should build a larger filter than this one."""
        return keys > 2 * self.capacity and not self.at_cap

    def save(self, path: str | os.PathLike[str], stamp: bytes) -> None:
        """Write the bits and `stamp` (what identifies the store's state they hold) to `path`: a file next to
        it first, fsynced, then renamed over `path`. Raises OSError; a failed save leaves no file."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        digest = blake2b(stamp, digest_size=16)
        view = memoryview(self._bits)
        for first in range(0, len(view), _IO_CHUNK):
            digest.update(view[first:first + _IO_CHUNK])
        try:
            with open(tmp, "wb") as fh:
                fh.write(_HEADER.pack(_MAGIC, len(stamp), self._m, self.max_bytes, digest.digest()))
                fh.write(stamp)
                for first in range(0, len(view), _IO_CHUNK):
                    fh.write(view[first:first + _IO_CHUNK])
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @classmethod
    def load(cls, path: str | os.PathLike[str], stamp: bytes, *, max_bytes: int = MAX_BYTES) -> SeenFilter:
        """The filter saved at `path` for `stamp`. Raises SeenFilterFileError (with the reason) if there is none
        or it does not hold: another stamp, a size over `max_bytes`, a short file or a wrong checksum."""
        try:
            with open(path, "rb") as fh:
                header = fh.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    raise SeenFilterFileError("the file is shorter than its header")
                magic, stamp_len, m, _saved_max, want = _HEADER.unpack(header)
                if magic != _MAGIC:
                    raise SeenFilterFileError("not a seen-filter file")
                if fh.read(stamp_len) != stamp:
                    raise SeenFilterFileError("it was saved for another state of the store")
                if m % 64 or not 0 < m <= _max_bits(max_bytes):
                    raise SeenFilterFileError(f"its {m // 8:,} bytes are not a filter under the cap of "
                                              f"{max_bytes:,} bytes")
                bits = bytearray(m // 8)
                view = memoryview(bits)
                digest = blake2b(stamp, digest_size=16)
                for first in range(0, len(bits), _IO_CHUNK):
                    part = view[first:first + _IO_CHUNK]
                    if fh.readinto(part) != len(part):
                        raise SeenFilterFileError("the file is torn (shorter than its bits)")
                    digest.update(part)
                if fh.read(1):
                    raise SeenFilterFileError("the file is longer than its bits")
        except FileNotFoundError:
            raise SeenFilterFileError("no saved filter") from None
        except OSError as exc:
            raise SeenFilterFileError(f"cannot read it: {exc}") from exc
        if digest.digest() != want:
            raise SeenFilterFileError("its checksum does not match (altered or torn)")
        return cls(max_bytes=max_bytes, _bits=bits)

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
