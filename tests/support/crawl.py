"""Helpers shared by the crawl tests: a local web + DNS server, node configs pointed at them, and
subprocess nodes started and stopped by PID."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import trio

from peer.config import Config, load
from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.server import serve_web


async def start_local_web(nursery: trio.Nursery, graph: SiteGraph):
    web = await nursery.start(serve_web, graph)
    dns = await nursery.start(serve_dns, graph.zone())
    return web, dns


def node_config(data_dir: Path, web, dns, **overrides) -> Config:
    flags = {
        "node_id": "test-node",
        "data_dir": str(data_dir),
        "control": "127.0.0.1:0",
        "listen": "127.0.0.1:0",
        "seeds": web.seeds(),
        "nameservers": [f"127.0.0.1:{dns.address[1]}"],
        "allow_private": True,
        "delay": 0.05,
        "exit_when_done": True,
        "concurrency": 64,
        "connect_timeout": 5.0,
        "read_timeout": 5.0,
        "total_timeout": 20.0,
    }
    flags.update(overrides)
    return load(env={}, flags=flags)


def peerd_argv(cfg: Config) -> list[str]:
    """The command line that starts ``cfg`` as a real peerd process."""
    argv = [sys.executable, "-m", "peer", "start", "--node-id", cfg.node_id, "--data-dir", cfg.data_dir,
            "--control", cfg.control, "--listen", cfg.listen, "--delay", str(cfg.delay),
            "--concurrency", str(cfg.concurrency), "--log-format", "json"]
    for s in cfg.seeds:
        argv += ["--seed", s]
    for ns in cfg.nameservers:
        argv += ["--nameserver", ns]
    if cfg.allow_private:
        argv.append("--allow-private")
    if cfg.exit_when_done:
        argv.append("--exit-when-done")
    if cfg.store != "warc":
        argv += ["--store", cfg.store]
    return argv


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def urls_fetched(web, expected) -> set[str]:
    """URLs the web answered, without robots.txt requests (and the targets robots.txt redirected to)."""
    from peerlab.localweb.referee import requested_urls

    return {u for u in requested_urls(web.log, port=web.port)
            if not u.endswith("/robots.txt") and u not in expected.robots}


__all__: Sequence[str] = ["start_local_web", "node_config", "peerd_argv", "kill_pid", "child_env", "urls_fetched"]


def node_warc_records(root: Path, names: Sequence[str]) -> Iterator[tuple[str, str, Any]]:
    """(node, record type, WARC headers) of every response and revisit record in the WARC files of the nodes
    whose data dirs are `root / name`, each record's digests checked."""
    from warcio.archiveiterator import ArchiveIterator

    for name in names:
        for path in sorted((root / name / "warc").glob("*.warc.gz")):
            with open(path, "rb") as fh:
                for record in ArchiveIterator(fh, check_digests="raise"):
                    if record.rec_type in ("response", "revisit"):
                        yield name, record.rec_type, record.rec_headers
