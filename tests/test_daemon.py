"""Real ``peerd`` processes: start, status over the control endpoint, clean stop, and crash recovery.

The crash test kills the node with SIGKILL at several moments of a crawl (chosen by how many requests the
web has seen), restarts it on the same data dir each time, and checks that the union of what was fetched is
exactly the reachable-and-allowed set, and that pages fetched twice are bounded by what was in flight at
each kill.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import trio

from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import max_concurrent_connections_per_host, requested_urls

from .support.crawl import child_env, kill_pid, node_config, peerd_argv, start_local_web, urls_fetched
from .test_cluster_daemons import _get, _post

pytestmark = pytest.mark.slow  # real peerd daemons


async def _wait_control(data_dir, proc, timeout=30.0) -> str:
    with trio.fail_after(timeout):
        while True:
            assert proc.poll() is None, "peerd exited early"
            path = data_dir / "control.addr"
            if path.exists() and path.read_text().strip():
                return path.read_text().strip()
            await trio.sleep(0.05)


async def _run_to_completion(cfg, timeout: float, env: dict[str, str] | None = None) -> None:
    """Start ``cfg`` as a real peerd with --exit-when-done and require a clean exit within ``timeout``."""
    proc = await trio.lowlevel.open_process(peerd_argv(cfg), env=env or child_env())
    try:
        with trio.fail_after(timeout):
            assert await proc.wait() == 0
    finally:
        kill_pid(proc.pid)


async def _paused_and_idle(control: str, data_dir) -> None:
    """Wait until the node reports the crawl paused and no worker busy: from then on it starts no request."""
    with trio.fail_after(30):
        while True:
            status = await _get(control, "/status", data_dir)
            if status["settings"]["paused"] and not status["queue"]["workers_busy"]:
                return
            await trio.sleep(0.05)


def _peerctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from peer.cli.main import peerctl_main; "
                           "sys.exit(peerctl_main())", *args], capture_output=True, text=True, timeout=30,
                          env=child_env())


async def test_peerd_status_and_clean_stop_then_resume(tmp_path):
    graph = SiteGraph.generate(seed=11, hosts=10, pages_per_host=10, features=False)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        # delay 1 s: ten pages per host take ten seconds, and the crawl is paused after its first requests: what
        # status shows and where the stop falls do not depend on how long peerctl takes to answer
        cfg = node_config(tmp_path / "n", web, dns, delay=1.0, exit_when_done=False)
        proc = await trio.lowlevel.open_process(peerd_argv(cfg), env=child_env(), stderr=subprocess.PIPE)
        try:
            control = await _wait_control(tmp_path / "n", proc)
            with trio.fail_after(30):
                while len(web.log) < 15:
                    await trio.sleep(0.05)
            await _post(control, "/pause", tmp_path / "n")
            await _paused_and_idle(control, tmp_path / "n")
            out = await trio.to_thread.run_sync(_peerctl, "status", "--data-dir", str(tmp_path / "n"), "--json")
            assert out.returncode == 0, out.stderr
            st = json.loads(out.stdout)
            assert st["node_id"] == "test-node" and st["pages"] > 0 and st["done"] is False
            assert st["settings"]["paused"] is True
            text = await trio.to_thread.run_sync(_peerctl, "status", "--data-dir", str(tmp_path / "n"))
            assert "node test-node" in text.stdout and "pages" in text.stdout and "PAUSED" in text.stdout
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                assert await proc.wait() == 0
        finally:
            kill_pid(proc.pid)
        before = len(web.log)
        # a second node on the same data dir starts paused (the pause is kept over restarts), resumes when told
        # and finishes the crawl
        cfg = node_config(tmp_path / "n", web, dns, delay=0.05)
        (tmp_path / "n" / "control.addr").unlink(missing_ok=True)  # the first node's, left behind
        proc = await trio.lowlevel.open_process(peerd_argv(cfg), env=child_env())
        try:
            control = await _wait_control(tmp_path / "n", proc)
            assert (await _get(control, "/status", tmp_path / "n"))["settings"]["paused"] is True
            assert len(web.log) == before
            await _post(control, "/resume", tmp_path / "n")
            with trio.fail_after(60):
                assert await proc.wait() == 0
        finally:
            kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
    expected = web.expected()
    assert urls_fetched(web, expected) == set(expected.fetched)
    counts = requested_urls(web.log, port=web.port)
    twice = [u for u, n in counts.items() if n > 1]
    assert len(web.log) > before
    # a clean stop loses nothing and repeats at most the robots.txt of hosts (never pages twice)
    assert all(u.endswith("/robots.txt") for u in twice), twice


async def test_peerctl_errors_are_one_line(tmp_path):
    out = await trio.to_thread.run_sync(_peerctl, "status", "--control", "127.0.0.1:1")
    assert out.returncode == 2
    assert out.stderr.startswith("peerctl: error: cannot reach node at 127.0.0.1:1")
    assert "Traceback" not in out.stderr
    out = await trio.to_thread.run_sync(_peerctl, "status", "--data-dir", str(tmp_path / "nothing"))
    assert out.returncode == 2 and "no running node found" in out.stderr


async def test_two_nodes_cannot_share_a_data_dir(tmp_path):
    graph = SiteGraph.generate(seed=12, hosts=3, pages_per_host=4, features=False)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        cfg = node_config(tmp_path / "n", web, dns, exit_when_done=False)
        first = await trio.lowlevel.open_process(peerd_argv(cfg), env=child_env())
        try:
            await _wait_control(tmp_path / "n", first)
            second = await trio.run_process(peerd_argv(cfg), env=child_env(), capture_stderr=True, check=False)
            assert second.returncode == 2
            assert b"in use by another running node" in second.stderr
            other = node_config(tmp_path / "n", web, dns, node_id="someone-else")
            kill_pid(first.pid, signal.SIGTERM)
            await first.wait()
            third = await trio.run_process(peerd_argv(other), env=child_env(), capture_stderr=True, check=False)
            assert third.returncode == 2 and b"belongs to node 'test-node'" in third.stderr
        finally:
            kill_pid(first.pid)
        nursery.cancel_scope.cancel()


async def test_sigkill_at_several_moments_loses_nothing(tmp_path):
    graph = SiteGraph.generate(seed=21, hosts=16, pages_per_host=14)
    kills = []  # (wall time of the kill, requests open or just finished at that moment)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        expected = web.expected()
        total = len(expected.fetched)
        cfg = node_config(tmp_path / "n", web, dns, delay=0.02, concurrency=32)
        # Four kills within a second or two: a URL popped early in each run would be in flight at three of them
        # and dropped as a crash-loop suspect (max_crashes, tested in test_storage_crashloop.py). This test is
        # about what outside kills lose, so that guard is off here.
        env = {**child_env(), "PEERCRAWL_MAX_CRASHES": "0"}
        for fraction in (0.1, 0.35, 0.6, 0.85):
            proc = await trio.lowlevel.open_process(peerd_argv(cfg), env=env)
            try:
                with trio.fail_after(60):
                    while len(urls_fetched(web, expected)) < fraction * total and proc.poll() is None:
                        await trio.sleep(0.01)
            finally:
                kill_pid(proc.pid, signal.SIGKILL)
                await proc.wait()
            t = time.time()
            kills.append(t)
        await _run_to_completion(cfg, 90, env)
        nursery.cancel_scope.cancel()
    assert urls_fetched(web, expected) == set(expected.fetched)
    counts = requested_urls(web.log, port=web.port)
    twice = sum(n - 1 for u, n in counts.items() if n > 1 and not u.endswith("/robots.txt")
                and u not in expected.retried)
    # in flight at a kill: requests the web had started (or finished) within the last half second before it
    in_flight = sum(
        sum(1 for r in web.log if r.wall_start <= t and r.wall_end >= t - 0.5 and not r.path.endswith("robots.txt"))
        for t in kills
    )
    assert twice <= in_flight, (twice, in_flight)
    # politeness across restarts: a request cut by a kill lives on at the server until it notices the dead
    # socket; those are the killed process's, so only requests that no kill cut are compared
    uncut = [r for r in web.log if not any(r.wall_start <= t <= r.wall_end + 0.05 for t in kills)]
    assert max(max_concurrent_connections_per_host(uncut).values()) == 1


async def test_unwritable_data_dir_is_one_clear_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    graph = SiteGraph.generate(seed=12, hosts=3, pages_per_host=4, features=False)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        cfg = node_config(blocker / "data", web, dns)
        out = await trio.run_process(peerd_argv(cfg), env=child_env(), capture_stderr=True, check=False)
        nursery.cancel_scope.cancel()
    assert out.returncode == 2
    lines = out.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("peerd: error: data dir"), lines


def _limit_file_size(limit: int):
    def apply() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


async def test_full_disk_stops_cleanly_and_the_store_survives(tmp_path):
    """A file-size limit stands in for a full disk: writes past it fail with EFBIG, as a full disk fails
    with ENOSPC. The node must stop with one line, and a restart without the limit must finish the crawl
    from the same data dir: the store was not corrupted."""
    graph = SiteGraph.generate(seed=31, hosts=12, pages_per_host=20, features=False, page_bytes=20000)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        cfg = node_config(tmp_path / "n", web, dns, delay=0.0)
        out = await trio.run_process(peerd_argv(cfg), env=child_env(), capture_stderr=True, check=False,
                                     preexec_fn=_limit_file_size(600_000))
        errors = [line for line in out.stderr.decode().splitlines() if line.startswith("peerd: error")]
        assert out.returncode == 2, out.stderr.decode()[-2000:]
        assert len(errors) == 1 and "Traceback" not in out.stderr.decode()
        assert str(tmp_path / "n") in errors[0]
        await _run_to_completion(cfg, 90)
        nursery.cancel_scope.cancel()
    expected = web.expected()
    assert urls_fetched(web, expected) == set(expected.fetched)
