"""The documented driving loop, run for real over trio memory streams: what the peer layer will do."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from protocol import (
    PROTOCOL_VERSION,
    NEED_DATA,
    BatchAck,
    Connection,
    ConnectionClosed,
    Established,
    Event,
    Goodbye,
    Reject,
    RemoteProtocolError,
    Role,
    UrlBatch,
    UrlEntry,
)

SECRET = b"cluster secret, 32 bytes long!!!"


async def next_event(conn: Connection, stream: trio.abc.Stream) -> Event:
    """docs/protocol.md section 7: flush what the connection made, read only when it needs data."""
    for _ in range(1000):
        try:
            event = conn.next_event()
        finally:
            if out := conn.data_to_send():
                await stream.send_all(out)
        if event is not NEED_DATA:
            return event
        conn.receive_data(await stream.receive_some(65536))
    raise AssertionError("no event after 1000 reads")


async def test_two_peers_handshake_and_exchange_a_batch_over_a_stream() -> None:
    left, right = trio.testing.memory_stream_pair()
    batch = UrlBatch(
        seq=1,
        sender="a",
        epoch=2,
        urls=tuple(UrlEntry(url=f"https://h{i}.example/p", depth=1, found_on=None, hops=0) for i in range(50)),
    )
    seen: dict[str, list[object]] = {"a": [], "b": []}

    async def initiator() -> None:
        conn = Connection(Role.INITIATOR, node_id="a", secret=SECRET, nonce=os.urandom, compressions=("zlib",))
        await left.send_all(conn.initiate())
        seen["a"].append(await next_event(conn, left))
        await left.send_all(conn.send(batch))
        seen["a"].append(await next_event(conn, left))
        await left.send_all(conn.send(Goodbye(reason="done")))
        seen["a"].append(await next_event(conn, left))
        await left.send_eof()

    async def responder() -> None:
        conn = Connection(Role.RESPONDER, node_id="b", secret=SECRET, nonce=os.urandom, compressions=("zlib", "none"))
        seen["b"].append(await next_event(conn, right))
        received = await next_event(conn, right)
        seen["b"].append(received)
        assert isinstance(received, UrlBatch)
        await right.send_all(conn.send(BatchAck(seq=received.seq, new=50, seen=0, forwarded=0, epoch=2)))
        seen["b"].append(await next_event(conn, right))
        await right.send_all(conn.send(Goodbye(reason="bye")))
        seen["b"].append(await next_event(conn, right))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(initiator)
            nursery.start_soon(responder)
    assert seen["a"] == [
        Established(node_id="b", version=PROTOCOL_VERSION, codec="msgpack", compression="zlib"),
        BatchAck(seq=1, new=50, seen=0, forwarded=0, epoch=2),
        Goodbye(reason="bye"),
    ]
    assert seen["b"] == [
        Established(node_id="a", version=PROTOCOL_VERSION, codec="msgpack", compression="zlib"),
        batch,
        Goodbye(reason="done"),
        ConnectionClosed(clean=True),
    ]


async def test_a_wrong_secret_ends_both_sides_with_a_reason() -> None:
    left, right = trio.testing.memory_stream_pair()
    outcome: dict[str, object] = {}

    async def initiator() -> None:
        conn = Connection(Role.INITIATOR, node_id="a", secret=b"x" * 16, nonce=os.urandom)
        await left.send_all(conn.initiate())
        with pytest.raises(RemoteProtocolError) as info:
            await next_event(conn, left)
        outcome["a"] = str(info.value)
        await left.aclose()

    async def responder() -> None:
        conn = Connection(Role.RESPONDER, node_id="b", secret=SECRET, nonce=os.urandom)
        outcome["b"] = await next_event(conn, right)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(initiator)
            nursery.start_soon(responder)
    assert outcome["a"] == "peer 'b' failed to prove the cluster secret"
    assert outcome["b"] == Reject(reason="a refused the connection: peer 'b' failed to prove the cluster secret")
