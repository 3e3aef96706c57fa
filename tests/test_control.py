import json

import trio

from peer.control import Reply, json_reply, serve_control


async def _request(port: int, raw: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(raw)
        chunks = []
        with trio.fail_after(5):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                chunks.append(data)
    return b"".join(chunks)


async def test_routes_errors_and_limits(nursery):
    calls = []

    async def status(body: bytes) -> Reply:
        calls.append(body)
        return json_reply({"ok": True})

    async def boom(body: bytes) -> Reply:
        raise RuntimeError("handler bug")

    port = await nursery.start(serve_control, "127.0.0.1", 0, {("GET", "/status"): status, ("POST", "/boom"): boom})
    out = await _request(port, b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200")
    assert json.loads(out.split(b"\r\n\r\n", 1)[1]) == {"ok": True}
    out = await _request(port, b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 404")
    out = await _request(port, b"POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 405")
    out = await _request(port, b"POST /boom HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 500") and b"handler bug" in out
    out = await _request(port, b"this is not http\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400")
    # keep-alive: two requests on one connection
    out = await _request(port, b"GET /status HTTP/1.1\r\nHost: x\r\n\r\nGET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200") == 2
    assert len(calls) == 3
    # the server survived all of that
    out = await _request(port, b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200")


async def test_token_guards_every_route_but_the_open_ones(nursery, tmp_path):
    import os
    import stat

    from peer.control import read_token, write_token

    token = write_token(tmp_path)
    assert read_token(tmp_path) == token and len(token) >= 40
    assert stat.S_IMODE(os.stat(tmp_path / "control.token").st_mode) == 0o600
    assert write_token(tmp_path) != token  # a fresh one at every start

    async def page(body: bytes) -> Reply:
        return Reply(content_type="text/html", body=b"<!doctype html>")

    async def status(body: bytes) -> Reply:
        return json_reply({"ok": True})

    routes = {("GET", "/"): page, ("GET", "/status"): status, ("GET", "/healthz"): status, ("POST", "/stop"): status}
    port = await nursery.start(lambda task_status: serve_control("127.0.0.1", 0, routes, token="s3cret",
                                                                 task_status=task_status))

    def get(path: str, auth: str | None = None, method: str = "GET") -> bytes:
        extra = f"Authorization: {auth}\r\n" if auth is not None else ""
        return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n".encode()

    assert (await _request(port, get("/"))).startswith(b"HTTP/1.1 200")  # the page: no data, no token
    assert (await _request(port, get("/healthz"))).startswith(b"HTTP/1.1 200")
    for auth in (None, "Bearer wrong", "Basic s3cret", "Bearer s3cre", "Bearer s3cretX"):
        out = await _request(port, get("/status", auth))
        assert out.startswith(b"HTTP/1.1 401"), (auth, out)
        assert b"www-authenticate: Bearer" in out and b"control.token" in out
        assert (await _request(port, get("/stop", auth, "POST"))).startswith(b"HTTP/1.1 401")
    out = await _request(port, get("/status", "Bearer s3cret"))
    assert out.startswith(b"HTTP/1.1 200") and b"no-store" in out
    assert (await _request(port, get("/status", "bearer  s3cret"))).startswith(b"HTTP/1.1 200")
