"""A body cut at the size limit is stored marked as cut: `WARC-Truncated: length` in the record (read back with
warcio, digests verified) and `"truncated": "length"` in its CDXJ line; a whole body carries neither."""

from __future__ import annotations

import json
from pathlib import Path

from storage import WarcPageStore
from storage._cdxj import parse_cdxj_line
from tests.test_storage_pages import page, read_checked


def test_a_cut_body_is_marked_in_the_record_and_the_index(tmp_path: Path) -> None:
    with WarcPageStore(tmp_path) as store:
        store.store(**page(1), truncated=True)
        store.store(**page(2))
        name = store.current_file
    assert name is not None
    records = [r for r in read_checked(tmp_path / name) if r[0] == "response"]
    assert [r[1].get_header("WARC-Truncated") for r in records] == ["length", None]
    lines = (tmp_path / (name[: -len(".warc.gz")] + ".cdxj")).read_text().splitlines()
    by_url = {json.loads(line.split(" ", 2)[2])["url"]: line for line in lines}
    cut, whole = by_url[page(1)["url"]], by_url[page(2)["url"]]
    assert json.loads(cut.split(" ", 2)[2])["truncated"] == "length"
    assert "truncated" not in json.loads(whole.split(" ", 2)[2])
    assert parse_cdxj_line(cut).truncated is True and parse_cdxj_line(whole).truncated is False
