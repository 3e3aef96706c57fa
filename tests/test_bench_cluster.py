"""Smoke test of tests/bench/bench_cluster.py: every measurement runs at a tiny size over real loopback TCP and
gives sane figures (positive, bytes per URL between a fifth of the bare URL list and twice it, everything
delivered).
No timing assertions: the figures themselves come from `python -m tests.bench.bench_cluster`."""

from __future__ import annotations

import math

import pytest

from tests.bench import bench_cluster as bench

pytestmark = pytest.mark.slow  # the cluster benchmarks' checks


@pytest.fixture(scope="module")
def dispatch_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wire")
    ring, items = bench.dispatch_items(300)
    runs = [bench.run_dispatch(tmp / codec, ring, items, codec=codec, batch_size=100) for codec in ("msgpack", "json")]
    return items, runs, bench.cpu_reference(tmp, items, repeats=1)


def test_url_batches_cost_between_a_fifth_of_the_bare_urls_and_twice_them(dispatch_runs, capsys) -> None:
    items, runs, _ = dispatch_runs
    for run in runs:
        reference = run.per_url(run.url_bytes)
        assert run.urls == len(items)
        assert reference == pytest.approx(sum(len(i.url) + 1 for i in items) / len(items), abs=0.01)
        # version 2's columns and brotli: below version 1's unpacked msgpack (about 2.07x the bare list)
        assert reference / 5 < run.per_url(run.sent_bytes) < 2 * reference
        assert 0 < run.ack_bytes < run.sent_bytes
        assert run.batches >= 3  # 300 URLs in batches of at most 100
    bench.print_wire(runs)
    out = capsys.readouterr().out
    assert "msgpack" in out and "json" in out and "newline-joined" in out


def test_cpu_parts_are_positive_and_within_the_process_total(dispatch_runs, capsys) -> None:
    _, runs, reference = dispatch_runs
    run = runs[0]
    parts = [bench.SENDER_ROUTE, bench.SENDER_BATCH, bench.SENDER_ACKS, bench.RECEIVER]
    assert all(run.cpu[part] > 0 for part in parts)
    assert sum(run.cpu[part] for part in parts) <= run.cpu["process"]
    assert run.wall > 0
    assert reference.urls == run.urls
    assert reference.set_add > 0 and reference.lmdb_put > 0 and reference.lmdb_put_sync > 0
    bench.print_cpu(run, reference)
    assert "reference: set.add" in capsys.readouterr().out


def test_view_changes_reach_every_node(capsys) -> None:
    run = bench.run_view_changes(3, 1)
    assert run.nodes == 3 and len(run.joins) == 1 and len(run.leaves) == 1
    assert all(0 < t < 60 and math.isfinite(t) for t in (*run.joins, *run.leaves))
    rtt = bench.run_ping_rtt(5)
    assert len(rtt) == 5 and all(0 < t < 10 for t in rtt)
    bench.print_membership([run], rtt)
    assert "Ping/Pong" in capsys.readouterr().out


def test_handoff_moves_the_gained_arcs(tmp_path, capsys) -> None:
    items = bench.handoff_items(400, 8)
    assert len({i.url for i in items}) == 400 and len({i.host for i in items}) == 8
    run = bench.run_handoff(tmp_path, items)  # raises if b does not end with exactly the moved URLs
    assert 0 < run.urls_moved < run.urls and 0 < run.hosts_moved < run.hosts
    assert run.chunks >= 1
    mean_url = sum(len(i.url) for i in items) / len(items)
    # version 2 columns and brotli: about half a URL's length per moved URL here (version 1: about 2x it)
    assert mean_url / 5 < run.bytes_sent / run.urls_moved < 2 * mean_url
    assert run.view_changed_sender > 0 and run.view_changed_receiver > 0
    assert run.streaming > 0 and run.cpu_streaming > 0 and run.reference_admit > 0
    bench.print_handoff(run)
    assert "store.admit" in capsys.readouterr().out
