"""A webhook receiver for the tests: a real HTTP server on loopback that keeps every POST."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = b"a-webhook-secret-of-some-length"


class Receiver:
    """A loopback HTTP server that answers 503 to the first `fail` POSTs and 200 after, keeping every POST."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.posts: list[tuple[dict[str, str], bytes, int]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers["content-length"]))
                status = 503 if len(receiver.posts) < receiver.fail else 200
                receiver.posts.append(({k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def accepted(self) -> list[dict]:
        return [json.loads(body) for _h, body, status in self.posts if status == 200]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
