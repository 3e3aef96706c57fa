"""`peerctl seed`, `pause`, `resume` and `scope`: steering a running crawl through the control API.

Each command is one or more calls of the node's JSON API (docs/operations.md lists them), made with
`peer.cli.client.control_request`, so whatever that function adds to a request (authentication) applies here
too. In a cluster any member will do: seeds are routed to their owners, and settings are gossiped to all.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from peer.cli.errors import CliError
from peer.cli.format import format_settings

__all__ = ["add_scope_arguments", "pause", "read_seed_file", "resume", "scope", "scope_changes", "seed"]

#: URLs per POST /seed: well under the node's limit (5,000) and its 1 MiB body limit at 2 KiB a URL.
SEEDS_PER_REQUEST = 400

Request = Callable[..., Any]

_LIST_FLAGS = {"include": "include", "exclude": "exclude", "allow_host": "allowed_hosts",
               "deny_host": "denied_hosts"}
_INT_FLAGS = ("max_depth", "max_pages_per_host", "max_bytes_per_host", "max_url_length", "max_query_params")


def read_seed_file(path: str) -> list[str]:
    """One URL a line; blank lines and # comments skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"seeds file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CliError(f"seeds file {path} is not UTF-8 text: {exc}") from exc
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _parts(urls: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(urls), size):
        yield urls[start:start + size]


def seed(request: Request, address: str, urls: Sequence[str], *, out: Callable[[str], None] = print) -> dict:
    """POST /seed in parts; the summed report."""
    if not urls:
        raise CliError("no URLs to seed: give URLs or --file FILE")
    total: dict[str, Any] = {"new": 0, "seen": 0, "routed": 0, "out_of_scope": {}, "invalid": []}
    for part in _parts(list(urls), SEEDS_PER_REQUEST):
        report = request(address, "POST", "/seed", body={"urls": list(part)})
        for key in ("new", "seen", "routed"):
            total[key] += report[key]
        for reason, n in report["out_of_scope"].items():
            total["out_of_scope"][reason] = total["out_of_scope"].get(reason, 0) + n
        total["invalid"] += report["invalid"]
    refused = " ".join(f"{k}={v}" for k, v in sorted(total["out_of_scope"].items())) or "none"
    out(f"{len(urls)} seeds: {total['new']} queued here, {total['seen']} already seen here, "
        f"{total['routed']} sent to their owners; out of scope: {refused}; not URLs: {len(total['invalid'])}")
    for bad in total["invalid"][:10]:
        out(f"  not a crawlable http(s) URL: {bad}")
    return total


def pause(request: Request, address: str, *, out: Callable[[str], None] = print) -> dict:
    reply = request(address, "POST", "/pause", body={})
    out(f"paused (settings v{reply['settings']['version']}, told {reply['peers_told']} peers): "
        "no new fetches start anywhere; fetches under way finish")
    return reply


def resume(request: Request, address: str, *, out: Callable[[str], None] = print) -> dict:
    reply = request(address, "POST", "/resume", body={})
    out(f"resumed (settings v{reply['settings']['version']}, told {reply['peers_told']} peers)")
    return reply


def add_scope_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--include", action="append", metavar="REGEX",
                   help="a URL must match one of these (repeatable; replaces the list)")
    p.add_argument("--exclude", action="append", metavar="REGEX",
                   help="a URL matching one of these is not crawled (repeatable; replaces the list)")
    p.add_argument("--allow-host", dest="allow_host", action="append", metavar="SUFFIX",
                   help="crawl only these hosts and their subdomains (repeatable; replaces the list)")
    p.add_argument("--deny-host", dest="deny_host", action="append", metavar="SUFFIX",
                   help="never crawl these hosts and their subdomains (repeatable; replaces the list)")
    p.add_argument("--clear", action="append", choices=sorted(_LIST_FLAGS.values()), default=[],
                   help="empty one list (repeatable)")
    for name in _INT_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=int, metavar="N", help="-1: no limit")
    p.add_argument("--json", action="store_true", help="print the raw JSON")


def scope_changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {name: [] for name in args.clear}
    for flag, name in _LIST_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            if name in changes:
                raise CliError(f"--clear {name} and a new {name} list: give one of them")
            changes[name] = value
    for name in _INT_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    return changes


def scope(request: Request, address: str, changes: dict[str, Any], *, as_json: bool = False,
          out: Callable[[str], None] = print) -> dict:
    """Change the scope (POST /scope) or, with no change given, show the settings in force (GET /settings)."""
    reply = request(address, "POST", "/scope", body=changes) if changes else request(address, "GET", "/settings")
    out(json.dumps(reply, indent=1, sort_keys=True) if as_json else format_settings(reply["settings"]))
    return reply
