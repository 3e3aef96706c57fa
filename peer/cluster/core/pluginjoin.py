"""The same plug-ins everywhere: before a node joins, it asks the member it joins through which plug-in chain
it runs (`PluginCheck`), and refuses to join when the two differ, naming the difference. The member answers
every ask with its own chain and counts (and logs) the askers whose chain differs: they go away.

Reloads (`peerctl plugins reload`) go to every node, so members that joined alike stay alike.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

import trio

from protocol import Message, PluginCheck

from peer.cluster.membership.membership import JOIN_RESEND
from peer.cluster.net.linksessions import LinkError
from peer.plugins import describe_difference

__all__ = ["PluginJoin", "PluginMismatch", "no_plugins"]

log = logging.getLogger("peer.cluster.pluginjoin")


class PluginMismatch(Exception):
    """This node's plug-in chain differs from the member's it would join through."""


class _Links(Protocol):
    async def introduce(self, address: str) -> str: ...

    def send_nowait(self, peer_id: str, message: Message, *, address: str | None = None) -> bool: ...


def no_plugins() -> dict[str, Any]:
    """The description of a node without plug-ins."""
    return {"fingerprint": "", "plugins": []}


class PluginJoin:
    """Comparing plug-in chains at join. `describe()` gives this node's chain as ``{"fingerprint", "plugins"}``."""

    def __init__(self, links: _Links, describe: Callable[[], dict[str, Any]] = no_plugins) -> None:
        self._links = links
        self._describe = describe
        self._seq = 0
        self._answers: dict[int, tuple[trio.Event, list[PluginCheck]]] = {}
        self.refused = 0  # askers whose chain differed from this node's

    def _message(self, seq: int, answer: bool) -> PluginCheck:
        mine = self._describe()
        return PluginCheck(seq=seq, fingerprint=mine["fingerprint"], chain=json.dumps(mine["plugins"]),
                           answer=answer)

    async def check(self, seed_address: str, timeout: float, *, attempts: int = 3) -> None:
        """Compare chains with the member at `seed_address`: PluginMismatch naming the difference; LinkError
        or trio.TooSlowError when it cannot be asked.

        As membership's join does: `attempts` tries, each waiting at most `timeout` for the answer and asking
        again every `JOIN_RESEND` meanwhile, so a lost message (a link that broke after the write) costs a
        resend, not the join. The question is idempotent: the member answers each one."""
        problem: Exception = trio.TooSlowError(f"{seed_address} did not say which plug-ins it runs")
        for _attempt in range(attempts):
            try:
                peer_id = await self._links.introduce(seed_address)
            except LinkError as exc:
                problem = exc
                continue
            self._seq += 1
            seq = self._seq
            done = trio.Event()
            box: list[PluginCheck] = []
            self._answers[seq] = (done, box)
            try:
                with trio.move_on_after(timeout):
                    while not done.is_set():
                        self._links.send_nowait(peer_id, self._message(seq, answer=False), address=seed_address)
                        with trio.move_on_after(JOIN_RESEND):
                            await done.wait()
            finally:
                del self._answers[seq]
            if box:
                self._compare(peer_id, box[0])
                return
            problem = trio.TooSlowError(f"{seed_address} did not say which plug-ins it runs within {timeout} s")
        raise problem

    def _compare(self, peer_id: str, theirs: PluginCheck) -> None:
        mine = self._describe()
        if theirs.fingerprint != mine["fingerprint"]:
            try:
                chain = json.loads(theirs.chain)
            except ValueError:
                chain = []
            raise PluginMismatch(f"refused by {peer_id}: this node's plug-ins differ from the cluster's: "
                                 f"{describe_difference(mine['plugins'], chain)}")

    def on_message(self, peer_id: str, message: PluginCheck) -> None:
        if message.answer:
            waiting = self._answers.get(message.seq)
            if waiting is not None:
                waiting[1].append(message)
                waiting[0].set()
            return
        self._links.send_nowait(peer_id, self._message(message.seq, answer=True))
        if message.fingerprint != self._describe()["fingerprint"]:
            self.refused += 1
            log.warning("a node whose plug-ins differ asked to join; it is told so and refuses itself",
                        extra={"peer": peer_id, "theirs": message.fingerprint,
                               "ours": self._describe()["fingerprint"]})
