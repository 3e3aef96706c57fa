"""`peerctl plugins` (what runs where), `peerctl plugins reload` (a new chain on every node, between pages) and
`peerctl items` (the items the nodes exported), each over the control API of every node named.

The nodes are named by ``--data-dir`` (repeatable: the control address and token are read there) or
``--control`` (repeatable, with ``--token-file`` or ``PEERCRAWL_CONTROL_TOKEN``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from peer.cli.client import control_address
from peer.cli.errors import CliError
from peer.config import ConfigError, load

__all__ = ["add_targets", "items", "plugins", "reload", "targets"]

Request = Callable[..., Any]
_PAGE = 1000  # items asked of a node at once


def add_targets(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", dest="data_dirs", metavar="DIR", action="append", default=[],
                   help="a node's data dir (repeat it for every node)")
    p.add_argument("--control", dest="controls", metavar="HOST:PORT", action="append", default=[],
                   help="a node's control address (repeat it for every node)")
    p.add_argument("--token-file", dest="token_file", metavar="FILE", help="the control token, when --control")


def targets(args: argparse.Namespace) -> list[str]:
    """The control addresses of the nodes named (their tokens noted for the requests)."""
    found = [control_address(argparse.Namespace(data_dir=d, control=None, token_file=args.token_file))
             for d in args.data_dirs]
    found += [control_address(argparse.Namespace(data_dir=None, control=c, token_file=args.token_file))
              for c in args.controls]
    if not found:
        found = [control_address(argparse.Namespace(data_dir=None, control=None, token_file=args.token_file))]
    return found


def plugins(request: Request, addresses: list[str], *, as_json: bool = False) -> str:
    """Each node's chain: fingerprint, then one line per plug-in with its counts and state."""
    answers = [request(address, "GET", "/plugins") for address in addresses]
    if as_json:
        return json.dumps(answers, indent=1, sort_keys=True)
    prints = {a.get("fingerprint", "") for a in answers}
    lines = []
    for a in answers:
        lines.append(f"{a['node_id']}: chain {a.get('fingerprint') or '(none)'} generation {a.get('generation')}"
                     f"{'' if len(prints) == 1 else '  <- differs'}")
        for p in a.get("chain", []):
            lines.append(f"  {p['use']} v{p['version']} ({', '.join(p['kinds'])}): pages {p['pages']}, items "
                         f"{p['items']}, errors {p['errors']}, timeouts {p['timeouts']}; {p['state']}")
        if a.get("items"):
            i = a["items"]
            lines.append(f"  items: {i['exported']} exported, {i['spooled']} spooled, {i['failures']} export failures")
    return "\n".join(lines)


def reload(request: Request, addresses: list[str], config: str) -> str:
    """Load the [[plugins]] of `config` on every node (each swaps its chain between two pages)."""
    try:
        entries = load(toml=config, env={}).plugins
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    lines = []
    for address in addresses:
        answer = request(address, "POST", "/plugins/reload", body={"plugins": [list(e) for e in entries]})
        lines.append(f"{answer['node_id']}: chain {answer.get('fingerprint') or '(none)'} generation "
                     f"{answer.get('generation')}")
    return "\n".join(lines)


def items(request: Request, addresses: list[str], out: Callable[[str], None], *, limit: int | None = None) -> int:
    """Every node's exported items as JSON lines, node after node; how many."""
    count = 0
    for address in addresses:
        offset = 0
        while limit is None or count < limit:
            page = request(address, "POST", "/items", body={"offset": offset, "limit": _PAGE})
            got = page["items"]
            for item in got:
                if limit is not None and count >= limit:
                    break
                out(json.dumps({"_node": page["node_id"], **item}, ensure_ascii=False, sort_keys=True))
                count += 1
            offset += len(got)
            if len(got) < _PAGE:
                break
    return count
