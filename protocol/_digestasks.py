"""Asking payload digests of their owner, sans-I/O: the asking side's batches and answers, and the owner's
answer to an ask.

A node about to store a payload asks the digest's owner on the ring whether it was stored in full already
(`ask`); a node that stored one in full tells the owner (`note`). Both wait in one batch per owner until the
shell sends what `take` gives (on a timer and when a batch is full, as URL batches go); `answered` turns an
answer into the digests it settles, and `expire` gives up on the asks unanswered past `timeout` (the shell then
stores the payload in full). A digest asked again while its ask is out waits for the same answer.

Nothing here reads a clock or touches a socket: time comes in as `now`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ._errors import LocalProtocolError
from ._messages import DigestAnswer, DigestAsk, PayloadOriginal

__all__ = ["DigestAsks", "answer_ask"]


@dataclass(slots=True)
class _Batch:
    digests: list[str] = field(default_factory=list)
    stored: list[PayloadOriginal] = field(default_factory=list)


class DigestAsks:
    """The asking side: digests waiting to be asked, per owner; asks out, by `seq`; notes of payloads stored."""

    def __init__(self, *, max_batch: int = 1000, timeout: float = 2.0, max_waiting: int = 100_000) -> None:
        if max_batch < 1 or timeout <= 0 or max_waiting < 1:
            raise LocalProtocolError("DigestAsks needs max_batch >= 1, timeout > 0, max_waiting >= 1")
        self.max_batch = max_batch
        self.timeout = timeout
        self.max_waiting = max_waiting
        self._batches: dict[str, _Batch] = {}
        self._waiting: set[str] = set()  # digests asked and not settled (queued or out)
        self._out: dict[int, tuple[str, float, tuple[str, ...]]] = {}  # seq -> peer, sent at, digests
        self._seq = 0
        self.notes_dropped = 0  # notes past the bound, never sent (a later duplicate is stored in full)

    def ask(self, peer: str, digest: str) -> bool:
        """Queue the question for `peer`; True also when `digest` is being asked already (one answer settles
        both). False when `max_waiting` digests wait: the caller stores the page in full at once."""
        if digest in self._waiting:
            return True
        if len(self._waiting) >= self.max_waiting:
            return False
        self._waiting.add(digest)
        self._batches.setdefault(peer, _Batch()).digests.append(digest)
        return True

    def waiting(self, digest: str) -> bool:
        return digest in self._waiting

    def note(self, peer: str, original: PayloadOriginal) -> None:
        """Tell `peer` (the digest's owner) where a payload was stored in full, with the next batch to it."""
        batch = self._batches.setdefault(peer, _Batch())
        if len(batch.stored) >= self.max_waiting:
            self.notes_dropped += 1
            return
        batch.stored.append(original)

    def full(self) -> bool:
        """Whether some batch holds `max_batch` items: the shell sends now rather than at its next tick."""
        return any(len(b.digests) >= self.max_batch or len(b.stored) >= self.max_batch
                   for b in self._batches.values())

    def take(self, now: float) -> list[tuple[str, DigestAsk]]:
        """The asks to send now, at most `max_batch` digests and notes each; everything queued goes."""
        messages: list[tuple[str, DigestAsk]] = []
        for peer, batch in self._batches.items():
            digests, stored = batch.digests, batch.stored
            for start in range(0, max(len(digests), len(stored)), self.max_batch):
                part = tuple(digests[start:start + self.max_batch])
                self._seq += 1
                if part:
                    self._out[self._seq] = (peer, now, part)
                messages.append((peer, DigestAsk(seq=self._seq, digests=part,
                                                 stored=tuple(stored[start:start + self.max_batch]))))
        self._batches.clear()
        return messages

    def answered(self, peer: str, answer: DigestAnswer) -> list[tuple[str, PayloadOriginal | None]]:
        """The digests an answer settles, with their original (None: not stored before). An answer to no ask
        out (late, repeated, or from another peer than asked) settles nothing."""
        out = self._out.get(answer.seq)
        if out is None or out[0] != peer:
            return []
        del self._out[answer.seq]
        found = {original.digest: original for original in answer.found}
        settled = []
        for digest in out[2]:
            self._waiting.discard(digest)
            settled.append((digest, found.get(digest)))
        return settled

    def expire(self, now: float) -> list[str]:
        """The digests whose ask went unanswered for `timeout`: settled as not known (stored in full)."""
        late = [seq for seq, (_peer, sent, _digests) in self._out.items() if now - sent >= self.timeout]
        expired: list[str] = []
        for seq in late:
            for digest in self._out.pop(seq)[2]:
                self._waiting.discard(digest)
                expired.append(digest)
        return expired

    def forget_peer(self, peer: str) -> list[str]:
        """`peer` left the view: its queued and outstanding asks are settled as not known."""
        gone = list(self._batches.pop(peer, _Batch()).digests)
        for seq in [s for s, (p, _sent, _d) in self._out.items() if p == peer]:
            gone += self._out.pop(seq)[2]
        for digest in gone:
            self._waiting.discard(digest)
        return gone

    def idle(self) -> bool:
        """Nothing queued and no ask out: the shell has nothing to send or expire until `ask` or `note`."""
        return not self._batches and not self._out

    def outstanding(self) -> int:
        return len(self._waiting)


def answer_ask(ask: DigestAsk, known: Callable[[Iterable[str]], dict[str, PayloadOriginal]]) -> DigestAnswer:
    """The owner's answer to `ask`: the originals `known` finds of its digests (after its notes were kept)."""
    found = known(ask.digests)
    return DigestAnswer(seq=ask.seq, found=tuple(found[d] for d in dict.fromkeys(ask.digests) if d in found))
