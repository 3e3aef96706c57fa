"""A node against a hostile web (tests/support/hostile.py): it survives every page, stays within a memory bound,
marks cut bodies, contains an unexpected exception to one URL, and never crash-loops on a URL that kills it.

The node is a real `peerd` process where memory or kill -9 matter (its peak RSS comes from `wait4`), and an
in-process `Node` where the test must reach inside.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from peer.config import load
from peer.node import Node
from tests.support.crawl import child_env, kill_pid
from tests.support.hostile import HANG_PATH, serve_hostile

#: The stated bound: a node crawling the hostile web never uses more than this (peak RSS). The pages include
#: bombs of 256 MiB in every coding, a 24 MiB body and a quarter of a million links; the body limit is 10 MiB.
RSS_BOUND_MIB = 400


def peerd(data_dir: Path, seeds: list[str], *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "peer", "start", "--node-id", "hostile-test", "--data-dir", str(data_dir),
            "--control", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--allow-private", "--delay", "0.02",
            "--log-format", "json", *extra]
    for seed in seeds:
        argv += ["--seed", seed]
    return argv


def env(**more: str) -> dict[str, str]:
    return {**child_env(), "PEERCRAWL_MAX_BACKOFF": "0.3", "PEERCRAWL_MAX_RETRIES": "2", **more}


def log_records(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def responses(warc_dir: Path) -> dict[str, tuple[str | None, int]]:
    """URL -> (WARC-Truncated, stored body length) of every response record."""
    out = {}
    for path in sorted(warc_dir.glob("*.warc.gz")):
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type == "response":
                    out[record.rec_headers.get_header("WARC-Target-URI")] = (
                        record.rec_headers.get_header("WARC-Truncated"), len(record.content_stream().read()))
    return out


@pytest.mark.slow
async def test_a_node_crawls_the_hostile_web_within_its_memory_bound(tmp_path: Path) -> None:
    data = tmp_path / "node"
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_hostile)
        log = tmp_path / "node.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(peerd(data, [web.url("/")], "--exit-when-done"), env=env(),
                                    stdout=subprocess.DEVNULL, stderr=err)
        try:
            with trio.fail_after(180):
                _, status, usage = await trio.to_thread.run_sync(os.wait4, proc.pid, 0)
        finally:
            kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
    records = log_records(log)
    assert os.waitstatus_to_exitcode(status) == 0, "\n".join(map(str, records[-10:]))
    stopped = [r for r in records if r.get("msg") == "node stopped"]
    assert stopped, "the node did not stop cleanly"
    # The node's own peak (VmHWM): the rusage of a child started by vfork and exec also counts the memory of
    # this test process (pytest's, grown by the suite) at the moment of the spawn.
    peak_mib = stopped[-1]["peak_rss"] / 2**20
    print(f"hostile web: peak RSS {peak_mib:.0f} MiB (bound {RSS_BOUND_MIB} MiB; rusage said "
          f"{usage.ru_maxrss / 1024:.0f})")
    assert 0 < peak_mib < RSS_BOUND_MIB
    errors = stopped[-1].get("errors", {})
    assert errors.get("internal", 0) == 0, errors  # every page is handled, none needs the safety net
    assert errors.get("protocol", 0) >= 2, errors  # three stacked codings, an unknown coding
    every = {web.url(path) for path in ("/", "/gzip2.html", "/gzip-br.html", "/br.html", "/deflate.html",
                                        "/big.html", "/links.html", "/bad-charset.html")}
    requested = {web.url(path) for path in web.log}
    assert every <= requested
    assert not any("/trap/" in path for path in web.log)  # robots.txt kept the link trap out
    # The retried pages were asked again (Retry-After that int() cannot read is ignored, not fatal).
    assert web.log.count("/retry-arabic.html") >= 2 and web.log.count("/retry-superscript.html") >= 2
    stored = responses(data / "warc")
    for path in ("/gzip2.html", "/gzip-br.html", "/br.html", "/deflate.html", "/big.html"):
        truncated, length = stored[web.url(path)]
        assert truncated == "length" and length == 10 * 2**20, (path, truncated, length)
    assert stored[web.url("/links.html")][0] is None  # whole: under the limit
    index = "".join(p.read_text() for p in (data / "warc").glob("*.cdxj"))
    assert index.count('"truncated": "length"') == 5


@pytest.mark.slow
async def test_an_unexpected_exception_in_a_host_turn_costs_that_url_only(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Any defect a page might reach is contained to its URL: the parser is made to fail on one page (a stand-in
    for a bug nobody knows yet); the node logs it with the URL, counts it, finishes the URL, backs the host off
    and crawls on."""
    import peer.crawl.hostturns as turns_module  # the host turn parses a page inline

    real_extract = turns_module.extract

    def extract(body: bytes, url: str, ctype: str | None):
        if url.endswith("/bad-charset.html"):
            raise RuntimeError("a parser defect reached by this page")
        return real_extract(body, url, ctype)

    monkeypatch.setattr(turns_module, "extract", extract)
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_hostile)
        cfg = load(env={}, flags={
            "node_id": "contain", "data_dir": str(tmp_path / "node"), "control": "127.0.0.1:0",
            "listen": "127.0.0.1:0", "seeds": [web.url("/")], "allow_private": True, "delay": 0.02,
            "exit_when_done": True, "max_backoff": 0.3, "max_retries": 1,
        })
        node = Node(cfg)
        with trio.fail_after(120):
            await node.run()
        nursery.cancel_scope.cancel()
    status = node.final_status
    assert status["done"] is True and status["queue"]["in_flight"] == 0 and status["queue"]["urls"] == 0
    assert status["errors"]["internal"] == 1
    assert web.log.count("/bad-charset.html") == 1  # finished, not retried
    assert web.url("/garbage-headers.html") in {web.url(p) for p in web.log}  # the crawl went on


@pytest.mark.slow
async def test_a_url_in_flight_at_three_kills_in_a_row_is_dropped_and_recorded(tmp_path: Path) -> None:
    """Without the rule a URL that kills the node comes back as in flight at every start: a crash loop."""
    data = tmp_path / "node"
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_hostile)
        seed = web.url(HANG_PATH)
        for attempt in range(3):
            before = web.log.count(HANG_PATH)
            proc = subprocess.Popen(peerd(data, [seed]), env=env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            try:
                with trio.fail_after(60):
                    while web.log.count(HANG_PATH) == before:
                        assert proc.poll() is None, "peerd exited early"
                        await trio.sleep(0.05)
            finally:
                proc.send_signal(signal.SIGKILL)
                await trio.to_thread.run_sync(proc.wait)
        # Fourth start: the URL was in flight at three stops in a row: dropped, recorded; the crawl is done.
        log = tmp_path / "last.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen(peerd(data, [seed], "--exit-when-done"), env=env(),
                                    stdout=subprocess.DEVNULL, stderr=err)
        started = time.monotonic()
        try:
            with trio.fail_after(60):
                code = await trio.to_thread.run_sync(proc.wait)
        finally:
            kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
    assert code == 0, log.read_text()[-2000:]
    assert web.log.count(HANG_PATH) == 3  # not asked a fourth time
    dropped = [json.loads(line) for line in (data / "dropped-urls.jsonl").read_text().splitlines()]
    assert [d["url"] for d in dropped] == [seed] and "3 stops in a row" in dropped[0]["reason"]
    records = log_records(log)
    assert any(r.get("url") == seed and "dropped" in r.get("msg", "") for r in records)
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("120", 120.0), (" 7 ", 7.0), ("\u0661\u0662", None), ("\u00b2", None), ("\u0967", None), ("9" * 400, 999999999999.0),
     ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), ("soon", None), ("", None)],
)
def test_retry_after_reads_only_ascii_seconds_or_a_date(value: str, seconds: float | None) -> None:
    """str.isdigit() is true of '١٢' and '²'; int() fails on '²' and reads '١٢' as 12: neither is HTTP."""
    from peer.crawl.responses import retry_after
    from peer.fetch.http import Response

    resp = Response(url="http://h/", status=503, reason="", headers=[("retry-after", value)], body=b"", ip="",
                    truncated=False, elapsed=0.0, request_headers=[])
    assert retry_after(resp, now=2_000_000_000.0) == seconds


@pytest.mark.slow  # a whole crawl, a child process or real nodes: seconds
async def test_a_page_of_a_quarter_million_links_is_parsed_off_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import peer.crawl.hostturns as turns_module  # the host turn parses a page inline

    real_extract = turns_module.extract
    threads: dict[str, bool] = {}

    def extract(body: bytes, url: str, ctype: str | None):
        threads[url.rsplit("/", 1)[1]] = threading.current_thread() is threading.main_thread()
        return real_extract(body, url, ctype)

    monkeypatch.setattr(turns_module, "extract", extract)
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_hostile)
        cfg = load(env={}, flags={
            "node_id": "links", "data_dir": str(tmp_path / "node"), "control": "127.0.0.1:0",
            "listen": "127.0.0.1:0", "seeds": [web.url("/links.html"), web.url("/bad-charset.html")],
            "allow_private": True, "delay": 0.02, "exit_when_done": True,
        })
        node = Node(cfg)
        with trio.fail_after(120):
            await node.run()
        nursery.cancel_scope.cancel()
    # The 8 MB page went to a worker thread; a small one stayed on the event loop (parse_in_thread is off).
    assert threads == {"links.html": False, "bad-charset.html": True}


#: The stated bound for a node crawling the hostile HTTP/2 server (floods of SETTINGS and PING, a 1 MiB header
#: block, CONTINUATION frames without end, reset and refused streams, GOAWAY).
H2_RSS_BOUND_MIB = 200


@pytest.mark.slow
async def test_a_node_crawls_a_hostile_http2_server_within_its_memory_bound(tmp_path: Path) -> None:
    import functools

    from tests.support.h2web import HOSTILE_PATHS, OK_PAGE, serve_h2web
    from tests.support.testca import make_ca

    ca = make_ca(tmp_path / "ca", ["127.0.0.1"])
    toml = tmp_path / "node.toml"
    toml.write_text(f'[hosts."*"]\ntls_ca_file = "{ca.ca_file}"\n')
    data = tmp_path / "node"
    async with trio.open_nursery() as nursery:
        web = await nursery.start(functools.partial(serve_h2web, ca.server_context(), h2_only=True))
        root = f"https://127.0.0.1:{web.port}"
        log = tmp_path / "node.log"
        with open(log, "wb") as err:
            proc = subprocess.Popen([*peerd(data, [root + "/"], "--exit-when-done"), "--config", str(toml)],
                                    env=env(), stdout=subprocess.DEVNULL, stderr=err)
        try:
            with trio.fail_after(180):
                _, status, _ = await trio.to_thread.run_sync(os.wait4, proc.pid, 0)
        finally:
            kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
    records = log_records(log)
    assert os.waitstatus_to_exitcode(status) == 0, "\n".join(map(str, records[-10:]))
    stopped = [r for r in records if r.get("msg") == "node stopped"]
    assert stopped, "the node did not stop cleanly"
    peak_mib = stopped[-1]["peak_rss"] / 2**20
    print(f"hostile HTTP/2 server: peak RSS {peak_mib:.0f} MiB (bound {H2_RSS_BOUND_MIB} MiB)")
    assert 0 < peak_mib < H2_RSS_BOUND_MIB
    errors = stopped[-1].get("errors", {})
    assert errors.get("internal", 0) == 0, errors
    assert errors.get("protocol", 0) >= 5 and errors.get("too-large", 0) >= 2, errors
    assert {path for _, path, _ in web.log} >= {*HOSTILE_PATHS, "/", "/ok"}
    assert all(alpn == "h2" for _, _, alpn in web.log)
    stored = responses(data / "warc")
    assert stored[root + "/ok"] == (None, len(OK_PAGE))
