"""Page store: WARC 1.1 records read back with warcio, rotation, CDXJ index and lookups, crash leftovers."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from storage import NullPageStore, StorageError, WarcPageStore, open_page_store, surt

T0 = 1_700_000_000.5  # 2023-11-14T22:13:20.5Z


def page(n: int, size: int = 2000, **over) -> dict:
    body = (f"<html><body>page {n} ".encode() + b"x" * size + b"</body></html>")
    fields = {
        "url": f"http://www.example.com/p/{n}?b=2&a=1",
        "request_headers": [("Host", "www.example.com"), ("User-Agent", "peercrawl/0.1 (+http://ops.test/)")],
        "status": 200,
        "reason": "OK",
        "response_headers": [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body)))],
        "body": body,
        "ip": "127.0.0.1",
        "fetched_at": T0 + n,
    }
    fields.update(over)
    return fields


def read_records(path: Path) -> list:
    out = []
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh):
            out.append((record.rec_type, record.rec_headers, record.http_headers, record.content_stream().read()))
    return out


def test_records_read_back_with_warcio(tmp_path):
    with WarcPageStore(tmp_path) as store:
        p = page(1)
        store.store(**p)
        chunked = page(2, response_headers=[("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked")])
        store.store(**chunked)
        name = store.current_file
        assert store.pages == 2
    assert name is not None and name.startswith("peercrawl-20231114221321-") and name.endswith(".warc.gz")
    records = read_records(tmp_path / name)
    assert [r[0] for r in records] == ["warcinfo", "response", "request", "response", "request"]
    _t, rec, http, body = records[1]
    assert rec.protocol == "WARC/1.1"
    assert rec.get_header("WARC-Target-URI") == p["url"]
    assert rec.get_header("WARC-Date") == "2023-11-14T22:13:21.500000Z"
    assert rec.get_header("WARC-IP-Address") == "127.0.0.1"
    assert rec.get_header("WARC-Payload-Digest").startswith("sha1:")
    assert http.get_statuscode() == "200" and http.get_header("Content-Type") == "text/html; charset=utf-8"
    assert body == p["body"]
    _t, req, req_http, req_body = records[2]
    assert req.get_header("WARC-Concurrent-To") == rec.get_header("WARC-Record-ID")
    assert req_http.protocol == "GET" and req_http.statusline.startswith("/p/1?b=2&a=1")
    assert req_http.get_header("User-Agent") == "peercrawl/0.1 (+http://ops.test/)" and req_body == b""
    _t, _rec, http2, body2 = records[3]
    assert http2.get_header("Transfer-Encoding") is None and body2 == chunked["body"]


def test_each_record_is_its_own_gzip_member_found_by_lookup(tmp_path):
    with WarcPageStore(tmp_path) as store:
        for n in range(5):
            store.store(**page(n))
        store.store(**page(3, status=404, reason="Not Found", fetched_at=T0 + 100))
        found = store.lookup(page(3)["url"])
        assert store.lookup("http://www.example.com/nothing") == []
    assert [offset for _f, offset, _l in found] == sorted(offset for _f, offset, _l in found)
    statuses = []
    for filename, offset, length in found:
        with open(tmp_path / filename, "rb") as fh:
            fh.seek(offset)
            raw = gzip.decompress(fh.read(length))  # exactly one member: the response record
        assert raw.startswith(b"WARC/1.1\r\n") and b"WARC-Type: response" in raw
        statuses.append(raw.split(b"\r\n\r\n", 1)[1].split(b"\r\n", 1)[0])
    assert statuses == [b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found"]


def test_cdxj_file_is_sorted_pywb_format(tmp_path):
    with WarcPageStore(tmp_path, prefix="crawl") as store:
        urls = ["http://b.test/z", "http://a.test/", "https://www.c.test:8443/x?q=1", "http://a.test/a"]
        for n, url in enumerate(urls):
            store.store(**page(n, url=url))
        name = store.current_file
    index = tmp_path / (name[: -len(".warc.gz")] + ".cdxj")
    lines = index.read_text().splitlines()
    assert lines == sorted(lines) and len(lines) == 4
    key, timestamp, blob = lines[0].split(" ", 2)
    fields = json.loads(blob)
    assert key == "test,a)/" and timestamp == "20231114221321"
    assert fields["url"] == "http://a.test/" and fields["status"] == "200" and fields["mime"] == "text/html"
    assert fields["filename"] == name and int(fields["length"]) > 0
    assert [line.split(" ", 1)[0] for line in lines] == ["test,a)/", "test,a)/a", "test,b)/z", "test,c:8443)/x?q=1"]
    assert not list(tmp_path.glob("*.open"))


def test_surt_keys():
    assert surt("http://www.Example.com/A?b=2&a=1") == "com,example)/a?a=1&b=2"
    assert surt("https://example.com:443/") == "com,example)/"
    assert surt("http://example.com:8080") == "com,example:8080)/"
    assert surt("http://www2.sub.example.org/x") == "org,example,sub)/x"


def test_rotation_by_size(tmp_path):
    with WarcPageStore(tmp_path, max_file_bytes=20_000) as store:
        for n in range(40):
            store.store(**page(n, size=3000 + n))  # about 1 KB per page once gzipped
    warcs = sorted(tmp_path.glob("*.warc.gz"))
    assert len(warcs) >= 2
    seen = []
    for warc in warcs:
        assert warc.stat().st_size < 20_000 + 5_000
        records = read_records(warc)
        assert records[0][0] == "warcinfo"
        seen += [r[1].get_header("WARC-Target-URI") for r in records if r[0] == "response"]
        assert (warc.with_name(warc.name[: -len(".warc.gz")] + ".cdxj")).exists()
    assert seen == [page(n)["url"] for n in range(40)]
    with WarcPageStore(tmp_path, max_file_bytes=20_000) as again:
        for n in (0, 39):
            [(filename, _o, _l)] = again.lookup(page(n)["url"])
            assert filename in {w.name for w in warcs}


def test_leftover_from_a_kill_is_cut_and_indexed(tmp_path):
    store = WarcPageStore(tmp_path)
    for n in range(3):
        store.store(**page(n))
    name = store.current_file
    warc_path = tmp_path / name
    whole = warc_path.stat().st_size
    # simulate kill -9 in the middle of the next page: a torn record and a torn index line
    store._warc.write(b"\x1f\x8b\x08\x00garbage-of-a-torn-record")
    store._index.write(b'com,example)/p/3 20231114 {"url": "http:')
    store._warc.close()  # the process dies: the files stay as they are, nothing is finished
    store._index.close()
    assert warc_path.stat().st_size > whole

    with WarcPageStore(tmp_path) as reopened:
        assert warc_path.stat().st_size == whole
        assert not list(tmp_path.glob("*.cdxj.open"))
        assert len(reopened.lookup(page(2)["url"])) == 1
        reopened.store(**page(9))
        assert reopened.current_file != name
    assert [r[0] for r in read_records(warc_path)].count("response") == 3


def test_unwritable_directory_is_storage_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageError, match="cannot use page store"):
        WarcPageStore(blocker / "warc")


def test_null_store_and_factory(tmp_path):
    null = open_page_store("none", tmp_path / "unused")
    assert isinstance(null, NullPageStore)
    null.store(**page(1))
    assert null.pages == 1 and null.body_bytes == len(page(1)["body"]) and null.lookup(page(1)["url"]) == []
    assert not (tmp_path / "unused").exists()
    with open_page_store("warc", tmp_path / "w", max_file_bytes=1 << 20) as warc:
        assert isinstance(warc, WarcPageStore) and warc.max_file_bytes == 1 << 20
    with pytest.raises(ValueError, match="unknown page store 'tar'"):
        open_page_store("tar", tmp_path)


CHILD_FULL_DISK = """
import resource, signal, sys
from storage import StorageError, WarcPageStore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
store = WarcPageStore(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
stored = 0
try:
    for n in range(10_000):
        store.store(url=f"http://h.test/{n}", request_headers=[], status=200, reason="OK",
                    response_headers=[("Content-Type", "text/plain")], body=bytes(range(256)) * 40, ip=None,
                    fetched_at=1_700_000_000.0 + n)
        stored += 1
except StorageError as exc:
    print(stored)
    print(exc)
    try:
        store.store(url="http://h.test/again", request_headers=[], status=200, reason="OK",
                    response_headers=[], body=b"x", ip=None, fetched_at=1_700_000_000.0)
    except StorageError as again:
        print(again)
store.close()
"""


def test_full_disk_stops_the_warc_store_and_the_next_start_repairs_it(tmp_path):
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", CHILD_FULL_DISK, str(tmp_path)], check=False,
                            capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(root)})
    assert result.returncode == 0, result.stderr
    stored_line, message, again = result.stdout.strip().split("\n")
    stored = int(stored_line)
    assert stored > 0 and message.startswith(f"cannot write WARC in {tmp_path}: ") and again == message
    with WarcPageStore(tmp_path) as store:
        assert len(store.lookup(f"http://h.test/{stored - 1}")) == 1
    [warc] = tmp_path.glob("*.warc.gz")
    responses = [r for r in read_records(warc) if r[0] == "response"]
    assert len(responses) == stored  # the torn page was cut off; every stored one reads back whole
    assert responses[-1][3] == bytes(range(256)) * 40
