"""Low disk on a real small filesystem: a real node whose data directory is a 16 MiB tmpfs that a filler file
all but fills holds (no new fetch, no seed admitted, the pages under way finished), says so in /status,
/metrics and `peerctl status`, and resumes by itself when the filler goes, then crawls the whole web.

Mounting needs root: the test skips with that reason otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from peer.cli.format import format_status
from peerlab.localweb.graph import SiteGraph

from .support.crawl import child_env, kill_pid, node_config, peerd_argv, start_local_web, urls_fetched
from .test_uploads_s3 import _control, _wait_up

MiB = 1 << 20
LOW_MIB = 2  # disk_min_free_mib: holds under 2 MiB free, resumes at 3 MiB


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MiB tmpfs mounted under the test's temp dir, unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("no mount/umount command")
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


async def _status(node_dir: Path) -> dict:
    return json.loads(await _control(node_dir, "/status"))


@pytest.mark.slow
async def test_a_node_holds_on_a_full_disk_says_so_and_resumes_when_space_returns(small_fs):
    graph = SiteGraph.generate(seed=43, hosts=4, pages_per_host=40, page_bytes=20_000, features=False)
    node_dir = small_fs / "node"
    filler = small_fs / "filler"
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        expected = web.expected()
        # delay 0.1 s: forty pages a host take four seconds, so the crawl is under way when the disk fills
        cfg = node_config(node_dir, web, dns, delay=0.1, concurrency=8)
        env = child_env() | {"PEERCRAWL_DISK_MIN_FREE_MIB": str(LOW_MIB)}
        proc = await trio.lowlevel.open_process(peerd_argv(cfg), env=env)
        try:
            await _wait_up(node_dir, proc)
            with trio.fail_after(60):
                while (await _status(node_dir))["pages"] < 5:
                    assert proc.poll() is None
                    await trio.sleep(0.05)
            # all but fill the disk: a little above the low mark is left, which the next pages use up
            filler.write_bytes(b"\0" * max(0, _free(small_fs) - LOW_MIB * MiB - 128 * 1024))
            with trio.fail_after(60):
                while not (st := await _status(node_dir))["disk"]["low"]:
                    assert proc.poll() is None and not st["done"]
                    await trio.sleep(0.05)
            assert st["held"] == ["disk"] and 0 < st["disk"]["free_bytes"] < LOW_MIB * MiB
            assert "DISK LOW" in format_status(st)  # peerctl status
            metrics = (await _control(node_dir, "/metrics")).decode()
            assert "peercrawl_disk_low 1.0" in metrics and "peercrawl_disk_free_bytes" in metrics
            # the pages under way finish (in their one commit each); no new one starts
            with trio.fail_after(60):
                while (st := await _status(node_dir))["queue"]["in_flight"] or st["queue"]["workers_busy"]:
                    await trio.sleep(0.05)
            held_at = st["pages"]
            assert st["queue"]["urls"] > 0 and not st["done"]
            # a seed is refused, not lost silently: 507 with the reason
            import httpx

            address = (node_dir / "control.addr").read_text().strip()
            token = (node_dir / "control.token").read_text().strip()
            async with httpx.AsyncClient() as client:
                reply = await client.post(f"http://{address}/seed", json={"urls": [f"http://{graph.hosts[0]}/x"]},
                                          headers={"authorization": f"Bearer {token}"})
            assert reply.status_code == 507 and "disk low" in reply.json()["error"]
            st = await _status(node_dir)
            assert st["pages"] == held_at and st["disk"]["low"] and proc.poll() is None
            filler.unlink()
            with trio.fail_after(60):
                while (st := await _status(node_dir))["disk"]["low"]:
                    await trio.sleep(0.05)
            assert st["held"] == []
            with trio.fail_after(120):
                assert await proc.wait() == 0  # --exit-when-done: it went on and finished the web
        finally:
            kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
    assert urls_fetched(web, expected) == set(expected.fetched)
    log = (node_dir / "node.log").read_text() if (node_dir / "node.log").exists() else ""
    assert "storage failed" not in log
