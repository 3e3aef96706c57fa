"""The ring experiment (``ring.simulate``) and its command (``peerctl ring``, in peer/cli/ring_cmd.py)."""

from __future__ import annotations

import argparse
import json
import random
import re

import pytest

import ring
from peer.cli import ring_cmd as ringcmd
from ring import AddNode, RemoveNode, random_hosts, simulate

DESIGN = {"A": 150, "B": 80, "C": 200, "D": 40}
DESIGN_CHANGES = [RemoveNode(node_id="C"), AddNode(node_id="E", weight=300)]
HOST_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="peerctl ring")
    ringcmd.add_arguments(parser)
    code = ringcmd.run(parser.parse_args(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_design_configurations_within_two_percent_on_a_million_hosts() -> None:
    report = simulate(DESIGN, DESIGN_CHANGES, hosts=1_000_000, rng=random.Random(2024))
    assert [stage.label for stage in report.stages] == ["initial", "remove C", "add E=300"]
    assert [[n.node_id for n in s.nodes] for s in report.stages] == [["A", "B", "C", "D"], ["A", "B", "D"],
                                                                     ["A", "B", "D", "E"]]
    for stage in report.stages:
        assert sum(n.hosts for n in stage.nodes) == 1_000_000
        for node in stage.nodes:
            assert abs(node.key_error) < 0.02 and abs(node.host_error) < 0.02, (stage.label, node)
    assert report.max_key_error < 0.02 and report.max_host_error < 0.02
    removal, addition = report.stages[1].change, report.stages[2].change
    assert (removal.kind, removal.node_id, removal.weight) == ("remove", "C", 200)
    assert (addition.kind, addition.node_id, addition.weight) == ("add", "E", 300)
    assert removal.ideal == pytest.approx(200 / 470) and addition.ideal == pytest.approx(300 / 570)
    for change, stage_before, stage_after in ((removal, report.stages[0], report.stages[1]),
                                              (addition, report.stages[1], report.stages[2])):
        assert change.unnecessary_hosts == 0 and change.unnecessary_keyspace == 0.0
        assert abs(change.moved_keyspace / change.ideal - 1) < 0.02
        assert abs(change.moved_host_share / change.ideal - 1) < 0.02
    # every host C held moved, and nothing else did
    assert removal.moved_hosts == next(n.hosts for n in report.stages[0].nodes if n.node_id == "C")
    assert addition.moved_hosts == next(n.hosts for n in report.stages[2].nodes if n.node_id == "E")
    assert report.unnecessary_moves == 0


def test_simulation_is_reproducible_and_streams_in_chunks() -> None:
    small = {"x": 3, "y": 1}
    one = simulate(small, [AddNode(node_id="z", weight=2)], hosts=5000, rng=random.Random(5), points_per_weight=50,
                   chunk=333)
    two = simulate(small, [AddNode(node_id="z", weight=2)], hosts=5000, rng=random.Random(5), points_per_weight=50)
    assert one == two
    other = simulate(small, [AddNode(node_id="z", weight=2)], hosts=5000, rng=random.Random(6), points_per_weight=50)
    assert [n.hosts for n in other.stages[0].nodes] != [n.hosts for n in one.stages[0].nodes]


def test_simulation_rejects_impossible_changes() -> None:
    rng = random.Random(1)
    with pytest.raises(ValueError, match="already in the ring"):
        simulate({"a": 1}, [AddNode(node_id="a", weight=1)], hosts=10, rng=rng, points_per_weight=5)
    with pytest.raises(ValueError, match="not in the ring"):
        simulate({"a": 1}, [RemoveNode(node_id="b")], hosts=10, rng=rng, points_per_weight=5)
    with pytest.raises(ValueError, match="empty"):
        simulate({"a": 1}, [RemoveNode(node_id="a")], hosts=10, rng=rng, points_per_weight=5)
    with pytest.raises(ValueError, match="at least one node"):
        simulate({}, [], hosts=10, rng=rng)


def test_random_hosts_look_like_hosts_and_respect_the_count() -> None:
    chunks = list(random_hosts(random.Random(3), 10_001, chunk=1000))
    assert [len(c) for c in chunks] == [1000] * 10 + [1]
    names = [name for chunk in chunks for name in chunk]
    assert all(all(HOST_LABEL.match(label) for label in name.split(".")) for name in names)
    assert len(set(names)) > 9_900
    assert names == [n for c in random_hosts(random.Random(3), 10_001) for n in c]
    assert {name.rsplit(".", 1)[1] for name in names} >= {"com", "org", "net", "de", "uk"}


def test_cli_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["--node", "A=3", "--node", "B=1", "--add", "C=2", "--remove", "A", "--hosts", "2000",
                              "--points-per-weight", "40", "--seed", "9", "--json"], capsys)
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert set(doc) == {"points_per_weight", "hosts", "seed", "elapsed_seconds", "max_key_error", "max_host_error",
                        "unnecessary_moves", "stages"}
    assert (doc["points_per_weight"], doc["hosts"], doc["seed"], doc["unnecessary_moves"]) == (40, 2000, 9, 0)
    assert [s["label"] for s in doc["stages"]] == ["initial", "add C=2", "remove A"]  # command-line order
    assert doc["stages"][0]["change"] is None
    assert set(doc["stages"][0]) == {"label", "total_weight", "points", "nodes", "change"}
    assert set(doc["stages"][0]["nodes"][0]) == {"node", "weight", "weight_share", "key_share", "key_error", "hosts",
                                                 "host_share", "host_error"}
    assert set(doc["stages"][1]["change"]) == {"kind", "node", "weight", "ideal", "moved_keyspace", "moved_hosts",
                                               "moved_host_share", "unnecessary_keyspace", "unnecessary_hosts"}
    assert doc["stages"][2]["change"]["kind"] == "remove" and doc["stages"][2]["points"] == 3 * 40


def test_cli_table_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["--node", "A=3", "--node", "B=1", "--remove", "B", "--hosts", "1000",
                            "--points-per-weight", "20"], capsys)
    assert code == 0
    assert "== initial: total weight 4, 80 points" in out and "== remove B" in out
    assert "unnecessary: keys 0.000%, hosts 0" in out and "unnecessary moves: 0" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give at least one --node"),
        (["--node", "A=1", "--node", "A=2"], "given twice"),
        (["--node", "A=1", "--remove", "B"], "not in the ring"),
        (["--node", "A=1", "--hosts", "-5"], "--hosts must be >= 0"),
        (["--node", "A=100000"], "over the limit"),
    ],
)
def test_cli_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(argv + ["--hosts", "10"] if "--hosts" not in argv else argv, capsys)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1 and err.startswith("peerctl ring: ")


def test_cli_rejects_malformed_node_arguments() -> None:
    parser = argparse.ArgumentParser()
    ringcmd.add_arguments(parser)
    for bad in (["--node", "A"], ["--node", "A=0"], ["--node", "=3"], ["--add", "E=x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    assert ring.DEFAULT_POINTS_PER_WEIGHT == parser.parse_args(["--node", "A=1"]).points_per_weight
