"""Text a person reads: one node's status."""

from __future__ import annotations

from typing import Any

__all__ = ["format_settings", "format_status"]


def format_settings(settings: dict[str, Any]) -> str:
    """The crawl settings in force, one per line; -1 reads as "no limit"."""
    lines = [f"crawl settings v{settings['version']} (changed by {settings['origin'] or 'the configuration'})"
             f"{'  PAUSED' if settings['paused'] else ''}"]
    for name in sorted(settings):
        if name in ("version", "origin", "paused"):
            continue
        value = settings[name]
        if isinstance(value, list):
            text = " ".join(value) if value else "-"
        else:
            text = "no limit" if value == -1 else str(value)
        lines.append(f"  {name:<20} {text}")
    return "\n".join(lines)


def format_status(st: dict[str, Any]) -> str:
    q = st["queue"]
    lines = [
        f"node {st['node_id']} (weight {st['weight']})  up {st['uptime']:.0f}s  "
        f"{'DONE' if st['done'] else 'PAUSED' if st.get('settings', {}).get('paused') else 'crawling'}"
        + (f"  settings v{st['settings']['version']}" if "settings" in st else ""),
        f"  pages {st['pages']}  rate {st['rate']:.1f}/s  bytes {st['bytes']}  stored {st['stored']}",
        f"  queue {q['urls']} urls on {q['hosts_waiting']} waiting hosts ({q['hosts_known']} known), "
        f"in flight {q['in_flight']}, workers busy {q['workers_busy']}",
        f"  urls new {st['urls_new']}  already seen {st['urls_seen']}  seen-set {st['seen_urls']}",
        "  status " + (" ".join(f"{k}={v}" for k, v in sorted(st["status"].items())) or "-"),
        "  errors " + (" ".join(f"{k}={v}" for k, v in sorted(st["errors"].items())) or "-"),
        "  skipped " + (" ".join(f"{k}={v}" for k, v in sorted(st["skipped"].items())) or "-"),
    ]
    rv = st.get("revisit", {})
    if rv.get("enabled"):
        done = st.get("revisits", {})
        lines.append(f"  revisits scheduled {rv['scheduled']} (waiting {rv['waiting']}), fetched {done.get('fetched', 0)}: "
                     f"changed {done.get('changed', 0)}, unchanged {done.get('unchanged', 0)} "
                     f"(304 {done.get('not_modified', 0)}), bytes saved {done.get('bytes_saved', 0)}")
        for due in rv["next_due"]:
            lines.append(f"    next in {due['in']:>8.1f}s  {due['url']}")
    pw = st.get("page_workers", {})
    if pw.get("processes"):
        lines.append(f"  page workers {pw['ready']}/{pw['processes']} ready, in flight {pw['in_flight']}, "
                     f"pages {pw['pages']}, crashes {pw['crashes']} (timeouts {pw['timeouts']}), "
                     f"resent {pw['resent']}, failed {pw['failed']}")
    up = st.get("upload", {})
    if up.get("target"):
        state = "ok" if up["ok"] else f"FAILING for {up['failing_for']:.0f}s ({up['error_kind']}): {up['error']}"
        lines.append(f"  upload {up['target']}  {state}")
        lines.append(f"    waiting {up['queued_files']} files ({up['queued_bytes']} bytes), oldest {up['lag']:.0f}s; "
                     f"uploaded {up['uploaded_files']} files ({up['uploaded_bytes']} bytes)"
                     + ("; FETCHING PAUSED: the waiting files fill upload_max_local_bytes" if up["fetching_paused"] else ""))
    disk = st.get("disk", {})
    if disk.get("low"):
        lines.append(f"  DISK LOW: {disk['free_bytes']} bytes free (under {disk['low_bytes']}); fetching and "
                     f"admitting paused until {disk['resume_bytes']} are free")
    hook = st.get("webhook", {})
    if hook.get("url"):
        state = "ok" if hook["ok"] else f"FAILING for {hook['failing_for']:.0f}s: {hook['error']}"
        lines.append(f"  webhook {hook['url']}  {state}; waiting {hook['waiting']}, sent {hook['sent']}")
    cl = st.get("crawl_log", {})
    for reader, r in sorted(cl.get("readers", {}).items()):
        state = "ok" if r["ok"] else f"FAILING for {r['failing_for']:.0f}s: {r['error']}"
        lines.append(f"  crawl log ({reader}) {r['target']}  {state}; waiting {r['waiting']}, oldest {r['lag']:.0f}s, "
                     f"handed on {r['handed_on']}")
    if cl.get("dropped"):
        lines.append(f"  crawl log DROPPED {cl['dropped']} records: the spool ({cl['spool_limit']} records) was full")
    if "dns" in st:
        dns = st["dns"]
        failures = " ".join(f"{k}={v}" for k, v in sorted(dns.get("failures", {}).items())) or "-"
        lines.append(f"  dns hits={dns['hits']} misses={dns['misses']} queries={dns['queries']} "
                     f"failures {failures}")
    return "\n".join(lines)


def format_captures(captures: list[dict[str, Any]]) -> str:
    """`peerctl lookup`: one capture a line, oldest first per URL: time, status, digest, URL, where its record is."""
    if not captures:
        return "no captures"
    lines = []
    for c in captures:
        ts = c["timestamp"]
        when = f"{ts[0:4]}-{ts[4:6]}-{ts[6:8]} {ts[8:10]}:{ts[10:12]}:{ts[12:14]}"
        where = (f"object {c['object']} @{c['offset']}" if c.get("object")
                 else f"{c['node']}:{c['filename']} @{c['offset']}")
        lines.append(f"{when}  {c.get('status', '-'):>3}  {c.get('digest', '-')}  {c['url']}  {where}")
    return "\n".join(lines)
