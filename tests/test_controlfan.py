"""Control requests for the whole cluster (peer/cluster/core/controlfan.py), over a fake of the peer links that
delivers messages between fans in one trio.run, in virtual time: every live member's answer merged by node, a
member that cannot do it or does not answer named with why, the members held dead named too."""

from __future__ import annotations

from typing import Any

import trio

from peer.cluster.core.controlfan import ASK_TIMEOUT, MAX_ANSWER, ControlFan
from protocol import Message


class Wires:
    """Peer links between fans in one process: a message to a node that is up is handled by its fan soon after;
    to one that is down (or unknown), `send_nowait` says it could not be sent."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.fans: dict[str, ControlFan] = {}
        self.silent: set[str] = set()  # up, but never answers

    def links(self, me: str) -> Any:
        wires = self

        class Links:
            def send_nowait(self, peer_id: str, message: Message, *, address: str | None = None) -> bool:
                fan = wires.fans.get(peer_id)
                if fan is None:
                    return False
                if peer_id not in wires.silent:
                    wires.nursery.start_soon(fan.on_message, me, message)
                return True

        return Links()


async def test_answers_are_merged_by_node_and_the_missing_named(autojump_clock):
    async with trio.open_nursery() as nursery:
        wires = Wires(nursery)
        members = ["A", "B", "C", "D"]

        def answer_of(node: str):
            async def answer(what: str, body: Any) -> Any:
                if what == "fail":
                    raise ValueError(f"{node} cannot")
                return {"node": node, "what": what, "body": body}
            return answer

        for node in ("A", "B", "C"):
            wires.fans[node] = ControlFan(node, wires.links(node), lambda: members, answer_of(node),
                                          dead=lambda: ["E"])
        wires.silent.add("C")
        start = trio.current_time()
        got = await wires.fans["A"].ask_all("plugins", lambda node: {"for": node})
        assert got.answers == {n: {"node": n, "what": "plugins", "body": {"for": n}} for n in ("A", "B")}
        assert got.missing == {"C": f"no answer within {ASK_TIMEOUT:g} s", "D": "cannot be reached (no link)",
                               "E": "held dead by the cluster"}
        assert trio.current_time() - start == ASK_TIMEOUT  # asked at once: one wait for all
        failed = await wires.fans["A"].ask_all("fail", {}, nodes=["A", "B"])
        assert failed.answers == {} and failed.missing == {"A": "A cannot", "B": "B cannot"}
        # an answer too large for one message is refused by the member that would send it, saying so
        big = await wires.fans["A"].ask_all("items", "x" * MAX_ANSWER, nodes=["B"])
        assert big.missing == {"B": f"the answer to items is over {MAX_ANSWER:,} bytes"}
        nursery.cancel_scope.cancel()
