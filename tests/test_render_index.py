"""A rendered DOM's `conversion` record in the CDXJ index: the line pywb's own indexer writes for it (the page's
URL, the record's time, its MIME type and payload digest, no status: it is not a response), found by the
captures search `GET /cdx` runs, kept when its WARC file is finished even as the file's last record, and left
out of `lookup` (which names a URL's responses)."""

from __future__ import annotations

import json

from warcio.archiveiterator import ArchiveIterator

from storage import CaptureSearch, WarcPageStore, find_captures
from storage._cdxj import cdxj_line, parse_cdxj_line

T0 = 1_700_000_000.0
URL = "http://app.example/page.html"
DOM = b"<html><body><div id=app><a href=/made.html>made by a script</a></div></body></html>"


def pywb_line(record, filename: str, offset: int, length: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The fields pywb's indexer (`archiveindexer.DefaultRecordParser`, its CDXJ writer) gives a record that is
    not a response: status "-" and so no status field; the MIME type of its Content-Type before any ";"; the
    payload digest without its "sha1:"."""
    headers = record.rec_headers
    return {"url": headers.get_header("WARC-Target-URI"),
            "mime": headers.get_header("Content-Type").split(";")[0].strip(),
            "digest": headers.get_header("WARC-Payload-Digest").removeprefix("sha1:"),
            "length": str(length), "offset": str(offset), "filename": filename}


def test_a_rendered_dom_is_indexed_as_pywb_indexes_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with WarcPageStore(tmp_path) as store:
        body = b"<html><body><div id=app></div><script src=/app.js></script></body></html>"
        store.store(url=URL, request_headers=[("Host", "app.example")], status=200, reason="OK",
                    response_headers=[("Content-Type", "text/html")], body=body, ip="127.0.0.1", fetched_at=T0)
        # the file's last record: finishing the file keeps it
        store.store_conversion(url=URL, fetched_at=T0 + 2, body=DOM, content_type="text/html; charset=utf-8",
                               refers_to_date=T0)
        name = store.current_file
        assert name is not None
        assert store.pages == 1, "a conversion is not a page"
        assert len(store.lookup(URL)) == 1, "lookup names responses only"
    index = (tmp_path / name.replace(".warc.gz", ".cdxj")).read_text().splitlines()
    lines = [line for line in index if json.loads(line.split(" ", 2)[2])["url"] == URL]
    assert len(lines) == 2
    conversion = [line for line in lines if "status" not in json.loads(line.split(" ", 2)[2])]
    assert len(conversion) == 1
    key, timestamp, blob = conversion[0].split(" ", 2)
    fields = json.loads(blob)
    assert (key, timestamp) == ("example,app)/page.html", "20231114221322")
    # the line points at the record, and says of it what pywb's indexer says
    with open(tmp_path / name, "rb") as fh:
        fh.seek(int(fields["offset"]))
        record = next(iter(ArchiveIterator(fh)))
        assert record.rec_type == "conversion" and record.content_stream().read() == DOM
        assert fields == pywb_line(record, name, int(fields["offset"]), int(fields["length"]))
    # read back and written again (as a WACZ's index is): the same line
    entry = parse_cdxj_line(conversion[0])
    assert entry.status == 0 and entry.mime == "text/html"
    assert cdxj_line(entry) == conversion[0] + "\n"
    # what GET /cdx answers: the response and the rendered DOM, in time order
    found = find_captures(tmp_path, CaptureSearch.of(URL))
    assert [c.fields.get("status") for c in found] == ["200", None]
    assert [c.timestamp for c in found] == ["20231114221320", "20231114221322"]
