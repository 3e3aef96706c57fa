"""The dashboard's figures without a browser: a node's figures over time (NodeWatch), the slowest hosts, and a
node's summary through the StatusReport a peer receives (both codecs)."""

from __future__ import annotations

from peer.cluster.core.report import status_dict, status_report
from peer.crawl.scheduler import HostTurn
from peer.dashboard import FLOW_WINDOW, HISTORY_SECONDS, NodeWatch, page, rss_bytes, slow_hosts
from protocol import Limits, decode_body, encode_body


def test_watch_counts_pages_per_second_flows_over_the_window_and_the_last_page() -> None:
    pages = {"n": 0}
    sent: dict[str, int] = {}
    watch = NodeWatch(lambda: pages["n"], lambda: sent, now=100.0)
    assert watch.idle_for(103.0) == 3.0  # no page yet: counted from the start
    for second in range(1, 31):
        pages["n"] += second % 3  # 1, 2, 0, 1, 2, 0, ...
        sent["B"] = sent.get("B", 0) + 10
        if second > 20:
            sent["C"] = sent.get("C", 0) + 1
        watch.sample(100.0 + second)
    assert watch.history()[:6] == [1, 2, 0, 1, 2, 0] and len(watch.history()) == 30
    assert watch.idle_for(131.0) == 2.0  # the last page came in at second 29 (second 30 added none)
    window, recent = watch.sent_recent(130.0)
    assert window == FLOW_WINDOW
    assert recent == {"B": 100, "C": 10}
    for second in range(31, 31 + HISTORY_SECONDS):
        watch.sample(100.0 + second)
    assert len(watch.history()) == HISTORY_SECONDS and set(watch.history()) == {0}
    assert watch.sent_recent(100.0 + 30 + HISTORY_SECONDS)[1] == {}  # nothing sent lately


def test_slowest_hosts_are_those_with_work_that_wait_longest() -> None:
    turns = {
        "idle.test": HostTurn("idle.test", crawl_delay=60.0),  # no work: not listed
        "slow.test": HostTurn("slow.test", crawl_delay=5.0, waiting=True),
        "backoff.test": HostTurn("backoff.test", backoff=30.0, failures=3, waiting=True),
        "busy.test": HostTurn("busy.test", busy=True),
    }
    queued = {"slow.test": 7, "backoff.test": 2, "busy.test": 1}
    rows = slow_hosts(turns, queued.__getitem__, base_delay=1.0)
    assert [r["host"] for r in rows] == ["backoff.test", "slow.test", "busy.test"]
    assert rows[0] == {"host": "backoff.test", "delay": 1.0, "backoff": 30.0, "failures": 3, "queued": 2}
    assert rows[1]["delay"] == 5.0 and rows[2]["delay"] == 1.0
    assert len(slow_hosts(turns, queued.get, base_delay=1.0, limit=1)) == 1


def test_a_summary_crosses_the_wire_unchanged() -> None:
    summary = {
        "pages": 12, "bytes": 34_567, "queued": 8, "in_flight": 1, "hosts_queued": 3, "hosts_known": 9,
        "rss": 150 << 20, "idle_for": 0.5, "errors": {"connect": 2, "robots-dns": 1},
        "dns": {"hits": 40, "misses": 9}, "robots": {"hits": 30, "misses": 9}, "history": [0, 3, 5, 4],
        "window": 10.0, "sent": {"B": 100, "C": 50}, "sent_recent": {"B": 4},
        "slow_hosts": [{"host": "h.test", "delay": 2.0, "backoff": 0.0, "failures": 0, "queued": 5}],
        "transfers": [{"peer": "C", "incoming": True, "share": 0.125, "chunks": 0},
                      {"peer": "B", "incoming": False, "share": 0.0, "chunks": 3}],
        "outputs": [{"kind": "upload", "target": "s3://crawls/run", "ok": False, "error": "cannot reach it",
                     "failing_for": 12.5, "waiting": 3, "waiting_bytes": 61_000, "lag": 14.0, "done": 9,
                     "failures": 4, "dropped": 0, "paused": True},
                    {"kind": "crawl-log-stream", "target": "redis://r:6379/0?stream=s&maxlen=9", "ok": True,
                     "error": "", "failing_for": 0.0, "waiting": 20, "waiting_bytes": 0, "lag": 0.5, "done": 700,
                     "failures": 0, "dropped": 2, "paused": False}],
        "plugins_off": [{"use": "x:Y", "reason": "switched off: failed on 20 of 20 pages (20 errors, 0 timeouts)"}],
    }
    report = status_report(7, summary)
    for codec in ("msgpack", "json"):
        code, body = encode_body(report, codec, Limits())
        assert status_dict(decode_body(code, body, codec, Limits())) == summary


def test_the_page_is_one_self_contained_file() -> None:
    html = page().decode()
    assert html.startswith("<!doctype html>") and "</html>" in html
    # nothing from outside: no src= or href= to another origin, no external script or style sheet
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "").replace("http://CONTROL", "")
    assert "https://" not in html and "<link" not in html and "src=" not in html
    assert 'fetch(path' in html and '"Authorization": "Bearer "' in html
    assert rss_bytes() > 1 << 20
