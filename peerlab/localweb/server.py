"""The local web's HTTP server: trio + h11, keep-alive, virtual hosts chosen by the Host header.

Every host name of the graph resolves to 127.0.0.1, so one listening socket serves them all and URLs carry
its port. Each answered request is appended to ``WebServer.log`` (and handed to ``on_record``, which the
process entry point uses to write JSON lines), the record the politeness referees judge from. A client
that goes away mid-answer (the huge page) costs its own connection only, never the server.

Run it as a process: ``python -m peerlab.localweb.server --seed 7 --hosts 50 --port 0 --log web.jsonl``
prints ``listening 127.0.0.1:PORT`` and serves until killed.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import os
import socket as stdlib_socket
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import h11
import trio

from .changes import ChangeSchedule
from .graph import SiteGraph
from .model import Resource, norm_path
from .oracle import Expected
from .referee import (
    CrawlDelayViolation,
    RequestRecord,
    crawl_delay_violations,
    max_concurrent_connections_per_host,
    read_log,
    requested_paths,
    requested_urls,
)
from .render import SERVER, Answer, gzip_body, huge_chunks, render, render_robots

__all__ = [
    "CrawlDelayViolation",
    "RequestRecord",
    "WebServer",
    "crawl_delay_violations",
    "main",
    "max_concurrent_connections_per_host",
    "read_log",
    "requested_paths",
    "requested_urls",
    "serve_web",
]

log = logging.getLogger(__name__)

#: A connection with no request for this long is closed (keep-alive clients reconnect).
IDLE_TIMEOUT = 60.0
#: A client that accepts no bytes for this long while we send is dropped.
SEND_TIMEOUT = 30.0
_CACHE_ENTRIES = 4096
_CACHE_MAX_BODY = 1 << 20


class _Progress:
    __slots__ = ("sent", "status")

    def __init__(self) -> None:
        self.status = 0
        self.sent = 0


class WebServer:
    """A running local web (started by :func:`serve_web`)."""

    def __init__(
        self,
        graph: SiteGraph,
        *,
        port: int,
        on_record: Callable[[RequestRecord], None] | None = None,
        keep_log: bool = True,
        changes: ChangeSchedule | None = None,
        answer_delay: float = 0.0,
    ) -> None:
        self.graph = graph
        self.changes = changes
        self.answer_delay = answer_delay
        self.port = port
        self.log: list[RequestRecord] = []
        self._keep_log = keep_log
        self._on_record = on_record
        self._conn_ids = itertools.count(1)
        self._hits: Counter[tuple[str, str]] = Counter()
        self._cache: OrderedDict[tuple[str, str], Answer] = OrderedDict()

    def base_url(self, host: str) -> str:
        """``"http://h0001.web.test:PORT"`` for ``host``."""
        return f"http://{host}:{self.port}"

    def url(self, host: str, path: str) -> str:
        return self.graph.url(host, path, port=self.port)

    def seeds(self) -> list[str]:
        return self.graph.seeds(port=self.port)

    # -- one connection ---------------------------------------------------------------------------

    async def handle(self, stream: trio.abc.Stream) -> None:
        conn_id = next(self._conn_ids)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=32 * 1024)
        try:
            while True:
                request = await self._next_request(conn, stream)
                if request is None:
                    return
                if not await self._answer(conn, stream, request, conn_id):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            return
        except h11.ProtocolError as exc:
            log.debug("connection %d: %s", conn_id, exc)
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                try:
                    data = conn.send(h11.Response(status_code=400, headers=[(b"content-length", b"0"),
                                                                          (b"connection", b"close")]))
                    await stream.send_all(data or b"")
                except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError, OSError):
                    log.debug("connection %d: the client left before its 400", conn_id)
        except Exception:
            log.exception("connection %d failed; the server goes on", conn_id)
        finally:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()

    async def _next_request(self, conn: h11.Connection, stream: trio.abc.Stream) -> h11.Request | None:
        request = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                with trio.move_on_after(IDLE_TIMEOUT):
                    data = await stream.receive_some(65536)
                    conn.receive_data(bytes(data))
                    continue
                return None
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _send(self, stream: trio.abc.Stream, data: bytes) -> float:
        """Send ``data``; the trio time right after its last byte went to the kernel.

        On a socket the bytes are written here, non-blocking, and the time is read before this task yields, so a
        starved server cannot stamp an answer's end after the client has already read it and sent its next
        request (``trio``'s ``send_all`` yields once more after its last write, and the task may run again much
        later). Other streams (memory streams in unit tests) go through ``send_all``."""
        sock = getattr(stream, "socket", None)
        with trio.fail_after(SEND_TIMEOUT):
            if sock is None:
                await stream.send_all(data)
                return trio.current_time()
            view = memoryview(data)
            while True:
                try:
                    view = view[os.write(sock.fileno(), view):]
                except BlockingIOError:
                    pass
                if not view:
                    break
                await trio.lowlevel.wait_writable(sock)
        end = trio.current_time()
        await trio.lowlevel.checkpoint()
        return end

    async def _answer(self, conn: h11.Connection, stream: trio.abc.Stream, request: h11.Request, conn_id: int) -> bool:
        start, wall_start = trio.current_time(), time.time()
        headers = {k.lower(): v for k, v in request.headers}
        host_text = _host_name(headers.get(b"host", b""))
        spec = self.graph.host(host_text) if host_text else None
        host = spec.name if spec is not None else host_text.lower()
        path = _request_path(request.target)
        user_agent = headers.get(b"user-agent", b"").decode("utf-8", "replace")
        head_only = request.method == b"HEAD"
        progress = _Progress()
        end: float | None = None
        try:
            if self.answer_delay > 0:
                await trio.sleep(self.answer_delay)
            if request.method not in (b"GET", b"HEAD"):
                answer: Answer | Resource = _plain(405, "only GET and HEAD are served here")
            elif spec is None:
                answer = _plain(404 if host_text else 400, f"no host {host_text!r} in this web")
            else:
                answer = render_robots(self.graph, host, path) or await self._resource_answer(host, path, headers)
            if isinstance(answer, Resource):
                end = await self._stream_huge(conn, stream, answer, head_only, progress)
                return True
            progress.status = answer.status
            data = conn.send(h11.Response(status_code=answer.status, headers=[
                *answer.headers, (b"content-length", str(len(answer.body)).encode()), (b"server", SERVER)])) or b""
            if answer.body and not head_only:
                data += conn.send(h11.Data(data=answer.body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
            end = await self._send(stream, data)
            progress.sent = len(data)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, ConnectionError):
            return False
        finally:
            # the end: when the last byte went out, or now for an answer cut short (the client went away)
            wall_end = time.time() - (trio.current_time() - end if end is not None else 0.0)
            record = RequestRecord(host=host, path=path, status=progress.status, conn_id=conn_id, start=start,
                                   end=end if end is not None else trio.current_time(), wall_start=wall_start,
                                   wall_end=wall_end,
                                   user_agent=user_agent, bytes_sent=progress.sent, address=_local_address(stream))
            if self._keep_log:
                self.log.append(record)
            if self._on_record is not None:
                self._on_record(record)

    async def _resource_answer(self, host: str, path: str, headers: dict[bytes, bytes]) -> Answer | Resource:
        """The answer for a resource, or the resource itself when it is to be streamed."""
        res = self.graph.resource(host, path)
        if res is None:
            return _plain(404, f"{path} is not in this web")
        self._hits[(host, path)] += 1
        if res.delay > 0:
            await trio.sleep(res.delay)
        if res.first_status is not None and self._hits[(host, path)] == 1:
            answer = _plain(res.first_status, "come back later")
            return Answer(status=answer.status, body=answer.body,
                          headers=answer.headers + ((b"retry-after", str(res.retry_after).encode()),))
        if res.kind == "huge":
            return res
        answer = self._cached(res.host, res.path)
        if self.changes is not None and res.kind == "html" and answer.status == 200:
            changed = self._changing(res.host, res.path, answer, headers)
            if changed.status == 304:
                return changed
            answer = changed
        if res.gzip and b"gzip" in headers.get(b"accept-encoding", b"").lower():
            answer = Answer(status=answer.status, body=gzip_body(answer.body), headers=answer.headers + (
                (b"content-encoding", b"gzip"), (b"vary", b"accept-encoding")))
        return answer

    def _changing(self, host: str, path: str, answer: Answer, headers: dict[bytes, bytes]) -> Answer:
        """The page as it is now on its change schedule, with its validators; 304 to a matching conditional
        request on a host that answers them."""
        changes = self.changes
        assert changes is not None
        version = changes.version(host, path, time.time())
        etag, modified = changes.validators(host, path, version)
        extra = ((b"etag", etag.encode()), (b"last-modified", modified.encode()))
        if changes.conditional(host):
            inm, ims = headers.get(b"if-none-match"), headers.get(b"if-modified-since")
            if changes.not_modified(etag, modified, inm.decode("latin-1") if inm else None,
                                    ims.decode("latin-1") if ims else None):
                return Answer(status=304, body=b"", headers=extra)
        body = answer.body + f"\n<!-- version {version} -->\n".encode() if version else answer.body
        return Answer(status=200, body=body, headers=answer.headers + extra)

    async def _stream_huge(self, conn: h11.Connection, stream: trio.abc.Stream, res: Resource, head_only: bool,
                           progress: _Progress) -> float:
        """Stream the huge page; the time its last byte went out."""
        progress.status = 200
        head = conn.send(h11.Response(status_code=200, headers=[
            (b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(res.size).encode()),
            (b"server", SERVER)])) or b""
        await self._send(stream, head)
        progress.sent = len(head)
        if not head_only:
            for chunk in huge_chunks(self.graph, res):
                await self._send(stream, conn.send(h11.Data(data=chunk)) or b"")
                progress.sent += len(chunk)
        return await self._send(stream, conn.send(h11.EndOfMessage()) or b"")

    def _cached(self, host: str, path: str) -> Answer:
        key = (host, path)
        answer = self._cache.get(key)
        if answer is not None:
            self._cache.move_to_end(key)
            return answer
        res = self.graph.resource(host, path)
        assert res is not None
        answer = render(self.graph, res, self.port)
        if len(answer.body) <= _CACHE_MAX_BODY:
            self._cache[key] = answer
            if len(self._cache) > _CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return answer

    def expected(self, **kwargs: Any) -> Expected:
        """The oracle for this server's graph (``SiteGraph.expected``), with this port in every URL."""
        return self.graph.expected(port=self.port, **kwargs)


def _plain(status: int, text: str) -> Answer:
    return Answer(status=status, headers=((b"content-type", b"text/plain; charset=utf-8"),),
                  body=(text + "\n").encode("utf-8"))


def _host_name(raw: bytes) -> str:
    """The host of a Host header, without its port: ``b"h0001.web.test:8080"`` -> ``"h0001.web.test"``."""
    text = raw.decode("utf-8", "replace").strip()
    if text.startswith("["):
        return text[: text.find("]") + 1]
    return text.rsplit(":", 1)[0] if ":" in text else text


def _request_path(target: bytes) -> str:
    """The normalized path and query of a request target (origin form or absolute form)."""
    if not target.startswith(b"/"):
        scheme_end = target.find(b"://")
        if scheme_end >= 0:
            slash = target.find(b"/", scheme_end + 3)
            target = target[slash:] if slash >= 0 else b"/"
    target = target.split(b"#", 1)[0]
    text = "".join(chr(b) if b < 0x80 else f"%{b:02X}" for b in target)
    return norm_path(text or "/")


def _local_address(stream: trio.abc.Stream) -> str:
    sock = getattr(stream, "socket", None)
    try:
        return sock.getsockname()[0] if sock is not None else ""
    except OSError:
        return ""


async def _open_listener(host: str, port: int, reuse_port: bool) -> trio.SocketListener:
    sock = trio.socket.socket(stdlib_socket.AF_INET, stdlib_socket.SOCK_STREAM)
    try:
        sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_REUSEPORT, 1)
        await sock.bind((host, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def serve_web(
    graph: SiteGraph,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    on_record: Callable[[RequestRecord], None] | None = None,
    keep_log: bool = True,
    reuse_port: bool = False,
    addresses: Sequence[str] = (),
    changes: ChangeSchedule | None = None,
    answer_delay: float = 0.0,
    task_status: trio.TaskStatus[WebServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``graph`` on ``host:port`` until cancelled; ``nursery.start`` returns the :class:`WebServer`.

    ``reuse_port`` lets several processes share one port (the multi-process benchmark server);
    ``keep_log=False`` keeps memory flat on long runs (``on_record`` still sees every request).
    ``addresses`` (loopback addresses such as 127.0.1.1) serves on each of them, on one port, instead of
    ``host``: with ``graph.zone(addresses)`` many host names share each server address, and each logged
    request names the address it came in on (``RequestRecord.address``). ``changes`` makes pages change on a
    schedule and answer conditional requests (``changes.py``). ``answer_delay`` makes every answer wait that long
    after its request was read: a server that takes time to answer, whose log can show requests in service
    together (without it an answer is written in one step, and a client's concurrent requests are served one
    after the other).
    """
    listeners = [await _open_listener(addresses[0] if addresses else host, port, reuse_port)]
    try:
        chosen = listeners[0].socket.getsockname()[1]
        for address in addresses[1:]:
            listeners.append(await _open_listener(address, chosen, reuse_port))
    except BaseException:
        for listener in listeners:
            await listener.aclose()
        raise
    await _serve_on(listeners, graph, on_record=on_record, keep_log=keep_log, changes=changes,
                    answer_delay=answer_delay, task_status=task_status)


async def _serve_on(
    listeners: trio.SocketListener | list[trio.SocketListener],
    graph: SiteGraph,
    *,
    on_record: Callable[[RequestRecord], None] | None,
    keep_log: bool,
    changes: ChangeSchedule | None = None,
    answer_delay: float = 0.0,
    task_status: trio.TaskStatus[WebServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    if not isinstance(listeners, list):
        listeners = [listeners]
    server = WebServer(graph, port=listeners[0].socket.getsockname()[1], on_record=on_record, keep_log=keep_log,
                       changes=changes, answer_delay=answer_delay)
    try:
        task_status.started(server)
        await trio.serve_listeners(server.handle, listeners)
    finally:
        with trio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m peerlab.localweb.server",
        description="Serve a generated local web on loopback until killed.",
        epilog="example: python -m peerlab.localweb.server --seed 7 --hosts 50 --port 0 --log /tmp/web.jsonl",
    )
    p.add_argument("--seed", type=int, required=True, help="the graph's seed")
    p.add_argument("--hosts", type=int, default=50)
    p.add_argument("--pages-per-host", type=int, default=20)
    p.add_argument("--links-per-page", type=int, default=10)
    p.add_argument("--cross-host-fraction", type=float, default=0.3)
    p.add_argument("--page-bytes", type=int, default=2000)
    p.add_argument("--no-features", action="store_true", help="only ordinary pages (the benchmark web)")
    p.add_argument("--markup", choices=("filler", "real"), default="filler",
                   help="pages: a list of links and filler words, or built like real pages (docs/localweb.md)")
    p.add_argument("--doc-fraction", type=float, default=0.2,
                   help="with --markup real: share of hosts serving python3-doc's documents (when installed)")
    p.add_argument("--odd-link-fraction", type=float, default=0.02,
                   help="with --markup real: share of links to 404s, 301s and names that do not resolve")
    p.add_argument("--domain", default="web.test")
    p.add_argument("--seed-hosts", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=0, help="0 lets the system choose")
    p.add_argument("--reuse-port", action="store_true", help="share the port with other server processes")
    p.add_argument("--log", metavar="FILE", help="append each request as a JSON line, flushed per record")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        graph = SiteGraph.generate(
            seed=args.seed, hosts=args.hosts, pages_per_host=args.pages_per_host,
            links_per_page=args.links_per_page, cross_host_fraction=args.cross_host_fraction,
            page_bytes=args.page_bytes, features=not args.no_features, domain=args.domain,
            seed_hosts=args.seed_hosts, markup=args.markup, doc_fraction=args.doc_fraction,
            odd_link_fraction=args.odd_link_fraction,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log_file = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115 - lives as long as the process

    def on_record(record: RequestRecord) -> None:
        assert log_file is not None
        log_file.write(record.to_json() + "\n")
        log_file.flush()

    async def run() -> None:
        listener = await _open_listener(args.host, args.port, args.reuse_port)
        port = listener.socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(
                _serve_on, listener, graph, on_record=on_record if log_file else None, keep_log=False))
            print(f"listening {args.host}:{port}", flush=True)

    try:
        trio.run(run)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if log_file is not None:
            log_file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
