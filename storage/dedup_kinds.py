"""Choosing the dedup structure per node (`peerd --dedup KIND`): one registry, one `open_dedup` call.

Every kind speaks the `DedupStore` API over 16-byte `url_key`s (`add_new`, `insert`, `in`, `len`, `scan`,
`delete`, `sync`, `close`, context manager) and also `add_new_urls`/`contains_url` over
`(host position, URL)` pairs, which every kind accepts. An engine that calls `add_new_urls` works with all
kinds; one that calls `add_new(keys)` works with all but `memory-urls`, which keeps URL text and refuses keys.
Where a structure cannot do something by construction it raises `DedupUnsupported` with one line:

| kind | keeps | exact | survives restart | arc scan/delete | takes a hand-off |
|---|---|---|---|---|---|
| lmdb (default) | keys on disk | yes | yes | yes | yes |
| memory-urls | URL text | yes | no | yes (O(n)) | no |
| memory-md5 | 16-byte keys | yes* | no | yes (O(n)) | yes |
| md5-tree | 16-way digit tree of keys | yes* | no | yes | yes |
| bloom | bits | no: loses about fp_rate of new URLs | no | no | yes |
| redis | keys in Redis sets | yes* | server's setting | yes | yes |

(*) exact up to a collision of two URLs of one host in 64 bits.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._bloom import BloomDedup
from ._dedup import DedupStore
from ._dedup_alt import DedupUnsupported, FingerprintSetDedup, UrlSetDedup
from ._digittree import DigitTreeDedup
from ._keys import url_key
from ._redis_dedup import RedisDedup

__all__ = ["DEDUP_KINDS", "DedupUnsupported", "LmdbDedup", "open_dedup"]

DEDUP_KINDS = ("lmdb", "memory-urls", "memory-md5", "md5-tree", "bloom", "redis")


class LmdbDedup(DedupStore):
    """The default on-disk `DedupStore`, with the URL-pair calls every kind has."""

    def add_new_urls(self, items: Sequence[tuple[int, str]]) -> list[bool]:
        """Check-and-insert `(host position, normalized URL)` pairs: True where the URL was new."""
        return self.add_new([url_key(position, url) for position, url in items])

    def contains_url(self, position: int, url: str) -> bool:
        return url_key(position, url) in self


def open_dedup(
    kind: str,
    path: str | os.PathLike[str] | None,
    *,
    expected: int = 10_000_000,
    fp_rate: float = 0.001,
    redis_url: str | None = None,
    namespace: str | None = None,
) -> Any:
    """Open the dedup backend `kind` (one of `DEDUP_KINDS`).

    `path`: the LMDB directory for `lmdb`; for `redis` it names the key namespace when `namespace` is not
    given (so two nodes on one machine do not share a record); the memory kinds ignore it.
    `expected`, `fp_rate`: the Bloom filter's sizing (ignored by other kinds). `redis_url`: required by `redis`.
    Raises ValueError for an unknown kind or a missing option (the operator's flag), StorageError when the
    store cannot be opened.
    """
    if kind == "lmdb":
        if path is None:
            raise ValueError("dedup kind 'lmdb' needs a directory")
        return LmdbDedup.open(path)
    if kind == "memory-urls":
        return UrlSetDedup()
    if kind == "memory-md5":
        return FingerprintSetDedup()
    if kind == "md5-tree":
        return DigitTreeDedup(key_bytes=16)
    if kind == "bloom":
        return BloomDedup(expected=expected, fp_rate=fp_rate)
    if kind == "redis":
        if not redis_url:
            raise ValueError("dedup kind 'redis' needs a server URL, e.g. redis://127.0.0.1:6379/0")
        if namespace is None:
            namespace = str(Path(path).resolve()) if path is not None else "default"
        return RedisDedup.open(redis_url, namespace=namespace)
    raise ValueError(f"unknown dedup kind {kind!r}; choose one of: {', '.join(DEDUP_KINDS)}")
