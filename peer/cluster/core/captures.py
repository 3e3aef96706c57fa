"""The cluster's capture look-up (`GET /cdx` on any node): every live member is asked for the captures its
indexes hold, over the peer links (`CaptureAsk`, answered by `CaptureAnswer`), and the answers are merged in key
then time order.

Every member is asked, not only the ring's owner of the URL's host: a host's captures stay on the node that made
them, and the owner changes when nodes join and leave, so captures made before a view change are with the
previous owner. Asking over the peer links needs no other node's control token and is proved by the cluster
secret like everything else between nodes. A peer that does not answer within `ASK_TIMEOUT` is named in the
answer (`missing`), and the rest is served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from protocol import CaptureAnswer, CaptureAsk

__all__ = ["ASK_TIMEOUT", "ANSWER_BYTES", "CaptureLookups", "LocalCaptures", "no_captures"]

#: Seconds a peer has to answer a capture ask.
ASK_TIMEOUT = 5.0
#: The lines of one answer stay under this many bytes (a frame is at most 1 MiB); what is left out is flagged.
ANSWER_BYTES = 768 * 1024

#: This node's captures for an ask: CDXJ lines (each naming the node and, once uploaded, the object key).
LocalCaptures = Callable[[CaptureAsk], Awaitable[list[str]]]


async def no_captures(_ask: CaptureAsk) -> list[str]:
    """A cluster built alone (a simulation) holds no captures."""
    return []


def _bounded(lines: list[str]) -> tuple[tuple[str, ...], bool]:
    total = 0
    for index, line in enumerate(lines):
        total += len(line.encode("utf-8")) + 8
        if total > ANSWER_BYTES:
            return tuple(lines[:index]), True
    return tuple(lines), False


class CaptureLookups:
    """Answers the peers' capture asks from this node's indexes, and asks them for a look-up here."""

    def __init__(self, node_id: str, *, links: Any, live_peers: Callable[[], list[str]],
                 address_of: Callable[[str], str | None], local: LocalCaptures) -> None:
        self.node_id = node_id
        self.links = links
        self._live_peers = live_peers
        self._address_of = address_of
        self.local = local
        self._seq = 0
        self._waiting: dict[tuple[str, int], tuple[trio.Event, list[CaptureAnswer]]] = {}
        self.asked_count = 0  # asks answered for peers

    async def asked(self, peer_id: str, message: CaptureAsk) -> None:
        """A peer's look-up: this node's captures, bounded to one frame."""
        self.asked_count += 1
        try:
            lines = await self.local(message)
        except (OSError, ValueError) as exc:
            self.links.send_nowait(peer_id, CaptureAnswer(seq=message.seq, lines=(), more=False,
                                                          error=f"{type(exc).__name__}: {exc}"))
            return
        kept, more = _bounded(lines)
        self.links.send_nowait(peer_id, CaptureAnswer(seq=message.seq, lines=kept, more=more, error=""))

    def answered(self, peer_id: str, message: CaptureAnswer) -> None:
        waiter = self._waiting.get((peer_id, message.seq))
        if waiter is not None:  # else too late, or never asked: dropped
            waiter[1].append(message)
            waiter[0].set()

    async def lookup(self, *, url: str, match: str, since: str, until: str, limit: int) -> dict[str, Any]:
        """Every live member's captures (this node's too), merged in key then time order, at most `limit`:
        {"lines", "missing" (peers that did not answer, with why), "more" (an answer was cut at its bound)}."""
        self._seq += 1
        ask = CaptureAsk(seq=self._seq, url=url, match=match, since=since, until=until, limit=limit)
        answers: dict[str, list[str]] = {}
        missing: dict[str, str] = {}
        more = False

        async def from_peer(peer: str) -> None:
            nonlocal more
            key = (peer, ask.seq)
            event, got = trio.Event(), list[CaptureAnswer]()
            self._waiting[key] = (event, got)
            try:
                self.links.send_nowait(peer, ask, address=self._address_of(peer))
                with trio.move_on_after(ASK_TIMEOUT):
                    await event.wait()
            finally:
                del self._waiting[key]
            if not got:
                missing[peer] = f"no answer within {ASK_TIMEOUT:g} s"
            elif got[0].error:
                missing[peer] = got[0].error
            else:
                answers[peer] = list(got[0].lines)
                more = more or got[0].more

        async with trio.open_nursery() as nursery:
            for peer in self._live_peers():
                nursery.start_soon(from_peer, peer)
            answers[self.node_id] = await self.local(ask)
        merged = sorted((line for lines in answers.values() for line in lines),
                        key=lambda line: tuple(line.split(" ", 2)[:2]))
        return {"lines": merged[:limit], "missing": missing, "more": more or len(merged) > limit}
