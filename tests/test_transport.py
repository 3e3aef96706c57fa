"""The transport seam (TCP and the in-memory network with its faults) and the peer links built on it."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from peer.cluster.net.peerlinks import LinkConfig, LinkError, PeerLinks
from peer.cluster.net.memtransport import MemoryNetwork
from peer.cluster.net.transport import (
    TcpTransport,
    Transport,
    TransportError,
    split_address,
)
from protocol import TYPE_CODES, BatchAck, Goodbye, Hello, Message, Ping, Reject, Welcome, encode_frame

SECRET = b"transport test secret, 32 bytes"


def virtual(test):  # type: ignore[no-untyped-def]
    """Run an async test function under a MockClock that jumps whenever every task is blocked."""

    def run() -> None:
        trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))

    run.__name__ = test.__name__
    return run


async def echo(stream: trio.abc.Stream) -> None:
    async with stream:
        try:
            while data := await stream.receive_some(1024):
                await stream.send_all(data.upper())
        except trio.BrokenResourceError:
            pass


async def read_exactly(stream: trio.abc.Stream, size: int) -> bytes:
    data = b""
    for _ in range(size):
        if len(data) >= size:
            break
        chunk = await stream.receive_some(size - len(data))
        assert chunk, "stream ended early"
        data += chunk
    return data


# --- addresses and the seam --------------------------------------------------------------------------------------


def test_split_address_accepts_host_port_and_bracketed_ipv6_only() -> None:
    assert split_address("10.0.0.1:7000") == ("10.0.0.1", 7000)
    assert split_address("[::1]:80") == ("::1", 80)
    assert split_address("node.example:0") == ("node.example", 0)
    for bad in ("nohost", ":80", "host:", "host:99999", "host:x"):
        with pytest.raises(ValueError, match="host:port"):
            split_address(bad)


def test_both_transports_satisfy_the_transport_protocol() -> None:
    assert isinstance(TcpTransport("127.0.0.1:0"), Transport)
    assert isinstance(MemoryNetwork().transport("10.0.0.1:1"), Transport)


# --- TCP ---------------------------------------------------------------------------------------------------------


async def test_tcp_serve_reports_the_bound_port_and_connect_reaches_it() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(TcpTransport("127.0.0.1:0").serve, echo)
            host, port = split_address(address)
            assert host == "127.0.0.1" and port > 0
            stream = await TcpTransport("127.0.0.1:0").connect(address)
            async with stream:
                await stream.send_all(b"hello")
                assert await read_exactly(stream, 5) == b"HELLO"
            nursery.cancel_scope.cancel()


async def test_tcp_connect_to_a_closed_port_is_a_transport_error_naming_the_peer() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    with trio.fail_after(10), pytest.raises(TransportError, match=f"cannot connect to peer 127.0.0.1:{port}"):
        await TcpTransport("127.0.0.1:0").connect(f"127.0.0.1:{port}")


# --- the in-memory network -----------------------------------------------------------------------------------------


@virtual
async def test_memory_streams_carry_bytes_both_ways_and_half_close() -> None:
    net = MemoryNetwork(random.Random(1))
    async with trio.open_nursery() as nursery:
        address = await nursery.start(net.transport("10.0.0.2:7000").serve, echo)
        assert address == "10.0.0.2:7000"
        stream = await net.transport("10.0.0.1:7000").connect(address)
        await stream.send_all(b"abc" * 1000)
        assert await read_exactly(stream, 3000) == b"ABC" * 1000
        await stream.send_eof()
        assert await stream.receive_some(10) == b""  # the echo handler closed after our EOF
        await stream.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await stream.send_all(b"x")
        nursery.cancel_scope.cancel()


@virtual
async def test_memory_delay_is_exact_in_virtual_time_and_jitter_keeps_order() -> None:
    net = MemoryNetwork(random.Random(2), delay=0.25)
    async with trio.open_nursery() as nursery:
        server = await nursery.start(net.transport("10.0.0.2:7000").serve, echo)
        start = trio.current_time()
        stream = await net.transport("10.0.0.1:7000").connect(server)
        assert trio.current_time() - start == pytest.approx(0.25)  # connecting costs one delay
        await stream.send_all(b"ping")
        assert await read_exactly(stream, 4) == b"PING"
        assert trio.current_time() - start == pytest.approx(0.75)  # there and back
        net.delay, net.jitter = 0.0, 1.0
        for i in range(50):
            await stream.send_all(b"%03d" % i)
        got = await read_exactly(stream, 150)
        assert got == b"".join(b"%03d" % i for i in range(50))
        nursery.cancel_scope.cancel()


@virtual
async def test_a_partition_refuses_connections_breaks_open_ones_and_heals() -> None:
    net = MemoryNetwork(random.Random(3))
    a, b, c = (net.transport(f"10.0.0.{i}:7000") for i in (1, 2, 3))
    async with trio.open_nursery() as nursery:
        await nursery.start(b.serve, echo)
        ab = await a.connect("10.0.0.2:7000")
        cb = await c.connect("10.0.0.2:7000")
        net.partition(["10.0.0.1:7000"], ["10.0.0.2:7000"])
        assert net.blocked("10.0.0.2:7000", "10.0.0.1:7000")
        with pytest.raises(trio.BrokenResourceError):
            await ab.receive_some(10)
        with pytest.raises(trio.BrokenResourceError):
            await ab.send_all(b"x")
        with pytest.raises(TransportError, match="unreachable"):
            await a.connect("10.0.0.2:7000")
        await cb.send_all(b"still fine")  # a pair outside the partition is untouched
        assert await read_exactly(cb, 10) == b"STILL FINE"
        net.heal()
        ab = await a.connect("10.0.0.2:7000")
        await ab.send_all(b"back")
        assert await read_exactly(ab, 4) == b"BACK"
        nursery.cancel_scope.cancel()


@virtual
async def test_nothing_listening_is_refused_and_a_stopped_server_resets_its_connections() -> None:
    net = MemoryNetwork(random.Random(4))
    client = net.transport("10.0.0.1:7000")
    with pytest.raises(TransportError, match="refused"):
        await client.connect("10.0.0.9:7000")
    async with trio.open_nursery() as outer:
        with trio.CancelScope() as server_scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(net.transport("10.0.0.2:7000").serve, echo)
                with pytest.raises(TransportError, match="in use"):
                    await net.transport("10.0.0.2:7000").serve(echo)
                stream = await client.connect("10.0.0.2:7000")
                server_scope.cancel()
        with pytest.raises(trio.BrokenResourceError):
            await stream.receive_some(10)
        with pytest.raises(TransportError, match="refused"):
            await client.connect("10.0.0.2:7000")
        outer.cancel_scope.cancel()


@virtual
async def test_breaking_an_address_breaks_its_own_connections_and_the_network_keeps_only_open_ones() -> None:
    net = MemoryNetwork(random.Random(5))
    a, b, c = (net.transport(f"10.0.0.{i}:7000") for i in (1, 2, 3))
    async with trio.open_nursery() as nursery:
        await nursery.start(b.serve, echo)
        await nursery.start(c.serve, echo)
        ab, ac, cb = await a.connect(b.address), await a.connect(c.address), await c.connect(b.address)
        assert len(net._links) == 3 and {len(net._links_of[x.address]) for x in (a, b, c)} == {2}
        assert net.break_links(a.address, c.address) == 1  # a pair: the one connection between them
        assert net.break_links(a.address) == 1  # a's other one
        with pytest.raises(trio.BrokenResourceError):
            await ab.receive_some(10)
        with pytest.raises(trio.BrokenResourceError):
            await ac.receive_some(10)
        await cb.send_all(b"untouched")
        assert await read_exactly(cb, 9) == b"UNTOUCHED"
        assert len(net._links) == 1 and a.address not in net._links_of and len(net._links_of[b.address]) == 1
        await cb.aclose()  # closed at both ends (the echo server closes its side when ours reads the end)
        await trio.sleep(1)
        assert not net._links and not net._links_of
        nursery.cancel_scope.cancel()


def test_random_link_breaks_follow_the_injected_random_source() -> None:
    def sends_before_break(seed: int) -> int:
        async def main() -> int:
            net = MemoryNetwork(random.Random(seed), break_probability=0.05)
            async with trio.open_nursery() as nursery:
                await nursery.start(net.transport("10.0.0.2:7000").serve, echo)
                stream = await net.transport("10.0.0.1:7000").connect("10.0.0.2:7000")
                count = 0
                try:
                    for count in range(1000):
                        await stream.send_all(b"x")
                        await read_exactly(stream, 1)
                except trio.BrokenResourceError:
                    pass
                nursery.cancel_scope.cancel()
                assert net.breaks >= 1
                return count

        return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

    first = [sends_before_break(seed) for seed in (1, 2, 3)]
    assert first == [sends_before_break(seed) for seed in (1, 2, 3)]
    assert all(count < 1000 for count in first) and len(set(first)) > 1


# --- lost and duplicated messages ---------------------------------------------------------------------------------

HANDSHAKE_AND_CLOSING = [TYPE_CODES[cls] for cls in (Hello, Welcome, Reject, Goodbye)]


def frames_sent() -> list[bytes]:
    """A handshake frame, then 200 application frames of different sizes (each body names its index), a
    Reject among them and a Goodbye at the end: what a peer link writes, as raw frames."""
    frames = [encode_frame(TYPE_CODES[Hello], 0, b'{"hello": 1}')]
    for i in range(200):
        code = TYPE_CODES[BatchAck] if i % 2 else TYPE_CODES[Ping]
        frames.append(encode_frame(code, 0, b"%05d:" % i + b"x" * (i * 7 % 300)))
        if i == 100:
            frames.append(encode_frame(TYPE_CODES[Reject], 0, b'{"reason": "test"}'))
    frames.append(encode_frame(TYPE_CODES[Goodbye], 0, b'{"reason": "done"}'))
    return frames


def pieces(data: bytes, rng: random.Random) -> list[bytes]:
    """`data` cut at random points: writes that split frames, and writes that join several."""
    cuts = sorted(rng.sample(range(1, len(data)), 120))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def deliver(writes: list[bytes], *, seed: int, loss: float, duplicate: float) -> tuple[bytes, MemoryNetwork]:
    """Write `writes` one by one on a memory connection with the given faults; everything the far end read."""
    net = MemoryNetwork(random.Random(seed), delay=0.01, jitter=0.05, loss_probability=loss,
                        duplicate_probability=duplicate)
    got = bytearray()

    async def sink(stream: trio.abc.Stream) -> None:
        async with stream:
            while data := await stream.receive_some(4096):
                got.extend(data)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(net.transport("10.0.0.2:7000").serve, sink)
            stream = await net.transport("10.0.0.1:7000").connect("10.0.0.2:7000")
            for data in writes:
                await stream.send_all(data)
            await stream.send_eof()
            await trio.sleep(5)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return bytes(got), net


def frames_in(data: bytes) -> list[bytes]:
    """`data` cut into whole frames (docs/protocol.md section 1); fails if it ends inside one."""
    out = []
    while data:
        size = 4 + int.from_bytes(data[:4], "big")
        assert len(data) >= size, "the stream ended inside a frame"
        out.append(data[:size])
        data = data[size:]
    return out


@pytest.mark.parametrize("split", [False, True])
def test_lost_and_duplicated_frames_go_whole_in_order_sparing_handshake_reject_goodbye(split: bool) -> None:
    sent = frames_sent()
    stream = b"".join(sent)
    # Joined: all frames in one write. Split: 121 writes cut anywhere, most of them through a frame.
    writes = pieces(stream, random.Random(11)) if split else [stream]
    data, net = deliver(writes, seed=3, loss=0.2, duplicate=0.2)
    got = frames_in(data)
    # Every frame arrived whole, in order, each sent frame 0, 1 or 2 times in a row.
    index = 0
    counts = []
    for frame in sent:
        n = 0
        while index < len(got) and got[index] == frame:
            n += 1
            index += 1
        counts.append(n)
    assert index == len(got), "a frame arrived that was never sent, or out of order"
    assert all(n <= 2 for n in counts)
    untouched = [n for frame, n in zip(sent, counts) if frame[4] in HANDSHAKE_AND_CLOSING]
    assert untouched == [1, 1, 1]  # Hello, Reject, Goodbye: exactly once
    assert counts.count(0) == net.lost > 10
    assert counts.count(2) == net.duplicated > 10
    assert len(got) == len(sent) - net.lost + net.duplicated


def test_a_seeded_run_loses_and_duplicates_the_same_frames() -> None:
    writes = pieces(b"".join(frames_sent()), random.Random(12))
    first, net1 = deliver(writes, seed=4, loss=0.1, duplicate=0.1)
    again, net2 = deliver(writes, seed=4, loss=0.1, duplicate=0.1)
    other, _ = deliver(writes, seed=5, loss=0.1, duplicate=0.1)
    assert first == again and (net1.lost, net1.duplicated) == (net2.lost, net2.duplicated)
    assert other != first


def test_without_message_faults_bytes_pass_untouched_framed_or_not() -> None:
    framed = b"".join(frames_sent())
    writes = pieces(framed, random.Random(13))
    data, net = deliver(writes, seed=6, loss=0.0, duplicate=0.0)
    assert data == framed and net.lost == net.duplicated == 0
    garbage = [b"\x00\x00\x00", b"\x01abc", b"\xff" * 1000]  # a length of 1, then anything
    assert deliver(garbage, seed=6, loss=0.0, duplicate=0.0)[0] == b"".join(garbage)


def test_a_stream_that_is_not_peer_frames_passes_untouched_even_with_message_faults() -> None:
    # A length below 2 or above the frame limit is not a peer frame: the pipe stops cutting, and the reader
    # sees the bytes as written (and rejects them itself, as it would on a real connection).
    for junk in ([b"\x00\x00\x00\x01zzz", b"more"], [b"\xff\xff\xff\xff" + b"y" * 5000]):
        data, net = deliver(junk, seed=7, loss=0.5, duplicate=0.5)
        assert data == b"".join(junk) and net.lost == net.duplicated == 0
    # Frames first, then junk: the frames are cut (and faulted), the junk passes as written.
    frames = b"".join(frames_sent()[:50])
    data, net = deliver([frames, b"\x00\x00\x00\x00tail"], seed=7, loss=0.3, duplicate=0.0)
    assert data.endswith(b"\x00\x00\x00\x00tail") and net.lost > 0
    assert len(frames_in(data[: -8])) == 50 - net.lost


# --- peer links ------------------------------------------------------------------------------------------------


class Node:
    def __init__(self, net: MemoryNetwork, name: str, address: str, *, secret: bytes = SECRET,
                 config: LinkConfig | None = None, transport: Transport | None = None) -> None:
        self.inbox: list[tuple[str, Message]] = []
        self.arrived = trio.Event()
        self.links = PeerLinks(node_id=name, secret=secret, transport=transport or net.transport(address),
                               on_message=self.receive, rng=random.Random(name), config=config,
                               nonce=random.Random(address).randbytes)

    async def receive(self, peer_id: str, message: Message) -> None:
        self.inbox.append((peer_id, message))
        self.arrived.set()
        self.arrived = trio.Event()

    async def wait_for(self, count: int, limit: float = 30.0) -> None:
        with trio.fail_after(limit):
            while len(self.inbox) < count:
                await self.arrived.wait()


class CountingTransport:
    """Records when each connection attempt was made."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.attempts: list[float] = []

    async def connect(self, address: str) -> trio.abc.Stream:
        self.attempts.append(trio.current_time())
        return await self.inner.connect(address)

    async def serve(self, handler, *, task_status=trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        await self.inner.serve(handler, task_status=task_status)


@virtual
async def test_links_deliver_messages_both_ways_in_order_over_one_connection() -> None:
    net = MemoryNetwork(random.Random(5), delay=0.01)
    a, b = Node(net, "a", "10.0.0.1:7000"), Node(net, "b", "10.0.0.2:7000")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        await nursery.start(b.links.run)
        for seq in range(100):
            assert a.links.send_nowait("b", Ping(seq=seq, epoch=1), address="10.0.0.2:7000")
        await b.wait_for(100)
        assert b.inbox == [("a", Ping(seq=seq, epoch=1)) for seq in range(100)]
        b.links.send_nowait("a", Ping(seq=7, epoch=2))  # b learned of a from the inbound connection
        await a.wait_for(1)
        assert a.inbox == [("b", Ping(seq=7, epoch=2))]
        assert net.connects == 1
        assert a.links.connected_peers() == ["b"] and b.links.connected_peers() == ["a"]
        nursery.cancel_scope.cancel()


@virtual
async def test_a_wrong_secret_is_refused_by_the_handshake_and_delivers_nothing() -> None:
    net = MemoryNetwork(random.Random(6))
    a = Node(net, "a", "10.0.0.1:7000")
    b = Node(net, "b", "10.0.0.2:7000", secret=b"some other secret of 32 bytes!!")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        await nursery.start(b.links.run)
        with pytest.raises(LinkError, match="refused the connection|handshake failed"):
            await b.links.introduce("10.0.0.1:7000")
        b.links.send_nowait("a", Ping(seq=1, epoch=1), address="10.0.0.1:7000")
        await trio.sleep(5)
        assert a.inbox == [] and a.links.connected_peers() == []
        assert a.links.handshake_failures >= 2 and b.links.handshake_failures >= 2
        nursery.cancel_scope.cancel()
    with pytest.raises(ValueError, match="at least 16 bytes"):
        Node(net, "c", "10.0.0.3:7000", secret=b"short")


@virtual
async def test_redial_backs_off_exponentially_with_jitter_and_keeps_the_queue() -> None:
    net = MemoryNetwork(random.Random(7))
    config = LinkConfig(backoff_initial=0.1, backoff_max=2.0)
    counting = CountingTransport(net.transport("10.0.0.1:7000"))
    a = Node(net, "a", "10.0.0.1:7000", config=config, transport=counting)
    b = Node(net, "b", "10.0.0.2:7000")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        start = trio.current_time()
        a.links.send_nowait("b", Ping(seq=1, epoch=1), address="10.0.0.2:7000")  # b is not up yet
        await trio.sleep(12)
        gaps = [later - earlier for earlier, later in zip(counting.attempts, counting.attempts[1:])]
        for attempt, gap in enumerate(gaps[:4], start=1):
            base = min(2.0, 0.1 * 2 ** (attempt - 1))
            assert 0.5 * base <= gap <= base + 1e-9
        assert all(0.99 <= gap <= 2.0 + 1e-9 for gap in gaps[5:])  # capped at backoff_max, jitter 50-100%
        assert len(set(gaps)) == len(gaps)  # jittered, never in lockstep
        await nursery.start(b.links.run)
        await b.wait_for(1)
        assert b.inbox == [("a", Ping(seq=1, epoch=1))]
        assert trio.current_time() - start <= 12 + 2.0 + 0.01
        nursery.cancel_scope.cancel()


@virtual
async def test_a_broken_link_reconnects_and_later_messages_arrive() -> None:
    net = MemoryNetwork(random.Random(8))
    a, b = Node(net, "a", "10.0.0.1:7000"), Node(net, "b", "10.0.0.2:7000")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        await nursery.start(b.links.run)
        a.links.send_nowait("b", Ping(seq=1, epoch=1), address="10.0.0.2:7000")
        await b.wait_for(1)
        assert net.break_links("10.0.0.1:7000") == 1
        await trio.sleep(1)
        assert a.links.get("b").connected
        a.links.send_nowait("b", Ping(seq=2, epoch=1))
        await b.wait_for(2)
        assert a.links.get("b").connects == 2
        nursery.cancel_scope.cancel()


@virtual
async def test_messages_a_failed_write_took_from_the_queue_go_on_the_next_connection() -> None:
    """A connection that breaks as it writes (or ends after a Goodbye) hands the messages it had taken from the
    queue to the next connection: nothing is lost on a link that keeps coming back."""
    net = MemoryNetwork(random.Random(9), break_probability=0.3)
    a, b = Node(net, "a", "10.0.0.1:7000"), Node(net, "b", "10.0.0.2:7000")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        await nursery.start(b.links.run)
        for seq in range(60):
            assert a.links.send_nowait("b", Ping(seq=seq, epoch=1), address="10.0.0.2:7000")
            await trio.sleep(0.05)
        await trio.sleep(5)
        net.break_probability = 0.0
        with trio.fail_after(30):
            while {m.seq for _, m in b.inbox} != set(range(60)):
                await b.arrived.wait()
        assert net.breaks > 5 and net.connects > 5  # the faults were real
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", range(6))
def test_simultaneous_dials_keep_exactly_the_link_dialled_by_the_lower_id(seed: int) -> None:
    async def main() -> None:
        net = MemoryNetwork(random.Random(seed), delay=0.01, jitter=0.02)
        a, b = Node(net, "alpha", "10.0.0.1:7000"), Node(net, "beta", "10.0.0.2:7000")
        async with trio.open_nursery() as nursery:
            await nursery.start(a.links.run)
            await nursery.start(b.links.run)
            for seq in range(3):
                a.links.send_nowait("beta", Ping(seq=seq, epoch=0), address="10.0.0.2:7000")
                b.links.send_nowait("alpha", Ping(seq=seq, epoch=0), address="10.0.0.1:7000")
            await a.wait_for(3)
            await b.wait_for(3)
            await trio.sleep(5)
            assert a.links.get("beta").dialer == b.links.get("alpha").dialer == "alpha"
            assert sorted(m.seq for _, m in a.inbox) == [0, 1, 2]  # the duplicate's messages were not lost
            assert sorted(m.seq for _, m in b.inbox) == [0, 1, 2]
            a.links.send_nowait("beta", Ping(seq=9, epoch=0))
            await b.wait_for(4)
            assert len(net._links) == 1  # one live connection between the pair
            assert net.connects == 2  # both did dial
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@virtual
async def test_the_send_queue_is_bounded() -> None:
    net = MemoryNetwork(random.Random(9))
    a = Node(net, "a", "10.0.0.1:7000", config=LinkConfig(queue_size=4))
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        results = [a.links.send_nowait("b", Ping(seq=i, epoch=0), address="10.0.0.2:7000") for i in range(6)]
        assert results == [True] * 4 + [False] * 2
        assert a.links.get("b").dropped == 2
        with trio.move_on_after(1) as waited:
            await a.links.send("b", Ping(seq=9, epoch=0))  # back-pressure: waits for room that never comes
        assert waited.cancelled_caught
        nursery.cancel_scope.cancel()


@virtual
async def test_forget_flushes_the_queue_says_goodbye_and_stops_dialing() -> None:
    net = MemoryNetwork(random.Random(10), delay=0.01)
    a, b = Node(net, "a", "10.0.0.1:7000"), Node(net, "b", "10.0.0.2:7000")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.links.run)
        await nursery.start(b.links.run)
        a.links.send_nowait("b", Ping(seq=1, epoch=0), address="10.0.0.2:7000")
        await b.wait_for(1)
        for seq in range(2, 6):
            a.links.send_nowait("b", Ping(seq=seq, epoch=0))
        a.links.forget("b", "leaving")
        await b.wait_for(5)
        await trio.sleep(2)
        assert [m.seq for _, m in b.inbox] == [1, 2, 3, 4, 5]
        assert b.links.connected_peers() == [] and len(net._links) == 0
        connects = net.connects
        await trio.sleep(10)
        assert net.connects == connects  # nobody redials a forgotten link that said Goodbye
        nursery.cancel_scope.cancel()
