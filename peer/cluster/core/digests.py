"""Where payloads were first stored, asked of their owner on the ring: the cluster's `PayloadOriginals`
(peer/crawl/payloads.py).

A payload digest is a key on the ring like a host name (`storage.digest_ring_key`), so one node owns each digest
and keeps where its payload was first stored in full (`storage.PayloadDigests`). A node about to store a page
asks the owner (`original`): the asks wait in one batch per owner (`protocol.DigestAsks`) that goes every
`interval`, or at once when it is full; a digest it owns itself is answered from its own store, without a
message. A node that stored a payload in full tells the owner (`stored`), with the next batch to it.

What may go wrong costs disk, never a payload: an ask unanswered within `timeout` (the owner is down, cut off,
or its link's queue is full) is "not known", and the page is stored in full. Originals are not handed off when a
view change moves digests: the new owner does not know them, answers "not known", and the first copy stored
after the change becomes the original it remembers. The old owner keeps its entries, and answers for them again
if its arcs come back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import trio

from protocol import DigestAnswer, DigestAsk, DigestAsks, Message, PayloadOriginal, answer_ask
from storage import StoredPayload, digest_ring_key

__all__ = ["ASK_INTERVAL", "ASK_TIMEOUT", "DigestLookups"]

log = logging.getLogger("peer.cluster.digests")

#: How long asks for one owner wait to be sent together: a page's store waits at most this plus a round trip.
ASK_INTERVAL = 0.02
#: An ask unanswered this long is "not known" (the page is stored in full).
ASK_TIMEOUT = 2.0
#: Digests asked or notes sent per message (a batch of 1,000 is about 60 KB).
MAX_BATCH = 1000


class _Index(Protocol):
    def get_many(self, digests: Iterable[str]) -> dict[str, StoredPayload]: ...

    def put_many(self, originals: list[StoredPayload]) -> int: ...


class _Links(Protocol):
    def send_nowait(self, peer_id: str, message: Message, *, address: str | None = None) -> bool: ...


def _wire(original: StoredPayload) -> PayloadOriginal:
    return PayloadOriginal(digest=original.digest, uri=original.uri, date=original.date,
                           record_id=original.record_id)


def _stored(original: PayloadOriginal) -> StoredPayload:
    return StoredPayload(original.digest, original.uri, original.date, original.record_id)


class DigestLookups:
    """Both sides on one node: the asker for the crawler (`original`, `stored`), the owner for its peers
    (`on_message`). `owner_of(key)` is the ring's owner of a key now (None: no ring yet, answer here)."""

    def __init__(self, node_id: str, index: _Index, links: _Links, *, owner_of: Callable[[str], str | None],
                 interval: float = ASK_INTERVAL, timeout: float = ASK_TIMEOUT, max_batch: int = MAX_BATCH) -> None:
        self.node_id = node_id
        self.index = index
        self.links = links
        self.owner_of = owner_of
        self.interval = interval
        self.asks = DigestAsks(max_batch=max_batch, timeout=timeout)
        self._waiters: dict[str, tuple[trio.Event, list[StoredPayload | None]]] = {}
        self._queued = trio.Event()  # set when an ask or a note is queued
        self._wake = trio.Event()  # set when a batch is full
        self.asked = 0  # digests asked of another node
        self.found = 0  # ... that it knew
        self.unanswered = 0  # ... settled as not known: no answer in time, or not sent
        self.notes_received = 0  # originals peers told this node of
        self.answers_sent = 0

    # -- the asker: the crawler's PayloadOriginals ---------------------------------------------------------

    def _owner(self, digest: str) -> str:
        owner = self.owner_of(digest_ring_key(digest))
        return self.node_id if owner is None else owner

    async def original(self, digest: str) -> StoredPayload | None:
        owner = self._owner(digest)
        if owner == self.node_id:
            return self.index.get_many([digest]).get(digest)
        waiting = self._waiters.get(digest)
        if waiting is None:
            if not self.asks.ask(owner, digest):
                self.unanswered += 1
                return None
            self.asked += 1
            waiting = self._waiters[digest] = (trio.Event(), [])
            self._queued.set()
            if self.asks.full():
                self._wake.set()
        await waiting[0].wait()
        return waiting[1][0] if waiting[1] else None

    def stored(self, original: StoredPayload) -> None:
        owner = self._owner(original.digest)
        if owner == self.node_id:
            self.index.put_many([original])
        else:
            self.asks.note(owner, _wire(original))
            self._queued.set()
            if self.asks.full():
                self._wake.set()

    def _settle(self, settled: Iterable[tuple[str, StoredPayload | None]]) -> None:
        for digest, original in settled:
            waiting = self._waiters.pop(digest, None)
            self.found += original is not None
            if waiting is not None:
                waiting[1].append(original)
                waiting[0].set()

    # -- the owner ------------------------------------------------------------------------------------------

    def on_message(self, peer_id: str, message: Any) -> None:
        if isinstance(message, DigestAsk):
            if message.stored:
                self.notes_received += len(message.stored)
                self.index.put_many([_stored(o) for o in message.stored])
            if message.digests:
                answer = answer_ask(message, lambda digests: {
                    d: _wire(o) for d, o in self.index.get_many(digests).items()})
                self.answers_sent += self.links.send_nowait(peer_id, answer)
        elif isinstance(message, DigestAnswer):
            self._settle((d, None if o is None else _stored(o)) for d, o in self.asks.answered(peer_id, message))

    # -- the sender -----------------------------------------------------------------------------------------

    def flush(self, now: float) -> None:
        """Send what waits; settle as not known what went unanswered for too long or could not be sent."""
        for peer, message in self.asks.take(now):
            if not self.links.send_nowait(peer, message) and message.digests:
                lost = [digest for digest, _none in self.asks.answered(peer, DigestAnswer(seq=message.seq, found=()))]
                self.unanswered += len(lost)
                self._settle((digest, None) for digest in lost)
        expired = self.asks.expire(now)
        if expired:
            self.unanswered += len(expired)
            log.debug("payload digests unanswered in time: their pages are stored in full",
                      extra={"digests": len(expired)})
            self._settle((digest, None) for digest in expired)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if self.asks.idle():  # nothing queued, nothing out: sleep until something is
                await self._queued.wait()
            with trio.move_on_after(self.interval):
                await self._wake.wait()
            self._queued = trio.Event()
            self._wake = trio.Event()
            self.flush(trio.current_time())

    def status(self) -> dict[str, int]:
        return {"asked": self.asked, "found": self.found, "unanswered": self.unanswered,
                "waiting": self.asks.outstanding(), "notes_received": self.notes_received,
                "notes_dropped": self.asks.notes_dropped}
