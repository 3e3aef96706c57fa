"""Helpers for bench_cluster: a byte-counting transport, realistic URL sets, a CPU meter and small statistics.

The counting transport wraps the real `TcpTransport`: every stream it hands out (dialled or accepted) counts the
bytes passed to `send_all` and returned by `receive_some`, that is the payload written to and read from the
socket (TCP/IP headers are not counted).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import trio

from peer.cluster.net.transport import Handler, TcpTransport
from peer.crawl.urls import host_of, normalize
from ring import Ring
from storage import QueuedUrl
from tests.bench.bench_protocol import make_hosts, make_url

__all__ = [
    "ByteCounter",
    "CountingStream",
    "CountingTransport",
    "CpuMeter",
    "SECRET",
    "distinct_hosts",
    "make_queued",
    "owned_hosts",
    "spread",
    "unique_urls",
    "wait_for",
]

SECRET = b"bench-cluster secret 0123456789ab"


# -- counting bytes on the socket ------------------------------------------------------------------------------


@dataclass(slots=True)
class ByteCounter:
    """Bytes one node wrote to and read from its sockets, over all its connections."""

    written: int = 0
    read: int = 0


class CountingStream(trio.abc.Stream):
    """A stream that counts what goes through it into a `ByteCounter`, and otherwise is the wrapped stream."""

    def __init__(self, inner: trio.abc.Stream, counter: ByteCounter) -> None:
        self._inner = inner
        self._counter = counter

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._inner.send_all(data)
        self._counter.written += len(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self._inner.receive_some(max_bytes)
        self._counter.read += len(data)
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


class CountingTransport:
    """`TcpTransport` on 127.0.0.1 (port chosen by the OS) whose streams count their bytes in `counter`."""

    def __init__(self, listen: str = "127.0.0.1:0") -> None:
        self._tcp = TcpTransport(listen)
        self.counter = ByteCounter()

    async def connect(self, address: str) -> trio.abc.Stream:
        return CountingStream(await self._tcp.connect(address), self.counter)

    async def serve(self, handler: Handler, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        async def counted(stream: trio.abc.Stream) -> None:
            await handler(CountingStream(stream, self.counter))

        await self._tcp.serve(counted, task_status=task_status)


# -- CPU accounting ---------------------------------------------------------------------------------------------


class CpuMeter:
    """Process CPU seconds (time.process_time) spent inside named sections; sections must not nest or await."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        start = time.process_time()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.process_time() - start
            self.calls[name] = self.calls.get(name, 0) + 1

    def wrap(self, name: str, function: Callable[..., object]) -> Callable[..., object]:
        """`function` (synchronous) with its calls counted under `name`."""

        def timed(*args: object, **kwargs: object) -> object:
            with self.section(name):
                return function(*args, **kwargs)

        return timed

    def get(self, name: str) -> float:
        return self.seconds.get(name, 0.0)


# -- URLs -------------------------------------------------------------------------------------------------------


def distinct_hosts(rng: random.Random, count: int, keep: Callable[[str], bool] = lambda host: True) -> list[str]:
    """`count` distinct realistic host names for which `keep(host)` holds (bounded search)."""
    found: dict[str, None] = {}
    for _ in range(200):
        for host in make_hosts(rng, max(64, count)):
            if host not in found and keep(host):
                found[host] = None
                if len(found) == count:
                    return list(found)
    raise RuntimeError(f"found only {len(found)} suitable host names, wanted {count}")


def owned_hosts(ring: Ring, owner: str, count: int, rng: random.Random) -> list[str]:
    """`count` distinct realistic host names that `ring` gives to `owner`."""
    return distinct_hosts(rng, count, lambda host: ring.owner(host) == owner)


def unique_urls(rng: random.Random, hosts: Sequence[str], count: int) -> list[str]:
    """`count` distinct normalized URLs on `hosts` (round robin), realistic in shape (bench_protocol's maker)."""
    urls: dict[str, None] = {}
    attempts = 0
    while len(urls) < count:
        attempts += 1
        if attempts > count * 3:
            raise RuntimeError(f"could not make {count} distinct URLs")
        host = hosts[len(urls) % len(hosts)]
        url = normalize(make_url(rng, host))
        if url is None or url in urls or host_of(url) != host:
            continue
        urls[url] = None
    return list(urls)


def make_queued(urls: Sequence[str], referrers: Sequence[str], rng: random.Random) -> list[QueuedUrl]:
    """Frontier items for `urls`, each found on a random one of `referrers`, at a realistic depth."""
    return [
        QueuedUrl(
            url=url,
            host=host_of(url),
            depth=rng.randint(1, 12),
            hops=0 if rng.random() < 0.95 else rng.randint(1, 3),
            found_on=rng.choice(referrers),
        )
        for url in urls
    ]


# -- small things -----------------------------------------------------------------------------------------------


async def wait_for(condition: Callable[[], bool], limit: float, what: str, step: float = 0.005) -> None:
    """Poll `condition` every `step` seconds; TimeoutError naming `what` past `limit` seconds."""
    with trio.move_on_after(limit):
        while not condition():
            await trio.sleep(step)
        return
    raise TimeoutError(f"{what}: not reached within {limit} s")


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(median, max) of `values`."""
    return statistics.median(values), max(values)
