"""`peerctl` commands for a live cluster: status --cluster, ring (live), join, leave.

Each talks to one node's control endpoint; the node answers for the cluster from its view and the progress
reports its peers send while someone looks (docs/cluster.md, "Termination and control").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from peer.cli.errors import CliError

__all__ = ["format_cluster", "format_ring", "join", "leave"]

Request = Callable[..., Any]


def _num(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def format_cluster(cs: dict[str, Any]) -> str:
    """The cluster as one node sees it: one line per member."""
    nodes = cs["nodes"]
    head = f"cluster seen from {cs['node_id']}: epoch {cs['epoch']}, {len(nodes)} members, " + (
        "crawl FINISHED" if cs["done"] else "crawling")
    rows: list[tuple[str, ...]] = [
        ("node", "state", "zone", "weight", "pages", "rate/s", "queue", "received", "idle", "link")]
    for n in nodes:
        rows.append((
            n["node_id"], n["state"], n.get("zone") or "-", str(n["weight"]), _num(n["pages"]), _num(n["rate"], ".1f"),
            _num(n["queue"]), _num(n["urls_received"]),
            "-" if n["idle"] is None else ("yes" if n["idle"] else "no"),
            "up" if n["connected"] else "down",
        ))
    return head + "\n" + _table(rows)


def format_ring(cs: dict[str, Any]) -> str:
    """The live ring: each member's weight share beside its key-space share, and the URLs it received."""
    rows: list[tuple[str, ...]] = [("node", "state", "weight", "weight share", "key share", "error", "urls received")]
    for n in cs["nodes"]:
        ws, ks = n["weight_share"], n["key_share"]
        err = f"{(ks - ws) / ws * 100:+.2f}%" if ws else "-"
        rows.append((n["node_id"], n["state"], str(n["weight"]), f"{ws * 100:.2f}%", f"{ks * 100:.2f}%", err,
                     _num(n["urls_received"])))
    return f"ring at view epoch {cs['epoch']} (seen from {cs['node_id']})\n" + _table(rows)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines)


def join(request: Request, address: str, seed: str) -> str:
    answer = request(address, "POST", "/join", body={"seed": seed}, timeout=60.0)
    return f"joined through {answer['joined']}: {answer['members']} members, view epoch {answer['epoch']}"


def leave(request: Request, address: str, *, wait: bool, timeout: float, out: Callable[[str], None]) -> int:
    """Ask the node to leave; with `wait`, follow its hand-off until its control endpoint goes away."""
    request(address, "POST", "/leave")
    out("leave requested: the node hands its arcs to their new owners, then exits")
    if not wait:
        return 0
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            st = request(address, "GET", "/status", timeout=5.0)
        except CliError:
            out("node has left and exited")
            return 0
        c = st.get("cluster", {})
        line = (f"  hand-off: {c.get('handoff', {}).get('outstanding', '?')} chunks unacknowledged, "
                f"outbox {c.get('dispatch', {}).get('outstanding', '?')} URLs, "
                f"queue {st.get('queue', {}).get('urls', '?')} URLs")
        if line != last:
            out(line)
            last = line
        time.sleep(0.5)
    raise CliError(f"node at {address} was still leaving after {timeout:.0f} s")


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)
