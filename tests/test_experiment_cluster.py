"""``peerctl experiment --mode cluster``: the design's experiment on real `Cluster` nodes (membership, dispatch,
hand-off) simulated in one process over the in-memory network, 20 nodes with a leave and a join."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from peerlab import experiment
from peerlab.experiment.cluster import _Run, inline_threads, run_cluster
from peerlab.experiment.live import ring_figures
from peerlab.experiment.report import summary
from peerlab.experiment.loopshare import in_run_loop
from peerlab.experiment.plan import parse_plan

PLAN = """
name = "cluster-20"
mode = "cluster"
seed = 3
points_per_weight = 50

[nodes]
A = 150
B = 80
C = 200
D = 40

[fleet]
count = 16

[web]
hosts = 3000
links_per_page = 10

[simulate]
pages_per_second = 40.0
samples_per_phase = 4

[[phase]]
name = "C removed"
at = 12.0
remove = ["C"]

[[phase]]
name = "E added"
at = 20.0
add = { E = 300 }

[end]
at = 30.0
"""


@pytest.mark.slow
def test_the_design_experiment_runs_on_a_simulated_cluster_and_its_tables_add_up(tmp_path: Path) -> None:
    plan = parse_plan(PLAN)
    result = run_cluster(plan, workdir=tmp_path)
    assert result.mode == "cluster" and len(result.phases) == 3 and len(result.changes) == 2
    first, second, third = result.phases
    assert len(first.weights) == 20 and "C" in first.weights and "E" not in first.weights
    assert "C" not in second.weights and "E" not in second.weights and len(second.weights) == 19
    assert "C" not in third.weights and "E" in third.weights and len(third.weights) == 20
    # The run's own cross-checks found nothing: every node's ring gave the experiment's key shares, and no
    # receiver counted fewer URLs from a sender than that sender counted to it.
    assert not [note for note in result.notes if note.startswith(("phase ", "change "))], result.notes
    # Each settle says when every view held the new members, and when the hand-off was done (never before).
    for k, change in enumerate(result.changes, 1):
        [settle] = [note for note in result.notes if note.startswith(f"settle of change {k}:")]
        views, done = map(float, re.search(r"members ([\d.]+) virtual s .* done at ([\d.]+)", settle).groups())
        assert 0 <= views <= done == pytest.approx(change.settle_seconds, abs=0.05)
    for phase in result.phases:
        assert phase.pages > 0 and phase.total_sent > 0
        # The samples of a phase add up to its matrix, sender by sender and receiver by receiver.
        samples = [s for s in result.samples if s.phase == phase.index]
        for node, total in phase.row_totals().items():
            assert sum(s.sent_by.get(node, 0) for s in samples) == total
        for node, total in phase.column_totals().items():
            assert sum(s.received_by.get(node, 0) for s in samples) == total
        # A node sends nothing to itself, and every named node of the phase sent and received URLs.
        n = len(phase.weights)
        assert all(phase.sent[i * n + i] == 0 for i in range(n))
        for node in ("A", "B", "D"):
            assert phase.row_totals()[node] > 0 and phase.column_totals()[node] > 0
    assert third.column_totals()["E"] > 0
    leave, join = result.changes
    # C's leave handed its queue to the nodes that stay, never to itself; the join moved URLs to E only, the
    # hosts it gained coming from the nodes that lost arcs to it.
    assert leave.urls_moved > 0 and all(receiver in second.weights for _, receiver in leave.by_pair)
    assert join.urls_moved > 0 and set(join.by_pair) == {("", "E")}
    for change in (leave, join):
        assert change.hosts_moved > 0
        assert abs(change.moved_keyspace - change.ideal_keyspace) <= 0.05 * change.ideal_keyspace
        # Its hand-off ran between the leaver (or the joiner) and the nodes that took (or gave) arcs, one transfer
        # each way and no other pair: at most 2 x 19 ordered pairs, a few messages per node.
        cost = change.cost
        assert cost is not None and cost.nodes == (20 if change is leave else 19)
        assert 0 < cost.handoff_pairs <= 2 * 19 and 0 < cost.handoff_messages <= 8 * cost.nodes
        # Counted per pair: every pair has the leaver (or the joiner) at one end and shares a moved arc with it.
        mover = "C" if change is leave else "E"
        assert sum(cost.handoff_by_pair.values()) == cost.handoff_messages
        assert len(cost.handoff_by_pair) == cost.handoff_pairs
        assert all(mover in pair for pair in cost.handoff_by_pair), cost.handoff_by_pair
        assert cost.handoff_stray == 0 and cost.handoff_pairs <= 2 * (cost.changed_nodes - 1)
        assert cost.messages > cost.handoff_messages and cost.bytes > 0 and cost.cpu_seconds > 0
        assert cost.phase_messages > 0 and cost.phase_cpu > 0
        # of the CPU, trio's run loop's part (sampled): a share of it, never more
        assert 0 <= cost.loop_cpu_seconds <= cost.cpu_seconds and 0 <= cost.phase_loop_cpu <= cost.phase_cpu
        # what the nodes wrote, by kind: every byte in one kind, the hand-off's chunks among them
        assert 0.99 * cost.bytes <= sum(size for _, size in cost.sent_by_kind.values()) <= cost.bytes
        assert cost.sent_by_kind["HandoffChunk"][0] > 0 and cost.sent_by_kind["UrlBatch"][0] > 0
        assert cost.phase_sent_by_kind["UrlBatch"][0] > 0
        # what the connections dialled meanwhile were opened for: the hand-off's first chunks among them
        assert cost.dialled_for and all(n > 0 for n in cost.dialled_for.values())
    assert "what each view change cost, per node" in experiment.format_report(result)
    assert f"{leave.name}: sent per node by kind" in experiment.format_report(result)
    [summary_leave, _] = summary(result)["changes"]
    assert summary_leave["cost"]["sent_by_kind"]["HandoffChunk"] == list(leave.cost.sent_by_kind["HandoffChunk"])
    # Each node's status counts its open links: at most one per peer.
    [links] = [note for note in result.notes if note.startswith("links per node at the end")]
    most, peers = re.search(r"most (\d+) \(of (\d+) peers\)", links).groups()
    assert 1 <= int(most) <= int(peers) == 19
    # The report prints the design's table for the named nodes of a fleet too large for the whole matrix.
    text = experiment.format_report(result)
    assert "the design's table for the named nodes (A, B, C, D) and the other 16 nodes as one (others)" in text
    assert "the design's table for the named nodes (A, B, D, E) and the other 16 nodes as one (others)" in text


def test_cluster_mode_is_a_plan_mode_and_checks_its_settings() -> None:
    plan = parse_plan(PLAN.replace('mode = "cluster"', 'mode = "simulate"'), overrides={
        "mode": '"cluster"', "cluster.time_scale": "0.05"})
    assert plan.mode == "cluster" and plan.cluster.time_scale == 0.05
    with pytest.raises(experiment.PlanError, match="cluster.settle_wait"):
        parse_plan(PLAN, overrides={"cluster.settle_wait": "0"})
    assert parse_plan(PLAN).cluster.seeds == 64  # the first node's seed hosts, unless a series scales them
    assert parse_plan(PLAN, overrides={"cluster.seeds": "640"}).cluster.seeds == 640
    with pytest.raises(experiment.PlanError, match="cluster.seeds"):
        parse_plan(PLAN, overrides={"cluster.seeds": "0"})
    with pytest.raises(experiment.PlanError, match="a simulation has no crawl to finish"):
        parse_plan(PLAN.replace("at = 30.0", "when_done = true"))


def test_a_change_counts_hand_off_messages_per_pair_and_those_between_nodes_sharing_no_moved_arc() -> None:
    plan = parse_plan(PLAN, overrides={"web.hosts": "200"})
    figures = ring_figures(plan, [f"h{i}.test" for i in range(200)])
    leave, join = figures.moved_pairs
    # C's arcs go from C to the nodes that stay; E's come to E from the nodes that had them: C or E in every pair.
    assert leave and all(previous == "C" and new != "C" for previous, new in leave)
    assert join and all(new == "E" and previous != "E" for previous, new in join)
    run = _Run(plan, Path("unused"), lambda _line: None)
    before = run.traffic()
    taker = next(iter(leave))[1]
    other = next(node for node in plan.stage_weights()[1] if node != taker)
    run.handoff_pairs.update({("C", taker): 3, (taker, "C"): 2, (other, taker): 1})
    cost = run.cost(before, 20, 1.5, (before, 10.0), leave)
    assert cost.handoff_messages == 6 and cost.handoff_pairs == 3
    assert cost.handoff_by_pair == {("C", taker): 3, (taker, "C"): 2, (other, taker): 1}
    assert cost.handoff_stray == 1  # two nodes that stay share no moved arc: only C's arcs moved
    assert cost.changed_nodes == len({node for pair in leave for node in pair})
    # The pairs the run counted before the change are not the change's.
    cost = run.cost(run.traffic(), 20, 1.5, (before, 10.0), leave)
    assert cost.handoff_messages == 0 and cost.handoff_pairs == 0 and cost.handoff_stray == 0


async def test_the_converged_start_gives_every_node_the_records_it_holds_so_no_view_changes(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # Each node's own record in the whole view is the one it announces (address, weight and zone): none corrects
    # it, so no record is gossiped and no node's view changes (a correction of each record at every node made the
    # start cost n view changes per node).
    plan = parse_plan(PLAN, overrides={"fleet.count": "4", "web.hosts": "200"})
    run = _Run(plan, tmp_path, lambda _line: None)
    with inline_threads():
        async with trio.open_nursery() as nursery:
            await run.start_converged(nursery, plan.stage_weights()[0])
            given = {node.node_id: node.cluster.view for node in run.nodes.values()}
            changes = {node.node_id: node.cluster.view_changes for node in run.nodes.values()}
            await trio.sleep(5.0)
            for node in run.nodes.values():
                assert node.cluster.membership.view.members == given[node.node_id].members
                assert node.cluster.view_changes == changes[node.node_id], node.node_id
                assert not node.cluster.membership._broadcast, node.node_id
                assert node.cluster.links.received_kinds.get("Ping", 0) > 0  # the nodes did talk meanwhile
            await run.stop_all()  # at once: no node dials one that stopped before it
            assert not run.running() and all(node.stopped.is_set() for node in run.nodes.values())
            assert not run.net._links and not run.net._links_of  # every connection of every node is gone
            nursery.cancel_scope.cancel()


def test_a_cpu_sample_is_the_run_loops_only_when_every_frame_up_to_it_is_trios() -> None:
    # a function named and filed as trio's run loop stands for it: what it runs itself is the loop's, what it
    # runs of ours (a task) is the task's, and a frame outside any trio.run is nobody's
    scope: dict[str, object] = {}
    exec(compile("def unrolled_run(step):\n    return step()\n", "/lib/site-packages/trio/_core/_run.py", "exec"),
         scope)
    run_loop = scope["unrolled_run"]
    assert run_loop(lambda: in_run_loop(sys._getframe(1))) is True  # type: ignore[operator]

    def task() -> bool | None:
        return in_run_loop(sys._getframe())

    assert run_loop(task) is False  # type: ignore[operator]
    assert in_run_loop(sys._getframe()) is None
    seen: list[bool | None] = []

    async def main() -> None:
        seen.append(in_run_loop(sys._getframe()))

    trio.run(main)
    assert seen == [False]
