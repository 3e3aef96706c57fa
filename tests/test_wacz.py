"""`peerctl export --wacz` packs a crawl into a WACZ 1.1.1 file, checked two ways:

- against the parts the WACZ 1.1.1 specification requires (webrecorder/specs, wacz/1.1.1): a ZIP whose
  `archive/` holds the WARC files stored uncompressed, whose `indexes/` holds CDXJ lines that point at the
  records they name, whose `pages/pages.jsonl` lists pages with `url` and an RFC 3339 `ts` after its header
  line, with a `datapackage.json` (profile `data-package`, `wacz_version`, every other file's path, size and
  hash) and a `datapackage-digest.json` holding the manifest's hash;
- by the `wacz` package's own validator (`wacz validate`), from the replay tools' virtualenv
  (tests/support/replaytools.py); that part is skipped where it is not installed, the first never.

The crawls: one node, then a second one into another data dir, of a small local web with mirrored documents
(some records are revisits of another URL's payload).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from peer.cli.main import peerctl_main
from peer.node import Node
from peerlab.localweb.graph import SiteGraph
from storage._cdxj import parse_cdxj_line

from .support.crawl import node_config, start_local_web
from .support.replaytools import replay_tool

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture(scope="module")
def crawls(tmp_path_factory) -> tuple[Path, Path, SiteGraph]:
    """Two nodes' data dirs, each with a crawl of the same small web."""
    root = tmp_path_factory.mktemp("wacz-crawls")
    graph = SiteGraph.generate(seed=29, hosts=4, pages_per_host=4, features=False, mirrored=2)

    async def crawl() -> None:
        async with trio.open_nursery() as nursery:
            web, dns = await start_local_web(nursery, graph)
            for name in ("a", "b"):
                with trio.fail_after(60):
                    await Node(node_config(root / name, web, dns, node_id=name)).run()
            nursery.cancel_scope.cancel()

    trio.run(crawl)
    return root / "a", root / "b", graph


def check_wacz(path: Path) -> dict:
    """The specification's required parts, checked; what the WACZ holds (for the test's own assertions)."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        assert "datapackage.json" in names and "datapackage-digest.json" in names
        package = json.loads(zf.read("datapackage.json"))
        assert package["profile"] == "data-package" and package["wacz_version"] == "1.1.1"
        digest = json.loads(zf.read("datapackage-digest.json"))
        assert digest == {"path": "datapackage.json",
                          "hash": "sha256:" + hashlib.sha256(zf.read("datapackage.json")).hexdigest()}
        listed = {r["path"]: r for r in package["resources"]}
        assert set(listed) == set(names) - {"datapackage.json", "datapackage-digest.json"}
        for name, resource in listed.items():
            data = zf.read(name)
            assert resource["bytes"] == len(data) and resource["hash"] == "sha256:" + hashlib.sha256(data).hexdigest()
        warcs = [n for n in names if n.startswith("archive/")]
        assert warcs and all(n.endswith(".warc.gz") for n in warcs)
        # already compressed: stored, so a reader can range-request a record inside the ZIP
        assert all(zf.getinfo(n).compress_type == zipfile.ZIP_STORED for n in warcs)
        indexes = [n for n in names if n.startswith("indexes/")]
        assert indexes
        lines = [line for n in indexes for line in zf.read(n).decode("utf-8").splitlines()]
        assert lines == sorted(lines)
        entries = [parse_cdxj_line(line) for line in lines]
        archives = {n[len("archive/"):]: zf.read(n) for n in warcs}
        for e in entries:  # each line names the record at its offset
            record = next(iter(ArchiveIterator(io.BytesIO(archives[e.filename][e.offset:e.offset + e.length]))))
            assert record.rec_headers.get_header("WARC-Target-URI") == e.url
            assert record.rec_type == ("revisit" if e.mime == "warc/revisit" else "response")
        pages = zf.read("pages/pages.jsonl").decode("utf-8").splitlines()
        assert json.loads(pages[0])["format"] == "json-pages-1.0"
        listed_pages = [json.loads(line) for line in pages[1:]]
        assert listed_pages and all(p["url"] and RFC3339.match(p["ts"]) for p in listed_pages)
    return {"entries": entries, "pages": listed_pages, "warcs": warcs}


def wacz_validate(path: Path) -> None:
    tool = replay_tool("wacz")
    if tool is None:
        return
    done = subprocess.run([str(tool), "validate", "-f", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Validation succeeded" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow  # the wacz validator takes seconds
def test_a_nodes_crawl_packs_into_a_valid_wacz(crawls, tmp_path, capsys) -> None:
    a, _b, graph = crawls
    out = tmp_path / "crawl.wacz"
    assert peerctl_main(["export", "--wacz", str(out), "--data-dir", str(a)]) == 0
    said = capsys.readouterr().out
    held = check_wacz(out)
    index = [parse_cdxj_line(line) for p in sorted((a / "warc").glob("*.cdxj"))
             for line in p.read_text().splitlines()]
    assert sorted(e.url for e in held["entries"]) == sorted(e.url for e in index)
    assert any(e.mime == "warc/revisit" for e in held["entries"])  # the mirrored documents' copies
    assert f"{len(index)} captures" in said
    wacz_validate(out)


@pytest.mark.slow  # the crawls of the module's fixture
def test_two_data_dirs_pack_into_one_wacz(crawls, tmp_path) -> None:
    a, b, _graph = crawls
    out = tmp_path / "cluster.wacz"
    assert peerctl_main(["export", "--wacz", str(out), "--data-dir", str(a), "--data-dir", str(b)]) == 0
    held = check_wacz(out)
    per_dir = [sum(1 for p in (d / "warc").glob("*.cdxj") for _ in p.read_text().splitlines()) for d in (a, b)]
    assert len(held["entries"]) == sum(per_dir)
    assert {w.split("/", 1)[1].split("-", 1)[0] for w in held["warcs"]} == {"a", "b"}  # told apart by node


@pytest.mark.slow  # the wacz validator takes seconds
def test_one_host_packs_its_captures_and_the_originals_its_revisits_refer_to(crawls, tmp_path) -> None:
    a, _b, graph = crawls
    index = [parse_cdxj_line(line) for p in sorted((a / "warc").glob("*.cdxj"))
             for line in p.read_text().splitlines()]
    # a host whose mirrored copies are revisits of another host's payload
    revisit = next(e for e in index if e.mime == "warc/revisit")
    host = revisit.url.split("/")[2].split(":")[0]
    out = tmp_path / "host.wacz"
    assert peerctl_main(["export", "--wacz", str(out), "--data-dir", str(a), "--host", host]) == 0
    held = check_wacz(out)
    own = [e for e in held["entries"] if e.url.split("/")[2].split(":")[0] == host]
    assert sorted(e.url for e in own) == sorted(e.url for e in index if e.url.split("/")[2].split(":")[0] == host)
    others = [e for e in held["entries"] if e not in own]
    revisit_digests = {e.digest for e in own if e.mime == "warc/revisit"}
    assert others and {e.digest for e in others} == revisit_digests  # only the originals, nothing else
    assert all(e.mime != "warc/revisit" for e in others)
    wacz_validate(out)


def test_an_export_with_nothing_to_pack_is_one_clear_error(tmp_path, capsys) -> None:
    (tmp_path / "empty" / "warc").mkdir(parents=True)
    assert peerctl_main(["export", "--wacz", str(tmp_path / "x.wacz"), "--data-dir", str(tmp_path / "empty")]) == 2
    assert "nothing to pack" in capsys.readouterr().err
    assert peerctl_main(["export", "--wacz", str(tmp_path / "x.wacz"), "--data-dir", str(tmp_path / "nowhere")]) == 2
    assert "not a node's data dir" in capsys.readouterr().err
    assert not (tmp_path / "x.wacz").exists()
