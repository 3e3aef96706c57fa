"""pywb replays what an HTTP/2 fetch recorded: the WARC records say `WARC-Protocol: h2` and carry the exchange in
HTTP/1.1 form, which pywb (a reader that knows nothing of HTTP/2) indexes and serves.

pywb is not a dependency of the project (it pins its own versions of shared libraries): the test runs it from
its own virtualenv (`.ci/replay-tools.sh` builds it, cached, and `.ci/run` names it in ``PYWB_WAYBACK``;
tests/support/replaytools.py), or ``wayback`` on the PATH, and is skipped without one."""

from __future__ import annotations

import functools
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
import trio

from peer.crawl.responses import as_decoded
from peer.fetch.http import Fetcher
from storage import open_page_store
from tests.support.h2web import PAGE, serve_h2web
from tests.support.replaytools import replay_tool
from tests.support.testca import make_ca
from tests.test_http2 import UA, LoopbackResolver, policies

pytestmark = pytest.mark.slow

FETCHED_AT = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
STAMP = "20231114221320"


def _wayback() -> Path:
    found = replay_tool("wayback")
    if found is None:
        pytest.skip("pywb is not installed: run .ci/replay-tools.sh (or set PYWB_WAYBACK to its wayback script)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_pywb_replays_http2_records(tmp_path: Path, nursery: trio.Nursery) -> None:
    wayback = _wayback()
    ca = make_ca(tmp_path / "ca", ["h2.test"])
    web = await nursery.start(functools.partial(serve_h2web, ca.server_context(), h2_only=True))
    url = f"https://h2.test:{web.port}/page?enc=gzip"
    async with Fetcher(LoopbackResolver(), user_agent=UA, policies=policies(ca)) as fetcher:
        resp = await fetcher.fetch(url)
    assert resp.protocol == "h2"
    store = open_page_store("warc", tmp_path / "warc")
    store.store(url=resp.url, request_headers=resp.request_headers, status=resp.status, reason=resp.reason,
                response_headers=as_decoded(resp), body=resp.body, ip=resp.ip, fetched_at=FETCHED_AT,
                truncated=resp.truncated, protocol=resp.protocol)
    store.close()
    (warc,) = sorted((tmp_path / "warc").glob("*.warc.gz"))

    root = tmp_path / "pywb"
    root.mkdir()
    manager = wayback.parent / "wb-manager"
    subprocess.run([str(manager), "init", "crawl"], cwd=root, check=True, capture_output=True, timeout=120)
    subprocess.run([str(manager), "add", "crawl", str(warc)], cwd=root, check=True, capture_output=True,
                   timeout=120)
    port = _free_port()
    server = subprocess.Popen([str(wayback), "-p", str(port), "-b", "127.0.0.1"], cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        replay = f"http://127.0.0.1:{port}/crawl/{STAMP}id_/{url}"
        body = b""
        for _ in range(300):  # pywb takes a few seconds to start
            try:
                body = await trio.to_thread.run_sync(lambda: urllib.request.urlopen(replay, timeout=10).read())
                break
            except OSError:
                if server.poll() is not None:
                    raise AssertionError(f"pywb exited: {server.stderr.read().decode()[-2000:]}") from None
                await trio.sleep(0.1)
        assert body == PAGE
    finally:
        server.terminate()
        server.wait(timeout=30)
