"""``peerctl demo``: a local web and its DNS server, a peercrawl cluster crawling it, and a verdict.

The web (``peerlab.localweb``) is generated from a seed, with robots.txt rules, Crawl-delays, redirects and a
redirect loop, traps, odd charsets, slow and busy pages and names that do not resolve. By default the demo runs
the bundled experiment plan ``demo`` (``peerlab/experiment/demo.toml``) into a run folder (``./demo-data/``): the
design's four nodes A=150, B=80, C=200, D=40 as real ``peerd`` processes on loopback, C leaving gracefully and
E=300 joining while they crawl, each node exiting by itself once the cluster has decided that the crawl is
finished (``--exit-when-done``). It prints progress while the nodes crawl, then the experiment's tables (URLs
sent from each node to each other node against the ratios the weights promise), the verdict, the WARC files
the nodes wrote and the plots.

The verdict is the web's, not the crawler's: what the local web's own request log saw, against the oracle
(the set of pages a correct crawler must fetch and must not fetch, ``web.expected()``), plus politeness
(never two connections to one host at once, no Crawl-delay broken) and how every node ended.

``peerctl demo --single`` runs the earlier demo: one node crawling the local web.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

import httpx
import trio

from peer.cli.main import format_status
from peer.control import auth_headers
from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.model import make_url
from peerlab.localweb.referee import (
    RequestRecord,
    crawl_delay_violations,
    max_concurrent_connections_per_host,
    requested_urls,
)
from peerlab.localweb.server import serve_web

if TYPE_CHECKING:
    from peerlab.experiment.live import LiveRun
    from peerlab.experiment.plan import Plan
    from peerlab.localweb.oracle import Expected

__all__ = [
    "DemoError", "Verdict", "WarcSummary", "add_arguments", "format_verdict", "judge", "main", "read_warcs",
    "run_cluster_demo", "run_demo",
]

#: The plan the cluster demo runs unless ``--plan`` names another.
DEMO_PLAN = "demo"
#: Content types a node writes to its WARC files (the node's ``store_types`` default).
STORED_TYPES = ("text/html", "application/xhtml+xml")
#: Up to this many URLs are named when the verdict lists what went wrong.
SHOW_URLS = 5

_SINGLE_DEFAULTS = {"hosts": 40, "pages_per_host": 25, "web_seed": 7, "delay": 0.2, "timeout": 600.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run the demo: a local web with its own DNS server, a peercrawl cluster crawling it (C leaves "
                     "and E joins midway), progress while it runs, then the experiment's tables, a verdict from "
                     "the web's own request log, the WARC files and the plots. Exit code 1 if the verdict is "
                     "FAILED. example: peerctl demo --dir demo-data")
    p.add_argument("--single", action="store_true",
                   help="the one-node demo instead: a single peerd crawling the local web")
    p.add_argument("--dir", default="demo-data",
                   help="run folder: reports, plots, node data dirs and logs (default ./demo-data)")
    p.add_argument("--plan", default=DEMO_PLAN, metavar="FILE|NAME",
                   help="the experiment plan the cluster demo runs (default demo: peerlab/experiment/demo.toml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a plan setting, value in TOML (repeatable; e.g. web.hosts=40)")
    p.add_argument("--hosts", type=int, help="hosts in the local web (default: the plan's; 40 with --single)")
    p.add_argument("--pages-per-host", dest="pages_per_host", type=int,
                   help="pages per host (default: the plan's; 25 with --single)")
    p.add_argument("--web-seed", dest="web_seed", type=int,
                   help="generator seed (default: the plan's; 7 with --single)")
    p.add_argument("--delay", type=float,
                   help="seconds between two requests to a host (default: the plan's; 0.2 s with --single)")
    p.add_argument("--timeout", type=float,
                   help="give up after this many seconds (default: the plan's live.timeout; 600 with --single)")
    p.add_argument("--resume", action="store_true", help="--single: keep the node's data dir from an earlier run")
    p.add_argument("--json", action="store_true", help="print the final report as JSON")


def main(args: argparse.Namespace) -> int:
    if args.single:
        for name, value in _SINGLE_DEFAULTS.items():
            if getattr(args, name, None) is None:
                setattr(args, name, value)
        return _single_main(args)
    return _cluster_main(args)


# --------------------------------------------------------------------------- the cluster demo


@dataclass(frozen=True, slots=True, kw_only=True)
class WarcSummary:
    """What the nodes' WARC files hold, read back with warcio (the reference reader), not the node's index."""

    #: (path, records, response records) per file
    files: tuple[tuple[str, int, int], ...]
    records: int
    pages: int
    #: distinct target URLs of the response records
    urls: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The crawl judged from the web's request log against the oracle, and the nodes' ends."""

    expected_pages: int
    fetched_pages: int
    missing: tuple[str, ...]
    #: requested although the oracle says a correct crawler never requests them (or they do not exist)
    unexpected: tuple[str, ...]
    #: the part of ``unexpected`` that robots.txt forbids
    disallowed_requested: tuple[str, ...]
    #: URL -> requests, for URLs requested more than once (robots.txt and the 429/503-first pages left out)
    fetched_twice: dict[str, int]
    #: the part of ``fetched_twice`` whose first request was not under way while the ring changed
    twice_unexplained: tuple[str, ...]
    #: False when a node was killed: what died with it may be fetched again, beyond what was in flight
    twice_judged: bool
    max_connections_per_host: int
    crawl_delay_violations: int
    #: node id -> (how it ended, exit code, how it should have ended)
    nodes: dict[str, tuple[str, int | None, str]]
    concluded: bool
    #: 200 HTML pages of the oracle missing from the WARC files, and stored URLs the oracle does not fetch
    not_stored: tuple[str, ...]
    stored_unexpected: tuple[str, ...]

    @property
    def nodes_ok(self) -> bool:
        return all(state == wanted and (code == 0 or wanted == "killed")
                   for state, code, wanted in self.nodes.values())

    @property
    def ok(self) -> bool:
        return (self.nodes_ok and self.concluded and not self.missing and not self.unexpected
                and (not self.twice_judged or not self.twice_unexplained)
                and self.max_connections_per_host <= 1 and self.crawl_delay_violations == 0
                and not self.not_stored and not self.stored_unexpected)


def read_warcs(paths: Iterable[Path]) -> WarcSummary:
    """Count every record of ``paths`` and collect the target URLs of the responses."""
    from warcio.archiveiterator import ArchiveIterator

    files = []
    urls: set[str] = set()
    for path in sorted(paths):
        records = responses = 0
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                records += 1
                if record.rec_type == "response":
                    responses += 1
                    urls.add(record.rec_headers.get_header("WARC-Target-URI"))
        files.append((str(path), records, responses))
    return WarcSummary(files=tuple(files), records=sum(f[1] for f in files), pages=sum(f[2] for f in files),
                       urls=frozenset(urls))


def _stored_by_a_correct_crawler(graph: SiteGraph, expected: Expected) -> set[str]:
    """The oracle's 200 pages whose answer is HTML and whole: what a node writes to its WARC files."""
    out = set()
    for url in expected.pages - expected.too_large:
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        res = graph.resource(parts.hostname or "", path)
        if res is not None and res.kind == "html" and res.content_type.split(";", 1)[0] in STORED_TYPES:
            out.add(url)
    return out


def _wanted_end(plan: Plan, node_id: str) -> str:
    for phase in plan.phases:
        if node_id in phase.remove:
            return "left"
        if node_id in phase.kill:
            return "killed"
    return "done" if plan.end.when_done else "stopped"


def judge(run: LiveRun, warcs: WarcSummary) -> Verdict:
    """Judge a live run (and the WARC files its nodes wrote) from the web's request log and the oracle."""
    graph, log = run.graph, run.log
    expected = graph.expected(port=run.port)
    counts = requested_urls(log, port=run.port)
    fetched = {u for u in counts if not u.endswith("/robots.txt") and u not in expected.robots}
    twice = {u: n for u, n in sorted(counts.items())
             if n > 1 and u in fetched and u not in expected.retried}
    first_request: dict[str, RequestRecord] = {}
    for record in sorted(log, key=lambda r: r.wall_start):
        first_request.setdefault(make_url(record.host, record.path, run.port), record)
    unexplained = tuple(u for u in twice if u not in first_request or not any(
        first_request[u].wall_start <= end and first_request[u].wall_end >= start for _, start, end in run.changes))
    conc = max_concurrent_connections_per_host(log)
    plan = run.result.plan
    stored = _stored_by_a_correct_crawler(graph, expected) if plan.live.store == "warc" else set()
    return Verdict(
        expected_pages=len(expected.fetched),
        fetched_pages=len(fetched & expected.fetched),
        missing=tuple(sorted(expected.fetched - fetched)),
        unexpected=tuple(sorted(fetched - expected.fetched)),
        disallowed_requested=tuple(sorted(fetched & expected.disallowed)),
        fetched_twice=twice,
        twice_unexplained=unexplained,
        twice_judged=not any(phase.kill for phase in plan.phases),
        max_connections_per_host=max(conc.values()) if conc else 0,
        crawl_delay_violations=len(crawl_delay_violations(log, graph)),
        nodes={n.node_id: (n.state, n.exit_code, _wanted_end(plan, n.node_id)) for n in run.nodes},
        concluded=run.concluded or not plan.end.when_done,
        not_stored=tuple(sorted(stored - warcs.urls)),
        stored_unexpected=tuple(sorted(warcs.urls - expected.fetched)),
    )


class DemoError(RuntimeError):
    """The demo cannot run; the message is one line."""


def _clear_run_folder(base: Path) -> None:
    """Remove an earlier demo's node data dirs and logs (``DIR/nodes``); refuse if a node there still runs."""
    nodes = base / "nodes"
    if not nodes.exists():
        return
    for lock in nodes.glob("*/LOCK"):
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise DemoError(f"a node is still running in {lock.parent} (another demo?); stop it or give --dir") from exc
        finally:
            os.close(fd)
    shutil.rmtree(nodes)


def _plan_overrides(args: argparse.Namespace) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for text in args.overrides:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise DemoError(f"--set {text!r}: expected KEY=VALUE (e.g. web.hosts=40)")
        overrides[key.strip()] = value.strip()
    for flag, key in (("hosts", "web.hosts"), ("pages_per_host", "web.pages_per_host"), ("web_seed", "seed"),
                      ("delay", "live.delay"), ("timeout", "live.timeout")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = repr(value)
    return overrides


async def run_cluster_demo(plan: Plan, base: Path, say: Callable[[str], None]
                           ) -> tuple[LiveRun, Verdict, WarcSummary]:
    """Run ``plan`` (a live plan) into the run folder ``base``; returns the live run, its verdict and WARCs."""
    from peerlab.experiment.live import live_run

    _clear_run_folder(base)
    run = await live_run(plan, base, progress=say)
    warc_paths = [p for node in run.nodes for p in (node.data_dir / "warc").glob("*.warc.gz")]
    warcs = await trio.to_thread.run_sync(read_warcs, warc_paths)
    return run, judge(run, warcs), warcs


def _names(urls: Iterable[str]) -> str:
    urls = list(urls)
    shown = ", ".join(urls[:SHOW_URLS])
    return f" ({shown}{', ...' if len(urls) > SHOW_URLS else ''})" if urls else ""


def _rel(path: str | Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def format_verdict(verdict: Verdict, warcs: WarcSummary, run: LiveRun, plots: list[Path]) -> str:
    """The verdict, the WARC files and the plots as text."""
    lines = ["", "== verdict: the local web's own request log against the oracle"]
    ends = ", ".join(f"{node} {state} (exit {code})" + ("" if state == wanted and (code == 0 or wanted == "killed")
                                                         else f" [expected: {wanted}]")
                     for node, (state, code, wanted) in verdict.nodes.items())
    lines.append(f"nodes: {ends}")
    if run.result.plan.end.when_done:
        lines.append("the cluster decided itself that the crawl was finished: every node exited through "
                     "--exit-when-done" if verdict.concluded else
                     "the cluster did NOT conclude the crawl (see the notes above)")
    changes = "; ".join(f"{what} {end - start:.1f} s" for what, start, end in run.changes)
    twice = verdict.fetched_twice
    lines += [
        f"pages a correct crawler must fetch:        {verdict.expected_pages:,}",
        f"fetched of those:                          {verdict.fetched_pages:,}",
        f"missing:                                   {len(verdict.missing):,}{_names(verdict.missing)}",
        f"requested but not to be fetched:           {len(verdict.unexpected):,}{_names(verdict.unexpected)}",
        f"  of which robots.txt forbids:             {len(verdict.disallowed_requested):,}",
        f"pages fetched twice (or more):             {len(twice):,}{_names(twice)}",
    ]
    if twice:
        how = (f"{len(twice) - len(verdict.twice_unexplained)} of them were under way while the ring changed "
               f"(the duplicates the design allows: {changes})")
        if not verdict.twice_judged:
            how += "; not judged: a killed node's seen-set died with it"
        lines.append(f"  {how}")
    lines += [
        f"max connections to one host at once:      {verdict.max_connections_per_host}",
        f"Crawl-delay violations:                    {verdict.crawl_delay_violations}",
    ]
    if run.result.plan.live.store == "warc":
        lines.append(f"200 HTML pages missing from the WARC files: {len(verdict.not_stored):,}"
                     f"{_names(verdict.not_stored)}")
        if verdict.stored_unexpected:
            lines.append(f"stored pages the oracle never fetches:     {len(verdict.stored_unexpected):,}"
                         f"{_names(verdict.stored_unexpected)}")
    lines.append("verdict: " + ("OK" if verdict.ok else "FAILED"))
    lines += ["", "== WARC files (read back with warcio)"]
    for path, records, pages in warcs.files:
        lines.append(f"{_rel(path)}  {records:,} records, {pages:,} pages")
    if warcs.files:
        lines.append(f"total: {len(warcs.files)} files, {warcs.records:,} records, {warcs.pages:,} pages stored "
                     f"({len(warcs.urls):,} distinct URLs)")
    else:
        lines.append("none (the plan's live.store is \"none\")")
    if plots:
        lines += ["", "== plots"]
        lines += [_rel(p) for p in plots]
    return "\n".join(lines) + "\n"


def _verdict_json(verdict: Verdict, warcs: WarcSummary) -> dict[str, Any]:
    data = asdict(verdict)
    data["ok"] = verdict.ok
    data["nodes"] = {n: {"end": s, "exit_code": c, "expected_end": w} for n, (s, c, w) in verdict.nodes.items()}
    data["warc"] = {"files": [{"path": p, "records": r, "pages": n} for p, r, n in warcs.files],
                    "records": warcs.records, "pages": warcs.pages, "distinct_urls": len(warcs.urls)}
    return data


def _cluster_main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from peerlab.experiment import BUNDLED_PLANS, PlanError, bundled_plan_text, load_plan, write_run
    from peerlab.experiment.live import LiveError

    out = out or sys.stdout
    began = time.monotonic()
    base = Path(args.dir)
    try:
        plan, _ = load_plan(args.plan, overrides=_plan_overrides(args))
        source = bundled_plan_text(args.plan) if args.plan in BUNDLED_PLANS else Path(args.plan).read_text(
            encoding="utf-8")
    except (PlanError, DemoError) as exc:
        print(f"peerctl demo: {exc}", file=sys.stderr)
        return 2
    if plan.mode != "live":
        print(f"peerctl demo: plan {plan.name}: the demo runs live nodes; give a plan with mode = \"live\"",
              file=sys.stderr)
        return 2

    def say(line: str) -> None:  # with --json, stdout holds the JSON alone
        print(line, file=sys.stderr if args.json else out, flush=True)

    say(f"peercrawl demo: plan {plan.name!r} into {_rel(base)}/ (watch a node: peerctl status --cluster "
        f"--data-dir {_rel(base / 'nodes' / next(iter(plan.initial_weights())))})")
    try:
        run, verdict, warcs = trio.run(run_cluster_demo, plan, base, say)
    except (LiveError, DemoError) as exc:
        print(f"peerctl demo: {exc}", file=sys.stderr)
        return 1
    text, written = write_run(run.result, base, source_text=source, plots=True)
    plots = [p for p in written if p.suffix == ".png"]
    (base / "web-requests.jsonl").write_text("".join(r.to_json() + "\n" for r in run.log), encoding="utf-8")
    (base / "verdict.json").write_text(json.dumps(_verdict_json(verdict, warcs), indent=1) + "\n",
                                       encoding="utf-8")
    if args.json:
        print(json.dumps(_verdict_json(verdict, warcs), indent=1), file=out)
    else:
        out.write("\n" + text)
        out.write(format_verdict(verdict, warcs, run, plots))
        print(f"\ndemo finished in {time.monotonic() - began:.0f} s: verdict {'OK' if verdict.ok else 'FAILED'}; "
              f"run folder {_rel(base)}/ (report.txt, CSV files, plots, verdict.json, web-requests.jsonl, nodes/)",
              file=out)
    return 0 if verdict.ok else 1


# --------------------------------------------------------------------------- the single-node demo (--single)


def _peerd_command(args: argparse.Namespace, seeds: list[str], dns_port: int, data_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "peer", "start", "--node-id", "demo-1", "--data-dir", str(data_dir),
           "--control", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--nameserver", f"127.0.0.1:{dns_port}",
           "--allow-private", "--delay", str(args.delay), "--exit-when-done", "--log-format", "json",
           "--ip-connections", "0"]  # the local web serves every host from 127.0.0.1: it stands for many servers
    for s in seeds:
        cmd += ["--seed", s]
    return cmd


async def _status(data_dir: Path) -> dict[str, Any] | None:
    try:
        addr = (data_dir / "control.addr").read_text().strip()
    except OSError:
        return None
    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            resp = await client.get(f"http://{addr}/status", headers=auth_headers(data_dir))
        return resp.json()
    except (httpx.HTTPError, ValueError):
        return None


async def run_demo(args: argparse.Namespace, out=sys.stdout) -> dict[str, Any]:
    """The single-node demo (``--single``): one peerd crawling the local web; the report as a dict."""
    base = Path(args.dir).resolve()
    data_dir = base / "node-1"
    if data_dir.exists() and not args.resume:
        shutil.rmtree(data_dir)
    base.mkdir(parents=True, exist_ok=True)
    graph = SiteGraph.generate(seed=args.web_seed, hosts=args.hosts, pages_per_host=args.pages_per_host)
    report: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_web, graph)
        dns = await nursery.start(serve_dns, graph.zone())
        seeds = web.seeds()
        print(f"local web: {len(graph.zone())} hosts on 127.0.0.1:{web.port}, DNS on "
              f"127.0.0.1:{dns.address[1]}, {len(seeds)} seeds", file=out)
        cmd = _peerd_command(args, seeds, dns.address[1], data_dir)
        log_path = base / "node-1.log"
        print(f"starting node: peerd start --data-dir {data_dir} ... (log: {log_path})", file=out)
        with open(log_path, "ab") as log_file:
            proc = await trio.lowlevel.open_process(cmd, stdout=log_file, stderr=log_file)
            try:
                with trio.move_on_after(args.timeout) as scope:
                    while proc.poll() is None:
                        await trio.sleep(1.0)
                        st = await _status(data_dir)
                        if st is not None:
                            q = st["queue"]
                            print(f"  pages {st['pages']:6d}  rate {st['rate']:7.1f}/s  queued {q['urls']:6d}  "
                                  f"hosts waiting {q['hosts_waiting']:4d}  errors {sum(st['errors'].values()):4d}",
                                  file=out, flush=True)
                            report["status"] = st
                if scope.cancelled_caught:
                    print(f"timed out after {args.timeout:.0f} s; stopping the node", file=out)
                    proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(30):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        nursery.cancel_scope.cancel()
    report["exit_code"] = proc.returncode
    expected = web.expected(max_body=10 * 2**20)
    seen = requested_urls(web.log, port=web.port)
    fetched = set(seen)
    report["expected_pages"] = len(expected.fetched)
    report["fetched_pages"] = len(fetched & expected.fetched)
    report["missing"] = sorted(expected.fetched - fetched)
    report["unexpected"] = sorted(fetched - expected.fetched - expected.robots)
    report["disallowed_requested"] = sorted(fetched & expected.disallowed)
    report["fetched_twice"] = sorted(u for u, n in seen.items()
                                     if n > 1 and u not in expected.retried and u not in expected.robots)
    conc = max_concurrent_connections_per_host(web.log)
    report["max_connections_per_host"] = max(conc.values()) if conc else 0
    report["crawl_delay_violations"] = len(crawl_delay_violations(web.log, graph))
    report["warc_files"] = sorted(str(p) for p in (data_dir / "warc").glob("*.warc.gz"))
    report["ok"] = (
        proc.returncode == 0 and not report["missing"] and not report["disallowed_requested"]
        and report["max_connections_per_host"] <= 1 and report["crawl_delay_violations"] == 0
    )
    return report


def _single_main(args: argparse.Namespace) -> int:
    report = trio.run(run_demo, args)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return 0 if report["ok"] else 1
    st = report.get("status")
    if st:
        print(format_status(st))
    print()
    print(f"pages a correct crawler must fetch: {report['expected_pages']}")
    print(f"fetched of those:                   {report['fetched_pages']}")
    print(f"missing:                            {len(report['missing'])}")
    print(f"disallowed by robots but requested: {len(report['disallowed_requested'])}")
    print(f"fetched twice:                      {len(report['fetched_twice'])}")
    print(f"max connections to one host:        {report['max_connections_per_host']}")
    print(f"Crawl-delay violations:             {report['crawl_delay_violations']}")
    for f in report["warc_files"]:
        print(f"WARC: {os.path.relpath(f)}")
    print("verdict: " + ("OK" if report["ok"] else "PROBLEMS (see above)"))
    return 0 if report["ok"] else 1
