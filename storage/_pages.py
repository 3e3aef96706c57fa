"""Where fetched pages go: WARC 1.1 files with a CDXJ index, or nowhere (`--store warc|none`).

Each page is a response record and a request record, each its own gzip member (so any record can be read
from its offset alone), appended to a file that rotates at `max_file_bytes`. Every WARC gets a sidecar
`.cdxj` index readable by pywb. While a WARC is being written its index is `<name>.cdxj.open`, appended in
fetch order; when the file is closed (rotation, `close()`, or the next start after a crash) the index is
sorted into `<name>.cdxj` and the WARC is cut back to the end of its last indexed record, so a torn record
from a kill -9 never stays behind. Writes go straight to the OS (no user-space buffer): a stored page
survives kill -9 of the process; `sync()` forces the files to disk. The records are built by hand
(`_warc`), not by warcio, whose record building cost as much CPU as the compression.
"""

from __future__ import annotations

import glob
import os
import threading
import time
import zlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import BinaryIO, NamedTuple

from ._cdxj import CdxjEntry, cdxj_join, cdxj_line, cdxj_parts, parse_cdxj_line, surt, warc_timestamp
from ._closing import Closing
from ._errors import StorageError
from ._warc import conversion_record, exchange_records, gzip_member, revisit_records, warcinfo_record
from ._warc import payload_digest as _payload_digest

__all__ = ["BuiltPage", "NullPageStore", "PageStore", "WarcPageStore", "build_page_records", "open_page_store"]

_OPEN_SUFFIX = ".cdxj.open"
_WARC_SUFFIX = ".warc.gz"


class BuiltPage(NamedTuple):
    """One page's records, compressed and ready to append: what `build_page_records` makes, anywhere (a page
    worker process makes it; `PageStore.store_built` appends it in the node)."""

    response: bytes  # the response record as one gzip member
    request: bytes  # the request record as one gzip member
    digest: str  # the payload's base32 SHA-1 (the CDXJ `digest`)
    mime: str  # the CDXJ `mime`
    #: the index line without its place (`cdxj_parts`), made with the records so the writer only joins it;
    #: None: the writer makes the line (`cdxj_line`)
    cdxj: tuple[str, str] | None = None
    record_id: str = ""  # the response record's `WARC-Record-ID`


def build_page_records(*, url: str, request_headers: list[tuple[str, str]], status: int, reason: str,
                       response_headers: list[tuple[str, str]], body: bytes, ip: str | None, fetched_at: float,
                       truncated: bool = False, compress_level: int = 1, protocol: str = "http/1.1",
                       payload_digest: str | None = None) -> BuiltPage:
    """The stateless, CPU-heavy half of storing a page: its WARC records (SHA-1 digests of the body and of the
    heads) gzip-compressed. `payload_digest`: the body's, if the caller computed it already (`payload_digest`
    of storage), so it is not computed again. Pure: touches no file, so it may run in any thread or process."""
    records = exchange_records(url=url, request_headers=request_headers, status=status, reason=reason,
                               response_headers=response_headers, body=body, ip=ip, fetched_at=fetched_at,
                               truncated=truncated, protocol=protocol, digest=payload_digest)
    response = gzip_member(records.response, compress_level)
    mime = _mime(response_headers)
    index = cdxj_parts(url=url, timestamp=warc_timestamp(fetched_at), length=len(response), status=status,
                       mime=mime, digest=records.payload_digest, truncated=truncated)
    return BuiltPage(response=response, request=gzip_member((records.request,), compress_level),
                     digest=records.payload_digest, mime=mime, cdxj=index, record_id=records.record_id)


class PageStore(Closing, ABC):
    """Stores fetched pages. `pages` counts what was stored since this object was made."""

    pages: int = 0
    revisits: int = 0
    #: The gzip level of the records `build_page_records` must make for `store_built`; None: this store keeps
    #: no records, so there is nothing to build elsewhere (`store` is cheap).
    compress_level: int | None = None

    @abstractmethod
    def store(
        self,
        *,
        url: str,
        request_headers: list[tuple[str, str]],
        status: int,
        reason: str,
        response_headers: list[tuple[str, str]],
        body: bytes,
        ip: str | None,
        fetched_at: float,
        truncated: bool = False,
        protocol: str = "http/1.1",
        payload_digest: str | None = None,
    ) -> int:
        """Keep one fetched page; returns the bytes written. `body` is the payload as received (Content-Encoding
        not undone); `truncated` says it was cut at the size limit; `protocol` is what carried it (ALPN name);
        `payload_digest` is the body's base32 SHA-1 if the caller has it (None: the store computes it)."""

    def store_built(self, *, url: str, status: int, fetched_at: float, built: BuiltPage,
                    truncated: bool = False) -> int:
        """Keep one page whose records were built already (by `build_page_records` at this store's
        `compress_level`); returns the bytes written."""
        raise NotImplementedError(f"{type(self).__name__} keeps no built records")

    def last_record(self) -> tuple[str, int] | None:
        """The file and offset of the response record the calling thread wrote last (None: none, or a store
        without files)."""
        return None

    def last_record_id(self) -> str | None:
        """The `WARC-Record-ID` of the response record the calling thread wrote last (None: none, or not kept)."""
        return None

    def store_revisit(
        self,
        *,
        url: str,
        request_headers: list[tuple[str, str]],
        status: int,
        reason: str,
        response_headers: list[tuple[str, str]],
        ip: str | None,
        fetched_at: float,
        profile: str,
        payload_digest: str,
        refers_to_uri: str,
        refers_to_date: float,
        protocol: str = "http/1.1",
        refers_to: str = "",
    ) -> int:
        """Keep a revisit of a page stored before (WARC `revisit` record; `refers_to`: the original's record id,
        "" when not known); returns the bytes written."""
        return 0

    def store_conversion(self, *, url: str, fetched_at: float, body: bytes, content_type: str,
                         refers_to_date: float) -> int:
        """Keep what was made of a stored response (a rendered DOM: `conversion_record`), beside it in the same
        file, indexed as pywb's indexer indexes it (the page's URL, the record's time and MIME type, no status).
        Returns the bytes written."""
        return 0

    @abstractmethod
    def lookup(self, url: str) -> list[tuple[str, int, int]]:
        """Where a URL's response records are: (WARC file name, offset, length), oldest first."""

    def sync(self) -> None:
        """Force what was stored to the disk."""

    def close(self) -> None:
        """Finish the files; the store is unusable afterwards."""



class NullPageStore(PageStore):
    """Stores nothing; counts pages and body bytes (for `--store none` and benchmarks)."""

    def __init__(self) -> None:
        self.pages = 0
        self.body_bytes = 0

    def store(self, *, url: str, request_headers: list[tuple[str, str]], status: int, reason: str,
              response_headers: list[tuple[str, str]], body: bytes, ip: str | None, fetched_at: float,
              truncated: bool = False, protocol: str = "http/1.1", payload_digest: str | None = None) -> int:
        self.pages += 1
        self.body_bytes += len(body)
        return 0

    def lookup(self, url: str) -> list[tuple[str, int, int]]:
        return []


def _finish_index(directory: Path, open_index: Path) -> None:
    """Sort an `.open` index into its final `.cdxj` and cut its WARC back to the last indexed page."""
    lines = open_index.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    entries = []
    for line in lines:
        try:
            entries.append((line if line.endswith("\n") else line + "\n", parse_cdxj_line(line)))
        except (ValueError, KeyError):
            continue  # a line torn by a kill: its record is cut off below
    warc = directory / (open_index.name[: -len(_OPEN_SUFFIX)] + _WARC_SUFFIX)
    if not entries:
        warc.unlink(missing_ok=True)
        open_index.unlink()
        return
    if warc.exists():
        # keep the last indexed response and the request record after it, if that one is whole
        end = _end_of_members(warc, max(e.offset + e.length for _l, e in entries), limit=1)
        if warc.stat().st_size > end:
            os.truncate(warc, end)
    final = open_index.with_name(open_index.name[: -len(_OPEN_SUFFIX)] + ".cdxj")
    tmp = final.with_name(final.name + ".tmp")
    tmp.write_text("".join(line for line, _e in sorted(entries, key=lambda le: le[0])), encoding="utf-8")
    os.replace(tmp, final)
    open_index.unlink()


def _end_of_members(path: Path, start: int, *, limit: int) -> int:
    """The offset after up to `limit` complete gzip members that follow `start` back to back."""
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    pos = 0
    for _ in range(limit):
        if pos >= len(data):
            break
        decomp = zlib.decompressobj(wbits=31)
        try:
            decomp.decompress(data[pos:])
        except zlib.error:
            break
        if not decomp.eof:
            break
        pos = len(data) - len(decomp.unused_data)
    return start + pos


class WarcPageStore(PageStore):
    """WARC 1.1 files `<prefix>-<UTC time>-<serial>.warc.gz` in `directory`, each with a `.cdxj` index."""

    compress_level: int  # this store keeps records: always a level

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_file_bytes: int = 1 << 30,
        prefix: str = "peercrawl",
        compress_level: int = 1,
        recover_all: bool = True,
    ) -> None:
        """``recover_all``: finish every file a killed writer left open in `directory` (the node, which opens
        its store before any page worker starts); False: only those of this `prefix` (a page worker's own
        writer, started again while the node's and the other workers' files are being written)."""
        if max_file_bytes <= 0:
            raise ValueError(f"max_file_bytes must be positive, got {max_file_bytes}")
        if not 0 <= compress_level <= 9:
            raise ValueError(f"compress_level must be 0..9, got {compress_level}")
        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.prefix = prefix
        self.compress_level = compress_level
        self.pages = 0
        self._warc: BinaryIO | None = None
        self._index: BinaryIO | None = None
        self._name = ""
        self._size = 0
        self._serial = 0
        self._closed = False
        self._failure: StorageError | None = None  # after a failed write the files are left for recovery
        # store() may be called from several threads: records, digests and gzip (which release the GIL) run
        # in parallel, the file writes and the index line one thread at a time
        self._lock = threading.Lock()
        self._last = threading.local()  # where the calling thread's last response record went (last_record)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            mine = "*" if recover_all else f"{glob.escape(prefix)}-[0-9]*"  # not "<prefix>-p0-" for "<prefix>"
            for leftover in sorted(self.directory.glob(mine + _OPEN_SUFFIX)):
                _finish_index(self.directory, leftover)
        except OSError as exc:
            raise StorageError(f"cannot use page store at {self.directory}: {exc.strerror or exc}") from exc

    @property
    def current_file(self) -> str | None:
        """Name of the WARC being written, if any."""
        return self._name or None

    def _start_file(self, now: float) -> None:
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(now))
        while True:
            self._serial += 1
            name = f"{self.prefix}-{stamp}-{self._serial:05d}{_WARC_SUFFIX}"
            if not (self.directory / name).exists():
                break
        # both files live as long as this object: closed by _finish_file / close
        warc = open(self.directory / name, "xb", buffering=0)  # noqa: SIM115
        index_name = name[: -len(_WARC_SUFFIX)] + _OPEN_SUFFIX
        self._index = open(self.directory / index_name, "ab", buffering=0)  # noqa: SIM115
        self._warc, self._name, self._size = warc, name, 0
        info = warcinfo_record(name, now, {"software": "peercrawl", "format": "WARC File Format 1.1"})
        self._write(gzip_member((info,), self.compress_level))

    def _write(self, data: bytes) -> None:
        assert self._warc is not None
        _write_all(self._warc, data)
        self._size += len(data)

    def _finish_file(self) -> None:
        if self._warc is None or self._index is None:
            return
        warc, index, name = self._warc, self._index, self._name
        self._warc = self._index = None
        self._name = ""
        warc.close()
        index.close()
        _finish_index(self.directory, self.directory / (name[: -len(_WARC_SUFFIX)] + _OPEN_SUFFIX))

    def store(self, *, url: str, request_headers: list[tuple[str, str]], status: int, reason: str,
              response_headers: list[tuple[str, str]], body: bytes, ip: str | None, fetched_at: float,
              truncated: bool = False, protocol: str = "http/1.1", payload_digest: str | None = None) -> int:
        if self._closed:
            raise ValueError(f"page store at {self.directory} is closed")
        built = build_page_records(url=url, request_headers=request_headers, status=status, reason=reason,
                                   response_headers=response_headers, body=body, ip=ip, fetched_at=fetched_at,
                                   truncated=truncated, compress_level=self.compress_level, protocol=protocol,
                                   payload_digest=payload_digest)
        return self.store_built(url=url, status=status, fetched_at=fetched_at, built=built, truncated=truncated)

    def store_built(self, *, url: str, status: int, fetched_at: float, built: BuiltPage,
                    truncated: bool = False) -> int:
        """Append records built elsewhere (a page worker): the file write and the index line, under the lock,
        so a page is written once, whole, and indexed after its records."""
        if self._closed:
            raise ValueError(f"page store at {self.directory} is closed")
        with self._lock:
            return self._append(url, status, fetched_at, built.mime, built.digest, built.response, built.request,
                                truncated, index=built.cdxj, record_id=built.record_id)

    def _append(self, url: str, status: int, fetched_at: float, mime: str, digest: str, resp: bytes,
                req: bytes, truncated: bool, revisit: bool = False,
                index: tuple[str, str] | None = None, record_id: str = "") -> int:
        """Write one response (or revisit) record and its request record under the lock; returns the bytes
        written."""
        if self._closed:
            raise ValueError(f"page store at {self.directory} is closed")
        if self._failure is not None:
            raise self._failure
        try:
            if self._warc is None:
                self._start_file(fetched_at)
            offset = self._size
            self._write(resp + req)
            self._last.record = (self._name, offset)
            self._last.record_id = record_id
            line = None if index is None else cdxj_join(index, offset, self._name)
            if line is None:
                line = cdxj_line(CdxjEntry(url=url, timestamp=warc_timestamp(fetched_at), filename=self._name,
                                           offset=offset, length=len(resp), status=status, mime=mime,
                                           digest=digest, truncated=truncated))
            assert self._index is not None
            _write_all(self._index, line.encode("utf-8"))
            if revisit:
                self.revisits += 1
            else:
                self.pages += 1
            if self._size >= self.max_file_bytes:
                self._finish_file()
            return len(resp) + len(req)
        except OSError as exc:
            # offsets are unknown now: refuse further pages; the next start cuts the torn tail off
            self._failure = StorageError(f"cannot write WARC in {self.directory}: {exc.strerror or exc}")
            raise self._failure from exc

    def store_revisit(self, *, url: str, request_headers: list[tuple[str, str]], status: int, reason: str,
                      response_headers: list[tuple[str, str]], ip: str | None, fetched_at: float, profile: str,
                      payload_digest: str, refers_to_uri: str, refers_to_date: float,
                      protocol: str = "http/1.1", refers_to: str = "") -> int:
        if self._closed:
            raise ValueError(f"page store at {self.directory} is closed")
        records = revisit_records(url=url, request_headers=request_headers, status=status, reason=reason,
                                  response_headers=response_headers, ip=ip, fetched_at=fetched_at,
                                  profile=profile, payload_digest=payload_digest, refers_to_uri=refers_to_uri,
                                  refers_to_date=refers_to_date, protocol=protocol, refers_to=refers_to)
        resp = gzip_member(records.response, self.compress_level)
        req = gzip_member((records.request,), self.compress_level)
        with self._lock:
            return self._append(url, status, fetched_at, "warc/revisit", payload_digest, resp, req, False,
                                revisit=True, record_id=records.record_id)

    def store_conversion(self, *, url: str, fetched_at: float, body: bytes, content_type: str,
                         refers_to_date: float) -> int:
        if self._closed:
            raise ValueError(f"page store at {self.directory} is closed")
        record = gzip_member((conversion_record(url=url, fetched_at=fetched_at, body=body,
                                                content_type=content_type, refers_to_date=refers_to_date),),
                             self.compress_level)
        mime = content_type.split(";", 1)[0].strip().lower() or "unk"
        with self._lock:
            if self._failure is not None:
                raise self._failure
            try:
                if self._warc is None:
                    self._start_file(fetched_at)
                offset = self._size
                self._write(record)
                line = cdxj_line(CdxjEntry(url=url, timestamp=warc_timestamp(fetched_at), filename=self._name,
                                           offset=offset, length=len(record), status=0, mime=mime,
                                           digest=_payload_digest(body)))
                assert self._index is not None
                _write_all(self._index, line.encode("utf-8"))
            except OSError as exc:
                self._failure = StorageError(f"cannot write WARC in {self.directory}: {exc.strerror or exc}")
                raise self._failure from exc
            if self._size >= self.max_file_bytes:
                self._finish_file()
        return len(record)

    def last_record(self) -> tuple[str, int] | None:
        """The WARC file and offset of the response record the calling thread wrote last (None: none yet)."""
        return getattr(self._last, "record", None)

    def last_record_id(self) -> str | None:
        """The `WARC-Record-ID` of the record the calling thread wrote last (None: none yet)."""
        return getattr(self._last, "record_id", None) or None

    def lookup(self, url: str) -> list[tuple[str, int, int]]:
        """Scan the index files for `url` (a tool's and a test's call, not the crawl's hot path); records made
        from a response (a `conversion`: no status) are not responses."""
        key = surt(url) + " "
        found = []
        for index in sorted(self.directory.glob("*.cdxj")) + sorted(self.directory.glob("*" + _OPEN_SUFFIX)):
            with open(index, encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith(key):
                        entry = parse_cdxj_line(line)
                        if entry.url == url and entry.status:
                            found.append((entry.timestamp, entry.filename, entry.offset, entry.length))
        found.sort()
        return [(filename, offset, length) for _ts, filename, offset, length in found]

    def sync(self) -> None:
        try:
            with self._lock:
                for fh in (self._warc, self._index):
                    if fh is not None:
                        os.fsync(fh.fileno())
        except OSError as exc:
            raise StorageError(f"cannot sync WARC in {self.directory}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._failure is not None:
            for fh in (self._warc, self._index):
                if fh is not None:
                    fh.close()
            return
        try:
            with self._lock:
                self._finish_file()
        except OSError as exc:
            raise StorageError(f"cannot finish WARC in {self.directory}: {exc.strerror or exc}") from exc


def _write_all(fh: BinaryIO, data: bytes) -> None:
    """Write all of `data` to an unbuffered file. A short write (a file size limit, a nearly full disk) is
    continued, so that it either completes or raises: a page is indexed only once its records are whole."""
    view = memoryview(data)
    while view:
        written = fh.write(view)
        if not written:
            raise OSError(f"no progress writing {fh.name}")
        view = view[written:]


def _mime(headers: list[tuple[str, str]]) -> str:
    for name, value in headers:
        if name.lower() == "content-type":
            return value.split(";", 1)[0].strip().lower() or "unk"
    return "unk"


def open_page_store(kind: str, directory: str | os.PathLike[str], **options: object) -> PageStore:
    """The page store for `--store KIND`: "warc" (WARC files in `directory`) or "none" (stores nothing)."""
    if kind == "warc":
        return WarcPageStore(directory, **options)  # type: ignore[arg-type]
    if kind == "none":
        return NullPageStore()
    raise ValueError(f"unknown page store {kind!r} (expected 'warc' or 'none')")
