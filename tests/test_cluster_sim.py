"""Whole-cluster simulations: 5-6 weighted `Cluster` nodes with real LMDB stores crawl a synthetic web of a few
hundred hosts over the in-memory network (delays, jitter, random link breaks, partitions, lost and duplicated
messages) in virtual time, while nodes join, leave, are killed and restarted. Every request goes in one ledger,
on which the invariants are checked: one node at a time per host, nothing lost, views and rings converge, the
crawl ends everywhere and only once nothing is left anywhere.

Scenarios: churn (joins, a graceful leave, a kill with and without a restart, a split that heals, link breaks);
5% of the frames lost and 5% duplicated through a join, a graceful leave and a split; random fault schedules
with 2% lost and 2% duplicated (Hypothesis); termination over delays and link breaks (Hypothesis); URLs routed
under a stale view. The tests of views that reach nodes in a different order, and of the lossy runs, pinned
defects these simulations found in peer/ (fixed: transfers serialised per peer with an empty one to every owner
of a new ring, a transfer waits for arcs still arriving and for fetches of its peer's hosts, a joining node
computes its gains against the cluster's ring without it, progress rounds compare rings, a leaving node declares
nobody dead).

The helpers are in tests/support/clustersim.py (why `trio.to_thread` runs inline there: see its docstring).
Runs are repeatable: fixed seeds, Hypothesis derandomized, trio's scheduler seeded. `pytest -s` prints each
run's figures; run as a script (`python -m tests.test_cluster_sim [seed ...]`) it prints the churn runs'.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.cluster.membership.membership import to_wire
from peer.config import DEFAULTS
from peer.crawl.settings import CrawlSettings
from protocol import Gossip, UrlBatch, UrlEntry
from ring import MemberState
from tests.support.clustersim import ClusterSim, SimNode, Web, make_web, run_simulation
from tests.test_membership import CONFIG as MEMBERSHIP_CONFIG
from tests.test_membership import Sim as MembershipSim
from tests.test_membership import build as build_members
from tests.test_membership import run_sim as run_members

pytestmark = pytest.mark.slow  # whole-cluster simulations

WEIGHTS = (150, 80, 200, 40, 120, 100)
#: After the faults stop: SWIM settles in a few probe rounds; a restarted node's refutation spreads by gossip.
CONVERGE_LIMIT = 30.0
#: From the last request's end to `finished` on every node: two progress rounds of 1 s see every node idle with
#: unchanged activity, the others conclude at their next round on hearing it; the rest is message delay.
FINISH_BOUND = 5.0
#: No crawl here needs more than this (virtual seconds); the 30 s hand-off wait can stall part of it once.
CRAWL_LIMIT = 400.0


def _run(seed: int, body: Callable[[trio.Nursery, Path], object]) -> None:
    with tempfile.TemporaryDirectory(prefix="clustersim-") as tmp:
        run_simulation(lambda nursery: body(nursery, Path(tmp)), seed=seed)


def _dead_everywhere(sim: ClusterSim, node: SimNode) -> Callable[[], bool]:
    def check() -> bool:
        for other in sim.running():
            member = other.cluster.view.member(node.node_id) if other.cluster else None
            if member is None or member.state is not MemberState.DEAD:
                return False
        return True

    return check


def _all_finished(sim: ClusterSim) -> bool:
    return all(n.cluster is not None and n.cluster.finished.is_set() for n in sim.running())


async def _start_settled(sim: ClusterSim, web: Web, count: int) -> list[SimNode]:
    """The first node seeds the crawl; the others join one at a time, each once the ring has settled."""
    nodes = [await sim.start(0, WEIGHTS[0], seeds=web.seeds)]
    for index in range(1, count):
        nodes.append(await sim.start(index, WEIGHTS[index], join=nodes[sim.rng.randrange(len(nodes))]))
        await sim.until(sim.settled, limit=40.0)
    return nodes


def _check_termination(sim: ClusterSim, faults_end: float = 0.0, bound: float = FINISH_BOUND) -> dict[str, float]:
    """Every running node concluded, within FINISH_BOUND of the last request's end (or of the end of the faults,
    if later: a dead peer holds every round up until it is declared dead), and at the moment each one did, no
    running node held a queued or in-flight URL, an unacknowledged batch or chunk, or a request under way; and no
    request started after the first conclusion."""
    last = max(sim.ledger.last_end(), faults_end)
    running = {n.node_id for n in sim.running()}
    concluded = {snap.node for snap in sim.finishes}
    assert running <= concluded, f"never concluded: {sorted(running - concluded)}"
    for snap in sim.finishes:
        busy = [state for state in snap.states if not state.empty]
        assert not busy, f"{snap.node} concluded at {snap.at:.2f} while {busy}"
        assert snap.at - last <= bound, f"{snap.node} concluded {snap.at - last:.2f} s after the last fetch"
    first = min(snap.at for snap in sim.finishes)
    late = [f for f in sim.ledger.fetches if f.start >= first]
    assert not late, f"requests after the crawl was concluded finished: {late[:3]}"
    return {"finish_first": first - last, "finish_last": max(s.at for s in sim.finishes) - last}


def _check_one_fetcher_per_host(sim: ClusterSim) -> None:
    overlaps = sim.ledger.overlaps()
    assert not overlaps, f"{len(overlaps)} overlapping requests to one host, e.g. {overlaps[:2]}"


def _lost_within_dead_nodes_state(web: Web, expected: set[str], fetched: set[str], held: set[str]) -> set[str]:
    """The lost URLs that are NOT explained by a dead node's store: reachable from what it held at the kill
    (queued, in flight, routed and unacknowledged) through lost pages only. Must be empty."""
    lost = expected - fetched
    todo = list(held & lost)
    explained: set[str] = set()
    while todo:
        url = todo.pop()
        if url in explained:
            continue
        explained.add(url)
        todo.extend(link for link in web.links[url] if link in lost and link not in explained)
    return lost - explained


# -- scenario 1: churn under faults ----------------------------------------------------------------------------


async def churn(sim: ClusterSim, web: Web, expected: set[str], *, restart: bool) -> dict:
    """Five nodes join one by one; at 15% of the pages a sixth joins, at 30% one leaves gracefully, at 45% one is
    killed, at 55% the cluster is split in two for 2 s (under the suspicion timeout) and heals; the killed node
    is restarted on its store once everyone holds it dead (if `restart`). Then the link breaks stop."""
    total = len(expected)
    a, b, c, d, e = await _start_settled(sim, web, 5)
    await sim.at_pages(0.15, total)
    f = await sim.start(5, WEIGHTS[5], join=d)
    await sim.at_pages(0.30, total)
    assert await sim.leave(c), "the leaving node did not hand everything off"
    assert sim.held(c) == set(), "the node that left still holds URLs"
    await sim.at_pages(0.45, total)
    await sim.kill(b)
    killed = trio.current_time()
    await sim.at_pages(0.55, total)
    sim.net.partition([a.address, d.address], [e.address, f.address])
    sim.note("partition {a,d} | {e,f}")
    await trio.sleep(2.0)
    sim.net.heal()
    sim.note("healed")
    held = set() if restart else sim.held(b)
    # Converged: the same view and ring everywhere, the split refuted, the killed node DEAD everywhere.
    healed = trio.current_time()
    await sim.until(sim.converged, limit=CONVERGE_LIMIT, step=0.05)
    out = {"held": held, "kill_to_converged": trio.current_time() - killed,
           "heal_to_converged": trio.current_time() - healed}
    if restart:
        await sim.restart(b, a)
    sim.net.break_probability = 0.0
    out["faults_end"] = trio.current_time()
    sim.note("faults stop")
    out["converge"] = await sim.until(sim.converged, limit=CONVERGE_LIMIT, step=0.05)
    await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
    return out


def _churn_run(seed: int, *, restart: bool, time_scale: float = 1.0) -> tuple[ClusterSim, Web, set[str], dict]:
    web = make_web(seed, time_scale=time_scale)
    expected = web.reachable(web.seeds)
    out: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, delay=0.01, jitter=0.02, break_probability=0.002)
        out.update(await churn(sim, web, expected, restart=restart))
        out["sim"] = sim
        await sim.stop_all()

    _run(seed, body)
    return out["sim"], web, expected, out


def _report(name: str, figures: dict) -> None:
    """One line of figures (shown with `pytest -s`)."""
    shown = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in figures.items() if isinstance(v, int | float))
    print(f"{name}: {shown}")


# Seed 2, a second schedule with no defect story, runs with the search (`pytest -m search`).
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.search)])
def test_churn_with_a_restart_loses_nothing_and_never_fetches_a_host_twice_at_once(seed: int) -> None:
    sim, web, expected, out = _churn_run(seed, restart=True)
    figures = sim.figures(expected)
    _check_one_fetcher_per_host(sim)
    assert figures["lost"] == 0, f"{figures['lost']} reachable pages never fetched"
    assert figures["unexpected"] == 0
    # A node restarted from its data dir holds the hosts it regains until the hand-off from their interim owner
    # has brought their timers: no break of a host's gap, its first seconds back included.
    assert sim.ledger.gap_breaks(web.gap) == [], sim.ledger.gap_breaks(web.gap)[:3]
    assert figures["link_breaks"] > 0 and figures["requests_cut"] > 0  # the faults did happen
    assert out["converge"] <= CONVERGE_LIMIT
    figures.update(_check_termination(sim, out["faults_end"]))
    # A death costs duplicates (its hosts' new owners lack its seen-set), never more than one extra fetch a page.
    assert max(sim.ledger.pages().values()) <= 2
    _report(f"churn seed={seed} restart", figures | {k: v for k, v in out.items() if k != "held"})


def test_churn_with_a_node_dead_for_good_loses_only_what_it_held() -> None:
    sim, web, expected, out = _churn_run(3, restart=False)
    figures = sim.figures(expected)
    _check_one_fetcher_per_host(sim)
    unexplained = _lost_within_dead_nodes_state(web, expected, sim.ledger.fetched(), out["held"])
    assert not unexplained, f"lost without being held by the dead node: {sorted(unexplained)[:5]}"
    assert figures["unexpected"] == 0
    assert max(sim.ledger.pages().values()) <= 2
    figures.update(_check_termination(sim, out["faults_end"]))
    _report("churn seed=3 dead for good", figures | {"held_by_dead_node": len(out["held"])}
            | {k: v for k, v in out.items() if k != "held"})


# -- scenario 2: messages lost and duplicated ------------------------------------------------------------------

#: Each frame after the handshake is lost with this probability, and delivered twice with the same again.
MESSAGE_FAULTS = 0.05
#: Progress rounds need every report of two rounds in a row: with 5% of frames lost, a round of four peers
#: (eight frames) completes about two times in three, so concluding can take a few rounds more than without loss.
LOSSY_FINISH_BOUND = 15.0


async def lossy(sim: ClusterSim, web: Web, expected: set[str]) -> dict:
    """Four nodes join one by one; then the network loses and duplicates MESSAGE_FAULTS of the frames each way;
    at 15% of the pages a fifth node joins, at 30% one leaves gracefully, at 50% the cluster is split in two for
    2 s and heals. The faults last until every node has concluded the crawl, then stop."""
    total = len(expected)
    a, b, c, d = await _start_settled(sim, web, 4)
    sim.net.loss_probability = sim.net.duplicate_probability = MESSAGE_FAULTS
    sim.note("messages lost and duplicated")
    await sim.at_pages(0.15, total)
    e = await sim.start(4, WEIGHTS[4], join=b)
    await sim.at_pages(0.30, total)
    assert await sim.leave(c), "the leaving node did not hand everything off"
    assert sim.held(c) == set(), "the node that left still holds URLs"
    await sim.at_pages(0.50, total)
    sim.net.partition([a.address, b.address], [d.address, e.address])
    sim.note("partition {a,b} | {d,e}")
    await trio.sleep(2.0)
    sim.net.heal()
    sim.note("healed")
    await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
    sim.net.loss_probability = sim.net.duplicate_probability = 0.0
    sim.note("faults stop")
    return {"converge": await sim.until(sim.converged, limit=CONVERGE_LIMIT, step=0.05)}


# Seed 2, a second schedule with no defect story, runs with the search (`pytest -m search`).
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.search)])
def test_lost_and_duplicated_messages_lose_no_url_and_never_fetch_a_host_twice_at_once(seed: int) -> None:
    web = make_web(seed, hosts=300, max_pages=10)
    expected = web.reachable(web.seeds)
    out: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, delay=0.01, jitter=0.02)
        out.update(await lossy(sim, web, expected))
        out["sim"] = sim
        await sim.stop_all()

    _run(seed, body)
    sim = out["sim"]
    figures = sim.figures(expected)
    assert figures["messages_lost"] > 100 and figures["messages_duplicated"] > 100  # the faults did happen
    _check_one_fetcher_per_host(sim)
    assert figures["lost"] == 0, f"{figures['lost']} reachable pages never fetched"
    assert figures["unexpected"] == 0
    assert figures["gap_breaks"] == 0, sim.ledger.gap_breaks(web.gap)[:3]
    assert figures["handoff_waits_expired"] == 0, "gained arcs waited the whole hand-off wait"
    # nothing died: a duplicate fetch could only come from state that missed its new owner
    assert figures["extra_fetches"] == 0, sorted(sim.ledger.duplicates())[:5]
    figures.update(_check_termination(sim, bound=LOSSY_FINISH_BOUND))
    _report(f"lossy seed={seed}", figures | {"converge": out["converge"]})


def test_a_leaving_node_declares_nobody_dead_on_a_rumour_it_cannot_see_refuted() -> None:
    """The defect the lossy runs found, pinned at the membership layer: a leaving node still hands off over its
    links, but no longer probes and nobody gossips to it, so a suspicion it hears is never refuted there. It
    keeps the member SUSPECT (still an owner) instead of declaring it dead on its own timer (which cancelled its
    transfer to a live node); a DEAD record from the members that stay still counts."""

    async def body(msim: MembershipSim) -> None:
        nodes = await build_members(msim, 5)
        await msim.until(msim.converged, limit=5)
        leaver, rumoured, teller = nodes[4], nodes[2], nodes[0]
        await leaver.m.leave(close_links=False)
        record = rumoured.m.view.member(rumoured.id)
        assert record is not None
        suspect = replace(record, state=MemberState.SUSPECT)
        teller.m.links.send_nowait(leaver.id, Gossip(epoch=0, full=False, members=(to_wire(suspect),)))
        await msim.until(lambda: leaver.state_of(rumoured.id) is MemberState.SUSPECT, limit=2)
        await trio.sleep(3 * MEMBERSHIP_CONFIG.suspicion_timeout)
        assert leaver.state_of(rumoured.id) is MemberState.SUSPECT
        assert rumoured.id in leaver.m.view.owner_weights()  # its arcs are still its own here
        dead = replace(record, state=MemberState.DEAD)
        teller.m.links.send_nowait(leaver.id, Gossip(epoch=0, full=False, members=(to_wire(dead),)))
        await msim.until(lambda: leaver.state_of(rumoured.id) is MemberState.DEAD, limit=2)

    run_members(12, body)


# -- random fault schedules ------------------------------------------------------------------------------------

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("join"), st.floats(0.05, 0.8), st.integers(0, 99)),
        st.tuples(st.just("leave"), st.floats(0.05, 0.8), st.integers(0, 99)),
        st.tuples(st.just("kill"), st.floats(0.05, 0.8), st.integers(0, 99)),
        st.tuples(st.just("split"), st.floats(0.05, 0.8), st.integers(0, 99)),
    ),
    min_size=2,
    max_size=4,
)


@settings(max_examples=3, deadline=None, derandomize=True, database=None)
@given(operations=OPERATIONS, seed=st.integers(0, 2**16))
def test_any_fault_schedule_keeps_one_fetcher_per_host_and_loses_nothing(operations: list[tuple], seed: int) -> None:
    """Joins, graceful leaves, kills (each node restarted on its store once declared dead) and splits shorter than
    the suspicion timeout, at any point of the crawl, over a network with delays, link breaks, and 2% of the
    frames lost and 2% duplicated throughout."""
    _fault_schedule(operations, seed)


@pytest.mark.search
@pytest.mark.timeout(0)
@settings(max_examples=300, deadline=None, database=None)
@given(operations=OPERATIONS, seed=st.integers(0, 2**16))
def test_search_fault_schedules(operations: list[tuple], seed: int) -> None:
    """The schedules above by the hundred, random each run (`pytest -m search`)."""
    _fault_schedule(operations, seed)


@pytest.mark.parametrize(("seed", "operations"), [
    (3876, [("leave", 0.325, 89), ("kill", 0.115, 84), ("join", 0.634, 66), ("split", 0.328, 93)]),
    (7705, [("leave", 0.783, 80), ("split", 0.217, 83), ("join", 0.346, 73), ("kill", 0.545, 54)]),
])
def test_a_transfer_releases_no_host_its_sender_is_fetching(seed: int, operations: list[tuple]) -> None:
    """Schedules that found a defect (fixed in peer/cluster/handoff/handoff.py): a node that restarts and another that leaves at
    once. The leaver, fetching a host whose arc the restarted node waited for from it, sent its content to a
    third node (its view did not hold the restarted node yet), then an empty transfer labelled with the new ring
    to the restarted node, which released every arc it waited for from the leaver, and fetched that host while
    the leaver's request was under way. A transfer now waits while a fetch is in flight here of any host the
    ring it hands off to gives its peer."""
    _fault_schedule(operations, seed)


def _fault_schedule(operations: list[tuple], seed: int) -> None:
    web = make_web(seed, hosts=150)
    expected = web.reachable(web.seeds)
    result: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, delay=0.01, jitter=0.03, break_probability=0.002,
                         loss_probability=0.02, duplicate_probability=0.02)
        await _start_settled(sim, web, 4)
        next_index = 4
        for kind, share, pick in sorted(operations, key=lambda op: op[1]):
            await sim.at_pages(share, len(expected))
            live = sim.running()
            node = live[pick % len(live)]
            if kind == "join":
                await sim.start(next_index, WEIGHTS[next_index % len(WEIGHTS)], join=node)
                next_index += 1
            elif len(live) <= 3:
                continue  # keep three nodes running
            elif kind == "leave":
                assert await sim.leave(node)
            elif kind == "kill":
                await sim.kill(node)
                await sim.until(_dead_everywhere(sim, node), limit=30.0)
                await sim.restart(node, next(n for n in sim.running() if n is not node))
            else:
                sim.net.partition([n.address for n in live[:2]], [n.address for n in live[2:]])
                await trio.sleep(1.5)
                sim.net.heal()
        sim.net.break_probability = sim.net.loss_probability = sim.net.duplicate_probability = 0.0
        result["faults_end"] = trio.current_time()
        result["converge"] = await sim.until(sim.converged, limit=CONVERGE_LIMIT, step=0.05)
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        result["sim"] = sim
        await sim.stop_all()

    _run(seed, body)
    sim = result["sim"]
    _check_one_fetcher_per_host(sim)
    assert sim.ledger.fetched() == expected
    # Frames were lost until faults_end: a batch or ack lost just before it is sent again only after the
    # dispatcher's resend_after (5 s), and until then its sender is not idle, so the 5 s bound of the loss-free
    # scenarios cannot hold here (it missed by 0.1-1.9 s in a few schedules); the lossy scenario's bound does.
    figures = sim.figures(expected) | _check_termination(sim, result["faults_end"], LOSSY_FINISH_BOUND)
    _report(f"schedule seed={seed} {operations}", figures | {"converge": result["converge"]})


# -- scenario 3: termination -----------------------------------------------------------------------------------


@settings(max_examples=4, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 2**16),
    nodes=st.integers(3, 6),
    delay=st.sampled_from([0.001, 0.02, 0.1]),
    breaks=st.sampled_from([0.0, 0.003]),
)
def test_the_crawl_is_concluded_everywhere_soon_after_the_last_fetch_and_never_early(
    seed: int, nodes: int, delay: float, breaks: float
) -> None:
    """Delays and link breaks keep batches and chunks in transit after their page was fetched: no node may
    conclude while any node still has something queued, in flight, unacknowledged or under way. (Delays stay
    within SWIM's LAN profile: a round trip under the 0.5 s probe timeout; see the slow-network test below.)"""
    web = make_web(seed, hosts=60, island_hosts=0)
    expected = web.reachable(web.seeds)
    result: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, delay=delay, jitter=delay, break_probability=breaks)
        await _start_settled(sim, web, nodes)
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        result["sim"] = sim
        await sim.stop_all()

    _run(seed, body)
    sim = result["sim"]
    assert sim.ledger.fetched() == expected
    figures = _check_termination(sim)
    _report(f"termination seed={seed} nodes={nodes} delay={delay} breaks={breaks}", figures)


# -- scenario 4: a stale view ----------------------------------------------------------------------------------


def test_urls_routed_under_a_stale_view_are_forwarded_to_their_owner() -> None:
    """Four nodes crawl; a fifth joins. A sender that still holds the ring from before the join routes the home
    pages of island hosts (nothing links to them) that the join moved, with that ring: the batches reach nodes
    that no longer own those hosts, which forward them (durably, then ack). Every injected page, and everything
    reachable from it, is fetched, by its owner."""
    seed = 5
    web = make_web(seed, island_hosts=60)
    roots = sorted(url for url in web.island if url.endswith(".sim/"))
    result: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, delay=0.01, jitter=0.02)
        nodes = await _start_settled(sim, web, 4)
        stale = nodes[0].cluster.ring
        stale_epoch = nodes[0].cluster.epoch
        newcomer = await sim.start(4, WEIGHTS[4], join=nodes[1])
        await sim.until(sim.settled, limit=40.0)
        ring = newcomer.cluster.ring
        moved: dict[str, list[str]] = defaultdict(list)  # previous owner -> home pages of hosts the join moved
        for url in roots:
            host = url.split("/")[2]
            if stale.owner(host) != ring.owner(host):
                moved[stale.owner(host)].append(url)
        # The stale sender: the node that lost fewest of them (it would queue its own, not send them).
        sender = min(nodes, key=lambda n: (len(moved.get(n.node_id, ())), n.node_id))
        groups = {old: urls for old, urls in moved.items() if old != sender.node_id}
        misrouted = sum(len(urls) for urls in groups.values())
        assert misrouted >= 3, "the join moved too few island hosts for the test to mean anything"
        forwarded_before = {n: sim.nodes[n].cluster.dispatcher.stats.urls_forwarded for n in groups}
        acks = sender.cluster.dispatcher.stats.acks_unmatched  # the sender's dispatcher never sent these
        for k, (old, urls) in enumerate(sorted(groups.items())):
            batch = UrlBatch(seq=(1 << 40) + k, sender=sender.node_id, epoch=stale_epoch,
                             urls=tuple(UrlEntry(url=u, depth=0, found_on=None, hops=0) for u in urls))
            assert sender.cluster.links.send_nowait(old, batch)
        assert not any(n.cluster.finished.is_set() for n in sim.running()), "the crawl ended before the test began"
        await sim.until(lambda: sender.cluster.dispatcher.stats.acks_unmatched - acks == len(groups), limit=10.0)
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        result.update(sim=sim, ring=ring, groups=groups, misrouted=misrouted, forwarded_before=forwarded_before)
        await sim.stop_all()

    _run(seed, body)
    sim, ring, groups = result["sim"], result["ring"], result["groups"]
    injected = [url for urls in groups.values() for url in urls]
    forwarded = sum(sim.nodes[n].cluster.dispatcher.stats.urls_forwarded - before
                    for n, before in result["forwarded_before"].items())
    assert forwarded >= result["misrouted"]
    fetched = sim.ledger.fetched()
    assert web.reachable(injected) <= fetched, "an injected page (or one reachable from it) was dropped"
    for fetch in sim.ledger.fetches:
        if fetch.url in injected:
            assert fetch.node == ring.owner(fetch.host), f"{fetch.url} fetched by {fetch.node}, not its owner"
    assert web.reachable(web.seeds) | web.reachable(injected) == fetched
    _check_one_fetcher_per_host(sim)
    figures = _check_termination(sim)
    _report("stale view", figures | {"misrouted": result["misrouted"], "forwarded": forwarded})


# -- views that reach nodes in a different order (defects these simulations found, now fixed) ------------------


@pytest.mark.parametrize("gap", [0.0, 0.1])
def test_a_join_and_a_leave_at_once_keep_crawl_delays_and_stall_no_host(gap: float) -> None:
    seed = 1
    web = make_web(seed, hosts=120)
    expected = web.reachable(web.seeds)
    result: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        # With seen-key replicas on (their traffic shifts every later random draw of the network) this run found
        # a Crawl-delay broken at gap 0.1: the leaver's politeness states reached a node that no longer owned
        # the hosts and were dropped there, and the leaver's "nothing more" released the joiner before they
        # could arrive. Both fixed (peer/cluster/replicas/seenreplicas.py passes states on; peer/cluster/handoff/handoff.py orders transfers by ring).
        sim = ClusterSim(nursery, tmp, web, seed=seed)
        nodes = await _start_settled(sim, web, 4)
        await sim.at_pages(0.2, len(expected))

        async def leave() -> None:
            await trio.sleep(gap)
            await sim.leave(nodes[2])

        nursery.start_soon(leave)
        await sim.start(4, WEIGHTS[4], join=nodes[1])
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        result["sim"] = sim
        await sim.stop_all()

    _run(seed, body)
    sim = result["sim"]
    figures = sim.figures(expected)
    _report(f"join and leave {gap} s apart", figures)
    _check_one_fetcher_per_host(sim)
    assert figures["lost"] == 0
    assert figures["handoff_waits_expired"] == 0, "gained arcs waited the whole hand-off wait"
    assert figures["gap_breaks"] == 0, sim.ledger.gap_breaks(web.gap)[:3]


@pytest.mark.parametrize("seed", [4, 5])  # without the partial gossip, both (and seeds 1-8) pass
def test_a_restarted_node_that_hears_a_partial_view_first_waits_for_every_previous_owner(seed: int) -> None:
    web = make_web(seed, hosts=200)
    expected = web.reachable(web.seeds)
    result: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed)
        nodes = await _start_settled(sim, web, 5)
        victim, seed_node, gossiper = nodes[1], nodes[0], nodes[3]
        await sim.at_pages(0.2, len(expected))
        await sim.kill(victim)
        await sim.until(sim.converged, limit=CONVERGE_LIMIT, step=0.05)  # the others crawl its hosts now
        await sim.at_pages(0.35, len(expected))

        async def partial_gossip() -> None:
            # What `gossiper`'s gossip loop sends once it hears the victim is back: the records that changed,
            # here its own and one other member's, not the whole view.
            view = gossiper.cluster.view
            members = tuple(to_wire(view.member(n)) for n in (gossiper.node_id, nodes[4].node_id))
            gossip = Gossip(epoch=view.epoch, full=False, members=members)
            assert gossiper.cluster.links.send_nowait(victim.node_id, gossip, address=victim.address)
            await sim.until(lambda: victim.cluster.view.member(gossiper.node_id) is not None, limit=5.0, step=0.01)

        await sim.restart(victim, seed_node, before_join=partial_gossip)
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        result["sim"] = sim
        await sim.stop_all()

    _run(seed, body)
    sim = result["sim"]
    figures = sim.figures(expected)
    _report(f"partial view at restart seed={seed}", figures)
    assert figures["lost"] == 0
    assert figures["gap_breaks"] == 0, sim.ledger.gap_breaks(web.gap)[:3]
    _check_one_fetcher_per_host(sim)


def test_the_crawl_is_concluded_soon_over_a_slow_network() -> None:
    """Round trips of 0.6-1.2 s: with SWIM's LAN timeouts nodes would be suspected and refute without end. An
    operator on such a network raises the probe timeouts (--probe-interval/--probe-timeout); the progress rounds
    compare rings, not view epochs, so refutations (which bump epochs) do not hold the conclusion back."""
    seed = 973
    web = make_web(seed, hosts=60, island_hosts=0)
    result: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        # Without seen-key replicas: the memory network draws each write's delay afresh and keeps order, so ten
        # more writes a second per link hold the progress reports behind slow draws (1.8 s over this bound).
        sim = ClusterSim(nursery, tmp, web, seed=seed, delay=0.3, jitter=0.3, replicate=False,
                         settings={"probe_interval": 3.0, "probe_timeout": 2.0, "suspicion_timeout": 8.0})
        await _start_settled(sim, web, 3)
        await sim.until(lambda: _all_finished(sim), limit=CRAWL_LIMIT, step=0.5)
        result["sim"] = sim
        await sim.stop_all()

    _run(seed, body)
    sim = result["sim"]
    assert sim.ledger.fetched() == web.reachable(web.seeds)
    # two progress rounds, each a second apart plus answers that take up to 1.2 s here, and the last report;
    # and the last batches' acks, which wait for their receiver's next sync, one per sync_interval
    _check_termination(sim, bound=FINISH_BOUND + 3 * 1.2 + DEFAULTS["sync_interval"])


# -- figures ---------------------------------------------------------------------------------------------------


def main(seeds: list[int]) -> None:
    """Print the figures of the churn runs (with and without a restart) for `seeds`."""
    logging.basicConfig(level=logging.CRITICAL)  # the runs' warnings are expected: links reset, waits expire
    for restart in (True, False):
        for seed in seeds:
            started = time.perf_counter()
            sim, web, expected, out = _churn_run(seed, restart=restart)
            figures = sim.figures(expected) | {k: v for k, v in out.items() if k != "held"}
            try:
                figures.update(_check_termination(sim, out["faults_end"]))
            except AssertionError as exc:
                print(f"  termination: {exc}")
            if not restart:
                unexplained = _lost_within_dead_nodes_state(web, expected, sim.ledger.fetched(), out["held"])
                figures.update(held_by_dead_node=len(out["held"]), lost_unexplained=len(unexplained))
            figures["real_seconds"] = time.perf_counter() - started
            _report(f"restart={restart} seed={seed}", figures)
            for at, what in sim.events:
                print(f"    {at:7.2f} {what}")


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [1, 2, 3])


@pytest.mark.parametrize("seed", [6, 8, 14])
def test_crawl_settings_converge_over_a_lossy_network_and_reach_a_node_that_joins_later(seed: int) -> None:
    """Two different changes made at the same moment on two nodes, over a network that loses and duplicates a
    fifth of the messages: every node ends up crawling by the same record (the higher rank), and a node that
    joins afterwards gets it at the view change that admits it."""
    # Seeds 8 and 14 failed a join: the joiner sent its view to the seed once per 5 s attempt, and the draws lost
    # it three times in a row (the first join of seed 8). A joiner now sends it again every second of an attempt.
    web = make_web(seed, hosts=40, max_pages=3)
    out: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, delay=0.01, jitter=0.02, loss_probability=0.2,
                         duplicate_probability=0.1)
        nodes = await _start_settled(sim, web, 4)
        base = nodes[0].crawler.settings
        a = base.changed({"exclude": ["/a/"]}, version=base.version + 1, origin=nodes[1].node_id)
        b = base.changed({"max_depth": 2}, version=base.version + 1, origin=nodes[2].node_id)
        for node, record in ((nodes[1], a), (nodes[2], b)):
            assert node.crawler.adopt(record)
            node.cluster.share_settings()
        winner = max(a, b, key=CrawlSettings.rank)
        began = trio.current_time()
        await sim.until(lambda: all(n.crawler.settings == winner for n in sim.running()), limit=30.0)
        out["converged"] = trio.current_time() - began
        joiner = await sim.start(4, 100, join=nodes[0])
        began = trio.current_time()
        await sim.until(lambda: joiner.crawler.settings == winner, limit=30.0)
        out["joined"] = trio.current_time() - began
        out["winner"] = winner
        out["nodes"] = {n.node_id: n.crawler.settings for n in sim.running()}
        await sim.stop_all()

    _run(seed, body)
    assert set(out["nodes"].values()) == {out["winner"]}
    # the repeat every 5 s covers what the loss took; a joiner hears it at its first view change
    assert out["converged"] <= 11.0 and out["joined"] <= 6.0, out
    _report("settings", {"converged_s": round(out["converged"], 2), "joiner_s": round(out["joined"], 2)})


@pytest.mark.parametrize("late", ["joins", "restarts"])
def test_a_pause_holds_for_a_node_that_joins_or_restarts_after_it(late: str, monkeypatch) -> None:
    """The crawl is paused on one node (`POST /pause`: adopted, then shared) while it runs; once every node
    holds the pause and no request is under way, no node starts a request again: neither a node that joins
    afterwards (with its configuration as a joiner's record, version 0, as `peerd --join` starts), its seeds
    queued at once, nor a node killed before the pause and restarted after it, its queue on disk."""
    seed = 3
    web = make_web(seed, hosts=80)
    expected = web.reachable(web.seeds)
    build = SimNode.build

    def build_as_peerd(node: SimNode) -> None:  # every node but the first starts as a joiner does
        build(node)
        if node.index:
            assert node.crawler is not None
            node.crawler.settings = CrawlSettings.from_config(node.crawler.cfg, origin=node.node_id, joining=True)

    monkeypatch.setattr(SimNode, "build", build_as_peerd)
    out: dict = {}

    async def body(nursery: trio.Nursery, tmp: Path) -> None:
        sim = ClusterSim(nursery, tmp, web, seed=seed, delay=0.05, jitter=0.05)
        nodes = await _start_settled(sim, web, 3)
        await sim.at_pages(0.2, len(expected))
        if late == "restarts":
            await sim.kill(nodes[1])
        first = nodes[0].crawler
        paused = first.settings.changed({"paused": True}, version=first.settings.version + 1,
                                        origin=nodes[0].node_id)
        assert first.adopt(paused)
        nodes[0].cluster.share_settings()
        await sim.until(lambda: all(n.crawler.settings == paused and n.crawler.active == 0 for n in sim.running()),
                        limit=10.0)
        idle = trio.current_time()
        if late == "joins":
            node = await sim.start(3, WEIGHTS[3], join=nodes[0], seeds=web.seeds)
        else:
            node = nodes[1]
            await sim.restart(node, nodes[0])
        await sim.until(sim.settled, limit=40.0)
        await trio.sleep(10.0)  # two rounds of the settings gossip
        out.update(node=node, requests=[f for f in sim.ledger.fetches if f.start >= idle],
                   queued=len(node.store.frontier), settings=node.crawler.settings, paused=paused)
        await sim.stop_all()

    _run(seed, body)
    assert out["settings"] == out["paused"]
    assert out["queued"] > 0  # it had work it could have started
    assert out["requests"] == [], out["requests"][:3]
