"""The render pool with a real headless chromium on loopback (peer/render): a page's script builds its DOM, the
browser is restarted after N pages and after it is killed, and no chromium process outlives a node killed at
a random moment (its process group is checked through /proc)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from peer.render import (BrowserRequest, PoolLimits, RenderPool, Served, clear_workdir, find_chromium, open_browser,
                         pids_of_group)
from peer.render.browser import SCRATCH_NOTE, BrowserError
from peer.render.tabs import open_tab
from tests.support.crawl import child_env, kill_pid

pytestmark = pytest.mark.slow

try:
    find_chromium()
except BrowserError as exc:  # pragma: no cover - the suite's machine has Debian's chromium
    pytest.skip(str(exc), allow_module_level=True)

PAGE = (b"<html><body><div id=app></div><script src='/app.js'></script><img src='/i.png'>"
        b"<script>window.open('/popup.html')</script></body></html>")
SCRIPT = b"document.getElementById('app').innerHTML = '<a href=\"/made.html\">made by a script</a>';"


async def serve(request: BrowserRequest) -> Served | str:
    path = request.url.split("?", 1)[0]
    if path.endswith("/app.js"):
        return Served(status=200, headers=[("content-type", "application/javascript")], body=SCRIPT)
    if path.endswith("/page.html"):
        return Served(status=200, headers=[("content-type", "text/html")], body=PAGE)
    return "not-here"


def wait_gone(pgid: int, seconds: float = 10.0) -> list[int]:
    """The group's live processes once they are gone or `seconds` passed (what is left, if any)."""
    end = time.monotonic() + seconds
    while True:
        left = pids_of_group(pgid)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)


async def test_a_script_built_page_renders_through_the_node() -> None:
    async with open_browser() as browser:
        pgid = browser.pgid
        assert pgid is not None and pids_of_group(pgid)
        pool_limits = PoolLimits(tabs=1, time_limit=10)
        from peer.render.tabs import render_in_tab
        rendered = await render_in_tab(browser.cdp, "http://site.test/page.html", serve,
                                       time_limit=pool_limits.time_limit, max_requests=10)
        assert '<a href="/made.html">made by a script</a>' in rendered.html
        assert rendered.served == 2  # the page and its script; the image is refused by type
        assert rendered.refused.get("type") == 2  # the image and the tab's icon
    assert wait_gone(pgid) == []


#: A page that writes what it finds of an earlier page (a cookie, local storage), then leaves both for a later one.
REMEMBERING = b"""<html><body><div id=app></div><script>
var found = 'cookie=[' + document.cookie + '] stored=[' + localStorage.getItem('k') + ']';
document.cookie = 'left=1'; localStorage.setItem('k', 'left');
document.getElementById('app').textContent = found;
</script></body></html>"""


async def remembering(request: BrowserRequest) -> Served | str:
    if request.url.split("?", 1)[0].endswith("/remember.html"):
        return Served(status=200, headers=[("content-type", "text/html")], body=REMEMBERING)
    return "not-here"


async def test_a_kept_tab_carries_no_cookie_or_storage_from_one_page_to_the_next() -> None:
    pool = RenderPool(PoolLimits(tabs=1, time_limit=10))
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.serve_pool)
        for i in range(3):
            rendered = await pool.render(f"http://site.test/remember.html?{i}", remembering)
            assert "cookie=[] stored=[null]" in rendered.html, rendered.html
        assert pool.tabs_open == 1 and pool.renders == 3  # one tab, kept from render to render
        # the same tab without its clearing keeps both: the check above can see them
        assert pool._browser is not None
        tab = await open_tab(pool._browser.cdp)
        try:
            await tab.render("http://site.test/remember.html?a", remembering, time_limit=10, max_requests=5)
            rendered = await tab.render("http://site.test/remember.html?b", remembering, time_limit=10,
                                        max_requests=5)
            assert "cookie=[left=1] stored=[left]" in rendered.html, rendered.html
        finally:
            await tab.close()
        nursery.cancel_scope.cancel()


def scratch_of(profile: Path) -> Path:
    """The directory a launched browser's profile names for chromium's own temporary files."""
    return Path((profile / SCRATCH_NOTE).read_text())


def chromium_temp_dirs(profile: Path) -> list[Path]:
    """The temporary directories chromium made for itself (its singleton socket's) where `profile` told it."""
    return list(scratch_of(profile).glob("org.chromium.Chromium.*"))


async def test_the_pool_restarts_its_browser_after_n_pages_and_after_it_is_killed(tmp_path: Path) -> None:
    pool = RenderPool(PoolLimits(tabs=2, max_pages=2, time_limit=10), workdir=str(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.serve_pool)
        assert pool.pgid is None  # no browser before the first render
        await pool.render("http://site.test/page.html?first", serve)
        first = pool.pgid
        assert first is not None
        for i in range(2):
            rendered = await pool.render(f"http://site.test/page.html?{i}", serve)
            assert "made by a script" in rendered.html
        assert pool.restarts["max-pages"] == 1 and pool.pgid != first
        assert wait_gone(first) == []
        second = pool.pgid
        assert second is not None
        os.killpg(second, signal.SIGKILL)  # the browser dies under the node
        rendered = await pool.render("http://site.test/page.html?after", serve)
        assert "made by a script" in rendered.html
        # seen as died, or as unresponsive when the render's request fails before the pool sees the socket closed
        assert pool.restarts["died"] + pool.restarts["unresponsive"] == 1, (pool.restarts, pool.failures)
        assert pool.pgid not in (first, second)
        assert pool.peak_rss > 0
        # one profile, the running browser's; chromium's own temporary files are inside it
        profiles = list(tmp_path.iterdir())
        assert len(profiles) == 1 and profiles[0].name.startswith("peercrawl-browser-"), profiles
        assert chromium_temp_dirs(profiles[0]), list(profiles[0].iterdir())
        scratch = scratch_of(profiles[0])
        last = pool.pgid
        nursery.cancel_scope.cancel()
    assert last is not None and wait_gone(last) == []
    assert list(tmp_path.iterdir()) == [] and not scratch.exists()  # three browsers killed: nothing left behind


async def test_a_browser_that_dies_while_its_restart_waits_for_its_renders_is_counted_as_a_death() -> None:
    """The pool asked for a max-pages restart while a render ran (the render was its last page), then the browser
    was killed under that render: the restart is a death, and the render is tried again on the next browser."""
    pool = RenderPool(PoolLimits(tabs=1, max_pages=2, time_limit=10))
    killed: list[int] = []

    async def kill_while_held(request: BrowserRequest) -> Served | str:
        if request.url.split("?", 1)[0].endswith("/app.js") and not killed:
            with trio.fail_after(5):
                while not pool._restart.is_set():  # the pool's check saw its last page under way
                    await trio.sleep(0.01)
                assert pool.pgid is not None and pool._browser is not None
                killed.append(pool.pgid)
                os.killpg(pool.pgid, signal.SIGKILL)
                while not pool._browser.cdp.closed:
                    await trio.sleep(0.01)
        return await serve(request)

    async with trio.open_nursery() as nursery:
        await nursery.start(pool.serve_pool)
        await pool.render("http://site.test/page.html?first", serve)
        rendered = await pool.render("http://site.test/page.html?held", kill_while_held)
        assert "made by a script" in rendered.html
        assert killed and pool.pgid not in killed
        assert dict(pool.restarts) == {"died": 1}, (pool.restarts, pool.failures)
        assert pool.failures["died"] == 1
        last = pool.pgid
        nursery.cancel_scope.cancel()
    assert wait_gone(killed[0]) == []
    assert last is not None and wait_gone(last) == []


async def test_a_browser_whose_connection_breaks_under_it_is_a_death_and_replaced_at_once() -> None:
    """The browser is killed and its connection's reader fails before the pool sees the connection closed (the
    error leaves the browser's block): a death, not a start that failed, and the next browser comes without the
    retry pause."""
    from contextlib import asynccontextmanager

    killed = trio.Event()
    opened: list[int] = []

    @asynccontextmanager
    async def breaking():
        async with open_browser() as browser:
            opened.append(1)
            async with trio.open_nursery() as nursery:
                async def reader_fails() -> None:
                    await killed.wait()
                    raise BrowserError("cannot reach the browser: the connection was reset")

                if len(opened) == 1:  # the first browser only
                    nursery.start_soon(reader_fails)
                yield browser
                nursery.cancel_scope.cancel()

    pool = RenderPool(PoolLimits(tabs=1, max_pages=100, time_limit=10), opener=breaking)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.serve_pool)
        await pool.render("http://site.test/page.html?first", serve)
        first = pool.pgid
        assert first is not None
        os.killpg(first, signal.SIGKILL)
        killed.set()
        rendered = await pool.render("http://site.test/page.html?after", serve)
        assert "made by a script" in rendered.html
        assert pool.restarts == {"died": 1} and pool.counts["browser-restart-died"] == 1, pool.restarts
        assert pool.pgid not in (None, first)
        last = pool.pgid
        nursery.cancel_scope.cancel()
    assert wait_gone(first) == [] and last is not None and wait_gone(last) == []


async def test_a_pool_attaches_to_a_browser_that_already_runs() -> None:
    async with open_browser() as running:  # started by someone else: the pool only connects to it
        pool = RenderPool(PoolLimits(tabs=1, max_pages=1, time_limit=10), ws_url=running.ws_url)
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.serve_pool)
            for i in range(2):  # max_pages does not restart a browser the pool did not start
                rendered = await pool.render(f"http://site.test/page.html?{i}", serve)
                assert "made by a script" in rendered.html
            assert pool.attached and pool.pgid is None and not pool.restarts
            nursery.cancel_scope.cancel()
        assert running.pgid is not None and pids_of_group(running.pgid), "the browser it attached to runs on"
        answer = await running.cdp.send("Target.getTargets")
        assert all(t["url"] == "about:blank" for t in answer["targetInfos"] if t["type"] == "page")


@pytest.mark.parametrize("seed", [1, 3])
def test_no_chromium_outlives_a_node_killed_at_a_random_moment(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    child = subprocess.Popen([sys.executable, "-m", "tests.support.render_child", str(tmp_path)],
                             stdout=subprocess.PIPE, env=child_env(), text=True)
    try:
        assert child.stdout is not None
        pgid = int(child.stdout.readline())
        assert pids_of_group(pgid)
        for _ in range(rng.randint(0, 8)):  # some renders, a browser restart among them (max_pages 5)
            child.stdout.readline()
        if seed == 3:  # the browser first, then the node while its pool restarts the browser
            os.killpg(pgid, signal.SIGKILL)
            time.sleep(rng.uniform(0, 0.5))
        pgids = {pgid}
        kill_pid(child.pid)
        child.wait(timeout=10)
    finally:
        kill_pid(child.pid)
        child.wait()
    out = child.stdout.read() if child.stdout else ""
    pgids |= {int(line.split()[1]) for line in out.splitlines() if line.startswith("rendered ")
              and line.split()[1].isdigit()}
    for group in pgids:
        assert wait_gone(group) == [], f"chromium processes of group {group} outlived the node"
    # a killed node leaves its browser's profile (of a browser still starting, maybe without chromium's own files
    # yet) and the temporary directory it names; its next start removes both
    left = list(tmp_path.iterdir())
    assert left and all(p.name.startswith("peercrawl-browser-") for p in left), left
    scratches = [scratch_of(p) for p in left if (p / SCRATCH_NOTE).exists()]
    assert scratches, "no profile named its temporary directory"
    assert clear_workdir(tmp_path) == len(left)
    assert list(tmp_path.iterdir()) == [] and not any(s.exists() for s in scratches)
