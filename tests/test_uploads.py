"""The upload queue in the node's store, the expected ETag of a file, and the upload settings (no server: the
tests against a real S3 server are in test_uploads_s3.py)."""

from __future__ import annotations

import base64
import hashlib
import os
import random

import pytest

from peer.config import ConfigError, load
from peer.outputs import ObjectStore, S3Target, file_digest, file_etag, parse_s3_url
from peer.outputs.s3 import Stored
from peer.outputs.dirwatch import DirWatch
from storage import NodeStore, Uploaded, WarcPageStore, closed_files

MIB = 1 << 20


def _page(store: WarcPageStore, n: int, size: int = 2000) -> None:
    store.store(url=f"http://a.example/{n}", request_headers=[("host", "a.example")], status=200, reason="OK",
                response_headers=[("content-type", "text/html")], body=random.Random(n).randbytes(size), ip="127.0.0.1",
                fetched_at=1_700_000_000.0 + n)


def test_only_closed_files_are_queued_and_a_reopened_store_keeps_the_queue(tmp_path):
    warc = tmp_path / "warc"
    pages = WarcPageStore(warc, max_file_bytes=4000)
    for n in range(5):
        _page(pages, n)
    open_now = pages.current_file
    closed = [p.name for p in closed_files(warc)]
    assert closed and all(name.endswith((".warc.gz", ".cdxj")) for name in closed)
    assert open_now is not None and open_now not in closed  # the file being written is not closed yet

    with NodeStore.open(tmp_path / "state") as store:
        assert sorted(store.uploads.sweep(warc, now=10.0)) == sorted(closed)
        assert store.uploads.sweep(warc, now=11.0) == []  # queued once
    pages.close()
    with NodeStore.open(tmp_path / "state") as store:
        queued = {name: (size, at) for name, size, at in store.uploads.pending()}
        assert set(closed) <= set(queued) and all(queued[name][1] == 10.0 for name in closed)
        assert open_now in queued.keys() | set(store.uploads.sweep(warc, now=12.0))  # closed by close()
        for name, size, _at in store.uploads.pending():
            assert size == (warc / name).stat().st_size
        first = closed[0]
        store.uploads.done(first, Uploaded(key="p/n/" + first, size=1, sha256="ab", etag='"x"', at=13.0))
        assert store.uploads.uploaded(first) == Uploaded(key="p/n/" + first, size=1, sha256="ab", etag='"x"', at=13.0)
        assert first not in {name for name, _s, _a in store.uploads.pending()}
        assert store.uploads.sweep(warc, now=14.0) == []  # uploaded: never queued again while its file stays
        store.uploads.forget(closed[1])
        assert store.uploads.sweep(warc, now=15.0) == [closed[1]]  # forgotten but still here: queued again


def test_a_file_left_open_by_a_kill_is_closed_at_the_next_start_and_then_queued(tmp_path):
    warc = tmp_path / "warc"
    pages = WarcPageStore(warc, max_file_bytes=1 << 30)
    for n in range(3):
        _page(pages, n)
    name = pages.current_file
    assert name is not None and list(closed_files(warc)) == []
    # no close(): as after kill -9, the .cdxj.open index is left; the next store's start finishes it
    WarcPageStore(warc).close()
    assert [p.name for p in closed_files(warc)] == [name, name[: -len(".warc.gz")] + ".cdxj"]


@pytest.mark.parametrize("size, part", [(0, 5 * MIB), (1000, 5 * MIB), (5 * MIB, 5 * MIB), (12 * MIB + 7, 5 * MIB)])
def test_the_expected_checksum_and_etag_are_s3s_for_single_and_multipart_objects(tmp_path, size, part):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    path = tmp_path / "f"
    path.write_bytes(data)
    digest = file_digest(path, part)
    chunks = [data[i:i + part] for i in range(0, len(data), part)] or [b""]
    sums = tuple(base64.b64encode(hashlib.sha256(c).digest()).decode() for c in chunks)
    if len(chunks) == 1:
        checksum = sums[0]
        etag = hashlib.md5(data).hexdigest()
    else:
        both = b"".join(hashlib.sha256(c).digest() for c in chunks)
        checksum = base64.b64encode(hashlib.sha256(both).digest()).decode() + f"-{len(chunks)}"
        etag = hashlib.md5(b"".join(hashlib.md5(c).digest() for c in chunks)).hexdigest() + f"-{len(chunks)}"
    assert digest == (size, hashlib.sha256(data).hexdigest(), checksum, sums)
    assert file_etag(path, part) == f'"{etag}"'


def test_a_stored_object_is_the_file_by_its_checksum_or_without_one_by_its_etag(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 100)
    digest = file_digest(path, 5 * MIB)
    objects = ObjectStore(S3Target(bucket="b", prefix="", endpoint="http://127.0.0.1:9", region="us-east-1",
                                   access_key="k", secret_key="s"), part_size=5 * MIB)
    etag = file_etag(path, 5 * MIB)
    assert objects.matches(Stored(size=digest.size, etag="x", sha256="", checksum=digest.checksum), path, digest)
    assert not objects.matches(Stored(size=digest.size, etag=etag, sha256="", checksum="AAAA"), path, digest)
    assert not objects.matches(Stored(size=digest.size - 1, etag=etag, sha256="", checksum=digest.checksum), path,
                               digest)
    # a server that keeps no checksums: the ETag, from the file read again
    assert objects.matches(Stored(size=digest.size, etag=etag, sha256="", checksum=""), path, digest)
    assert not objects.matches(Stored(size=digest.size, etag='"0"', sha256="", checksum=""), path, digest)


def test_upload_settings_come_from_the_config_then_the_aws_variables():
    aws = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "env-key",
           "AWS_SECRET_ACCESS_KEY": "env-secret", "AWS_REGION": "eu-west-3"}
    cfg = load(env={}, flags={"upload": "s3://bucket/some/prefix/"})
    target = S3Target.from_config(cfg, aws)
    assert (target.bucket, target.prefix, target.endpoint, target.region, target.access_key, target.secret_key) == (
        "bucket", "some/prefix", "http://127.0.0.1:9", "eu-west-3", "env-key", "env-secret")
    assert target.key("node-1:7400", "f.warc.gz") == "some/prefix/node-1:7400/f.warc.gz"
    cfg = load(env={"PEERCRAWL_UPLOAD_ACCESS_KEY": "own"}, flags={"upload": "s3://bucket", "upload_secret_key": "s",
                                                                   "upload_endpoint": "http://h:1"})
    target = S3Target.from_config(cfg, aws)
    assert (target.access_key, target.secret_key, target.endpoint, target.prefix) == ("own", "s", "http://h:1", "")
    assert target.key("n", "f") == "n/f"
    with pytest.raises(ConfigError, match="credentials"):
        S3Target.from_config(load(env={}, flags={"upload": "s3://bucket/p"}), {})


@pytest.mark.parametrize("flags, message", [
    ({"upload": "http://bucket/p"}, "s3://BUCKET"),
    ({"upload": "s3:///p"}, "s3://BUCKET"),
    ({"upload": "s3://b/p", "store": "none"}, "store warc"),
    ({"upload": "s3://b/p", "upload_part_bytes": MIB}, "5 MiB"),
    ({"upload": "s3://b/p", "upload_max_local_bytes": 0}, "upload_max_local_bytes"),
])
def test_wrong_upload_settings_are_one_clear_error(flags, message):
    with pytest.raises(ConfigError, match=message):
        load(env={}, flags=flags)


def test_parse_s3_url():
    assert parse_s3_url("s3://b") == ("b", "")
    assert parse_s3_url("s3://b/x/y/") == ("b", "x/y")
    with pytest.raises(ConfigError):
        parse_s3_url("s3://b/x?y=1")


def test_the_directory_is_looked_at_again_when_it_changed_or_after_a_while(tmp_path):
    """The uploader and the webhook list the WARC directory only when a file was closed (renamed), created or
    removed there since their last look, or at least every `every` seconds."""
    now = [0.0]
    watch = DirWatch(tmp_path, lambda: now[0], every=10.0)
    os.utime(tmp_path, ns=(1, 1))  # a time no change made here can have: each change below shows
    assert watch.changed() and not watch.changed()
    opened = tmp_path / "a.cdxj.open"
    opened.write_text("")
    assert watch.changed() and not watch.changed()
    os.utime(tmp_path, ns=(1, 1))
    assert watch.changed()  # a time that went back is a change too
    opened.rename(tmp_path / "a.cdxj")  # a file closed
    assert watch.changed() and not watch.changed()
    now[0] = 9.9
    assert not watch.changed()
    now[0] = 10.0
    assert watch.changed() and not watch.changed()
