"""A node rendering hostile pages (tests/support/hostile.py) with a real headless chromium: a script that never
ends is stopped at the render's time limit, a page's fifty windows never open nor fetch, a script that
allocates without end dies at the script heap's bound or takes the browser past its memory bound; the node
goes on, and its browser is gone when it stops."""

from __future__ import annotations

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
#: How far past its bound the browser may get between two checks (4 a second) of a script allocating flat out.
OVERSHOOT_MIB = 256


async def test_hostile_scripts_are_survived(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with trio.open_nursery() as nursery:
        web = await nursery.start(serve_hostile)
        seeds = [web.url(p) for p in ("/script-endless.html", "/script-popups.html", "/script-memory.html")]
        cfg = load(env={}, flags={
            "node_id": "render-hostile", "data_dir": str(tmp_path / "node"), "control": "127.0.0.1:0",
            "listen": "127.0.0.1:0", "seeds": seeds, "allow_private": True, "delay": 0.05,
            "exit_when_done": True, "render": "always", "render_timeout": 6.0, "browser_max_mib": BOUND_MIB})
        node = Node(cfg)
        with trio.fail_after(120):
            await node.run()
        nursery.cancel_scope.cancel()
    counts = node.stats.render
    pgid = node.crawler.renderer.pgid  # type: ignore[union-attr]
    # the endless script: stopped at the time limit and the page read as it was
    assert counts["timed-out"] + counts["failed-timeout"] >= 1, counts
    # the popups: none opened a window that fetched, and the script's own link was found
    assert not [path for path in web.log if path.startswith("/popup-")]
    assert "/after-popups.html" in web.log
    # the memory hog: its renderer died at the script heap's bound, or the browser was restarted past its own
    assert counts["failed-crashed"] + counts["browser-restart-memory"] >= 1, counts
    assert 0 < counts["browser-peak-bytes"] < (BOUND_MIB + OVERSHOOT_MIB) << 20
    assert node.final_status["done"] is True
    end = time.monotonic() + 10
    while pgid is not None and pids_of_group(pgid) and time.monotonic() < end:
        time.sleep(0.05)
    assert pgid is None or pids_of_group(pgid) == []
