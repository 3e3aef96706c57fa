"""What the peer links count of what they write, by kind (`PeerLinks.sent_kinds`, `sent_kind_bytes`): every byte
a node writes to the network falls in one kind, a new connection's handshake in "handshake", a datagram under its
message type with " (datagram)"; and what each connection a node dialled was opened for (`dialled_for`: the
kind of the first message written on it). In-memory network, MockClock."""

from __future__ import annotations

import random

import trio
import trio.testing

from peer.cluster.net.memtransport import MemoryNetwork
from peer.cluster.net.peerlinks import LinkConfig, PeerLinks
from protocol import Message, Ping, Pong

SECRET = b"peer link kinds test secret, 32b"


def test_every_byte_a_node_writes_is_counted_under_one_kind() -> None:
    async def main() -> None:
        net = MemoryNetwork(random.Random(7), delay=0.001)
        got: list[tuple[str, Message]] = []

        async def on_message(peer_id: str, message: Message) -> None:
            got.append((peer_id, message))

        config = LinkConfig(idle_timeout=5.0, max_links=0)
        a, b = (PeerLinks(node_id=name, secret=SECRET, transport=net.transport(f"{name}:7000"), on_message=on_message,
                          on_datagram=on_message, rng=random.Random(name), config=config,
                          nonce=random.Random(name).randbytes, address_of=lambda peer: f"{peer}:7000")
                for name in ("a", "b"))
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await nursery.start(b.run)
            for seq in range(3):
                assert a.send_nowait("b", Ping(seq=seq, epoch=1))
            await trio.sleep(1.0)  # the link is up: b answers on it
            assert b.send_nowait("a", Pong(seq=0, epoch=1))
            assert a.send_datagram("b", Ping(seq=9, epoch=1))
            await trio.sleep(1.0)
            assert len(got) == 5
            # one connection (a dialled): a's Hello and Welcome (its answer to the challenge), b's Challenge
            assert net.connects == 1
            assert a.sent_kinds == {"handshake": 2, "Ping": 3, "Ping (datagram)": 1}
            assert b.sent_kinds == {"handshake": 1, "Pong": 1}
            assert a.dialled_for == {"Ping": 1} and not b.dialled_for  # what the one connection was opened for
            for links in (a, b):
                assert sum(links.sent_kind_bytes.values()) == net.sent_bytes[f"{links.node_id}:7000"]
                assert set(links.sent_kind_bytes) == set(links.sent_kinds)
                assert all(links.sent_kind_bytes[kind] > 0 for kind in links.sent_kinds)
            await trio.sleep(10.0)  # idle past the timeout: the link closes with a Goodbye each way
            assert a.connected_peers() == [] and b.connected_peers() == []
            assert a.sent_kinds["Goodbye"] == b.sent_kinds["Goodbye"] == 1
            assert b.send_nowait("a", Pong(seq=1, epoch=1))  # b dials this time
            await trio.sleep(1.0)
            assert net.connects == 2 and b.dialled_for == {"Pong": 1} and a.dialled_for == {"Ping": 1}
            for links in (a, b):
                assert sum(links.sent_kind_bytes.values()) == net.sent_bytes[f"{links.node_id}:7000"]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
