"""Nodes that die for good lose no URL: whole-cluster simulations (tests/support/clustersim.py: real `Cluster`s
and real `Crawler`s over the in-memory network, in virtual time) with queued-URL replicas (`--replicas R`,
peer/cluster/replicas/queuereplicas.py).

- R = 1, permanent kills one at a time (each once the survivors declared it dead and re-homed their replicas):
  every reachable page is fetched, and only pages under way at a kill (or finished just before it, their
  release still on its way) are fetched twice.
- R = 2, two nodes killed at the same moment: the same.
- A 5 s partition that heals, with lost and duplicated messages: nothing lost, one fetcher per host.
- Schedules of permanent kills, joins and leaves (Hypothesis): those that found defects here, random ones by
  the hundred under the `search` marker (`pytest -m search tests/test_replicas_sim.py`; docs/cluster.md, "Whole-cluster simulations").

`pytest -s` prints each run's figures, among them the time from each death to the promotion of the dead
node's queue at its heirs and the time to restore R + 1 copies after each view change.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from ring import MemberState
from tests.support.clustersim import ClusterSim, SimNode, Web, make_web, run_simulation

pytestmark = pytest.mark.slow  # whole-cluster simulations, 10-20 s each

WEIGHTS = (150, 80, 200, 40, 120, 100, 90)
CONVERGE_LIMIT = 30.0
CRAWL_LIMIT = 400.0


def _run(seed: int, body) -> None:
    with tempfile.TemporaryDirectory(prefix="replicasim-") as tmp:
        run_simulation(lambda nursery: body(nursery, Path(tmp)), seed=seed)


async def _start_settled(sim: ClusterSim, web: Web, count: int) -> list[SimNode]:
    nodes = [await sim.start(0, WEIGHTS[0], seeds=web.seeds)]
    for index in range(1, count):
        nodes.append(await sim.start(index, WEIGHTS[index], join=nodes[sim.rng.randrange(len(nodes))]))
        await sim.until(sim.settled, limit=40.0)
    return nodes


def _dead_everywhere(sim: ClusterSim, nodes: list[SimNode]):
    def check() -> bool:
        for other in sim.running():
            for node in nodes:
                member = other.cluster.view.member(node.node_id)
                if member is None or member.state is not MemberState.DEAD:
                    return False
        return True

    return check


def _restored(sim: ClusterSim) -> bool:
    """Every running node holds the same ring and has re-homed its replicas under it."""
    return sim.settled() and all(n.cluster.backups.restored() for n in sim.running())


def _all_finished(sim: ClusterSim) -> bool:
    return all(n.cluster is not None and n.cluster.finished.is_set() for n in sim.running())


async def _kill_for_good(sim: ClusterSim, victims: list[SimNode], kills: list[tuple[float, str]]) -> dict:
    """Kill `victims` at the same moment, never to return; wait until the others hold them dead, their queues
    are promoted and every replica is re-homed. Returns the figures of this death."""
    at = trio.current_time()
    unreleased = set()
    for node in victims:
        unreleased |= node.cluster.backups.unreleased()
        node.scope.cancel()
    for node in victims:
        await sim.kill(node)
        kills.append((at, node.node_id))
    sim.unreleased_at_kills |= unreleased
    detected = await sim.until(_dead_everywhere(sim, victims), limit=CONVERGE_LIMIT, step=0.05)
    promoted = [t for n in sim.running() for (t, dead, _count) in n.cluster.promotions
                if dead in {v.node_id for v in victims} and t >= at]
    restored = await sim.until(lambda: _restored(sim), limit=CONVERGE_LIMIT, step=0.05)
    return {"dead_everywhere_s": detected, "promoted_s": max(promoted, default=at) - at,
            "restored_after_dead_s": restored}


def _in_flight_at_kills(sim: ClusterSim, kills: list[tuple[float, str]]) -> set[str]:
    """Pages a killed node had under way at its kill."""
    return {f.url for at, node in kills for f in sim.ledger.fetches
            if f.node == node and not f.robots and f.start <= at and (f.cut or f.end is None or f.end >= at)}


def _check(sim: ClusterSim, web: Web, expected: set[str], kills: list[tuple[float, str]], *,
           bound_duplicates: bool = True) -> dict:
    figures = sim.figures(expected)
    overlaps = sim.ledger.overlaps()
    assert not overlaps, f"{len(overlaps)} overlapping requests to one host, e.g. {overlaps[:2]}"
    assert figures["lost"] == 0, f"{figures['lost']} reachable pages never fetched: " \
                                 f"{sorted(expected - sim.ledger.fetched())[:5]}"
    assert figures["unexpected"] == 0
    assert figures["gap_breaks"] == 0, sim.ledger.gap_breaks(web.gap)[:3]
    # A killed node's pages come back from its replicas until their release reached its backups, which waits
    # for the links the page routed to be acknowledged by their owners: those pages (and those under way) are
    # the ones its heirs may fetch again, and no other.
    dups = set(sim.ledger.duplicates())
    in_flight = _in_flight_at_kills(sim, kills)
    allowed = in_flight | getattr(sim, "unreleased_at_kills", set())
    if bound_duplicates:
        extra = sorted(dups - allowed)[:3]
        detail = [(f.url, f.node, round(f.start, 3), f.end and round(f.end, 3), f.cut) for f in sim.ledger.fetches
                  if f.url in extra]
        assert dups <= allowed, f"fetched twice though not under way at a kill: {extra} {detail} kills {kills}"
    figures["unexplained_duplicates"] = len(dups - allowed)
    figures["in_flight_at_kills"] = len(in_flight)
    figures["unreleased_at_kills"] = len(allowed - in_flight)
    return figures


def _report(name: str, figures: dict) -> None:
    shown = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in figures.items() if isinstance(v, int | float))
    print(f"{name}: {shown}")


def _restore_figures(sim: ClusterSim) -> dict:
    times = [t for n in sim.nodes.values() if n.cluster for t in n.cluster.backups.restore_seconds]
    return {"restore_max_s": max(times, default=0.0), "restore_views": len(times)}


# Seeds 4 and 7 repeated pages the victim had fetched 13-17 s before its kill: its backup had been the arc's
# previous owner, and the drop that ended that hand-off took the marks of the pages released to it meanwhile.
# Seeds 25 and 32 lost pages when the first victim died under 2 s after a join (2% of the frames lost): in 32 its
# re-homing message to the joiner (the new backup of h153.sim) was lost and the old backup dropped its copies
# 1 s after the ring settled, before the re-send (2 s); in 25 the hand-off sent as seen a page whose release
# waited for its one link (h185.sim/p3, its batch lost), and the new owner discarded its own queued copy.
# The seeds without a story run with the search (`pytest -m search`): the same invariants on other schedules.
@pytest.mark.parametrize("seed", [*(pytest.param(seed, marks=pytest.mark.search) for seed in (1, 2, 4, 7, 27)),
                                  25, 32])
def test_permanent_kills_one_at_a_time_lose_no_url_with_one_replica(seed: int) -> None:
    web = make_web(seed, hosts=250)
    expected = web.reachable(web.seeds)
    out: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, break_probability=0.002, loss_probability=0.02,
                         duplicate_probability=0.02, replicas=1)
        sim.unreleased_at_kills = set()
        nodes = await _start_settled(sim, web, 6)
        kills: list[tuple[float, str]] = []
        await sim.at_pages(0.25, len(expected))
        first = await _kill_for_good(sim, [nodes[1]], kills)
        await sim.at_pages(0.5, len(expected))
        second = await _kill_for_good(sim, [nodes[4]], kills)
        sim.net.break_probability = sim.net.loss_probability = sim.net.duplicate_probability = 0.0
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        out.update(sim=sim, kills=kills, first=first, second=second)
        await sim.stop_all()

    _run(seed, body)
    sim = out["sim"]
    figures = _check(sim, web, expected, out["kills"])
    _report(f"R=1 two kills one at a time seed={seed}", figures | _restore_figures(sim)
            | {f"first_{k}": v for k, v in out["first"].items()} | {f"second_{k}": v for k, v in out["second"].items()})


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.search)])
def test_two_nodes_killed_at_once_lose_no_url_with_two_replicas(seed: int) -> None:
    web = make_web(seed + 10, hosts=250)
    expected = web.reachable(web.seeds)
    out: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, break_probability=0.002, replicas=2)
        sim.unreleased_at_kills = set()
        nodes = await _start_settled(sim, web, 6)
        kills: list[tuple[float, str]] = []
        await sim.at_pages(0.35, len(expected))
        out["death"] = await _kill_for_good(sim, [nodes[1], nodes[2]], kills)
        sim.net.break_probability = 0.0
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        out.update(sim=sim, kills=kills)
        await sim.stop_all()

    _run(seed, body)
    sim = out["sim"]
    figures = _check(sim, web, expected, out["kills"])
    _report(f"R=2 two killed at once seed={seed}", figures | _restore_figures(sim) | out["death"])


# Seed 42 broke four hosts' Crawl-delays after the heal: the split outlasts the suspicion timeout, and the node
# back from it fetched hosts the other side had crawled, before (or without waiting for) their hand-off back; then
# pages it had parked before the split, which the other side had fetched.
@pytest.mark.parametrize("seed", [*(pytest.param(seed, marks=pytest.mark.search) for seed in (1, 2)), 42])
def test_a_five_second_partition_that_heals_loses_nothing_and_keeps_one_fetcher_per_host(seed: int) -> None:
    web = make_web(seed + 20, hosts=250)
    expected = web.reachable(web.seeds)
    out: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, loss_probability=0.02, duplicate_probability=0.02,
                         replicas=1)
        nodes = await _start_settled(sim, web, 5)
        await sim.at_pages(0.3, len(expected))
        sim.unreleased_at_kills = set().union(*(n.cluster.backups.unreleased() for n in nodes))
        cut = trio.current_time()
        sim.net.partition([n.address for n in nodes[:2]], [n.address for n in nodes[2:]])
        sim.note("partition")
        await trio.sleep(5.0)
        sim.net.heal()
        # pages the minority fetched before it fenced itself: their releases could not reach the majority, which
        # may have declared it dead and promoted its replicas
        minority = {n.node_id for n in nodes[:2]}
        sim.unreleased_at_kills |= {f.url for f in sim.ledger.fetches if f.node in minority and f.end is not None and f.end >= cut}
        sim.note("healed")
        healed = trio.current_time()
        await sim.until(sim.converged, limit=CONVERGE_LIMIT, step=0.05)
        out["heal_to_converged"] = trio.current_time() - healed
        sim.net.loss_probability = sim.net.duplicate_probability = 0.0
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        out["sim"] = sim
        await sim.stop_all()

    _run(seed, body)
    sim = out["sim"]
    figures = _check(sim, web, expected, [])
    figures["fences"] = sum(n.cluster.fence.fences for n in sim.nodes.values())
    _report(f"5 s partition seed={seed}", figures | _restore_figures(sim) | {"heal": out["heal_to_converged"]})


# -- random schedules of permanent kills -----------------------------------------------------------------------

PERMANENT = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.floats(0.05, 0.8), st.integers(0, 99)),
        st.tuples(st.just("leave"), st.floats(0.05, 0.8), st.integers(0, 99)),
        st.tuples(st.just("kill"), st.floats(0.05, 0.8), st.integers(0, 99)),
    ),
    min_size=1,
    max_size=4,
)


def _permanent_schedule(operations: list[tuple], seed: int) -> None:
    """Joins, graceful leaves and permanent kills (one at a time: each once the previous view change has been
    re-homed) at any point of the crawl, with R = 1, over a network with delays, link breaks and 2% of the frames
    lost and 2% duplicated: no URL lost, one fetcher per host, duplicates only of what was in flight at a kill."""
    web = make_web(seed, hosts=150)
    expected = web.reachable(web.seeds)
    out: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, delay=0.01, jitter=0.03, break_probability=0.002,
                         loss_probability=0.02, duplicate_probability=0.02, replicas=1)
        sim.unreleased_at_kills = set()
        await _start_settled(sim, web, 4)
        kills: list[tuple[float, str]] = []
        next_index = 4
        for kind, share, pick in sorted(operations, key=lambda op: op[1]):
            await sim.at_pages(share, len(expected))
            await sim.until(lambda: _restored(sim), limit=CONVERGE_LIMIT, step=0.05)
            live = sim.running()
            node = live[pick % len(live)]
            if kind == "join":
                await sim.start(next_index, WEIGHTS[next_index % len(WEIGHTS)], join=node)
                next_index += 1
            elif len(live) <= 3:
                continue  # keep three nodes running
            elif kind == "leave":
                assert await sim.leave(node)
            else:
                await _kill_for_good(sim, [node], kills)
        sim.net.break_probability = sim.net.loss_probability = sim.net.duplicate_probability = 0.0
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        out.update(sim=sim, kills=kills)
        await sim.stop_all()

    _run(seed, body)
    # Duplicates are reported, not bounded here: a join that follows a death can repeat a few pages the hand-off
    # did not carry the seen keys of (docs/cluster.md, "Still open"), which is not what these schedules test.
    figures = _check(out["sim"], web, expected, out["kills"], bound_duplicates=False)
    _report(f"permanent schedule seed={seed} {operations}", figures | _restore_figures(out["sim"]))


# Schedules that pin defects (CHANGELOG.md, "Fixed"); random ones run with the search below.
@settings(phases=[Phase.explicit], deadline=None, database=None)
@given(operations=PERMANENT, seed=st.integers(0, 2**16))
# A joiner that dies 65 ms after acknowledging a hand-off chunk: a chunk's ack waits for its replicas, as a
# batch's does.
@example(operations=[("kill", 0.2, 3), ("join", 0.4, 1), ("kill", 0.6, 7)], seed=4242)
@example(operations=[("leave", 0.15, 2), ("kill", 0.3, 5), ("kill", 0.5, 1)], seed=977)
# A page's release reaching its own backup while the replica of a link it queued (whose arc has another backup)
# is stuck behind a lost message: a release waits for the replicas of the links its page queued here, as for
# those it routed; and the page's seen-key replica goes with its release, not before the link's replica.
@example(operations=[("kill", 0.25, 0)], seed=65535)
# A page waiting for the ack of a link routed to its own backup, which dies: a page whose release is held is
# re-homed to the new backup like a queued URL, before the owner's death.
@example(operations=[("join", 0.08784353332009495, 0), ("kill", 0.765625, 87), ("kill", 0.765625, 87)], seed=31527)
def test_any_schedule_of_permanent_kills_loses_no_url_with_one_replica(operations: list[tuple], seed: int) -> None:
    _permanent_schedule(operations, seed)


@pytest.mark.search
@pytest.mark.timeout(0)
@settings(max_examples=300, deadline=None, database=None)
@given(operations=PERMANENT, seed=st.integers(0, 2**16))
def test_search_schedules_of_permanent_kills(operations: list[tuple], seed: int) -> None:
    """The schedules above by the hundred, random each run (`pytest -m search`)."""
    _permanent_schedule(operations, seed)
