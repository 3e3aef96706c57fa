"""The study's MD5 digit tree: a 16-way tree over the hex digits of a fingerprint (`md5-tree`).

The study walks the hex digits of a URL's MD5 from the root, one level per digit, creating missing nodes,
and claims O(1) checks and a large space saving from shared prefixes. Shared prefixes are real only near the
root: n random fingerprints fill the first log16(n) levels and then every key goes its own way, so each new
key allocates about (digits - log16 n) nodes of 16 children. docs/experiments-dedup.md has the figures.

Layout: one flat `array('I')` of child slots, 16 per node (64 bytes a node, against about 184 for a Python
list of 16), holding the child's slot offset (node index x 16), 0 for none. The root is node 0, so 0 is never
a child. The last digit needs no node: its slot holds 1, "present". Freed nodes are reused.

The product tree (`key_bytes=16`, 32 levels) walks the digits of `url_key`, host position first, so the tree
is in ring order and an arc is a subtree range: `scan`/`delete` work. The study's own tree
(`key_bytes=8`, 16 levels, fed `md5_key(url)`) keeps no position and refuses arc operations.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Self

from ._dedup_alt import DedupUnsupported, UrlKeyedMixin, _MemoryBase
from ._keys import arc_ranges

__all__ = ["DigitTreeDedup"]

_ZEROS = array("I", bytes(64))  # one node: 16 empty slots
_PRESENT = 1
_MAX_SLOTS = 2**32 - 16


class DigitTreeDedup(UrlKeyedMixin, _MemoryBase):
    """A 16-way digit tree of fixed-length keys; `key_bytes` 16 (product keys) or 8 (the study's MD5-16)."""

    def __init__(self, *, key_bytes: int = 16) -> None:
        if key_bytes not in (8, 16):
            raise ValueError(f"key_bytes is 16 (url_key) or 8 (the study's md5_key), got {key_bytes}")
        self.key_bytes = key_bytes
        self._slots = array("I", _ZEROS)
        self._free: list[int] = []
        self._count = 0

    @classmethod
    def open(cls, path: object = None, *, key_bytes: int = 16) -> Self:
        return cls(key_bytes=key_bytes)

    # -- sizes, for the benchmark and for operators --

    @property
    def node_count(self) -> int:
        """Nodes in use (free ones excluded)."""
        return len(self._slots) // 16 - len(self._free)

    @property
    def nbytes(self) -> int:
        """Bytes held by the child array (every node ever allocated, freed ones included)."""
        return len(self._slots) * self._slots.itemsize

    # -- check-and-insert --

    def _new_node(self) -> int:
        if self._free:
            return self._free.pop()
        base = len(self._slots)
        if base > _MAX_SLOTS:
            raise MemoryError("the digit tree is full: 2**28 nodes is the most a 32-bit child slot can address")
        self._slots.extend(_ZEROS)
        return base

    def _check(self, key: object) -> bytes:
        if not isinstance(key, bytes) or len(key) != self.key_bytes:
            raise ValueError(f"this digit tree takes {self.key_bytes}-byte keys, got {key!r:.40}")
        return key

    def add_new(self, keys: Sequence[bytes]) -> list[bool]:
        """Check-and-insert: True where the key was new and is now stored (first occurrence in a batch)."""
        size = self.key_bytes
        for key in keys:
            if key.__class__ is not bytes or len(key) != size:
                self._check(key)
        slots = self._slots
        new_node = self._new_node
        added = 0
        out = []
        for key in keys:
            node = 0
            for byte in key[:-1]:
                i = node + (byte >> 4)
                node = slots[i]
                if not node:
                    node = slots[i] = new_node()
                i = node + (byte & 15)
                node = slots[i]
                if not node:
                    node = slots[i] = new_node()
            byte = key[-1]
            i = node + (byte >> 4)
            node = slots[i]
            if not node:
                node = slots[i] = new_node()
            i = node + (byte & 15)
            if slots[i]:
                out.append(False)
            else:
                slots[i] = _PRESENT
                added += 1
                out.append(True)
        self._count += added
        return out

    def insert(self, keys: Iterable[bytes]) -> int:
        return sum(self.add_new(list(keys)))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes) or len(key) != self.key_bytes:
            return False
        slots = self._slots
        node = 0
        for byte in key[:-1]:
            node = slots[node + (byte >> 4)]
            if not node:
                return False
            node = slots[node + (byte & 15)]
            if not node:
                return False
        byte = key[-1]
        node = slots[node + (byte >> 4)]
        return bool(node) and bool(slots[node + (byte & 15)])

    def __len__(self) -> int:
        return self._count

    # -- arcs --

    def _arc_keys(self, start: int, end: int) -> list[bytes]:
        if self.key_bytes != 16:
            raise DedupUnsupported(
                "the study's 16-digit MD5 tree keeps no host position, so it cannot list or drop an arc"
            )
        found: list[int] = []
        slots = self._slots
        digits = 2 * self.key_bytes

        def walk(node: int, depth: int, acc: int, lo: int, hi: int, lo_tight: bool, hi_tight: bool) -> None:
            # depth: digits already taken; the first 16 digits (the position) are bounded by lo..hi
            bounded = depth < 16
            shift = 4 * (15 - depth)
            d_lo = (lo >> shift) & 15 if bounded and lo_tight else 0
            d_hi = (hi >> shift) & 15 if bounded and hi_tight else 15
            for d in range(d_lo, d_hi + 1):
                child = slots[node + d]
                if not child:
                    continue
                value = (acc << 4) | d
                if depth == digits - 1:
                    found.append(value)
                else:
                    walk(
                        child,
                        depth + 1,
                        value,
                        lo,
                        hi,
                        bounded and lo_tight and d == d_lo,
                        bounded and hi_tight and d == d_hi,
                    )

        for first, last in arc_ranges(start, end):
            walk(0, 0, 0, int.from_bytes(first, "big"), int.from_bytes(last, "big"), True, True)
        return [value.to_bytes(self.key_bytes, "big") for value in found]

    def scan(self, start: int, end: int) -> Iterator[bytes]:
        """Keys of the ring arc [start, end) in key order (the tree is in digit order, so no sort)."""
        return iter(self._arc_keys(start, end))

    def delete(self, start: int, end: int) -> int:
        """Remove the keys of the arc; nodes left empty go to the free list for reuse."""
        doomed = self._arc_keys(start, end)
        for key in doomed:
            self._discard(key)
        return len(doomed)

    def _discard(self, key: bytes) -> None:
        slots = self._slots
        path: list[int] = []  # slot index taken at each digit
        node = 0
        for byte in key:
            for d in (byte >> 4, byte & 15):
                path.append(node + d)
                node = slots[node + d]
        slots[path[-1]] = 0
        self._count -= 1
        # free nodes that became empty, from the bottom up (never the root)
        for i in range(len(path) - 1, 0, -1):
            owner = path[i] - path[i] % 16
            if any(slots[owner : owner + 16]):
                break
            self._free.append(owner)
            slots[path[i - 1]] = 0
