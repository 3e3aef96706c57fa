"""Real proxies on loopback for the tests: Debian's tinyproxy (HTTP proxying and CONNECT, with Basic credentials)
and dante (`danted`, SOCKS5), each started in the foreground on a free port with a configuration of its own,
and stopped (by its process id) when the context ends. Skips the test when the program is not installed
(.ci/run installs both)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["RunningProxy", "dante", "tinyproxy"]


@dataclass(frozen=True)
class RunningProxy:
    port: int
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _program(name: str) -> str:
    found = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)),
                                       None)
    if found is None:
        pytest.skip(f"{name} is not installed (apt-get install {'dante-server' if name == 'danted' else name})")
    return found


@contextlib.contextmanager
def _running(argv: list[str], port: int, log: Path) -> Iterator[RunningProxy]:
    with open(log.with_suffix(".out"), "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not start: {log.with_suffix('.out').read_text()[-2000:]}")
            time.sleep(0.05)
        yield RunningProxy(port, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def tinyproxy(directory: Path, *, user: str = "", password: str = "") -> Iterator[RunningProxy]:
    """tinyproxy on 127.0.0.1: plain HTTP proxying and CONNECT to any port, Basic credentials if given."""
    program = _program("tinyproxy")
    port = _free_port()
    log = directory / f"tinyproxy-{port}.log"
    conf = directory / f"tinyproxy-{port}.conf"
    lines = [f"Port {port}", "Listen 127.0.0.1", "Timeout 60", "MaxClients 100", "Allow 127.0.0.1",
             f"LogFile \"{log}\"", "LogLevel Connect", "DisableViaHeader No"]
    if user:
        lines.append(f"BasicAuth {user} {password}")
    conf.write_text("\n".join(lines) + "\n")
    with _running([program, "-d", "-c", str(conf)], port, log) as running:
        yield running


@contextlib.contextmanager
def dante(directory: Path, *, external: str = "127.0.0.1") -> Iterator[RunningProxy]:
    """danted on 127.0.0.1: SOCKS5 without authentication, to loopback only, connecting from ``external``."""
    program = _program("danted")
    port = _free_port()
    log = directory / f"danted-{port}.log"
    conf = directory / f"danted-{port}.conf"
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "nobody")
    conf.write_text(f"""\
logoutput: {log}
internal: 127.0.0.1 port = {port}
external: {external}
clientmethod: none
socksmethod: none
user.privileged: {user}
user.unprivileged: {user}
client pass {{ from: 127.0.0.1/32 to: 0.0.0.0/0 log: connect }}
socks pass {{ from: 127.0.0.1/32 to: 127.0.0.0/8 log: connect }}
""")
    with _running([program, "-f", str(conf), "-N", "1", "-p", str(directory / f"danted-{port}.pid")], port,
                  log) as running:
        yield running
