"""Plug-ins across real peerd daemons on loopback, crawling the local web's structured pages.

- Three nodes with the examples loaded write exactly the items the oracle expects, with the node that owns the
  structured pages killed (SIGKILL) mid-crawl and restarted from its data dir: no item is lost, and a page gives
  its items once per fetch that committed (the fetches cut by the kill give none); `peerctl items` reads them
  from every node, `peerctl plugins` shows one chain everywhere.
- A node whose plug-in chain differs is refused at join, by itself and by the member, each naming the
  difference; a reload that one node cannot load runs on none (the error names the node and the plug-in);
  after `peerctl plugins reload` gives the members that chain, the same node joins. `peerctl plugins` and
  `peerctl items` ask one node for the whole cluster, and name a node that does not answer.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from peer.cli.main import peerctl_main
from peerlab.localweb.graph import SiteGraph
from tests.support.crawl import child_env, kill_pid, node_config, peerd_argv, start_local_web, urls_fetched
from tests.support.plugin_web import ROOT, check_items, expected_fetched
from tests.test_cluster_daemons import _paused, _post

pytestmark = pytest.mark.slow  # real peerd daemons

SECRET = "test-cluster-secret-0123456789"
#: A fetch that ended this long before the kill may not have committed (its node's event loop had it in hand).
COMMIT_SLACK = 1.0

MAIN_TEXT = '\n[[plugins]]\nuse = "peer.plugins:MainTextExtractor"\nurl = "/articles/a"\nmin_chars = 100\n'
DOCS = '\n[[plugins]]\nuse = "examples.docs_filter:DocsFilter"\n'


def _config(tmp: Path, name: str, *tables: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text((ROOT / "examples" / "products.toml").read_text() + "".join(tables))
    return path


def _peerctl(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from peer.cli.main import peerctl_main; "
                           "sys.exit(peerctl_main())", *argv], capture_output=True, text=True, timeout=60,
                          env=child_env())


def _peerctl_here(*argv: str) -> subprocess.CompletedProcess:
    """peerctl run in this process (in a thread: it blocks), as `_peerctl` runs it in its own: the command's
    code and output, without a new interpreter's start (seconds on a loaded machine)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = peerctl_main(list(argv))
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


class Nodes:
    def __init__(self, tmp: Path, web, dns, **overrides) -> None:
        self.tmp, self.web, self.dns, self.overrides = tmp, web, dns, overrides
        self.procs: dict[str, trio.Process] = {}
        self.seed: str | None = None

    async def start(self, name: str, config: Path, *, join: bool = True, wait_ready: bool = True,
                    env: dict[str, str] | None = None) -> trio.Process:
        cfg = node_config(self.tmp / name, self.web, self.dns, node_id=name, **self.overrides)
        argv = peerd_argv(cfg) + ["--config", str(config), "--suspicion-timeout", "2",
                                  "--contact", f"https://nodes.test/{name}"]
        if join and self.seed:
            argv += ["--join", self.seed]
        env = {**child_env(), **(env or {})}
        env["PEERCRAWL_CLUSTER_SECRET"] = SECRET
        # a killed node's heir lends no lane of the web's one address for lease + total time-out (62 s by default)
        env["PEERCRAWL_TOTAL_TIMEOUT"] = "10"
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the test's tmp dir
        proc = await trio.lowlevel.open_process(argv, env=env, stderr=log)
        self.procs[name] = proc
        if wait_ready:
            # a bound, not a wait: starting a daemon on a loaded 2-core machine has taken over 30 s
            with trio.fail_after(120):
                while not (self.tmp / name / "peer.addr").exists():
                    assert proc.poll() is None, f"{name} exited early: {self.log(name)[-2000:]}"
                    await trio.sleep(0.05)
            if self.seed is None:
                self.seed = (self.tmp / name / "peer.addr").read_text().strip()
        return proc

    def control(self, name: str) -> str:
        return (self.tmp / name / "control.addr").read_text().strip()

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def kill_all(self) -> None:
        for proc in self.procs.values():
            kill_pid(proc.pid)


def _structured_fetches(web, truth) -> list:
    return [r for r in web.log if r.host == truth.host and r.path in {*truth.products, *truth.articles}]


async def test_three_nodes_with_a_kill_write_the_oracles_items(tmp_path):
    graph = SiteGraph.generate(seed=8, hosts=20, pages_per_host=6, seed_hosts=2, structured=True)
    truth = graph.structured
    config = _config(tmp_path, "chain", MAIN_TEXT, DOCS)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        expected = web.expected()
        nodes = Nodes(tmp_path, web, dns, delay=0.3, concurrency=32)
        try:
            # paused from A's start until B and C have joined, and again while the killed node restarts: a start
            # has taken 20-40 s on a loaded machine, in which the others would finish the crawl
            for name in ("A", "B", "C"):
                await nodes.start(name, config, join=name != "A")
                if name == "A":
                    await _post(nodes.control("A"), "/pause", tmp_path / "A")
            await _paused(nodes, {"A", "B", "C"})
            # one node asked, every node's chain shown
            shown = await trio.to_thread.run_sync(lambda: _peerctl("plugins", f"--data-dir={tmp_path / 'B'}"))
            assert shown.returncode == 0, shown.stderr
            assert shown.stdout.count("peer.plugins:RuleExtractor v1") == 3 and "differs" not in shown.stdout
            assert {line.split(":")[0] for line in shown.stdout.splitlines() if " chain " in line} == {"A", "B", "C"}
            await _post(nodes.control("A"), "/resume", tmp_path / "A")
            # the node that fetches the structured pages is killed once a third of them are fetched
            with trio.fail_after(120):
                while len(_structured_fetches(web, truth)) < (len(truth.products) + len(truth.articles)) / 3:
                    await trio.sleep(0.02)
            owner = _structured_fetches(web, truth)[0].user_agent.rsplit("/", 1)[1].rstrip(")")
            kill_at = time.time()
            kill_pid(nodes.procs[owner].pid, signal.SIGKILL)
            await nodes.procs[owner].wait()
            other = next(n for n in "ABC" if n != owner)  # restarted, it joins through a live member
            await _post(nodes.control(other), "/pause", tmp_path / other)
            nodes.seed = (tmp_path / other / "peer.addr").read_text().strip()
            (tmp_path / owner / "peer.addr").unlink()
            await nodes.start(owner, config)
            await _paused(nodes, {"A", "B", "C"})
            await _post(nodes.control(other), "/resume", tmp_path / other)
            with trio.fail_after(240):
                for name in ("A", "B", "C"):
                    assert await nodes.procs[name].wait() == 0, nodes.log(name)[-3000:]
        finally:
            nodes.kill_all()
        nursery.cancel_scope.cancel()

    assert urls_fetched(web, expected) == expected_fetched(graph, expected, web.port)
    listed = _peerctl("items", *(f"--data-dir={tmp_path / n}" for n in "ABC"))
    assert listed.returncode != 0 and "cannot reach node" in listed.stderr  # the nodes are gone: read the files
    items = [json.loads(line) for n in "ABC" if (tmp_path / n / "items" / "items.jsonl").exists()
             for line in (tmp_path / n / "items" / "items.jsonl").read_text().splitlines()]
    # every page's items are the oracle's; a page gives them once per fetch that committed
    per_page: dict[str, int] = {}
    for item in items:
        per_page[item["_page"]] = per_page.get(item["_page"], 0) + 1
    check_items(graph, list({i["_page"]: i for i in items}.values()), web.port)
    for path in (*truth.products, *truth.articles):
        url = truth.url(path, web.port)
        fetches = [r for r in web.log if r.host == truth.host and r.path == path]
        certain = [r for r in fetches if r.wall_start > kill_at or r.wall_end < kill_at - COMMIT_SLACK]
        assert len(certain) <= per_page[url] <= len(fetches), (url, per_page[url], len(fetches))
    assert sum(per_page.values()) == len(items)


async def test_a_node_with_other_plugins_is_refused_until_reload(tmp_path):
    graph = SiteGraph.generate(seed=9, hosts=20, pages_per_host=4, structured=True)
    three = _config(tmp_path, "three", MAIN_TEXT, DOCS)
    two = _config(tmp_path, "two", MAIN_TEXT)  # no documentation filter
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        nodes = Nodes(tmp_path, web, dns, delay=5.0, concurrency=4, exit_when_done=False)
        try:
            await nodes.start("A", three, join=False)
            await nodes.start("B", three, env={"PLUGIN_CASE_REFUSE": "1"})
            refused = await nodes.start("D", two, wait_ready=False)
            with trio.fail_after(60):
                code = await refused.wait()
            assert code != 0
            log = nodes.log("D")
            assert "refused by A: this node's plug-ins differ from the cluster's: plug-in #3 differs: this node " \
                   "runs nothing, the cluster runs examples.docs_filter:DocsFilter version 1" in log, log[-2000:]
            # the member refused it too, and says what differs
            shown = await trio.to_thread.run_sync(lambda: _peerctl("plugins", f"--data-dir={tmp_path / 'A'}"))
            assert shown.returncode == 0, shown.stderr
            assert "refused D: plug-in #3 differs: D runs nothing, this node runs examples.docs_filter:DocsFilter" \
                in shown.stdout, shown.stdout
            before = {line.split(" chain ")[1] for line in shown.stdout.splitlines() if " chain " in line}
            # a reload that one node cannot load runs nowhere: the error names the node and the plug-in
            refusing = tmp_path / "refusing.toml"
            refusing.write_text(two.read_text() + '\n[[plugins]]\nuse = "tests.support.plugin_cases:RefusesWhere"\n')
            failed = await trio.to_thread.run_sync(
                lambda: _peerctl_here("plugins", "reload", "--config", str(refusing), f"--data-dir={tmp_path / 'A'}"))
            assert failed.returncode not in (0, 3)
            assert "every node keeps the chain it runs: B: plug-in tests.support.plugin_cases:RefusesWhere: bad " \
                   "settings: refuses to load where PLUGIN_CASE_REFUSE is set" in failed.stderr, failed.stderr
            shown = await trio.to_thread.run_sync(lambda: _peerctl_here("plugins", f"--data-dir={tmp_path / 'B'}"))
            assert {line.split(" chain ")[1] for line in shown.stdout.splitlines() if " chain " in line} == before
            # one that every node loads runs everywhere
            reload = await trio.to_thread.run_sync(
                lambda: _peerctl_here("plugins", "reload", "--config", str(two), f"--data-dir={tmp_path / 'A'}"))
            assert reload.returncode == 0, reload.stderr
            assert len({line.split(" chain ")[1] for line in reload.stdout.splitlines()}) == 1
            assert {line.split(":")[0] for line in reload.stdout.splitlines()} == {"A", "B"}
            (tmp_path / "D" / "peer.addr").unlink(missing_ok=True)
            await nodes.start("D", two)
            with trio.fail_after(60):
                while "joined the cluster" not in nodes.log("D"):
                    assert nodes.procs["D"].poll() is None, nodes.log("D")[-2000:]
                    await trio.sleep(0.1)
            # the items every node exported so far, through one node
            on_disk = {n: (tmp_path / n / "items" / "items.jsonl").read_text().splitlines()
                       if (tmp_path / n / "items" / "items.jsonl").exists() else [] for n in "ABD"}
            listed = await trio.to_thread.run_sync(lambda: _peerctl_here("items", f"--data-dir={tmp_path / 'D'}"))
            assert listed.returncode == 0, listed.stderr
            got = [json.loads(line) for line in listed.stdout.splitlines()]
            assert all(i["_page"].startswith("http://") and "_fetched_at" in i for i in got)
            # at least what was exported before the ask
            assert {(i["_node"], i["_seq"]) for i in got} >= {(n, json.loads(x)["_seq"]) for n, v in on_disk.items()
                                                             for x in v}
            # a node that does not answer is named, the others' answers shown
            kill_pid(nodes.procs["B"].pid, signal.SIGKILL)
            await nodes.procs["B"].wait()
            shown = await trio.to_thread.run_sync(lambda: _peerctl_here("plugins", f"--data-dir={tmp_path / 'A'}"))
            assert shown.returncode == 3 and shown.stderr.startswith("B: did not answer: "), shown.stderr
            assert {line.split(":")[0] for line in shown.stdout.splitlines() if " chain " in line} == {"A", "D"}
        finally:
            nodes.kill_all()
        nursery.cancel_scope.cancel()
