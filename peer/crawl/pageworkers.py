"""Page workers: the stateless, CPU-heavy part of a fetched page in N processes (``--page-processes N``).

Everything a page changes stays in the node's one process: frontier, seen-set, politeness, robots.txt, DNS,
the outbox and LMDB. What a page needs no state for goes to a worker process: charset decoding, lxml's parse,
link extraction and normalization (`peer.crawl.links.extract`), the WARC records with their SHA-1 digests and
their gzip compression (`storage.build_page_records`), and with ``--store warc`` their append: each worker
writes WARC files of its own (`PageWriter`: ``<prefix>-p<N>-...`` in the node's WARC directory, each with its
index, fsynced every ``sync_interval`` it has written). The node sends a `PageJob` (URL, response head, body)
and gets back a `PageResult` (the page's links, and the bytes written, or the compressed records for a store
that is not WARC); it then finishes the page in one LMDB transaction, exactly as inline. A page's records are
written, whole and indexed, before the answer that lets the node commit it, as inline; each file has one
writer. A worker killed between writing a page and answering it leaves the page in its file, and the page is
written again by the next worker: as after a node's own crash between the write and its commit, a WARC may
then hold a page twice, never half of one (what a killed worker left open is cut back to its last whole page
by the next worker of its slot, or by the node's next start).

The pool, to the node's standards:

- **Back-pressure.** At most ``in_flight`` jobs (64) and 4 MiB of them per worker (one worked on, the others
  waiting in its socket, sent together in one write); a host turn that finds every place taken waits (a
  semaphore, then a look for a worker with room), so what the pool holds is bounded by count and bytes.
- **A crash or a hang costs nothing.** A worker that dies (any signal, the OOM killer) or answers nothing for
  ``timeout`` seconds while it holds jobs (killed then) is started again by its slot's supervisor, and the
  jobs it held are sent again. A worker answers what it holds together, so when it dies holding several, the
  culprit is not known: each is sent again *alone* to a worker, and a worker that dies holding one job counts
  a *kill* against it. A job that has killed ``max_kills`` workers fails with `PageWorkerError` (the crawler
  counts it as ``errors{kind="page-worker"}`` and finishes the URL unstored): no page can crash-loop the pool,
  and no innocent page is blamed for its neighbour.
- **A worker that cannot start** (it dies before saying it is ready, ``_START_FAILURES`` times in a row)
  stops the pool, and with it the node, with one line: nothing could be stored.
- **Clean stop.** Leaving `open_page_workers` closes every worker's socket (a worker exits at end of input),
  waits up to ``_STOP_WAIT`` seconds and kills what is left. Workers ignore SIGINT and SIGTERM: the node says
  when they stop, so a Ctrl-C to the process group cannot cut a page in half.

Processes are started with the ``spawn`` context (a fork of a trio process with threads is unsafe), and talk
over a socket pair in length-prefixed pickle frames (the peers are the node's own processes). A job's frame is
its head (the lengths of its two parts), the pickled fields without the body, and the body as it came from the
fetch: the node hands the three to one ``sendmsg`` with the frames queued beside them, so a body is not
copied in the node on its way out (a pickle of it, the frame, the join of the frames were three copies). An
answer is the compressed records, the index line without its place (`storage.cdxj_parts`) and the page's
fields as plain tuples, read in place from the node's buffer.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from storage import BuiltPage

from peer.crawl.pagejobs import (
    ANSWER_HEADER, MAX_KILLS, READ_SIZE, READY, PageJob, PageResult, PageWorkerError, PageWriter, job_frame, page_of,
    process_page, serve_worker, settle_collector,
)

__all__ = ["IN_FLIGHT_PER_WORKER", "MAX_KILLS", "QUEUED_BYTES_PER_WORKER", "PageJob", "PageResult", "PageWorkerError",
           "PageWorkers", "PageWriter", "open_page_workers", "process_page", "settle_collector"]

log = logging.getLogger(__name__)

#: Jobs a worker holds at once: the one it works on and those queued behind it. The pool's throughput is at
#: most (workers x this) jobs per round trip, and in a busy node a job's round trip is several event-loop
#: rounds: 4 held one worker to 960 pages/s and 16 two workers to 890, with neither process busy (measured).
IN_FLIGHT_PER_WORKER = 64
#: ... and at most this many bytes of jobs queued for one worker (a job alone may be larger: max_body).
QUEUED_BYTES_PER_WORKER = 4 << 20
#: Seconds one job may take in a worker before the worker is killed (a 10 MiB page parses in about 1 s).
DEFAULT_TIMEOUT = 60.0

_START_FAILURES = 5  # a slot whose worker dies this many times in a row before it is ready gives up
_RESTART_PAUSE = 0.05  # doubled for each start failure in a row, up to _RESTART_PAUSE_MAX
_RESTART_PAUSE_MAX = 5.0
_STOP_WAIT = 5.0  # seconds the workers get to exit at the end of their input before they are killed
_IOV_MAX = 512  # parts given to one sendmsg (Linux takes 1024)


class _Task:
    """One job on its way through the pool."""

    __slots__ = ("done", "frame", "kills", "outcome", "size", "suspect", "url")

    def __init__(self, frame: tuple[bytes, bytes, bytes], url: str) -> None:
        self.frame = frame  # head, pickled fields, body: written as they are (one sendmsg)
        self.size = len(frame[0]) + len(frame[1]) + len(frame[2])
        self.url = url
        self.kills = 0
        self.suspect = False  # held by a worker that died with other jobs: sent alone from now on
        self.done = trio.Event()
        self.outcome: tuple[bool, Any] | None = None  # None: sent again (its worker died)


class _Worker:
    """One worker process and what it holds, in the order it will answer."""

    __slots__ = ("outbox", "pending", "process", "queued", "ready", "served", "since", "solo", "stream",
                 "timed_out", "wake")

    def __init__(self, process: Any, stream: trio.SocketStream) -> None:
        self.process = process
        self.stream = stream
        self.pending: deque[_Task] = deque()
        # the parts of the frames of `pending` not yet written, in the same order (a part cut by a short write
        # is a memoryview of what is left)
        self.outbox: list[bytes | memoryview] = []
        self.queued = 0  # bytes of the frames of `pending`
        self.wake = trio.Event()
        self.ready = False
        self.solo = False  # holds one suspect job alone, so that if it dies the job is known
        self.served = 0
        self.since = 0.0  # when the job at the head of `pending` began (or was sent)
        self.timed_out = False


class PageWorkers:
    """N worker processes doing `process_page` (or ``work``) for the crawler. Made by `open_page_workers`."""

    def __init__(self, processes: int, *, work: Callable[[PageJob], Any] = process_page,
                 in_flight: int = IN_FLIGHT_PER_WORKER, queued_bytes: int = QUEUED_BYTES_PER_WORKER,
                 timeout: float = DEFAULT_TIMEOUT,
                 max_kills: int = MAX_KILLS, context: str = "spawn", writer: PageWriter | None = None) -> None:
        if processes <= 0:
            raise ValueError(f"page workers need at least one process, got {processes}")
        if in_flight <= 0 or timeout <= 0 or max_kills <= 0:
            raise ValueError(f"in_flight, timeout and max_kills must be > 0, got {in_flight}, {timeout}, {max_kills}")
        self.processes = processes
        self.in_flight = in_flight
        self.queued_bytes = queued_bytes
        self.timeout = timeout
        self.max_kills = max_kills
        self._work = work
        self._writer = writer  # the workers append the records to WARC files of their own
        self._ctx = multiprocessing.get_context(context)
        self._slots: list[_Worker | None] = [None] * processes
        self._places = trio.Semaphore(processes * in_flight)
        self._room = trio.Event()
        self._waiting = 0  # tasks waiting in `_take` for a worker with room
        # counters for `status()`
        self.pages = 0  # jobs answered
        self.started = 0  # worker processes started (the first N, then restarts)
        self.crashes = 0  # workers that died with jobs or before they were ready
        self.timeouts = 0  # workers killed for holding a job past `timeout`
        self.failed = 0  # jobs failed after max_kills kills
        self.resent = 0  # jobs sent again after their worker died

    # ---------------------------------------------------------------- the crawler's call

    async def process(self, job: PageJob) -> Any:
        """Do `job` in a worker; its result, or the exception the work raised. `PageWorkerError` when the
        job killed or hung ``max_kills`` workers."""
        task = _Task(job_frame(job), job.url)
        try:  # a place free: taken without a trip through the scheduler (the answer is waited for below)
            self._places.acquire_nowait()
        except trio.WouldBlock:
            await self._places.acquire()
        try:
            while True:  # bounded: each round ends in an answer, or a kill (at most max_kills) or a start failure
                worker = await self._take(task.size, alone=task.suspect)
                worker.solo = task.suspect
                if task.outcome is not None or task.done.is_set():
                    task.done = trio.Event()
                task.outcome = None
                if not worker.pending:
                    worker.since = trio.current_time()
                worker.pending.append(task)
                worker.queued += task.size
                worker.outbox += task.frame
                worker.wake.set()
                await task.done.wait()  # a worker that dies gives it back (outcome None)
                if task.outcome is None:
                    continue
                ok, value = task.outcome
                if ok:
                    return value
                raise value
        finally:
            self._places.release()

    async def _take(self, size: int, *, alone: bool) -> _Worker:
        """The ready worker holding the fewest jobs, among those with room for one of `size` bytes (``alone``:
        holding none)."""
        room = 1 if alone else self.in_flight
        while True:  # bounded: each wait ends when a worker answers, becomes ready or is given up
            best: _Worker | None = None
            for w in self._slots:
                if w is not None and w.ready and not w.solo and len(w.pending) < room and \
                        (not w.pending or w.queued + size <= self.queued_bytes) and \
                        (best is None or len(w.pending) < len(best.pending)):
                    best = w
            if best is not None:
                return best
            self._waiting += 1
            try:
                await self._room.wait()
            finally:
                self._waiting -= 1

    def _wake(self) -> None:
        if self._waiting:  # an answer per page: no new event when nobody waits for room
            self._room.set()
            self._room = trio.Event()

    def status(self) -> dict[str, int]:
        """What `peerctl status` shows (``page_workers``)."""
        live = [w for w in self._slots if w is not None and w.ready]
        return {"processes": self.processes, "ready": len(live), "in_flight": sum(len(w.pending) for w in live),
                "pages": self.pages, "started": self.started, "crashes": self.crashes,
                "timeouts": self.timeouts, "resent": self.resent, "failed": self.failed}

    # ---------------------------------------------------------------- supervision

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run one supervisor per worker slot and the watchdog, until cancelled."""
        async with trio.open_nursery() as nursery:
            for slot in range(self.processes):
                nursery.start_soon(self._supervise, slot)
            nursery.start_soon(self._watchdog)
            task_status.started()

    async def _start(self, slot: int) -> _Worker:
        parent, child = socket.socketpair()
        try:
            # typeshed's BaseContext has no Process; every context get_context returns has one
            process = self._ctx.Process(  # type: ignore[attr-defined]
                target=serve_worker, args=(child, self._work, slot, self._writer), name=f"peercrawl-page-{slot}",
                daemon=True)
            await trio.to_thread.run_sync(process.start)
        finally:
            child.close()
        parent.setblocking(False)
        self.started += 1
        worker = _Worker(process, trio.SocketStream(trio.socket.from_stdlib_socket(parent)))
        self._slots[slot] = worker
        return worker

    async def _supervise(self, slot: int) -> None:
        """Keep slot `slot` served: start its worker, read its answers, and when it dies give its jobs back
        and start another."""
        start_failures = 0
        pause = _RESTART_PAUSE
        while True:  # one round per worker process; bounded by _START_FAILURES in a row
            worker = await self._start(slot)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write, worker)
                    await self._read(worker)
                    nursery.cancel_scope.cancel()
            finally:
                if worker.stream.socket.fileno() >= 0:
                    with trio.CancelScope(shield=True):
                        await worker.stream.aclose()
            self._slots[slot] = None
            code = await self._reap(worker)
            if not worker.ready:
                start_failures += 1
                self.crashes += 1
                log.warning("a page worker died before it was ready", extra={"slot": slot, "exit_code": code,
                                                                           "in_a_row": start_failures})
                if start_failures >= _START_FAILURES:
                    raise PageWorkerError(f"page worker processes cannot start (exit code {code}, "
                                          f"{start_failures} times in a row); see the log above")
                await trio.sleep(pause)
                pause = min(_RESTART_PAUSE_MAX, pause * 2)
            else:
                start_failures = 0
                pause = _RESTART_PAUSE
                if worker.pending:
                    # A worker works off what it holds before it answers, so with several jobs the one that
                    # killed it is not known: they are all sent again alone, and a job alone is the culprit.
                    self.crashes += 1
                    if len(worker.pending) == 1:
                        worker.pending[0].kills += 1
                    for task in worker.pending:
                        task.suspect = True
                    log.warning("a page worker %s; starting another", "timed out" if worker.timed_out else "died",
                                extra={"slot": slot, "exit_code": code, "urls": [t.url for t in worker.pending],
                                       "kills": worker.pending[0].kills})
            for task in worker.pending:
                if task.kills >= self.max_kills:
                    self.failed += 1
                    what = f"hung {self.max_kills} page workers past {self.timeout:g} s" if worker.timed_out \
                        else f"killed {self.max_kills} page workers"
                    task.outcome = (False, PageWorkerError(f"page not processed: it {what}: {task.url[:200]}"))
                else:
                    self.resent += 1
                    task.outcome = None
                task.done.set()
            worker.pending.clear()
            self._wake()

    async def _write(self, worker: _Worker) -> None:
        """Write the jobs queued for one worker, all that are waiting in one ``sendmsg`` of their parts (no
        copy of a body here). A frame cut in half (the worker died) ends the worker's round: its reader sees
        the socket end."""
        sock = worker.stream.socket
        while True:  # until the worker's round is cancelled
            await worker.wake.wait()
            worker.wake = trio.Event()
            parts, worker.outbox = worker.outbox, []
            if not parts:
                continue
            try:
                await _send_parts(sock, parts)
            except (OSError, trio.ClosedResourceError):
                worker.process.kill()  # make sure the reader sees the end
                return

    async def _read(self, worker: _Worker) -> None:
        """Answers from one worker, in the order its jobs were sent, until its socket ends."""
        buf = bytearray()
        chunk = bytearray(READ_SIZE)  # one buffer for every read (see _answer_jobs)
        view = memoryview(chunk)
        sock = worker.stream.socket
        while True:
            try:
                got = await sock.recv_into(view)
            except (OSError, trio.ClosedResourceError):  # reset, or closed by the end of its round
                return
            if not got:
                return
            buf += view[:got]
            pos = 0
            while len(buf) - pos >= ANSWER_HEADER.size:
                (size,) = ANSWER_HEADER.unpack_from(buf, pos)
                end = pos + ANSWER_HEADER.size + size
                if len(buf) < end:
                    break
                with memoryview(buf) as whole:  # read in place; released before the buffer is cut
                    frame = whole[pos + ANSWER_HEADER.size:end]
                    pos = end
                    if not worker.ready:
                        worker.ready = frame == READY
                        frame.release()
                        if not worker.ready:
                            return  # not our worker's first word: treat as a failed start
                        self._wake()
                        continue
                    try:
                        self._answer(worker, frame)
                    finally:
                        frame.release()
            if pos:
                del buf[:pos]

    def _answer(self, worker: _Worker, frame: memoryview) -> None:
        if not worker.pending:
            log.error("a page worker answered a job it was not given; restarting it")
            worker.process.kill()
            return
        task = worker.pending.popleft()
        worker.queued -= task.size
        worker.solo = False
        worker.since = trio.current_time()
        worker.served += 1
        self.pages += 1
        try:
            reply = pickle.loads(frame)
            if reply[0] == 3:
                page = None if reply[2] is None else page_of(reply[2])
                task.outcome = (True, PageResult(None, page, reply[1], reply[3], reply[4], reply[5]))
            elif reply[0] == 1:
                page = None if reply[2] is None else page_of(reply[2])
                built = None if reply[1] is None else BuiltPage(*reply[1])
                task.outcome = (True, PageResult(built=built, page=page, outcome=reply[3]))
            else:
                task.outcome = (reply[0] == 2, reply[1])
        except Exception as exc:
            task.outcome = (False, PageWorkerError(f"page worker's answer unreadable: {exc}"))
        task.done.set()
        self._wake()

    async def _reap(self, worker: _Worker) -> int | None:
        """Wait for a worker whose socket ended to exit (it does at end of input), killing it if it does not."""
        process = worker.process
        await trio.to_thread.run_sync(process.join, _STOP_WAIT)
        if process.exitcode is None:
            process.kill()
            await trio.to_thread.run_sync(process.join, _STOP_WAIT)
        code = process.exitcode
        if code is not None:
            process.close()
        return code

    async def _watchdog(self) -> None:
        """Kill a worker that has held one job longer than `timeout`; its supervisor does the rest."""
        while True:
            await trio.sleep(min(1.0, self.timeout / 4))
            now = trio.current_time()
            for worker in self._slots:
                if worker is not None and worker.pending and not worker.timed_out and \
                        now - worker.since > self.timeout:
                    worker.timed_out = True
                    self.timeouts += 1
                    log.warning("a page worker held one page past the timeout; killing it",
                                extra={"url": worker.pending[0].url, "timeout": self.timeout})
                    worker.process.kill()

    async def _stop(self) -> None:
        """End of input for every worker, then wait for them to exit (killing the ones that do not)."""
        workers = [w for w in self._slots if w is not None]
        for worker in workers:
            if worker.stream.socket.fileno() >= 0:
                await worker.stream.aclose()
        for worker in workers:
            await self._reap(worker)


async def _send_parts(sock: trio.socket.SocketType, parts: list[bytes | memoryview]) -> None:
    """Write every byte of `parts`, in order, with as few ``sendmsg`` calls as the socket takes (at most
    _IOV_MAX parts a call)."""
    i = 0
    while i < len(parts):  # bounded: each call writes at least one byte or raises
        batch = parts[i:i + _IOV_MAX]
        sent = await sock.sendmsg(batch)
        for part in batch:  # drop what was written, whole parts, then the written head of one
            if sent >= len(part):
                sent -= len(part)
                i += 1
                continue
            if sent:
                parts[i] = memoryview(part)[sent:]
            break


@asynccontextmanager
async def open_page_workers(processes: int, **options: Any) -> AsyncIterator[PageWorkers]:
    """N page worker processes for the lifetime of the block; stopped cleanly when it ends."""
    pool = PageWorkers(processes, **options)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.serve)
            try:
                yield pool
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await pool._stop()
