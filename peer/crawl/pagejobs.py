"""A page job and its answer, their frames between the node and a page worker process, and the worker's side:
`serve_worker` answers the node's jobs in order until its socket closes (peer/crawl/pageworkers.py runs the
pool of them). The work itself is `process_page`, the same calls the crawler makes inline: the WARC records of a
page (`storage.build_page_records`), written by the worker itself with ``--store warc`` (`PageWriter`), and its
links (`peer.crawl.links.extract`).

A job's frame is its head (the lengths of its two parts), the pickled fields without the body, and the body as
it came from the fetch. An answer is one length-prefixed pickle: the compressed records and the index line
without its place (`storage.cdxj_parts`), or the bytes the worker wrote, and the page's fields as plain tuples.
"""

from __future__ import annotations

import faulthandler
import gc
import pickle
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from storage import BuiltPage, StorageError, WarcPageStore, build_page_records

from peer.crawl.links import Page, extract

__all__ = ["ANSWER_HEADER", "MAX_KILLS", "READY", "READ_SIZE", "PageJob", "PageResult", "PageWorkerError",
           "PageWriter", "job_frame", "page_of", "process_page", "serve_worker", "settle_collector"]

#: A job that has killed (or hung) this many workers is failed, not sent again.
MAX_KILLS = 3

ANSWER_HEADER = struct.Struct(">I")  # an answer: its length
_JOB_HEADER = struct.Struct(">II")  # a job: the length of its pickled fields, then of its body
_MAX_FRAME = 1 << 30  # a frame is a page body (max_body, 10 MiB by default) and its head, or its records
READY = b""  # the empty frame a worker sends once it has imported what it needs
READ_SIZE = 1 << 16  # bytes read at once from a worker's socket, each way
#: allocations of container objects between two collections of the young generation (Python's default: 700)
_GC_YOUNG = 10_000
_ANSWER_BATCH = 4  # a worker answers at least every this many jobs, so no job waits for a whole queue


def settle_collector() -> None:
    """Set the cyclic collector up for a long-lived crawling process (the node, and each page worker). What
    start-up made (modules, classes, functions: about 60,000 objects) lives as long as the process: frozen, the
    collector's full passes skip it. A page allocates tens of container objects that die young by reference
    counting; collecting the young generation every 700 allocations (the default) cost 2-3% of the node's CPU,
    most of it looking at objects about to be freed anyway."""
    gc.collect()  # start-up's garbage first, so none of it is frozen
    gc.freeze()
    gc.set_threshold(_GC_YOUNG, *gc.get_threshold()[1:])


class PageWorkerError(Exception):
    """A page could not be processed: it killed or hung its worker ``MAX_KILLS`` times (the page's fault), or
    the workers cannot start (the node's)."""


class PageJob(NamedTuple):
    """What a worker needs of one fetched page. A named tuple, like `storage.BuiltPage`: made once per page in
    the node and once in the worker, and a frozen dataclass's field-by-field set-up cost more than the job's
    framing (measured in the node's profile)."""

    url: str
    content_type: str | None
    body: bytes
    parse: bool  # extract the links (an HTML page)
    compress_level: int | None  # build the WARC records at this gzip level; None: no records
    request_headers: list[tuple[str, str]]
    status: int
    reason: str
    response_headers: list[tuple[str, str]]  # as stored (Content-Encoding undone)
    ip: str | None
    fetched_at: float
    truncated: bool
    protocol: str = "http/1.1"  # what carried the exchange (ALPN name), for WARC-Protocol
    #: the plug-in chain to run (`peer.plugins.Plugins.job_part`): None when no plug-in works on pages
    plugins: tuple | None = None
    #: the body's payload digest when the node computed it already (not computed again here); None: made here
    digest: str | None = None


class PageResult(NamedTuple):
    """What a worker gives back: the compressed records (to append) and the parsed page (its links); or, when
    the worker wrote the records to its own WARC file (`PageWriter`), the bytes it wrote and where. With plug-ins,
    what the chain made of the page (`peer.plugins.Outcome`); a page its filters did not store has no records."""

    built: BuiltPage | None
    page: Page | None
    written: int | None = None
    outcome: Any = None
    location: tuple[str, int] | None = None
    record_id: str = ""  # the `WARC-Record-ID` of the response record the worker wrote ("": none)


class PageWriter(NamedTuple):
    """Where the page workers write their records themselves (``--store warc``): the node's WARC directory and
    its settings. Worker N writes ``<prefix>-p<N>-<UTC time>-<serial>.warc.gz``, each file with its own index
    as the node's, and forces them to disk every ``sync_interval`` seconds it has written, as the node does."""

    directory: str
    prefix: str
    max_file_bytes: int
    compress_level: int
    sync_interval: float

    @classmethod
    def of(cls, store: Any, sync_interval: float) -> PageWriter | None:
        """The writer spec for the node's page store, or None when the node keeps its pages otherwise."""
        if not isinstance(store, WarcPageStore):
            return None
        return cls(str(store.directory), store.prefix, store.max_file_bytes, store.compress_level, sync_interval)


# On the wire jobs and results are plain tuples: pickling a slotted dataclass calls `dataclasses.fields` on
# both sides, which was a tenth of the node's cost per page in the pool.
_PAGE_FIELDS = ("links", "canonical", "noindex", "nofollow", "charset", "title", "base")
_BODY = PageJob._fields.index("body")


def job_frame(job: PageJob) -> tuple[bytes, bytes, bytes]:
    """A job's frame in three parts, the body as it is: head, pickled fields (the body's place empty), body."""
    meta = pickle.dumps(job[:_BODY] + (None,) + job[_BODY + 1:], protocol=pickle.HIGHEST_PROTOCOL)
    return _JOB_HEADER.pack(len(meta), len(job.body)), meta, job.body


def _job_of(meta: Any, body: bytes) -> PageJob:
    fields = pickle.loads(meta)
    if not isinstance(fields, tuple) or len(fields) != len(PageJob._fields):
        raise ValueError(f"page worker: a job of {len(fields) if isinstance(fields, tuple) else '?'} fields")
    return PageJob._make(fields[:_BODY] + (body,) + fields[_BODY + 1:])


def _page_tuple(page: Page | None) -> tuple | None:
    if page is None:
        return None
    return (page.links, page.canonical, page.noindex, page.nofollow, page.charset, page.title, page.base)


def page_of(fields: tuple) -> Page:
    links, canonical, noindex, nofollow, charset, title, base = fields
    return Page(links=links, canonical=canonical, noindex=noindex, nofollow=nofollow, charset=charset, title=title,
                base=base)


def process_page(job: PageJob) -> PageResult:
    """A page's stateless work, the same calls the crawler makes inline: records first, then the links (with
    plug-ins: the links, the chain, then the records if its filters keep the page)."""
    if job.plugins is not None:
        return _process_plugged(job)
    built = None
    if job.compress_level is not None:
        built = build_page_records(url=job.url, request_headers=job.request_headers, status=job.status,
                                   reason=job.reason, response_headers=job.response_headers, body=job.body,
                                   ip=job.ip, fetched_at=job.fetched_at, truncated=job.truncated,
                                   compress_level=job.compress_level, protocol=job.protocol,
                                   payload_digest=job.digest)
    page = extract(job.body, job.url, job.content_type) if job.parse else None
    return PageResult(built=built, page=page)


def _process_plugged(job: PageJob) -> PageResult:
    """With plug-ins: the links, the chain (its runner comes with the job: `peer.plugins.Plugins.job_part`),
    then the records if the chain's page filters keep the page."""
    assert job.plugins is not None  # only jobs with a chain come here
    page = extract(job.body, job.url, job.content_type) if job.parse else None
    outcome = job.plugins[0](job.plugins, job.url, job.status, job.response_headers, job.body, job.content_type,
                             job.fetched_at, None if page is None else page.links, None if page is None else page.base)
    built = None
    if job.compress_level is not None and outcome.store:
        built = build_page_records(url=job.url, request_headers=job.request_headers, status=job.status,
                                   reason=job.reason, response_headers=job.response_headers, body=job.body,
                                   ip=job.ip, fetched_at=job.fetched_at, truncated=job.truncated,
                                   compress_level=job.compress_level, protocol=job.protocol,
                                   payload_digest=job.digest)
    return PageResult(built=built, page=page, outcome=outcome)


# ---------------------------------------------------------------------------------------------- the worker


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(ANSWER_HEADER.pack(len(payload)) + payload)


def _job_size(buf: bytearray, pos: int) -> int:
    """The length of the job frame at `pos` of `buf` (which holds at least its head); SystemExit past the
    bound."""
    meta, body = _JOB_HEADER.unpack_from(buf, pos)
    if meta + body > _MAX_FRAME:
        raise SystemExit(f"page worker: a frame of {meta + body} bytes is over the bound")
    return _JOB_HEADER.size + meta + body


def serve_worker(sock: socket.socket, work: Callable[[PageJob], Any], slot: int = 0,
           writer: PageWriter | None = None) -> None:
    """A worker process's life: answer each job in order until the node closes the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    faulthandler.enable(all_threads=True)  # a fatal signal (lxml, LMDB) prints this worker's Python stack first
    own = None if writer is None else _OwnWarc(writer, slot)  # before the ready word: a failure is a failed start
    settle_collector()
    try:
        with sock:
            _answer_jobs(sock, work, own)
    except (BrokenPipeError, ConnectionResetError):
        return  # the node closed its end (stopping, or it died): nothing is waiting for an answer
    finally:
        if own is not None:
            own.close()


class _OwnWarc:
    """A page worker's own WARC writer: the records it builds are appended here, not sent to the node, so the
    node's process neither copies them nor writes them (its two writes a page were a tenth of its CPU with
    workers). The worker's file and index are the node's format; its files are finished when it stops, and
    what a killed worker left open is finished by the next worker of its slot (or the node's next start)."""

    __slots__ = ("dirty", "failure", "interval", "store", "synced")

    def __init__(self, writer: PageWriter, slot: int) -> None:
        self.store = WarcPageStore(writer.directory, prefix=f"{writer.prefix}-p{slot}",
                                   max_file_bytes=writer.max_file_bytes, compress_level=writer.compress_level,
                                   recover_all=False)
        self.interval = writer.sync_interval
        self.synced = time.monotonic()
        self.dirty = False  # written since the last sync
        self.failure: StorageError | None = None  # a failed sync: every later page is refused with it

    def append(self, job: PageJob, built: BuiltPage) -> int:
        if self.failure is not None:
            raise self.failure
        written = self.store.store_built(url=job.url, status=job.status, fetched_at=job.fetched_at, built=built,
                                         truncated=job.truncated)
        self.dirty = True
        return written

    def due_in(self) -> float:
        """Seconds until what was written must be synced (<= 0: now)."""
        return self.synced + self.interval - time.monotonic()

    def sync(self) -> None:
        try:
            self.store.sync()
        except StorageError as exc:  # the node hears of it with its next page, and stops on it
            self.failure = exc
        self.dirty = False
        self.synced = time.monotonic()

    def close(self) -> None:
        try:
            self.store.close()
        except StorageError as exc:  # the node's next start finishes the file
            print(f"page worker: {exc}", file=sys.stderr)


def _answer_jobs(sock: socket.socket, work: Callable[[PageJob], Any], own: _OwnWarc | None = None) -> None:
    """Answer the jobs in order, up to _ANSWER_BATCH in one write: a wake-up of the other process per page cost
    more CPU than the work, and a whole queue's answers in one write made each job wait for all of them."""
    _send_frame(sock, READY)
    buf = bytearray()
    block = True
    answers: list[bytes] = []
    chunk = bytearray(READ_SIZE)  # read into one buffer: a fresh large buffer per read costs an mmap and munmap
    view = memoryview(chunk)
    while True:  # until the end of input
        if own is not None and own.dirty:  # written pages reach the disk within sync_interval, busy or idle
            wait = own.due_in()
            if wait <= 0 or (block and not select.select([sock], [], [], wait)[0]):
                own.sync()
        try:
            got = sock.recv_into(view, 0, 0 if block else socket.MSG_DONTWAIT)
            data: bool | None = got > 0
        except BlockingIOError:
            data = None
        if data is False:
            return
        if data:
            buf += view[:got]
        pos = 0
        while len(buf) - pos >= _JOB_HEADER.size:
            size = _job_size(buf, pos)
            if len(buf) - pos < size:
                break
            (meta_size,) = ANSWER_HEADER.unpack_from(buf, pos)
            start = pos + _JOB_HEADER.size
            with memoryview(buf) as whole:
                meta = whole[start:start + meta_size]
                body = bytes(whole[start + meta_size:pos + size])
                try:
                    answers.append(_answer(work, meta, body, own))
                finally:
                    meta.release()
            pos += size
            if len(answers) >= _ANSWER_BATCH:  # no job waits for the whole queue behind it
                sock.sendall(b"".join(answers))
                answers = []
        del buf[:pos]
        if data is None or (block and not pos):
            # nothing more waiting (or only part of a frame): send what is done, then wait for input
            if answers:
                sock.sendall(b"".join(answers))
                answers = []
            block = True
        else:
            block = False  # look once more, without waiting, before answering


def _answer(work: Callable[[PageJob], Any], meta: Any, body: bytes, own: _OwnWarc | None = None) -> bytes:
    """One job's answer as a frame: (1, records, page fields) for a `PageResult` (both plain tuples), or (3,
    bytes written, page fields) when the worker wrote the records itself; (2, value) for anything else the
    work returns, (0, exception) when it raised."""
    reply: tuple
    try:
        job = _job_of(meta, body)
        result = work(job)
        if isinstance(result, PageResult) and own is not None and result.built is not None:
            written = own.append(job, result.built)
            reply = (3, written, _page_tuple(result.page), result.outcome, own.store.last_record(),
                     result.built.record_id)
        elif isinstance(result, PageResult):
            reply = (1, None if result.built is None else tuple(result.built), _page_tuple(result.page),
                     result.outcome)
        else:
            reply = (2, result)
    except Exception as exc:  # the same exception the inline call would raise, for the crawler to contain
        reply = (0, exc)
    try:
        payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        payload = pickle.dumps((0, RuntimeError(f"page worker: cannot send back {reply[1:]!r}: {exc}")))
    return ANSWER_HEADER.pack(len(payload)) + payload
