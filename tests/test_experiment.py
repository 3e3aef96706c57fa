"""The ring-rebalance experiment (``peerlab/experiment``): plans, the ratio arithmetic and its deviation split,
the simulation, the report files, and ``peerctl experiment`` end to end."""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
from pathlib import Path

import pytest

import ring
from peerlab import experiment
from peerlab.experiment import report as report_mod
from peerlab.experiment.plan import PlanError, load_plan, parse_plan, to_toml
from peerlab.experiment.results import (
    PhaseResult,
    cells,
    node_deviations,
    ratio,
    receiver_expected_shares,
)
from peerlab.experiment.simulate import phase_boundaries, run_simulation
from peerlab.experiment.synthweb import zipf_sampler

SMALL = """
name = "small"
seed = 7
points_per_weight = 20

[nodes]
A = 150
B = 80
C = 200
D = 40

[web]
hosts = 4000
links_per_page = 10
internal_links = 0.5
popularity = 1.0

[simulate]
pages_per_second = 10.0
samples_per_phase = 5

[[phase]]
at = 60.0
remove = ["C"]

[[phase]]
name = "E joins"
after_pages = 900
add = { E = 300 }

[end]
at = 150.0
"""


def small(**overrides: str):
    return parse_plan(SMALL, label="small.toml", overrides=overrides or None)


# --------------------------------------------------------------------------- plans


def test_bundled_design_plan_is_the_design_experiment() -> None:
    plan, label = load_plan("design")
    assert label == "design (bundled)"
    assert plan.nodes == (("A", 150), ("B", 80), ("C", 200), ("D", 40))
    assert plan.stage_weights() == [{"A": 150, "B": 80, "C": 200, "D": 40}, {"A": 150, "B": 80, "D": 40},
                                    {"A": 150, "B": 80, "D": 40, "E": 300}]
    assert [(p.at, p.remove, p.add) for p in plan.phases] == [(600.0, ("C",), ()), (780.0, (), (("E", 300),))]
    assert plan.end.at == 3600.0 and plan.mode == "simulate"
    assert plan.points_per_weight == ring.DEFAULT_POINTS_PER_WEIGHT
    live, _ = load_plan("live-small")
    assert live.mode == "live" and live.web.popularity == 0.0 and live.stage_weights() == plan.stage_weights()
    wide, _ = load_plan("live-wide")  # the same experiment on ten times the hosts
    assert wide.mode == "live" and wide.stage_weights() == plan.stage_weights()
    assert wide.web.hosts == 10 * live.web.hosts and wide.web.popularity == 0.0


@pytest.mark.parametrize("source", ["design", "live-small", "live-wide", "demo", SMALL])
def test_plan_round_trips_through_toml(source: str) -> None:
    plan = load_plan(source)[0] if source in experiment.BUNDLED_PLANS else parse_plan(source)
    again = parse_plan(to_toml(plan))
    assert again == plan


def test_phase_names_triggers_and_kill() -> None:
    plan = parse_plan(SMALL.replace('remove = ["C"]', 'kill = "C"'))
    assert plan.phase_names() == ["start", "kill C", "E joins"]
    assert plan.phases[0].kill == ("C",) and plan.phases[0].remove == ()
    assert plan.phases[1].after_pages == 900 and plan.phases[1].at is None


def test_overrides_set_any_key_with_toml_values() -> None:
    plan = small(**{"web.hosts": "123", "mode": "live", "nodes.A": "7", "fleet.count": "3"})
    assert plan.web.hosts == 123 and plan.mode == "live"
    assert plan.initial_weights()["A"] == 7
    assert [n for n in plan.initial_weights() if n.startswith("n")] == ["n0001", "n0002", "n0003"]
    with pytest.raises(PlanError, match=r"^plan small.toml: --set web.hosts.x: web.hosts is not a table$"):
        small(**{"web.hosts.x": "1"})


def test_fleet_weights_are_drawn_from_the_seed_within_bounds() -> None:
    plan = small(**{"fleet.count": "50", "fleet.weight_min": "5", "fleet.weight_max": "9"})
    fleet = {n: w for n, w in plan.initial_weights().items() if n.startswith("n")}
    assert len(fleet) == 50 and all(5 <= w <= 9 for w in fleet.values())
    assert len(set(fleet.values())) > 1
    assert small(**{"fleet.count": "50", "fleet.weight_min": "5", "fleet.weight_max": "9"}).initial_weights() == \
        plan.initial_weights()
    other = small(**{"fleet.count": "50", "fleet.weight_min": "5", "fleet.weight_max": "9", "seed": "8"})
    assert other.initial_weights() != plan.initial_weights()


BAD_PLANS = [
    ("name = 'x'\n[nodes]\nA = 1\n[end]\nat = 1.0\n[web]\nhostz = 5", "web.hostz: unknown key"),
    ("name = 'x'\n[nodes]\nA = 'heavy'\n[end]\nat = 1.0", "nodes.A: expected an integer, got str 'heavy'"),
    ("name = 'x'\n[nodes]\nA = 0\n[end]\nat = 1.0", "nodes.A: must be >= 1, got 0"),
    ("name = 'x'\n[nodes]\nA = true\n[end]\nat = 1.0", "nodes.A: expected an integer, got a boolean (true)"),
    ("[nodes]\nA = 1\n[end]\nat = 1.0", "name: missing"),
    ("name = 'a b'\n[nodes]\nA = 1\n[end]\nat = 1.0", "name: 1-64 letters"),
    ("name = 'x'\nmode = 'fast'\n[nodes]\nA = 1\n[end]\nat = 1.0", "mode: must be one of simulate, cluster, live"),
    ("name = 'x'\n[end]\nat = 1.0", "nodes: the initial cluster is empty"),
    ("name = 'x'\n[nodes]\nA = 1", "end: missing"),
    ("name = 'x'\n[nodes]\nA = 1\n[end]\nwhen_done = true", "end: a simulation has no crawl to finish"),
    ("name = 'x'\n[nodes]\nA = 1\n[end]\nat = 1.0\nafter_pages = 5", "end: give exactly one trigger"),
    ("name = 'x'\n[nodes]\nA = 1\nB = 1\n[[phase]]\nremove = ['B']\n[end]\nat = 9.0",
     "phase[1]: give exactly one trigger"),
    ("name = 'x'\n[nodes]\nA = 1\n[[phase]]\nat = 1.0\n[end]\nat = 9.0", "phase[1]: a phase starts with a change"),
    ("name = 'x'\n[nodes]\nA = 1\nB = 1\n[[phase]]\nat = 1.0\nremove = ['Z']\n[end]\nat = 9.0",
     "phase[1].remove: node 'Z' is not in the cluster at that point"),
    (("name = 'x'\n[nodes]\nA = 1\nB = 1\n[[phase]]\nat = 1.0\nremove = ['B']\n[[phase]]\nat = 2.0\n"
      "kill = ['B']\n[end]\nat = 9.0"), "phase[2].kill: node 'B' is not in the cluster at that point"),
    ("name = 'x'\n[nodes]\nA = 1\nB = 1\n[[phase]]\nat = 1.0\nadd = { B = 3 }\n[end]\nat = 9.0",
     "phase[1].add: node id 'B' was used before"),
    ("name = 'x'\n[nodes]\nA = 1\n[[phase]]\nat = 1.0\nkill = ['A']\n[end]\nat = 9.0",
     "phase[1]: this change leaves no node in the cluster"),
    ("name = 'x'\n[nodes]\nA = 1\nB = 1\n[[phase]]\nat = 5.0\nremove = ['B']\n[end]\nat = 5.0",
     "end.at: must be later than phase[1].at = 5"),
    ("name = 'x'\n[nodes]\nA = 1\n[web]\ninternal_links = 1.5\n[end]\nat = 1.0", "web.internal_links: must be <= 1"),
    ("name = 'x'\n[nodes]\nA = 1\n[web]\npopularity = -1\n[end]\nat = 1.0", "web.popularity: must be >= 0"),
    ("name = 'x'\n[nodes]\nA = 1\n[dispatch]\ncodec = 'xml'\n[end]\nat = 1.0", "dispatch.codec: must be one of"),
    ("name = 'x'\n[nodes]\nA = 1\n[simulate]\npages_per_second = 0\n[end]\nat = 1.0",
     "simulate.pages_per_second: must be > 0"),
    ("name = 'x'\n[nodes]\n'A B' = 1\n[end]\nat = 1.0", "nodes: node ids are 1-64 letters"),
    ("name = 'x'\n[nodes]\nn0001 = 1\n[fleet]\ncount = 2\n[end]\nat = 1.0",
     "fleet.prefix: generated node id 'n0001' is also in [nodes]"),
    ("name = 'x'\n[nodes]\nA = 1\n[fleet]\nweight_min = 9\nweight_max = 3\n[end]\nat = 1.0",
     "fleet.weight_max: must be >= fleet.weight_min (9)"),
    ("name = 'x'\nphase = 3\n[nodes]\nA = 1\n[end]\nat = 1.0", "phase: expected [[phase]] tables, got int 3"),
    ("name = 'x\n", "not valid TOML"),
    ("name = 'x'\n[nodes]\nA = 15000\nB = 10000\n[end]\nat = 1.0",
     ("points_per_weight: the largest ring would hold 25,000,000 points (total weight 25,000 x 1000), over the "
      "ring's limit of 20,000,000; use points_per_weight <= 800")),
]


@pytest.mark.parametrize(("text", "message"), BAD_PLANS)
def test_bad_plans_fail_with_one_line_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_plan(text, label="bad.toml")
    error = str(info.value)
    assert "\n" not in error
    assert error.startswith("plan bad.toml: ")
    assert message in error


def test_missing_plan_file_names_the_bundled_plans(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"cannot read it .*bundled plans are: design, live-small, live-wide, demo"):
        load_plan(tmp_path / "nope.toml")


def test_triggers_of_both_kinds_must_still_increase_in_pages() -> None:
    plan = small()  # 60 s at 10 pages/s = page 600, then after 900 pages, end at 150 s = page 1500
    assert phase_boundaries(plan) == [0, 600, 900, 1500]
    late = small(**{"simulate.pages_per_second": "20"})  # 60 s is page 1200: after the 900-page change
    with pytest.raises(PlanError, match=r"phase\[2\]: after 900 pages does not come after .* \(page 1,200\)"):
        phase_boundaries(late)


# --------------------------------------------------------------------------- arithmetic


def test_expected_ratio_is_the_receivers_weight_over_what_the_sender_does_not_own() -> None:
    weights = {"A": 150, "B": 80, "C": 200, "D": 40}
    assert ratio(weights, "A", "B") == pytest.approx(80 / (80 + 200 + 40))
    assert [ratio(weights, "A", j) for j in "BCD"] == pytest.approx([0.25, 0.625, 0.125])
    # the design's row for D: 1 : 0.53 : 1.33 (A : B : C)
    row = [ratio(weights, "D", j) for j in "ABC"]
    assert [round(v / row[0], 2) for v in row] == [1.0, 0.53, 1.33]
    for i in weights:
        assert sum(ratio(weights, i, j) for j in weights if j != i) == pytest.approx(1.0)
    # shares work the same as weights
    shares = {k: v / 470 for k, v in weights.items()}
    assert ratio(shares, "B", "C") == pytest.approx(ratio(weights, "B", "C"))


def test_receiver_expected_shares_match_the_sum_over_senders() -> None:
    weights = {"A": 150, "B": 80, "D": 40, "E": 300}
    sent_by = {"A": 1000, "B": 300, "D": 50, "E": 2000}
    shares = receiver_expected_shares(weights, sent_by)
    total = sum(sent_by.values())
    for j in weights:
        brute = sum(sent_by[i] * ratio(weights, i, j) for i in weights if i != j) / total
        assert shares[j] == pytest.approx(brute)
    assert sum(shares.values()) == pytest.approx(1.0)


def _phase(sent: dict[tuple[str, str], int], weights: dict[str, int], key: dict[str, float],
           hosts: dict[str, float], popularity: dict[str, float] | None = None) -> PhaseResult:
    return PhaseResult(index=0, name="t", start=0.0, end=1.0, pages=1, weights=weights, key_shares=key,
                       host_shares=hosts, popularity_shares=popularity,
                       sent=PhaseResult.matrix(list(weights), sent))


def test_deviation_split_on_a_constructed_case() -> None:
    # Two senders' worth of URLs on a 3-node ring whose key space is exactly the weights (no key-space error),
    # whose hosts are split exactly by key space (no host-count error), and whose measured URLs follow a
    # popularity that favours C: the whole deviation is popularity.
    weights = {"A": 1, "B": 1, "C": 2}
    shares = {"A": 0.25, "B": 0.25, "C": 0.5}
    sent = {("A", "B"): 200, ("A", "C"): 800, ("B", "A"): 300, ("B", "C"): 700, ("C", "A"): 500, ("C", "B"): 500}
    phase = _phase(sent, weights, key=shares, hosts=shares)
    by_node = {d.node: d for d in node_deviations(phase)}
    c = by_node["C"]
    assert c.received == 1500 and c.expected == pytest.approx(1000 * 2 / 3 * 2)
    assert c.key_part == pytest.approx(0.0) and c.host_part == pytest.approx(0.0)
    assert c.popularity_part == pytest.approx(c.deviation) == pytest.approx(1500 / (4000 / 3) - 1)
    cell = next(x for x in cells(phase) if (x.sender, x.receiver) == ("A", "C"))
    assert cell.measured == 0.8 and cell.expected == pytest.approx(2 / 3)
    assert cell.deviation == pytest.approx(0.8 / (2 / 3) - 1) and cell.key_part == pytest.approx(0.0)

    # Now the ring is off (C owns 60% of the key space) and the hosts follow it exactly: key-space error only,
    # and the parts multiply to the total.
    key = {"A": 0.2, "B": 0.2, "C": 0.6}
    sent_ring = {("A", "B"): 250, ("A", "C"): 750, ("B", "A"): 250, ("B", "C"): 750, ("C", "A"): 500,
                 ("C", "B"): 500}
    phase = _phase(sent_ring, weights, key=key, hosts=key)
    for d in node_deviations(phase):
        assert d.popularity_part == pytest.approx(0.0, abs=1e-12) and d.host_part == pytest.approx(0.0, abs=1e-12)
        assert d.key_part == pytest.approx(d.deviation)
    for x in cells(phase):
        assert (1 + x.key_part) * (1 + x.host_part) * (1 + x.popularity_part) == pytest.approx(1 + x.deviation)


def test_zipf_sampler_draws_the_exact_distribution() -> None:
    n, draws = 12, 120_000
    for exponent in (0.0, 0.7, 1.0, 2.0):
        sample = zipf_sampler(n, exponent, random.Random(3))
        counts = [0] * n
        for _ in range(draws):
            counts[sample()] += 1
        weights = [(i + 1) ** -exponent for i in range(n)]
        total = sum(weights)
        chi2 = sum((counts[i] - draws * w / total) ** 2 / (draws * w / total) for i, w in enumerate(weights))
        assert chi2 < 45, (exponent, chi2, counts)  # 11 degrees of freedom: p < 1e-5 for a correct sampler
    big = zipf_sampler(10_000_000, 1.0, random.Random(1))
    values = [big() for _ in range(2000)]
    assert min(values) == 0 and max(values) < 10_000_000 and max(values) > 100_000


# --------------------------------------------------------------------------- simulation


@pytest.fixture(scope="module")
def small_result():
    return run_simulation(small())


def test_simulation_is_deterministic_with_the_plan_seed(small_result) -> None:
    again = run_simulation(small())
    assert [p.sent for p in again.phases] == [p.sent for p in small_result.phases]
    assert again.samples == small_result.samples and again.changes == small_result.changes
    other = run_simulation(small(seed="8"))
    assert [p.sent for p in other.phases] != [p.sent for p in small_result.phases]


def test_simulation_accounts_for_every_link(small_result) -> None:
    plan = small_result.plan
    assert [p.pages for p in small_result.phases] == [600, 300, 600]
    assert [(p.start, p.end) for p in small_result.phases] == [(0.0, 60.0), (60.0, 90.0), (90.0, 150.0)]
    for phase in small_result.phases:
        assert phase.kept is not None
        assert phase.total_sent + sum(phase.kept.values()) == phase.pages * plan.web.links_per_page
        assert sum(phase.host_shares.values()) == pytest.approx(1.0)
        assert sum(phase.popularity_shares.values()) == pytest.approx(1.0)
        assert sum(phase.key_shares.values()) == pytest.approx(1.0)
        nodes = phase.nodes
        assert all(phase.sent[i * len(nodes) + i] == 0 for i in range(len(nodes)))
        samples = [s for s in small_result.samples if s.phase == phase.index]
        assert len(samples) == plan.simulate.samples_per_phase
        assert sum(sum(s.sent_by.values()) for s in samples) == phase.total_sent
        assert sum(sum(s.received_by.values()) for s in samples) == phase.total_sent
        assert phase.column_totals() == {n: sum(s.received_by.get(n, 0) for s in samples) for n in nodes}


def test_simulated_changes_move_only_what_they_must(small_result) -> None:
    start, _, added = small_result.phases
    removal, addition = small_result.changes
    # a graceful removal moves exactly C's hosts, all away from C, with everything C held
    assert removal.actions == ("remove C",) and addition.actions == ("add E=300",)
    assert removal.hosts_moved == round(start.host_shares["C"] * 4000)
    assert {a for a, _ in removal.by_pair} == {"C"} and removal.urls_lost == 0
    assert removal.urls_moved == sum(removal.by_pair.values()) > 0
    assert removal.ideal_keyspace == pytest.approx(200 / 470)
    assert removal.moved_keyspace == pytest.approx(start.key_shares["C"])
    # the join moves hosts only to E
    assert {b for _, b in addition.by_pair} == {"E"}
    assert addition.hosts_moved == round(added.host_shares["E"] * 4000)
    assert addition.ideal_keyspace == pytest.approx(300 / 570)
    # URLs held grow with the links of every phase
    assert removal.urls_held == 600 * 10 and addition.urls_held == 900 * 10


def test_a_killed_node_loses_what_it_held() -> None:
    result = run_simulation(parse_plan(SMALL.replace('remove = ["C"]', 'kill = ["C"]')))
    kill, join = result.changes
    assert kill.urls_moved == 0 and kill.urls_lost == sum(kill.by_pair.values()) > 0
    assert kill.urls_held == 6000
    # the next change finds C's hosts emptied: E's share of what is held comes only from later links
    assert join.urls_held == 9000 - kill.urls_lost


def test_uniform_popularity_leaves_only_sampling_in_the_popularity_part() -> None:
    def run(exponent: str):
        text = SMALL.replace("after_pages = 900", "after_pages = 9000")
        return run_simulation(parse_plan(text, overrides={"web.popularity": exponent, "web.hosts": "20000",
                                                          "simulate.pages_per_second": "100"}))

    for phase in run("0").phases:
        for d in node_deviations(phase):
            # uniform popularity: the link probability a node owns is its host share, so the popularity part is
            # sampling alone (at least ~1,500 URLs per receiver here: a few percent at most)
            assert d.popularity == pytest.approx(d.hosts)
            assert d.popularity_part == pytest.approx(d.sampling_part)
            assert abs(d.popularity_part) < 0.08, d
    skewed = run("1.2")
    systematic = max(abs(d.popularity / d.hosts - 1) for p in skewed.phases for d in node_deviations(p))
    # skewed: the top host alone draws about a fifth of all links; whoever owns it is far above its share
    assert systematic > 0.15
    for phase in skewed.phases:
        for d in node_deviations(phase):
            assert abs(d.sampling_part) < 0.08  # and the measured URLs follow the popularity law
            assert (1 + d.key_part) * (1 + d.host_part) * (1 + d.popularity_part) == pytest.approx(1 + d.deviation)


def test_simulation_key_shares_come_from_the_ring(small_result) -> None:
    expected = ring.Ring({"A": 150, "B": 80, "D": 40}, points_per_weight=20).shares()
    assert small_result.phases[1].key_shares == pytest.approx(expected)


# --------------------------------------------------------------------------- report and command


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="peerctl experiment")
    experiment.add_arguments(parser)
    code = experiment.run(parser.parse_args(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_command_writes_a_run_folder_whose_files_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_path = tmp_path / "small.toml"
    plan_path.write_text(SMALL, encoding="utf-8")
    out = tmp_path / "run"
    code, text, err = _run_cli(["--plan", str(plan_path), "--out", str(out), "--set", "web.hosts=3000"], capsys)
    assert code == 0, err
    assert f"run folder: {out}" in err
    names = {p.name for p in out.iterdir()}
    assert names == {"report.txt", "plan.toml", "plan.source.toml", "sent-phase1.csv", "sent-phase2.csv",
                     "sent-phase3.csv", "cells.csv", "nodes.csv", "shares.csv", "changes.csv", "moved.csv",
                     "summary.json", "shares.png", "moved.png", "deviation.png"}
    assert (out / "report.txt").read_text() == text
    assert (out / "plan.source.toml").read_text() == SMALL
    effective = parse_plan((out / "plan.toml").read_text())
    assert effective.web.hosts == 3000 and effective == small(**{"web.hosts": "3000"})
    summary = json.loads((out / "summary.json").read_text())

    # the printed matrix, the CSV matrix and the summary agree
    for k, phase_summary in enumerate(summary["phases"], start=1):
        rows = list(csv.reader((out / f"sent-phase{k}.csv").open()))
        nodes = rows[0][1:]
        matrix = {(r[0], nodes[j]): int(v) for r in rows[1:] for j, v in enumerate(r[1:])}
        assert sum(matrix.values()) == phase_summary["urls_sent"]
        assert phase_summary["received"] == {j: sum(matrix[(i, j)] for i in nodes) for j in nodes}
        block = text.split(f"== phase {k} ")[1]
        for i in nodes:
            line = next(x for x in block.splitlines() if x.startswith(f"{i} "))
            printed = [c for c in line.split()[1:1 + len(nodes)]]
            assert printed == ["-" if i == j else f"{matrix[(i, j)]:,}" for j in nodes]
        # nodes.csv: received and deviation parts match the matrix, and multiply to the total
        for row in (r for r in _read_csv(out / "nodes.csv") if int(r["phase"]) == k):
            assert int(row["received"]) == sum(matrix[(i, row["node"])] for i in nodes)
            assert int(row["sent"]) == sum(matrix[(row["node"], j)] for j in nodes)
            product = (1 + float(row["key_part"])) * (1 + float(row["host_part"])) * (1 + float(row["popularity_part"]))
            assert product == pytest.approx(1 + float(row["deviation"]), rel=1e-4)
            assert float(row["deviation"]) == pytest.approx(int(row["received"]) / float(row["expected"]) - 1,
                                                            rel=1e-4, abs=1e-6)
        # cells.csv has every pair once with the URLs of the matrix
        phase_cells = [c for c in _read_csv(out / "cells.csv") if int(c["phase"]) == k]
        assert len(phase_cells) == len(nodes) * (len(nodes) - 1)
        assert all(int(c["urls"]) == matrix[(c["sender"], c["receiver"])] for c in phase_cells)

    # the summary line in the text quotes the largest deviation of summary.json
    for k, phase_summary in enumerate(summary["phases"], start=1):
        assert f"largest deviation {phase_summary['max_deviation']:+.2%}" in text.split("== summary")[1]
    # shares.csv: per phase, what the samples received adds up to the matrix's columns
    shares = _read_csv(out / "shares.csv")
    for k, phase_summary in enumerate(summary["phases"], start=1):
        got: dict[str, int] = {}
        for row in shares:
            if int(row["phase"]) == k:
                got[row["node"]] = got.get(row["node"], 0) + int(row["received"])
        assert got == phase_summary["received"]
    # changes.csv and moved.csv agree with the summary
    changes = _read_csv(out / "changes.csv")
    assert [int(c["urls_moved"]) for c in changes] == [c["urls_moved"] for c in summary["changes"]]
    moved = _read_csv(out / "moved.csv")
    for change in changes:
        assert sum(int(m["urls"]) for m in moved if m["phase"] == change["phase"]) == \
            int(change["urls_moved"]) + int(change["urls_lost"])
    assert f"URLs moved {summary['changes'][0]['urls_moved']:,}" in text

    from matplotlib import image

    for name in ("shares.png", "moved.png", "deviation.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        pixels = image.imread(out / name)
        assert pixels.shape[0] > 300 and pixels.shape[1] > 500
        assert pixels.std() > 0.05  # not a blank canvas


def test_command_reports_bad_plans_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\n[nodes]\nA = 1\n[end]\nat = 1.0\n[web]\nhostz = 5\n")
    code, out, err = _run_cli(["--plan", str(bad), "--out", str(tmp_path / "run")], capsys)
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and err.startswith("peerctl experiment: plan bad.toml: web.hostz: unknown key")
    assert not (tmp_path / "run").exists()
    code, out, err = _run_cli(["--plan", "design", "--set", "web.hosts=abc"], capsys)
    assert code == 2 and "web.hosts: expected an integer, got str 'abc'" in err


def test_show_plan_prints_the_effective_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run_cli(["--plan", "design", "--mode", "live", "--set", "web.popularity=0", "--show-plan"],
                            capsys)
    assert code == 0
    plan = parse_plan(out)
    assert plan.mode == "live" and plan.web.popularity == 0.0 and plan.nodes == load_plan("design")[0].nodes


def test_large_fleets_get_a_short_table_and_the_named_nodes_in_plots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_mod, "CELLS_CSV_MAX_NODES", 10)
    plan = small(**{"fleet.count": "20", "web.hosts": "3000", "fleet.weight_min": "20", "fleet.weight_max": "60"})
    result = run_simulation(plan)
    text, files = report_mod.write_run(result, tmp_path, plots=False)
    assert "cells.csv" not in {f.name for f in files}
    assert "24 nodes, total weight" in text and "shown: the 12 receivers that deviate most, then the plan's" in text
    # the whole matrix is not printed, only the design's table among the named nodes
    assert "the design's table for the named nodes (A, B, C, D) and the other 20 nodes as one (others)" in text
    block = text.split("== phase 1 ")[1].split("-- change")[0]
    assert block.count("from\\to") == 2 and "\nA  " in block.split("URLs sent between them")[1]
    assert "\nothers  " in block.split("URLs sent between them")[1]
    block = block.split("URLs received against the weights")[1]
    rows = [line.split()[0] for line in block.splitlines()[2:] if line.strip()]
    assert len(rows) >= 12 and {"A", "B", "C", "D"} <= set(rows)  # E joins later
    assert "median |deviation|" in text.split("== summary")[1]
    rows = list(csv.reader((tmp_path / "sent-phase1.csv").open()))
    assert len(rows) == 25 and len(rows[0]) == 25
    chosen = report_mod._plot_nodes(result)
    assert chosen[:5] == ["A", "B", "C", "D", "E"] and len(chosen) == report_mod.PLOT_MAX_NODES


def test_the_named_nodes_table_of_a_large_fleet_has_the_rest_as_one_node() -> None:
    # Two named nodes among 40 that never send each other a URL (each holds 1% of the ring): alone their table
    # is all zeros; with the rest of the fleet as one node ("others") it shows what they sent and received.
    weights = {"A": 10, "B": 10, **{f"n{i:02d}": 20 for i in range(38)}}
    total = sum(weights.values())
    shares = {k: v / total for k, v in weights.items()}
    sent = {("A", "n00"): 30, ("A", "n01"): 12, ("B", "n05"): 7, ("n03", "A"): 4, ("n04", "A"): 5, ("n07", "B"): 6,
            ("n00", "n01"): 1000}
    phase = _phase(sent, weights, key=shares, hosts=shares)
    lines = report_mod._matrix_table(phase, only=["A", "B"])
    assert lines[0].split() == ["from\\to", "A", "B", "others", "expected", "ratio", "measured", "ratio"]
    rows = {line.split()[0]: line.split() for line in lines[1:4]}
    assert rows["A"][1:4] == ["-", "0", "42"] and rows["B"][1:4] == ["0", "-", "7"]
    assert rows["others"][1:4] == ["9", "6", "-"]  # the URLs among the rest stay out: the diagonal
    # the expected ratio weighs the rest as one node of weight 760: A sends 1:76 to B and the rest
    assert rows["A"][4] == "1:76.00" and rows["others"][4:] == ["1:1.00", "1:0.67"]


def test_text_table_shows_the_designs_ratio_form() -> None:
    weights = {"A": 150, "B": 80, "C": 200, "D": 40}
    shares = {k: v / 470 for k, v in weights.items()}
    # the design's first table (first ten minutes), measured counts as published
    published = {("A", "B"): 4480, ("A", "C"): 9840, ("A", "D"): 2254, ("B", "A"): 4622, ("B", "C"): 6098,
                 ("B", "D"): 1285, ("C", "A"): 9473, ("C", "B"): 5551, ("C", "D"): 725, ("D", "A"): 6167,
                 ("D", "B"): 3269, ("D", "C"): 10349}
    phase = _phase(published, weights, key=shares, hosts=shares)
    text_lines = report_mod._matrix_table(phase)
    row_a = next(x for x in text_lines if x.startswith("A "))
    assert row_a.split()[-2:] == ["1:2.50:0.50", "1:2.20:0.50"]  # the design's "1:2.5:0.5" and "1:2.20:0.50"
    row_d = next(x for x in text_lines if x.startswith("D "))
    assert row_d.split()[-2:] == ["1:0.53:1.33", "1:0.53:1.68"]
    widths = {len(x) for x in text_lines[:5]}
    assert len(widths) == 1 or max(widths) - min(widths) <= 12  # aligned columns (ratios may differ in width)
    assert re.search(r"27\.0% \(25\.0%\) \+8\.\d%", "\n".join(text_lines))  # A -> B: 4480 / 16574


def test_a_phase_without_urls_reports_no_deviation() -> None:
    phase = _phase({}, {"A": 1, "B": 1}, key={"A": 0.5, "B": 0.5}, hosts={"A": 0.5, "B": 0.5})
    assert [(d.received, d.expected, d.deviation) for d in node_deviations(phase)] == [(0, 0.0, 0.0), (0, 0.0, 0.0)]
    assert [c.measured for c in cells(phase)] == [0.0, 0.0]
    result = experiment.ExperimentResult(plan=small(), mode="live", phases=(phase,), samples=(), changes=(),
                                         wall_seconds=1.0, peak_rss_bytes=0)
    assert 'phase 1 "t": no URLs sent' in report_mod.format_report(result)


# --------------------------------------------------------------------------- live


LIVE = """
name = "live-test"
mode = "live"
seed = 5

[nodes]
A = 150
B = 80
C = 200

[web]
hosts = 200
pages_per_host = 20
links_per_page = 8
internal_links = 0.5
popularity = 0.0

[dispatch]
batch_size = 50
interval = 0.1

[live]
delay = 1.0
timeout = 90.0
sample_interval = 0.25

[[phase]]
at = 5.0
remove = ["C"]
add = { E = 300 }

[end]
at = 10.0
"""


def test_live_plans_are_checked_before_anything_starts(tmp_path: Path) -> None:
    from peerlab.experiment.live import LiveError, run_live

    with pytest.raises(LiveError, match=r"web.popularity: the local web links hosts uniformly"):
        run_live(load_plan("design")[0], tmp_path / "run")
    with pytest.raises(LiveError, match=r"points_per_weight: the nodes use 1000"):
        run_live(parse_plan(LIVE, overrides={"points_per_weight": "10"}), tmp_path / "run")
    with pytest.raises(LiveError, match=r"29 nodes; live mode runs one process per node"):
        run_live(parse_plan(LIVE, overrides={"fleet.count": "25"}), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
async def test_live_experiment_runs_real_nodes_through_the_plan(tmp_path: Path) -> None:
    """Three peerd processes on loopback crawl the local web; then C leaves gracefully while E joins."""
    from peerlab.experiment.live import live_experiment

    plan = parse_plan(LIVE)
    lines: list[str] = []
    result = await live_experiment(plan, tmp_path, progress=lines.append)
    assert result.mode == "live"
    # the crawl waits, paused, until B and C have joined: A does not crawl the web alone while they start
    assert "crawl paused until the other 2 founding nodes have joined" in lines, lines
    assert [p.weights for p in result.phases] == [{"A": 150, "B": 80, "C": 200}, {"A": 150, "B": 80, "E": 300}]
    assert not any("crawl finished" in note or "timeout" in note for note in result.notes), (result.notes, lines)
    hosts = [f"h{i:04d}.web.test" for i in range(200)]
    first, second = result.phases
    # `at` counts time inside phases: the change at 5 s, the end at 10 s of phase time (the settling not counted);
    # 5 s, not less: the first phase must fetch pages (robots.txt first, then 1 s per host) on a busy machine too
    assert first.end - first.start >= 5.0 and (first.end - first.start) + (second.end - second.start) >= 10.0, lines
    assert second.start - first.end == pytest.approx(result.changes[0].settle_seconds, abs=0.5)
    assert first.pages > 0 and second.pages > 0, lines
    for phase in result.phases:
        assert all(n > 0 for n in phase.row_totals().values()), (phase.name, lines)  # every node sent
        assert all(n > 0 for n in phase.column_totals().values()), (phase.name, lines)  # and received
        the_ring = ring.Ring(phase.weights)
        assert phase.key_shares == pytest.approx(the_ring.shares())
        owned = {n: sum(1 for h in hosts if the_ring.owner(h) == n) / 200 for n in phase.weights}
        assert phase.host_shares == pytest.approx(owned)
        # every sample's URLs belong to its phase, and together they are the phase's URLs
        samples = [s for s in result.samples if s.phase == phase.index]
        assert samples and all(set(s.sent_by) <= set(phase.weights) for s in samples)
        assert sum(sum(s.received_by.values()) for s in samples) == phase.total_sent
    assert not any("reports key share" in note for note in result.notes), result.notes
    assert not any("exited with" in note or "was killed" in note for note in result.notes), result.notes
    (change,) = result.changes
    assert change.actions == ("add E=300", "remove C")
    before, after = ring.Ring({"A": 150, "B": 80, "C": 200}), ring.Ring({"A": 150, "B": 80, "E": 300})
    assert change.hosts_moved == sum(1 for h in hosts if before.owner(h) != after.owner(h))
    assert change.moved_keyspace == pytest.approx(ring.moved_fraction(ring.diff(before, after)))
    assert change.urls_held > 0 and change.settle_seconds > 0
    assert change.urls_moved == sum(change.by_pair.values()) and {b for _, b in change.by_pair} <= {"A", "B", "E"}
    # every node this run started has stopped; C left gracefully and handed everything off
    logs = {n: (tmp_path / "nodes" / f"{n}.log").read_text() for n in "ABCE"}
    assert all('"node stopped"' in text for text in logs.values())
    assert all('"crawl paused"' in logs[n] and '"crawl resumed"' in logs[n] for n in "ABC")  # the founders
    assert '"leave: everything handed off"' in logs["C"]
    assert not (tmp_path / "nodes" / "A").exists()  # data dirs are removed, logs stay
    text, _ = report_mod.write_run(result, tmp_path / "run", plots=False)
    assert "settled in" in text and "links" in text and "URLs handed off" in text
