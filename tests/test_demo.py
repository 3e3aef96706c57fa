"""``peerctl demo``: the bundled ``demo`` plan, the verdict it prints, and the demo run end to end.

The end-to-end test runs the cluster demo for real on a small web (four peerd processes, C leaving, E joining,
every node exiting through --exit-when-done, about 45 s here); the verdict's own tests feed ``judge`` a
request log made by hand, so each problem it must catch is shown to be caught.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import pytest

from peer.cli.main import peerctl_main
from peerlab.demo import DemoError, WarcSummary, _clear_run_folder, judge, read_warcs
from peerlab.experiment import bundled_plan_text, load_plan, parse_plan, to_toml
from peerlab.experiment.live import NodeOutcome
from peerlab.experiment.plan import PlanError
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import RequestRecord
from storage import WarcPageStore

pytestmark = pytest.mark.slow  # the demo: a local web and four real daemons

# --------------------------------------------------------------------------- the plan


def test_bundled_demo_plan_is_the_design_cluster_crawling_to_the_end() -> None:
    plan, label = load_plan("demo")
    assert label == "demo (bundled)" and plan.mode == "live"
    assert dict(plan.nodes) == {"A": 150, "B": 80, "C": 200, "D": 40}
    leave, join = plan.phases
    assert leave.remove == ("C",) and not leave.add and leave.after_pages is not None
    assert join.add == (("E", 300),) and not join.remove and join.after_pages is not None
    assert join.after_pages > leave.after_pages
    assert plan.end.when_done and plan.end.at is None and plan.end.after_pages is None
    assert plan.web.features and plan.web.popularity == 0.0
    assert plan.live.store == "warc" and plan.live.keep_data and plan.live.progress_interval > 0
    # smaller than any Crawl-delay of the web, so the referee's Crawl-delay check has teeth
    assert plan.live.delay < 0.3
    assert parse_plan(to_toml(plan)) == plan


def test_plans_without_the_new_keys_keep_their_meaning() -> None:
    plan, _ = load_plan("live-small")
    assert not plan.web.features and plan.live.store == "none" and not plan.live.keep_data


_BASE = "name = 'x'\nmode = 'live'\n[nodes]\nA = 1\n[web]\npopularity = 0.0\n"


@pytest.mark.parametrize(("text", "message"), [
    ("name = 'x'\n[nodes]\nA = 1\n[web]\nfeatures = true\n[end]\nat = 1.0",
     "web.features: only a live run serves a local web with features"),
    (_BASE + "features = true\nhosts = 13\n[end]\nwhen_done = true",
     "web.hosts: a web with features needs at least 14 hosts"),
    (_BASE + "features = 'yes'\n[end]\nwhen_done = true", "web.features: expected true or false, got str 'yes'"),
    (_BASE + "[live]\nstore = 'warc'\n[end]\nwhen_done = true",
     "live.store: the WARC files are written into the node data dirs"),
    (_BASE + "[live]\nstore = 's3'\n[end]\nwhen_done = true", "live.store: must be one of none, warc, got 's3'"),
    (_BASE + "[live]\nkeep_data = 1\n[end]\nwhen_done = true", "live.keep_data: expected true or false, got int 1"),
    (_BASE + "[live]\nprogress_interval = -1\n[end]\nwhen_done = true", "live.progress_interval: must be >= 0"),
    (_BASE + "[end]\nwhen_done = 'yes'", "end.when_done: expected true or false"),
])
def test_new_plan_keys_are_checked(text: str, message: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_plan(text, label="bad.toml")
    assert message in str(info.value) and "\n" not in str(info.value)


# --------------------------------------------------------------------------- the verdict


PORT = 8080


def _record(url: str, start: float, *, conn: int, length: float = 0.01) -> RequestRecord:
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return RequestRecord(host=parts.hostname or "", path=path, status=200, conn_id=conn, start=start,
                         end=start + length, wall_start=1000.0 + start, wall_end=1000.0 + start + length,
                         user_agent="peercrawl/0.1", bytes_sent=100)


def _correct_log(graph: SiteGraph) -> list[RequestRecord]:
    """What a correct crawl looks like: each robots.txt, then each page once, a host's requests 1 s apart."""
    expected = graph.expected(port=PORT)
    log = []
    for i, url in enumerate(sorted(expected.robots) + sorted(expected.fetched)):
        log.append(_record(url, float(i), conn=i))
    return log


def _run(graph: SiteGraph, log: list[RequestRecord], *, c_exit: int = 0, changes=()) -> SimpleNamespace:
    plan, _ = load_plan("demo")
    nodes = [NodeOutcome(node_id=n, weight=w, state="left" if n == "C" else "done", exit_code=c_exit if n == "C"
                         else 0, data_dir=Path("/nonexistent"), log_path=Path("/nonexistent.log"), pages=0,
                         stored=0) for n, w in (*plan.nodes, ("E", 300))]
    return SimpleNamespace(graph=graph, port=PORT, log=tuple(log), nodes=tuple(nodes), concluded=True,
                           changes=tuple(changes), result=SimpleNamespace(plan=plan))


@pytest.fixture(scope="module")
def tiny() -> tuple[SiteGraph, WarcSummary]:
    graph = SiteGraph.generate(seed=3, hosts=4, pages_per_host=3, links_per_page=3, features=False, seed_hosts=4)
    pages = graph.expected(port=PORT).pages
    return graph, WarcSummary(files=(), records=2 * len(pages), pages=len(pages), urls=frozenset(pages))


def test_a_correct_crawl_is_judged_ok(tiny) -> None:
    graph, warcs = tiny
    verdict = judge(_run(graph, _correct_log(graph)), warcs)
    assert verdict.ok, verdict
    assert verdict.fetched_pages == verdict.expected_pages == len(graph.expected(port=PORT).fetched) > 5
    assert not verdict.missing and not verdict.fetched_twice and verdict.max_connections_per_host == 1


def test_the_verdict_catches_each_problem(tiny) -> None:
    graph, warcs = tiny
    log = _correct_log(graph)
    page = next(r for r in log if r.path != "/robots.txt")
    url = f"http://{page.host}:{PORT}{page.path}"

    missing = judge(_run(graph, [r for r in log if r is not page]), warcs)
    assert not missing.ok and missing.missing == (url,)

    again = _record(url, 500.0, conn=900)
    twice = judge(_run(graph, [*log, again]), warcs)
    assert not twice.ok and twice.fetched_twice == {url: 2} and twice.twice_unexplained == (url,)
    # under way while the ring changed: the duplicate the design allows
    window = [("C leaves", page.wall_start - 1.0, page.wall_end + 1.0)]
    allowed = judge(_run(graph, [*log, again], changes=window), warcs)
    assert allowed.ok and allowed.fetched_twice == {url: 2} and allowed.twice_unexplained == ()

    overlap = _record(url, page.start, conn=901)  # a second connection to the host while the first is busy
    assert judge(_run(graph, [*log, overlap]), warcs).max_connections_per_host == 2

    stranger = judge(_run(graph, [*log, _record(f"http://{page.host}:{PORT}/nowhere.html", 600.0, conn=902)]), warcs)
    assert not stranger.ok and stranger.unexpected == (f"http://{page.host}:{PORT}/nowhere.html",)

    failed_leave = judge(_run(graph, log, c_exit=1), warcs)
    assert not failed_leave.ok and failed_leave.nodes["C"] == ("left", 1, "left")

    lost = WarcSummary(files=(), records=0, pages=0, urls=warcs.urls - {url})
    assert judge(_run(graph, log), lost).not_stored == (url,)


def test_the_verdict_counts_crawl_delay_violations() -> None:
    graph = SiteGraph.generate(seed=3, hosts=16, pages_per_host=3, links_per_page=3, features=True, seed_hosts=1)
    host = graph.role("robots-agent").name  # Crawl-delay 0.3 for peercrawl
    delay = graph.crawl_delay(host)
    assert delay == pytest.approx(0.3)
    log = [_record(f"http://{host}:{PORT}/private/open.html", 0.0, conn=1),
           _record(f"http://{host}:{PORT}/list.html?page=2", 0.1, conn=2)]
    verdict = judge(_run(graph, log), WarcSummary(files=(), records=0, pages=0, urls=frozenset()))
    assert verdict.crawl_delay_violations == 1 and not verdict.ok


def test_warc_files_are_read_back_record_by_record(tmp_path: Path) -> None:
    store = WarcPageStore(tmp_path / "warc")
    for i in range(3):
        store.store(url=f"http://h.test/{i}.html", request_headers=[("User-Agent", "peercrawl")], status=200,
                    reason="OK", response_headers=[("Content-Type", "text/html")], body=b"<p>x</p>", ip="127.0.0.1",
                    fetched_at=1.7e9 + i)
    store.close()
    summary = read_warcs((tmp_path / "warc").glob("*.warc.gz"))
    assert summary.pages == 3 and summary.records == 7  # warcinfo + a response and a request per page
    assert summary.urls == {f"http://h.test/{i}.html" for i in range(3)}


def test_an_earlier_demo_is_cleared_but_not_while_a_node_runs(tmp_path: Path) -> None:
    node = tmp_path / "nodes" / "A"
    node.mkdir(parents=True)
    (node / "LOCK").write_bytes(b"")
    fd = os.open(node / "LOCK", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running peerd holds
        with pytest.raises(DemoError, match="a node is still running in"):
            _clear_run_folder(tmp_path)
        assert node.exists()
    finally:
        os.close(fd)
    _clear_run_folder(tmp_path)
    assert not (tmp_path / "nodes").exists()


def test_the_demo_refuses_a_plan_that_is_not_live(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert peerctl_main(["demo", "--dir", str(tmp_path), "--plan", "design"]) == 2
    assert "the demo runs live nodes" in capsys.readouterr().err
    assert peerctl_main(["demo", "--dir", str(tmp_path), "--set", "web.hosts"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


# --------------------------------------------------------------------------- end to end


def _small_demo_plan(tmp_path: Path) -> Path:
    """The bundled demo on a small web: 20 hosts x 40 pages; delay 0.4 s keeps the crawl going while the
    cluster forms, C leaves and E joins (each join takes a few seconds here)."""
    text = bundled_plan_text("demo")
    for old, new in (("hosts = 80", "hosts = 20"), ("pages_per_host = 100", "pages_per_host = 40"),
                     ("delay = 0.2", "delay = 0.4"), ("after_pages = 1000", "after_pages = 100"),
                     ("after_pages = 2000", "after_pages = 200")):
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "small-demo.toml"
    path.write_text(text)
    return path


def test_the_cluster_demo_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "demo-data"
    code = peerctl_main(["demo", "--dir", str(run), "--plan", str(_small_demo_plan(tmp_path))])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "verdict: OK" in out
    # progress while it crawled, then the experiment's tables
    assert re.search(r"^ +\d+\.\d s  pages +\d+ .*\| A \d+", out, flags=re.MULTILINE), out[:2000]
    assert "C is leaving" in out and "started E (weight 300" in out
    # the four founders join with the crawl paused: A does not crawl alone while the others start
    assert "crawl paused until the other 3 founding nodes have joined" in out, out[:2000]
    # the address of the dashboard the first node serves for the whole cluster, with its token in the fragment
    assert re.search(r"^dashboard \(any node serves it for the whole cluster\): http://127\.0\.0\.1:\d+/#token=\S{32,}$",
                     out, flags=re.MULTILINE), out[:2000]
    for header in ('== phase 1 "start"', '== phase 2 "C leaves"', '== phase 3 "E joins"'):
        assert header in out
    assert "from\\to" in out and "expected ratio" in out and "measured ratio" in out
    # the verdict, from the web's own log
    verdict = json.loads((run / "verdict.json").read_text())
    assert verdict["ok"] and verdict["missing"] == [] and verdict["unexpected"] == []
    assert verdict["max_connections_per_host"] == 1 and verdict["crawl_delay_violations"] == 0
    assert {n: v["end"] for n, v in verdict["nodes"].items()} == {
        "A": "done", "B": "done", "C": "left", "D": "done", "E": "done"}
    assert all(v["exit_code"] == 0 for v in verdict["nodes"].values())
    summary = json.loads((run / "summary.json").read_text())
    assert [p["name"] for p in summary["phases"]] == ["start", "C leaves", "E joins"]
    assert any("every node exited through --exit-when-done" in note for note in summary["notes"])
    for node in "ABDE":  # the cluster itself concluded the crawl
        assert '"crawl finished across the cluster"' in (run / "nodes" / f"{node}.log").read_text()
    # a PNG and WARC files
    png = run / "shares.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "shares.png" in out
    warcs = sorted(run.glob("nodes/*/warc/*.warc.gz"))
    assert warcs and any(w.parent.parent.name == "E" for w in warcs)
    back = read_warcs(warcs)
    assert back.pages == verdict["warc"]["pages"] > 100 and back.records == verdict["warc"]["records"]
    assert verdict["not_stored"] == [] and verdict["stored_unexpected"] == []
    assert f"{back.records:,} records, {back.pages:,} pages stored" in out


def test_the_single_node_demo_is_still_there(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = peerctl_main(["demo", "--single", "--dir", str(tmp_path), "--hosts", "16", "--pages-per-host", "4"])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert "verdict: OK" in out and "missing:                            0" in out
    assert list((tmp_path / "node-1" / "warc").glob("*.warc.gz"))
