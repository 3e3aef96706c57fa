"""Page store: WARC 1.1 records read back with warcio, rotation, CDXJ index and lookups, crash leftovers."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from warcio.archiveiterator import ArchiveIterator

from storage import NullPageStore, StorageError, WarcPageStore, build_page_records, open_page_store, surt
from storage._cdxj import cdxj_line, parse_cdxj_line

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


# --- the hand-built records, read by warcio with digests verified ---

def read_checked(path: Path) -> list:
    """Every record of a WARC with warcio verifying block and payload digests, plus its offset and length."""
    out = []
    with open(path, "rb") as fh:
        it = ArchiveIterator(fh, check_digests=True)
        for record in it:
            content = record.content_stream().read()
            it.read_to_end(record)
            assert record.digest_checker.passed is True, (record.rec_type, record.digest_checker.problems)
            out.append((record.rec_type, record.rec_headers, record.http_headers, content,
                        it.get_record_offset(), it.get_record_length()))
    return out


def test_warcio_verifies_every_digest_and_reads_identical_payloads(tmp_path):
    pages = [
        page(1),
        page(2, body=b"", response_headers=[("Content-Length", "0")], status=204, reason="No Content"),
        page(3, body=bytes(range(256)) * 50, response_headers=[("Content-Type", "application/octet-stream")]),
        page(4, response_headers=[("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked")], ip=None),
        page(5, reason="", response_headers=[("X-Name", "caf\u00e9")]),  # latin-1 text from the wire
        page(6, body=b"\r\n\r\nWARC/1.1\r\nnot a record\r\n\r\n"),
    ]
    with WarcPageStore(tmp_path) as store:
        for p in pages:
            store.store(**p)
        name = store.current_file
    records = read_checked(tmp_path / name)
    with open(tmp_path / name, "rb") as fh:  # "raise": a digest that does not verify raises
        assert sum(len(r.content_stream().read()) >= 0 for r in ArchiveIterator(fh, check_digests="raise")) == 13
    assert [r[0] for r in records] == ["warcinfo"] + ["response", "request"] * len(pages)
    info = records[0][1]
    assert info.get_header("WARC-Filename") == name
    assert info.get_header("WARC-Date") == "2023-11-14T22:13:21.500000Z"  # the first page's time
    assert records[0][3] == b"software: peercrawl\r\nformat: WARC File Format 1.1\r\n"
    ids = set()
    for n, p in enumerate(pages):
        _t, resp, http, body, _o, _l = records[1 + 2 * n]
        _t, req, req_http, req_body, _o, _l = records[2 + 2 * n]
        assert body == p["body"] and req_body == b""
        assert resp.protocol == req.protocol == "WARC/1.1"
        assert resp.get_header("Content-Type") == "application/http; msgtype=response"
        assert req.get_header("Content-Type") == "application/http; msgtype=request"
        assert resp.get_header("WARC-Target-URI") == req.get_header("WARC-Target-URI") == p["url"]
        assert resp.get_header("WARC-Date") == req.get_header("WARC-Date")
        assert resp.get_header("WARC-IP-Address") == req.get_header("WARC-IP-Address") == p["ip"]
        assert req.get_header("WARC-Concurrent-To") == resp.get_header("WARC-Record-ID")
        for rec in (resp, req):
            record_id = rec.get_header("WARC-Record-ID")
            assert record_id.startswith("<urn:uuid:") and record_id[24] == "4" and record_id not in ids
            ids.add(record_id)
        assert http.get_statuscode() == str(p["status"])
        assert http.get_header("Transfer-Encoding") is None
        assert req_http.get_header("Host") == "www.example.com"
        assert req_http.statusline.endswith(" HTTP/1.1")
    assert records[9][2].get_header("X-Name") == "caf\u00e9"
    assert records[9][2].protocol == "HTTP/1.1" and records[9][2].statusline == "200"


def test_a_payload_digest_the_caller_computed_is_written_as_given(tmp_path):
    """The crawler hashes a page's body once (for its revisit schedule, the payload's original and its crawl-log
    record) and hands the digest on: the store writes that one, not one of its own, in the record, the CDXJ line
    and the built page; a correct one verifies as the store's own would."""
    from storage import payload_digest

    p = page(1)
    right = payload_digest(p["body"])
    foreign = payload_digest(b"another payload")
    built = build_page_records(compress_level=1, payload_digest=foreign, **p)
    assert built.digest == foreign and built.cdxj is not None and f"\"digest\": \"{foreign}\"" in built.cdxj[0]
    with WarcPageStore(tmp_path / "given") as store:
        store.store(payload_digest=right, **p)
        given_name = store.current_file
    with WarcPageStore(tmp_path / "own") as store:
        store.store(**p)
        own_name = store.current_file
    given, own = read_checked(tmp_path / "given" / given_name), read_checked(tmp_path / "own" / own_name)
    assert given[1][1].get_header("WARC-Payload-Digest") == own[1][1].get_header("WARC-Payload-Digest") == f"sha1:{right}"
    with open(tmp_path / "given" / given_name, "rb") as fh:  # the given digest verifies
        assert sum(1 for r in ArchiveIterator(fh, check_digests="raise") if r.content_stream().read() is not None) == 3
    assert (tmp_path / "given" / given_name.replace(".warc.gz", ".cdxj")).read_text().count(right) == 1


def test_cdxj_lines_point_at_the_offsets_and_lengths_warcio_finds(tmp_path):
    with WarcPageStore(tmp_path, max_file_bytes=6_000) as store:
        for n in range(30):
            store.store(**page(n, size=500 + 97 * n, url=f"http://h{n % 4}.test/p/{n}"))
    warcs = sorted(tmp_path.glob("*.warc.gz"))
    assert len(warcs) >= 2
    checked = 0
    for warc in warcs:
        found = {r[1].get_header("WARC-Target-URI"): r for r in read_checked(warc) if r[0] == "response"}
        lines = (warc.with_name(warc.name[: -len(".warc.gz")] + ".cdxj")).read_text().splitlines()
        assert len(lines) == len(found)
        for line in lines:
            key, _ts, blob = line.split(" ", 2)
            fields = json.loads(blob)
            _t, rec, _h, body, offset, length = found[fields["url"]]
            assert key == surt(fields["url"]) and fields["filename"] == warc.name
            assert (int(fields["offset"]), int(fields["length"])) == (offset, length)
            assert "sha1:" + fields["digest"] == rec.get_header("WARC-Payload-Digest")
            with open(warc, "rb") as fh:  # the slice alone is one whole response record
                fh.seek(offset)
                [(rec_type, uri, payload)] = [
                    (r.rec_type, r.rec_headers.get_header("WARC-Target-URI"), r.content_stream().read())
                    for r in ArchiveIterator(io.BytesIO(fh.read(length)), check_digests="raise")]
            assert (rec_type, uri, payload) == ("response", fields["url"], body)
            checked += 1
    assert checked == 30


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.binary(max_size=3000),
    status=st.integers(100, 599),
    reason=st.text(st.characters(min_codepoint=32, max_codepoint=255, exclude_characters="\x7f"), max_size=20),
    headers=st.lists(st.tuples(st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True),
                               st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40)),
                     max_size=6),
    level=st.sampled_from([0, 1, 6, 9]),
)
def test_any_page_reads_back_with_verified_digests(tmp_path_factory, body, status, reason, headers, level):
    directory = tmp_path_factory.mktemp("warc")
    with WarcPageStore(directory, compress_level=level) as store:
        store.store(**page(1, body=body, status=status, reason=reason, response_headers=headers))
        name = store.current_file
    [_info, (_t, _rec, http, payload, _o, _l), (_t2, _req, _rh, req_body, _o2, _l2)] = read_checked(directory / name)
    assert payload == body and req_body == b""
    assert http.get_statuscode() == str(status)
    assert [(k, v) for k, v in http.headers] == [(k, v.strip()) for k, v in headers if k.lower() != "transfer-encoding"]


def test_line_breaks_in_a_record_field_are_the_callers_error(tmp_path):
    with WarcPageStore(tmp_path) as store:
        with pytest.raises(ValueError, match="URL contains a line break"):
            store.store(**page(1, url="http://a.test/x\r\nWARC-Type: evil"))
        with pytest.raises(ValueError, match="response header contains a line break"):
            store.store(**page(2, response_headers=[("X-A", "1\r\nX-B: 2")]))
        with pytest.raises(ValueError, match="request header contains a line break"):
            store.store(**page(3, request_headers=[("X-A\n", "1")]))
        store.store(**page(4))
        name = store.current_file
        assert store.pages == 1
    assert [r[0] for r in read_checked(tmp_path / name)] == ["warcinfo", "response", "request"]


class ShortWrites:
    """An unbuffered file that takes at most `chunk` bytes per write, as the OS may near a size limit."""

    def __init__(self, fh, chunk: int) -> None:
        self.fh, self.chunk, self.name, self.calls = fh, chunk, fh.name, 0

    def write(self, data) -> int:
        self.calls += 1
        return self.fh.write(data[: self.chunk])

    def __getattr__(self, attr):
        return getattr(self.fh, attr)


def test_short_writes_are_continued_and_no_progress_is_a_storage_error(tmp_path):
    store = WarcPageStore(tmp_path)
    store.store(**page(1))
    before = (tmp_path / store.current_file).stat().st_size
    store._warc = ShortWrites(store._warc, 100)
    store.store(**page(2, size=5000))
    grown = (tmp_path / store.current_file).stat().st_size - before
    assert grown > 300 and store._warc.calls == -(-grown // 100)  # one call per 100 bytes, all of them kept
    store._warc.chunk = 0
    with pytest.raises(StorageError, match=f"cannot write WARC in {tmp_path}: no progress writing"):
        store.store(**page(3))
    name = store.current_file
    store.close()
    with WarcPageStore(tmp_path) as again:
        assert [len(again.lookup(page(n)["url"])) for n in (1, 2, 3)] == [1, 1, 0]
    bodies = [r[3] for r in read_checked(tmp_path / name) if r[0] == "response"]
    assert bodies == [page(1)["body"], page(2, size=5000)["body"]]


def test_pages_stored_from_several_threads_are_whole_and_indexed(tmp_path):
    """store() from four threads at once (the node's --page-threads): every record verifies, pairs stay
    adjacent, and every CDXJ line points at its own response, across rotations."""
    import threading

    with WarcPageStore(tmp_path, max_file_bytes=60_000) as store:
        def work(k: int) -> None:
            for n in range(k, 200, 4):
                store.store(**page(n, size=300 + 41 * n, url=f"http://h{n % 7}.test/p/{n}"))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.pages == 200
    urls = []
    for warc in sorted(tmp_path.glob("*.warc.gz")):
        records = read_checked(warc)
        kinds = [r[0] for r in records]
        assert kinds == ["warcinfo"] + ["response", "request"] * ((len(kinds) - 1) // 2)
        for resp, req in zip(records[1::2], records[2::2], strict=True):
            assert req[1].get_header("WARC-Concurrent-To") == resp[1].get_header("WARC-Record-ID")
        found = {r[1].get_header("WARC-Target-URI"): r for r in records if r[0] == "response"}
        for line in warc.with_name(warc.name[: -len(".warc.gz")] + ".cdxj").read_text().splitlines():
            fields = json.loads(line.split(" ", 2)[2])
            assert (int(fields["offset"]), int(fields["length"])) == found[fields["url"]][4:6]
            urls.append(fields["url"])
    assert sorted(urls) == sorted(f"http://h{n % 7}.test/p/{n}" for n in range(200))


def test_records_built_elsewhere_index_as_records_built_here(tmp_path):
    """A page worker makes the index line without its place (`BuiltPage.cdxj`); the writer's join gives the
    line `cdxj_line` gives at that place, so the index is the same whichever side made the line."""
    pages = [page(n, size=400 + 97 * n, url=f"http://h{n % 3}.test/p/{n}?b=2&a=1", truncated=n % 5 == 0)
             for n in range(12)]
    records = {p["url"]: build_page_records(compress_level=1, **p) for p in pages}
    with WarcPageStore(tmp_path, max_file_bytes=6_000) as store:
        for n, p in enumerate(pages):
            built = records[p["url"]]
            assert built.cdxj is not None
            if n % 2:
                built = built._replace(cdxj=None)  # the writer makes the whole line
            store.store_built(url=p["url"], status=p["status"], fetched_at=p["fetched_at"], built=built,
                              truncated=p["truncated"])
    lines = [line + "\n" for f in sorted(tmp_path.glob("*.cdxj")) for line in f.read_text().splitlines()]
    assert len(lines) == 12 and len(list(tmp_path.glob("*.cdxj"))) >= 2
    for line in lines:
        entry = parse_cdxj_line(line)
        built = records[entry.url]
        assert line == cdxj_line(entry)
        assert (entry.length, entry.digest, entry.mime) == (len(built.response), built.digest, built.mime)
        assert entry.truncated == (int(entry.url.split("/p/")[1].split("?")[0]) % 5 == 0)
