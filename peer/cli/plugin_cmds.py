"""`peerctl plugins` (what runs where), `peerctl plugins reload` (a new chain on every node, between pages, or
on none) and `peerctl items` (the items the nodes exported), for the whole cluster through one node.

The node asked is named by ``--data-dir`` (its control address and token are read there) or ``--control``
(with ``--token-file`` or ``PEERCRAWL_CONTROL_TOKEN``); it passes the request to every live member over the
peer links and merges their answers by node. When several nodes are named, the first that answers is asked. A
member that does not answer is named on stderr, and the command exits 3.
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
                   help="the data dir of the node to ask (repeated: the first that answers)")
    p.add_argument("--control", dest="controls", metavar="HOST:PORT", action="append", default=[],
                   help="the control address of the node to ask (repeated: the first that answers)")
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


#: The exit status when some member did not answer (what the others said is printed).
PARTIAL = 3


def _first(request: Request, addresses: list[str], method: str, path: str, body: Any = None) -> Any:
    """The answer of the first node named that can be reached (the node asked for the cluster)."""
    problems = []
    for address in addresses:
        try:
            return request(address, method, path, timeout=60.0, body=body)
        except CliError as exc:
            if "cannot reach" not in str(exc):
                raise
            problems.append(str(exc))
    raise CliError("; ".join(problems))


def _missing(missing: dict[str, str], err: Callable[[str], None]) -> int:
    for node, why in sorted(missing.items()):
        err(f"{node}: did not answer: {why}")
    return PARTIAL if missing else 0


def plugins(request: Request, addresses: list[str], out: Callable[[str], None], err: Callable[[str], None], *,
            as_json: bool = False) -> int:
    """Each member's chain: fingerprint, then one line per plug-in with its counts and state; the exit status."""
    got = _first(request, addresses, "GET", "/cluster/plugins")
    answers = got["nodes"]
    if as_json:
        out(json.dumps(got, indent=1, sort_keys=True))
        return _missing(got["missing"], err)
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
        for node, why in sorted(a.get("refused_nodes", {}).items()):
            lines.append(f"  refused {node}: {why}")
    out("\n".join(lines))
    return _missing(got["missing"], err)


def reload(request: Request, addresses: list[str], config: str, out: Callable[[str], None]) -> int:
    """Load the [[plugins]] of `config` on every member (each swaps its chain between two pages), or on none:
    CliError naming the member and the plug-in that failed."""
    try:
        entries = load(toml=config, env={}).plugins
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    answer = _first(request, addresses, "POST", "/cluster/plugins/reload",
                    body={"plugins": [list(e) for e in entries]})
    out("\n".join(f"{a['node_id']}: chain {a.get('fingerprint') or '(none)'} generation {a.get('generation')}"
                   for a in answer["nodes"]))
    return 0


def items(request: Request, addresses: list[str], out: Callable[[str], None], err: Callable[[str], None], *,
          limit: int | None = None) -> int:
    """Every member's exported items as JSON lines, each with its node (``_node``); the exit status."""
    count = 0
    offsets: dict[str, int] = {}
    missing: dict[str, str] = {}
    nodes: list[str] | None = None  # None: every live member (the first round names them)
    while nodes is None or nodes:
        got = _first(request, addresses, "POST", "/cluster/items",
                     body={"offsets": offsets, "nodes": nodes, "limit": _PAGE})
        missing.update(got["missing"])
        going = []
        for node in sorted(got["pages"]):
            page = got["pages"][node]
            for item in page["items"]:
                if limit is not None and count >= limit:
                    return _missing(missing, err)
                out(json.dumps({"_node": page["node_id"], **item}, ensure_ascii=False, sort_keys=True))
                count += 1
            offsets[node] = page["offset"] + len(page["items"])
            if page["more"] and page["items"]:
                going.append(node)
        nodes = going
    return _missing(missing, err)
