"""What a node's periodic work costs per peer, at 100 and 1,000 peers, against the pass over every peer it replaced,
measured in the same run.

Run: ``python -m tests.bench.bench_per_peer_work [--sizes 100 1000]``.

- the dispatcher's timer tick (every ``dispatch_interval``) on a node that has sent to every owner and been
  acknowledged: the tick itself, beside one outbox read per owner (what each tick made before it looked only at the
  owners with work);
- a partial gossip of 3 records the node holds, merged into its view of n members (``ring.merge``), beside the
  merge that builds, sorts and ranks all n records;
- the partition fence's tick with a fresh proof of contact (its count put off) beside a count over every member.

Each figure is CPU microseconds per call; the ratio is what the reader should keep (the machine is shared).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import trio
import trio.testing

from peer.cluster.core.dispatch import DispatchConfig, Dispatcher
from protocol import BatchAck, Message
from ring import MemberState, Ring, View, merge
from storage import NodeStore, QueuedUrl


class _Links:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []

    def send_nowait(self, peer_id: str, message: Message) -> bool:
        self.sent.append((peer_id, message))
        return True

    def get(self, peer_id: str) -> object | None:
        return None


def _host_of(ring: Ring, owner: str) -> str:
    i = 0
    while ring.owner(f"h{i}.test") != owner:
        i += 1
    return f"h{i}.test"


def _cpu(fn, rounds: int) -> float:
    start = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - start) / rounds * 1e6


async def _dispatch(n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = NodeStore.open(Path(tmp) / "a", map_size=1 << 26)
        try:
            ring = Ring({"a": 1, **{f"p{i}": 1 for i in range(n)}}, points_per_weight=10)
            links = _Links()
            d = Dispatcher("a", store, links, ring_of=lambda: (1, ring), config=DispatchConfig(partials_per_interval=n))
            for i in range(n):
                host = _host_of(ring, f"p{i}")
                d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
            d.tick(trio.current_time())
            for peer, batch in links.sent:
                await d.on_message(peer, BatchAck(seq=batch.seq, new=1, seen=0, forwarded=0, epoch=1))  # type: ignore[attr-defined]
            d.tick(trio.current_time())
            tick = _cpu(lambda: d.tick(trio.current_time()), 200)
            owners = [f"p{i}" for i in range(n)]
            reads = _cpu(lambda: [store.outbox.take(owner, 500, after=1 << 62) for owner in owners], 10)
        finally:
            store.close()
    return tick, reads


def _full_merge(a: View, b: View) -> View:
    records = {member.node_id: member for member in a.members}
    for member in b.members:
        current = records.get(member.node_id)
        if current is None or member.precedence() > current.precedence():
            records[member.node_id] = member
    members = tuple(records.values())
    rank = sum(member.rank for member in members)
    offset = max(a.epoch - sum(m.rank for m in a.members), b.epoch - sum(m.rank for m in b.members))
    return View(epoch=rank + offset, members=members)


def _count_all(view: View, node_id: str, heard: dict[str, float], silent: dict[str, float], last: float) -> int:
    """The fence's count over every member, as each tick made it while a proof of contact kept the fence off."""
    owning = [m.node_id for m in view.members if m.state in (MemberState.ALIVE, MemberState.SUSPECT)]
    contact = 1
    for peer in owning:
        if peer == node_id:
            continue
        if heard.get(peer, -math.inf) >= last:
            silent[peer] = 0.0
        else:
            silent[peer] = silent.get(peer, 0.0) + 0.25
        contact += silent[peer] < 2.5
    return contact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args()
    print("peers | dispatch tick us (every owner read) | gossip merge us (full merge) | fence count us (over all)")
    for n in args.sizes:
        tick, reads = trio.run(_dispatch, n, clock=trio.testing.MockClock())
        view = View()
        for i in range(n):
            view = view.join(f"n{i:04d}", f"10.0.{i // 250}.{i % 250}:7400", 1)
        gossip = View(members=view.members[3:6])
        gossip = View(epoch=gossip.rank, members=gossip.members)
        merged = _cpu(lambda: merge(view, gossip), 500)
        full = _cpu(lambda: _full_merge(view, gossip), 100)
        heard = {m.node_id: 1.0 for m in view.members}
        silent: dict[str, float] = {}
        count = _cpu(lambda: _count_all(view, "n0000", heard, silent, 0.5), 100)
        print(f"{n:5d} | {tick:8.1f} ({reads:8.1f}, x{reads / tick:,.0f}) | {merged:6.1f} ({full:7.1f}, "
              f"x{full / merged:,.0f}) | {count:7.1f} a tick, now one tick in 16 at most")


if __name__ == "__main__":
    main()
