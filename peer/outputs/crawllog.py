"""The crawl log: one record per finished URL, handed on from the node's store to rotating local files and to a
Redis stream, at least once, never in the crawl's way.

A record is spooled in the store in the commit that finishes its page (`storage.CrawlLogSpool`); each reader
here takes the records after its mark, hands them on, and only then moves its mark (a kill between the two
repeats a batch, never loses one). Its id is `NODE_ID-NUMBER`, the same on every repeat, so a consumer that
keeps the ids it has seen drops repeats.

- The local files (`LocalLog`, reader `file`): `DATA_DIR/crawl-log/crawl.log` in Heritrix's crawl.log layout
  and `crawl.jsonl` as JSON lines, rotated at a size or an age (renamed `crawl.log.YYYYMMDDTHHMMSSZ`), the
  oldest rotated files removed past a count.
- The stream (`StreamLog`, reader `stream`): one XADD per record with `MAXLEN ~ N` and the fields `id`, `url`
  and `record` (the record as a JSON object), batches of up to 500 written at once and their replies read, in a
  worker thread with a socket timeout. The commands are written as RESP here: redis-py's own packing of them
  cost more CPU than the rest of the crawl log together. A broker that is down, slow or refusing is retried with a
  back-off (1 s doubling to 30 s); meanwhile records wait in the spool, whose bound (`crawl_log_spool`) drops
  and counts what comes past it, with a warning. The crawl never waits for the broker.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring as _quote
from json.encoder import encode_basestring_ascii as _quote_ascii
from pathlib import Path
from typing import Any, TextIO

import trio

from storage import LOG_FIELDS, CrawlLogSpool

from peer.config import StreamTarget

__all__ = ["CrawlLog", "LocalLog", "RotatingFile", "StreamError", "StreamLog", "json_line", "record_fields", "text_line"]

log = logging.getLogger(__name__)

#: Records one reader hands on per step (one pipeline, one file write).
BATCH = 500
#: Seconds a reader that has caught up waits before it looks again: a record reaches its readers within about
#: this, in batches of what came meanwhile. A reader reads the store only when the crawl put records there since
#: its last look (a count in memory), so an idle node's readers cost no transaction.
POLL = 1.0
MAX_BACKOFF = 30.0
#: Seconds the stream's client waits for the broker before a try counts as failed.
SOCKET_TIMEOUT = 5.0
#: At most one warning about dropped records per this many seconds.
DROP_WARNING_EVERY = 60.0


#: The seconds formatted lately, each as "%Y-%m-%dT%H:%M:%S" and "%Y%m%d%H%M%S" (cleared past a bound).
_SECONDS: dict[int, tuple[str, str]] = {}


def _second(second: int) -> tuple[str, str]:
    known = _SECONDS.get(second)
    if known is None:
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        stamp = time.gmtime(second)
        known = _SECONDS[second] = (time.strftime("%Y-%m-%dT%H:%M:%S", stamp), time.strftime("%Y%m%d%H%M%S", stamp))
    return known


def _iso(at: float) -> str:
    second, ms = divmod(int(at * 1000), 1000)
    return f"{_second(second)[0]}.{ms:03d}Z"


def _compact(at: float) -> str:
    second, ms = divmod(int(at * 1000), 1000)
    return f"{_second(second)[1]}{ms:03d}"


def _command(*args: bytes) -> bytes:
    """One command in RESP, Redis's protocol: an array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(arg), arg) for arg in args)


def record_fields(node: str, seq: int, fields: Sequence[Any]) -> dict[str, Any]:
    """A record as a dict: its id, node and number, then `LOG_FIELDS` (times in ISO 8601, UTC)."""
    out: dict[str, Any] = {"id": f"{node}-{seq}", "node": node, "seq": seq}
    out.update(zip(LOG_FIELDS, fields))
    out["time"] = _iso(out["time"])
    out["fetch_began"] = _iso(out["fetch_began"])
    if not out["warc"]:
        out["warc"], out["offset"] = None, None
    return out


def lines(node: str, records: Sequence[tuple[int, Sequence[Any]]], *, text: bool = True,
          as_json: bool = True) -> tuple[list[str], list[str]]:
    """The records' `text_line`s (if `text`) and `json_line`s (if `as_json`), made in one pass: the crawl log's CPU
    is per page, and the two layouts share a record's unpacking, its time and its id."""
    seconds, second_of = _SECONDS, _second
    quote, quote_ascii = _quote, _quote_ascii
    node_q, node_a = quote(node), quote_ascii(node)
    id_q, id_a = node_q[:-1] + "-", node_a[:-1] + "-"  # the id is NODE-SEQ: the node's escaping and digits
    texts: list[str] = []
    jsons: list[str] = []
    for seq, (at, status, size, url, path, via, mime, began, took, digest, notes, warc, offset) in records:
        second, ms = divmod(int(at * 1000), 1000)
        when = f"{(seconds.get(second) or second_of(second))[0]}.{ms:03d}Z"
        start_second, start_ms = divmod(int(began * 1000), 1000)
        start = seconds.get(start_second) or second_of(start_second)
        if as_json:
            where = f'{quote(warc)},"offset":{offset:d}' if warc else 'null,"offset":null'
            jsons.append(f'{{"id":{id_q}{seq:d}","node":{node_q},"seq":{seq:d},"time":"{when}","status":{status:d},'
                         f'"size":{size:d},"url":{quote(url)},"path":{quote(path)},"via":{quote(via)},'
                         f'"mime":{quote(mime)},"fetch_began":"{start[0]}.{start_ms:03d}Z","duration_ms":{took:d},'
                         f'"digest":{quote(digest)},"annotations":{quote(notes)},"warc":{where}}}\n')
        if text:
            where = f',"warc":{quote_ascii(warc)},"offset":{offset:d}}}' if warc else "}"
            texts.append(f"{when} {status:5d} {size if size >= 0 else '-':>10} {url} {path} {via} {mime} - "
                         f"{start[1]}{start_ms:03d}+{took} {digest} - {notes} "
                         f'{{"id":{id_a}{seq:d}","node":{node_a}{where}\n')
    return texts, jsons


def json_line(node: str, seq: int, fields: Sequence[Any]) -> str:
    """`record_fields` as one line of compact JSON (non-ASCII kept), written field by field: the same text
    `json.dumps(record_fields(...), separators=(",", ":"), ensure_ascii=False)` gives, at a fraction of its CPU
    (strings escaped by the json module's own C escaper)."""
    return lines(node, [(seq, fields)], text=False)[1][0]


def text_line(node: str, seq: int, fields: Sequence[Any]) -> str:
    """A record in Heritrix's crawl.log layout: time, status (5 wide), size (10 wide, "-": none), URL, discovery
    path, via, MIME, thread ("-": a node has none to name), fetch start+duration (ms), digest, source tag,
    annotations, and the extra JSON Heritrix ends a line with: here the record id, node, WARC file and offset
    (ASCII JSON, as `json.dumps` writes it)."""
    return lines(node, [(seq, fields)], as_json=False)[0][0]


class RotatingFile:
    """An append-only text file rotated at `max_bytes` or `max_age` seconds (renamed with its UTC time), keeping
    the newest `keep` rotated files. `now` gives the wall clock (a test passes its own)."""

    def __init__(self, path: Path, *, max_bytes: int, max_age: float, keep: int,
                 now: Callable[[], float] = time.time) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.keep = keep
        self._now = now
        self._fh: TextIO | None = None
        self._size = 0
        self._opened = 0.0
        self.rotations = 0

    def _open(self) -> TextIO:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a", encoding="utf-8")
        self._size = fh.tell()
        try:  # a file kept from the last run is as old as its first line
            self._opened = os.stat(self.path).st_ctime if self._size else self._now()
        except OSError:
            self._opened = self._now()
        self._fh = fh
        return fh

    def write(self, text: str) -> None:
        """Append `text` (whole lines) and flush it to the kernel; rotate first when the file is full or old."""
        fh = self._fh or self._open()
        if self._size and (self._size >= self.max_bytes or self._now() - self._opened >= self.max_age):
            self.rotate()
            fh = self._open()
        fh.write(text)
        fh.flush()
        self._size += len(text.encode("utf-8")) if not text.isascii() else len(text)

    def rotate(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if not self.path.exists():
            return
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._now()))
        target = self.path.with_name(f"{self.path.name}.{stamp}")
        serial = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.{stamp}-{serial}")
            serial += 1
        os.replace(self.path, target)
        self.rotations += 1
        for old in self.rotated()[: -self.keep]:
            old.unlink(missing_ok=True)

    def rotated(self) -> list[Path]:
        """The rotated files, oldest first."""
        return sorted(self.path.parent.glob(self.path.name + ".*"))

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class LocalLog:
    """Reader `file`: the local crawl-log files (`formats`: "text", "json" or both)."""

    reader = "file"

    def __init__(self, directory: Path, formats: Sequence[str], *, max_bytes: int, max_age: float, keep: int,
                 now: Callable[[], float] = time.time) -> None:
        self.uses_json = "json" in formats  # hand_on takes the records' JSON lines made once for every reader
        self.text: RotatingFile | None = None
        self.json: RotatingFile | None = None
        if "text" in formats:
            self.text = RotatingFile(directory / "crawl.log", max_bytes=max_bytes, max_age=max_age, keep=keep,
                                     now=now)
        if "json" in formats:
            self.json = RotatingFile(directory / "crawl.jsonl", max_bytes=max_bytes, max_age=max_age, keep=keep,
                                     now=now)

    @property
    def files(self) -> list[RotatingFile]:
        return [f for f in (self.text, self.json) if f is not None]

    def target(self) -> str:
        return ", ".join(str(f.path) for f in self.files)

    async def hand_on(self, node: str, records: Sequence[tuple[int, list[Any]]],
                      json_lines: Sequence[str] | None = None) -> None:
        """Append `records` to each file; `json_lines`: their `json_line`s if made already."""
        texts, made = lines(node, records, text=self.text is not None,
                            as_json=self.json is not None and json_lines is None)
        if self.text is not None:
            self.text.write("".join(texts))
        if self.json is not None:
            self.json.write("".join(made if json_lines is None else json_lines))

    def close(self) -> None:
        for rotating in self.files:
            rotating.close()


class StreamError(Exception):
    """The broker answered a command with an error (a wrong password, a wrong type at the stream's key, ...)."""


class _Redis:
    """One connection to a Redis server, speaking its protocol (RESP) directly: commands written as bytes, each
    reply read and checked, an error reply raised. Made on first use (AUTH and SELECT first, when set), closed
    after any failure and made again by the next call. Blocking, with a socket timeout: run it in a worker
    thread."""

    def __init__(self, target: StreamTarget) -> None:
        self.target = target
        self._sock: socket.socket | None = None
        self._buf = bytearray()

    def _connect(self) -> socket.socket:
        target = self.target
        sock = socket.create_connection((target.host, target.port), timeout=SOCKET_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._buf = sock, bytearray()
        hello = []
        if target.password:
            hello.append(_command(b"AUTH", target.password.encode("utf-8")))
        if target.db:
            hello.append(_command(b"SELECT", str(target.db).encode()))
        if hello:
            sock.sendall(b"".join(hello))
            self._replies(sock, len(hello))
        return sock

    def call(self, commands: bytes, count: int) -> None:
        """Send `count` commands (RESP, back to back) and read their `count` replies; raises OSError (no broker,
        a timeout) or StreamError (an error reply), and the connection is closed then."""
        try:
            sock = self._sock or self._connect()
            sock.sendall(commands)
            self._replies(sock, count)
        except BaseException:
            self.close()
            raise

    def _replies(self, sock: socket.socket, count: int) -> None:
        buf, pos = self._buf, 0
        while count:
            end = buf.find(b"\r\n", pos)
            if end >= 0:
                kind = buf[pos:pos + 1]
                if kind == b"$":  # a bulk string (XADD's entry id), or $-1 (none)
                    size = int(buf[pos + 1:end])
                    after = end + 2 + (size + 2 if size >= 0 else 0)
                    if len(buf) >= after:
                        pos, count = after, count - 1
                        continue
                elif kind in (b"+", b":"):  # a status (OK) or an integer
                    pos, count = end + 2, count - 1
                    continue
                elif kind == b"-":
                    raise StreamError(bytes(buf[pos + 1:end]).decode("utf-8", "replace"))
                else:
                    raise StreamError(f"an unexpected reply from the broker: {bytes(buf[pos:end])[:100]!r}")
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError(f"{self.target.host}:{self.target.port} closed the connection")
            buf += chunk
        del buf[:pos]

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class StreamLog:
    """Reader `stream`: XADD to a Redis stream, in a worker thread."""

    reader = "stream"
    uses_json = True

    def __init__(self, target: StreamTarget) -> None:
        self.stream = target
        self._redis = _Redis(target)
        self._limiter = trio.CapacityLimiter(1)
        # an entry's command up to its id's value: twelve arguments, the first seven the same for every entry
        self._head = b"*12\r\n" + _command(b"XADD", target.stream.encode("utf-8"), b"MAXLEN", b"~",
                                            str(target.maxlen).encode(), b"*", b"id").split(b"\r\n", 1)[1]

    def target(self) -> str:
        return self.stream.url()

    def _send(self, node: str, records: Sequence[tuple[int, list[Any]]], lines: Sequence[str]) -> None:
        # XADD STREAM MAXLEN ~ N * id ID url URL record JSON, one per record, written at once; then every reply
        # is read (an error reply raises: the batch is sent again, at least once)
        head = self._head
        blob = b"".join([head + b"$%d\r\n%b\r\n$3\r\nurl\r\n$%d\r\n%b\r\n$6\r\nrecord\r\n$%d\r\n%b\r\n" % (
            len(rid), rid, len(url), url, len(body), body)
            for rid, url, body in ((f"{node}-{seq}".encode("utf-8"), fields[3].encode("utf-8"),
                                    line[:-1].encode("utf-8")) for (seq, fields), line in zip(records, lines))])
        self._redis.call(blob, len(records))

    async def hand_on(self, node: str, records: Sequence[tuple[int, list[Any]]],
                      json_lines: Sequence[str] | None = None) -> None:
        """`json_lines`: the records' `json_line`s if made already (the JSON file's reader made them)."""
        if json_lines is None:
            json_lines = lines(node, records, text=False)[1]
        await trio.to_thread.run_sync(functools.partial(self._send, node, records, json_lines),
                                      limiter=self._limiter, abandon_on_cancel=True)

    def close(self) -> None:
        self._redis.close()


class _Reader:
    """One reader's progress and errors, as status shows them."""

    def __init__(self, out: LocalLog | StreamLog) -> None:
        self.out = out
        self.handed_on = 0  # records handed on since the start
        self.failures = 0
        self.error: str | None = None
        self.failing_since: float | None = None
        self.looked_at = -1  # the spool's `puts` when this reader last found nothing more to hand on
        self.position = -1  # the last record it handed on, in this run


class CrawlLog:
    """The crawl log's readers of one node (`run`), and what status and metrics show of them."""

    def __init__(self, spool: CrawlLogSpool, node_id: str, outputs: Sequence[LocalLog | StreamLog], *,
                 limit: int) -> None:
        spool.configure(limit=limit, readers=[out.reader for out in outputs])
        self.spool = spool
        self.node_id = node_id
        self.readers = [_Reader(out) for out in outputs]
        # the JSON line of each record not yet handed on by every reader that writes JSON, made once for all
        self._shared_json = sum(out.uses_json for out in outputs) > 1
        self._lines: dict[int, str] = {}
        self._records: list[tuple[int, list[Any]]] = []  # read by a reader, not yet handed on by every reader
        self._dropped_at_start = spool.dropped()
        self._warned_drops = self._dropped_at_start
        self._warned_at = -DROP_WARNING_EVERY
        self._drops_checked = spool.drops_hint  # the spool's drop count in memory when no drop was left unwarned

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for reader in self.readers:
                nursery.start_soon(self._serve, reader)
            task_status.started()

    async def _serve(self, reader: _Reader) -> None:
        backoff = 1.0
        while True:
            puts = self.spool.puts
            if puts == reader.looked_at:  # nothing put since this reader caught up: no look at the store
                await trio.sleep(POLL)
                continue
            try:
                moved = await self.step(reader)
            except Exception as exc:  # noqa: BLE001 - a broker's or a disk's error: counted, shown, retried
                self._failed(reader, exc)
                await trio.sleep(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
                continue
            backoff = 1.0
            self._check_drops()
            if moved < BATCH:
                reader.looked_at = puts  # caught up with what was put before this look
                await trio.sleep(POLL)

    async def step(self, reader: _Reader) -> int:
        """Hand on one batch of what `reader` has not; how many records. Raises what the hand-on raised (the
        mark stays where it was)."""
        records = self._take(reader)
        if not records:
            return 0
        if reader.out.uses_json:
            await reader.out.hand_on(self.node_id, records, self._json_lines(records))
        else:
            await reader.out.hand_on(self.node_id, records)
        self.spool.handed_on(reader.out.reader, records[-1][0])
        reader.handed_on += len(records)
        reader.position = records[-1][0]
        self._forget()
        if reader.error is not None:
            log.info("crawl log reaches its reader again", extra={"reader": reader.out.reader,
                                                                  "target": reader.out.target()})
        reader.error, reader.failing_since = None, None
        return len(records)

    def _take(self, reader: _Reader) -> list[tuple[int, list[Any]]]:
        """Up to BATCH records after `reader`'s mark: from those another reader read already when they follow on
        from its position (each record read from the store and unpacked once for every reader), the rest from
        the store."""
        if len(self.readers) == 1:
            return self.spool.after(reader.out.reader, BATCH)
        cached, first = self._records, reader.position + 1
        if reader.position >= 0 and cached and cached[0][0] <= first <= cached[-1][0] + 1:
            got = cached[first - cached[0][0]:first - cached[0][0] + BATCH]
            if len(got) < BATCH:
                more = self.spool.after(reader.out.reader, BATCH - len(got), start=cached[-1][0] + 1)
                cached.extend(more)
                got.extend(more)
            return got
        got = self.spool.after(reader.out.reader, BATCH)
        if got and (not cached or got[0][0] > cached[-1][0] + 1):
            self._records = list(got)  # a reader far behind reads its own, and leaves the others' here
        elif got and got[0][0] == cached[-1][0] + 1:
            cached.extend(got)
        return got

    def _json_lines(self, records: Sequence[tuple[int, list[Any]]]) -> list[str]:
        if not self._shared_json:
            return lines(self.node_id, records, text=False)[1]
        made, missing = self._lines, [(seq, fields) for seq, fields in records if seq not in self._lines]
        if missing:
            for (seq, _fields), line in zip(missing, lines(self.node_id, missing, text=False)[1]):
                made[seq] = line
        return [made[seq] for seq, _fields in records]

    def _forget(self) -> None:
        """Drop the records and JSON lines every reader has handed on; past a bound the oldest (a reader far
        behind reads and makes its own again)."""
        if len(self.readers) == 1:
            return
        done = min(r.position for r in self.readers)
        cached = self._records
        if cached and cached[0][0] <= done:
            del cached[:done + 1 - cached[0][0]]
        if len(cached) > 4 * BATCH:
            del cached[:len(cached) - 2 * BATCH]
        made = self._lines
        if made:
            if len(made) > 4 * BATCH:
                made.clear()
                return
            done_json = min(r.position for r in self.readers if r.out.uses_json)
            while made:
                first = next(iter(made))
                if first > done_json:
                    break
                del made[first]

    async def flush(self) -> None:
        """Hand on what is spooled once, each reader until its first failure (a node's last act before it stops;
        bound it with a deadline)."""
        for reader in self.readers:
            try:
                while await self.step(reader):
                    pass
            except Exception as exc:  # noqa: BLE001 - left spooled for the next start
                self._failed(reader, exc)

    def _failed(self, reader: _Reader, exc: Exception) -> None:
        reader.failures += 1
        message = f"{type(exc).__name__}: {exc}"
        if reader.failing_since is None:
            reader.failing_since = time.time()
        if message != reader.error:
            log.warning("crawl log not handed on; retrying (records wait in the spool)",
                        extra={"reader": reader.out.reader, "target": reader.out.target(), "error": message})
        reader.error = message

    def _check_drops(self) -> None:
        hint = self.spool.drops_hint
        if hint == self._drops_checked:
            return  # no record dropped since the last warning: no look at the store
        dropped = self.spool.dropped()
        now = trio.current_time()
        if dropped > self._warned_drops and now - self._warned_at >= DROP_WARNING_EVERY:
            log.warning("crawl-log records dropped: the spool is full because a reader is behind",
                        extra={"dropped": dropped, "new": dropped - self._warned_drops,
                               "spool_limit": self.spool.limit,
                               "behind": [r.out.reader for r in self.readers if r.error is not None]})
            self._warned_drops, self._warned_at = dropped, now
        if dropped <= self._warned_drops:
            self._drops_checked = hint

    def close(self) -> None:
        for reader in self.readers:
            reader.out.close()

    # ------------------------------------------------------------------ what status and metrics show

    def status(self) -> dict[str, Any]:
        now = time.time()
        readers = {}
        for reader in self.readers:
            waiting, oldest = self.spool.waiting(reader.out.reader)
            readers[reader.out.reader] = {
                "target": reader.out.target(),
                "ok": reader.error is None,
                "error": reader.error,
                "failing_for": round(now - reader.failing_since, 1) if reader.failing_since is not None else 0.0,
                "failures": reader.failures,
                "handed_on": reader.handed_on,
                "waiting": waiting,
                "lag": round(max(0.0, now - oldest), 1) if oldest is not None else 0.0,
            }
        return {"readers": readers, "spooled": len(self.spool), "spool_limit": self.spool.limit,
                "dropped": self.spool.dropped()}
