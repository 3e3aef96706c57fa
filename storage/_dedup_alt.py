"""In-memory dedup backends from the URL-dedup study: a hash set of URL text and a set of fingerprints.

Every dedup backend speaks the `DedupStore` API over the product's 16-byte key (`url_key(position, url)`:
host ring position, then a 64-bit fingerprint of the URL), so the engine and the hand-off code never care
which structure is behind it. A structure that needs the URL text itself (the study's plain hash set of
URLs) cannot be fed a key: a key does not contain its URL. So every backend also takes `(position, url)`
pairs through `add_new_urls`/`contains_url`; keys are derived from them where the structure keeps keys.
What a structure cannot do (take keys it cannot turn back into URLs, list an arc from a Bloom filter) is
refused with `DedupUnsupported`, one line saying why, never silently approximated.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Self

from ._closing import Closing
from ._errors import StorageError
from ._keys import arc_ranges, url_key

__all__ = [
    "DedupUnsupported",
    "FingerprintSetDedup",
    "UrlKeyedMixin",
    "UrlSetDedup",
    "check_key",
    "md5_key",
]

KEY_BYTES = 16


class DedupUnsupported(StorageError):
    """The chosen dedup structure cannot do this operation by construction (the operator chose it)."""


def check_key(key: object) -> bytes:
    """A dedup key as these backends keep it: exactly 16 bytes (a caller's bug otherwise)."""
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise ValueError(f"a dedup key is the 16 bytes of url_key(position, url), got {key!r:.40}")
    return key


def _in_ranges(key: bytes, ranges: list[tuple[bytes, bytes]]) -> bool:
    head = key[:8]
    return any(first <= head <= last for first, last in ranges)


class UrlKeyedMixin:
    """`add_new_urls`/`contains_url` for a backend that keeps 16-byte keys: derive the key and delegate.

    The class it is mixed into provides `add_new(keys)` and `__contains__(key)`.
    """

    if TYPE_CHECKING:
        # What the class it is mixed into provides.
        def add_new(self, keys: Sequence[bytes]) -> list[bool]: ...

        def __contains__(self, key: object) -> bool: ...

    def add_new_urls(self, items: Sequence[tuple[int, str]]) -> list[bool]:
        """Check-and-insert `(host position, normalized URL)` pairs: True where the URL was new."""
        return self.add_new([url_key(position, url) for position, url in items])

    def contains_url(self, position: int, url: str) -> bool:
        return url_key(position, url) in self


class _MemoryBase(Closing):
    """Context-manager and lifecycle parts shared by the in-memory backends (nothing survives the process)."""

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None) -> Self:
        """The same as `cls()`: the `open(path)` every store has (nothing is read from `path`)."""
        return cls()


    def sync(self) -> None:
        """Nothing to force: an in-memory backend keeps nothing on disk, and a restart forgets every URL."""

    def close(self) -> None:
        """Nothing to release but the memory, which goes with the object."""


class FingerprintSetDedup(UrlKeyedMixin, _MemoryBase):
    """A hash set of 16-byte fingerprints (the study's "MD5 fingerprints" kind, `memory-md5`).

    The study hashed the URL with MD5 (16 bytes); the product's key is the same size and keeps the host's
    ring position in its first half, which is what lets an arc be listed. The set is unordered, so `scan`
    and `delete` of an arc read every key: O(n) per hand-off, fine for a structure that lives in memory.
    """

    def __init__(self) -> None:
        self._keys: set[bytes] = set()

    def add_new(self, keys: Sequence[bytes]) -> list[bool]:
        seen = self._keys
        out = []
        for key in keys:
            if key in seen:
                out.append(False)
            else:
                seen.add(check_key(key))
                out.append(True)
        return out

    def insert(self, keys: Iterable[bytes]) -> int:
        before = len(self._keys)
        self._keys.update(check_key(key) for key in keys)
        return len(self._keys) - before

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def scan(self, start: int, end: int) -> Iterator[bytes]:
        ranges = arc_ranges(start, end)
        return iter(sorted(key for key in self._keys if _in_ranges(key, ranges)))

    def delete(self, start: int, end: int) -> int:
        doomed = list(self.scan(start, end))
        self._keys.difference_update(doomed)
        return len(doomed)


class UrlSetDedup(_MemoryBase):
    """A hash set of the URL text itself (the study's baseline, `memory-urls`): exact, and the largest.

    Each entry is the host position as 16 hex digits followed by the URL, so an arc can be listed and its
    keys recomputed. A 16-byte key cannot be turned back into its URL, so the key calls (`add_new`,
    `insert`, `in`) are refused with `DedupUnsupported`: feed it `add_new_urls`. In a cluster this means a
    node on this backend cannot receive a hand-off of seen keys; it can send one (`scan` gives keys).
    """

    def __init__(self) -> None:
        self._entries: set[str] = set()

    @staticmethod
    def _entry(position: int, url: str) -> str:
        if not 0 <= position < 2**64:
            raise ValueError(f"position must be a ring position in [0, 2**64), got {position}")
        return f"{position:016x}{url}"

    def _refuse(self, what: str) -> DedupUnsupported:
        return DedupUnsupported(
            f"dedup kind 'memory-urls' keeps URL text and cannot {what} from 16-byte keys; "
            "use add_new_urls/contains_url or another kind"
        )

    def add_new_urls(self, items: Sequence[tuple[int, str]]) -> list[bool]:
        """Check-and-insert `(host position, normalized URL)` pairs: True where the URL was new."""
        seen = self._entries
        out = []
        for position, url in items:
            entry = self._entry(position, url)
            if entry in seen:
                out.append(False)
            else:
                seen.add(entry)
                out.append(True)
        return out

    def contains_url(self, position: int, url: str) -> bool:
        return self._entry(position, url) in self._entries

    def add_new(self, keys: Sequence[bytes]) -> list[bool]:
        raise self._refuse("check-and-insert")

    def insert(self, keys: Iterable[bytes]) -> int:
        raise self._refuse("take a hand-off")

    def __contains__(self, key: object) -> bool:
        raise self._refuse("answer a membership test")

    def __len__(self) -> int:
        return len(self._entries)

    def _arc_entries(self, start: int, end: int) -> list[str]:
        ranges = [
            (int.from_bytes(first, "big"), int.from_bytes(last, "big")) for first, last in arc_ranges(start, end)
        ]
        found = []
        for entry in self._entries:
            position = int(entry[:16], 16)
            if any(first <= position <= last for first, last in ranges):
                found.append(entry)
        return found

    def scan(self, start: int, end: int) -> Iterator[bytes]:
        """Keys (`url_key` of each stored URL) of the ring arc [start, end), in key order."""
        keys = [url_key(int(entry[:16], 16), entry[16:]) for entry in self._arc_entries(start, end)]
        return iter(sorted(keys))

    def delete(self, start: int, end: int) -> int:
        doomed = self._arc_entries(start, end)
        self._entries.difference_update(doomed)
        return len(doomed)


def md5_key(url: str) -> bytes:
    """The study's "16-digit MD5" of a URL: hex digits 8..24 of MD5, i.e. digest bytes 4..12 (64 bits)."""
    return hashlib.md5(url.encode("utf-8"), usedforsecurity=False).digest()[4:12]
