"""Steering a running cluster of real peerd daemons, judged from the local web server's own request log.

Two nodes; the founder's scope flags reach the node that joins; `peerctl pause` on one node stops the whole
cluster (not one request while paused), `peerctl seed` on the other routes seeds to their owners, `peerctl resume`
starts it again, and `peerctl scope --deny-host` narrows it everywhere; a third node joining after the change
crawls by it too. A second test shows a page budget holding fleet-wide while hosts move to a node that joins.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import httpx
import trio

from peer.control import auth_headers
from peerlab.localweb.graph import SiteGraph
from tests.support.crawl import child_env, kill_pid, node_config, peerd_argv, start_local_web
from tests.test_cluster_daemons import _post

pytestmark = pytest.mark.slow  # real peerd processes

SECRET = "test-cluster-secret-0123456789"
EXCLUDE = r"/p/[0-9]*3\.html$"


class Daemons:
    """The peerd processes this test started (stopped by PID), with their logs."""

    def __init__(self, tmp: Path, web, dns, **overrides) -> None:
        self.tmp, self.web, self.dns, self.overrides = tmp, web, dns, overrides
        self.procs: dict[str, trio.Process] = {}
        self.seed: str | None = None

    async def start(self, name: str, *, weight: int = 100, extra: tuple[str, ...] = ()) -> None:
        cfg = node_config(self.tmp / name, self.web, self.dns, node_id=name, **self.overrides)
        argv = peerd_argv(cfg) + ["--weight", str(weight), "--contact", f"https://nodes.test/{name}"]
        if self.seed:
            argv += ["--join", self.seed]
        env = child_env()
        env["PEERCRAWL_CLUSTER_SECRET"] = SECRET
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the test's tmp dir
        proc = self.procs[name] = await trio.lowlevel.open_process(argv + list(extra), env=env, stderr=log)
        # a bound, not a wait: starting a daemon on a loaded 2-core machine has taken over 30 s
        with trio.fail_after(120):
            while not (self.tmp / name / "peer.addr").exists():
                assert proc.poll() is None, f"{name} exited early: {self.log_tail(name)}"
                await trio.sleep(0.05)
        if self.seed is None:
            self.seed = (self.tmp / name / "peer.addr").read_text().strip()

    def control(self, name: str) -> str:
        return (self.tmp / name / "control.addr").read_text().strip()

    def data_dir(self, name: str) -> str:
        """What peerctl is pointed at: it finds the control address and the control token there."""
        return str(self.tmp / name)

    def log_tail(self, name: str, lines: int = 15) -> str:
        return "\n".join((self.tmp / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])

    async def get(self, name: str, path: str) -> dict:
        async with httpx.AsyncClient(timeout=30.0) as client:  # 30 s: a node on a loaded machine answers late
            return (await client.get(f"http://{self.control(name)}{path}",
                                     headers=auth_headers(self.tmp / name))).json()

    async def peerctl(self, *args: str) -> str:
        done = await trio.to_thread.run_sync(lambda: subprocess.run(
            [sys.executable, "-c", "import sys; from peer.cli.main import peerctl_main; sys.exit(peerctl_main())",
             *args], capture_output=True, text=True, timeout=150, env=child_env()))
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    async def wait_settings(self, names, check, timeout: float = 60.0) -> dict[str, dict]:
        seen: dict[str, dict] = {}
        with trio.move_on_after(timeout):
            while True:
                seen = {n: (await self.get(n, "/settings"))["settings"] for n in names}
                if all(check(s) for s in seen.values()):
                    return seen
                await trio.sleep(0.05)
        raise AssertionError(f"settings did not reach every node: {seen}")

    async def wait_done(self, names, timeout: float = 120.0) -> None:
        """Every node reports the cluster idle twice in a row, 0.5 s apart."""
        with trio.fail_after(timeout):
            quiet = 0
            while quiet < 2:
                statuses = [await self.get(n, "/status") for n in names]
                quiet = quiet + 1 if all(s["done"] for s in statuses) else 0
                await trio.sleep(0.5)

    async def stop_all(self) -> None:
        for proc in self.procs.values():
            kill_pid(proc.pid, signal.SIGTERM)
        with trio.move_on_after(20):
            for proc in self.procs.values():
                await proc.wait()

    def kill_all(self) -> None:
        for proc in self.procs.values():
            kill_pid(proc.pid)


def _pages(log) -> list:
    return [r for r in log if not r.path.endswith("robots.txt")]


async def test_pause_seed_resume_and_scope_steer_the_whole_cluster(tmp_path):
    graph = SiteGraph.generate(seed=31, hosts=30, pages_per_host=8, features=False)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        nodes = Daemons(tmp_path, web, dns, seeds=[], exit_when_done=False, delay=0.2, concurrency=32)
        try:
            await nodes.start("A", extra=("--exclude", EXCLUDE, "--max-pages-per-host", "5"))
            await nodes.start("B")  # no scope flags: it crawls by the cluster's record
            first = await nodes.wait_settings(["A", "B"], lambda s: s["exclude"] == [EXCLUDE])
            assert first["B"] == first["A"] and first["B"]["origin"] == "A" and first["B"]["max_pages_per_host"] == 5

            out = await nodes.peerctl("pause", "--data-dir", nodes.data_dir("B"))
            assert out.startswith("paused")
            await nodes.wait_settings(["A", "B"], lambda s: s["paused"])
            seeds = tmp_path / "seeds.txt"
            seeds.write_text("# the web's seeds\n" + "\n".join(web.seeds()) + "\nnot a url\n")
            out = await nodes.peerctl("seed", "--data-dir", nodes.data_dir("B"), "--file", str(seeds))
            numbers = dict(re.findall(r"(\d+) (queued here|sent to their owners)", out)[i][::-1] for i in range(2))
            assert int(numbers["queued here"]) + int(numbers["sent to their owners"]) == len(web.seeds()), out
            assert "not URLs: 1" in out
            await trio.sleep(2.0)
            assert web.log == [], "a paused cluster fetched something"

            # the nodes resume when the control request lands, before peerctl has exited: the time it was asked
            resume_asked = time.time()
            out = await nodes.peerctl("resume", "--data-dir", nodes.data_dir("A"))
            assert out.startswith("resumed")
            with trio.fail_after(60):
                while len({r.host for r in _pages(web.log)}) < 8:
                    await trio.sleep(0.05)
            visited = {r.host for r in web.log}
            denied = next(h.name for h in graph.hosts if h.name not in visited)
            out = await nodes.peerctl("scope", "--data-dir", nodes.data_dir("B"), "--deny-host", denied)
            changed_at = time.time()
            assert denied in out and "v4" in out  # v2 paused, v3 resumed, v4 this change
            await nodes.wait_settings(["A", "B"], lambda s: s["denied_hosts"] == [denied])
            await nodes.start("C", weight=50)  # joins after the change: it gets the record at once
            await nodes.wait_settings(["C"], lambda s: s["version"] == 4 and s["denied_hosts"] == [denied])
            await nodes.wait_done(["A", "B", "C"])
            shown = await nodes.peerctl("scope", "--data-dir", nodes.data_dir("C"))
            assert f"denied_hosts         {denied}" in shown and "max_pages_per_host   5" in shown
            await nodes.stop_all()
        finally:
            nodes.kill_all()
        nursery.cancel_scope.cancel()

    (tmp_path / "web.log").write_text("".join(r.to_json() + "\n" for r in web.log))
    pages = _pages(web.log)
    assert min(r.wall_start for r in web.log) >= resume_asked
    assert not [r.path for r in pages if re.search(EXCLUDE, r.path)], "an excluded page was fetched"
    per_host: dict[str, int] = {}
    for r in pages:
        per_host[r.host] = per_host.get(r.host, 0) + 1
    assert max(per_host.values()) == 5, per_host  # the budget held, and bit
    late = [r for r in web.log if r.host == denied and r.wall_start > changed_at + 0.5]
    assert late == [], f"{denied} fetched after it was denied"
    fetchers = {r.user_agent.rsplit("/", 1)[-1].rstrip(")") for r in pages}
    assert {"A", "B"} <= fetchers, fetchers  # seeds given to B reached A's hosts too, and the other way round
    seeded_hosts = {u.split("//", 1)[1].split(":", 1)[0] for u in web.seeds()}
    assert seeded_hosts - {denied} <= {r.host for r in pages}
    print(f"pages {len(pages)} on {len(per_host)} hosts by {sorted(fetchers)}; denied {denied} "
          f"(requests to it: {sum(1 for r in web.log if r.host == denied)})")


async def test_a_page_budget_holds_fleet_wide_while_hosts_move_to_a_joining_node(tmp_path):
    graph = SiteGraph.generate(seed=37, hosts=24, pages_per_host=14, features=False)
    budget = 5
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        nodes = Daemons(tmp_path, web, dns, exit_when_done=False, delay=1.0, concurrency=32)
        try:
            await nodes.start("A", extra=("--max-pages-per-host", str(budget)))
            with trio.fail_after(60):  # many hosts have part of their budget spent on A when B joins
                while len({r.host for r in _pages(web.log)}) < len(graph.hosts) // 2:
                    await trio.sleep(0.05)
            # paused while B starts and joins (a start has taken 40 s on a loaded machine, A alone would spend
            # every budget meanwhile), resumed once B has the pause too
            await _post(nodes.control("A"), "/pause", tmp_path / "A")  # not peerctl: it takes seconds to start
            await nodes.start("B", weight=150)
            await nodes.wait_settings(["A", "B"], lambda s: s["paused"])
            await _post(nodes.control("A"), "/resume", tmp_path / "A")
            await nodes.wait_done(["A", "B"])
            await nodes.stop_all()
        finally:
            nodes.kill_all()
        nursery.cancel_scope.cancel()
    by_host: dict[str, set[str]] = {}
    per_host: dict[str, int] = {}
    for r in _pages(web.log):
        per_host[r.host] = per_host.get(r.host, 0) + 1
        by_host.setdefault(r.host, set()).add(r.user_agent.rsplit("/", 1)[-1].rstrip(")"))
    moved = [h for h, who in by_host.items() if who == {"A", "B"}]
    print(f"hosts {len(per_host)}, fetched by both nodes {len(moved)}, pages per host {sorted(per_host.values())}")
    assert len(moved) >= 3, by_host  # hosts did move mid-budget
    assert max(per_host.values()) == budget, per_host
