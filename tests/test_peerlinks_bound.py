"""Bounded peer links: an idle link closes and reopens at its next use; past `max_links` the least recently used
idle link closes first; a busy link is never closed for idleness. In-memory network, MockClock."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from peer.cluster.net.peerlinks import LinkConfig, PeerLinks
from peer.cluster.net.memtransport import MemoryNetwork
from protocol import Message, Ping

SECRET = b"peer link bound test secret, 32b"


def virtual(test):  # type: ignore[no-untyped-def]
    def run() -> None:
        trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))

    run.__name__ = test.__name__
    return run


class Node:
    def __init__(self, net: MemoryNetwork, name: str, config: LinkConfig, busy=None) -> None:  # type: ignore[no-untyped-def]
        self.name = name
        self.address = f"{name}:7000"
        self.inbox: list[tuple[str, Message]] = []
        self.links = PeerLinks(node_id=name, secret=SECRET, transport=net.transport(self.address),
                               on_message=self.receive, rng=random.Random(name), config=config,
                               nonce=random.Random(name).randbytes, busy=busy,
                               address_of=lambda peer: f"{peer}:7000")

    async def receive(self, peer_id: str, message: Message) -> None:
        self.inbox.append((peer_id, message))

    async def wait_for(self, count: int, limit: float = 10.0) -> None:
        with trio.fail_after(limit):
            while len(self.inbox) < count:
                await trio.sleep(0.01)


def tasks() -> int:
    """Tasks alive in this run (the root's descendants)."""
    count = 0
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


@virtual
async def test_a_link_idle_past_the_timeout_closes_and_reopens_on_the_next_send() -> None:
    net = MemoryNetwork(random.Random(1), delay=0.001)
    config = LinkConfig(idle_timeout=10.0, max_links=0)
    a, b = Node(net, "a", config), Node(net, "b", config)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        await nursery.start(b.links.run)
        idle_tasks = tasks()
        assert a.links.send_nowait("b", Ping(seq=1, epoch=1), address=b.address)
        await b.wait_for(1)
        assert a.links.connected_peers() == ["b"] and b.links.connected_peers() == ["a"]
        await trio.sleep(9.0)  # not yet idle for 10 s
        assert a.links.connected_peers() == ["b"]
        await trio.sleep(2.0)
        assert a.links.connected_peers() == [] and b.links.connected_peers() == []
        assert 1 <= a.links.idle_closes + b.links.idle_closes <= 2 and a.links.live == b.links.live == 0
        await trio.sleep(60.0)  # closed for idleness: nobody redials while nothing is to be sent
        assert net.connects == 1 and a.links.connected_peers() == []
        assert tasks() == idle_tasks  # an idle link costs no task
        # The next use, from either side, reopens it and delivers the message.
        assert b.links.send_nowait("a", Ping(seq=2, epoch=1))
        await a.wait_for(1)
        assert a.inbox == [("b", Ping(seq=2, epoch=1))] and net.connects == 2
        assert a.links.send_nowait("b", Ping(seq=3, epoch=1))
        await b.wait_for(2)
        assert b.inbox == [("a", Ping(seq=1, epoch=1)), ("a", Ping(seq=3, epoch=1))]
        nursery.cancel_scope.cancel()


@virtual
async def test_a_used_link_stays_open_and_traffic_either_way_counts_as_use() -> None:
    net = MemoryNetwork(random.Random(2), delay=0.001)
    config = LinkConfig(idle_timeout=10.0, max_links=0)
    a, b = Node(net, "a", config), Node(net, "b", config)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        await nursery.start(b.links.run)
        for seq in range(30):  # one message every 6 s for 3 minutes, alternating sender
            sender, peer = (a, "b") if seq % 2 else (b, "a")
            assert sender.links.send_nowait(peer, Ping(seq=seq, epoch=1), address=f"{peer}:7000")
            await trio.sleep(6.0)
        assert len(a.inbox) == len(b.inbox) == 15
        assert net.connects == 1 and a.links.idle_closes == b.links.idle_closes == 0
        nursery.cancel_scope.cancel()


@virtual
async def test_a_busy_link_is_never_closed_for_idleness() -> None:
    net = MemoryNetwork(random.Random(3), delay=0.001)
    config = LinkConfig(idle_timeout=5.0, max_links=0)
    waiting_for = {"b"}
    a = Node(net, "a", config, busy=lambda peer: peer in waiting_for)
    b = Node(net, "b", LinkConfig(idle_timeout=0, max_links=0))
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        await nursery.start(b.links.run)
        assert a.links.send_nowait("b", Ping(seq=1, epoch=1), address=b.address)
        await b.wait_for(1)
        await trio.sleep(60.0)
        assert a.links.connected_peers() == ["b"] and a.links.idle_closes == 0
        waiting_for.clear()  # acknowledged: the next check finds it idle
        await trio.sleep(6.0)
        assert a.links.connected_peers() == [] and a.links.idle_closes == 1
        nursery.cancel_scope.cancel()


@virtual
async def test_the_cap_holds_closing_the_least_recently_used_idle_link_first() -> None:
    net = MemoryNetwork(random.Random(4), delay=0.001)
    hub = Node(net, "hub", LinkConfig(idle_timeout=0, max_links=3))
    spokes = [Node(net, f"s{i}", LinkConfig(idle_timeout=0, max_links=0)) for i in range(6)]
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.links.run)
        for spoke in spokes:
            await nursery.start(spoke.links.run)
        most = 0
        for i, spoke in enumerate(spokes):
            assert hub.links.send_nowait(spoke.name, Ping(seq=i, epoch=1), address=spoke.address)
            await spoke.wait_for(1)
            await trio.sleep(1.0)
            most = max(most, hub.links.live)
            assert hub.links.live <= 3
        assert most == 3
        # the three most recently used stay; the others were closed in the order they were last used
        assert hub.links.connected_peers() == ["s3", "s4", "s5"]
        assert hub.links.evictions == 3 and hub.links.idle_closes == 0
        # an inbound connection counts too: s0 writes to the hub, which then closes s3 (now least recent)
        assert spokes[0].links.send_nowait("hub", Ping(seq=9, epoch=1))
        await hub.wait_for(1)
        await trio.sleep(1.0)
        assert hub.links.connected_peers() == ["s0", "s4", "s5"] and hub.inbox == [("s0", Ping(seq=9, epoch=1))]
        # a closed link reopens on its next send, still within the cap
        assert hub.links.send_nowait("s1", Ping(seq=10, epoch=1))
        await spokes[1].wait_for(2)
        await trio.sleep(1.0)
        assert hub.links.live == 3 and "s1" in hub.links.connected_peers()
        nursery.cancel_scope.cancel()


@virtual
async def test_a_node_at_the_cap_asks_only_the_least_recently_used_links_whether_they_are_busy() -> None:
    # At the cap, each new connection closes the least recently used idle link: the links are asked whether they
    # are busy in order of last use until one is not, not each of them (a node of a thousand-node cluster sits at
    # its cap of 512 and adopts a connection at every first contact).
    net = MemoryNetwork(random.Random(6), delay=0.001)
    asked: list[str] = []

    def busy(peer: str) -> bool:
        asked.append(peer)
        return peer == "s00"

    hub = Node(net, "hub", LinkConfig(idle_timeout=0, max_links=20), busy=busy)
    spokes = [Node(net, f"s{i:02d}", LinkConfig(idle_timeout=0, max_links=0)) for i in range(22)]
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.links.run)
        for spoke in spokes:
            await nursery.start(spoke.links.run)
        for i, spoke in enumerate(spokes[:20]):
            assert hub.links.send_nowait(spoke.name, Ping(seq=i, epoch=1), address=spoke.address)
            await spoke.wait_for(1)
            await trio.sleep(1.0)
        assert hub.links.live == 20 and hub.links.evictions == 0
        for i, spoke in enumerate(spokes[20:], 1):
            asked.clear()
            assert hub.links.send_nowait(spoke.name, Ping(seq=20 + i, epoch=1), address=spoke.address)
            await spoke.wait_for(1)
            await trio.sleep(1.0)
            # s00 (least recently used, busy) is spared; the next least recently used closes
            assert hub.links.evictions == i and f"s{i:02d}" not in hub.links.connected_peers()
            assert hub.links.live == 20 and "s00" in hub.links.connected_peers()
            # asked: s00 and the one it closes at the cap, and that one again as its writer closes it
            assert asked.count("s00") == 1 and len(asked) <= 3, asked
        nursery.cancel_scope.cancel()


@virtual
async def test_the_cap_spares_busy_links_and_is_exceeded_until_one_is_idle() -> None:
    net = MemoryNetwork(random.Random(5), delay=0.001)
    busy = {"s0", "s1", "s2"}
    hub = Node(net, "hub", LinkConfig(idle_timeout=0, max_links=2), busy=lambda peer: peer in busy)
    spokes = [Node(net, f"s{i}", LinkConfig(idle_timeout=0, max_links=0)) for i in range(3)]
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.links.run)
        for i, spoke in enumerate(spokes):
            await nursery.start(spoke.links.run)
            assert hub.links.send_nowait(spoke.name, Ping(seq=i, epoch=1), address=spoke.address)
            await spoke.wait_for(1)
        await trio.sleep(1.0)
        assert hub.links.live == 3 and hub.links.evictions == 0
        busy.discard("s1")
        assert hub.links.send_nowait("s2", Ping(seq=5, epoch=1))  # a send does not trigger the cap
        await trio.sleep(1.0)
        assert hub.links.live == 3
        # the next adoption looks again: s1 is no longer busy and closes; s0 and s2 still are
        late = Node(net, "s3", LinkConfig(idle_timeout=0, max_links=0))
        await nursery.start(late.links.run)
        assert late.links.send_nowait("hub", Ping(seq=6, epoch=1), address=hub.address)
        await hub.wait_for(1)
        await trio.sleep(1.0)
        assert hub.links.connected_peers() == ["s0", "s2", "s3"] and hub.links.evictions == 1
        nursery.cancel_scope.cancel()


def test_the_bounds_refuse_negative_values() -> None:
    with pytest.raises(ValueError, match="idle_timeout and max_links must be >= 0"):
        LinkConfig(idle_timeout=-1)
    with pytest.raises(ValueError, match="idle_timeout and max_links must be >= 0"):
        LinkConfig(max_links=-2)
