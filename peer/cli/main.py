"""Command lines: ``peerd`` runs a node; ``peerctl`` talks to running nodes and runs experiments.

The only place ``trio.run`` is called. Errors to a person are one line; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import importlib
import json
import re
import os
import sys
import textwrap
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from urllib.parse import urlencode

import trio

from peer.cli import cluster_cmds, plugin_cmds, ring_cmd, steer_cmds
from peer.cli.client import control_address, control_request, find_token
from peer.cli.errors import CliError
from peer.cli.format import format_captures, format_status
from peer.config import DEFAULTS, FIELDS, Config, ConfigError, default_text, load
from peer.control import dashboard_address
from peer.log import setup_logging

# The node (peer.node, the crawl engine, the cluster, the stores) is imported by the commands that run or read
# one: a `peerctl` call that talks to a running node over HTTP starts in a third of the time.

__all__ = ["peerd_main", "peerctl_main"]

PEERD_EPILOG = textwrap.dedent(
    """\
    examples:
      peerd start --weight 150 --seed https://example.org/ --data-dir /var/lib/peercrawl \\
                  --contact https://example.org/crawler-info
      peerd start --config peerd.toml --exit-when-done
      peerd check --data-dir /var/lib/peercrawl       # read the stopped node's stores through: exit 0 when sound

    Settings come from built-in defaults < --config TOML < PEERCRAWL_* environment < flags.
    `peerd config` prints the effective settings with the reason for each default.
    """
)

PEERCTL_EPILOG = textwrap.dedent(
    """\
    examples:
      peerctl demo                                  # local web + DNS + a node crawling it, with progress
      peerctl status --control 127.0.0.1:7410       # one node's counters (or --data-dir DIR)
      peerctl ring --node A=150 --node B=80 --node C=200 --node D=40 --remove C --add E=300 --hosts 1000000
      peerctl status --cluster --data-dir ./a       # every member: state, pages, rate, queue, idle
      peerctl ring --data-dir ./a                   # the live ring: weight share, key share, URLs received
      peerctl dashboard --data-dir ./a              # the live dashboard's address (ring, flows, crawl)
      peerctl join --data-dir ./c --seed 127.0.0.1:7400
      peerctl leave --data-dir ./b                  # hand off everything, then exit
      peerctl stop --control 127.0.0.1:7410
      peerctl seed --data-dir ./a https://example.org/ https://example.net/   # or --file seeds.txt
      peerctl pause --data-dir ./a                  # the whole cluster stops starting fetches; resume resumes
      peerctl scope --data-dir ./a --exclude '/calendar/' --max-pages-per-host 500   # everywhere, at once
      peerctl plugins --data-dir ./a                # the plug-in chain of every node, its counts and state
      peerctl plugins reload --config crawl.toml --data-dir ./a   # a new chain on every node, or on none
      peerctl items --data-dir ./a                  # every node's items the plug-ins extracted, as JSON lines
      peerctl lookup --data-dir ./a https://example.org/   # its captures anywhere in the cluster, and where
      peerctl experiment --plan design --out runs/design   # the design's ring experiment, simulated
    """
)


# --------------------------------------------------------------------------- peerd


def _add_node_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("node")
    g.add_argument("--config", metavar="FILE", help="TOML file with settings (keys as in `peerd config`)")
    g.add_argument("--node-id", dest="node_id", help="stable node name (default: hostname:listen-port)")
    g.add_argument("--weight", type=int, help="ring weight, integer > 0")
    g.add_argument("--listen", help="peer address HOST:PORT")
    g.add_argument("--control", help="control/metrics address HOST:PORT; port 0 picks one")
    g.add_argument("--data-dir", dest="data_dir", help="directory for all durable state")
    g.add_argument("--store-check-timeout", dest="store_check_timeout", type=float, metavar="SECONDS",
                   help="bound on the check of the stores at a start after a run that did not stop cleanly "
                        "(0: no check)")
    k = p.add_argument_group("cluster (a node without a secret runs standalone)")
    g.add_argument("--control-token-file", dest="control_token_file", metavar="FILE",
                   help="file holding the control endpoint's token; without a token set, control stays on loopback")
    k.add_argument("--cluster-secret-file", dest="cluster_secret_file", metavar="FILE",
                   help="file holding the cluster secret (>= 16 bytes); or set PEERCRAWL_CLUSTER_SECRET")
    k.add_argument("--join", dest="join", action="append", metavar="HOST:PORT",
                   help="peer address of any member to join through (repeatable, tried in order)")
    k.add_argument("--join-srv", dest="join_srv", metavar="NAME",
                   help="DNS SRV name listing members to join through (Kubernetes headless service)")
    k.add_argument("--advertise", metavar="HOST:PORT", help="address peers dial (default: the --listen address)")
    k.add_argument("--zone", metavar="NAME",
                   help="failure zone: nodes that go down together (one machine) name the same one, and each queued "
                        "URL keeps a copy outside its owner's zone (default: this machine's host name)")
    k.add_argument("--tls-cert", dest="tls_cert", metavar="PEM", help="this node's certificate (mutual TLS)")
    k.add_argument("--tls-key", dest="tls_key", metavar="PEM", help="its private key")
    k.add_argument("--tls-ca", dest="tls_ca", metavar="PEM", help="the CA that signed every node's certificate")
    k.add_argument("--codec", choices=["msgpack", "json"], help="wire codec offered first")
    k.add_argument("--compression", choices=["br", "zlib", "none"], help="frame compression offered first")
    k.add_argument("--batch-size", dest="batch_size", type=int, metavar="N",
                   help="URLs per batch to a peer; a full batch goes at once")
    k.add_argument("--dispatch-interval", dest="dispatch_interval", type=float, metavar="SECONDS",
                   help="flush timer for partial batches")
    k.add_argument("--handoff-wait", dest="handoff_wait", type=float, metavar="SECONDS",
                   help="how long a gained arc waits for its hand-off before it is crawled anyway")
    k.add_argument("--leave-timeout", dest="leave_timeout", type=float, metavar="SECONDS",
                   help="bound on a graceful leave's hand-off")
    k.add_argument("--probe-timeout", dest="probe_timeout", type=float, metavar="SECONDS",
                   help="wait for a direct probe's answer before asking others to probe")
    k.add_argument("--suspicion-timeout", dest="suspicion_timeout", type=float, metavar="SECONDS",
                   help="time a silent peer has to refute a suspicion before it is declared dead")
    k.add_argument("--replicas", dest="replicas", type=int, metavar="R",
                   help="ring backups that hold every queued URL durably besides its owner; 0 turns it off")
    k.add_argument("--link-idle-timeout", dest="link_idle_timeout", type=float, metavar="SECONDS",
                   help="close a peer link idle this long; it reopens at its next use (0: keep links open)")
    k.add_argument("--max-links", dest="max_links", type=int, metavar="N",
                   help="live peer links at most; the least recently used idle one closes first (0: no bound)")
    k.add_argument("--no-peer-datagrams", dest="peer_datagrams", action="store_const", const=False,
                   help="keep membership's probes and gossip on TCP links instead of UDP on the peer port")
    c = p.add_argument_group("crawl")
    c.add_argument("--seed", dest="seeds", action="append", metavar="URL", help="start URL (repeatable)")
    c.add_argument("--seeds-file", dest="seeds_file", metavar="FILE", help="file of start URLs, one per line")
    c.add_argument("--allow-host", dest="allowed_hosts", action="append", metavar="PATTERN",
                   help="crawl only these hosts and their subdomains (repeatable)")
    c.add_argument("--deny-host", dest="denied_hosts", action="append", metavar="PATTERN",
                   help="never crawl these hosts (repeatable)")
    c.add_argument("--max-depth", dest="max_depth", type=int, help="link depth limit (-1: none)")
    c.add_argument("--max-pages-per-host", dest="max_pages_per_host", type=int,
                   help="pages fetched from one host, counted by its owner fleet-wide (-1: none)")
    c.add_argument("--max-bytes-per-host", dest="max_bytes_per_host", type=int, metavar="BYTES",
                   help="body bytes fetched from one host, counted by its owner fleet-wide (-1: none)")
    c.add_argument("--include", dest="include", action="append", metavar="REGEX",
                   help="crawl only URLs in which one of these matches (re.search on the normalized URL; repeatable)")
    c.add_argument("--exclude", dest="exclude", action="append", metavar="REGEX",
                   help="never crawl URLs in which one of these matches (repeatable)")
    c.add_argument("--max-url-length", dest="max_url_length", type=int, metavar="N",
                   help="longer URLs are not crawled")
    c.add_argument("--max-query-params", dest="max_query_params", type=int, metavar="N",
                   help="URLs with more query parameters are not crawled (-1: none)")
    c.add_argument("--delay", type=float, help="minimum seconds between requests to one host")
    c.add_argument("--concurrency", type=int, help="fetches in flight")
    c.add_argument("--page-threads", dest="page_threads", type=int, metavar="N",
                   help="threads that store and parse pages, to use more cores (0: inline; docs/operations.md)")
    c.add_argument("--page-processes", dest="page_processes", type=int, metavar="N",
                   help="worker processes that parse pages and build their WARC records, to use more cores "
                        "(0: inline; docs/operations.md has the sizing)")
    c.add_argument("--ip-connections", dest="ip_connections", type=int, metavar="N",
                   help="requests in service at once to one server address (0: no per-address limits)")
    c.add_argument("--ip-delay", dest="ip_delay", type=float, metavar="SECONDS",
                   help="seconds between the end of a request to an address and the next on its lane")
    c.add_argument("--user-agent", dest="user_agent", help="product token/version")
    c.add_argument("--contact", help="URL or address for site owners, added to the User-Agent")
    c.add_argument("--store", choices=["warc", "none"], help="page store")
    c.add_argument("--dedup", choices=["lmdb", "memory-urls", "memory-md5", "md5-tree", "bloom", "redis"],
                   help="seen-URL store (the others are the URL-dedup study's, see docs/experiments.md)")
    c.add_argument("--redis-url", dest="redis_url", metavar="URL", help="redis://HOST:PORT/DB for --dedup redis")
    c.add_argument("--upload", metavar="s3://BUCKET/PREFIX",
                   help="send every closed WARC file and its index to S3-compatible storage (endpoint and credentials "
                        "from the upload_* settings or AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                        "AWS_REGION); e.g. --upload s3://crawls/2026-11")
    c.add_argument("--keep-local", dest="keep_local", action="store_const", const=True,
                   help="keep WARC files on this disk after their verified upload")
    c.add_argument("--disk-min-free-mib", dest="disk_min_free_mib", type=int, metavar="MIB",
                   help="below this much free space on the data directory's disk the node holds (no new fetch, no "
                        "new URL admitted) and resumes by itself at a quarter more (0: never hold)")
    c.add_argument("--webhook", metavar="URL",
                   help="POST a signed JSON notice for every WARC file uploaded (with --upload) or closed; the "
                        "HMAC key is webhook_secret (PEERCRAWL_WEBHOOK_SECRET); e.g. --webhook https://hooks.example/warc")
    c.add_argument("--crawl-log", dest="crawl_log", metavar="redis://HOST:PORT/DB",
                   help="stream every crawl-log record to a Redis stream as well as to DATA_DIR/crawl-log/ (at least "
                        "once; record id NODE_ID-NUMBER); e.g. --crawl-log 'redis://10.0.0.5:6379/0?stream=crawl&maxlen=1000000'")
    c.add_argument("--store-type", dest="store_types", action="append", metavar="MIME",
                   help="content type to store (repeatable)")
    c.add_argument("--max-body", dest="max_body", type=int, metavar="BYTES", help="body size cap")
    c.add_argument("--no-sitemaps", dest="sitemaps", action="store_const", const=False,
                   help="do not read the sitemaps robots.txt names")
    c.add_argument("--sitemap-xml", dest="sitemap_xml", action="store_const", const=True,
                   help="read /sitemap.xml of hosts whose robots.txt names no sitemap")
    c.add_argument("--revisit", dest="revisit", action="store_const", const=True,
                   help="keep crawling: fetch every stored page again on an adaptive schedule (conditional GET; "
                        "unchanged pages cost a WARC revisit record)")
    c.add_argument("--no-payload-revisits", dest="payload_revisits", action="store_const", const=False,
                   help="store every page in full, even one whose payload the cluster stored already under another "
                        "URL (by default such a page is a WARC revisit record pointing at the first copy)")
    c.add_argument("--revisit-min", dest="revisit_min", type=float, metavar="SECONDS",
                   help="shortest revisit interval")
    c.add_argument("--revisit-max", dest="revisit_max", type=float, metavar="SECONDS",
                   help="longest revisit interval")
    c.add_argument("--exit-when-done", dest="exit_when_done", action="store_const", const=True,
                   help="exit 0 when the frontier is empty and nothing is in flight")
    n = p.add_argument_group("network")
    n.add_argument("--nameserver", dest="nameservers", action="append", metavar="ADDR[:PORT]",
                   help="DNS server to use (repeatable; default: /etc/resolv.conf)")
    n.add_argument("--allow-private", dest="allow_private", action="store_const", const=True,
                   help="allow private, loopback and link-local addresses (tests, local demos)")
    n.add_argument("--http2", dest="http2", choices=["on", "off"],
                   help="offer HTTP/2 by ALPN on HTTPS (per host: [hosts.\"PATTERN\"] http2 in the TOML file)")
    n.add_argument("--proxy", dest="proxy", action="append", metavar="URL",
                   help="go through this proxy: http://HOST:PORT, socks5://HOST:PORT or socks5h://HOST:PORT "
                        "(repeatable: taken in turn; credentials: proxy_user/proxy_password in the TOML file or "
                        "environment)")
    r = p.add_argument_group("rendering (pages that need JavaScript, in a headless chromium: docs/rendering.md)")
    r.add_argument("--render", dest="render", choices=["never", "auto", "always"],
                   help="render pages in a browser: never, auto (when a page's HTML shows it is built by script) "
                        "or always (per host: [hosts.\"PATTERN\"] render in the TOML file)")
    r.add_argument("--browser-ws", dest="browser_ws", metavar="URL",
                   help="attach to a browser that already runs (its DevTools ws://... URL) instead of starting one")
    r.add_argument("--chromium", dest="chromium", metavar="PATH", help="the browser binary (default: Debian's chromium)")
    r.add_argument("--render-tabs", dest="render_tabs", type=int, metavar="N", help="renders at once")
    r.add_argument("--render-timeout", dest="render_timeout", type=float, metavar="SECONDS",
                   help="time one render may take, its requests included")
    r.add_argument("--browser-max-pages", dest="browser_max_pages", type=int, metavar="N",
                   help="renders before the browser is restarted")
    r.add_argument("--browser-max-mib", dest="browser_max_mib", type=int, metavar="MIB",
                   help="browser memory (all its processes) past which it is restarted")
    o = p.add_argument_group("output")
    o.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    o.add_argument("--log-format", dest="log_format", choices=["auto", "json", "text"])
    o.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    _add_defaults(p)


def _add_defaults(p: argparse.ArgumentParser) -> None:
    """Append each setting's built-in default to its flag's help, from peer.config: stated once, shown here."""
    for action in p._actions:
        text = default_text(action.dest) if action.dest in DEFAULTS else None
        if text is not None and action.help is not None:
            action.help += f" (default {text})".replace("%", "%%")


def _config_from(args: argparse.Namespace):
    # every setting with a flag has the setting's name as its argparse dest; the rest are simply absent
    flags = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(Config)}
    return load(toml=args.config, env=os.environ, flags=flags)


def _peerd_start(args: argparse.Namespace) -> int:
    from peer.crawl.pageworkers import settle_collector
    from peer.node import run_node

    cfg = _config_from(args)
    setup_logging(cfg.log_level, cfg.log_format)
    # A fatal signal (an LMDB assertion's SIGABRT, a SIGSEGV in a C library) prints every thread's Python stack
    # to stderr, the node's log, before the process dies: the reason is in the log, not only an exit status.
    faulthandler.enable(all_threads=True)
    settle_collector()  # the node's, as each page worker's
    return trio.run(run_node, cfg)


def _peerd_config(args: argparse.Namespace) -> int:
    cfg = _config_from(args)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in SECRET_SETTINGS and value:
            # The output is pasted into tickets and chats: a secret is shown only as set, never its value.
            shown = json.dumps(f"<set: {len(value.encode())} bytes, not shown>")
        elif f.name in ("proxy", "hosts"):
            shown = _PROXY_PASSWORD.sub(r"://\1:<not shown>@", json.dumps(value))  # a proxy URL's password
        else:
            shown = json.dumps(value)
        print(f"{f.name} = {shown}    # {FIELDS.get(f.name, '')}")
    return 0


def _peerd_check(args: argparse.Namespace) -> int:
    """Read every store of a stopped node's data dir through, each in a child process (as a start does after a
    run that did not stop cleanly); exit 0 when all are sound, 2 with the store's error when one is not."""
    from peer.node import NodeError, lock_data_dir
    from storage import RUNNING, check_data_dir, mark_stopped, running_marker

    cfg = _config_from(args)
    data_dir = Path(cfg.data_dir)
    if not data_dir.is_dir():
        raise CliError(f"no data dir at {data_dir}")
    timeout = cfg.store_check_timeout or DEFAULTS["store_check_timeout"]
    with ExitStack() as stack:
        try:
            lock_data_dir(data_dir, stack)
        except NodeError as exc:
            raise CliError(f"{exc}; stop it first (the check reads the whole store and must not race its "
                           "writes)") from exc
        unclean = running_marker(data_dir) is not None
        checks = check_data_dir(data_dir, timeout=timeout, remembered=False)
        for c in checks:
            rate = c.keys / c.seconds if c.seconds else 0.0
            mb = c.bytes / 1e6
            print(f"{c.path}: sound: {c.keys:,} keys in {c.databases} databases, {mb:,.1f} MB of keys and values "
                  f"read in {c.seconds:.2f} s ({rate:,.0f} keys/s; data.mdb {c.file_bytes / 1e6:,.1f} MB)")
        if not checks:
            print(f"{data_dir}: no store yet (nothing to check)")
        if unclean:
            mark_stopped(data_dir)
            print(f"{data_dir / RUNNING} removed: the last run did not stop cleanly, and its stores are sound; "
                  "the next start opens them without checking again")
    return 0


_PROXY_PASSWORD = re.compile(r"://([^:@/\"]*):[^@/\"]*@")
#: Settings `peerd config` never prints.
SECRET_SETTINGS = frozenset({"cluster_secret", "control_token", "proxy_password"})


def peerd_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="peerd", description="Run a peercrawl node.", epilog=PEERD_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("start", help="run a crawler node", epilog=PEERD_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_node_flags(p)
    p.set_defaults(func=_peerd_start)
    p = sub.add_parser("config", help="print the effective settings and why each default is what it is")
    _add_node_flags(p)
    p.set_defaults(func=_peerd_config)
    p = sub.add_parser(
        "check", help="read a stopped node's stores through and say whether they are sound (exit 0) or not (2)",
        description="Read every LMDB store in the data dir through, each in a child process: every database, "
        "every key and value, each key also searched for from the root. A store LMDB cannot read (it reports "
        "damage, or aborts on it) is reported in one line naming the file and what to do; the node must be "
        "stopped. Example: peerd check --data-dir /var/lib/peercrawl")
    p.add_argument("--config", metavar="FILE", help="TOML file with settings (for data_dir)")
    p.add_argument("--data-dir", dest="data_dir", help="the node's data directory")
    p.add_argument("--store-check-timeout", dest="store_check_timeout", type=float, metavar="SECONDS",
                   help="give up after this long")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    _add_defaults(p)
    p.set_defaults(func=_peerd_check)
    args = parser.parse_args(argv)
    return _run(args, "peerd")


# --------------------------------------------------------------------------- peerctl


def _peerctl_status(args: argparse.Namespace) -> int:
    if args.cluster:
        cs = control_request(control_address(args), "GET", "/cluster")
        print(cluster_cmds.dumps(cs) if args.json else cluster_cmds.format_cluster(cs))
        return 0
    st = control_request(control_address(args), "GET", "/status")
    print(json.dumps(st, indent=1, sort_keys=True) if args.json else format_status(st))
    return 0


def _peerctl_lookup(args: argparse.Namespace) -> int:
    query = {"url": args.url, "matchType": args.match, "output": "json", "limit": str(args.limit)}
    if args.since:
        query["from"] = args.since
    if args.until:
        query["to"] = args.until
    text = control_request(control_address(args), "GET", "/cdx?" + urlencode(query), timeout=args.timeout)
    captures = [json.loads(line) for line in str(text).splitlines() if line.strip()]
    if args.json:
        for capture in captures:
            print(json.dumps(capture, sort_keys=True))
        return 0
    print(format_captures(captures))
    return 0 if captures else 1


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _peerctl_plugins(args: argparse.Namespace) -> int:
    addresses = plugin_cmds.targets(args)
    if args.action == "reload":
        if not args.config:
            raise CliError("peerctl plugins reload needs --config FILE (its [[plugins]] tables are loaded)")
        return plugin_cmds.reload(control_request, addresses, args.config, print)
    return plugin_cmds.plugins(control_request, addresses, print, _stderr, as_json=args.json)


def _peerctl_items(args: argparse.Namespace) -> int:
    return plugin_cmds.items(control_request, plugin_cmds.targets(args), print, _stderr, limit=args.limit)


def _peerctl_export(args: argparse.Namespace) -> int:
    if not args.data_dirs:
        raise CliError("export needs --data-dir DIR (repeat it for every node whose crawl to pack)")
    from storage import pack_wacz

    started = time.perf_counter()
    try:
        report = pack_wacz(args.data_dirs, args.wacz, host=args.host, title=args.title,
                           software="peercrawl")
    except (OSError, ValueError) as exc:
        raise CliError(f"export: {exc}") from exc
    took = time.perf_counter() - started
    print(f"{report.path}: {report.records} captures ({report.pages} pages) from {report.warc_files} WARC "
          f"file(s), {report.bytes} bytes packed in {took:.1f} s")
    for skipped in report.skipped_open:
        print(f"left out (still being written; stop the node or wait for it to close): {skipped}")
    return 0


def _peerctl_join(args: argparse.Namespace) -> int:
    print(cluster_cmds.join(control_request, control_address(args), args.seed))
    return 0


def _peerctl_leave(args: argparse.Namespace) -> int:
    return cluster_cmds.leave(control_request, control_address(args), wait=not args.no_wait,
                            timeout=args.timeout, out=print)


def _peerctl_stop(args: argparse.Namespace) -> int:
    control_request(control_address(args), "POST", "/stop")
    print("stop requested")
    return 0


def _peerctl_seed(args: argparse.Namespace) -> int:
    urls = list(args.urls) + (steer_cmds.read_seed_file(args.file) if args.file else [])
    steer_cmds.seed(control_request, control_address(args), urls)
    return 0


def _peerctl_pause(args: argparse.Namespace) -> int:
    steer_cmds.pause(control_request, control_address(args))
    return 0


def _peerctl_resume(args: argparse.Namespace) -> int:
    steer_cmds.resume(control_request, control_address(args))
    return 0


def _peerctl_scope(args: argparse.Namespace) -> int:
    steer_cmds.scope(control_request, control_address(args), steer_cmds.scope_changes(args), as_json=args.json)
    return 0


def _peerctl_ring(args: argparse.Namespace) -> int:
    if args.control or args.data_dir:
        cs = control_request(control_address(args), "GET", "/cluster")
        print(cluster_cmds.dumps(cs) if args.json else cluster_cmds.format_ring(cs))
        return 0
    if not args.node:
        raise CliError("peerctl ring needs --node NAME=WEIGHT (a simulation) or --control/--data-dir (a live node)")
    return ring_cmd.run(args)


def _peerctl_dashboard(args: argparse.Namespace) -> int:
    address, token = control_address(args), find_token(args)
    if token is None:
        raise CliError("peerctl dashboard needs the node's control token: give --data-dir DIR, --token-file FILE "
                       "or PEERCRAWL_CONTROL_TOKEN")
    control_request(address, "GET", "/healthz", timeout=5.0)  # the node is there
    print(dashboard_address(address, token))
    return 0


# The lab (peerlab: the local web, the experiment, the demo) is a sibling package the daemon never imports; its
# two commands are found by name when it is installed (`pip install 'peercrawl[lab]'`), like a plugin.
LAB_COMMANDS = {"experiment": "peerlab.experiment", "demo": "peerlab.demo"}
LAB_INSTALL = "pip install 'peercrawl[lab]'  (in a checkout: pip install -e '.[lab]')"


def _lab(command: str) -> ModuleType | None:
    """The lab module behind `peerctl COMMAND`, or None when the lab or one of its libraries is missing."""
    try:
        return importlib.import_module(LAB_COMMANDS[command])
    except ImportError:
        return None


def _lab_missing(args: argparse.Namespace) -> int:
    raise CliError(f"peerctl {args.cmd} needs the lab, which is not installed: {LAB_INSTALL}")


def _add_lab_command(sub, command: str, help_text: str) -> None:
    module = _lab(command)
    if module is None:
        p = sub.add_parser(command, help=f"{help_text} [needs the lab: {LAB_INSTALL}]")
        p.set_defaults(func=_lab_missing)  # its arguments are unknown here: peerctl_main lets them pass
        return
    p = sub.add_parser(command, help=help_text)
    module.add_arguments(p)
    p.set_defaults(func=module.main if command == "demo" else module.run)


def peerctl_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="peerctl", description="Control peercrawl nodes and run ring experiments.",
        epilog=PEERCTL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="cmd", required=True)

    def target(p: argparse.ArgumentParser) -> None:
        p.add_argument("--control", metavar="HOST:PORT", help="the node's control address")
        p.add_argument("--data-dir", dest="data_dir", metavar="DIR", help="find the node by its data dir")
        p.add_argument("--token-file", dest="token_file", metavar="FILE",
                       help="the node's control token (default: DIR/control.token, or PEERCRAWL_CONTROL_TOKEN)")

    p = sub.add_parser("status", help="a node's counters: pages, rate, queues, errors (--cluster: every member)")
    target(p)
    p.add_argument("--cluster", action="store_true", help="every member: state, pages, rate, queue, idle")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(func=_peerctl_status)
    p = sub.add_parser("lookup", help="the captures of a URL anywhere in the cluster: time, status, digest, where "
                                      "the record is (a node's file and offset, or the object once uploaded)",
                       description="Ask any node for the captures the whole cluster holds (its GET /cdx, pywb's "
                       "CDX server API). Exit status 1 when there are none. Example: peerctl lookup --data-dir ./a "
                       "'https://example.org/news/' --match prefix --from 2026")
    target(p)
    p.add_argument("url", metavar="URL", help="the URL (a trailing * asks for a prefix, a leading *. for a domain)")
    p.add_argument("--match", choices=["exact", "prefix", "host", "domain"], default="exact",
                   help="pywb's matchType (default: exact)")
    p.add_argument("--from", dest="since", metavar="TIMESTAMP", help="earliest capture time, up to 14 digits")
    p.add_argument("--to", dest="until", metavar="TIMESTAMP", help="latest capture time, up to 14 digits")
    p.add_argument("--limit", type=int, default=1000, metavar="N", help="at most N captures (default 1000)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    p.add_argument("--json", action="store_true", help="one JSON object a capture (pywb's fields, node, object)")
    p.set_defaults(func=_peerctl_lookup)
    p = sub.add_parser("join", help="make a running node join a cluster through one of its members")
    target(p)
    p.add_argument("--seed", required=True, metavar="HOST:PORT", help="peer address of any member")
    p.set_defaults(func=_peerctl_join)
    p = sub.add_parser("leave", help="make a node leave gracefully: hand off everything, then exit")
    target(p)
    p.add_argument("--no-wait", action="store_true", help="return at once instead of following the hand-off")
    p.add_argument("--timeout", type=float, default=300.0, help="give up following after this many seconds")
    p.set_defaults(func=_peerctl_leave)
    p = sub.add_parser("stop", help="ask a node to stop cleanly")
    target(p)
    p.set_defaults(func=_peerctl_stop)
    p = sub.add_parser("dashboard", help="print the address of the node's live dashboard (open it in a browser)",
                       description="Print the address of the dashboard the node serves for the whole cluster: "
                       "its control endpoint, with the control token in the fragment (a browser never sends "
                       "it to a server; the page sends it with each API call). Example: "
                       "peerctl dashboard --data-dir ./a")
    target(p)
    p.set_defaults(func=_peerctl_dashboard)
    p = sub.add_parser("seed", help="add start URLs to a running crawl (routed to their owners from any node)")
    target(p)
    p.add_argument("urls", nargs="*", metavar="URL", help="start URLs")
    p.add_argument("--file", metavar="FILE", help="file of start URLs, one a line (# comments allowed)")
    p.set_defaults(func=_peerctl_seed)
    p = sub.add_parser("pause", help="stop starting fetches everywhere in the cluster (state is kept)")
    target(p)
    p.set_defaults(func=_peerctl_pause)
    p = sub.add_parser("resume", help="start fetching again everywhere after a pause")
    target(p)
    p.set_defaults(func=_peerctl_resume)
    p = sub.add_parser("scope", help="change the crawl's scope and budgets everywhere at runtime (no change "
                                      "given: show them); queued URLs now out of scope are dropped when popped")
    target(p)
    steer_cmds.add_scope_arguments(p)
    p.set_defaults(func=_peerctl_scope)
    p = sub.add_parser("ring", help="the live ring of a running cluster (--control/--data-dir), or a simulation "
                                     "(--node ...): shares, moved keys")
    target(p)
    ring_cmd.add_arguments(p)
    p.set_defaults(func=_peerctl_ring)
    p = sub.add_parser("plugins", help="the plug-in chain every node runs, with its counts; reload: load a new "
                                       "chain on every node, or on none", description="Show every node's plug-in "
                       "chain (fingerprint, pages, items, errors, state), asked of the whole cluster through the "
                       "node named; or with `reload --config FILE` load the [[plugins]] of FILE on every node (each "
                       "swaps between two pages) or, when one cannot load it, on none (the error names the node "
                       "and the plug-in). A node that does not answer is named on stderr (exit status 3). Example: "
                       "peerctl plugins reload --config crawl.toml --data-dir ./a")
    p.add_argument("action", nargs="?", choices=["list", "reload"], default="list")
    p.add_argument("--config", metavar="FILE", help="with reload: the TOML file whose [[plugins]] to load")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    plugin_cmds.add_targets(p)
    p.set_defaults(func=_peerctl_plugins)
    p = sub.add_parser("items", help="the items every node's plug-ins extracted, as JSON lines",
                       description="Print the items every node of the cluster has exported (DATA_DIR/items/), "
                       "asked through the node named, one JSON object a line with its node (_node). A node that "
                       "does not answer is named on stderr (exit status 3). Example: peerctl items --data-dir ./a")
    p.add_argument("--limit", type=int, metavar="N", help="at most N items")
    plugin_cmds.add_targets(p)
    p.set_defaults(func=_peerctl_items)
    p = sub.add_parser("export", help="pack a crawl (or one host's pages) into a WACZ file",
                       description="Pack the crawl held in the data dirs named (a node's, or every node's of a "
                       "cluster whose data dirs this machine reads) into a WACZ 1.1.1 file: the WARC files, one "
                       "sorted CDXJ index, pages/pages.jsonl and a datapackage.json with every file's SHA-256. "
                       "With --host, only that host's captures (and the originals its revisit records refer to). "
                       "Example: peerctl export --wacz crawl.wacz --data-dir ./a --data-dir ./b")
    p.add_argument("--wacz", required=True, metavar="FILE", help="the WACZ file to write")
    p.add_argument("--data-dir", dest="data_dirs", metavar="DIR", action="append", default=[],
                   help="a node's data dir (repeat it for every node)")
    p.add_argument("--host", metavar="HOST", help="only this host's captures")
    p.add_argument("--title", metavar="TEXT", help="the collection's title (datapackage.json)")
    p.set_defaults(func=_peerctl_export)
    _add_lab_command(sub, "experiment", "ring-rebalance experiment (a TOML plan, simulated or with live nodes): "
                                        "URLs sent between nodes against the weights, tables, CSV and plots")
    _add_lab_command(sub, "demo", "crawl a built-in local web with a local cluster, showing progress")
    args, unknown = parser.parse_known_args(argv)
    if unknown and getattr(args, "func", None) is not _lab_missing:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return _run(args, "peerctl")


# --------------------------------------------------------------------------- shared


def _leaf_errors(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for sub in exc.exceptions:
            out.extend(_leaf_errors(sub))
        return out
    return [exc]


#: The errors whose message is for a person, by module; an error of a module the command never imported cannot
#: have been raised.
_KNOWN_ERRORS = (("peer.node", "NodeError"), ("storage", "StorageError"), ("peer.crawl.pagejobs", "PageWorkerError"))


def _known_errors() -> tuple[type[BaseException], ...]:
    known: list[type[BaseException]] = [CliError, ConfigError]
    for module, name in _KNOWN_ERRORS:
        if module in sys.modules:
            known.append(getattr(sys.modules[module], name))
    return tuple(known)


def _run(args: argparse.Namespace, prog: str) -> int:
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:  # noqa: BLE001 - the one place errors become one line for a person
        if getattr(args, "debug", False) or isinstance(exc, SystemExit):
            raise
        leaves = _leaf_errors(exc)
        known = _known_errors()
        for leaf in leaves:
            if isinstance(leaf, known):
                print(f"{prog}: error: {leaf}", file=sys.stderr)
                return 2
        if all(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            return 130
        leaf = leaves[0]
        print(f"{prog}: error: {type(leaf).__name__}: {leaf} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1
