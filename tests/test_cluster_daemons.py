"""Real peerd daemons forming a cluster on loopback, crawling a local web the test serves (HTTP + DNS).

The issue's scenario: nodes A=150, B=80, C=200, D=40 crawl a generated web of 100 hosts; at a tenth of it
the crawl is paused (`POST /pause`, which reaches every node: no request starts until the resume), E=300 joins
(and is paused too), C leaves gracefully (`peerctl leave`); once the crawl is resumed B is killed with SIGKILL
(then restarted from its data dir, as systemd or Kubernetes would). Afterwards, from the web server's own request log:
- the union of fetched pages is exactly the reachable-and-allowed set (nothing lost);
- pages fetched twice are counted (at most 5% of the pages); of the pages B fetched, only those in flight at
  the kill (or fetched just before it, their seen-key replica not yet sent) are fetched again;
- no host ever had two connections open at once, and no Crawl-delay was broken.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import trio

from peer.control import auth_headers
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import (
    RequestRecord,
    crawl_delay_violations,
    max_concurrent_connections_per_host,
    requested_urls,
)
from tests.support.crawl import child_env, kill_pid, node_config, peerd_argv, start_local_web, urls_fetched

pytestmark = pytest.mark.slow  # real peerd daemons

SECRET = "test-cluster-secret-0123456789"
#: A page fetched this long before the kill may have lost its replica with B (they leave every 0.1 s; the rest
#: is the kill's own delay and the send queue).
REPLICA_SLACK = 1.0


def _cluster_env() -> dict[str, str]:
    env = child_env()
    env["PEERCRAWL_CLUSTER_SECRET"] = SECRET
    # A request's time in service is bounded by the total time-out, and so is what a node's death costs the
    # address its lanes were lent from: the heir lends none until lease + total time-out have passed (docs/cluster.md,
    # "Per-address limits"), 62 s with the default of 60, in which every host of the local web (one address) waits.
    # The web's slowest answer takes 1 s.
    env["PEERCRAWL_TOTAL_TIMEOUT"] = "10"
    return env


class Cluster:
    """The daemons this test started, by name, with their logs."""

    def __init__(self, tmp: Path, web, dns, **overrides) -> None:
        self.tmp, self.web, self.dns, self.overrides = tmp, web, dns, overrides
        self.procs: dict[str, trio.Process] = {}
        self.seed: str | None = None

    async def start(self, name: str, weight: int, *, join: bool = True, extra: tuple[str, ...] = ()) -> trio.Process:
        cfg = node_config(self.tmp / name, self.web, self.dns, node_id=name, **self.overrides)
        # each node names itself in its User-Agent (the contact URL), so the web's log tells who fetched what
        argv = peerd_argv(cfg) + ["--weight", str(weight), "--suspicion-timeout", "2",
                                  "--contact", f"https://nodes.test/{name}"]
        if join and self.seed:
            argv += ["--join", self.seed]
        argv += list(extra)
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the test's tmp dir
        proc = await trio.lowlevel.open_process(argv, env=_cluster_env(), stderr=log)
        self.procs[name] = proc
        # a bound, not a wait: starting a daemon on a loaded 2-core machine has taken over 30 s
        with trio.fail_after(120):
            while not (self.tmp / name / "peer.addr").exists() or proc.poll() is not None:
                assert proc.poll() is None, f"{name} exited early: {self.log_tail(name)}"
                await trio.sleep(0.05)
        if self.seed is None:
            self.seed = (self.tmp / name / "peer.addr").read_text().strip()
        return proc

    def control(self, name: str) -> str:
        return (self.tmp / name / "control.addr").read_text().strip()

    def log_tail(self, name: str, lines: int = 15) -> str:
        text = (self.tmp / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def kill_all(self) -> None:
        for proc in self.procs.values():
            kill_pid(proc.pid)


async def _get(address: str, path: str, data_dir) -> dict:
    """A control-endpoint GET; 30 s allowed (a node busy with a hand-off of thousands of arcs answers late)."""
    async with httpx.AsyncClient(timeout=30.0) as client:
        resp = await client.get(f"http://{address}{path}", headers=auth_headers(data_dir))
        return resp.json()


async def _post(address: str, path: str, data_dir: Path) -> dict:
    """A control-endpoint POST with an empty JSON body (`/pause`, `/resume`)."""
    async with httpx.AsyncClient(timeout=30.0) as client:
        resp = await client.post(f"http://{address}{path}", json={}, headers=auth_headers(data_dir))
        assert resp.status_code == 200, resp.text
        return resp.json()


async def _paused(cluster: Cluster, names: set[str], timeout: float = 60.0) -> float:
    """Wait until every node in `names` reports the crawl paused and no worker busy; returns the wall time
    from which none of them starts a request until the crawl is resumed."""
    why: dict[str, object] = {}
    with trio.move_on_after(timeout):
        while True:
            why = {}
            for name in sorted(names):
                try:  # a node just started may not serve its control endpoint yet
                    status = await _get(cluster.control(name), "/status", cluster.tmp / name)
                except (OSError, httpx.HTTPError) as exc:
                    why[name] = repr(exc)
                    continue
                if not status["settings"]["paused"] or status["queue"]["workers_busy"]:
                    why[name] = (status["settings"], status["queue"])
            if not why:
                return time.time()
            await trio.sleep(0.1)
    raise AssertionError(f"the pause did not reach every node within {timeout:g} s: {why}")


async def _form(cluster: Cluster, nodes: tuple[tuple[str, int], ...], extra=lambda name: ()) -> None:
    """Start `nodes`, the first founding the cluster and the others joining it at once, with the crawl paused from
    the founder's start until every node has joined: the crawl runs on the whole cluster however long each daemon
    takes to start (on a loaded machine a start has taken 20 s, the founder alone would crawl most of the web)."""
    (first, weight), *others = nodes
    await cluster.start(first, weight, join=False, extra=extra(first))
    await _post(cluster.control(first), "/pause", cluster.tmp / first)
    async with trio.open_nursery() as starting:  # the joiners start side by side: their imports use both cores
        for name, weight in others:
            starting.start_soon(functools.partial(cluster.start, name, weight, extra=extra(name)))
    await _paused(cluster, {name for name, _ in nodes})
    await _post(cluster.control(first), "/resume", cluster.tmp / first)


def _started_while_paused(web, names, idle_at: float, resume_at: float) -> list:
    """Requests the nodes `names` started between `idle_at` and `resume_at` (none, if the pause held)."""
    agents = tuple(f"nodes.test/{name})" for name in names)
    return [r for r in web.log if idle_at <= r.wall_start <= resume_at and r.user_agent.endswith(agents)]


async def _progress(cluster: Cluster, web, expected, fraction: float, names, timeout: float = 120.0) -> None:
    """Wait until `fraction` of the web is fetched; if it is not within `timeout`, say what each node reports."""
    with trio.move_on_after(timeout):
        await _wait_fetched(web, expected, fraction, timeout + 1)
        return
    statuses = {}
    for name in sorted(names):
        status = await _get(cluster.control(name), "/status", cluster.tmp / name)
        statuses[name] = {k: status[k] for k in ("done", "queue", "settings", "held")}
        statuses[name]["cluster"] = {k: status["cluster"].get(k)
                                     for k in ("members", "handoff", "backups", "fence", "progress", "done")}
    have = len(urls_fetched(web, expected)) / len(expected.fetched)
    raise AssertionError(f"{have:.1%} of the web fetched, not {fraction:.1%}, {timeout:g} s on: {statuses}")


async def _wait_fetched(web, expected, fraction: float, timeout: float) -> None:
    total = len(expected.fetched)
    with trio.fail_after(timeout):
        while len(urls_fetched(web, expected)) < fraction * total:
            await trio.sleep(0.05)


async def _settled(cluster: Cluster, owners: set[str], timeout: float = 60.0) -> None:
    """Wait until every node in `owners` shows exactly `owners` alive, no hand-off under way and its replicas
    sent where the ring puts them."""
    why: dict[str, str] = {}
    with trio.move_on_after(timeout):
        while True:
            why = {}
            for name in sorted(owners):
                status = (await _get(cluster.control(name), "/status", cluster.tmp / name))["cluster"]
                alive = {m["node_id"] for m in status["members"] if m["state"] == "alive"}
                handoff = status["handoff"]
                if alive != owners or handoff["outstanding"] or handoff["pending_arcs"] or not status["replica"]["synced"]:
                    why[name] = (f"alive {sorted(alive)}, hand-off {handoff['outstanding']}/{handoff['pending_arcs']}, "
                                 f"replica {status['replica']}")
            if not why:
                return
            await trio.sleep(0.2)
    raise AssertionError(f"the cluster did not settle on {sorted(owners)} within {timeout:g} s: {why}")


async def test_four_nodes_join_leave_and_kill_lose_nothing(tmp_path):
    graph = SiteGraph.generate(seed=51, hosts=100, pages_per_host=6, links_per_page=8, seed_hosts=4)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        expected = web.expected()
        cluster = Cluster(tmp_path, web, dns, delay=0.3, concurrency=32)
        try:
            await _form(cluster, (("A", 150), ("B", 80), ("C", 200), ("D", 40)))
            await _wait_fetched(web, expected, 0.10, 120)
            # The crawl is paused (a pause reaches every node, and a node that joins later) from a tenth of the web
            # through E's join, C's leave and until the ring has settled (every node on the ring A, B, D, E, no
            # hand-off under way, every replica where that ring puts it): the crawl is still under way at B's
            # kill and restart however long a join or a leave takes on a loaded machine (starting a daemon there
            # can take longer than the rest of the crawl), and what B's death costs is measured alone.
            await _post(cluster.control("A"), "/pause", cluster.tmp / "A")
            idle_at = await _paused(cluster, {"A", "B", "C", "D"})
            await cluster.start("E", 300)
            await _paused(cluster, {"E"})
            leave = await trio.to_thread.run_sync(
                lambda: subprocess.run(
                    [sys.executable, "-c", "import sys; from peer.cli.main import peerctl_main; sys.exit(peerctl_main())",
                     "leave", "--data-dir", str(cluster.tmp / "C"), "--timeout", "120"],
                    capture_output=True, text=True, timeout=150, env=child_env()))
            assert leave.returncode == 0, leave.stdout + leave.stderr
            with trio.fail_after(90):
                assert await cluster.procs["C"].wait() == 0, cluster.log_tail("C")
            c_status = [json.loads(line) for line in (tmp_path / "C.log").read_text().splitlines()
                        if line.startswith("{")]
            assert any(e.get("msg") == "leave: everything handed off" for e in c_status), cluster.log_tail("C")
            settle_began = time.time()
            await _settled(cluster, {"A", "B", "D", "E"})
            resumed_at = len(urls_fetched(web, expected)) / len(expected.fetched)
            resume_at = time.time()
            started = _started_while_paused(web, "ABCDE", idle_at, resume_at)
            assert not started, f"the crawl went on while paused: {len(started)} requests, e.g. {started[:3]}"
            await _post(cluster.control("A"), "/resume", cluster.tmp / "A")
            # fetching again, requests in flight: 3% more of the web, or half of what is left when less than 6% is
            await _progress(cluster, web, expected, min(resumed_at + 0.03, (1 + resumed_at) / 2), "ABDE")
            for name in ("A", "B", "D", "E"):  # membership's probes and gossip travel as UDP datagrams
                links = (await _get(cluster.control(name), "/status", cluster.tmp / name))["cluster"]["links"]
                assert links["datagrams"] and links["datagrams_sent"] > 0 and links["datagrams_received"] > 0, links
                assert links["datagrams_refused"] == 0, links
            # pages B is done with whose release has not reached its backups (it waits for the acks of the links
            # the page routed, `--replicas`): its heirs promote them at its death and fetch them again
            status_at = time.time()
            unreleased = (await _get(cluster.control("B"), "/status", cluster.tmp / "B"))["cluster"]["backups"][
                "unreleased"]
            kill_at = time.time()
            print(f"settled {resume_at - settle_began:.1f} s after C left, killed B at {len(urls_fetched(web, expected))}"
                  f" pages ({resumed_at:.0%} at the resume)")
            kill_pid(cluster.procs["B"].pid, signal.SIGKILL)
            await cluster.procs["B"].wait()
            killed_at = time.time()  # B may start a request between the clock read above and the signal
            # the others declare B dead (suspicion timeout 2 s), then B is restarted from its data dir
            with trio.fail_after(90):
                while True:
                    view = await _get(cluster.control("A"), "/cluster", cluster.tmp / "A")
                    states = {n["node_id"]: n["state"] for n in view["nodes"]}
                    if states.get("B") == "dead":
                        break
                    await trio.sleep(0.2)
            assert states["C"] == "leaving" and states["E"] == "alive"
            await cluster.start("B", 80)
            with trio.fail_after(240):
                for name in ("A", "B", "D", "E"):
                    assert await cluster.procs[name].wait() == 0, cluster.log_tail(name)
        finally:
            cluster.kill_all()
        nursery.cancel_scope.cancel()

    (tmp_path / "web.log").write_text("".join(r.to_json() + "\n" for r in web.log))  # for a post-mortem
    fetched = urls_fetched(web, expected)
    missing = set(expected.fetched) - fetched
    assert not missing, sorted(missing)[:10]
    assert fetched == set(expected.fetched)
    counts = requested_urls(web.log, port=web.port)
    twice = sum(n - 1 for u, n in counts.items() if n > 1 and not u.endswith("/robots.txt")
                and u not in expected.retried)
    in_flight_at_kill = sum(1 for r in web.log if r.wall_start <= kill_at and r.wall_end >= kill_at - 0.5
                            and not r.path.endswith("robots.txt"))
    # What died with B: its seen-set and its queue. B's seen keys of fetched pages were replicated to the node
    # that owns each of its arcs once it is gone (peer/cluster/replicas/seenreplicas.py), so while B is dead its hosts' new owners
    # fetch again only what was under way at the kill, or fetched in the moment before it, whose replica had
    # not left yet (every 0.1 s), or done with by B and not yet released to its backups (`unreleased`: its
    # heirs promote those from the replicas). The joins and the leave move seen-sets with their arcs.
    firsts: dict[str, RequestRecord] = {}
    repeats_before = repeats_after = b_pages_before_kill = 0
    unexplained: list[str] = []
    for r in sorted(web.log, key=lambda r: r.wall_start):
        if r.path.endswith("robots.txt"):
            continue
        url = f"http://{r.host}:{web.port}{r.path}"
        if r.wall_start < kill_at and r.user_agent.endswith("nodes.test/B)"):
            b_pages_before_kill += 1
        if url in firsts and url not in expected.retried:
            repeats_before += r.wall_start < kill_at
            repeats_after += r.wall_start >= kill_at
            first = firsts[url]
            if (r.wall_start >= kill_at and first.user_agent.endswith("nodes.test/B)")
                    and not (first.wall_start <= killed_at and first.wall_end >= kill_at - REPLICA_SLACK)):
                unexplained.append(url)
        firsts.setdefault(url, r)
    after_kill = sum(1 for r in firsts.values() if r.wall_start >= kill_at)
    print(f"pages {len(fetched)}, fetched twice {twice}: {repeats_before} before the kill (joins and the leave), "
          f"{repeats_after} after it; in flight at the kill {in_flight_at_kill}, "
          f"pages B fetched before the kill {b_pages_before_kill}, pages first fetched after the kill {after_kill}")
    assert twice == repeats_before + repeats_after
    late = sum(1 for r in web.log if status_at <= r.wall_end <= kill_at and r.user_agent.endswith("nodes.test/B)"))
    assert len(unexplained) <= unreleased + late, \
        f"fetched by B well before the kill, and again after it: {unexplained[:5]} (unreleased {unreleased})"
    # The join and the leave repeat a few pages (a fetch under way when its arc moved; docs/cluster.md lists the
    # races still open), some of them after the kill when the leave ends late.
    assert twice <= 0.05 * len(fetched), twice
    # fleet-wide politeness: one connection per host at a time and every Crawl-delay kept, across all nodes;
    # a request cut by the kill lives on at the server until it notices the dead socket, so those are left out
    uncut = [r for r in web.log if not (r.wall_start <= killed_at and kill_at <= r.wall_end + 0.05)]
    assert max(max_concurrent_connections_per_host(uncut).values()) == 1
    assert crawl_delay_violations(uncut, graph) == []


async def test_two_nodes_over_mutual_tls_crawl_everything(tmp_path):
    """The same crawl with peers speaking mutual TLS (certificates from a CA the test makes)."""
    from tests.test_transport_tls import _ca, _node

    ca = _ca(tmp_path, "cluster-ca")
    graph = SiteGraph.generate(seed=52, hosts=30, pages_per_host=6, features=False, seed_hosts=2)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        expected = web.expected()
        cluster = Cluster(tmp_path, web, dns, delay=0.6, concurrency=16)
        try:
            for name, weight, join in (("A", 100, False), ("B", 100, True)):
                files = _node(tmp_path, ca, name)
                await cluster.start(name, weight, join=join,
                                    extra=("--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca))
                if name == "A":  # A waits for B, paused: B joins a crawl that is not over however long it starts
                    await _post(cluster.control("A"), "/pause", cluster.tmp / "A")
            await _paused(cluster, {"A", "B"})
            await _post(cluster.control("B"), "/resume", cluster.tmp / "B")
            with trio.fail_after(120):
                for name in ("A", "B"):
                    assert await cluster.procs[name].wait() == 0, cluster.log_tail(name)
        finally:
            cluster.kill_all()
        nursery.cancel_scope.cancel()
    assert urls_fetched(web, expected) == set(expected.fetched)
    logs = (tmp_path / "A.log").read_text() + (tmp_path / "B.log").read_text()
    assert '"hand-off complete"' in logs  # B's join moved arcs from A over the TLS link
