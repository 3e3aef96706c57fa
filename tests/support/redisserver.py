"""A real redis-server on a free loopback port, for the crawl log's stream: started, killed (SIGKILL, as a broker
that dies) and started again on the same port, stopped by its PID."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time

import pytest

REDIS = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """One redis-server; with `directory`, every write is in its append-only file before it answers (so what it
    acknowledged survives a kill -9), else it keeps nothing (a restart starts it empty)."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        if REDIS is None:
            pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS is not None
        keep = (["--appendonly", "yes", "--appendfsync", "always", "--dir", self.directory] if self.directory
                else ["--appendonly", "no"])
        self.proc = subprocess.Popen([REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *keep],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                assert self.proc.poll() is None, "redis-server exited at start"
                assert time.monotonic() < deadline, "redis-server did not listen within 10 s"
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def entries(self, stream: str) -> list[dict[str, str]]:
        """Every entry of `stream`, oldest first (its fields)."""
        return [fields for _id, fields in self.client().xrange(stream)]

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None
