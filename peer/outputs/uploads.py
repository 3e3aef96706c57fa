"""The uploader: sends the node's closed WARC files and their CDXJ indexes to object storage, and never stalls
the crawl while it does.

The store's transactions run on the node's own thread (they are short: a few keys each, and one fsync per
uploaded file); reading and hashing files and the S3 calls run in worker threads. Once a second it queues the
closed files of the WARC directory in the node's store (`Uploads.sweep`: a file
closed just before a kill -9 is queued at the next start), then sends the queue oldest first. A second that
changed nothing in the directory (`DirWatch`: one `stat`) costs no sweep. Each file goes
to the key `PREFIX/NODE_ID/FILE`, so sending it again (after a kill mid-upload, or a crash between the upload
and its record) overwrites the one object rather than adding another; a file an earlier run may have sent, or
whose sending failed, is first looked up in the bucket (sent already: recorded, not sent again) and its
unfinished multipart uploads aborted. An object is recorded as uploaded only
when the server's size and SHA-256 checksum match the local file's (`ObjectStore.verify`); the local WARC file is
removed after that record is on disk, unless `keep_local`. A CDXJ index stays (it is about 1/300 of its WARC
file): the node answers look-ups from it (`GET /cdx`), naming the object its record went to.

A server that is down or refuses the credentials leaves the files queued: the uploader retries with back-off
(1 s doubling to a minute), the error is in /status, /metrics and the dashboard, and the crawl goes on until
the files waiting pass `max_local_bytes`; then the node stops starting host turns (`hold`) until the queue
is back under the bound.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from peer.outputs.dirwatch import DirWatch
from peer.outputs.s3 import FileDigest, ObjectStore, UploadError, file_digest
from peer.outputs.webhook import notice_body, records_in
from storage import Uploaded, Uploads, closed_files

__all__ = ["Uploader"]

log = logging.getLogger(__name__)

#: Seconds between looks at the WARC directory when the queue is empty (a sweep when it changed).
SWEEP_INTERVAL = 1.0
#: The longest wait between two tries of a failing upload.
MAX_BACKOFF = 60.0


class Uploader:
    """The upload task of one node (`run`), and what status and metrics show of it."""

    def __init__(self, *, uploads: Uploads, directory: Path, objects: ObjectStore, node_id: str,
                 keep_local: bool, max_local_bytes: int, hold: Callable[[bool], None],
                 threads: int = 2, notify: bool = False) -> None:
        """`hold(True)` stops the crawl from starting host turns, `hold(False)` lets it go on. `notify`: each
        uploaded WARC file's webhook notice is written with its upload record (peer/outputs/webhook.py)."""
        self.notify = notify
        self.uploads = uploads
        self.directory = directory
        self.objects = objects
        self.node_id = node_id
        self.keep_local = keep_local
        self.max_local_bytes = max_local_bytes
        self._hold = hold
        self._limiter = trio.CapacityLimiter(threads)
        self.held = False
        self.queued_files = 0
        self.queued_bytes = 0
        self.oldest_queued_at: float | None = None
        self.uploaded_files = 0
        self.uploaded_bytes = 0
        self.failures = 0  # failed tries since the start
        self.failing_since: float | None = None
        self.last_error: str | None = None
        self.last_error_kind: str | None = None
        self.lost_files = 0  # queued files gone from the disk and not in the bucket
        self._wake = trio.Event()
        self._watch = DirWatch(directory, trio.current_time)
        # files an earlier run may have sent (queued or closed when this one began) and files whose sending failed
        # here: looked up in the bucket before they are sent; a file closed and queued since is sent straight away
        self._inherited: set[str] | None = None
        self._tried: set[str] = set()

    def key(self, name: str) -> str:
        return self.objects.target.key(self.node_id, name)

    def wake(self) -> None:
        """A file was closed: sweep now rather than at the next interval."""
        self._wake.set()

    async def _thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=self._limiter)

    # ------------------------------------------------------------------ the task

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self._sweep()
        task_status.started()
        backoff = 1.0
        while True:
            failed = False
            for name, _size, _at in self.uploads.pending():
                try:
                    await self._send(name)
                except UploadError as exc:
                    self._failed(exc)
                    failed = True
                    break
                self._ok()
                await self._sweep()
            if failed:
                await trio.sleep(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
                await self._sweep()
                continue
            backoff = 1.0
            with trio.move_on_after(SWEEP_INTERVAL):
                await self._wake.wait()
            woken, self._wake = self._wake.is_set(), trio.Event()
            if woken or self._watch.changed():
                await self._sweep()

    async def flush(self) -> None:
        """Send what is queued once, stopping at the first failure (a node's last act before it stops; bound it
        with a deadline)."""
        await self._sweep()
        for name, _size, _at in self.uploads.pending():
            try:
                await self._send(name)
            except UploadError as exc:
                self._failed(exc)
                log.warning("files left for upload at the next start",
                            extra={"queued_files": self.queued_files, "error": str(exc)})
                return
            self._ok()

    async def _sweep(self) -> None:
        """Queue newly closed files, remove local copies already uploaded, and hold or free the crawl."""
        self.uploads.sweep(self.directory, time.time())
        if not self.keep_local:
            self._remove_uploaded()
        pending = self.uploads.pending()
        if self._inherited is None:
            self._inherited = {name for name, _size, _at in pending}
        self.queued_files = len(pending)
        self.queued_bytes = sum(size for _name, size, _at in pending)
        self.oldest_queued_at = min((at for _name, _size, at in pending), default=None)
        hold = self.queued_bytes >= self.max_local_bytes
        if hold != self.held:
            self.held = hold
            self._hold(hold)
            if hold:
                log.warning("fetching paused: the files waiting for upload fill the local bound",
                            extra={"queued_bytes": self.queued_bytes, "max_local_bytes": self.max_local_bytes,
                                   "error": self.last_error})
            else:
                log.info("fetching resumed: the upload queue is under its bound",
                         extra={"queued_bytes": self.queued_bytes, "max_local_bytes": self.max_local_bytes})

    def _remove_uploaded(self) -> None:
        """Local files recorded as uploaded but still here (a kill between the record and the removal)."""
        for path in closed_files(self.directory):
            if path.name.endswith(".warc.gz") and self.uploads.uploaded(path.name) is not None:
                path.unlink(missing_ok=True)

    async def _send(self, name: str) -> None:
        path = self.directory / name
        key = self.key(name)
        objects = self.objects
        try:
            digest: FileDigest = await self._thread(file_digest, path, objects.part_size)
        except FileNotFoundError:
            await self._gone(name, key)
            return
        inherited = self._inherited is None or name in self._inherited or name in self._tried
        self._tried.add(name)
        there = await self._thread(objects.head, key) if inherited else None
        if there is not None and await self._thread(objects.matches, there, path, digest):
            etag = there.etag  # uploaded before a kill took the record with it: one object, nothing to send
        else:
            if inherited:
                await self._thread(objects.abort_stale, key)
            if len(digest.parts) == 1:
                await self._thread(objects.put, path, key, digest)
            else:
                upload_id = await self._thread(objects.start_parts, key, digest)
                etags = []
                for number in range(1, len(digest.parts) + 1):
                    etags.append(await self._thread(objects.put_part, path, key, upload_id, number, digest))
                await self._thread(objects.finish_parts, key, upload_id, etags, digest)
            etag = await self._thread(objects.verify, key, path, digest)
        record = Uploaded(key=key, size=digest.size, sha256=digest.sha256, etag=etag, at=time.time())
        notice = None
        if self.notify and name.endswith(".warc.gz"):
            index = path.with_name(name[: -len(".warc.gz")] + ".cdxj")
            records = await self._thread(records_in, index)
            notice = notice_body(event="uploaded", node=self.node_id, file=name, key=key, size=digest.size,
                                 sha256=digest.sha256, records=records, at=record.at)
        self.uploads.done(name, record, notice)
        self._tried.discard(name)
        if self._inherited is not None:
            self._inherited.discard(name)
        if not self.keep_local and name.endswith(".warc.gz"):  # the index stays for look-ups
            path.unlink(missing_ok=True)
        self.uploaded_files += 1
        self.uploaded_bytes += digest.size
        log.info("uploaded", extra={"file": name, "key": key, "size": digest.size, "sha256": digest.sha256})

    async def _gone(self, name: str, key: str) -> None:
        """A queued file is no longer on the disk: recorded as uploaded if its object is in the bucket (the record
        of a verified upload was lost with the machine), else dropped from the queue and counted as lost."""
        self._tried.discard(name)
        there = await self._thread(self.objects.head, key)
        if there is not None:
            self.uploads.done(name, Uploaded(key=key, size=there.size, sha256=there.sha256, etag=there.etag,
                                             at=time.time()))
            return
        self.uploads.forget(name)
        self.lost_files += 1
        log.error("a queued file is gone from the disk and is not in the bucket", extra={"file": name, "key": key})

    def _failed(self, exc: UploadError) -> None:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = time.time()
        if str(exc) != self.last_error:
            log.warning("upload failed; retrying", extra={"error": str(exc), "kind": exc.kind})
        self.last_error, self.last_error_kind = str(exc), exc.kind

    def _ok(self) -> None:
        if self.last_error is not None:
            log.info("uploads work again", extra={"failed_for": round(time.time() - (self.failing_since or 0), 1)})
        self.last_error = self.last_error_kind = None
        self.failing_since = None

    # ------------------------------------------------------------------ what status and metrics show

    def status(self) -> dict[str, Any]:
        now = time.time()
        return {
            "target": self.objects.target.url(),
            "ok": self.last_error is None,
            "error": self.last_error,
            "error_kind": self.last_error_kind,
            "failing_for": round(now - self.failing_since, 1) if self.failing_since is not None else 0.0,
            "failures": self.failures,
            "queued_files": self.queued_files,
            "queued_bytes": self.queued_bytes,
            "lag": round(now - self.oldest_queued_at, 1) if self.oldest_queued_at is not None else 0.0,
            "uploaded_files": self.uploaded_files,
            "uploaded_bytes": self.uploaded_bytes,
            "lost_files": self.lost_files,
            "max_local_bytes": self.max_local_bytes,
            "fetching_paused": self.held,
            "keep_local": self.keep_local,
        }
