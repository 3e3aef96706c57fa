"""Page worker processes (``--page-processes``): the pool's supervision with real processes, and a node that
crawls a local web with them storing and finding exactly what the same node stores and finds inline."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pickle
import sys
from pathlib import Path

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from peer.cli.format import format_status
from peer.config import ConfigError, load
from peer.crawl import pagejobs, pageworkers
from peer.crawl.links import Page
from peer.crawl.pageworkers import PageJob, PageWorkerError, PageWriter, open_page_workers, process_page
from storage import StorageError, WarcPageStore
from peer.node import Node
from peerlab.localweb.graph import SiteGraph

from .support.crawl import node_config, start_local_web
from .support.pageworks import collector, crashing, hanging

BODY = (b"<html><head><title>t</title></head><body>"
        + b"".join(b'<a href="/p%d">p</a>' % i for i in range(30)) + b"<p>" + b"x" * 4000 + b"</p></body></html>")


def _job(url: str, body: bytes = BODY, **kw) -> PageJob:
    fields = dict(url=url, content_type="text/html; charset=utf-8", body=body, parse=True, compress_level=1,
                  request_headers=[("user-agent", "t")], status=200, reason="OK",
                  response_headers=[("content-type", "text/html; charset=utf-8")], ip="127.0.0.1",
                  fetched_at=1_700_000_000.0, truncated=False)
    fields.update(kw)
    return PageJob(**fields)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes only once reaped: /proc says which
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # worker processes, about 2 s of CPU
async def test_answers_match_the_inline_work_and_workers_stop_with_the_block():
    jobs = [_job(f"http://h{i}.test/page{i}") for i in range(12)]
    async with open_page_workers(2) as pool:
        with trio.fail_after(30):
            while pool.status()["ready"] < 2:  # both started, so both take jobs
                await trio.sleep(0.02)
        results = [None] * len(jobs)

        async def one(i):
            results[i] = await pool.process(jobs[i])

        async with trio.open_nursery() as nursery:
            for i in range(len(jobs)):
                nursery.start_soon(one, i)
        pids = [w.process.pid for w in pool._slots if w is not None]
        status = pool.status()
    for job, result in zip(jobs, results):
        inline = process_page(job)
        assert result.page == inline.page and len(result.page.links) == 30
        assert result.built.digest == inline.built.digest and result.built.mime == "text/html"
    assert status["pages"] == 12 and status["ready"] == 2 and status["crashes"] == 0
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids), "the workers exit with the block"


async def test_the_works_exception_reaches_the_caller_as_inline():
    job = _job("ftp://h.test/x")  # extract refuses a URL that is not crawlable
    with pytest.raises(ValueError) as inline:
        process_page(job)
    async with open_page_workers(1) as pool:
        with pytest.raises(ValueError) as there:
            await pool.process(job)
        ok = await pool.process(_job("http://h.test/after"))  # the worker goes on
        assert pool.status()["crashes"] == 0
    assert str(there.value) == str(inline.value)
    assert len(ok.page.links) == 30


@pytest.mark.slow  # a whole crawl, a child process or real nodes: seconds
@pytest.mark.parametrize("bound", ["count", "bytes"])
async def test_in_flight_per_worker_is_bounded(bound):
    most = 0
    frame = len(pickle.dumps(_job("http://h.test/slow0"), protocol=pickle.HIGHEST_PROTOCOL)) + 4
    # at most two jobs held: by count, or by bytes (room for two frames and a half)
    limits = {"in_flight": 2} if bound == "count" else {"in_flight": 8, "queued_bytes": frame * 5 // 2}
    async with open_page_workers(1, work=crashing, **limits) as pool:
        async def sample():
            nonlocal most
            while True:
                most = max(most, pool.status()["in_flight"])
                await trio.sleep(0.01)

        async with trio.open_nursery() as outer:
            outer.start_soon(sample)
            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(pool.process, _job(f"http://h.test/slow{i}"))
            outer.cancel_scope.cancel()
        assert pool.status()["pages"] == 8
    assert most == 2


async def _process_all(pool, jobs, gap: float = 0.0) -> dict:
    """Every job through the pool at once (started `gap` seconds apart): URL -> its answer."""
    results = {}

    async def one(job):
        results[job.url] = await pool.process(job)

    async with trio.open_nursery() as nursery:
        for job in jobs:
            nursery.start_soon(one, job)
            if gap:
                await trio.sleep(gap)
    return results


@pytest.mark.slow
async def test_a_crashed_worker_is_restarted_and_its_pages_done_again(tmp_path):
    jobs = [_job(f"http://h.test/slow{i}") for i in range(6)] + [_job(f"http://h.test/crash-once-a?{tmp_path}")]
    async with open_page_workers(1, work=crashing, in_flight=2) as pool:
        results = await _process_all(pool, jobs)
        status = pool.status()
    assert set(results) == {j.url for j in jobs}, "nothing lost"
    assert all(len(r.page.links) == 30 for r in results.values())
    assert status["crashes"] == 1 and status["started"] == 2 and status["resent"] >= 1 and status["failed"] == 0
    assert (tmp_path / "crash-once-a").exists()


@pytest.mark.slow
async def test_a_page_that_kills_every_worker_fails_and_the_others_pass():
    async with open_page_workers(2, work=crashing) as pool:
        outcome = {}

        async def one(url):
            try:
                outcome[url] = len((await pool.process(_job(url))).page.links)
            except PageWorkerError as exc:
                outcome[url] = str(exc)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, "http://h.test/poison")
                for i in range(10):
                    nursery.start_soon(one, f"http://h.test/slow{i}")
            while pool.status()["ready"] < 2:  # the last replacement is started after the page is failed
                await trio.sleep(0.02)
        status = pool.status()
    assert outcome.pop("http://h.test/poison") == "page not processed: it killed 3 page workers: http://h.test/poison"
    assert outcome == {f"http://h.test/slow{i}": 30 for i in range(10)}
    # three kills alone, and perhaps one first among other jobs (then each of those was sent again alone)
    assert status["failed"] == 1 and status["crashes"] in (3, 4) and status["started"] == 2 + status["crashes"]


@pytest.mark.slow
async def test_a_page_that_hangs_its_worker_is_given_up_after_the_timeouts():
    async with open_page_workers(1, work=hanging, timeout=0.5) as pool:
        with trio.fail_after(60):
            with pytest.raises(PageWorkerError, match="hung 3 page workers past 0.5 s"):
                await pool.process(_job("http://h.test/hang"))
            after = await pool.process(_job("http://h.test/fine"))
        status = pool.status()
    assert len(after.page.links) == 30
    assert status["timeouts"] == 3 and status["failed"] == 1 and status["ready"] == 1


@pytest.mark.slow
async def test_workers_that_cannot_start_stop_the_pool_with_one_error(tmp_path):
    module = tmp_path / "vanishing_work.py"
    module.write_text("from peer.crawl.pageworkers import process_page\n\n\n"
                      "def work(job):\n    return process_page(job)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        work = importlib.import_module("vanishing_work").work
        module.unlink()  # a spawned worker cannot import it: it dies before it is ready
        with trio.fail_after(60):
            with pytest.raises(BaseExceptionGroup) as raised:
                async with open_page_workers(1, work=work):
                    await trio.sleep_forever()
        assert [str(e) for e in _leaves(raised.value)] == [
            "page worker processes cannot start (exit code 1, 5 times in a row); see the log above"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("vanishing_work", None)


def test_page_processes_and_page_threads_are_one_choice():
    assert load(env={}).page_processes == 0
    assert load(env={"PEERCRAWL_PAGE_PROCESSES": "3"}).page_processes == 3
    with pytest.raises(ConfigError, match="set one of them"):
        load(env={}, flags={"page_processes": 2, "page_threads": 2})
    with pytest.raises(ConfigError, match="page_processes must be within"):
        load(env={}, flags={"page_processes": -1})


def _warc_records(warc_dir: Path) -> dict[str, list[tuple[bytes, str, str]]]:
    """URI -> its response records' (payload, content type, payload digest), in file order."""
    out: dict[str, list[tuple[bytes, str, str]]] = {}
    for path in sorted(warc_dir.glob("*.warc.gz")):
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type == "response":
                    uri = record.rec_headers.get_header("WARC-Target-URI")
                    out.setdefault(uri, []).append((record.content_stream().read(),
                                                    record.http_headers.get_header("Content-Type"),
                                                    record.rec_headers.get_header("WARC-Payload-Digest")))
    return out


@pytest.mark.slow
async def test_a_crawl_with_page_processes_stores_and_finds_what_inline_does(tmp_path):
    graph = SiteGraph.generate(seed=21, hosts=16, pages_per_host=10)  # with the feature pages: charsets, gzip, ...
    runs = {}
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        for name, extra in (("inline", {}), ("processes", {"page_processes": 2})):
            node = Node(node_config(tmp_path / name, web, dns, **extra))
            with trio.fail_after(120):
                await node.run()
            st = node.final_status
            runs[name] = (st, node.crawler.dedup, _warc_records(tmp_path / name / "warc"))
        nursery.cancel_scope.cancel()
    (st_i, _, warc_i), (st_p, _, warc_p) = runs["inline"], runs["processes"]
    assert warc_i and warc_p == warc_i, "the same pages, payloads, types and digests"
    assert all(len(records) == 1 for records in warc_p.values()), "each page recorded exactly once"
    # the workers wrote the pages' records to files of their own, each finished with its index at the stop
    files = sorted(p.name for p in (tmp_path / "processes" / "warc").iterdir())
    writers = {name.split("-")[1] for name in files if name.endswith(".warc.gz")}
    assert writers and writers <= {"p0", "p1"}, files
    assert not [n for n in files if n.endswith(".open")], "every index finished"
    store = WarcPageStore(tmp_path / "processes" / "warc")
    try:
        assert all(len(store.lookup(uri)) == 1 for uri in warc_p), "each page indexed exactly once"
    finally:
        store.close()
    # (the page count is not compared: the web answers 429/503 by time, so retries differ between runs)
    same = ("stored", "links_found", "urls_new", "urls_seen", "skipped")
    assert {k: st_p[k] for k in same} == {k: st_i[k] for k in same}
    workers = st_p["page_workers"]
    assert workers["processes"] == 2 and workers["pages"] >= st_p["stored"] and workers["crashes"] == 0
    assert st_i["page_workers"] == {"processes": 0}
    shown = format_status(st_p)  # what `peerctl status` prints
    assert f"page workers 2/2 ready, in flight 0, pages {workers['pages']}, crashes 0" in shown
    assert "page workers" not in format_status(st_i)


def test_the_wire_tuples_name_every_field_in_order():
    # jobs and pages cross the socket as tuples: a job is its own tuple (the body sent beside it, not pickled);
    # a field added to a page must be added to its wire tuple too
    assert pagejobs._PAGE_FIELDS == tuple(f.name for f in dataclasses.fields(Page))
    job = _job("http://h.test/x")
    head, meta, body = pagejobs.job_frame(job)
    assert pagejobs._job_of(meta, body) == job and body is job.body and job.body not in meta
    page = process_page(job).page
    assert Page(**dict(zip(pagejobs._PAGE_FIELDS, pagejobs._page_tuple(page)))) == page
    assert pagejobs.page_of(pagejobs._page_tuple(page)) == page


def test_a_job_frame_carries_the_body_as_it_came_and_reads_back_whole():
    """The body is a part of the frame, not copied into a pickle: the node writes the fetch's own bytes."""
    job = _job("http://h.test/x", body=BODY * 50)
    frame = pagejobs.job_frame(job)
    assert frame[2] is job.body
    whole = bytearray(b"junk" + b"".join(frame) + b"next")
    assert pagejobs._job_size(whole, 4) == len(whole) - 8
    meta_size = int.from_bytes(frame[0][:4], "big")
    assert pagejobs._job_of(whole[12:12 + meta_size], bytes(whole[12 + meta_size:-4])) == job
    with pytest.raises(ValueError, match="fields"):  # a frame of another shape is refused, not guessed at
        pagejobs._job_of(pickle.dumps(("http://h.test/x", None)), b"")


async def test_parts_are_written_whole_and_in_order_through_partial_sends():
    """`_send_parts` over a real socket pair whose buffers take far less than the parts: every byte arrives,
    in order, whether a send ends inside a part or between parts, with more parts than one sendmsg takes."""
    a, b = trio.socket.socketpair()
    a.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 4096)
    parts = [bytes([i % 251]) * ((i * 7919) % 9000) for i in range(pageworkers._IOV_MAX * 2 + 37)]
    expected = b"".join(parts)
    got = bytearray()

    async def reader():
        while len(got) < len(expected):
            data = await b.recv(3000)
            assert data
            got.extend(data)
            await trio.sleep(0)

    with a, b, trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await pageworkers._send_parts(a, list(parts))
    assert bytes(got) == expected


@pytest.mark.slow
async def test_a_worker_that_dies_on_a_large_job_loses_nothing(tmp_path):
    """Jobs far larger than the socket's buffers go out in many sends; a worker dies on one of them with
    others queued behind it (one of them large, perhaps half written): every job is answered once, the large
    ones with their links and their records as inline."""
    big = BODY + b"<p>" + b"y" * (3 << 20) + b"</p>"
    jobs = [_job(f"http://h.test/slow{i}") for i in range(4)]
    jobs.insert(1, _job(f"http://h.test/crash-once-big?{tmp_path}", body=big))
    jobs += [_job(f"http://h.test/after{i}", body=big if i == 0 else BODY) for i in range(3)]
    async with open_page_workers(1, work=crashing, in_flight=8, queued_bytes=16 << 20) as pool:
        results = await _process_all(pool, jobs, gap=0.01)  # in this order
        status = pool.status()
    assert set(results) == {j.url for j in jobs}, "nothing lost"
    for job in jobs:
        inline = process_page(job)
        assert results[job.url].page == inline.page and len(inline.page.links) == 30
        assert results[job.url].built.digest == inline.built.digest
    assert status["crashes"] == 1 and status["started"] == 2 and status["resent"] >= 1 and status["failed"] == 0
    assert (tmp_path / "crash-once-big").exists()


async def test_a_worker_collects_as_the_node_does():
    """Start-up's objects frozen and the young generation collected every _GC_YOUNG allocations, in the worker
    that does the work (its answer says so)."""
    async with open_page_workers(1, work=collector) as pool:
        threshold, frozen = await pool.process(_job("http://h.test/x"))
    assert threshold == pagejobs._GC_YOUNG and frozen > 1000


def _indexed(warc_dir: Path) -> dict[str, list[str]]:
    """URI -> the files whose finished or open index lists it."""
    out: dict[str, list[str]] = {}
    for path in warc_dir.iterdir():
        if path.name.endswith((".cdxj", ".cdxj.open")):
            for line in path.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line.split(" ", 2)[2])
                out.setdefault(entry["url"], []).append(entry["filename"])
    return out


@pytest.mark.slow
async def test_workers_write_their_own_warc_and_a_killed_workers_open_file_is_finished_by_the_next(tmp_path):
    warc = tmp_path / "warc"
    node_store = WarcPageStore(warc)  # the node's own writer, with a file open while the workers run
    node_store.store_built(url="http://node.test/r", status=200, fetched_at=1_700_000_000.0,
                           built=process_page(_job("http://node.test/r")).built)
    writer = PageWriter(str(warc), "peercrawl", 1 << 30, 1, 3600.0)
    first = [_job(f"http://h.test/a{i}") for i in range(5)]
    then = [_job(f"http://h.test/b{i}") for i in range(5)]
    async with open_page_workers(1, writer=writer) as pool:
        results = await _process_all(pool, first)
        assert all(r.built is None and r.written > 0 and len(r.page.links) == 30 for r in results.values())
        pool._slots[0].process.kill()  # dies with its file open and its index unfinished
        with trio.fail_after(30):
            while pool.status()["ready"] < 1 or pool.status()["started"] < 2:
                await trio.sleep(0.02)
        results.update(await _process_all(pool, then))
    node_store.close()
    files = sorted(p.name for p in warc.iterdir())
    assert not [n for n in files if n.endswith(".open")], f"every index finished: {files}"
    warcs = [n for n in files if n.endswith(".warc.gz")]
    assert len([n for n in warcs if n.startswith("peercrawl-p0-")]) == 2, warcs  # one per worker process
    indexed = _indexed(warc)
    assert {u: len(f) for u, f in indexed.items()} == {j.url: 1 for j in first + then} | {"http://node.test/r": 1}
    assert indexed["http://node.test/r"][0].startswith("peercrawl-2"), "the node's file left to the node"
    assert _warc_records(warc).keys() == indexed.keys(), "every record whole and readable"


def test_a_workers_failed_sync_refuses_its_later_pages(tmp_path, monkeypatch):
    own = pagejobs._OwnWarc(PageWriter(str(tmp_path), "peercrawl", 1 << 30, 1, 0.0), 3)
    job = _job("http://h.test/x")
    assert own.append(job, process_page(job).built) > 0 and own.dirty and own.due_in() <= 0
    own.sync()
    assert not own.dirty and own.failure is None

    def broken() -> None:
        raise StorageError("cannot sync WARC: no space left on device")

    monkeypatch.setattr(own.store, "sync", broken)
    own.append(job, process_page(job).built)
    own.sync()
    with pytest.raises(StorageError, match="no space left"):
        own.append(job, process_page(job).built)
    own.close()
    assert [p.name.split("-")[1] for p in tmp_path.glob("*.warc.gz")] == ["p3"]
