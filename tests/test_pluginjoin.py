"""The plug-in chains compared at join, on both sides, over the in-memory network in virtual time: a node whose
chain differs refuses itself, and the member refuses it too (its view is not merged, the refusal names the
difference), even when the joiner never asks; a node with the same chain joins whichever side asks."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from peer.cluster.core.pluginjoin import PluginJoin, PluginMismatch
from peer.cluster.membership.membership import Membership
from peer.cluster.net.memtransport import MemoryNetwork
from peer.cluster.net.peerlinks import LinkError
from protocol import PluginCheck

SECRET = b"membership test secret, 32 byte"


def chain(version: str) -> dict[str, Any]:
    plugins = [{"use": "examples.docs_filter:DocsFilter", "version": version, "kinds": ["url_filter"],
                "settings": "44136fa355b3"}]
    return {"fingerprint": f"fp-{version}", "plugins": plugins}


class Node:
    def __init__(self, net: MemoryNetwork, index: int, version: str) -> None:
        self.described = chain(version)
        self.m = Membership(node_id=f"node-{index}", weight=10, secret=SECRET,
                            transport=net.transport(f"10.0.0.{index}:7000"), rng=random.Random(index),
                            nonce=random.Random(index).randbytes, on_message=self._on_message,
                            admits=lambda peer: self.join.admits(peer),
                            refuses=lambda node: node in self.join.refused_nodes)
        self.join = PluginJoin(self.m.links, lambda: self.described)

    async def _on_message(self, peer_id: str, message: Any) -> None:
        if isinstance(message, PluginCheck):
            self.join.on_message(peer_id, message)


async def _start(nursery: trio.Nursery, net: MemoryNetwork, index: int, version: str) -> tuple[Node, str]:
    node = Node(net, index, version)
    address = await nursery.start(node.m.run)
    return node, address


async def test_the_member_refuses_a_joiner_whose_chain_differs_even_when_it_never_asks(autojump_clock):
    net = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        a, a_addr = await _start(nursery, net, 1, "1")
        b, _ = await _start(nursery, net, 2, "1")
        c, _ = await _start(nursery, net, 3, "2")
        # the same chain: the joiner asks, then joins
        await b.join.check(a_addr, 5.0)
        await b.m.join(a_addr)
        assert {m.node_id for m in a.m.view.members} == {"node-1", "node-2"}
        # another chain, and the joiner skips its own check: the member asks it, and never merges its view
        with pytest.raises(LinkError, match="did not answer"):
            await c.m.join(a_addr, attempts=2)
        assert a.m.view.member("node-3") is None and a.m.gossip_refused > 0
        assert a.join.refused_nodes["node-3"] == (
            "plug-in #1 differs: node-3 runs examples.docs_filter:DocsFilter version 2 settings 44136fa355b3, "
            "this node runs examples.docs_filter:DocsFilter version 1 settings 44136fa355b3")
        # a joiner that asks hears the same difference, named from its side
        with pytest.raises(PluginMismatch, match="refused by node-1: .*this node runs examples.docs_filter:"
                                                 "DocsFilter version 2.*the cluster runs .*version 1"):
            await c.join.check(a_addr, 5.0)
        # once C runs the members' chain (a reload), it is asked again and admitted
        c.described = chain("1")
        await c.join.check(a_addr, 5.0)
        await c.m.join(a_addr)
        assert "node-3" not in a.join.refused_nodes
        with trio.fail_after(30):
            while b.m.view.member("node-3") is None:
                await trio.sleep(0.1)
        nursery.cancel_scope.cancel()


async def test_a_refused_node_is_left_out_of_the_views_others_gossip(autojump_clock):
    net = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        a, a_addr = await _start(nursery, net, 1, "1")
        b, b_addr = await _start(nursery, net, 2, "2")
        c, _ = await _start(nursery, net, 3, "2")
        with pytest.raises(PluginMismatch):  # C is refused by A ...
            await c.join.check(a_addr, 5.0)
        await c.join.check(b_addr, 5.0)  # ... and joins B, whose chain is C's
        await c.m.join(b_addr)
        b.described = chain("1")  # B takes A's chain (its members stay), and joins A
        await b.join.check(a_addr, 5.0)
        await b.m.join(a_addr)
        assert b.m.view.member("node-3") is not None
        await trio.sleep(30)  # many rounds of gossip between A and B
        assert a.m.view.member("node-2") is not None and a.m.view.member("node-3") is None
        assert "node-3" in a.join.refused_nodes
        nursery.cancel_scope.cancel()
