"""Identical payloads across URLs (`payload_revisits`, on by default): a page whose payload the cluster stored
already under another URL (or at another time) is written as a WARC `revisit` record, profile
identical-payload-digest, pointing at the first copy, instead of a second copy.

Who knows where a payload was stored is the digest's owner on the ring (a digest is a key like a host name:
`storage.digest_ring_key`). The crawler asks through a `PayloadOriginals`: `LocalOriginals` on a node alone
(it answers itself from its store), the cluster's `peer.cluster.core.digests.DigestLookups` in a fleet. Whatever
goes wrong on the way (the owner unreachable, no answer in time, a view change that moved the digest to a node
that never heard of it) answers "not known", and the page is stored in full: a payload is never lost, at worst
stored twice.
"""

from __future__ import annotations

from typing import Protocol

from storage import StoredPayload

__all__ = ["MIN_PAYLOAD", "LocalOriginals", "PayloadOriginals"]

#: Payloads shorter than this are stored in full: a revisit record and its request cost about 700 bytes
#: compressed, about what a small page costs whole.
MIN_PAYLOAD = 1024


class PayloadOriginals(Protocol):
    """Where payloads were first stored in full, across the cluster."""

    async def original(self, digest: str) -> StoredPayload | None:
        """Where the payload of `digest` was stored in full before; None if nowhere known (or not known in
        time): the caller stores it in full."""

    def stored(self, original: StoredPayload) -> None:
        """A payload was just stored in full (its record is written): tell the digest's owner."""


class _Index(Protocol):
    def get_many(self, digests: list[str]) -> dict[str, StoredPayload]: ...

    def put_many(self, originals: list[StoredPayload]) -> int: ...


class LocalOriginals:
    """A node alone owns every digest: it answers itself from its store (`storage.PayloadDigests`)."""

    def __init__(self, index: _Index) -> None:
        self.index = index

    async def original(self, digest: str) -> StoredPayload | None:
        return self.index.get_many([digest]).get(digest)

    def stored(self, original: StoredPayload) -> None:
        self.index.put_many([original])
