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
    out = await _request(port, b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200")
    assert json.loads(out.split(b"\r\n\r\n", 1)[1]) == {"ok": True}
    out = await _request(port, b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 404")
    out = await _request(port, b"POST /status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 405")
    out = await _request(port, b"POST /boom HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 500") and b"handler bug" in out
    out = await _request(port, b"this is not http\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400")
    # keep-alive: two requests on one connection
    out = await _request(port, b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200") == 2
    assert len(calls) == 3
    # the server survived all of that
    out = await _request(port, b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200")
