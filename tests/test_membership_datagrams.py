"""Probes as datagrams (protocol version 5): the pure codec, the in-memory network's datagrams, membership that
probes without links (and falls back to links for a peer that takes no datagrams), and real nodes over UDP and
TCP on loopback."""

from __future__ import annotations

import random
import socket

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from peer.cluster.membership.membership import Membership, MembershipConfig
from peer.cluster.net.peerlinks import LinkConfig, PeerLinks
from peer.cluster.net.memtransport import MemoryNetwork
from peer.cluster.net.transport import DatagramTransport, TcpTransport, split_address
from protocol import (
    MAX_DATAGRAM,
    BatchAck,
    Gossip,
    Limits,
    LocalProtocolError,
    Member,
    Ping,
    Pong,
    ProbeReply,
    ProbeRequest,
    RemoteProtocolError,
    datagram_key,
    decode_datagram,
    encode_datagram,
)
from ring import MemberState, View

SECRET = b"datagram test secret, 32 bytes!"
KEY = datagram_key(SECRET)
LIMITS = Limits()
MESSAGES = [Ping(seq=1, epoch=7), Pong(seq=2**40, epoch=0), ProbeRequest(seq=3, target="node-é"),
            ProbeReply(seq=4, target="node-2", alive=True), ProbeReply(seq=5, target="n", alive=False)]


# --- the pure codec --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("message", MESSAGES)
def test_each_probe_message_round_trips_between_the_two_named_nodes(message: object) -> None:
    data = encode_datagram(message, key=KEY, sender="node-1", recipient="node-2", limits=LIMITS)
    assert data[:3] == b"PD\x05" and len(data) <= 60
    assert decode_datagram(data, key=KEY, recipient="node-2", limits=LIMITS) == ("node-1", message)


def test_a_datagram_is_refused_by_another_node_another_cluster_and_after_any_change() -> None:
    data = encode_datagram(Ping(seq=9, epoch=3), key=KEY, sender="node-1", recipient="node-2", limits=LIMITS)
    with pytest.raises(RemoteProtocolError, match="wrong tag"):
        decode_datagram(data, key=KEY, recipient="node-3", limits=LIMITS)  # replayed to another node
    with pytest.raises(RemoteProtocolError, match="wrong tag"):
        decode_datagram(data, key=datagram_key(b"another cluster's secret, 32 b!"), recipient="node-2", limits=LIMITS)
    for index in range(len(data)):
        for bit in (0x01, 0x80):
            altered = bytearray(data)
            altered[index] ^= bit
            with pytest.raises(RemoteProtocolError):
                decode_datagram(bytes(altered), key=KEY, recipient="node-2", limits=LIMITS)
    for size in range(len(data)):
        with pytest.raises(RemoteProtocolError):
            decode_datagram(data[:size], key=KEY, recipient="node-2", limits=LIMITS)
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        decode_datagram(data + bytes(MAX_DATAGRAM), key=KEY, recipient="node-2", limits=LIMITS)


def test_only_membership_messages_and_only_small_ones_may_be_sent_as_datagrams() -> None:
    with pytest.raises(LocalProtocolError, match="BatchAck does not travel as a datagram"):
        encode_datagram(BatchAck(seq=1, new=1, seen=0, forwarded=0, epoch=2), key=KEY, sender="a", recipient="b", limits=LIMITS)
    record = Member(node_id="node-0001", address="10.0.0.1:7000", weight=100, incarnation=3, state="alive", zone="z")
    assert encode_datagram(Gossip(epoch=9, full=False, members=(record,) * 20), key=KEY, sender="a", recipient="b",
                           limits=LIMITS)
    with pytest.raises(LocalProtocolError, match="over 1200"):  # a full view of many members keeps its link
        encode_datagram(Gossip(epoch=9, full=True, members=(record,) * 40), key=KEY, sender="a", recipient="b",
                        limits=LIMITS)
    with pytest.raises(LocalProtocolError, match="over 1200"):
        encode_datagram(ProbeRequest(seq=1, target="t" * 1000), key=KEY, sender="a" * 200, recipient="b",
                        limits=LIMITS)
    with pytest.raises(LocalProtocolError, match="sender id must be 1-255 bytes"):
        encode_datagram(Ping(seq=1, epoch=1), key=KEY, sender="a" * 256, recipient="b", limits=LIMITS)


@given(st.binary(max_size=1300))
def test_any_bytes_either_decode_or_are_refused_as_the_peers_fault(data: bytes) -> None:
    try:
        sender, message = decode_datagram(data, key=KEY, recipient="node-2", limits=LIMITS)
    except RemoteProtocolError:
        return
    assert isinstance(message, (Ping, Pong, ProbeRequest, ProbeReply, Gossip)) and sender


# --- the in-memory network ---------------------------------------------------------------------------------------


def test_memory_datagrams_arrive_after_the_delay_and_are_lost_across_a_partition_or_to_loss() -> None:
    async def main() -> None:
        net = MemoryNetwork(random.Random(1), delay=0.25)
        got: list[tuple[float, bytes, str]] = []

        async def handler(data: bytes, source: str) -> None:
            got.append((trio.current_time(), data, source))

        a, b = net.transport("10.0.0.1:7000"), net.transport("10.0.0.2:7000")
        assert isinstance(a, DatagramTransport) and a.datagrams
        async with trio.open_nursery() as nursery:
            await nursery.start(b.serve_datagrams, handler)
            assert a.send_datagram("10.0.0.2:7000", b"one")
            await trio.sleep(1)
            assert got == [(0.25, b"one", "10.0.0.1:7000")]
            net.block("10.0.0.1:7000", "10.0.0.2:7000")
            a.send_datagram("10.0.0.2:7000", b"cut off")
            a.send_datagram("10.0.0.9:7000", b"nobody there")
            net.heal()
            net.loss_probability = 1.0
            a.send_datagram("10.0.0.2:7000", b"lost")
            await trio.sleep(1)
            assert len(got) == 1 and net.datagrams == 4 and net.datagrams_lost == 3
            assert net.sent_bytes["10.0.0.1:7000"] == len(b"one" b"cut off" b"nobody there" b"lost")
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# --- membership over datagrams, simulated -----------------------------------------------------------------------

# No periodic full-view sync in the windows these tests watch: what remains is probing alone.
QUIET = MembershipConfig(sync_interval=10_000.0, reconnect_interval=10_000.0)


def _converged_cluster(net: MemoryNetwork, count: int, links: dict[int, LinkConfig]) -> list[Membership]:
    addresses = [f"10.0.0.{index + 1}:7000" for index in range(count)]
    whole = View()
    for index, address in enumerate(addresses):
        whole = whole.join(f"node-{index}", address, 10)
    return [Membership(node_id=f"node-{index}", weight=10, secret=SECRET, transport=net.transport(address),
                       rng=random.Random(index), config=QUIET, nonce=random.Random(index).randbytes,
                       link_config=links.get(index, LinkConfig(idle_timeout=2.0)), members=whole)
            for index, address in enumerate(addresses)]


async def _start(nursery: trio.Nursery, node: Membership) -> trio.CancelScope:
    """Run `node` under a cancel scope of its own (cancel it to kill the node)."""

    async def host(task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as inner:
                await inner.start(node.run)
                task_status.started(scope)

    return await nursery.start(host)


def _connects(node: Membership) -> int:
    return sum(link.connects for link in node.links._links.values())


def test_a_converged_cluster_probes_by_datagram_and_opens_no_link() -> None:
    async def main() -> None:
        net = MemoryNetwork(random.Random(2), delay=0.001, jitter=0.001)
        nodes = _converged_cluster(net, 12, {})
        suspected: list[str] = []
        async with trio.open_nursery() as nursery:
            scopes = [await _start(nursery, node) for node in nodes]
            for node in nodes:
                node.subscribe(lambda view: suspected.extend(
                    m.node_id for m in view.members if m.state is not MemberState.ALIVE))
            # The first seconds open links: the records every node starts with are gossiped a few rounds, and a
            # Ping sent before its target started listening went over the link too.
            await trio.sleep(5)
            connects = net.connects
            await trio.sleep(30)  # 30 probe rounds: every node probed every other one about three times
            assert net.connects == connects  # not one link more: every probe and answer was a datagram
            assert all(node.links.datagrams_sent >= 30 and node.links.datagrams_received >= 30 for node in nodes)
            assert all(set(node.links.datagram_peers) == {n.node_id for n in nodes} - {node.node_id}
                       and all(node.links.datagram_peers.values()) for node in nodes)
            assert suspected == []
            # A death is still found and agreed: probes and indirect probes of the victim go unanswered.
            scopes[5].cancel()
            await trio.sleep(15)
            assert all(node.view.member("node-5").state is MemberState.DEAD for node in nodes if node is not nodes[5])
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_peer_that_takes_no_datagrams_is_probed_over_its_link_and_never_suspected() -> None:
    async def main() -> None:
        net = MemoryNetwork(random.Random(3), delay=0.001, jitter=0.001)
        # node-0 stands for a node of version 4 (or with UDP blocked): no datagrams either way.
        nodes = _converged_cluster(net, 6, {0: LinkConfig(idle_timeout=2.0, datagrams=False)})
        changes: list[tuple[str, MemberState]] = []
        async with trio.open_nursery() as nursery:
            for node in nodes:
                await _start(nursery, node)
                node.subscribe(lambda view: changes.extend(
                    (m.node_id, m.state) for m in view.members if m.state is not MemberState.ALIVE))
            await trio.sleep(40)
            assert not nodes[0].links.datagrams and nodes[0].links.datagrams_sent == 0
            assert changes == []  # nobody suspected node-0, nor anyone node-0 probed over links
            for node in nodes[1:]:
                assert "node-0" not in node.links.datagram_peers or node.links.datagram_peers["node-0"] is False
                assert node.links.get("node-0") is not None and node.links.get("node-0").sent > 0
            assert all(nodes[1].links.datagram_peers.get(n.node_id) is True for n in nodes[2:])
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# --- real nodes: UDP and TCP on loopback --------------------------------------------------------------------------


@pytest.mark.slow  # a whole crawl, a child process or real nodes: seconds
async def test_real_nodes_probe_over_udp_with_links_closed_and_a_forged_datagram_is_refused() -> None:
    fast = MembershipConfig(probe_interval=0.1, probe_timeout=0.05, suspicion_timeout=0.6, gossip_interval=0.05,
                            sync_interval=10_000.0, reconnect_interval=10_000.0)

    def make(index: int) -> Membership:
        return Membership(node_id=f"udp-{index}", weight=5, secret=SECRET, transport=TcpTransport("127.0.0.1:0"),
                          rng=random.Random(index), config=fast, link_config=LinkConfig(idle_timeout=0.3))

    nodes = [make(index) for index in range(3)]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            scopes = [await _start(nursery, node) for node in nodes]
            assert all(node.links.datagrams for node in nodes)
            await nodes[1].join(nodes[0].address)
            await nodes[2].join(nodes[0].address)
            for _ in range(300):
                if all(len(n.view.members) == 3 and not n.links.connected_peers() for n in nodes):
                    break
                await trio.sleep(0.02)
            assert all(len(n.view.members) == 3 for n in nodes)
            assert not any(n.links.connected_peers() for n in nodes)  # every link closed for idleness
            connects = [_connects(n) for n in nodes]
            received = [n.links.datagrams_received for n in nodes]
            await trio.sleep(1.0)  # ten probe rounds over UDP alone
            assert [_connects(n) for n in nodes] == connects
            assert all(n.links.datagrams_received - before >= 10 for n, before in zip(nodes, received))
            assert all(m.state is MemberState.ALIVE for n in nodes for m in n.view.members)
            # A datagram forged without the secret, sent to node 0's UDP port: refused and counted, nothing else.
            host, port = split_address(nodes[0].address)
            forged = encode_datagram(Pong(seq=1, epoch=1), key=datagram_key(b"not the cluster secret at all!!"),
                                     sender="udp-1", recipient="udp-0", limits=LIMITS)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
                raw.sendto(forged, (host, port))
                raw.sendto(b"not a datagram at all", (host, port))
            for _ in range(100):
                if nodes[0].links.datagrams_refused >= 2:
                    break
                await trio.sleep(0.01)
            assert nodes[0].links.datagrams_refused == 2
            # A node that dies is found over UDP and agreed dead by the others.
            scopes[2].cancel()
            for _ in range(300):
                if all(n.view.member("udp-2").state is MemberState.DEAD for n in nodes[:2]):
                    break
                await trio.sleep(0.02)
            assert all(n.view.member("udp-2").state is MemberState.DEAD for n in nodes[:2])
            nursery.cancel_scope.cancel()


def test_the_worked_example_of_docs_protocol_md() -> None:
    key = datagram_key(b"correct horse battery staple 123")
    assert key.hex() == "aa42311c8a40fdf91f56ea560438a71c475791c6bec2f950d97d09e257efa099"
    data = encode_datagram(Ping(seq=1, epoch=2), key=key, sender="a.example:7070", recipient="b.example:7070",
                           limits=LIMITS)
    assert data.hex() == ("504405210e612e6578616d706c653a37303730920102" "5db8b9c015b99786c31482bd0f7368c5")


async def test_tcp_transport_sends_datagrams_to_a_name_and_to_an_address_over_loopback() -> None:
    receiver, sender = TcpTransport("127.0.0.1:0"), TcpTransport("127.0.0.1:0")
    got: list[tuple[bytes, str]] = []

    async def handler(data: bytes, source: str) -> None:
        got.append((data, source))

    async def accept(stream: trio.abc.Stream) -> None:
        await stream.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(receiver.serve, accept)
            await nursery.start(receiver.serve_datagrams, handler)
            sender_address = await nursery.start(sender.serve, accept)
            await nursery.start(sender.serve_datagrams, handler)
            port = split_address(address)[1]
            assert sender.send_datagram(address, b"by address")
            assert sender.send_datagram(f"localhost:{port}", b"by name")
            while len(got) < 2:
                await trio.sleep(0.01)
            # both came from the sender's own port: the UDP socket is bound where its TCP listener is
            assert sorted(got) == [(b"by address", sender_address), (b"by name", sender_address)]
            nursery.cancel_scope.cancel()


def test_a_link_that_agrees_on_version_4_marks_its_peer_as_taking_no_datagrams() -> None:
    async def main() -> None:
        net = MemoryNetwork(random.Random(4), delay=0.001)
        got: list[tuple[str, object]] = []

        async def on_message(peer_id: str, message: object) -> None:
            got.append((peer_id, message))

        new = PeerLinks(node_id="new", secret=SECRET, transport=net.transport("10.0.0.1:7000"), on_message=on_message,
                        on_datagram=on_message, rng=random.Random(1))
        old = PeerLinks(node_id="old", secret=SECRET, transport=net.transport("10.0.0.2:7000"), on_message=on_message,
                        rng=random.Random(2), versions=(2, 3, 4))  # a node of version 4: no datagrams
        async with trio.open_nursery() as nursery:
            await nursery.start(new.run)
            await nursery.start(old.run)
            assert new.datagrams and not old.datagrams and new.datagram_peers == {}
            new.send_nowait("old", Ping(seq=1, epoch=1), address="10.0.0.2:7000")
            await trio.sleep(1)
            assert got == [("new", Ping(seq=1, epoch=1))]
            assert new.datagram_peers == {"old": False}  # from now on the membership probes it over this link
            assert new.send_datagram("old", Pong(seq=1, epoch=1), address="10.0.0.2:7000")  # sent, and lost
            await trio.sleep(1)
            assert got == [("new", Ping(seq=1, epoch=1))] and net.datagrams_lost == 1
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
