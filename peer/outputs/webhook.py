"""The webhook: an HTTP POST for every WARC file uploaded (with `--upload`) or closed (without), signed, retried,
and never in the crawl's way.

The body is JSON: `{"id", "event": "uploaded"|"closed", "node", "file", "key", "size", "sha256", "records",
"at"}` (`key` is the object key, null for a file not uploaded; `records` the responses and revisits the file
holds). The header `X-Peercrawl-Signature: sha256=HEX` is the HMAC-SHA256 of the body with the webhook secret;
`X-Peercrawl-Event` is the event id, the same on every try, so a receiver that sees it twice drops the repeat.

Notices wait in the node's store (`Uploads.notices`): an uploaded file's notice is written in the commit that
records its upload, a closed file's when the sender first sees it closed. One notice is sent at a time, oldest
event id first; a 2xx answer deletes it, anything else (or no answer) is tried again after a back-off of 1 s
doubling to a minute.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from storage import Uploads

from peer.outputs.dirwatch import DirWatch

__all__ = ["WebhookSender", "notice_body", "sign"]

log = logging.getLogger(__name__)

#: Seconds between looks for new notices when none waits: the store is read only when a notice was written since
#: the last look (`Uploads.notices_added`), the WARC directory listed only when it changed (`DirWatch`).
POLL = 1.0
MAX_BACKOFF = 60.0
#: A receiver gets this long to answer one POST.
TIMEOUT = 10.0


def sign(secret: bytes, body: bytes) -> str:
    """The `X-Peercrawl-Signature` header's value for `body`."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def notice_body(*, event: str, node: str, file: str, key: str | None, size: int, sha256: str, records: int,
                at: float) -> tuple[str, bytes]:
    """(event id, JSON body) of one notice."""
    event_id = f"{node}/{event}/{file}"
    body = {"id": event_id, "event": event, "node": node, "file": file, "key": key, "size": size, "sha256": sha256,
            "records": records, "at": round(at, 3)}
    return event_id, json.dumps(body, sort_keys=True).encode("utf-8")


def records_in(index: Path) -> int:
    """The records a closed WARC file's CDXJ index lists (one line each)."""
    try:
        with open(index, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except FileNotFoundError:
        return 0


def closed_notice(path: Path, node: str) -> tuple[str, bytes]:
    """The notice of a closed (not uploaded) WARC file: its size, SHA-256 and record count, read from the disk."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    index = path.with_name(path.name[: -len(".warc.gz")] + ".cdxj")
    return notice_body(event="closed", node=node, file=path.name, key=None, size=size, sha256=sha.hexdigest(),
                       records=records_in(index), at=time.time())


class WebhookSender:
    """The webhook task of one node (`run`), and what status and metrics show of it."""

    def __init__(self, *, uploads: Uploads, url: str, secret: bytes, node_id: str, directory: Path,
                 closed_files: bool, transport: httpx.AsyncBaseTransport | None = None) -> None:
        """`closed_files`: announce closed files (a node without --upload); otherwise only the notices the
        uploader writes with each upload."""
        self.uploads = uploads
        self.url = url
        self.secret = secret
        self.node_id = node_id
        self.directory = directory
        self.closed_files = closed_files
        self._transport = transport
        self.sent = 0
        self.failures = 0
        self.waiting = 0
        self.last_error: str | None = None
        self.failing_since: float | None = None
        self._watch = DirWatch(directory, trio.current_time)
        # one client for the node's life, made with the node (tens of ms of CPU): TLS settings (the CA bundle's
        # load) only for a receiver that speaks it; redirects are not followed
        self._http = httpx.AsyncClient(transport=transport, timeout=TIMEOUT, verify=url.startswith("https:"))

    async def _thread(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(functools.partial(fn, *args))

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        backoff = 1.0
        looked = -1  # `notices_added` when the last look found none waiting
        client = self._http
        while True:
            if self.closed_files and self._watch.changed():
                await self._note_closed()
            added = self.uploads.notices_added
            if added == looked:
                await trio.sleep(POLL)
                continue
            notices = self.uploads.notices()
            self.waiting = self.uploads.notices_waiting()
            failed = False
            for event_id, body in notices:
                if not await self._post(client, event_id, body):
                    failed = True
                    break
                self.uploads.notice_sent(event_id)
                self.sent += 1
                self.waiting = max(0, self.waiting - 1)
            if failed:
                await trio.sleep(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
                continue
            backoff = 1.0
            if not notices:
                looked = added
                await trio.sleep(POLL)

    async def flush(self) -> None:
        """Send what waits once, stopping at the first failure (a node's last act before it stops; bound it with
        a deadline); its client is closed then. What is left is sent after the next start."""
        try:
            if self.closed_files:
                await self._note_closed()
            for event_id, body in self.uploads.notices(1 << 30):
                if not await self._post(self._http, event_id, body):
                    return
                self.uploads.notice_sent(event_id)
                self.sent += 1
        finally:
            await self._http.aclose()

    async def _note_closed(self) -> None:
        for path in self.uploads.unnoticed(self.directory):
            try:
                event_id, body = await self._thread(closed_notice, path, self.node_id)
            except FileNotFoundError:
                continue
            self.uploads.notice_closed(path.name, event_id, body)

    async def _post(self, client: httpx.AsyncClient, event_id: str, body: bytes) -> bool:
        headers = {"content-type": "application/json", "x-peercrawl-event": event_id,
                   "x-peercrawl-signature": sign(self.secret, body), "user-agent": "peercrawl-webhook"}
        try:
            reply = await client.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return self._failed(f"POST {self.url}: {type(exc).__name__}: {exc}")
        if not 200 <= reply.status_code < 300:
            return self._failed(f"POST {self.url}: HTTP {reply.status_code}")
        if self.last_error is not None:
            log.info("webhook accepted again", extra={"url": self.url})
        self.last_error = None
        self.failing_since = None
        return True

    def _failed(self, error: str) -> bool:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = time.time()
        if error != self.last_error:
            log.warning("webhook failed; retrying", extra={"error": error})
        self.last_error = error
        return False

    def status(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "ok": self.last_error is None,
            "error": self.last_error,
            "failing_for": round(time.time() - self.failing_since, 1) if self.failing_since is not None else 0.0,
            "waiting": self.waiting,
            "sent": self.sent,
            "failures": self.failures,
        }
