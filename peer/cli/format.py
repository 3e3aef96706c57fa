"""Text a person reads: one node's status."""

from __future__ import annotations

from typing import Any

__all__ = ["format_status"]


def format_status(st: dict[str, Any]) -> str:
    q = st["queue"]
    lines = [
        f"node {st['node_id']} (weight {st['weight']})  up {st['uptime']:.0f}s  "
        f"{'DONE' if st['done'] else 'crawling'}",
        f"  pages {st['pages']}  rate {st['rate']:.1f}/s  bytes {st['bytes']}  stored {st['stored']}",
        f"  queue {q['urls']} urls on {q['hosts_waiting']} waiting hosts ({q['hosts_known']} known), "
        f"in flight {q['in_flight']}, workers busy {q['workers_busy']}",
        f"  urls new {st['urls_new']}  already seen {st['urls_seen']}  seen-set {st['seen_urls']}",
        "  status " + (" ".join(f"{k}={v}" for k, v in sorted(st["status"].items())) or "-"),
        "  errors " + (" ".join(f"{k}={v}" for k, v in sorted(st["errors"].items())) or "-"),
        "  skipped " + (" ".join(f"{k}={v}" for k, v in sorted(st["skipped"].items())) or "-"),
    ]
    if "dns" in st:
        dns = st["dns"]
        failures = " ".join(f"{k}={v}" for k, v in sorted(dns.get("failures", {}).items())) or "-"
        lines.append(f"  dns hits={dns['hits']} misses={dns['misses']} queries={dns['queries']} "
                     f"failures {failures}")
    return "\n".join(lines)
