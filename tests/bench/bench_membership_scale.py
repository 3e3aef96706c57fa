"""Membership at 10, 100 and 1,000 nodes: what a node pays for gossip, and how fast a join and a death spread.

Run: ``python -m tests.bench.bench_membership_scale [--sizes 10 100 1000] [--seconds 20]``.

Every node runs the real ``Membership`` (SWIM probes, gossip, push-pull sync, suspicion) over the in-memory
network in one ``trio.run`` under ``MockClock``; the network adds 1-2 ms per message, as a LAN does. The cluster
starts converged: each node's view holds every member (the view n sequential joins end with, merged once), so
the figures are those of a running cluster rather than of n joins in a row. Per size it prints:

- steady state: bytes written and CPU seconds (of this process, divided by n) per node per virtual second;
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
import random
import resource
import time

import trio
import trio.testing

from peer.cluster.membership import Membership, MembershipConfig
from peer.cluster.peerlinks import LinkConfig
from peer.config import DEFAULTS
from peer.cluster.transport import MemoryNetwork
from ring import MemberState, View, merge

SECRET = b"membership bench secret, 32 byte"
CONFIG = MembershipConfig()


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
            seed: int = 1) -> dict[str, float]:
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
            cpu = time.process_time()
            await trio.sleep(seconds)
            figures["cpu_per_node_s"] = (time.process_time() - cpu) / count / seconds
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
    args = parser.parse_args()
    print(f"membership, {args.warmup:g} virtual s warm-up, {args.seconds:g} s steady and {args.seconds:g} s at 1% "
          f"loss; probe 1 s, gossip 0.2 s x3, suspicion {CONFIG.suspicion_timeout:g} s, sync "
          f"{CONFIG.sync_interval:g} s, link idle timeout {args.idle_timeout:g} s")
    base = None
    for count in args.sizes:
        f = measure(count, args.seconds, warmup=args.warmup, idle_timeout=args.idle_timeout)
        base = base or f
        print(f"N={count:5d}: {f['bytes_per_node_s']:8.0f} B/node/s ({f['bytes_per_node_s'] / base['bytes_per_node_s']:4.1f}x "
              f"N={args.sizes[0]})  CPU {f['cpu_per_node_s'] * 1000:6.2f} ms/node/s  links/node {f['links_per_node']:5.1f} "
              f"(most {f['links_most']:.0f}, {f['connects_per_node_s']:.2f} opened/node/s)  "
              f"join known everywhere {f['join_s']:5.2f} s  death agreed {f['death_s']:5.2f} s  "
              f"false suspicions {f['false_suspicions']:.0f} (deaths {f['false_deaths']:.0f}) of "
              f"{f['lost_messages']:.0f} lost  [wall {f['wall_s']:.0f} s, peak {f['peak_mb']:.0f} MB]", flush=True)


if __name__ == "__main__":
    main()
