"""A UDP proxy that holds every datagram for a fixed delay each way: network latency on a kernel without netem.

The DNS study measured resolvers against real name servers 10-100 ms away; on loopback an answer takes
microseconds, which hides everything a cache or asynchrony saves. This proxy sits in front of the local DNS
server and delays each datagram by ``--delay`` seconds on the way out and again on the way back, keeping any
number in flight (a FIFO per direction: with one constant delay, arrival order is due order, so one sender
task per direction suffices and no task is spawned per datagram).

Clients talk to one socket; the proxy talks to the server from one other socket and tells answers apart by
rewriting the 16-bit DNS message id to one of its own, restoring the client's id on the way back. A mapping
not answered within ``--forget`` seconds is dropped (the client has retransmitted or given up).

Run as its own process so the client's CPU is measured alone::

    python -m tests.bench._delay_proxy --upstream 127.0.0.1:5353 --delay 0.02

It prints ``listening 127.0.0.1:PORT`` when ready and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import collections
import functools
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["DelayProxy", "main", "serve_delay_proxy"]

_MAX_DATAGRAM = 65535
_Address = tuple[Any, ...]  # a socket address as recvfrom gives it
_QUEUE_LIMIT = 100_000  # datagrams held per direction; beyond this they are dropped, as a full link would


class DelayProxy:
    """The proxy's state: id mappings and counters. ``address`` is where clients send."""

    def __init__(self, address: tuple[str, int], upstream: tuple[str, int], delay: float, forget: float) -> None:
        self.address = address
        self.upstream = upstream
        self.delay = delay
        self.forget = forget
        self.forwarded = 0
        self.answered = 0
        self.dropped = 0
        self._next_id = 0
        # proxy id -> (client address, client id bytes, time sent), oldest first
        self._pending: collections.OrderedDict[int, tuple[_Address, bytes, float]] = collections.OrderedDict()

    def outbound(self, data: bytes, client: _Address, now: float) -> bytes | None:
        """The datagram to send upstream for ``data`` from ``client``, with an id of ours; None to drop it."""
        if len(data) < 12:
            self.dropped += 1
            return None  # not a DNS message: no id to rewrite
        self._expire(now)
        if len(self._pending) >= 65536:
            self.dropped += 1
            return None  # every id is in use
        proxy_id = self._next_id
        while proxy_id in self._pending:
            proxy_id = (proxy_id + 1) & 0xFFFF
        self._next_id = (proxy_id + 1) & 0xFFFF
        self._pending[proxy_id] = (client, data[:2], now)
        self.forwarded += 1
        return proxy_id.to_bytes(2, "big") + data[2:]

    def inbound(self, data: bytes) -> tuple[bytes, _Address] | None:
        """The answer to send back and to whom, or None for an answer nobody is waiting for."""
        if len(data) < 12:
            return None
        entry = self._pending.pop(int.from_bytes(data[:2], "big"), None)
        if entry is None:
            return None
        client, client_id, _ = entry
        self.answered += 1
        return client_id + data[2:], client

    def _expire(self, now: float) -> None:
        pending = self._pending
        while pending:
            proxy_id, (_, _, sent) = next(iter(pending.items()))
            if now - sent < self.forget:
                break
            del pending[proxy_id]


async def _delayed_sender(
    sock: trio.socket.SocketType, queue: trio.MemoryReceiveChannel[tuple[float, bytes, _Address]]
) -> None:
    async for due, data, dest in queue:
        await trio.sleep_until(due)
        try:
            await sock.sendto(data, dest)
        except OSError:
            pass  # the destination went away; UDP tells no one


async def _receive_loop(sock: trio.socket.SocketType, handle: Callable[[bytes, _Address], None]) -> None:
    while True:
        try:
            data, peer = await sock.recvfrom(_MAX_DATAGRAM)
        except ConnectionError:
            continue  # an ICMP error for an earlier datagram
        handle(data, peer)


async def serve_delay_proxy(
    upstream: tuple[str, int],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    delay: float = 0.02,
    forget: float = 30.0,
    task_status: trio.TaskStatus[DelayProxy] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Relay UDP between clients and ``upstream`` with ``delay`` seconds each way until cancelled."""
    front = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    back = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with front, back:
        for sock in (front, back):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        await front.bind((host, port))
        await back.bind((host, 0))
        proxy = DelayProxy((host, front.getsockname()[1]), upstream, delay, forget)
        out_send, out_receive = trio.open_memory_channel[tuple[float, bytes, _Address]](_QUEUE_LIMIT)
        back_send, back_receive = trio.open_memory_channel[tuple[float, bytes, _Address]](_QUEUE_LIMIT)

        def from_client(data: bytes, client: _Address) -> None:
            now = trio.current_time()
            wire = proxy.outbound(data, client, now)
            if wire is None:
                return
            try:
                out_send.send_nowait((now + delay, wire, upstream))
            except trio.WouldBlock:
                proxy.dropped += 1

        def from_server(data: bytes, peer: _Address) -> None:
            if tuple(peer[0:2]) != upstream:
                return
            answer = proxy.inbound(data)
            if answer is None:
                return
            try:
                back_send.send_nowait((trio.current_time() + delay, answer[0], answer[1]))
            except trio.WouldBlock:
                proxy.dropped += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_delayed_sender, back, out_receive)
            nursery.start_soon(_delayed_sender, front, back_receive)
            nursery.start_soon(_receive_loop, front, from_client)
            nursery.start_soon(_receive_loop, back, from_server)
            task_status.started(proxy)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    try:
        return socket.gethostbyname(host or "127.0.0.1"), int(port)
    except (OSError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT") from None


async def _run(args: argparse.Namespace) -> str | None:
    """Relay until SIGINT or SIGTERM; returns an error line if the proxy could not start."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            start = functools.partial(
                serve_delay_proxy, args.upstream, host=args.host, port=args.port, delay=args.delay
            )
            try:
                proxy = await nursery.start(start)
            except OSError as exc:
                return f"delay_proxy: cannot listen on {args.host}:{args.port}: {exc}"
            print(f"listening {proxy.address[0]}:{proxy.address[1]}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
    print(f"forwarded {proxy.forwarded} answered {proxy.answered} dropped {proxy.dropped}", flush=True)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench._delay_proxy",
        description="Relay UDP to an upstream server, delaying each datagram each way.",
        epilog="example: python -m tests.bench._delay_proxy --upstream 127.0.0.1:5353 --delay 0.02",
    )
    parser.add_argument("--upstream", type=_address, required=True, help="HOST:PORT of the server")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: chosen by the OS)")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds added each way (default 0.02)")
    args = parser.parse_args(argv)
    if args.delay < 0:
        print("delay_proxy: --delay must not be negative", file=sys.stderr)
        return 2
    error = trio.run(_run, args)
    if error is not None:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
