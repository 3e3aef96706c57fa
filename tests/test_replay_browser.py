"""A crawl replayed in a real browser: one node crawls a small local web (with mirrored documents, so some of its
records are revisits of another URL's payload), a pywb collection is made of the node's WARC files and its own
CDXJ indexes (nothing re-indexed), pywb serves it on loopback, and headless chromium opens crawled pages through
pywb's framed replay: a page stored in full and a mirrored page stored as a revisit record, whose text pywb
takes from the original it refers to.

pywb runs from its own virtualenv (tests/support/replaytools.py: `.ci/run` builds it, cached); the test is
skipped where neither pywb nor chromium is installed."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
import trio

from peer.node import Node
from peerlab.localweb.graph import SiteGraph, mirror_path
from storage._cdxj import parse_cdxj_line

from .support.browser import browser, need_browser
from .support.crawl import node_config, start_local_web
from .support.replaytools import replay_tool

pytestmark = pytest.mark.slow  # a crawl, pywb's start and a browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_collection(root: Path, warc_dir: Path, name: str = "crawl") -> list[str]:
    """A pywb collection of a node's WARC files and CDXJ indexes, as pywb lays one out (archive/, indexes/);
    the indexes merged into one sorted file. The index lines."""
    archive = root / "collections" / name / "archive"
    indexes = root / "collections" / name / "indexes"
    archive.mkdir(parents=True)
    indexes.mkdir()
    for warc in sorted(warc_dir.glob("*.warc.gz")):
        shutil.copy(warc, archive / warc.name)
    lines = sorted(line for cdxj in sorted(warc_dir.glob("*.cdxj"))
                   for line in cdxj.read_text(encoding="utf-8").splitlines(keepends=True))
    (indexes / "index.cdxj").write_text("".join(lines), encoding="utf-8")
    return lines


async def _until(predicate, timeout: float, what: str):
    """Poll `predicate` (in a thread: selenium and urllib block) until it returns a true value."""
    last = None
    with trio.move_on_after(timeout):
        while True:
            try:
                last = await trio.to_thread.run_sync(predicate)
            except OSError as exc:  # pywb not listening yet
                last = exc
            if last and not isinstance(last, Exception):
                return last
            await trio.sleep(0.2)
    raise AssertionError(f"{what} not seen within {timeout:g} s (last: {last!r})")


def _replayed_text(driver, url: str) -> str:
    """The text of the page pywb shows in its replay frame at `url` ("" until it is there)."""
    from selenium.common.exceptions import NoSuchElementException, WebDriverException
    from selenium.webdriver.common.by import By

    driver.switch_to.default_content()
    try:
        frame = driver.find_element(By.ID, "replay_iframe")
        driver.switch_to.frame(frame)
        return driver.find_element(By.TAG_NAME, "body").text
    except (NoSuchElementException, WebDriverException):
        return ""


async def test_pywb_replays_crawled_pages_in_chromium(tmp_path: Path) -> None:
    need_browser()
    wayback = replay_tool("wayback")
    if wayback is None:
        pytest.skip("pywb is not installed: run .ci/replay-tools.sh (or set PYWB_WAYBACK to its wayback script)")
    graph = SiteGraph.generate(seed=23, hosts=4, pages_per_host=3, features=False, mirrored=1)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        node = Node(node_config(tmp_path / "node", web, dns))
        with trio.fail_after(60):
            await node.run()
        nursery.cancel_scope.cancel()
    root = tmp_path / "pywb"
    entries = [parse_cdxj_line(line) for line in make_collection(root, tmp_path / "node" / "warc")]
    full = next(e for e in entries if e.mime == "text/html" and e.url.endswith("/p/1.html"))
    mirrored = next(e for e in entries if e.mime == "warc/revisit" and e.url.endswith(mirror_path(0)))
    port = _free_port()
    server = subprocess.Popen([str(wayback), "-p", str(port), "-b", "127.0.0.1"], cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}/crawl"
        await _until(lambda: server.poll() is not None or urllib.request.urlopen(f"{base}/", timeout=5).status == 200,
                     60, "pywb answering")
        assert server.poll() is None, server.stderr.read().decode()[-2000:] if server.stderr else ""
        with browser() as driver:
            for entry, text in ((full, "/p/1.html"), (mirrored, "Mirrored document 0")):
                replay = f"{base}/{entry.timestamp}/{entry.url}"
                await trio.to_thread.run_sync(driver.get, replay)
                shown = await _until(lambda: text in _replayed_text(driver, replay) and _replayed_text(driver, replay),
                                     30, f"{text!r} in the replay of {entry.url}")
                assert text in shown
        # what pywb serves for the revisit is the original's payload, byte for byte
        original = graph.resource(mirrored.url.split("/")[2].split(":")[0], mirror_path(0)).body
        body = await trio.to_thread.run_sync(
            lambda: urllib.request.urlopen(f"{base}/{mirrored.timestamp}id_/{mirrored.url}", timeout=10).read())
        assert body == original
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(json.dumps({"records": len(entries), "revisits": sum(e.mime == "warc/revisit" for e in entries)}))
