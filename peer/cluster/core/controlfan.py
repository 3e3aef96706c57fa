"""Control requests for the whole cluster through one node: the node a person asks passes the request to every
live member over the peer links (`ControlAsk`), each answers from its own control routes (`ControlAnswer`),
and the asker merges the answers by node; a member that does not answer in time is named with why, never left
out silently. `peerctl plugins`, `peerctl items` and `peerctl plugins reload` go this way (peer/noderoutes.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import trio

from protocol import ControlAnswer, ControlAsk, Message

__all__ = ["ASK_TIMEOUT", "MAX_ANSWER", "ControlFan", "FanAnswers", "no_control"]

log = logging.getLogger("peer.cluster.controlfan")

#: The largest answer sent to a peer (its JSON, in bytes): under the protocol's `max_control`.
MAX_ANSWER = 700_000

#: How long a member has to answer: far above a page of items read from its disk or a chain loaded.
ASK_TIMEOUT = 10.0


class _Links(Protocol):
    def send_nowait(self, peer_id: str, message: Message, *, address: str | None = None) -> bool: ...


#: The node's own answer to a request: its `what` and its JSON body in, the answer's JSON out; ValueError (its
#: message) when the node cannot do it.
Answer = Callable[[str, Any], Awaitable[Any]]


async def no_control(what: str, body: Any) -> Any:
    """The answer of a cluster built without control routes (simulations): none."""
    raise ValueError(f"this node answers no control request ({what})")


class FanAnswers:
    """The answers of one request to the cluster: node id -> answer, and node id -> why it gave none."""

    __slots__ = ("answers", "missing")

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.missing: dict[str, str] = {}


class ControlFan:
    """Passing control requests to the live members and collecting their answers (`ask_all`, `ask`); answering
    theirs (`on_message`) with `answer`, the node's control routes."""

    def __init__(self, node_id: str, links: _Links, members: Callable[[], Sequence[str]],
                 answer: Answer = no_control, dead: Callable[[], Sequence[str]] = tuple) -> None:
        self.node_id = node_id
        self._links = links
        self._members = members  # the live members' node ids, this node's among them
        self._dead = dead  # the members this node holds dead: not asked, named as not answering
        self._answer = answer
        self._seq = 0
        self._waiting: dict[int, tuple[trio.Event, list[ControlAnswer]]] = {}

    async def ask(self, node_id: str, what: str, body: Any, timeout: float = ASK_TIMEOUT) -> Any:
        """One member's answer (this node's own, asked directly); ValueError naming the node when it gave none."""
        if node_id == self.node_id:
            try:
                return await self._answer(what, body)
            except ValueError as exc:
                raise ValueError(f"{node_id}: {exc}") from exc
        self._seq += 1
        seq = self._seq
        done = trio.Event()
        box: list[ControlAnswer] = []
        self._waiting[seq] = (done, box)
        try:
            if not self._links.send_nowait(node_id, ControlAsk(seq=seq, what=what, body=json.dumps(body))):
                raise ValueError(f"{node_id}: cannot be reached (no link)")
            with trio.move_on_after(timeout):
                await done.wait()
        finally:
            del self._waiting[seq]
        if not box:
            raise ValueError(f"{node_id}: no answer within {timeout:g} s")
        reply = box[0]
        if not reply.ok:
            raise ValueError(f"{node_id}: {reply.body}")
        try:
            return json.loads(reply.body)
        except ValueError as exc:
            raise ValueError(f"{node_id}: its answer is not JSON ({exc})") from exc

    async def ask_all(self, what: str, body: Any | Callable[[str], Any], *, nodes: Sequence[str] | None = None,
                      timeout: float = ASK_TIMEOUT) -> FanAnswers:
        """Every live member's answer (or `nodes`'), asked at once; `body` may depend on the node (a function
        of its id). The members that gave none are in ``missing`` with why, and (`nodes` not given) those the
        cluster holds dead."""
        out = FanAnswers()
        if nodes is None:
            targets = list(self._members())
            out.missing.update((node, "held dead by the cluster") for node in self._dead())
        else:
            targets = list(nodes)

        async def one(node_id: str) -> None:
            try:
                out.answers[node_id] = await self.ask(node_id, what, body(node_id) if callable(body) else body,
                                                      timeout)
            except ValueError as exc:
                out.missing[node_id] = str(exc).removeprefix(f"{node_id}: ")

        async with trio.open_nursery() as nursery:
            for node_id in targets:
                nursery.start_soon(one, node_id)
        return out

    async def on_message(self, peer_id: str, message: ControlAsk | ControlAnswer) -> None:
        if isinstance(message, ControlAnswer):
            waiting = self._waiting.get(message.seq)
            if waiting is not None and not waiting[1]:
                waiting[1].append(message)
                waiting[0].set()
            return
        try:
            answer = json.dumps(await self._answer(message.what, json.loads(message.body)))
            ok = True
        except ValueError as exc:  # the request cannot be done here (or its body is not JSON): say why
            answer, ok = str(exc)[:10_000], False
        if ok and len(answer.encode("utf-8")) > MAX_ANSWER:
            answer, ok = f"the answer to {message.what} is over {MAX_ANSWER:,} bytes", False
        self._links.send_nowait(peer_id, ControlAnswer(seq=message.seq, ok=ok, body=answer))
        log.debug("answered a peer's control request", extra={"peer": peer_id, "what": message.what, "ok": ok})
