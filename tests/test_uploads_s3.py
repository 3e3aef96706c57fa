"""--upload against a real S3-compatible server (SeaweedFS, tests/support/s3server.py): the uploader in process
(multipart, verification, keep-local, refused credentials, the local bound), and real peerd daemons killed with
SIGKILL mid-upload and crawling through a restart of the S3 server."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import signal
import socket
from pathlib import Path

import pytest
import trio

from peer.cli.format import format_status
from peer.outputs import ObjectStore, S3Target, UploadError, Uploader, file_digest, file_etag, sign
from peerlab.localweb.graph import SiteGraph
from storage import NodeStore, WarcPageStore, closed_files

from .support.crawl import child_env, kill_pid, node_config, peerd_argv, start_local_web, urls_fetched
from .support.s3server import ACCESS_KEY, BUCKET, SECRET_KEY, WeedS3
from .support.webhook_receiver import SECRET, Receiver

pytestmark = pytest.mark.slow  # a real S3 server, real daemons

MIB = 1 << 20


def test_the_test_s3_server_starts_on_other_inner_ports_when_one_is_taken(tmp_path):
    # its ports are picked free before weed starts; a port another process takes meanwhile makes weed exit
    server = WeedS3(tmp_path / "weed")
    taken = server._ports[4]  # the volume server's
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", taken))
    squatter.listen()
    try:
        server.start()
        try:
            assert taken not in server._ports and server._ports[0] == server.s3_port
            server.client().put_object(Bucket=BUCKET, Key="k", Body=b"v")
            assert "address already in use" in (tmp_path / "weed" / "weed.out").read_text()
        finally:
            server.kill()
    finally:
        squatter.close()


@pytest.fixture
def s3(tmp_path):
    server = WeedS3(tmp_path / "weed")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def _target(server: WeedS3, prefix: str, secret: str = SECRET_KEY) -> S3Target:
    return S3Target(bucket=BUCKET, prefix=prefix, endpoint=server.endpoint, region="us-east-1",
                    access_key=ACCESS_KEY, secret_key=secret)


def _write_pages(warc: Path, count: int, size: int, max_file_bytes: int, at: float = 1_700_000_000.0) -> None:
    rng = random.Random(count)
    with WarcPageStore(warc, max_file_bytes=max_file_bytes) as pages:
        for n in range(count):
            pages.store(url=f"http://a.example/{n}", request_headers=[("host", "a.example")], status=200,
                        reason="OK", response_headers=[("content-type", "text/html")], body=rng.randbytes(size),
                        ip="127.0.0.1", fetched_at=at + n)


def _uploader(store: NodeStore, warc: Path, objects: ObjectStore, holds: list[bool], **kw) -> Uploader:
    return Uploader(uploads=store.uploads, directory=warc, objects=objects, node_id="node-a",
                    keep_local=kw.get("keep_local", False), max_local_bytes=kw.get("max_local_bytes", 1 << 40),
                    hold=holds.append, notify=kw.get("notify", False))


async def _until(check, timeout: float = 60.0, step: float = 0.1):
    with trio.fail_after(timeout):
        while not (got := check()):
            await trio.sleep(step)
        return got


async def test_files_go_once_verified_multipart_and_local_copies_are_removed(s3, tmp_path):
    warc = tmp_path / "warc"
    # three files of about 12 MiB (three 5 MiB parts each) and the last one smaller
    _write_pages(warc, count=80, size=400_000, max_file_bytes=12 * MIB)
    local = {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in closed_files(warc)}
    assert len(local) >= 6
    holds: list[bool] = []
    with NodeStore.open(tmp_path / "state") as store:
        uploader = _uploader(store, warc, ObjectStore(_target(s3, "run1"), part_size=5 * MIB), holds, notify=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(uploader.run)
            await _until(lambda: uploader.uploaded_files == len(local))
            nursery.cancel_scope.cancel()
        assert store.uploads.pending() == [] and list(closed_files(warc)) == []
        assert {name: store.uploads.uploaded(name).sha256 for name in local} == {n: s for n, (_z, s) in local.items()}
        # each WARC file's webhook notice was written with its upload record, naming its object
        notices = {json.loads(body)["file"]: json.loads(body) for _id, body in store.uploads.notices()}
        assert set(notices) == {name for name in local if name.endswith(".warc.gz")}
        for name, body in notices.items():
            assert (body["event"], body["key"], body["size"], body["sha256"]) == (
                "uploaded", f"run1/node-a/{name}", *local[name])
            assert body["records"] > 0
    objects = s3.objects("run1/")
    assert objects == {f"run1/node-a/{name}": size for name, (size, _sha) in local.items()}
    client = s3.client()
    for name, (size, sha) in local.items():
        got = client.get_object(Bucket=BUCKET, Key=f"run1/node-a/{name}")
        assert got["Metadata"]["sha256"] == sha
        assert hashlib.sha256(got["Body"].read()).hexdigest() == sha
    # the server keeps each object's SHA-256 checksum (S3's composite one for a multipart object) and its ETag
    heads = {name: client.head_object(Bucket=BUCKET, Key=f"run1/node-a/{name}", ChecksumMode="ENABLED")
             for name in local}
    for name, head in heads.items():
        copy = tmp_path / "copy"
        copy.write_bytes(client.get_object(Bucket=BUCKET, Key=f"run1/node-a/{name}")["Body"].read())
        assert (head["ChecksumSHA256"], head["ETag"]) == (file_digest(copy, 5 * MIB).checksum,
                                                        file_etag(copy, 5 * MIB))
    assert any(head["ChecksumSHA256"].endswith("-3") and head["ETag"].endswith('-3"')
               for head in heads.values())  # multipart happened
    assert holds == [] and uploader.status()["ok"] is True


class _Counted(ObjectStore):
    """The real object store, counting the S3 steps it takes."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.steps: list[str] = []

    def _call(self, op: str, **kwargs):
        self.steps.append(op)
        return super()._call(op, **kwargs)


async def test_a_file_closed_while_the_node_runs_is_sent_without_a_look_first_and_an_inherited_one_with(s3, tmp_path):
    warc = tmp_path / "warc"
    _write_pages(warc, count=3, size=20_000, max_file_bytes=1 << 30)  # closed before the uploader starts
    inherited = {p.name for p in closed_files(warc)}
    holds: list[bool] = []
    with NodeStore.open(tmp_path / "state") as store:
        objects = _Counted(_target(s3, "fresh"), part_size=5 * MIB)
        uploader = _uploader(store, warc, objects, holds)
        async with trio.open_nursery() as nursery:
            await nursery.start(uploader.run)
            await _until(lambda: uploader.uploaded_files == len(inherited))
            # an earlier run may have sent these: looked up, stale multipart uploads aborted, sent, verified
            assert objects.steps == ["head_object", "list_multipart_uploads", "put_object", "head_object"] * 2
            objects.steps.clear()
            _write_pages(warc, count=3, size=20_000, max_file_bytes=1 << 30, at=1_700_000_100.0)  # closed now
            uploader.wake()
            await _until(lambda: uploader.uploaded_files == len(inherited) + 2)
            nursery.cancel_scope.cancel()
        assert objects.steps == ["put_object", "head_object"] * 2  # nobody sent these before: sent, verified
    assert len(s3.objects("fresh/")) == 4


async def test_a_body_that_does_not_match_its_checksum_is_refused_and_not_stored(s3, tmp_path):
    path = tmp_path / "f.warc.gz"
    path.write_bytes(random.Random(1).randbytes(300_000))
    objects = ObjectStore(_target(s3, "bad"), part_size=5 * MIB)
    digest = file_digest(path, 5 * MIB)
    other = digest._replace(parts=(file_digest(__file__, 5 * MIB).parts[0],))  # another body's checksum
    with pytest.raises(UploadError) as refused:
        await trio.to_thread.run_sync(objects.put, path, "bad/f.warc.gz", other)
    assert refused.value.kind == "server" and "BadDigest" in str(refused.value)
    assert s3.objects("bad/") == {}
    await trio.to_thread.run_sync(objects.put, path, "bad/f.warc.gz", digest)
    etag = await trio.to_thread.run_sync(objects.verify, "bad/f.warc.gz", path, digest)
    assert etag == file_etag(path, 5 * MIB)


async def test_refused_credentials_hold_the_crawl_at_the_bound_and_keep_local_keeps_files(s3, tmp_path):
    warc = tmp_path / "warc"
    _write_pages(warc, count=30, size=20_000, max_file_bytes=100_000)
    local = {p.name for p in closed_files(warc)}
    queued_bytes = sum((warc / name).stat().st_size for name in local)
    holds: list[bool] = []
    with NodeStore.open(tmp_path / "state") as store:
        wrong = ObjectStore(_target(s3, "run2", secret="not-the-secret"), part_size=5 * MIB)
        uploader = _uploader(store, warc, wrong, holds, keep_local=True, max_local_bytes=queued_bytes // 2)
        async with trio.open_nursery() as nursery:
            await nursery.start(uploader.run)
            await _until(lambda: uploader.failures >= 2)
            status = uploader.status()
            assert status["ok"] is False and status["error_kind"] == "credentials"
            assert "refused the credentials" in status["error"]
            assert status["queued_files"] == len(local) and status["queued_bytes"] == queued_bytes
            assert status["fetching_paused"] is True and holds == [True]
            # the operator fixes the credentials: the queue drains and the crawl is let go
            uploader.objects = ObjectStore(_target(s3, "run2"), part_size=5 * MIB)
            await _until(lambda: uploader.uploaded_files == len(local))
            await _until(lambda: holds == [True, False])
            nursery.cancel_scope.cancel()
        assert uploader.status()["ok"] is True and uploader.status()["fetching_paused"] is False
        # --keep-local: the files stay, and are not queued again
        assert {p.name for p in closed_files(warc)} == local
        assert store.uploads.sweep(warc, now=0.0) == []
    assert set(s3.objects("run2/")) == {f"run2/node-a/{name}" for name in local}


# ---------------------------------------------------------------------------------------------- real daemons


def _upload_env(server: WeedS3, prefix: str, **settings: str) -> dict[str, str]:
    env = {**child_env(), **server.env(), "PEERCRAWL_UPLOAD": f"s3://{BUCKET}/{prefix}",
           "PEERCRAWL_MAX_CRASHES": "0"}
    env.update({f"PEERCRAWL_{k.upper()}": v for k, v in settings.items()})
    return env


def _bucket_urls(server: WeedS3, prefix: str) -> tuple[set[str], dict[str, int]]:
    """The URLs whose response records the bucket's CDXJ objects index, and every WARC object's size, after
    checking that each WARC object is whole gzip and its stored ETag is its MD5 (single-part)."""
    client = server.client()
    urls: set[str] = set()
    warcs: dict[str, int] = {}
    shas: list[str] = []
    for key, size in server.objects(prefix).items():
        body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert len(body) == size
        if key.endswith(".cdxj"):
            for line in body.decode().splitlines():
                urls.add(json.loads(line.split(" ", 2)[2])["url"])
        else:
            assert key.endswith(".warc.gz"), key
            gzip.decompress(body)  # whole: every member complete
            head = client.head_object(Bucket=BUCKET, Key=key)
            assert head["Metadata"]["sha256"] == hashlib.sha256(body).hexdigest()
            warcs[key] = size
            shas.append(head["Metadata"]["sha256"])
    assert len(set(shas)) == len(shas)  # no file stored as two objects
    return urls, warcs


async def _control(data_dir: Path, path: str) -> bytes:
    """GET `path` from a running node's control endpoint (its address and token from its data dir)."""
    import httpx

    address = (data_dir / "control.addr").read_text().strip()
    token = (data_dir / "control.token").read_text().strip()
    async with httpx.AsyncClient() as client:
        reply = await client.get(f"http://{address}{path}", headers={"authorization": f"Bearer {token}"})
    reply.raise_for_status()
    return reply.content


async def _wait_up(data_dir: Path, proc) -> None:
    with trio.fail_after(60):
        while not (data_dir / "control.addr").exists() or not (data_dir / "control.token").exists():
            assert proc.poll() is None, "peerd exited early"
            await trio.sleep(0.05)


def _check_bucket(server: WeedS3, prefix: str, node_dir: Path, stored: set[str]) -> None:
    """Every page the node stored is indexed in the bucket, every file is there once and whole, and nothing is
    left on the node's disk or half-sent in the bucket."""
    urls, warcs = _bucket_urls(server, prefix)
    assert urls == stored
    indexes = {k for k in server.objects(prefix) if k.endswith(".cdxj")}
    assert {k[: -len(".warc.gz")] for k in warcs} == {k[: -len(".cdxj")] for k in indexes}
    assert list((node_dir / "warc").glob("*.warc.gz")) == []  # uploaded, verified, removed
    assert server.client().list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


async def test_sigkill_mid_upload_loses_no_file_and_stores_none_twice(s3, tmp_path):
    graph = SiteGraph.generate(seed=31, hosts=8, pages_per_host=16, features=False)
    node_dir = tmp_path / "n"
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        expected = web.expected()
        cfg = node_config(node_dir, web, dns, delay=0.05, concurrency=16)
        # WARC files of about 20 kB: a file closes every few pages, so uploads run all through the crawl
        receiver = Receiver()
        env = _upload_env(s3, "kills", warc_max_bytes="20000", webhook=receiver.url,
                          webhook_secret=SECRET.decode())
        for uploaded in (2, 10, 24):
            proc = await trio.lowlevel.open_process(peerd_argv(cfg), env=env)
            try:
                await _until(lambda: len(s3.objects("kills/")) >= uploaded or proc.poll() is not None,
                             timeout=90, step=0.02)
            finally:
                kill_pid(proc.pid, signal.SIGKILL)
                await proc.wait()
        proc = await trio.lowlevel.open_process(peerd_argv(cfg), env=env)
        try:
            with trio.fail_after(120):
                assert await proc.wait() == 0
        finally:
            kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
    receiver.close()
    stored = set(expected.fetched)
    assert urls_fetched(web, expected) == stored
    _check_bucket(s3, "kills/", node_dir, stored)
    # the webhook announced every WARC object at least once, with its key and the SHA-256 of what is stored
    announced = {body["key"]: body["sha256"] for body in receiver.accepted()}
    client = s3.client()
    warcs = {k for k in s3.objects("kills/") if k.endswith(".warc.gz")}
    assert set(announced) == warcs
    for key in warcs:
        assert client.head_object(Bucket=BUCKET, Key=key)["Metadata"]["sha256"] == announced[key]
    for headers, raw, _status in receiver.posts:
        assert headers["x-peercrawl-signature"] == sign(SECRET, raw)


async def test_the_crawl_goes_on_through_an_s3_restart_and_pauses_at_the_local_bound(s3, tmp_path):
    graph = SiteGraph.generate(seed=41, hosts=6, pages_per_host=40, features=False)
    node_dir = tmp_path / "n"
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        expected = web.expected()
        # delay 0.5 s: forty pages a host take twenty seconds, so the crawl outlasts the server's absence
        cfg = node_config(node_dir, web, dns, delay=0.5, concurrency=16)
        env = _upload_env(s3, "restart", warc_max_bytes="20000", upload_max_local_bytes="60000")
        proc = await trio.lowlevel.open_process(peerd_argv(cfg), env=env)
        try:
            await _wait_up(node_dir, proc)
            await _until(lambda: len(s3.objects("restart/")) >= 2, timeout=60, step=0.05)
            s3.kill()
            status = json.loads(await _control(node_dir, "/status"))
            pages_at_kill = status["pages"]

            async def failing() -> dict:
                st = json.loads(await _control(node_dir, "/status"))
                return st if not st["upload"]["ok"] and st["pages"] > pages_at_kill else {}

            with trio.fail_after(60):
                while not (status := await failing()):
                    await trio.sleep(0.1)
            # the crawl went on while the server was down, and says why uploads fail
            assert status["upload"]["error_kind"] == "unreachable" and status["upload"]["failures"] >= 1
            assert f"upload s3://{BUCKET}/restart  FAILING for" in format_status(status)  # peerctl status
            metrics = (await _control(node_dir, "/metrics")).decode()
            assert "peercrawl_upload_ok 0.0" in metrics
            assert "peercrawl_upload_failures_total" in metrics
            with trio.fail_after(90):
                while not (st := json.loads(await _control(node_dir, "/status")))["upload"]["fetching_paused"]:
                    assert proc.poll() is None and not st["done"]
                    await trio.sleep(0.1)
            assert st["held"] == ["upload"] and st["upload"]["queued_bytes"] >= 60000
            assert "FETCHING PAUSED" in format_status(st)
            assert "peercrawl_upload_fetching_paused 1.0" in (await _control(node_dir, "/metrics")).decode()
            await trio.to_thread.run_sync(s3.start)
            with trio.fail_after(180):
                assert await proc.wait() == 0
        finally:
            kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
    stored = set(expected.fetched)
    assert urls_fetched(web, expected) == stored
    _check_bucket(s3, "restart/", node_dir, stored)
