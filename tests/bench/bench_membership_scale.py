"""Membership at 10, 100 and 1,000 nodes: what a node pays for gossip, and how fast a join and a death spread.

Run: ``python -m tests.bench.bench_membership_scale [--sizes 10 100 1000] [--seconds 20]``.

Every node runs the real ``Membership`` (SWIM probes, gossip, push-pull sync, suspicion) over the in-memory
network in one ``trio.run`` under ``MockClock``; the network adds 1-2 ms per message, as a LAN does. The cluster
starts converged: each node's view holds every member (the view n sequential joins end with, merged once), so
the figures are those of a running cluster rather than of n joins in a row. Per size it prints:

- steady state: bytes written (frames on links and datagrams) per node per virtual second, and CPU per node per
  virtual second twice: the whole process's divided by n, and that spent inside the nodes' own task steps (the
  membership, link and protocol code, with the trio calls it makes and the in-memory network's pipes standing in
  for the kernel's sockets), measured by a trio Instrument around every task step. The difference is the
  simulator's scheduling: one trio run loop and timer heap holding every node's tasks and deadlines, which a
  real node (one process, its own few tasks) does not share with 999 others;
- with `--by-kind`, the steady state's bytes by message kind (link frames, handshake included; "dg:" datagrams);
- a join: virtual seconds until every node holds the newcomer ALIVE, in protocol periods (probe interval 1 s);
- a death: virtual seconds from the kill until every live node holds the victim DEAD, beside the suspicion
  timeout (5 s);
- false suspicions: with 1% of messages lost for the same duration, how many live members were suspected (and
  how many were declared dead) by anyone;
- links: connections each node holds at the end of the steady state (mean and most), and connections opened
  per node per second meanwhile (each a handshake). Links close after `--idle-timeout` seconds without traffic
  (the product's `link_idle_timeout`, 60 s); `--warmup` virtual seconds pass before the steady state is
  measured, so with a warm-up past the idle timeout the figures are those of links that come and go.
- the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import collections
import random
import resource
import time

import trio
import trio.testing

from peer.cluster.membership.membership import Membership, MembershipConfig
from peer.cluster.net.peerlinks import LinkConfig
from peer.config import DEFAULTS
from peer.cluster.net import memtransport as _transport
from peer.cluster.net.memtransport import MemoryNetwork
from protocol import TYPE_CODES
from ring import MemberState, View, merge

SECRET = b"membership bench secret, 32 byte"
CONFIG = MembershipConfig()


_KIND_NAMES = {code: cls.__name__ for cls, code in TYPE_CODES.items()}


class TaskCpu(trio.abc.Instrument):
    """CPU spent inside task steps (the nodes' own code), apart from the run loop's scheduling between them."""

    def __init__(self) -> None:
        self.ns = 0
        self._started: int | None = None  # None in the step that adds the instrument (it saw no start)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.process_time_ns()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._started is not None:
            self.ns += time.process_time_ns() - self._started
            self._started = None


class KindCounter:
    """Bytes sent by message kind: every link write cut into its frames, every datagram by its type byte. It wraps
    the in-memory network's two send paths for the bench's run only (the network itself counts bytes per node)."""

    def __init__(self) -> None:
        self.bytes: collections.Counter[str] = collections.Counter()
        self.count: collections.Counter[str] = collections.Counter()
        self.on = False

    def install(self) -> None:
        send_all, send_datagram, counter = _transport.MemoryStream.send_all, MemoryNetwork._send_datagram, self

        async def counted_send_all(stream: _transport.MemoryStream, data: bytes) -> None:
            if counter.on:
                view, offset = bytes(data), 0
                while offset + 6 <= len(view):  # PeerLinks writes whole frames only
                    size = 4 + int.from_bytes(view[offset:offset + 4], "big")
                    counter.add(_KIND_NAMES.get(view[offset + 4], "?"), size)
                    offset += size
            await send_all(stream, data)

        def counted_datagram(network: MemoryNetwork, source: str, address: str, data: bytes) -> bool:
            if counter.on:
                counter.add("dg:" + _KIND_NAMES.get(data[3], "?"), len(data))
            return send_datagram(network, source, address, data)

        _transport.MemoryStream.send_all = counted_send_all  # type: ignore[method-assign]
        MemoryNetwork._send_datagram = counted_datagram  # type: ignore[method-assign]

    def add(self, kind: str, size: int) -> None:
        self.bytes[kind] += size
        self.count[kind] += 1


def address(index: int) -> str:
    return f"10.{index // 62500}.{index // 250 % 250}.{index % 250 + 1}:7000"


class Cluster:
    def __init__(self, nursery: trio.Nursery, net: MemoryNetwork, seed: int, links: LinkConfig) -> None:
        self.nursery, self.net, self.seed, self.link_config = nursery, net, seed, links
        self.nodes: dict[str, Membership] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.suspected: set[tuple[str, int]] = set()  # (node, incarnation) anyone held SUSPECT
        self.declared_dead: set[str] = set()

    def watch(self, membership: Membership) -> None:
        def seen(view: View) -> None:
            for member in view.members:
                if member.state is MemberState.SUSPECT:
                    self.suspected.add((member.node_id, member.incarnation))
                elif member.state is MemberState.DEAD:
                    self.declared_dead.add(member.node_id)
        membership.subscribe(seen)

    async def start(self, index: int) -> Membership:
        membership = Membership(node_id=f"node-{index:04d}", weight=40 + index % 261, secret=SECRET,
                                transport=self.net.transport(address(index)), config=CONFIG,
                                link_config=self.link_config,
                                rng=random.Random(self.seed * 100_000 + index), nonce=random.Random(index).randbytes)

        async def host(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(membership.run)
                    task_status.started(scope)

        self.scopes[membership.node_id] = await self.nursery.start(host)
        self.nodes[membership.node_id] = membership
        return membership

    async def start_converged(self, count: int) -> None:
        members = [await self.start(index) for index in range(count)]
        whole = View()
        for membership in members:
            whole = merge(whole, membership.view)
        for membership in members:
            membership._apply(merge(membership.view, whole))
            membership._broadcast.clear()  # a converged cluster has nothing left to gossip
            self.watch(membership)

    def kill(self, node_id: str) -> None:
        self.scopes.pop(node_id).cancel()
        del self.nodes[node_id]

    async def until(self, condition, limit: float, step: float = 0.01) -> float:
        start = trio.current_time()
        for _ in range(int(limit / step) + 1):
            if condition():
                return trio.current_time() - start
            await trio.sleep(step)
        raise AssertionError(f"not within {limit} virtual seconds")

    def everyone_holds(self, node_id: str, state: MemberState) -> bool:
        return all(m.view.member(node_id) is not None and m.view.member(node_id).state is state
                   for other, m in self.nodes.items() if other != node_id)


def measure(count: int, seconds: float, *, warmup: float = 5.0, idle_timeout: float = DEFAULTS["link_idle_timeout"],
            seed: int = 1, kinds: KindCounter | None = None) -> dict[str, float]:
    figures: dict[str, float] = {}

    async def main() -> None:
        net = MemoryNetwork(random.Random(seed), delay=0.001, jitter=0.001)
        async with trio.open_nursery() as nursery:
            cluster = Cluster(nursery, net, seed, LinkConfig(idle_timeout=idle_timeout))
            wall = time.perf_counter()
            await cluster.start_converged(count)
            figures["setup_s"] = time.perf_counter() - wall
            await trio.sleep(warmup)  # links come up as probes go out (and, past the idle timeout, go again)
            # steady state
            net.sent_bytes.clear()
            connects = net.connects
            datagrams = net.datagrams
            task_cpu = TaskCpu()
            if kinds is not None:
                kinds.on = True
            trio.lowlevel.add_instrument(task_cpu)
            cpu = time.process_time()
            await trio.sleep(seconds)
            figures["cpu_per_node_s"] = (time.process_time() - cpu) / count / seconds
            trio.lowlevel.remove_instrument(task_cpu)
            if kinds is not None:
                kinds.on = False
            figures["task_cpu_per_node_s"] = task_cpu.ns / 1e9 / count / seconds
            figures["datagrams_per_node_s"] = (net.datagrams - datagrams) / count / seconds
            figures["bytes_per_node_s"] = sum(net.sent_bytes.values()) / count / seconds
            figures["connects_per_node_s"] = 2 * (net.connects - connects) / count / seconds
            live = [m.links.live for m in cluster.nodes.values()]
            figures["links_per_node"] = sum(live) / len(live)
            figures["links_most"] = max(live)
            figures["steady_suspected"] = len(cluster.suspected)
            # a join
            newcomer = await cluster.start(count)
            cluster.watch(newcomer)
            start = trio.current_time()
            nursery.start_soon(newcomer.join, address(count // 2))
            figures["join_s"] = await cluster.until(
                lambda: cluster.everyone_holds(newcomer.node_id, MemberState.ALIVE), limit=120)
            figures["join_s"] = trio.current_time() - start
            await trio.sleep(3)
            # a death
            victim = f"node-{count // 3:04d}"
            cluster.kill(victim)
            figures["death_s"] = await cluster.until(lambda: cluster.everyone_holds(victim, MemberState.DEAD),
                                                     limit=300)
            await trio.sleep(3)
            # false suspicions under 1% loss
            cluster.suspected.clear()
            dead_before = set(cluster.declared_dead)
            net.loss_probability = 0.01
            lost = net.lost
            await trio.sleep(seconds)
            net.loss_probability = 0.0
            figures["lost_messages"] = net.lost - lost
            live = set(cluster.nodes)
            figures["false_suspicions"] = len({(n, i) for n, i in cluster.suspected if n in live})
            figures["false_deaths"] = len((cluster.declared_dead - dead_before) & live)
            nursery.cancel_scope.cancel()

    wall = time.perf_counter()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    figures["wall_s"] = time.perf_counter() - wall
    figures["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--seconds", type=float, default=20.0, help="virtual seconds of steady state and of loss")
    parser.add_argument("--warmup", type=float, default=5.0, help="virtual seconds before the steady state")
    parser.add_argument("--idle-timeout", type=float, default=DEFAULTS["link_idle_timeout"],
                        help="seconds a link may stay idle before it closes (0: never)")
    parser.add_argument("--by-kind", action="store_true", help="also print the steady state's bytes by message kind")
    args = parser.parse_args()
    print(f"membership, {args.warmup:g} virtual s warm-up, {args.seconds:g} s steady and {args.seconds:g} s at 1% "
          f"loss; probe 1 s, gossip 0.2 s x3, suspicion {CONFIG.suspicion_timeout:g} s, sync "
          f"{CONFIG.sync_interval:g} s, link idle timeout {args.idle_timeout:g} s")
    base = None
    kinds = KindCounter() if args.by_kind else None
    if kinds is not None:
        kinds.install()
    for count in args.sizes:
        if kinds is not None:
            kinds.bytes.clear()
            kinds.count.clear()
        f = measure(count, args.seconds, warmup=args.warmup, idle_timeout=args.idle_timeout, kinds=kinds)
        base = base or f
        print(f"N={count:5d}: {f['bytes_per_node_s']:8.0f} B/node/s ({f['bytes_per_node_s'] / base['bytes_per_node_s']:4.1f}x "
              f"N={args.sizes[0]})  CPU {f['cpu_per_node_s'] * 1000:6.2f} ms/node/s process-wide, "
              f"{f['task_cpu_per_node_s'] * 1000:5.2f} in the nodes' task steps "
              f"({f['task_cpu_per_node_s'] / base['task_cpu_per_node_s']:4.1f}x)  "
              f"datagrams {f['datagrams_per_node_s']:.2f}/node/s  links/node {f['links_per_node']:5.1f} "
              f"(most {f['links_most']:.0f}, {f['connects_per_node_s']:.2f} opened/node/s)  "
              f"join known everywhere {f['join_s']:5.2f} s  death agreed {f['death_s']:5.2f} s  "
              f"false suspicions {f['false_suspicions']:.0f} (deaths {f['false_deaths']:.0f}) of "
              f"{f['lost_messages']:.0f} lost  [wall {f['wall_s']:.0f} s, peak {f['peak_mb']:.0f} MB]", flush=True)
        if kinds is not None:
            total = sum(kinds.bytes.values())
            for kind, size in kinds.bytes.most_common():
                print(f"    {kind:16s} {size / count / args.seconds:7.1f} B/node/s  {100 * size / total:5.1f}%  "
                      f"{kinds.count[kind] / count / args.seconds:6.2f} /node/s", flush=True)


if __name__ == "__main__":
    main()
