"""Real peerd daemons with --revisit over a local web whose pages change on a schedule (some never).

Two nodes crawl and keep revisiting; a third joins, one leaves, one is killed with SIGKILL (the other, once it
has declared it dead, has every page on its schedule) and restarted from its data dir. Each stage begins once
the nodes report the change settled (every member alive in every view, no arc awaited, no chunk unacknowledged) and lasts until every page was revisited under it. From the web server's
own log (which names the node in each request's User-Agent), the nodes' logs and the WARC collection of every
node (warcio):
- every page is revisited after every change, twice after the restart (no schedule forgotten, none stuck);
- no page is fetched twice closer than the minimum interval, but for a page in flight at the kill, fetched again
  after it, and for two nodes' fetches while a node that ran was declared dead (a split, where the guarantee
  of one owner per host ends: docs/cluster.md), which the nodes' logs say;
- revisit records name an original full record that exists somewhere in the collection, though it may have
  been written by another node: the schedule (validators, digest, original's date) moved with the host;
- 304s were produced and recorded as server-not-modified revisits.
"""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict

import pytest
import trio

from peerlab.localweb.changes import ChangeSchedule
from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.server import serve_web
from tests.support.crawl import kill_pid, node_warc_records
from tests.test_steering_daemons import Daemons

pytestmark = pytest.mark.slow  # real peerd processes

MIN, MAX = 2.0, 6.0
# Per-address limits off: every host of the local web shares 127.0.0.1, and after the kill the address's new owner
# lends no lane until the dead node's leases have surely run out (lease + total_timeout, 62 s: docs/cluster.md,
# "Per-address limits"), longer than this test's whole timeline. What is tested here is the revisit schedule.
# A suspicion of 4 s: the killed node is declared dead within seconds, and a node starved of CPU on a loaded
# machine is seldom declared dead while it runs (when one is, its logs say so and the check below allows for it).
REVISIT = ("--revisit", "--revisit-min", str(MIN), "--revisit-max", str(MAX), "--suspicion-timeout", "4",
           "--ip-connections", "0")
#: Bounds, not waits: a stage takes 6-10 s on an idle machine; a loaded two-core machine has taken 40 s.
STAGE, SETTLE = 120.0, 120.0


def _warc_records(tmp_path, names) -> list[tuple[str, str, str, str | None, str | None, str | None, str]]:
    return [(name, kind, h.get_header("WARC-Target-URI"), h.get_header("WARC-Date"), h.get_header("WARC-Profile"),
             h.get_header("WARC-Refers-To-Date"), h.get_header("WARC-Payload-Digest"))
            for name, kind, h in node_warc_records(tmp_path, names)]


async def _fetched_since(web, pages: set[str], since: float, times: int = 1, timeout: float = STAGE) -> None:
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


async def _settled(nodes: Daemons, names: tuple[str, ...], timeout: float = SETTLE) -> None:
    """Wait until each node of `names` reports every other one alive in its view, no gained arc awaited and no
    hand-off chunk unacknowledged: the view change is done, and each host has its one owner."""
    seen: dict[str, tuple[dict[str, str | None], int, int]] = {}
    with trio.move_on_after(timeout):
        while True:
            for name in names:
                cluster = (await nodes.get(name, "/status"))["cluster"]
                states = {m["node_id"]: m["state"] for m in cluster["members"]}
                seen[name] = ({n: states.get(n) for n in names}, cluster["handoff"]["pending_arcs"],
                              cluster["handoff"]["outstanding"])
            if all(views == dict.fromkeys(names, "alive") and pending == 0 and outstanding == 0
                   for views, pending, outstanding in seen.values()):
                return
            await trio.sleep(0.2)
    raise AssertionError(f"not settled in {timeout:g} s (views, arcs awaited, chunks outstanding): {seen}")


def _declared_dead(tmp_path, names) -> list[tuple[float, str, str]]:
    """(time, declaring node, node declared dead) from the nodes' JSON logs."""
    out = []
    for name in names:
        for line in (tmp_path / f"{name}.log").read_text(errors="replace").splitlines():
            if " declares " in line and line.startswith("{"):
                record = json.loads(line)
                words = record["msg"].split()
                if words[1:2] == ["declares"]:
                    out.append((record["ts"], words[0], words[2]))
    return out


def _node_of(user_agent: str) -> str:
    return user_agent.rsplit("/", 1)[-1].rstrip(")")  # the contact URL, https://nodes.test/NAME


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
            # each stage begins once the nodes report the change settled and lasts until every page has been
            # revisited under it (the log of the web says when)
            events["begin"] = time.time()
            await nodes.start("A", extra=REVISIT)
            await nodes.start("B", extra=REVISIT)
            await _settled(nodes, ("A", "B"))
            events["formed"] = time.time()
            await _fetched_since(web, pages, 0.0, times=2)  # fetched, then revisited
            events["joining"] = time.time()
            await nodes.start("C", extra=REVISIT)
            await _settled(nodes, ("A", "B", "C"))
            events["join"] = time.time()
            await _fetched_since(web, pages, events["join"])
            events["leave"] = time.time()
            await nodes.peerctl("leave", "--data-dir", nodes.data_dir("B"), "--timeout", "60")
            with trio.fail_after(SETTLE):
                assert await nodes.procs["B"].wait() == 0, nodes.log_tail("B")
            await _settled(nodes, ("A", "C"))
            events["left"] = time.time()
            await _fetched_since(web, pages, events["left"])
            events["kill"] = time.time()
            kill_pid(nodes.procs["A"].pid, signal.SIGKILL)
            await nodes.procs["A"].wait()
            # C declares A dead and owns everything meanwhile, with A's pages on its schedule: their releases
            # brought it their schedules (--replicas 1, the default)
            with trio.fail_after(SETTLE):
                while {n["node_id"]: n["state"] for n in (await nodes.get("C", "/cluster"))["nodes"]}.get("A") != "dead":
                    await trio.sleep(0.1)
                while (await nodes.get("C", "/status"))["revisit"]["scheduled"] < len(pages):
                    await trio.sleep(0.1)
            nodes.seed = (tmp_path / "C" / "peer.addr").read_text().strip()
            for name in ("control.addr", "peer.addr"):  # the killed process's: the restart writes them anew
                (tmp_path / "A" / name).unlink()
            events["restarting"] = time.time()
            await nodes.start("A", extra=REVISIT)
            await _settled(nodes, ("A", "C"))  # A has its arcs back, with their schedules
            events["restart"] = time.time()
            # twice over since A is back: a page that both A and C revisited would show two fetches too close,
            # and a revisit left queued with nothing to fetch it (or never handed back) shows as not fetched
            await _fetched_since(web, pages, events["restart"], times=2)
            events["end"] = time.time()
            status = {n: await nodes.get(n, "/status") for n in ("A", "C")}
            await nodes.stop_all()
        finally:
            nodes.kill_all()
        nursery.cancel_scope.cancel()

    fetches: dict[str, list] = defaultdict(list)
    for r in web.log:
        if not r.path.endswith("robots.txt"):
            fetches[web.url(r.host, r.path)].append(r)
    assert len(fetches) >= 40
    # A node declared dead while it ran (a CPU-starved daemon on a loaded machine): two nodes own its hosts until
    # it is back, so two of them may fetch a page close together then.
    running = {"A": lambda t: t < events["kill"] or t >= events["restarting"], "B": lambda t: t < events["leave"],
               "C": lambda t: True}
    false_deaths = [(round(t - events["kill"], 1), by, who) for t, by, who in _declared_dead(tmp_path, "ABC")
                    if running[who](t)]
    # nothing fetched twice at once (two fetches of a page closer than the minimum interval), except a page in
    # flight at the kill, fetched again after it
    close = []
    for url, rs in fetches.items():
        rs = sorted(rs, key=lambda r: r.wall_start)
        for a, b in zip(rs, rs[1:]):
            if b.wall_start - a.wall_start >= MIN - 0.2 or a.wall_start <= events["kill"] < b.wall_start:
                continue
            pair = (url, _node_of(a.user_agent), _node_of(b.user_agent), round(b.wall_start - a.wall_start, 2),
                    round(a.wall_start - events["kill"], 1))
            if not (false_deaths and pair[1] != pair[2]):
                close.append(pair)
    assert not close, (close[:5], false_deaths)
    # 304s produced and recorded; every revisit record names an original that exists in the collection
    records = _warc_records(tmp_path, ("A", "B", "C"))
    originals = {(uri, date): digest for _n, kind, uri, date, _p, _r, digest in records if kind == "response"}
    revisits = [r for r in records if r[1] == "revisit"]
    dangling = [r for r in revisits if originals.get((r[2], r[5])) != r[6]]
    assert revisits and not dangling, dangling[:3]
    cross = [r for r in revisits if not any(o[0] == r[0] and o[1] == "response" and o[2] == r[2] and o[3] == r[5]
                                            for o in records)]
    profiles: dict[str, int] = defaultdict(int)
    for r in revisits:
        profiles[r[4].rsplit("/", 1)[-1]] += 1
    assert profiles["server-not-modified"] > 0 and sum(1 for rs in fetches.values() for r in rs if r.status == 304)
    moved = sum(s["cluster"]["handoff"]["revisits_received"] for s in status.values())
    stages = ", ".join(f"{name} {at - events['begin']:.1f} s" for name, at in events.items())
    assert cross, "no revisit record refers to an original written by another node: no schedule moved"
    print(f"pages {len(fetches)}, fetches {sum(len(v) for v in fetches.values())}, revisit records {dict(profiles)}, "
          f"referring to another node's original {len(cross)}, schedule entries received by hand-off (A, C) {moved}, "
          f"stages {stages}, "
          f"live nodes declared dead {false_deaths}")
