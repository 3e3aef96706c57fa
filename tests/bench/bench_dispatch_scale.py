"""Dispatch at 10, 100 and 1,000 nodes: frames and bytes per URL, and how long a URL waits, with the batching
that sends at most 12 partial batches a tick (to the owners that waited longest) against the fixed 200 ms timer
(every partial batch at every tick), in the same run.

Run: ``python -m tests.bench.bench_dispatch_scale [--sizes 10 100 1000] [--rate 2000] [--seconds 60]``; a light
``--rate`` (100: a young crawl, a quiet node) shows what a URL waits when the node has links for few owners.

One node's real ``Dispatcher`` with its real on-disk store routes ``--rate`` links a second (hosts spread over the
ring of n nodes, weights 40-300) for ``--seconds`` virtual seconds under ``MockClock``; the network is replaced by a
recorder that encodes every ``UrlBatch`` as the wire would (msgpack body and frame header) and answers each with
the owner's ``BatchAck`` 5 ms later, which is encoded and counted too.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import trio
import trio.testing

from peer.cluster.core.dispatch import DispatchConfig, Dispatcher
from protocol import HEADER_SIZE, BatchAck, Limits, UrlBatch
from protocol._codec import encode_body
from ring import Ring
from storage import NodeStore, QueuedUrl

LIMITS = Limits()


def wire_bytes(message: object) -> int:
    _, body = encode_body(message, "msgpack", LIMITS)
    return HEADER_SIZE + len(body)


class Recorder:
    """The link layer: counts what would be written, and acks batches as their owner would."""

    def __init__(self, nursery: trio.Nursery, routed_at: dict[str, float]) -> None:
        self.nursery = nursery
        self.routed_at = routed_at
        self.dispatcher: Dispatcher | None = None
        self.frames = self.bytes = self.urls = 0
        self.waits: list[float] = []
        self.peers: set[str] = set()

    def send_nowait(self, peer_id: str, message: object) -> bool:
        if isinstance(message, UrlBatch):
            self.frames += 1
            self.bytes += wire_bytes(message)
            self.urls += len(message.urls)
            self.peers.add(peer_id)
            now = trio.current_time()
            self.waits.extend(now - self.routed_at.pop(entry.url, now) for entry in message.urls)
            self.nursery.start_soon(self.ack, peer_id, message)
        return True

    async def ack(self, peer_id: str, batch: UrlBatch) -> None:
        await trio.sleep(0.005)
        ack = BatchAck(seq=batch.seq, new=len(batch.urls), seen=0, forwarded=0, epoch=1)
        self.frames += 1
        self.bytes += wire_bytes(ack)
        assert self.dispatcher is not None
        await self.dispatcher.on_message(peer_id, ack)

    def get(self, peer_id: str) -> object:
        return _Up()


class _Up:
    connects = 1
    connected = True


def measure(count: int, rate: int, seconds: float, config: DispatchConfig, seed: int = 1) -> dict[str, float]:
    rng = random.Random(seed)
    weights = {"a": 150, **{f"n{i:04d}": rng.randint(40, 300) for i in range(1, count)}}
    ring = Ring(weights, points_per_weight=20)
    result: dict[str, float] = {}

    async def main(store: NodeStore) -> None:
        routed_at: dict[str, float] = {}
        async with trio.open_nursery() as nursery:
            links = Recorder(nursery, routed_at)
            dispatcher = Dispatcher("a", store, links, ring_of=lambda: (1, ring), config=config)
            links.dispatcher = dispatcher
            await nursery.start(dispatcher.run)
            step = 0.01
            per_step = rate * step
            owed = 0.0
            made = 0
            for _ in range(int(seconds / step)):
                owed += per_step
                while owed >= 1:
                    owed -= 1
                    made += 1
                    host = f"www.site{rng.getrandbits(40)}.example"
                    url = f"https://{host}/page/{made}"
                    if ring.owner(host) != "a":
                        routed_at[url] = trio.current_time()
                        dispatcher.route(QueuedUrl(url=url, host=host, depth=1))
                await trio.sleep(step)
            await trio.sleep(60)  # every partial batch leaves and is acked
            waits = sorted(links.waits)
            result.update(urls=links.urls, frames_per_url=links.frames / links.urls, bytes_per_url=links.bytes / links.urls,
                          urls_per_batch=links.urls / (links.frames / 2), peers=len(links.peers),
                          wait_mean=sum(waits) / len(waits), wait_p99=waits[int(0.99 * (len(waits) - 1))],
                          unsent=len(routed_at))
            nursery.cancel_scope.cancel()

    with tempfile.TemporaryDirectory() as tmp, NodeStore.open(Path(tmp) / "node", map_size=1 << 30) as store:
        trio.run(main, store, clock=trio.testing.MockClock(autojump_threshold=0))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--rate", type=int, default=2000, help="links routed per second by the node (2,000)")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    policies = {"fixed 200 ms timer": DispatchConfig(partials_per_interval=10**9),
                "12 partial batches a tick (default)": DispatchConfig()}
    print(f"dispatch: {args.rate} links/s for {args.seconds:g} virtual s, batch_size 500, interval 200 ms")
    for label, config in policies.items():
        print(f"  {label}:")
        base = None
        for count in args.sizes:
            f = measure(count, args.rate, args.seconds, config)
            base = base or f
            print(f"    N={count:5d}: {f['frames_per_url']:6.3f} frames/URL ({f['frames_per_url'] / base['frames_per_url']:5.2f}x"
                  f" N={args.sizes[0]}), {f['bytes_per_url']:6.1f} B/URL ({f['bytes_per_url'] / base['bytes_per_url']:4.2f}x),"
                  f" {f['urls_per_batch']:6.1f} URLs/batch, peers written to {f['peers']:.0f},"
                  f" wait mean {f['wait_mean']:.2f} s p99 {f['wait_p99']:.2f} s", flush=True)
            assert f["unsent"] == 0


if __name__ == "__main__":
    main()
