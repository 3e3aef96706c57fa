"""The partition fence (peer/cluster/core/fence.py) under trio's MockClock: who was heard from, and when, decides
whether a node may start a fetch and whether an inherited arc is still held."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from peer.cluster.core.fence import CONTACT_TICK, CONTACT_WINDOW, TAKEOVER_GRACE, PartitionFence
from ring import Member, MemberState, View

SUSPICION = 5.0
PROBE = 1.0


def _view(*states: tuple[str, MemberState]) -> View:
    return View(epoch=1, members=tuple(Member(node_id=n, address=f"127.0.0.1:{7400 + i}", weight=100, state=s)
                                       for i, (n, s) in enumerate(states)))


def _fence(view: View, heard: dict[str, float]) -> PartitionFence:
    return PartitionFence("a", view=lambda: view, last_heard=heard, suspicion_timeout=SUSPICION,
                          probe_interval=PROBE)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def _run(clock: trio.testing.MockClock, body) -> None:
    trio.run(body, clock=clock)


def test_a_node_that_hears_from_no_majority_is_fenced_and_holds_after_the_heal(clock) -> None:
    alive = MemberState.ALIVE
    view = _view(("a", alive), ("b", alive), ("c", alive))
    heard: dict[str, float] = {}
    seen: dict[str, object] = {}

    async def body() -> None:
        fence = _fence(view, heard)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fence.contact_loop)

            async def chatter(until: float) -> None:  # b and c are heard from every tick until `until`
                while trio.current_time() < until:
                    heard["b"] = heard["c"] = trio.current_time()
                    await trio.sleep(CONTACT_TICK / 2)

            await chatter(3.0)
            seen["before"] = fence.fenced()
            await trio.sleep(CONTACT_WINDOW + 1.0)  # silence: a partition
            seen["cut"] = fence.fenced()
            seen["fences"] = fence.fences
            nursery.start_soon(chatter, math.inf)  # the partition heals
            await trio.sleep(1.0)
            seen["healed_soon"] = fence.fenced()
            await trio.sleep(fence.hold_seconds + 0.5)
            seen["healed_later"] = fence.fenced()
            nursery.cancel_scope.cancel()

    _run(clock, body)
    assert seen == {"before": False, "cut": True, "fences": 1, "healed_soon": True, "healed_later": False}


def test_one_silent_peer_of_three_does_not_fence(clock) -> None:
    alive = MemberState.ALIVE
    view = _view(("a", alive), ("b", alive), ("c", alive))
    heard: dict[str, float] = {}
    seen: list[bool] = []

    async def body() -> None:
        fence = _fence(view, heard)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fence.contact_loop)
            for _ in range(80):  # 10 s: b talks, c is silent
                heard["b"] = trio.current_time()
                await trio.sleep(CONTACT_TICK / 2)
                seen.append(fence.fenced())
            nursery.cancel_scope.cancel()

    _run(clock, body)
    assert not any(seen) and len(seen) == 80


def test_a_frozen_node_holds_as_if_it_had_been_declared_dead(clock) -> None:
    alive = MemberState.ALIVE
    view = _view(("a", alive), ("b", alive))
    heard: dict[str, float] = {}
    seen: dict[str, bool] = {}

    async def body() -> None:
        fence = _fence(view, heard)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fence.contact_loop)
            heard["b"] = trio.current_time()
            await trio.sleep(CONTACT_TICK * 2)
            # the whole process stalls (SIGSTOP): the loop runs nothing while the clock moves on
            clock.jump(SUSPICION + PROBE + 1.0)
            heard["b"] = trio.current_time()
            seen["at_once"] = fence.fenced()  # no tick since the stall: nothing is known
            for _ in range(int((fence.hold_seconds - 1.0) / CONTACT_TICK)):
                heard["b"] = trio.current_time()
                await trio.sleep(CONTACT_TICK)
            seen["in_hold"] = fence.fenced()
            for _ in range(int(3.0 / CONTACT_TICK)):
                heard["b"] = trio.current_time()
                await trio.sleep(CONTACT_TICK)
            seen["after"] = fence.fenced()
            nursery.cancel_scope.cancel()

    _run(clock, body)
    assert seen == {"at_once": True, "in_hold": True, "after": False}


def test_an_inherited_arc_is_held_until_its_dead_owner_would_have_fenced_itself(clock) -> None:
    alive, dead = MemberState.ALIVE, MemberState.DEAD
    view = _view(("a", alive), ("b", alive), ("d", dead))
    seen: dict[str, object] = {}

    async def body() -> None:
        heard = {"d": 10.0}
        await trio.sleep(12.0)  # d was last heard from at 10; declared dead at 12
        fence = _fence(view, heard)
        arcs = range(100, 200)
        seen["until"] = fence.inherit("d", arcs)
        seen["held"] = (fence.held(150), fence.held(250))
        await trio.sleep(10.0 + CONTACT_WINDOW + TAKEOVER_GRACE - 12.0 + 0.01)
        seen["past_fence"] = fence.held(150)  # a host with no known timer waits TAKEOVER_GRACE more
        await trio.sleep(TAKEOVER_GRACE)
        seen["released"] = fence.held(150)
        seen["past"] = fence.inherit("d", arcs)  # an old death: no hold at all
        seen["past_held"] = fence.held(150)

    _run(clock, body)
    assert seen == {"until": 10.0 + CONTACT_WINDOW + TAKEOVER_GRACE, "held": (True, False), "past_fence": True,
                    "released": False,
                    "past": 10.0 + CONTACT_WINDOW + TAKEOVER_GRACE, "past_held": False}


def _fence_times(clock: trio.testing.MockClock, proof_until: float | None) -> list[float]:
    """When a 5-member node fences itself: b-e are heard from every tick until 10 s, then silent; a proof of contact
    is renewed every 0.5 s until `proof_until` (None: no proof at all)."""
    alive = MemberState.ALIVE
    view = _view(*((n, alive) for n in "abcde"))
    heard: dict[str, float] = {}
    proof = [-math.inf]
    fenced_at: list[float] = []

    async def body() -> None:
        fence = PartitionFence("a", view=lambda: view, last_heard=heard, suspicion_timeout=SUSPICION,
                               probe_interval=PROBE, majority_heard=lambda: proof[0])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fence.contact_loop)
            start = trio.current_time()
            while trio.current_time() - start < 30.0:
                now = trio.current_time() - start
                if now < 10.0:
                    heard.update(dict.fromkeys("bcde", trio.current_time()))
                if proof_until is not None and now < proof_until:
                    proof[0] = trio.current_time()
                await trio.sleep(CONTACT_TICK / 2)
                if fence.fences > len(fenced_at):
                    fenced_at.append(round(trio.current_time() - start, 3))
            nursery.cancel_scope.cancel()

    _run(clock, body)
    return fenced_at


def test_a_proof_of_contact_puts_the_count_off_without_changing_what_it_finds() -> None:
    """While a fresh proof of contact keeps the fence off, the members' silences are counted only now and then; the
    moment the proof runs out, the count finds each member as silent as a tick-by-tick count would: the fence
    comes CONTACT_WINDOW after the last proof, not CONTACT_WINDOW later still."""
    without = _fence_times(trio.testing.MockClock(autojump_threshold=0), None)
    assert len(without) == 1 and 10.0 + CONTACT_WINDOW <= without[0] <= 10.0 + CONTACT_WINDOW + 2 * CONTACT_TICK
    proven = _fence_times(trio.testing.MockClock(autojump_threshold=0), 20.0)
    assert len(proven) == 1 and 20.0 + CONTACT_WINDOW - 0.5 <= proven[0] <= 20.0 + CONTACT_WINDOW + 2 * CONTACT_TICK
