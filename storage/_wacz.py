"""A crawl packed into one WACZ 1.1.1 file (Web Archive Collection Zipped: the WARC files, a CDXJ index, a list of
pages and a manifest with every file's SHA-256, in a ZIP that replay tools read by range requests).

`pack_wacz` reads one or more nodes' data dirs (their `warc/` directory: closed WARC files and their sorted
`.cdxj` indexes) and writes:

- `archive/*.warc.gz`: the WARC files as they are, stored (not compressed again), or with `host`, one new WARC
  file of that host's records (each response or revisit record with the request record written after it)
  and of the originals its revisit records refer to, wherever they are;
- `indexes/index.cdxj`: the nodes' index lines, merged and sorted (their file names and offsets those of the
  archive's files);
- `pages/pages.jsonl`: one page per HTML capture (2xx response or revisit record): URL, time, MIME, status;
- `datapackage.json` (profile `data-package`, `wacz_version` 1.1.1, every file's path, size and SHA-256) and
  `datapackage-digest.json` (the manifest's SHA-256).

A WARC file still being written (its index ends in `.cdxj.open`) is left out and named in the report: its tail
may be a record half written. Reading and writing are streamed; memory holds the index lines.
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO
from urllib.parse import urlsplit

from ._cdxj import CdxjEntry, cdxj_line, parse_cdxj_line

__all__ = ["WACZ_VERSION", "WaczReport", "pack_wacz"]

WACZ_VERSION = "1.1.1"
_CHUNK = 1 << 20
_PAGE_MIMES = ("text/html", "application/xhtml+xml")


@dataclass(slots=True)
class WaczReport:
    """What a WACZ holds: its WARC files, index lines, pages and bytes; the WARC files left out (still open)."""

    path: Path
    warc_files: int = 0
    records: int = 0
    pages: int = 0
    bytes: int = 0
    skipped_open: list[str] = field(default_factory=list)


class _Hashing:
    """A writable ZIP member that counts and hashes what goes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.sha.update(data)
        self.size += len(data)


def _member(zf: zipfile.ZipFile, name: str, stored: bool, now: float) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=time.gmtime(now)[:6])
    info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def _rfc3339(timestamp: str) -> str:
    t = timestamp
    return f"{t[0:4]}-{t[4:6]}-{t[6:8]}T{t[8:10]}:{t[10:12]}:{t[12:14]}Z"


def _host(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def _record_end(fh: BinaryIO, start: int) -> int:
    """The offset after the one gzip member that starts at `start` (a record, written as one member)."""
    fh.seek(start)
    decomp = zlib.decompressobj(wbits=31)
    pos = start
    while not decomp.eof:
        data = fh.read(64 * 1024)
        if not data:
            raise ValueError(f"a record at offset {start} of {getattr(fh, 'name', '?')} is cut short")
        decomp.decompress(data)
        pos += len(data)
    return pos - len(decomp.unused_data)


def _copy(src: BinaryIO, start: int, length: int, out: _Hashing) -> None:
    src.seek(start)
    left = length
    while left:
        data = src.read(min(_CHUNK, left))
        if not data:
            raise ValueError(f"{getattr(src, 'name', '?')} ends before offset {start + length}")
        out.write(data)
        left -= len(data)


def _inputs(data_dirs: Sequence[Path],
            report: WaczReport) -> list[tuple[Path, str, list[tuple[str, CdxjEntry]]]]:
    """(WARC path, its name in the archive, its index lines and entries) of every closed WARC file of the data
    dirs."""
    found = []
    names: set[str] = set()
    for data_dir in data_dirs:
        warc_dir = data_dir / "warc"
        if not warc_dir.is_dir():
            raise FileNotFoundError(f"{data_dir} holds no warc/ directory: not a node's data dir")
        report.skipped_open += [str(p) for p in sorted(warc_dir.glob("*.cdxj.open"))]
        for index in sorted(warc_dir.glob("*.cdxj")):
            warc = index.with_name(index.name[: -len(".cdxj")] + ".warc.gz")
            if not warc.exists():
                continue
            name = warc.name if len(data_dirs) == 1 else f"{data_dir.name}-{warc.name}"
            if name in names:  # two data dirs of one name: told apart by their place in the list
                name = f"{len(names)}-{name}"
            names.add(name)
            with open(index, encoding="utf-8") as fh:
                entries = [(line if line.endswith("\n") else line + "\n", parse_cdxj_line(line))
                           for line in fh if line.strip()]
            found.append((warc, name, entries))
    return found


def pack_wacz(data_dirs: Iterable[str | Path], out: str | Path, *, host: str | None = None,
              title: str | None = None, software: str = "peercrawl", now: float | None = None) -> WaczReport:
    """Pack the crawl held in `data_dirs` (or, with `host`, that host's pages) into the WACZ file `out`."""
    dirs = [Path(d) for d in data_dirs]
    if not dirs:
        raise ValueError("no data dir to pack")
    now = time.time() if now is None else now
    out = Path(out)
    report = WaczReport(path=out)
    inputs = _inputs(dirs, report)
    resources: list[dict[str, Any]] = []
    lines: list[tuple[str, CdxjEntry]] = []
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", allowZip64=True) as zf:
        def add(name: str, stored: bool, writer: Callable[[_Hashing], None]) -> None:
            with zf.open(_member(zf, name, stored, now), "w", force_zip64=True) as raw:
                sink = _Hashing(raw)
                writer(sink)
            resources.append({"name": name.rsplit("/", 1)[-1].lower(), "path": name,
                              "hash": "sha256:" + sink.sha.hexdigest(), "bytes": sink.size})
            report.bytes += sink.size

        if host is None:
            for warc, name, entries in inputs:
                def whole(sink: _Hashing, warc: Path = warc) -> None:
                    with open(warc, "rb") as fh:
                        while data := fh.read(_CHUNK):
                            sink.write(data)

                add(f"archive/{name}", True, whole)
                report.warc_files += 1
                if name == warc.name:
                    lines += entries
                else:
                    lines += [(cdxj_line(e._replace(filename=name)), e) for _line, e in entries]
        else:
            wanted = host.lower()
            chosen = [(warc, e) for warc, _name, entries in inputs for _l, e in entries if _host(e.url) == wanted]
            # the originals the host's revisit records refer to (by payload digest), wherever they are
            digests = {e.digest for _w, e in chosen if e.mime == "warc/revisit"}
            have = {e.digest for _w, e in chosen if e.mime != "warc/revisit"}
            originals: dict[str, tuple[Path, CdxjEntry]] = {}
            for warc, _name, entries in inputs:
                for _l, e in entries:
                    if e.digest in digests and e.digest not in have and e.mime != "warc/revisit":
                        originals.setdefault(e.digest, (warc, e))
            chosen += list(originals.values())
            name = f"{wanted}.warc.gz"
            rewritten: list[CdxjEntry] = []

            def records(sink: _Hashing) -> None:
                handles: dict[Path, BinaryIO] = {}
                try:
                    for warc, e in chosen:
                        fh = handles.get(warc)
                        if fh is None:
                            fh = handles[warc] = open(warc, "rb")  # noqa: SIM115 - closed below
                        offset = sink.size
                        end = _record_end(fh, e.offset + e.length)  # the request record after it
                        _copy(fh, e.offset, end - e.offset, sink)
                        rewritten.append(e._replace(filename=name, offset=offset))
                finally:
                    for fh in handles.values():
                        fh.close()

            if chosen:
                add(f"archive/{name}", True, records)
                report.warc_files = 1
            lines = [(cdxj_line(e), e) for e in rewritten]
        if not lines:
            raise ValueError(f"nothing to pack: no closed WARC file{' with pages of ' + host if host else ''} "
                             f"in {', '.join(map(str, dirs))}")
        lines.sort()
        report.records = len(lines)
        add("indexes/index.cdxj", False, lambda sink: sink.write("".join(line for line, _e in lines).encode("utf-8")))
        pages = [json.dumps({"format": "json-pages-1.0", "id": "pages", "title": "All Pages"})]
        for _line, e in lines:
            if (e.mime in _PAGE_MIMES or e.mime == "warc/revisit") and 200 <= e.status < 300:
                page_id = hashlib.sha256(f"{e.url} {e.timestamp}".encode()).hexdigest()[:16]
                pages.append(json.dumps({"id": page_id, "url": e.url, "ts": _rfc3339(e.timestamp),
                                         "mime": e.mime, "status": e.status}, ensure_ascii=False))
        report.pages = len(pages) - 1
        add("pages/pages.jsonl", False, lambda sink: sink.write(("\n".join(pages) + "\n").encode("utf-8")))
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        package = {
            "profile": "data-package",
            "wacz_version": WACZ_VERSION,
            "title": title or (f"peercrawl crawl of {host}" if host else "peercrawl crawl"),
            "description": f"{report.records} captures from {len(dirs)} node data dir(s)"
                           + (f", host {host}" if host else ""),
            "created": created,
            "modified": created,
            "software": software,
            "resources": resources,
        }
        manifest = json.dumps(package, indent=2).encode("utf-8")
        zf.writestr(_member(zf, "datapackage.json", False, now), manifest)
        digest = {"path": "datapackage.json", "hash": "sha256:" + hashlib.sha256(manifest).hexdigest()}
        zf.writestr(_member(zf, "datapackage-digest.json", False, now), json.dumps(digest, indent=2))
    tmp.replace(out)
    return report
