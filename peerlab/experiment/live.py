"""Live mode: the plan's nodes as real ``peerd`` processes on loopback, crawling the local web.

The local web (``peerlab.localweb``: ``SiteGraph``, ``serve_web``, ``serve_dns``) is generated from the plan's seed
and ``[web]`` (hosts, pages per host, links per page, ``1 - internal_links`` of them to other hosts, chosen
uniformly: the local web has no popularity skew, so ``web.popularity`` must be 0; ``web.features`` adds the
feature hosts: robots.txt rules, Crawl-delays, redirects, traps). Each node is started as

    python -m peer start --node-id A --weight 150 --listen 127.0.0.1:0 --control 127.0.0.1:0 --data-dir DIR
        --nameserver 127.0.0.1:P --allow-private --delay D --store none|warc --ip-connections 0
        [--exit-when-done] [--join PEER] [--seed URL ...]

with ``PEERCRAWL_CLUSTER_SECRET`` set to a secret made for the run. The first node starts the cluster; every
other joins through a running node's peer address (``DIR/peer.addr``). The first node brings the seeds (a
cluster started without work concludes at once, and for good, that its crawl is finished) and the crawl is
paused through it (``POST /pause``) until every other founding node has joined, then resumed: how long each
start takes does not decide who crawls what. The first phase starts once every view holds the whole initial
cluster.

``--exit-when-done`` is given when the plan ends ``when_done``: the cluster's own termination rounds decide that
the crawl is finished, every node exits by itself, and the run ends once all have. A plan without it ends at
its trigger, and the runner stops the nodes with ``POST /stop``.

Every ``live.sample_interval`` the runner reads ``GET /status`` of every node (and every
``live.progress_interval`` reports pages, rate and queues per node). The URLs sent from node i to
node j in a phase are the growth of i's ``cluster.dispatch.urls_sent[j]`` over the phase. Changes: ``remove``
is ``POST /leave`` (the node hands its arcs off and exits), ``kill`` is SIGKILL of the PID this runner
started, ``add`` starts a new process with ``--join``. A phase ends at its trigger; the next begins once the
cluster has settled: every running node's view holds exactly the new ring's members and no hand-off is under
way. What is sent while it settles (re-routed outboxes, the leaver's last batches) is the transition, counted
apart; ``at`` and ``after_pages`` count time and pages inside phases only. URLs moved at a change are what the
new owners received by hand-off (``cluster.handoff.urls_received``); a killed node's queued URLs are lost.

Ring shares, host shares and what each change moves are computed from ``ring.Ring`` before any process
starts (building rings in this process later would stall the local web it serves), and the last phase's key
shares are checked against a node's own ``GET /cluster`` once the cluster has settled on it.

``live_run`` returns the experiment's result with what a referee needs besides: the web's graph and port, its
request log, and how each node ended (``NodeOutcome``); ``peerlab.demo`` judges the crawl with them. The node data
dirs are removed at the end unless ``live.keep_data``.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import trio

import ring
from peer.control import auth_headers, dashboard_address, read_token

from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import RequestRecord

from .plan import Plan
from .results import ChangeResult, ExperimentResult, PhaseResult, Sample

__all__ = ["LiveError", "LiveRun", "NodeOutcome", "live_experiment", "live_run", "run_live"]

log = logging.getLogger(__name__)

#: Member states that own arcs (docs/ring.md): a node's ring is built from these.
_OWNING = ("alive", "suspect")
#: One process per node on a 2-core machine: past this many the experiment measures the machine, not the ring.
MAX_LIVE_NODES = 24
#: Seconds a node gets to stop cleanly (POST /stop) at the end before it is killed.
STOP_WAIT = 30.0
#: Hosts the crawl starts from: a few, so the first pages spread over several owners at once.
SEED_HOSTS = 4


_LIVE_NOTE = ("live: URLs are first sends counted by each sender (cluster.dispatch.urls_sent). The local web links "
              "hosts uniformly, so the 'links' part (measured against the host share) is not popularity but sampling "
              "and the crawl itself: a sender sends a URL once (recently-sent filter), and which links are still "
              "new changes as the crawl proceeds")


class LiveError(RuntimeError):
    """The live experiment cannot run or went wrong; the message is one line."""


@dataclass(slots=True)
class _Node:
    node_id: str
    weight: int
    data_dir: Path
    log_path: Path
    proc: trio.Process
    control: str = ""
    peer: str = ""
    #: running, leaving, left, killed, stopped (by the runner), done (exited by itself with 0: --exit-when-done),
    #: failed (exited by itself with another code)
    state: str = "running"
    status: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeOutcome:
    """How one node of a live run ended."""

    node_id: str
    weight: int
    #: left (graceful leave), killed, stopped (POST /stop by the runner), done (--exit-when-done, exit code 0),
    #: failed (exited by itself with another code)
    state: str
    exit_code: int | None
    data_dir: Path
    log_path: Path
    #: the last counters read from the node: pages fetched and pages written to its page store
    pages: int
    stored: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveRun:
    """A live run: the experiment's result, and what a referee of the crawl needs (the web and its log)."""

    result: ExperimentResult
    graph: SiteGraph
    port: int
    log: tuple[RequestRecord, ...]
    nodes: tuple[NodeOutcome, ...]
    #: True when the run ended because every node exited through --exit-when-done
    concluded: bool
    #: (what, wall-clock start, wall-clock end) of every change of the ring, the joins at the start included:
    #: from the change until the cluster settled on the new ring. A fetch under way then may be repeated by
    #: the host's new owner (DESIGN decision 6 bounds duplicates by what was in flight).
    changes: tuple[tuple[str, float, float], ...]


def _counters(status: Mapping[str, Any]) -> dict[str, Any]:
    cluster = status.get("cluster") or {}
    dispatch = cluster.get("dispatch") or {}
    handoff = cluster.get("handoff") or {}
    return {
        "pages": int(status.get("pages", 0)),
        "sent": {str(k): int(v) for k, v in (dispatch.get("urls_sent") or {}).items()},
        "handoff_received": int(handoff.get("urls_received", 0)),
        "queued": int((status.get("queue") or {}).get("urls", 0)),
        "in_flight": int((status.get("queue") or {}).get("in_flight", 0)),
        "cluster_done": bool(cluster.get("cluster_done", False)),
    }


def _total_pages(counters: Mapping[str, Mapping[str, Any]]) -> int:
    return sum(c["pages"] for c in counters.values())


def _unsettled(status: Mapping[str, Any], owners: set[str]) -> str:
    """Why a node's status does not show exactly ``owners`` owning arcs with no hand-off under way ("" if it
    does)."""
    cluster = status.get("cluster") or {}
    members = {m["node_id"] for m in cluster.get("members", []) if m.get("state") in _OWNING}
    handoff = cluster.get("handoff") or {}
    why = []
    if members != owners:
        why.append(f"ring members {','.join(sorted(members)) or 'none'}")
    if handoff.get("outstanding"):
        why.append(f"hand-off outstanding {handoff['outstanding']}")
    if handoff.get("pending_arcs"):
        why.append(f"{handoff['pending_arcs']} arcs pending")
    return ", ".join(why)


@dataclass(frozen=True, slots=True, kw_only=True)
class _RingFigures:
    """What the rings of a plan say, computed before any process starts (building a ring takes about a second
    per 500,000 points: done while nodes run, it would stall the local web served from this process)."""

    key_shares: list[dict[str, float]]
    host_shares: list[dict[str, float]]
    #: per change: (ideal key-space fraction, key-space fraction moved, hosts moved)
    changes: list[tuple[float, float, int]]
    #: per change: the (previous owner, new owner) pairs of its moved arcs, the only pairs a hand-off may join
    moved_pairs: list[frozenset[tuple[str, str]]]


def ring_figures(plan: Plan, hosts: list[str]) -> _RingFigures:
    rings = [ring.Ring(weights, points_per_weight=plan.points_per_weight) for weights in plan.stage_weights()]
    owners = [[r.owner(host) for host in hosts] for r in rings]
    host_shares = []
    for r, owned in zip(rings, owners):
        counts = dict.fromkeys(r.nodes, 0)
        for node in owned:
            counts[node] += 1
        host_shares.append({node: count / len(hosts) for node, count in counts.items()})
    changes = []
    moved_pairs = []
    for old, new, old_owned, new_owned in zip(rings, rings[1:], owners, owners[1:]):
        old_shares, new_shares = old.weight_shares(), new.weight_shares()
        moves = ring.diff_moves(old, new)
        changes.append((sum(max(0.0, s - old_shares.get(n, 0.0)) for n, s in new_shares.items()),
                        ring.moved_fraction(moves), sum(1 for a, b in zip(old_owned, new_owned) if a != b)))
        moved_pairs.append(frozenset((move.previous, move.next) for move in moves
                                     if move.previous is not None and move.next is not None))
    return _RingFigures(key_shares=[r.shares() for r in rings], host_shares=host_shares, changes=changes,
                        moved_pairs=moved_pairs)


class _Runner:
    def __init__(self, plan: Plan, out: Path, web: Any, dns: Any, figures: _RingFigures,
                 say: Callable[[str], None]) -> None:
        self.plan = plan
        self.out = out
        self.web = web
        self.dns_port = dns.address[1]
        self.figures = figures
        self.seeds = web.seeds()[:SEED_HOSTS]
        self.say = say
        self.secret = secrets.token_hex(16)
        self.nodes: dict[str, _Node] = {}
        self.client = httpx.AsyncClient(timeout=5.0)
        self.notes: list[str] = []
        self.samples: list[Sample] = []
        self.t0 = 0.0
        self.started = trio.current_time()
        self.concluded = False  # a node exited through --exit-when-done: the cluster finished the crawl
        self.windows: list[tuple[str, float, float]] = []  # ring changes, wall clock (LiveRun.changes)
        self._last_progress: tuple[float, int] | None = None

    # -- processes ------------------------------------------------------------------------------------

    def _argv(self, node_id: str, weight: int, data_dir: Path, join: str | None, seeds: list[str]) -> list[str]:
        plan = self.plan
        argv = [sys.executable, "-m", "peer", "start", "--node-id", node_id, "--weight", str(weight),
                "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0", "--data-dir", str(data_dir),
                "--nameserver", f"127.0.0.1:{self.dns_port}", "--allow-private", "--delay", str(plan.live.delay),
                "--concurrency", str(plan.live.concurrency), "--store", plan.live.store, "--log-format", "json",
                "--batch-size", str(plan.dispatch.batch_size),
                "--dispatch-interval", str(plan.dispatch.interval), "--codec", plan.dispatch.codec,
                "--suspicion-timeout", str(plan.live.suspicion_timeout),
                # every host of the local web is served from 127.0.0.1, standing for as many servers as hosts:
                # per-address limits would make it one server
                "--ip-connections", "0"]
        if plan.end.when_done:
            argv.append("--exit-when-done")
        if join:
            argv += ["--join", join]
        for seed in seeds:
            argv += ["--seed", seed]
        return argv

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PEERCRAWL_CLUSTER_SECRET"] = self.secret
        return env

    def _tail(self, node: _Node, lines: int = 5) -> str:
        try:
            text = node.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    async def start(self, node_id: str, weight: int, *, seeds: list[str]) -> _Node:
        running = [n for n in self.nodes.values() if n.state == "running" and n.peer]
        join = running[0].peer if running else None
        data_dir = self.out / "nodes" / node_id
        if data_dir.exists():
            shutil.rmtree(data_dir)
        data_dir.mkdir(parents=True)
        log_path = self.out / "nodes" / f"{node_id}.log"
        argv = self._argv(node_id, weight, data_dir, join, seeds)
        with log_path.open("ab") as log_file:
            proc = await trio.lowlevel.open_process(argv, env=self._env(), stdout=log_file, stderr=log_file)
        node = self.nodes[node_id] = _Node(node_id=node_id, weight=weight, data_dir=data_dir, log_path=log_path,
                                           proc=proc)
        self.say(f"started {node_id} (weight {weight}, pid {proc.pid})" + (f", joining {join}" if join else ""))
        with trio.move_on_after(self.plan.live.settle_wait) as scope:
            while True:
                if proc.poll() is not None:
                    raise LiveError(f"node {node_id} exited with {proc.returncode} while starting: "
                                    f"{self._tail(node)}")
                control, peer = data_dir / "control.addr", data_dir / "peer.addr"
                if control.exists() and peer.exists():
                    node.control = control.read_text().strip()
                    node.peer = peer.read_text().strip()
                    status = await self._get(node, "/status")
                    if status is not None:
                        node.status = status
                        break
                await trio.sleep(0.05)
        if join is None and not scope.cancelled_caught:  # the first node: its dashboard shows the whole cluster
            self.say(f"dashboard (any node serves it for the whole cluster): "
                     f"{dashboard_address(node.control, read_token(data_dir))}")
        if scope.cancelled_caught:
            raise LiveError(f"node {node_id} did not come up within {self.plan.live.settle_wait:g} s "
                            f"(live.settle_wait): {self._tail(node)}")
        return node

    async def settle(self, owners: Mapping[str, int]) -> float:
        """Wait until every running node's view has exactly ``owners`` as its ring members (alive or suspect)
        and no node has a hand-off under way (nothing outstanding, no arc pending); returns the seconds it took.
        Until then the cluster is between two rings, and what it sends belongs to neither phase."""
        began = trio.current_time()
        wanted = set(owners)
        reasons: dict[str, str] = {}
        with trio.move_on_after(self.plan.live.settle_wait) as scope:
            while True:
                await self.poll()  # keeps the leaving node's counters fresh until it exits
                if self.concluded:
                    return trio.current_time() - began  # the crawl ended while the cluster was settling
                running = [n for n in self.nodes.values() if n.state == "running"]
                reasons = {n.node_id: _unsettled(n.status, wanted) for n in running}
                if not any(reasons.values()):
                    return trio.current_time() - began
                await trio.sleep(0.1)
        if scope.cancelled_caught:
            detail = "; ".join(f"{node}: {why}" for node, why in reasons.items() if why)
            raise LiveError(f"the cluster did not settle on {', '.join(sorted(wanted))} within "
                            f"{self.plan.live.settle_wait:g} s (live.settle_wait): {detail}")
        return trio.current_time() - began

    async def _get(self, node: _Node, path: str) -> dict[str, Any] | None:
        try:
            resp = await self.client.get(f"http://{node.control}{path}", headers=auth_headers(node.data_dir))
            return resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def _post(self, node: _Node, path: str) -> bool:
        try:
            resp = await self.client.post(f"http://{node.control}{path}", json={},
                                          headers=auth_headers(node.data_dir))
            return resp.status_code < 400
        except httpx.HTTPError:
            return False

    async def _steer(self, node: _Node, path: str) -> None:
        """``/pause`` or ``/resume`` the crawl through ``node`` (it tells the cluster, joiners included)."""
        if not await self._post(node, path):
            raise LiveError(f"node {node.node_id} refused POST {path}: {self._tail(node)}")

    async def poll(self) -> dict[str, dict[str, Any]]:
        """Read every running (or leaving) node's status; a node that does not answer keeps its last reading."""
        targets = [n for n in self.nodes.values() if n.state in ("running", "leaving")]

        async def one(node: _Node) -> None:
            status = await self._get(node, "/status")
            if status is not None:
                node.status = status

        async with trio.open_nursery() as nursery:
            for node in targets:
                nursery.start_soon(one, node)
        for node in targets:
            if node.state == "leaving" and node.proc.poll() is not None:
                node.state = "left"
                self.say(f"{node.node_id} left (exit code {node.proc.returncode})")
            elif node.state == "running" and node.proc.poll() is not None:
                self._exited(node)
        counters = {node_id: _counters(n.status) for node_id, n in self.nodes.items() if n.status}
        self._progress(counters)
        return counters

    def _exited(self, node: _Node) -> None:
        """A running node exited by itself: through --exit-when-done (0), or it failed."""
        code = node.proc.returncode
        if code == 0 and self.plan.end.when_done:
            node.state = "done"
            if not self.concluded:
                self.concluded = True
                self.say(f"{node.node_id} concluded that the cluster's crawl is finished and exited "
                         "(--exit-when-done)")
        else:
            node.state = "failed"
            self.notes.append(f"{node.node_id} exited by itself with {code}: {self._tail(node, 2)}")
            self.say(f"{node.node_id} exited with {code} (log: {node.log_path})")

    def _progress(self, counters: Mapping[str, Mapping[str, Any]]) -> None:
        """A progress line every ``live.progress_interval``: pages, rate, queues, and each node's pages."""
        interval = self.plan.live.progress_interval
        now = trio.current_time()
        pages = _total_pages(counters)
        if not interval or not counters:
            return
        if self._last_progress is None:
            self._last_progress = (now, pages)
            return
        then, before = self._last_progress
        if now - then < interval:
            return
        self._last_progress = (now, pages)
        marks = {"leaving": " (leaving)", "left": " (left)", "killed": " (killed)", "done": " (done)",
                 "failed": " (failed)", "stopped": " (stopped)"}
        per_node = "  ".join(f"{n} {c['pages']:,}{marks.get(self.nodes[n].state, '')}" for n, c in counters.items())
        queued = sum(c["queued"] for n, c in counters.items() if self.nodes[n].state in ("running", "leaving"))
        in_flight = sum(c["in_flight"] for n, c in counters.items()
                        if self.nodes[n].state in ("running", "leaving"))
        self.say(f"{now - self.started:6.1f} s  pages {pages:7,}  {(pages - before) / (now - then):6,.0f}/s  "
                 f"queued {queued:7,}  in flight {in_flight:3}  | {per_node}")

    async def wait_exits(self) -> None:
        """Once one node concluded the crawl, the others conclude within a round or two (a node lingers up to
        5 s for its peers): wait for every running or leaving node to exit by itself."""
        with trio.move_on_after(self.plan.live.settle_wait):
            while any(n.state in ("running", "leaving") for n in self.nodes.values()):
                await self.poll()
                await trio.sleep(0.1)
        for node in self.nodes.values():
            if node.state in ("running", "leaving"):
                self.notes.append(f"{node.node_id} had not exited {self.plan.live.settle_wait:g} s after another "
                                  "node concluded the crawl (live.settle_wait); it was stopped")

    # -- changes --------------------------------------------------------------------------------------

    async def leave(self, node: _Node) -> None:
        if not await self._post(node, "/leave"):
            raise LiveError(f"node {node.node_id} refused POST /leave: {self._tail(node)}")
        node.state = "leaving"
        self.say(f"{node.node_id} is leaving")

    async def finish_leaving(self, node: _Node) -> None:
        """Keep reading a leaving node until it exits (its hand-off counters grow meanwhile)."""
        with trio.move_on_after(self.plan.live.leave_wait) as scope:
            while node.proc.poll() is None:
                status = await self._get(node, "/status")
                if status is not None:
                    node.status = status
                await trio.sleep(0.2)
            await node.proc.wait()
        if scope.cancelled_caught:
            self.notes.append(f"{node.node_id} did not finish leaving within {self.plan.live.leave_wait:g} s "
                              "(live.leave_wait) and was killed")
            self._kill(node)
            await node.proc.wait()
        elif node.proc.returncode != 0:
            self.notes.append(f"{node.node_id} exited with {node.proc.returncode} after leaving")
        node.state = "left"

    def _kill(self, node: _Node) -> None:
        if node.proc.poll() is None:
            try:
                os.kill(node.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def kill(self, node: _Node) -> None:
        self._kill(node)
        await node.proc.wait()
        node.state = "killed"
        self.say(f"{node.node_id} killed (SIGKILL, pid {node.proc.pid})")

    async def stop_all(self) -> None:
        running = [n for n in self.nodes.values() if n.proc.poll() is None]
        for node in running:
            if node.state == "running":
                node.state = "stopped"
        for node in running:
            await self._post(node, "/stop")
        with trio.move_on_after(STOP_WAIT):
            for node in running:
                await node.proc.wait()
        for node in running:
            if node.proc.poll() is None:
                self.notes.append(f"{node.node_id} did not stop within {STOP_WAIT:g} s and was killed")
                self._kill(node)
                await node.proc.wait()

    def kill_leftovers(self) -> None:
        for node in self.nodes.values():
            self._kill(node)

    # -- the experiment -------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return trio.current_time() - self.t0

    async def run(self) -> ExperimentResult:
        plan = self.plan
        started = trio.current_time()
        stages = plan.stage_weights()
        names = plan.phase_names()
        initial = list(stages[0].items())
        # The first node starts the cluster with the seeds (a cluster started without work concludes at once
        # that its crawl is finished, for good); the others join one at a time, each once the cluster has
        # settled (joins at once can leave a node waiting out its hand-off timeout for arcs computed under a
        # view it skipped). The crawl is paused from the first node's start until the last founder has joined,
        # so the first phase runs on the whole cluster however long each node takes to start (on a loaded
        # machine a start has taken 40 s, in which the first node alone would crawl the web). The first phase
        # starts when all are in: what was sent before is not counted.
        founder = await self.start(*initial[0], seeds=self.seeds)
        if len(initial) > 1:
            await self._steer(founder, "/pause")
            self.say(f"crawl paused until the other {len(initial) - 1} founding nodes have joined")
        for i, (node_id, weight) in enumerate(initial[1:], start=2):
            if self.concluded:
                raise LiveError(f"the cluster finished the crawl before {node_id} could join: the web is too small "
                                "for the plan (web.hosts, web.pages_per_host)")
            wall = time.time()
            await self.start(node_id, weight, seeds=[])
            await self.settle(dict(initial[:i]))
            self.windows.append((f"{node_id} joins at the start", wall, time.time()))
        if len(initial) > 1:
            await self._steer(founder, "/resume")
        self.t0 = trio.current_time()
        self.say(f"cluster of {len(initial)} nodes up in {self.t0 - started:.1f} s; crawling")
        if len(stages) == 1:
            await self.cross_check(0)
        boundary = previous = await self.poll()
        # Triggers count time and pages inside phases only: the settling after a change is not counted.
        offset_time = 0.0
        offset_pages = _total_pages(boundary)
        phases: list[PhaseResult] = []
        changes: list[ChangeResult] = []
        start_time = 0.0
        triggers = [(p.at, p.after_pages) for p in plan.phases] + [(plan.end.at, plan.end.after_pages)]
        deadline = self.t0 + plan.live.timeout
        crawl_over = False
        for k, weights in enumerate(stages):
            at, after = triggers[k]
            is_end = k == len(stages) - 1
            while True:
                await trio.sleep(plan.live.sample_interval)
                now = await self.poll()
                self._sample(k, weights, previous, now)
                previous = now
                clock, pages = self.elapsed() - offset_time, _total_pages(now) - offset_pages
                if at is not None and clock >= at:
                    break
                if after is not None and pages >= after:
                    break
                if plan.end.when_done:
                    # the cluster decides: its nodes exit through --exit-when-done
                    finished = self.concluded
                else:
                    finished = not is_end and all(
                        now[n]["cluster_done"] and not now[n]["queued"] and not now[n]["in_flight"]
                        for n in weights if n in now)
                if finished:
                    if self.concluded:
                        await self.wait_exits()
                        now = await self.poll()
                    how = " (every node exited through --exit-when-done)" if self.concluded else ""
                    self.notes.append(f"the crawl finished at {self.elapsed():.1f} s, in phase {k + 1}{how}"
                                      + ("" if is_end else ": the web is too small for the plan's later phases"))
                    crawl_over = True
                    break
                if trio.current_time() >= deadline:
                    self.notes.append(f"stopped by live.timeout after {plan.live.timeout:g} s, in phase {k + 1}")
                    break
            end_time = self.elapsed()
            phases.append(self._phase(k, names[k], weights, start_time, end_time, boundary, now))
            self.say(f"phase {k + 1} ({names[k]}) ended at {end_time:.1f} s: {pages:,} pages in phases so far, "
                     f"{phases[-1].total_sent:,} URLs sent in this one")
            if is_end or crawl_over or trio.current_time() >= deadline:
                break
            wall = time.time()
            change = await self._apply(k + 1, weights, now, end_time)
            # The next phase starts once the cluster settled on the new ring: what is sent meanwhile is the
            # transition, in no phase.
            await self.settle(stages[k + 1])
            self.windows.append((change["name"], wall, time.time()))
            boundary = previous = await self.poll()
            start_time = self.elapsed()
            change["settle"] = start_time - end_time  # the change's own actions (a node starting) included
            change["transition"] = sum(max(0, n - now.get(i, {}).get("sent", {}).get(j, 0))
                                       for i, c in boundary.items() for j, n in c["sent"].items())
            changes.append(self._close_change(change, boundary))
            offset_time += start_time - end_time
            offset_pages += _total_pages(boundary) - _total_pages(now)
            self.say(f"settled in {change['settle']:.1f} s: {changes[-1].urls_moved:,} URLs handed off, "
                     f"{change['transition']:,} sent meanwhile")
            if k + 1 == len(stages) - 1 and not self.concluded:
                await self.cross_check(k + 1)
        for node in list(self.nodes.values()):
            if node.state == "leaving":
                await self.finish_leaving(node)
        await self.stop_all()
        return ExperimentResult(
            plan=plan, mode="live", phases=tuple(phases), samples=tuple(self.samples), changes=tuple(changes),
            wall_seconds=trio.current_time() - started, peak_rss_bytes=0,
            notes=(_LIVE_NOTE, *self.notes),
        )

    def _sample(self, k: int, weights: Mapping[str, int], before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
        sent_by: dict[str, int] = {}
        received_by: dict[str, int] = {}
        for i in weights:
            if i not in after:
                continue
            for j, n in after[i]["sent"].items():
                delta = n - (before.get(i, {}).get("sent", {}).get(j, 0))
                if delta > 0 and j in weights and j != i:
                    sent_by[i] = sent_by.get(i, 0) + delta
                    received_by[j] = received_by.get(j, 0) + delta
        self.samples.append(Sample(time=self.elapsed(), phase=k, sent_by=sent_by, received_by=received_by))

    def _phase(self, k: int, name: str, weights: Mapping[str, int], start: float, end: float,
               first: Mapping[str, Any], last: Mapping[str, Any]) -> PhaseResult:
        sent: dict[tuple[str, str], int] = {}
        for i in weights:
            for j in weights:
                if i != j and i in last:
                    before = first.get(i, {}).get("sent", {}).get(j, 0)
                    sent[(i, j)] = max(0, last[i]["sent"].get(j, 0) - before)
        pages = sum(last[n]["pages"] - first.get(n, {}).get("pages", 0) for n in weights if n in last)
        return PhaseResult(
            index=k, name=name, start=start, end=end, pages=pages, weights=dict(weights),
            key_shares=self.figures.key_shares[k], host_shares=self.figures.host_shares[k], popularity_shares=None,
            sent=PhaseResult.matrix(list(weights), sent), kept=None,
        )

    async def _apply(self, k: int, old: Mapping[str, int], now: Mapping[str, Any], when: float) -> dict[str, Any]:
        phase = self.plan.phases[k - 1]
        self.say(f"change {k}: {', '.join(phase.actions())} at {when:.1f} s")
        lost = 0
        for node_id in phase.kill:
            lost += now.get(node_id, {}).get("queued", 0)
            await self.kill(self.nodes[node_id])
        for node_id in phase.remove:
            await self.leave(self.nodes[node_id])
        for node_id, weight in phase.add:
            await self.start(node_id, weight, seeds=[])
        ideal, moved_keyspace, hosts_moved = self.figures.changes[k - 1]
        return {
            "phase": k, "name": phase.name, "time": when, "actions": tuple(phase.actions()), "ideal": ideal,
            "moved_keyspace": moved_keyspace, "hosts_moved": hosts_moved,
            "held": sum(c["queued"] for n, c in now.items() if n in old),
            "handoff_before": {n: c["handoff_received"] for n, c in now.items()},
            "lost": lost,
        }

    def _close_change(self, change: dict[str, Any], now: Mapping[str, Any]) -> ChangeResult:
        """The change's figures once the cluster settled: URLs moved are what the new owners received by
        hand-off (their ``cluster.handoff.urls_received``; a node that left can no longer be read)."""
        by_pair = {}
        for node_id, counters in now.items():
            moved = counters["handoff_received"] - change["handoff_before"].get(node_id, 0)
            if moved > 0:
                by_pair[("", node_id)] = moved
        return ChangeResult(
            phase=change["phase"], name=change["name"], time=change["time"], actions=change["actions"],
            ideal_keyspace=change["ideal"], moved_keyspace=change["moved_keyspace"],
            hosts_moved=change["hosts_moved"], hosts_total=self.plan.web.hosts,
            urls_moved=sum(by_pair.values()), urls_lost=change["lost"], urls_held=change["held"], by_pair=by_pair,
            settle_seconds=change["settle"], transition_urls=change["transition"],
        )

    async def cross_check(self, k: int) -> None:
        """Compare stage ``k``'s key shares (the experiment's own ring) with a running node's GET /cluster, once
        the cluster has settled on that stage (with --exit-when-done no node is left to ask at the end)."""
        shares = self.figures.key_shares[k]
        for node in self.nodes.values():
            if node.state != "running":
                continue
            view = await self._get(node, "/cluster")
            if view is None:
                continue
            reported = {m["node_id"]: float(m.get("key_share", 0.0)) for m in view.get("nodes", [])
                        if m.get("state") in _OWNING}
            for node_id, share in shares.items():
                if abs(reported.get(node_id, 0.0) - share) > 1e-9:
                    self.notes.append(f"{node.node_id} reports key share {reported.get(node_id, 0.0):.6f} for "
                                      f"{node_id}, the experiment's ring says {share:.6f}")
            return


async def live_run(plan: Plan, out: Path, *, progress: Callable[[str], None] | None = None) -> LiveRun:
    """Run ``plan`` with real nodes; node data and logs go under ``out/nodes/``. Returns the result with the web
    and its request log, for a referee of the crawl."""
    from peerlab.localweb.dns_server import serve_dns
    from peerlab.localweb.server import serve_web

    say = progress or (lambda line: log.info(line))
    if plan.web.popularity != 0.0:
        raise LiveError(f"plan {plan.name}: web.popularity: the local web links hosts uniformly; "
                        "set web.popularity = 0 for live mode (e.g. --set web.popularity=0)")
    if plan.points_per_weight != ring.DEFAULT_POINTS_PER_WEIGHT:
        raise LiveError(f"plan {plan.name}: points_per_weight: the nodes use {ring.DEFAULT_POINTS_PER_WEIGHT}; "
                        f"a live plan must too, got {plan.points_per_weight}")
    everyone = {node for stage in plan.stage_weights() for node in stage}
    if len(everyone) > MAX_LIVE_NODES:
        raise LiveError(f"plan {plan.name}: {len(everyone)} nodes; live mode runs one process per node and "
                        f"allows at most {MAX_LIVE_NODES} (simulate larger fleets)")
    graph = SiteGraph.generate(seed=plan.seed, hosts=plan.web.hosts, pages_per_host=plan.web.pages_per_host,
                               links_per_page=plan.web.links_per_page,
                               cross_host_fraction=1.0 - plan.web.internal_links, features=plan.web.features,
                               seed_hosts=min(SEED_HOSTS, plan.web.hosts))
    figures = ring_figures(plan, [h.name for h in graph.hosts])
    out.mkdir(parents=True, exist_ok=True)
    failure: LiveError | None = None
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_web, graph)
        dns = await nursery.start(serve_dns, graph.zone())
        say(f"local web: {plan.web.hosts:,} hosts x {plan.web.pages_per_host} pages"
            + (" with robots.txt rules, Crawl-delays, redirects and traps" if plan.web.features else "")
            + f" on 127.0.0.1:{web.port}, DNS on 127.0.0.1:{dns.address[1]}")
        runner = _Runner(plan, out, web, dns, figures, say)
        try:
            result = await runner.run()
        except LiveError as exc:
            failure = exc  # raised below, outside the nursery, as itself rather than in an exception group
        finally:
            runner.kill_leftovers()
            await runner.client.aclose()
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    if not plan.live.keep_data:
        for node in runner.nodes.values():
            shutil.rmtree(node.data_dir, ignore_errors=True)  # LMDB maps; the logs stay
    result = replace(result, peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    nodes = tuple(
        NodeOutcome(node_id=n.node_id, weight=n.weight, state=n.state, exit_code=n.proc.returncode,
                    data_dir=n.data_dir, log_path=n.log_path, pages=int(n.status.get("pages", 0)),
                    stored=int(n.status.get("stored", 0)))
        for n in runner.nodes.values())
    return LiveRun(result=result, graph=graph, port=web.port, log=tuple(web.log), nodes=nodes,
                   concluded=runner.concluded, changes=tuple(runner.windows))


async def live_experiment(plan: Plan, out: Path, *, progress: Callable[[str], None] | None = None
                          ) -> ExperimentResult:
    """Run ``plan`` with real nodes (``live_run``) and return the experiment's result alone."""
    return (await live_run(plan, out, progress=progress)).result


def run_live(plan: Plan, out: Path, *, progress: Callable[[str], None] | None = None) -> ExperimentResult:
    """``live_experiment`` under its own ``trio.run`` (for the command line)."""
    return trio.run(functools.partial(live_experiment, plan, out, progress=progress))
