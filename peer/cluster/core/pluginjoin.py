"""The same plug-ins everywhere: the plug-in chains of two nodes are compared before one joins through the
other (`PluginCheck`), on both sides.

- The joining node asks the member it joins through which chain it runs, and refuses to join when the two
  differ, naming the difference (`check`).
- Every member refuses too: a node that is not yet a member here is admitted to this node's view only once it
  has shown a chain like this node's (`admits`, asked by membership before it merges the newcomer's view; a
  newcomer that did not say is asked). A node whose chain differs is refused: its gossip is not merged, it is
  left out of every view merged here, and the refusal is logged and listed (`refused_nodes`: node -> the
  difference) until it shows the same chain or this node's own chain changes (a reload).

Reloads (`peerctl plugins reload`) go to every node at once, so members that joined alike stay alike.
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
        self.refused = 0  # nodes refused for a chain that differs from this node's (each time one is)
        # node -> the difference, for nodes whose chain differs from this node's; nodes whose chain is the same
        self.refused_nodes: dict[str, str] = {}
        self._admitted: set[str] = set()
        self._asked: dict[str, float] = {}  # node -> when this node last asked it (trio time)
        self._fingerprint = describe()["fingerprint"]

    def _mine(self) -> dict[str, Any]:
        """This node's chain; what was learnt of others' is forgotten when it changed (a reload)."""
        mine = self._describe()
        if mine["fingerprint"] != self._fingerprint:
            self._fingerprint = mine["fingerprint"]
            self._admitted.clear()
            self.refused_nodes.clear()
            self._asked.clear()
        return mine

    def _message(self, seq: int, answer: bool) -> PluginCheck:
        mine = self._mine()
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
                difference = self._compare(peer_id, box[0])
                if difference is not None:
                    raise PluginMismatch(f"refused by {peer_id}: this node's plug-ins differ from the cluster's: "
                                         f"{difference}")
                return
            problem = trio.TooSlowError(f"{seed_address} did not say which plug-ins it runs within {timeout} s")
        raise problem

    def _compare(self, peer_id: str, theirs: PluginCheck) -> str | None:
        """Note `peer_id`'s chain as admitted or refused; the difference (this node's chain against the
        cluster's, as the joining node says it), None when the same."""
        mine = self._mine()
        if theirs.fingerprint == mine["fingerprint"]:
            self._admitted.add(peer_id)
            self.refused_nodes.pop(peer_id, None)
            return None
        try:
            chain = json.loads(theirs.chain)
        except ValueError:
            chain = []
        if not isinstance(chain, list):
            chain = []
        self._admitted.discard(peer_id)
        # the member's record names the refused node's chain first
        refusal = describe_difference(chain, mine["plugins"], me=peer_id, them="this node")
        if self.refused_nodes.get(peer_id) != refusal:
            self.refused += 1
            log.warning("a node whose plug-ins differ from this node's is refused: it does not join the cluster "
                        "through this node, and its view is not merged here",
                        extra={"peer": peer_id, "difference": refusal})
        self.refused_nodes[peer_id] = refusal
        return describe_difference(mine["plugins"], chain)

    def admits(self, peer_id: str) -> bool:
        """Whether `peer_id`, not yet a member here, has shown a chain like this node's. When it has not said,
        it is asked (at most once every `JOIN_RESEND`); its view is merged once its answer matches."""
        self._mine()
        if peer_id in self._admitted:
            return True
        if peer_id not in self.refused_nodes:
            now = trio.current_time()
            if now - self._asked.get(peer_id, -JOIN_RESEND) >= JOIN_RESEND:
                self._asked[peer_id] = now
                self._seq += 1
                self._links.send_nowait(peer_id, self._message(self._seq, answer=False))
        return False

    def on_message(self, peer_id: str, message: PluginCheck) -> None:
        if message.answer:
            waiting = self._answers.get(message.seq)
            if waiting is not None:
                waiting[1].append(message)
                waiting[0].set()
            else:  # the answer to a member's own question (`admits`)
                self._compare(peer_id, message)
            return
        self._links.send_nowait(peer_id, self._message(message.seq, answer=True))
        self._compare(peer_id, message)
