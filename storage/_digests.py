"""Payload digests this node owns on the ring, and where each payload was first stored in full.

One LMDB database in the node's environment:

- `digests`:  the digest's ring position (8 bytes) + the digest (ASCII)  ->  msgpack [URL, time, record id]

A digest is a key on the ring like a host name (its position is that of the text ``sha1:<digest>``), so the
node that owns the position answers for it, and an arc of the ring is one key range here. The first original
put for a digest stays: a later one (another node that stored the same payload before it heard) is ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import msgpack

from ._keys import host_position_bytes
from ._lmdb import LmdbEnv

if TYPE_CHECKING:
    from ._lmdb import Txn

__all__ = ["DIGESTS_DB", "MemoryPayloadDigests", "PayloadDigests", "StoredPayload", "digest_key", "digest_ring_key"]

DIGESTS_DB = b"digests"


class StoredPayload(NamedTuple):
    """Where a payload was first stored in full: its digest (base32 SHA-1), the URL and time of its response
    record, and that record's `WARC-Record-ID` ("" when not known)."""

    digest: str
    uri: str
    date: float
    record_id: str


def digest_ring_key(digest: str) -> str:
    """The text whose ring position is the digest's: its owner is the ring's owner of this key."""
    return "sha1:" + digest


def digest_key(digest: str) -> bytes:
    return host_position_bytes(digest_ring_key(digest)) + digest.encode("ascii")


class PayloadDigests:
    """The digests index in the node's LMDB environment."""

    def __init__(self, env: LmdbEnv) -> None:
        self._env = env
        self._db = env.db(DIGESTS_DB)

    def get_many(self, digests: Iterable[str]) -> dict[str, StoredPayload]:
        found: dict[str, StoredPayload] = {}
        with self._env.read() as txn:
            for digest in digests:
                if not digest.isascii():
                    continue
                value = txn.get(digest_key(digest), db=self._db)
                if value is not None:
                    uri, date, record_id = msgpack.unpackb(value)
                    found[digest] = StoredPayload(digest, uri, date, record_id)
        return found

    def put_many(self, originals: Sequence[StoredPayload]) -> int:
        """Remember where payloads were stored; a digest known already keeps its first original. The new ones."""
        rows = [(digest_key(o.digest), msgpack.packb([o.uri, float(o.date), o.record_id]))
                for o in originals if o.digest.isascii()]
        if not rows:
            return 0

        def run(txn: Txn) -> int:
            return sum(bool(txn.put(key, value, db=self._db, overwrite=False)) for key, value in rows)

        return self._env.write(run)

    def __len__(self) -> int:
        return self._env.entries(DIGESTS_DB)


class MemoryPayloadDigests:
    """The same in memory (a node on `MemoryNodeStore`)."""

    def __init__(self) -> None:
        self._known: dict[str, StoredPayload] = {}

    def get_many(self, digests: Iterable[str]) -> dict[str, StoredPayload]:
        return {d: self._known[d] for d in digests if d in self._known}

    def put_many(self, originals: Sequence[StoredPayload]) -> int:
        new = 0
        for original in originals:
            if original.digest not in self._known:
                self._known[original.digest] = original
                new += 1
        return new

    def __len__(self) -> int:
        return len(self._known)
