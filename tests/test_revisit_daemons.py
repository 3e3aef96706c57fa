"""Real peerd daemons with --revisit over a local web whose pages change on a schedule (some never).

Two nodes crawl and keep revisiting; a third joins, one leaves, one is killed with SIGKILL and restarted from
its data dir. From the web server's own log and the WARC collection of every node (warcio):
- every page is still revisited at the end (no schedule forgotten), and no page is fetched twice at once;
- revisit records name an original full record that exists somewhere in the collection, though it may have
  been written by another node: the schedule (validators, digest, original's date) moved with the host;
- 304s were produced and recorded as server-not-modified revisits.
"""

from __future__ import annotations

import signal
import time
from collections import defaultdict

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from peerlab.localweb.changes import ChangeSchedule
from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.server import serve_web
from tests.support.crawl import kill_pid
from tests.test_steering_daemons import Daemons

pytestmark = pytest.mark.slow  # real peerd processes

MIN, MAX = 2.0, 6.0
# Per-address limits off: every host of the local web shares 127.0.0.1, and after the kill the address's new owner
# lends no lane until the dead node's leases have surely run out (lease + total_timeout, 62 s: docs/cluster.md,
# "Per-address limits"), longer than this test's whole timeline. What is tested here is the revisit schedule.
REVISIT = ("--revisit", "--revisit-min", str(MIN), "--revisit-max", str(MAX), "--suspicion-timeout", "2",
           "--ip-connections", "0")


def _warc_records(tmp_path, names) -> list[tuple[str, str, str, str | None, str | None, str | None, str]]:
    out = []
    for name in names:
        for path in sorted((tmp_path / name / "warc").glob("*.warc.gz")):
            with open(path, "rb") as fh:
                for record in ArchiveIterator(fh, check_digests="raise"):
                    if record.rec_type in ("response", "revisit"):
                        h = record.rec_headers
                        out.append((name, record.rec_type, h.get_header("WARC-Target-URI"), h.get_header("WARC-Date"),
                                    h.get_header("WARC-Profile"), h.get_header("WARC-Refers-To-Date"),
                                    h.get_header("WARC-Payload-Digest")))
    return out


async def _fetched_since(web, pages: set[str], since: float, times: int = 1, timeout: float = 60.0) -> None:
    """Wait until every page of `pages` has been fetched `times` times since the wall time `since`."""
    counts: dict[str, int] = {}
    with trio.move_on_after(timeout):
        while True:
            counts = dict.fromkeys(pages, 0)
            for r in web.log:
                url = web.url(r.host, r.path)
                if r.wall_start >= since and url in counts:
                    counts[url] += 1
            if min(counts.values()) >= times:
                return
            await trio.sleep(0.1)
    late = sorted(u for u, n in counts.items() if n < times)
    raise AssertionError(f"{len(late)} pages not fetched {times} times in the {timeout:g} s since: {late[:5]}")


async def test_revisit_schedules_survive_a_join_a_leave_and_a_kill(tmp_path):
    graph = SiteGraph.generate(seed=43, hosts=12, pages_per_host=5, features=False)
    changes = ChangeSchedule(start=time.time(), periods=(None, 3.0))
    events: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        web = await nursery.start(lambda task_status: serve_web(graph, changes=changes, task_status=task_status))
        dns = await nursery.start(serve_dns, graph.zone())
        pages = web.expected().fetched
        nodes = Daemons(tmp_path, web, dns, exit_when_done=False, delay=0.1, concurrency=32)
        try:
            # each stage lasts until every page has been revisited under it (the log of the web says when)
            await nodes.start("A", extra=REVISIT)
            await nodes.start("B", extra=REVISIT)
            await _fetched_since(web, pages, 0.0, times=2)  # fetched, then revisited
            events["join"] = time.time()
            await nodes.start("C", extra=REVISIT)
            await _fetched_since(web, pages, events["join"])
            events["leave"] = time.time()
            await nodes.peerctl("leave", "--data-dir", nodes.data_dir("B"), "--timeout", "60")
            with trio.fail_after(60):
                assert await nodes.procs["B"].wait() == 0, nodes.log_tail("B")
            await _fetched_since(web, pages, time.time())
            events["kill"] = time.time()
            kill_pid(nodes.procs["A"].pid, signal.SIGKILL)
            await nodes.procs["A"].wait()
            # C declares A dead (2 s suspicion) and owns everything meanwhile
            with trio.fail_after(30):
                while {n["node_id"]: n["state"] for n in (await nodes.get("C", "/cluster"))["nodes"]}.get("A") != "dead":
                    await trio.sleep(0.1)
            nodes.seed = (tmp_path / "C" / "peer.addr").read_text().strip()
            await nodes.start("A", extra=REVISIT)
            events["restart"] = time.time()
            # twice over since the restart: a page that both A and C revisited would show two fetches too close
            await _fetched_since(web, pages, events["restart"], times=2)
            status = {n: await nodes.get(n, "/status") for n in ("A", "C")}
            events["end"] = time.time()
            await nodes.stop_all()
        finally:
            nodes.kill_all()
        nursery.cancel_scope.cancel()

    fetches: dict[str, list] = defaultdict(list)
    for r in web.log:
        if not r.path.endswith("robots.txt"):
            fetches[web.url(r.host, r.path)].append(r)
    assert len(fetches) >= 40
    # nothing forgotten: every page is revisited in the last stretch, after the restart
    late = events["end"] - (MAX + 3.0)
    forgotten = [u for u, rs in fetches.items() if max(r.wall_start for r in rs) < late]
    assert not forgotten, forgotten[:5]
    # nothing revisited twice at once (two fetches of a page closer than the minimum interval), except pages in
    # flight at the kill, which are fetched again after the restart
    close = []
    for url, rs in fetches.items():
        times = sorted(r.wall_start for r in rs)
        close += [(url, round(b - a, 2), round(a - events["kill"], 1)) for a, b in zip(times, times[1:])
                  if b - a < MIN - 0.2 and not (events["kill"] - 1 <= a <= events["restart"] + 2)]
    assert not close, close[:5]
    # 304s produced and recorded; every revisit record names an original that exists in the collection
    records = _warc_records(tmp_path, ("A", "B", "C"))
    originals = {(uri, date): digest for _n, kind, uri, date, _p, _r, digest in records if kind == "response"}
    revisits = [r for r in records if r[1] == "revisit"]
    dangling = [r for r in revisits if originals.get((r[2], r[5])) != r[6]]
    assert revisits and not dangling, dangling[:3]
    cross = [r for r in revisits if not any(o[0] == r[0] and o[1] == "response" and o[2] == r[2] and o[3] == r[5]
                                            for o in records)]
    profiles = defaultdict(int)
    for r in revisits:
        profiles[r[4].rsplit("/", 1)[-1]] += 1
    assert profiles["server-not-modified"] > 0 and sum(1 for rs in fetches.values() for r in rs if r.status == 304)
    moved = sum(s["cluster"]["handoff"]["revisits_received"] for s in status.values())
    assert cross, "no revisit record refers to an original written by another node: no schedule moved"
    print(f"pages {len(fetches)}, fetches {sum(len(v) for v in fetches.values())}, revisit records {dict(profiles)}, "
          f"referring to another node's original {len(cross)}, schedule entries received by hand-off (A, C) {moved}")
