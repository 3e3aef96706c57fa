"""Every output at once on a cluster of real daemons: three peerd nodes crawl the local web with --upload to
SeaweedFS, the crawl log streamed to a real redis-server and the webhook on. One node is killed with SIGKILL
while it uploads (and started again from its data dir), and the S3 server is killed and started again
mid-crawl. Afterwards:

- every WARC file is in the bucket exactly once, whole, with the SHA-256 its upload recorded, and its index
  beside it; nothing half-sent, no WARC file left on a node's disk;
- the Redis stream holds every URL the web answered at least once (its record ids tell repeats apart);
- the webhook announced every WARC object with its SHA-256;
- every node's outputs are on every node's card of one node's dashboard (`GET /cluster`);
- any node's `GET /cdx` answers for the whole cluster: every stored page, each naming the node that wrote it
  and, once uploaded, its object in the bucket; `peerctl lookup` prints them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import signal
import subprocess
import sys

import httpx
import pytest
import trio

from peer.control import auth_headers
from peerlab.localweb.graph import SiteGraph

from .support.crawl import child_env, kill_pid, node_config, peerd_argv, start_local_web, urls_fetched
from .support.redisserver import RedisServer
from .support.s3server import BUCKET, WeedS3
from .support.webhook_receiver import SECRET, Receiver

pytestmark = pytest.mark.slow  # real daemons, a real S3 server and a real redis-server

CLUSTER_SECRET = "test-cluster-secret-0123456789"
STREAM = "crawl"
NODES = ("A", "B", "C")


async def _get(data_dir, path: str) -> httpx.Response:
    address = (data_dir / "control.addr").read_text().strip()
    async with httpx.AsyncClient(timeout=10.0) as client:
        return await client.get(f"http://{address}{path}", headers=auth_headers(data_dir))


async def _status(data_dir) -> dict:
    return (await _get(data_dir, "/status")).json()


class Nodes:
    def __init__(self, tmp, web, dns, env: dict[str, str]) -> None:
        self.tmp, self.web, self.dns, self.env = tmp, web, dns, env
        self.procs: dict[str, trio.Process] = {}
        self.seed: str | None = None

    async def start(self, name: str) -> None:
        # no seeds: the crawl starts once every node is a member (a start takes seconds on a loaded machine)
        cfg = node_config(self.tmp / name, self.web, self.dns, node_id=name, delay=0.3, concurrency=16,
                          exit_when_done=False, seeds=[])
        argv = peerd_argv(cfg) + ["--suspicion-timeout", "2"]
        if self.seed is not None and name != "A":
            argv += ["--join", self.seed]
        (self.tmp / name / "control.addr").unlink(missing_ok=True)
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the test's tmp dir
        self.procs[name] = await trio.lowlevel.open_process(argv, env=self.env, stderr=log)
        with trio.fail_after(120):  # a start imports a few seconds of modules; a loaded machine takes longer
            while not (self.tmp / name / "peer.addr").exists() or not (self.tmp / name / "control.addr").exists():
                assert self.procs[name].poll() is None, f"{name} exited early"
                await trio.sleep(0.05)
        if self.seed is None:
            self.seed = (self.tmp / name / "peer.addr").read_text().strip()

    def kill_all(self) -> None:
        for proc in self.procs.values():
            kill_pid(proc.pid)


async def _until(check, timeout: float, step: float = 0.1) -> None:
    with trio.fail_after(timeout):
        while not await check():
            await trio.sleep(step)


async def test_three_nodes_with_every_output_lose_nothing_through_a_kill_and_an_s3_restart(tmp_path):
    s3 = WeedS3(tmp_path / "weed")
    s3.start()
    redis = RedisServer()
    receiver = Receiver()
    # a host's pages take 9 s at least (30 pages, 0.3 s apart): the crawl outlasts the kill and the S3 server's
    # absence
    graph = SiteGraph.generate(seed=23, hosts=10, pages_per_host=30, features=False)
    try:
        async with trio.open_nursery() as nursery:
            web, dns = await start_local_web(nursery, graph)
            expected = web.expected()
            env = {**child_env(), **s3.env(), "PEERCRAWL_CLUSTER_SECRET": CLUSTER_SECRET,
                   "PEERCRAWL_UPLOAD": f"s3://{BUCKET}/run", "PEERCRAWL_WARC_MAX_BYTES": "20000",
                   "PEERCRAWL_WEBHOOK": receiver.url, "PEERCRAWL_WEBHOOK_SECRET": SECRET.decode(),
                   "PEERCRAWL_CRAWL_LOG": f"{redis.url}?stream={STREAM}", "PEERCRAWL_MAX_CRASHES": "0"}
            nodes = Nodes(tmp_path, web, dns, env)
            try:
                await nodes.start("A")
                async with trio.open_nursery() as starting:  # B and C join A at once
                    starting.start_soon(nodes.start, "B")
                    starting.start_soon(nodes.start, "C")

                async def members() -> bool:
                    cluster = (await _status(tmp_path / "A"))["cluster"]
                    return {m["node_id"] for m in cluster["members"] if m["state"] == "alive"} == set(NODES)

                await _until(members, 60)
                async with httpx.AsyncClient(timeout=10.0) as client:
                    address = (tmp_path / "A" / "control.addr").read_text().strip()
                    reply = await client.post(f"http://{address}/seed", json={"urls": web.seeds()},
                                              headers=auth_headers(tmp_path / "A"))
                    assert reply.status_code == 200, reply.text

                # B is killed while it uploads: once a few of its files are in the bucket
                async def b_uploads() -> bool:
                    # in a thread: this loop serves the local web and its DNS to the nodes
                    return len(await trio.to_thread.run_sync(s3.objects, "run/B/")) >= 4

                try:
                    await _until(b_uploads, 180, 0.02)
                except trio.TooSlowError:
                    # what each node reports, so that a run that stalls here says where
                    full = {n: await _status(tmp_path / n) for n in NODES}
                    (tmp_path / "stall-status.json").write_text(json.dumps(full, indent=1, default=str))
                    report = {n: {k: v for k, v in full[n].items()
                                  if k in ("queue", "errors", "held", "upload", "settings", "disk", "pages")}
                              | {"lanes": full[n]["cluster"].get("lanes")} for n in NODES}
                    stored = len(await trio.to_thread.run_sync(s3.objects, "run/B/"))
                    raise AssertionError(f"B stored {stored} objects in 180 s; seeding answered "
                                         f"{reply.json()}; the nodes report {report}") from None
                kill_pid(nodes.procs["B"].pid, signal.SIGKILL)
                await nodes.procs["B"].wait()

                # the S3 server goes away mid-crawl; the nodes say so and crawl on
                await trio.to_thread.run_sync(s3.kill)

                async def failing() -> bool:
                    return not all([(await _status(tmp_path / n))["upload"]["ok"] for n in ("A", "C")])

                await _until(failing, 60)
                await trio.to_thread.run_sync(s3.start)  # soon: the nodes' back-off stays short
                await nodes.start("B")  # from its data dir, as systemd would

                async def all_out() -> bool:
                    for name in NODES:
                        st = await _status(tmp_path / name)
                        if not st["done"] or st["upload"]["queued_files"] or not st["upload"]["ok"]:
                            return False
                        if st["crawl_log"]["readers"]["stream"]["waiting"] or st["webhook"]["waiting"]:
                            return False
                    return True

                await _until(all_out, 300, 0.2)

                # every node's card on any node's dashboard shows its outputs (from the peers' status reports)
                async def cards() -> bool:
                    nodes_seen = (await _get(tmp_path / "C", "/cluster")).json()["nodes"]
                    kinds = {n["node_id"]: {o["kind"] for o in (n.get("detail") or {}).get("outputs", [])}
                             for n in nodes_seen}
                    return kinds == {name: {"upload", "webhook", "crawl-log", "crawl-log-stream"} for name in NODES}

                await _until(cards, 30, 0.5)
                # the cluster's index, asked of one node, while every node runs
                reply = await _get(tmp_path / "C", "/cdx?url=*.test&output=json")
                assert reply.status_code == 200 and "x-peercrawl-nodes-missing" not in reply.headers
                captures = [json.loads(line) for line in reply.text.splitlines()]
                some = sorted(expected.fetched)[0]
                lookup = await trio.to_thread.run_sync(lambda: subprocess.run(
                    [sys.executable, "-c", "import sys; from peer.cli.main import peerctl_main; sys.exit(peerctl_main())",
                     "lookup", "--data-dir", str(tmp_path / "A"), some], capture_output=True, text=True, timeout=60,
                    env=child_env()))
                for name in NODES:
                    nodes.procs[name].send_signal(signal.SIGTERM)
                for name in NODES:
                    with trio.fail_after(60):
                        assert await nodes.procs[name].wait() == 0
            finally:
                nodes.kill_all()
            nursery.cancel_scope.cancel()

        fetched = urls_fetched(web, expected)
        assert set(expected.fetched) <= fetched
        client = s3.client()
        objects = s3.objects("run/")
        warcs = {k: size for k, size in objects.items() if k.endswith(".warc.gz")}
        indexes = {k for k in objects if k.endswith(".cdxj")}
        assert {k[: -len(".warc.gz")] for k in warcs} == {k[: -len(".cdxj")] for k in indexes}
        assert {k.split("/")[1] for k in warcs} == set(NODES)
        # every WARC file exactly once: one object per file name, whole, with its recorded checksum
        indexed: set[str] = set()
        shas = []
        for key in warcs:
            body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            gzip.decompress(body)
            sha = hashlib.sha256(body).hexdigest()
            assert client.head_object(Bucket=BUCKET, Key=key)["Metadata"]["sha256"] == sha
            shas.append(sha)
        assert len(set(shas)) == len(shas)
        for key in indexes:
            for line in client.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode().splitlines():
                indexed.add(json.loads(line.split(" ", 2)[2])["url"])
        assert indexed == set(expected.fetched)
        assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
        for name in NODES:
            assert list((tmp_path / name / "warc").glob("*.warc.gz")) == []
        # the stream: every URL the web answered, at least once
        entries = redis.entries(STREAM)
        assert {e["url"] for e in entries} == fetched
        ids = [e["id"] for e in entries]
        repeats = len(ids) - len(set(ids))
        records = [json.loads(e["record"]) for e in entries]
        assert [r["id"] for r in records] == ids and [r["url"] for r in records] == [e["url"] for e in entries]
        assert {r["node"] for r in records if r["warc"]} == set(NODES)
        # the webhook: every WARC object announced with the checksum of what is stored
        announced = {body["key"]: body["sha256"] for body in receiver.accepted()}
        assert set(announced) == set(warcs)
        for key, sha in announced.items():
            assert client.head_object(Bucket=BUCKET, Key=key)["Metadata"]["sha256"] == sha
        # the index: every stored page, from the node that wrote it, with its object
        assert {c["url"] for c in captures} == set(expected.fetched)
        assert {c["node"] for c in captures} == set(NODES)
        # a capture names its object once its file was uploaded; the files still open then went at the stop
        for c in captures:
            key = f"run/{c['node']}/{c['filename']}"
            assert key in warcs and c.get("object") in (None, key), c
        assert sum(1 for c in captures if c.get("object")) > len(captures) / 2
        assert lookup.returncode == 0, lookup.stderr
        assert some in lookup.stdout and re.search(r"(object run/[ABC]/|[ABC]:)peercrawl-\S+ @\d+", lookup.stdout)
        print(f"{len(fetched)} URLs, {len(warcs)} WARC objects, {len(entries)} stream entries "
              f"({repeats} repeated ids), {len(captures)} captures")
    finally:
        receiver.close()
        redis.close()
        s3.kill()
