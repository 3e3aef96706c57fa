"""The experiment plan: a TOML file naming the nodes, the changes to the cluster, the web and the mode.

A plan is read once, checked whole, and turned into frozen dataclasses; every error is one line naming the bad
key (``plan design.toml: phase[2].remove: node 'X' is not in the cluster at that point``). ``to_toml`` writes
the effective plan back, so a run folder holds exactly what ran (``load(to_toml(plan)) == plan``).

Layout (every table but ``[nodes]`` and ``[end]`` optional; see ``default.toml`` for the design's experiment)::

    name = "design"           mode = "simulate" | "cluster" | "live"      seed = 1      points_per_weight = 1000
    [nodes]     A = 150 ...                                  the initial cluster, node id = weight
    [fleet]     count, prefix, weight_min, weight_max        more initial nodes, weights drawn from the seed
    [web]       hosts, pages_per_host, links_per_page, internal_links, popularity, features (live)
    [dispatch]  batch_size, interval, codec                  (live: passed to every peerd)
    [simulate]  pages_per_second, samples_per_phase          (cluster: the pages a second of the whole cluster)
    [cluster]   time_scale, settle_wait, seeds               the simulated cluster (mode = "cluster")
    [live]      delay, concurrency, timeout, sample_interval, progress_interval, leave_wait, settle_wait,
                suspicion_timeout, store, keep_data
    [[phase]]   name, at | after_pages, add = {X = w}, remove = [..], kill = [..]
    [end]       at | after_pages, when_done

``[end] when_done = true`` (live only) starts every node with ``--exit-when-done``: the cluster itself decides
that the crawl is finished, and the run ends when every node has exited on its own (or earlier, at ``at`` or
``after_pages`` when given, whichever comes first).
"""

from __future__ import annotations

import json
import math
import random
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

import ring

from ..localweb.features import MIN_FEATURE_HOSTS

__all__ = [
    "BUNDLED_PLANS",
    "Dispatch",
    "End",
    "Fleet",
    "LiveSettings",
    "Phase",
    "Plan",
    "PlanError",
    "SimulateSettings",
    "ClusterSettings",
    "Web",
    "apply_overrides",
    "bundled_plan_text",
    "load_plan",
    "parse_plan",
    "to_toml",
]

#: Plans shipped inside the package, by name: ``--plan design`` needs no file.
BUNDLED_PLANS = {
    "design": "default.toml",
    "live-small": "live-small.toml",
    "live-wide": "live-wide.toml",
    "demo": "demo.toml",
}

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
_MODES = ("simulate", "cluster", "live")
_CODECS = ("msgpack", "json")
_STORES = ("none", "warc")


class PlanError(ValueError):
    """The plan is wrong; the message is one line naming the file and the key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Web:
    """The synthetic web (simulate) or the local web served on loopback (live)."""

    #: 100,000 hosts: enough that a few popular hosts stand out from a long tail, small enough to run in seconds.
    hosts: int = 100_000
    #: 50 pages per host: the local web's scale; the simulation uses it only to size the live web.
    pages_per_host: int = 50
    #: 20 links per page: a typical count of distinct links on an HTML page.
    links_per_page: int = 20
    #: 70% of links stay on their own host (navigation, pagination); those are never dispatched.
    internal_links: float = 0.7
    #: Zipf exponent of host popularity, P(rank k) ~ 1/k^s; 1.0 is the classic web in-link skew, 0 is uniform.
    popularity: float = 1.0
    #: live: off, so every host is plain and the figures measure routing alone; on, the local web adds robots.txt
    #: rules, Crawl-delays, redirects, traps, odd charsets and slow pages (docs/localweb.md), as the demo does.
    features: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """Extra initial nodes with generated ids ``<prefix>0001`` ... and weights drawn from the plan's seed."""

    #: no extra nodes unless asked: the design has four.
    count: int = 0
    #: short, and unlike the design's single letters.
    prefix: str = "n"
    #: the design's smallest weight (D = 40).
    weight_min: int = 40
    #: the design's largest weight (E = 300).
    weight_max: int = 300


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """The URL dispatcher's settings, passed to every live node (the simulation does not batch)."""

    #: the node's default: about 60 KB per batch.
    batch_size: int = 500
    #: the design's flush timer.
    interval: float = 0.2
    #: the node's default codec.
    codec: str = "msgpack"


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulateSettings:
    #: the design's four nodes made about 5.5 requests a second each: 22 pages/s turns ``at`` times into pages.
    pages_per_second: float = 22.0
    #: 20 points per phase on the share-over-time plot: a readable curve, negligible cost.
    samples_per_phase: int = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSettings:
    """The simulated cluster (``mode = "cluster"``): real nodes in one process, in virtual time."""

    #: virtual seconds per second of the plan's ``at`` triggers: 1 keeps the design's ten-minute phases; a
    #: large fleet runs them shorter (0.05: 30 s) because every virtual second costs each node its timers.
    time_scale: float = 1.0
    #: virtual seconds a change has to settle (every ring the new one, no hand-off under way) before the run
    #: fails: past the node's 30 s hand-off wait.
    settle_wait: float = 120.0
    #: seed hosts the first node brings (their first pages): a series of fleet sizes compares crawls of the same
    #: age when the seeds grow with the fleet (the same seeds per node).
    seeds: int = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveSettings:
    #: seconds between two requests to one host: fast on loopback, still exercising politeness.
    delay: float = 0.05
    #: fetches in flight per node: the local web answers in microseconds, more only adds contention.
    concurrency: int = 32
    #: give up after 10 minutes: a local web of a few thousand pages is crawled in well under that.
    timeout: float = 600.0
    #: read every node's counters twice a second: smooth curves at a negligible load.
    sample_interval: float = 0.5
    #: a progress line (pages, rate, queues per node) every 2 s: visibly alive without flooding; 0 for none.
    progress_interval: float = 2.0
    #: a graceful leave hands its arcs off first: allow a minute before the process is killed.
    leave_wait: float = 60.0
    #: a started node must answer, and the cluster settle after a change, within 45 s: longer than the node's
    #: 30 s hand-off wait, after which a gained arc is crawled even if its previous owner never sent it.
    settle_wait: float = 45.0
    #: the node's default: a killed node is declared dead about this long after it stops answering.
    suspicion_timeout: float = 5.0
    #: none: the experiment measures routing, and writing WARC files would only add disk load; warc keeps the
    #: pages, as a real crawl does (with ``keep_data``, or they are removed with the data dirs).
    store: str = "none"
    #: the node data dirs (LMDB maps of a few hundred MB of address space, WARC files) are removed at the end;
    #: the logs stay. true keeps them under ``OUT/nodes/<id>/``.
    keep_data: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Phase:
    """A change to the cluster and the phase it starts. Exactly one trigger: ``at`` (seconds since the start)
    or ``after_pages`` (pages crawled by the whole cluster since the start)."""

    name: str
    at: float | None = None
    after_pages: int | None = None
    add: tuple[tuple[str, int], ...] = ()
    remove: tuple[str, ...] = ()
    kill: tuple[str, ...] = ()

    def actions(self) -> list[str]:
        return ([f"add {node}={weight}" for node, weight in self.add] + [f"remove {node}" for node in self.remove]
                + [f"kill {node}" for node in self.kill])


@dataclass(frozen=True, slots=True, kw_only=True)
class End:
    """When the experiment stops: ``at`` seconds, ``after_pages`` pages, or (live) when the crawl is done."""

    at: float | None = None
    after_pages: int | None = None
    when_done: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    name: str
    #: the ring alone unless asked: no processes, no network, deterministic.
    mode: str = "simulate"
    #: every random draw (fleet weights, host names, links, the live web) comes from this seed.
    seed: int = 1
    #: the cluster's setting (ring.DEFAULT_POINTS_PER_WEIGHT); large fleets lower it to bound the ring's size.
    points_per_weight: int = 1000
    nodes: tuple[tuple[str, int], ...] = ()
    fleet: Fleet = field(default_factory=Fleet)
    web: Web = field(default_factory=Web)
    dispatch: Dispatch = field(default_factory=Dispatch)
    simulate: SimulateSettings = field(default_factory=SimulateSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    live: LiveSettings = field(default_factory=LiveSettings)
    phases: tuple[Phase, ...] = ()
    end: End = field(default_factory=End)

    def initial_weights(self) -> dict[str, int]:
        """The initial cluster: ``[nodes]`` in file order, then the generated fleet."""
        weights = dict(self.nodes)
        rng = random.Random(f"{self.seed}:fleet")
        width = max(4, len(str(self.fleet.count)))
        for i in range(1, self.fleet.count + 1):
            weights[f"{self.fleet.prefix}{i:0{width}d}"] = rng.randint(self.fleet.weight_min, self.fleet.weight_max)
        return weights

    def stage_weights(self) -> list[dict[str, int]]:
        """The live nodes and weights of every phase: index 0 is the start, then one per ``[[phase]]``."""
        stages = [self.initial_weights()]
        for phase in self.phases:
            weights = dict(stages[-1])
            for node in (*phase.remove, *phase.kill):
                del weights[node]
            weights.update(phase.add)
            stages.append(weights)
        return stages

    def phase_names(self) -> list[str]:
        return ["start", *(phase.name for phase in self.phases)]


# --------------------------------------------------------------------------- reading


def bundled_plan_text(name: str) -> str:
    """The text of a plan shipped with the package (``design``, ``live-small``, ``live-wide``, ``demo``)."""
    return resources.files(__package__).joinpath(BUNDLED_PLANS[name]).read_text(encoding="utf-8")


def load_plan(source: str | Path, *, overrides: Mapping[str, str] | None = None) -> tuple[Plan, str]:
    """Read a plan from a file path or a bundled name; returns the plan and a label for messages."""
    text_source = str(source)
    if text_source in BUNDLED_PLANS:
        text, label = bundled_plan_text(text_source), f"{text_source} (bundled)"
    else:
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            names = ", ".join(BUNDLED_PLANS)
            raise PlanError(f"plan {path}: cannot read it ({exc.strerror}); bundled plans are: {names}") from exc
        label = path.name
    return parse_plan(text, label=label, overrides=overrides), label


def parse_plan(text: str, *, label: str = "plan", overrides: Mapping[str, str] | None = None) -> Plan:
    """Parse and check plan TOML; ``overrides`` maps dotted keys (``web.hosts``) to TOML values (``"10"``)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"plan {label}: not valid TOML: {exc}") from exc
    if overrides:
        raw = apply_overrides(raw, overrides, label=label)
    return _Checker(label).plan(raw)


def apply_overrides(raw: dict[str, Any], overrides: Mapping[str, str], *, label: str = "plan") -> dict[str, Any]:
    """A copy of ``raw`` with each ``dotted.key = value`` set; the value is TOML, or a bare string."""
    out = json.loads(json.dumps(raw))  # a deep copy of plain TOML data
    for key, value_text in overrides.items():
        parts = key.split(".")
        if not all(parts):
            raise PlanError(f"plan {label}: --set {key}: not a dotted key like web.hosts")
        try:
            value = tomllib.loads(f"v = {value_text}")["v"]
        except tomllib.TOMLDecodeError:
            value = value_text
        table = out
        for i, part in enumerate(parts[:-1]):
            nxt = table.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise PlanError(f"plan {label}: --set {key}: {'.'.join(parts[: i + 1])} is not a table")
            table = nxt
        table[parts[-1]] = value
    return out


class _Checker:
    """Turns raw TOML into a ``Plan``, naming the key of the first problem."""

    def __init__(self, label: str) -> None:
        self.label = label

    def fail(self, key: str, problem: str) -> PlanError:
        return PlanError(f"plan {self.label}: {key}: {problem}")

    def table(self, raw: Any, key: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise self.fail(key, f"expected a table, got {_kind(raw)}")
        return raw

    def known(self, raw: dict[str, Any], key: str, allowed: set[str]) -> None:
        for name in raw:
            if name not in allowed:
                where = f"{key}.{name}" if key else name
                raise self.fail(where, f"unknown key (known: {', '.join(sorted(allowed))})")

    def integer(self, value: Any, key: str, *, low: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {_kind(value)}")
        if low is not None and value < low:
            raise self.fail(key, f"must be >= {low}, got {value}")
        return value

    def number(self, value: Any, key: str, *, low: float | None = None, high: float | None = None,
               positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"expected a number, got {_kind(value)}")
        value = float(value)
        if not math.isfinite(value):
            raise self.fail(key, f"must be finite, got {value}")
        if positive and value <= 0:
            raise self.fail(key, f"must be > 0, got {value:g}")
        if low is not None and value < low:
            raise self.fail(key, f"must be >= {low:g}, got {value:g}")
        if high is not None and value > high:
            raise self.fail(key, f"must be <= {high:g}, got {value:g}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_kind(value)}")
        return value

    def string(self, value: Any, key: str, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_kind(value)}")
        if choices is not None and value not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def node_id(self, value: Any, key: str) -> str:
        value = self.string(value, key)
        if not _NODE_ID.match(value):
            raise self.fail(key, f"node ids are 1-64 letters, digits, '.', '_', ':' or '-', got {value!r}")
        return value

    def section(self, cls: type, raw: Any, key: str, checks: Mapping[str, Any]) -> Any:
        """Build dataclass ``cls`` from table ``raw``: each field checked by ``checks[name](value, dotted)``."""
        raw = self.table(raw, key)
        self.known(raw, key, {f.name for f in fields(cls)})
        return cls(**{name: checks[name](value, f"{key}.{name}") for name, value in raw.items()})

    # -- the plan -----------------------------------------------------------------------------------------

    def plan(self, raw: dict[str, Any]) -> Plan:
        top = {"name", "mode", "seed", "points_per_weight", "nodes", "fleet", "web", "dispatch", "simulate",
               "cluster", "live", "phase", "end"}
        self.known(raw, "", top)
        if "name" not in raw:
            raise self.fail("name", "missing: every plan has a name (it names the run folder)")
        name = self.string(raw["name"], "name")
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", name):
            raise self.fail("name", f"1-64 letters, digits, '.', '_' or '-' (it names a folder), got {name!r}")
        defaults = Plan(name=name)
        mode = self.string(raw.get("mode", defaults.mode), "mode", _MODES)
        seed = self.integer(raw.get("seed", defaults.seed), "seed")
        ppw = self.integer(raw.get("points_per_weight", defaults.points_per_weight), "points_per_weight", low=1)
        nodes_raw = self.table(raw.get("nodes", {}), "nodes")
        nodes = tuple((self.node_id(node, "nodes"), self.integer(weight, f"nodes.{node}", low=1))
                      for node, weight in nodes_raw.items())
        fleet = self.section(Fleet, raw.get("fleet", {}), "fleet", {
            "count": lambda v, k: self.integer(v, k, low=0),
            "prefix": lambda v, k: self.node_id(v, k),
            "weight_min": lambda v, k: self.integer(v, k, low=1),
            "weight_max": lambda v, k: self.integer(v, k, low=1),
        })
        if fleet.weight_max < fleet.weight_min:
            raise self.fail("fleet.weight_max", f"must be >= fleet.weight_min ({fleet.weight_min}), "
                                                f"got {fleet.weight_max}")
        if not nodes and not fleet.count:
            raise self.fail("nodes", "the initial cluster is empty: give [nodes] (A = 150 ...) or [fleet] count")
        web = self.section(Web, raw.get("web", {}), "web", {
            "hosts": lambda v, k: self.integer(v, k, low=2),
            "pages_per_host": lambda v, k: self.integer(v, k, low=1),
            "links_per_page": lambda v, k: self.integer(v, k, low=1),
            "internal_links": lambda v, k: self.number(v, k, low=0.0, high=1.0),
            "popularity": lambda v, k: self.number(v, k, low=0.0, high=10.0),
            "features": lambda v, k: self.boolean(v, k),
        })
        if web.hosts >= 1 << 32:
            raise self.fail("web.hosts", f"at most {(1 << 32) - 1:,} hosts, got {web.hosts:,}")
        if web.features and mode != "live":
            raise self.fail("web.features", "only a live run serves a local web with features: give mode = "
                                           "\"live\" or web.features = false")
        if web.features and web.hosts < MIN_FEATURE_HOSTS:
            raise self.fail("web.hosts", f"a web with features needs at least {MIN_FEATURE_HOSTS} hosts (one per "
                                         f"feature role), got {web.hosts}")
        dispatch = self.section(Dispatch, raw.get("dispatch", {}), "dispatch", {
            "batch_size": lambda v, k: self.integer(v, k, low=1),
            "interval": lambda v, k: self.number(v, k, positive=True),
            "codec": lambda v, k: self.string(v, k, _CODECS),
        })
        simulate = self.section(SimulateSettings, raw.get("simulate", {}), "simulate", {
            "pages_per_second": lambda v, k: self.number(v, k, positive=True),
            "samples_per_phase": lambda v, k: self.integer(v, k, low=1),
        })
        cluster = self.section(ClusterSettings, raw.get("cluster", {}), "cluster", {
            "time_scale": lambda v, k: self.number(v, k, positive=True),
            "settle_wait": lambda v, k: self.number(v, k, positive=True),
            "seeds": lambda v, k: self.integer(v, k, low=1),
        })
        live = self.section(LiveSettings, raw.get("live", {}), "live", {
            "delay": lambda v, k: self.number(v, k, low=0.0),
            "concurrency": lambda v, k: self.integer(v, k, low=1),
            "timeout": lambda v, k: self.number(v, k, positive=True),
            "sample_interval": lambda v, k: self.number(v, k, positive=True),
            "progress_interval": lambda v, k: self.number(v, k, low=0.0),
            "leave_wait": lambda v, k: self.number(v, k, positive=True),
            "settle_wait": lambda v, k: self.number(v, k, positive=True),
            "suspicion_timeout": lambda v, k: self.number(v, k, positive=True),
            "store": lambda v, k: self.string(v, k, _STORES),
            "keep_data": lambda v, k: self.boolean(v, k),
        })
        if live.store == "warc" and not live.keep_data:
            raise self.fail("live.store", "the WARC files are written into the node data dirs, which are removed "
                                          "at the end: give live.keep_data = true too")
        phases_raw = raw.get("phase", [])
        if not isinstance(phases_raw, list):
            raise self.fail("phase", f"expected [[phase]] tables, got {_kind(phases_raw)}")
        phases = tuple(self.phase(item, f"phase[{i + 1}]") for i, item in enumerate(phases_raw))
        end = self.end(raw.get("end"), mode)
        plan = Plan(name=name, mode=mode, seed=seed, points_per_weight=ppw, nodes=nodes, fleet=fleet, web=web,
                    dispatch=dispatch, simulate=simulate, cluster=cluster, live=live, phases=phases, end=end)
        self.membership(plan)
        self.order(plan)
        self.ring_size(plan)
        return plan

    def trigger(self, raw: dict[str, Any], key: str) -> tuple[float | None, int | None]:
        at = raw.get("at")
        after = raw.get("after_pages")
        if (at is None) == (after is None):
            raise self.fail(key, "give exactly one trigger: at = SECONDS or after_pages = N")
        if at is not None:
            return self.number(at, f"{key}.at", low=0.0), None
        return None, self.integer(after, f"{key}.after_pages", low=1)

    def phase(self, raw: Any, key: str) -> Phase:
        raw = self.table(raw, key)
        self.known(raw, key, {"name", "at", "after_pages", "add", "remove", "kill"})
        at, after = self.trigger(raw, key)
        add_raw = self.table(raw.get("add", {}), f"{key}.add")
        add = tuple((self.node_id(node, f"{key}.add"), self.integer(weight, f"{key}.add.{node}", low=1))
                    for node, weight in add_raw.items())
        lists = {}
        for verb in ("remove", "kill"):
            value = raw.get(verb, [])
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list):
                raise self.fail(f"{key}.{verb}", f"expected a list of node ids, got {_kind(value)}")
            lists[verb] = tuple(self.node_id(node, f"{key}.{verb}") for node in value)
        if not add and not lists["remove"] and not lists["kill"]:
            raise self.fail(key, "a phase starts with a change: give add, remove or kill")
        phase = Phase(name="", at=at, after_pages=after, add=add, remove=lists["remove"], kill=lists["kill"])
        name = self.string(raw["name"], f"{key}.name") if "name" in raw else ", ".join(phase.actions())
        return replace(phase, name=name)

    def end(self, raw: Any, mode: str) -> End:
        if raw is None:
            raise self.fail("end", "missing: say when the experiment stops ([end] at = SECONDS or after_pages = N)")
        raw = self.table(raw, "end")
        self.known(raw, "end", {"at", "after_pages", "when_done"})
        when_done = self.boolean(raw.get("when_done", False), "end.when_done")
        if "at" not in raw and "after_pages" not in raw:
            if not when_done:
                raise self.fail("end", "give at = SECONDS, after_pages = N or when_done = true")
            if mode != "live":
                raise self.fail("end", "a simulation has no crawl to finish: give at = SECONDS or after_pages = N")
            return End(when_done=True)
        at, after = self.trigger(raw, "end")
        return End(at=at, after_pages=after, when_done=when_done)

    def membership(self, plan: Plan) -> None:
        live = dict(plan.nodes)
        width = max(4, len(str(plan.fleet.count)))
        for i in range(1, plan.fleet.count + 1):
            node = f"{plan.fleet.prefix}{i:0{width}d}"
            if node in live:
                raise self.fail("fleet.prefix", f"generated node id {node!r} is also in [nodes]")
            live[node] = 1
        ever = set(live)
        for i, phase in enumerate(plan.phases):
            key = f"phase[{i + 1}]"
            gone = set()
            for verb, nodes in (("remove", phase.remove), ("kill", phase.kill)):
                for node in nodes:
                    if node not in live or node in gone:
                        raise self.fail(f"{key}.{verb}", f"node {node!r} is not in the cluster at that point")
                    gone.add(node)
            for node, _ in phase.add:
                if node in ever:
                    raise self.fail(f"{key}.add", f"node id {node!r} was used before; a node id is never reused")
                ever.add(node)
            for node in gone:
                del live[node]
            live.update(phase.add)
            if not live:
                raise self.fail(key, "this change leaves no node in the cluster")

    def ring_size(self, plan: Plan) -> None:
        """Every phase's ring must be buildable: ``ring.Ring`` refuses more than ``ring.MAX_POINTS`` points."""
        total = max(sum(weights.values()) for weights in plan.stage_weights())
        points = total * plan.points_per_weight
        if points > ring.MAX_POINTS:
            fits = max(1, ring.MAX_POINTS // total)
            raise self.fail("points_per_weight", f"the largest ring would hold {points:,} points (total weight "
                                                 f"{total:,} x {plan.points_per_weight}), over the ring's limit of "
                                                 f"{ring.MAX_POINTS:,}; use points_per_weight <= {fits}")

    def order(self, plan: Plan) -> None:
        """Triggers of one kind must increase; the end must come after the last change of its kind."""
        last: dict[str, tuple[float, str]] = {}
        items = [(f"phase[{i + 1}]", p.at, p.after_pages) for i, p in enumerate(plan.phases)]
        items.append(("end", plan.end.at, plan.end.after_pages))
        for key, at, after in items:
            kind, value = ("at", at) if at is not None else ("after_pages", after)
            if value is None:
                continue
            previous = last.get(kind)
            if previous is not None and value <= previous[0]:
                raise self.fail(f"{key}.{kind}", f"must be later than {previous[1]}.{kind} = {previous[0]:g}, "
                                                 f"got {value:g}")
            last[kind] = (float(value), key)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


# --------------------------------------------------------------------------- writing


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def to_toml(plan: Plan) -> str:
    """The plan as TOML, every setting spelled out; ``parse_plan`` reads it back to an equal plan."""
    lines = ["# The effective plan of this run: every setting, defaults included.",
             f"name = {_value(plan.name)}", f"mode = {_value(plan.mode)}", f"seed = {plan.seed}",
             f"points_per_weight = {plan.points_per_weight}", "", "[nodes]"]
    lines += [f"{_key(node)} = {weight}" for node, weight in plan.nodes]
    for title, section in (("fleet", plan.fleet), ("web", plan.web), ("dispatch", plan.dispatch),
                           ("simulate", plan.simulate), ("cluster", plan.cluster), ("live", plan.live)):
        lines += ["", f"[{title}]"]
        lines += [f"{f.name} = {_value(getattr(section, f.name))}" for f in fields(section)]
    for phase in plan.phases:
        lines += ["", "[[phase]]", f"name = {_value(phase.name)}"]
        lines.append(f"at = {_value(phase.at)}" if phase.at is not None else f"after_pages = {phase.after_pages}")
        if phase.add:
            lines.append("add = { " + ", ".join(f"{_key(n)} = {w}" for n, w in phase.add) + " }")
        if phase.remove:
            lines.append(f"remove = {_value(phase.remove)}")
        if phase.kill:
            lines.append(f"kill = {_value(phase.kill)}")
    lines += ["", "[end]"]
    if plan.end.at is not None:
        lines.append(f"at = {_value(plan.end.at)}")
    if plan.end.after_pages is not None:
        lines.append(f"after_pages = {plan.end.after_pages}")
    lines.append(f"when_done = {_value(plan.end.when_done)}")
    return "\n".join(lines) + "\n"
