"""A node rendering hostile pages (tests/support/hostile.py) with a real headless chromium: a script that never
ends is stopped at the render's time limit, a page's fifty windows never open nor fetch, a script that
allocates without end dies at the script heap's bound or takes the browser past its memory bound; the node
goes on, and its browser is gone when it stops."""

from __future__ import annotations

import re
import time

import pytest
import trio

from peer.config import load
from peer.node import Node
from peer.render import BrowserError, find_chromium, pids_of_group
from tests.support.hostile import serve_hostile

pytestmark = pytest.mark.slow

try:
    find_chromium()
except BrowserError as exc:  # pragma: no cover - the suite's machine has Debian's chromium
    pytest.skip(str(exc), allow_module_level=True)


#: The browser's memory bound in this test: a fresh headless chromium holds about 300 MiB (PSS) here.
BOUND_MIB = 450
#: The script heap's cap (docs/rendering.md): a page allocating flat out can take the browser at most this far
#: past its bound before the next check (4 a second) restarts it or the renderer dies at the cap.
HEAP_MIB = 512


async def test_hostile_scripts_are_survived(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_hostile)
        seeds = [web.url(p) for p in ("/script-endless.html", "/script-popups.html", "/script-memory.html")]
        cfg = load(env={}, flags={
            "node_id": "render-hostile", "data_dir": str(tmp_path / "node"), "control": "127.0.0.1:0",
            "listen": "127.0.0.1:0", "seeds": seeds, "allow_private": True, "delay": 0.05,
            "render": "always", "render_timeout": 6.0, "browser_max_mib": BOUND_MIB})
        node = Node(cfg)
        with trio.fail_after(120):
            async with trio.open_nursery() as running:
                running.start_soon(node.run)
                # done: the three pages and the one a script wrote fetched, nothing left to do
                while node.stats.status["2xx"] < 4 or node.crawler is None or not node.crawler.is_done():
                    await trio.sleep(0.1)
                # the render figures in /metrics, read while the node runs
                metrics = (await node.control.routes()[("GET", "/metrics")](b"")).body.decode()
                node.request_stop()
        nursery.cancel_scope.cancel()
    counts = node.stats.render
    pgid = node.crawler.renderer.pgid  # type: ignore[union-attr]
    # the endless script: stopped at the time limit and the page read as it was, or, on a loaded machine, ended
    # with its browser when the memory bound's restart came first; either way every render ended
    assert counts["timed-out"] + counts["failed-timeout"] + counts["failed-crashed"] >= 1, counts
    ended = counts["rendered"] + counts["timed-out"] + sum(n for k, n in counts.items() if k.startswith("failed-"))
    assert ended >= 3, counts
    # the popups: none opened a window that fetched, and the script's own link was found
    assert not [path for path in web.log if path.startswith("/popup-")]
    assert "/after-popups.html" in web.log
    # the memory hog: its renderer died at the script heap's bound, or the browser was restarted past its own
    assert counts["failed-crashed"] + counts["browser-restart-memory"] >= 1, counts
    assert 0 < counts["browser-peak-bytes"] < (BOUND_MIB + HEAP_MIB) << 20
    assert node.final_status["done"] is True
    pool = node.crawler.renderer
    assert f"peercrawl_renders_total {float(pool.renders)}" in metrics  # type: ignore[union-attr]
    assert f"peercrawl_render_timeouts_total {float(counts['timed-out'])}" in metrics
    for kind, n in pool.failures.items():  # type: ignore[union-attr]
        assert f'peercrawl_render_failures_total{{kind="{kind}"}} {float(n)}' in metrics
    for reason, n in pool.restarts.items():  # type: ignore[union-attr]
        assert f'peercrawl_browser_restarts_total{{reason="{reason}"}} {float(n)}' in metrics
    assert f'peercrawl_render_requests_total{{outcome="served"}} {float(counts["requests-served"])}' in metrics
    assert counts["refused-type"] > 0  # the popups' windows and the tabs' icons
    assert f'peercrawl_render_requests_total{{outcome="refused-type"}} {float(counts["refused-type"])}' in metrics
    peak = re.search(r"^peercrawl_browser_memory_peak_bytes (\S+)$", metrics, re.M)
    assert peak is not None and 0 < float(peak.group(1)) <= counts["browser-peak-bytes"]
    assert "peercrawl_render_tabs_in_use 0.0" in metrics
    end = time.monotonic() + 10
    while pgid is not None and pids_of_group(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    assert pgid is None or pids_of_group(pgid) == []
