"""A real `peerd`'s DATA_DIR/RUNNING marker over its lifetime: a clean stop (`peerctl stop`, or a SIGTERM even the
moment control.addr appears) removes it; a SIGKILL or an abort (SIGABRT) leaves it, and the next start reads the
stores through in a child first, logs what it read, and goes on. An abort prints the Python stack to the node's
log (faulthandler)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import trio

from peerlab.localweb.graph import SiteGraph
from storage import RUNNING, running_marker

from .support.crawl import child_env, kill_pid, node_config, peerd_argv, start_local_web

pytestmark = pytest.mark.slow  # real peerd daemons


async def _start(cfg, log: Path) -> trio.Process:
    with open(log, "wb") as out:
        proc = await trio.lowlevel.open_process(peerd_argv(cfg), env=child_env(), stderr=out)
    with trio.fail_after(60):
        while not (Path(cfg.data_dir) / "control.addr").exists():
            assert proc.poll() is None, log.read_text()[-2000:]
            await trio.sleep(0.05)
    return proc


def _records(log: Path) -> list[dict]:
    complete = log.read_text().rpartition("\n")[0]  # a line still being written is not read
    return [json.loads(line) for line in complete.splitlines() if line.startswith("{")]


async def _logged(log: Path, msg: str) -> list[dict]:
    """The log's records once one says `msg` (the node logs "node starting" after it publishes control.addr)."""
    with trio.fail_after(30):
        while True:
            records = _records(log)
            if any(r["msg"] == msg for r in records):
                return records
            await trio.sleep(0.05)


async def _stop(proc: trio.Process, sig: int | None, cfg) -> int:
    """Stop the node: `peerctl stop` (a clean stop) when `sig` is None, else that signal."""
    if sig is None:
        done = await trio.run_process([sys.executable, "-c", "import sys; from peer.cli.main import peerctl_main; "
                                       "sys.exit(peerctl_main())", "stop", "--data-dir", cfg.data_dir],
                                      env=child_env(), capture_stdout=True, capture_stderr=True, check=False)
        assert done.returncode == 0, done.stderr
    else:
        kill_pid(proc.pid, sig)
    (Path(cfg.data_dir) / "control.addr").unlink()
    with trio.fail_after(30):
        return await proc.wait()


async def test_the_marker_over_clean_stops_kills_and_aborts(tmp_path: Path) -> None:
    graph = SiteGraph.generate(seed=12, hosts=4, pages_per_host=30, features=False)
    data = tmp_path / "n"
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        cfg = node_config(data, web, dns, exit_when_done=False, delay=0.2)
        procs: list[trio.Process] = []
        try:
            # 1. a clean stop removes the marker
            procs.append(proc := await _start(cfg, tmp_path / "1.log"))
            assert running_marker(data)["pid"] == proc.pid
            with trio.fail_after(30):
                while len(web.log) < 10:
                    await trio.sleep(0.05)
            assert await _stop(proc, None, cfg) == 0
            assert not (data / RUNNING).exists()
            assert not any("checking the stores" in r["msg"] for r in _records(tmp_path / "1.log"))
            # 2. no check after a clean stop; a SIGKILL leaves the marker
            procs.append(proc := await _start(cfg, tmp_path / "2.log"))
            assert not any("checking the stores" in r["msg"] for r in _records(tmp_path / "2.log"))
            assert await _stop(proc, signal.SIGKILL, cfg) == -signal.SIGKILL
            assert running_marker(data)["pid"] == proc.pid
            # 3. the next start checks the stores, logs it, and goes on; an abort prints the Python stack
            procs.append(proc := await _start(cfg, tmp_path / "3.log"))
            records = await _logged(tmp_path / "3.log", "node starting")
            checked = [r for r in records if r["msg"] == "stores checked: sound"]
            assert len(checked) == 1 and checked[0]["keys"] > 10 and checked[0]["seconds"] >= 0
            assert checked[0]["stores"] == [str(data / "state")]
            assert running_marker(data)["pid"] == proc.pid
            assert await _stop(proc, signal.SIGABRT, cfg) == -signal.SIGABRT
            text = (tmp_path / "3.log").read_text()
            assert "Fatal Python error: Aborted" in text and 'File "' in text, text[-2000:]
            assert running_marker(data)["pid"] == proc.pid
            # 4. checked again after the abort, then a clean stop
            procs.append(proc := await _start(cfg, tmp_path / "4.log"))
            assert [r["msg"] for r in _records(tmp_path / "4.log")].count("stores checked: sound") == 1
            assert await _stop(proc, None, cfg) == 0
            assert not (data / RUNNING).exists()
            # 5. a SIGTERM the moment control.addr appears is a clean stop too: the node watches for it first
            procs.append(proc := await _start(cfg, tmp_path / "5.log"))
            assert await _stop(proc, signal.SIGTERM, cfg) == 0, (tmp_path / "5.log").read_text()[-2000:]
            assert not (data / RUNNING).exists()
            assert any(r["msg"] == "signal received, stopping" for r in _records(tmp_path / "5.log"))
        finally:
            for proc in procs:
                kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
