"""SWIM membership in deterministic simulations: many nodes in one trio.run over the in-memory network, virtual
time (MockClock), injected partitions, delays and link breaks; plus a few real nodes over loopback TCP.

Run as a script (`python -m tests.test_membership`) it prints the convergence figures quoted in docs/cluster.md.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peer.cluster.membership.membership import Membership, MembershipConfig
from peer.cluster.net.peerlinks import LinkError
from peer.cluster.net.memtransport import MemoryNetwork
from peer.cluster.net.transport import TcpTransport
from protocol import Gossip, Ping
from ring import MemberState, View

SECRET = b"membership test secret, 32 byte"
CONFIG = MembershipConfig()  # the defaults: probe 1 s / timeout 0.5 s, suspicion 5 s, gossip 0.2 s, sync 10 s


class Node:
    def __init__(self, membership: Membership, scope: trio.CancelScope, address: str) -> None:
        self.m = membership
        self.scope = scope
        self.address = address
        self.views: list[View] = []
        membership.subscribe(self.views.append)

    @property
    def id(self) -> str:
        return self.m.node_id

    def state_of(self, node_id: str) -> MemberState | None:
        member = self.m.view.member(node_id)
        return None if member is None else member.state


class Sim:
    """A cluster on a MemoryNetwork; every node runs under its own cancel scope so it can be killed."""

    def __init__(self, nursery: trio.Nursery, net: MemoryNetwork, seed: int, config: MembershipConfig = CONFIG):
        self.nursery = nursery
        self.net = net
        self.seed = seed
        self.config = config
        self.nodes: dict[str, Node] = {}

    async def start(self, index: int, weight: int = 10) -> Node:
        node_id = f"node-{index:02d}"
        membership = Membership(
            node_id=node_id,
            weight=weight,
            secret=SECRET,
            transport=self.net.transport(f"10.0.{index // 250}.{index % 250 + 1}:7000"),
            rng=random.Random(self.seed * 1000 + index),
            config=self.config,
            nonce=random.Random(index).randbytes,
        )

        async def host(task_status: trio.TaskStatus[tuple[trio.CancelScope, str]]) -> None:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    address = await nursery.start(membership.run)
                    task_status.started((scope, address))

        scope, address = await self.nursery.start(host)
        node = self.nodes[node_id] = Node(membership, scope, address)
        return node

    def kill(self, node: Node) -> None:
        node.scope.cancel()
        del self.nodes[node.id]

    def live(self) -> list[Node]:
        return list(self.nodes.values())

    def converged(self, nodes: list[Node] | None = None) -> bool:
        nodes = nodes or self.live()
        first = nodes[0].m.view
        return all(n.m.view.epoch == first.epoch and n.m.view.members == first.members for n in nodes)

    async def until(self, condition: Callable[[], bool], limit: float, step: float = 0.05) -> float:
        """Virtual seconds until `condition` holds, checked every `step`; fails past `limit`."""
        start = trio.current_time()
        for _ in range(int(limit / step) + 1):
            if condition():
                return trio.current_time() - start
            await trio.sleep(step)
        raise AssertionError(f"condition not met within {limit} virtual seconds")


async def build(sim: Sim, count: int, *, via_random_member: bool = True) -> list[Node]:
    rng = random.Random(sim.seed)
    nodes = [await sim.start(0)]
    for index in range(1, count):
        node = await sim.start(index)
        seed = rng.choice(nodes) if via_random_member else nodes[0]
        with trio.fail_after(30):  # three tries, each waiting at most the handshake timeout (5 s)
            await node.m.join(seed.address)
        nodes.append(node)
    return nodes


def run_sim(seed: int, body: Callable[[Sim], object], **net_options: float) -> None:
    async def main() -> None:
        net = MemoryNetwork(random.Random(seed), **net_options)
        async with trio.open_nursery() as nursery:
            await body(Sim(nursery, net, seed))  # type: ignore[misc]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# --- joining -------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_join_through_any_member_converges_everywhere(seed: int) -> None:
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 16)
        took = await sim.until(lambda: sim.converged() and len(nodes[0].m.view.members) == 16, limit=5)
        assert took <= 5
        view = nodes[-1].m.view
        assert [m.node_id for m in view.members] == sorted(n.id for n in nodes)
        assert all(m.state is MemberState.ALIVE for m in view.members)
        # Nothing condemns a healthy cluster: 30 quiet seconds later no one was ever suspected.
        await trio.sleep(30)
        assert sim.converged() and nodes[0].m.view == view
        assert not any(m.state is not MemberState.ALIVE for n in nodes for v in n.views for m in v.members)

    run_sim(seed, body)


def test_join_returns_the_seed_view_and_fails_clearly_for_a_dead_seed() -> None:
    async def body(sim: Sim) -> None:
        a, b = await sim.start(0), await sim.start(1)
        view = await b.m.join(a.address)
        assert view.member(a.id) is not None and view.member(b.id) is not None
        c = await sim.start(2)
        with pytest.raises(LinkError, match=r"cannot join through 10\.9\.9\.9:7000: .*refused"):
            await c.m.join("10.9.9.9:7000")

    run_sim(3, body)


def test_a_join_is_told_to_every_member_by_the_member_it_joined_through_within_one_delivery() -> None:
    """The member a newcomer joins through sends the newcomer's record alone to every other member at once: all
    24 hold it before a gossip round (0.2 s, three members a round) could have told more than a few."""
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 24)
        await sim.until(sim.converged, limit=10)
        seed = nodes[5]
        sent: list[tuple[str, Gossip]] = []
        send = seed.m._send_datagram_first

        def recording(peer_id: str, message: object) -> bool:
            if isinstance(message, Gossip):
                sent.append((peer_id, message))
            return send(peer_id, message)  # type: ignore[arg-type]

        seed.m._send_datagram_first = recording  # type: ignore[method-assign]
        newcomer = await sim.start(24)
        await newcomer.m.join(seed.address)
        took = await sim.until(lambda: all(n.state_of(newcomer.id) is MemberState.ALIVE for n in sim.live()),
                               limit=1.0, step=0.01)
        assert took < CONFIG.gossip_interval / 2
        told = [(peer, g) for peer, g in sent if [m.node_id for m in g.members] == [newcomer.id]]
        assert sorted(peer for peer, _ in told) == sorted(n.id for n in nodes if n is not seed)
        assert all(not g.full for _, g in told)
        await sim.until(sim.converged, limit=5)

    run_sim(13, body)


def test_every_view_change_is_announced_once_and_epochs_only_grow() -> None:
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 6)
        await sim.until(sim.converged, limit=5)
        sim.kill(nodes[5])
        await sim.until(lambda: all(n.state_of("node-05") is MemberState.DEAD for n in sim.live()), limit=20)
        for node in sim.live():
            epochs = [v.epoch for v in node.views]
            assert epochs == sorted(set(epochs))  # strictly increasing: each change announced once
            assert node.views[-1] == node.m.view

    run_sim(4, body)


# --- failures ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", [5, 6])
def test_a_killed_node_is_declared_dead_by_all(seed: int) -> None:
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 12)
        await sim.until(sim.converged, limit=5)
        victim = nodes[7]
        sim.kill(victim)
        # Detection: up to one probe round of the members (12 s worst case is rare; expected ~2 s) plus the
        # suspicion timeout (5 s) plus gossip; bounded generously at 20 virtual seconds.
        took = await sim.until(lambda: all(n.state_of(victim.id) is MemberState.DEAD for n in sim.live()), limit=20)
        assert took >= CONFIG.suspicion_timeout  # never dead before the suspicion ran out
        await sim.until(sim.converged, limit=5)
        survivors = sim.live()
        assert all(n.state_of(m.id) is MemberState.ALIVE for n in survivors for m in survivors)
        # Suspicion came first on every node that saw the death happen by itself.
        assert any(m.node_id == victim.id and m.state is MemberState.SUSPECT
                   for n in survivors for v in n.views for m in v.members)

    run_sim(seed, body)


def test_a_partitioned_then_healed_node_refutes_and_returns_alive() -> None:
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 8)
        await sim.until(sim.converged, limit=5)
        cut = nodes[3]
        before = cut.m.view.member(cut.id)
        assert before is not None
        others = [n.address for n in nodes if n is not cut]
        sim.net.partition([cut.address], others)
        majority = [n for n in nodes if n is not cut]
        await sim.until(lambda: all(n.state_of(cut.id) is MemberState.DEAD for n in majority), limit=20)
        assert sim.converged(majority)
        sim.net.heal()
        # Reconnect tries one dead member every 5-15 s; then the push-pull and refutations spread.
        took = await sim.until(
            lambda: sim.converged() and all(m.state is MemberState.ALIVE for m in nodes[0].m.view.members), limit=40
        )
        assert took <= 40
        after = nodes[0].m.view.member(cut.id)
        assert after is not None and after.incarnation > before.incarnation
        # it knows it was declared dead (the others took its arcs over meanwhile: the cluster then waits for
        # their hand-offs)
        assert cut.m.declared_dead_at > 0

    run_sim(7, body)


def test_a_short_partition_is_only_suspected_then_refuted() -> None:
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 8)
        await sim.until(sim.converged, limit=5)
        cut = nodes[2]
        sim.net.partition([cut.address], [n.address for n in nodes if n is not cut])
        await sim.until(lambda: any(n.state_of(cut.id) is MemberState.SUSPECT for n in nodes if n is not cut),
                        limit=15)
        sim.net.heal()
        await sim.until(lambda: sim.converged() and all(n.state_of(cut.id) is MemberState.ALIVE for n in nodes),
                        limit=15)
        me = nodes[0].m.view.member(cut.id)
        assert me is not None and me.incarnation >= 1  # it refuted: a bumped incarnation
        assert cut.m.declared_dead_at == -math.inf  # suspected only: nobody took its arcs
        assert not any(m.node_id == cut.id and m.state is MemberState.DEAD for n in nodes for v in n.views
                       for m in v.members)

    run_sim(8, body)


def test_a_leave_is_seen_as_leaving_by_all_and_never_turns_dead() -> None:
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 10)
        await sim.until(sim.converged, limit=5)
        leaver = nodes[4]
        started = trio.current_time()
        await leaver.m.leave()
        assert trio.current_time() - started <= 2.0  # the goodbyes are bounded
        assert leaver.m.view.member(leaver.id).state is MemberState.LEAVING
        sim.kill(leaver)
        took = await sim.until(lambda: all(n.state_of(leaver.id) is MemberState.LEAVING for n in sim.live()),
                               limit=3)
        assert took <= 3
        await trio.sleep(30)
        assert sim.converged()
        assert all(n.state_of(leaver.id) is MemberState.LEAVING for n in sim.live())
        assert leaver.id not in nodes[0].m.view.owner_weights()  # it owns no arcs any more

    run_sim(9, body)


def test_a_leave_tells_every_member_its_own_record_alone_and_none_answers_with_a_whole_view() -> None:
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 24)
        await sim.until(sim.converged, limit=10)
        leaver = nodes[7]
        sent: list[tuple[str, Gossip]] = []
        received: list[Gossip] = []
        send = leaver.m.links.send_nowait

        def recording(peer_id: str, message: object, **kwargs: object) -> bool:
            if isinstance(message, Gossip):
                sent.append((peer_id, message))
            return send(peer_id, message, **kwargs)

        leaver.m.links.send_nowait = recording  # type: ignore[method-assign]
        on_gossip = leaver.m._on_gossip

        def answered(peer_id: str, gossip: Gossip) -> None:
            received.append(gossip)
            on_gossip(peer_id, gossip)

        leaver.m._on_gossip = answered  # type: ignore[method-assign]
        await leaver.m.leave(close_links=False)
        assert {peer for peer, _ in sent} == {n.id for n in nodes if n is not leaver}
        for _, gossip in sent:
            assert not gossip.full and [m.node_id for m in gossip.members] == [leaver.id]
            assert gossip.members[0].state == MemberState.LEAVING.value
        await sim.until(lambda: all(n.state_of(leaver.id) is MemberState.LEAVING for n in sim.live()), limit=3)
        assert not [g for g in received if g.full]  # nobody answered the news with its whole view

    run_sim(12, body)


def test_a_ping_from_a_member_behind_is_answered_with_the_records_being_gossiped_else_the_whole_view() -> None:
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 8)
        await sim.until(sim.converged, limit=10)
        await trio.sleep(10)  # every record's retransmissions are over: nothing is being gossiped
        a, b = nodes[0], nodes[1]
        sent: list[Gossip] = []
        for name in ("send_nowait", "send_datagram"):
            original = getattr(a.m.links, name)

            def recording(peer_id: str, message: object, _original=original, **kwargs: object) -> bool:
                if isinstance(message, Gossip):
                    sent.append(message)
                return _original(peer_id, message, **kwargs)

            setattr(a.m.links, name, recording)
        assert not a.m._broadcast
        await a.m._on_message(b.id, Ping(seq=1, epoch=a.m.view.epoch + 1), datagram=True)
        assert [(g.full, len(g.members)) for g in sent] == [(True, 8)]  # no news to explain it: the whole view
        sent.clear()
        a.m._broadcast[a.id] = 3  # its own record is being gossiped: a change spreading
        await a.m._on_message(b.id, Ping(seq=2, epoch=a.m.view.epoch - 1), datagram=True)
        assert [(g.full, [m.node_id for m in g.members]) for g in sent] == [(False, [a.id])]  # b is behind
        sent.clear()
        await a.m._on_message(b.id, Ping(seq=3, epoch=a.m.view.epoch + 1), datagram=True)
        assert [(g.full, len(g.members)) for g in sent] == [(True, 8)]  # b is ahead: the exchange of whole views
        sent.clear()
        await a.m._on_message(b.id, Ping(seq=3, epoch=a.m.view.epoch), datagram=True)
        assert sent == []  # the same view: a Pong alone

    run_sim(13, body)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [10, 11])
def test_views_converge_after_delays_and_random_link_breaks_stop(seed: int) -> None:
    async def body(sim: Sim) -> None:
        nodes = await build(sim, 12)
        extra = random.Random(seed)
        for _ in range(5):  # churn under faults: partitions come and go
            a, b = extra.sample(nodes, 2)
            sim.net.block(a.address, b.address)
            await trio.sleep(extra.uniform(1, 4))
            sim.net.heal()
        await trio.sleep(10)
        sim.net.delay = sim.net.jitter = sim.net.break_probability = 0.0
        took = await sim.until(
            lambda: sim.converged() and all(m.state is MemberState.ALIVE for m in nodes[0].m.view.members), limit=60
        )
        assert took <= 60
        assert sim.net.breaks > 0  # the faults did happen

    run_sim(seed, body, delay=0.02, jitter=0.05, break_probability=0.003)


# --- random fault schedules -----------------------------------------------------------------------------------------

OPERATIONS = st.one_of(
    st.tuples(st.just("kill"), st.integers(0, 99)),
    st.tuples(st.just("leave"), st.integers(0, 99)),
    st.tuples(st.just("isolate"), st.integers(0, 99), st.floats(0.5, 12)),
    st.tuples(st.just("join"), st.integers(0, 99)),
    st.tuples(st.just("sleep"), st.floats(0, 8)),
)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedule=st.lists(OPERATIONS, min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_after_any_fault_schedule_views_converge_on_the_truth(schedule: list[tuple], seed: int) -> None:
    """Kills, leaves, isolations (partition then heal) and joins in any order, over a network with delays and
    random link breaks; once they stop, every live node holds the same view in bounded time: live nodes ALIVE,
    killed ones DEAD, departed ones LEAVING."""
    killed: set[str] = set()
    departed: set[str] = set()

    async def body(sim: Sim) -> None:
        nodes = await build(sim, 6)
        await sim.until(sim.converged, limit=5)
        next_index = 6
        for op in schedule:
            live = sim.live()
            if op[0] == "sleep":
                await trio.sleep(op[1])
            elif op[0] == "join":
                newcomer = await sim.start(next_index)
                next_index += 1
                await newcomer.m.join(live[op[1] % len(live)].address)
            elif len(live) > 2:  # keep a quorum of two to talk to each other
                node = live[op[1] % len(live)]
                if op[0] == "kill":
                    sim.kill(node)
                    killed.add(node.id)
                elif op[0] == "leave":
                    await node.m.leave()
                    sim.kill(node)
                    departed.add(node.id)
                else:
                    sim.net.partition([node.address], [n.address for n in live if n is not node])
                    await trio.sleep(op[2])
                    sim.net.heal()

        def truth() -> bool:
            if not sim.converged():
                return False
            for member in sim.live()[0].m.view.members:
                expected = (MemberState.DEAD if member.node_id in killed else
                            MemberState.LEAVING if member.node_id in departed else MemberState.ALIVE)
                if member.state is not expected:
                    return False
            return True

        # Bound: detection (probe round + 5 s suspicion) and, after an isolation long enough to be declared dead,
        # a reconnect try (5-15 s) and the refutations it starts.
        sim.net.break_probability = 0
        await sim.until(truth, limit=60)
        assert {m.node_id for m in sim.live()[0].m.view.members} >= {n.id for n in sim.live()}
        del nodes

    run_sim(seed, body, delay=0.01, jitter=0.03, break_probability=0.002)


# --- real TCP --------------------------------------------------------------------------------------------------


async def test_three_nodes_over_loopback_tcp_and_a_wrong_secret_kept_out() -> None:
    fast = MembershipConfig(probe_interval=0.2, probe_timeout=0.1, suspicion_timeout=1.0, gossip_interval=0.05)

    def make(index: int, secret: bytes) -> Membership:
        return Membership(node_id=f"tcp-{index}", weight=5, secret=secret, transport=TcpTransport("127.0.0.1:0"),
                          rng=random.Random(index), config=fast)

    nodes = [make(i, SECRET) for i in range(3)]
    intruder = make(9, b"not the cluster secret at all!!")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for node in [*nodes, intruder]:
                await nursery.start(node.run)
            assert nodes[0].address.startswith("127.0.0.1:") and not nodes[0].address.endswith(":0")
            await nodes[1].join(nodes[0].address)
            await nodes[2].join(nodes[1].address)
            for _ in range(200):
                if all(len(n.view.members) == 3 and n.view == nodes[0].view for n in nodes):
                    break
                await trio.sleep(0.02)
            assert all(n.view == nodes[0].view for n in nodes)
            assert [m.node_id for m in nodes[0].view.members] == ["tcp-0", "tcp-1", "tcp-2"]
            with pytest.raises(LinkError, match="cannot join through .*handshake failed|refused"):
                await intruder.join(nodes[0].address)
            await trio.sleep(0.5)
            assert all(n.view.member("tcp-9") is None for n in nodes)
            await nodes[2].leave()
            for _ in range(200):
                if all(n.view.member("tcp-2").state is MemberState.LEAVING for n in nodes[:2]):
                    break
                await trio.sleep(0.02)
            assert all(n.view.member("tcp-2").state is MemberState.LEAVING for n in nodes[:2])
            nursery.cancel_scope.cancel()


# --- convergence figures (docs/cluster.md) ----------------------------------------------------------------------


def measure(count: int, seed: int) -> dict[str, float]:
    """Virtual seconds for a join, a graceful leave and a death to reach every node of a `count`-node cluster,
    from the moment the joiner calls join / the leaver calls leave / the victim is killed."""
    figures: dict[str, float] = {}

    async def spread(sim: Sim, node_id: str, state: MemberState, limit: float) -> float:
        start = trio.current_time()
        await sim.until(lambda: all(n.state_of(node_id) is state for n in sim.live()), limit=limit, step=0.005)
        return trio.current_time() - start

    async def body(sim: Sim) -> None:
        nodes = await build(sim, count)
        await sim.until(sim.converged, limit=60)
        await trio.sleep(5)
        newcomer = await sim.start(count)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(newcomer.m.join, nodes[count // 2].address)
            figures["join"] = await spread(sim, newcomer.id, MemberState.ALIVE, 60)
        await sim.until(sim.converged, limit=60)
        leaver = nodes[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(leaver.m.leave)
            figures["leave"] = await spread(sim, leaver.id, MemberState.LEAVING, 60)
        sim.kill(leaver)
        await sim.until(sim.converged, limit=60)
        victim = nodes[2]
        sim.kill(victim)
        figures["death"] = await spread(sim, victim.id, MemberState.DEAD, 120)

    run_sim(seed, body, delay=0.001, jitter=0.001)  # a LAN: 1-2 ms per message
    return figures


if __name__ == "__main__":
    sizes = [int(arg) for arg in sys.argv[1:]] or [4, 16, 64]
    for size in sizes:
        runs = [measure(size, seed) for seed in (1, 2, 3)]
        cells = ", ".join(f"{key} {min(r[key] for r in runs):.2f}-{max(r[key] for r in runs):.2f} s" for key in runs[0])
        print(f"N={size}: {cells}")
