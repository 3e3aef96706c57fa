"""The control endpoint trusts no request by default: what a browser tab, a rebinding page or a stranger on the
machine can and cannot do, over real loopback sockets, with the exact requests a browser would send."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest
import trio

from peer.cli.main import peerctl_main
from peer.control import TOKEN_FILE, Reply, json_reply, load_or_create_token, serve_control

TOKEN = "t0ken-" + "x" * 40


async def _start(nursery: trio.Nursery) -> tuple[int, list[str]]:
    calls: list[str] = []

    async def status(_body: bytes) -> Reply:
        calls.append("status")
        return json_reply({"ok": True})

    async def stop(_body: bytes) -> Reply:
        calls.append("stop")
        return json_reply({"stopping": True})

    async def health(_body: bytes) -> Reply:
        return json_reply({"ok": True})

    routes = {("GET", "/status"): status, ("POST", "/stop"): stop, ("GET", "/healthz"): health}
    port = await nursery.start(lambda task_status: serve_control("127.0.0.1", 0, routes, token=TOKEN,
                                                                 task_status=task_status))
    return port, calls


def _auth(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_every_api_request_needs_the_token(nursery: trio.Nursery) -> None:
    port, calls = await _start(nursery)
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        missing = await client.get(base + "/status")
        wrong = await client.get(base + "/status", headers=_auth("t0ken-" + "y" * 40))
        basic = await client.get(base + "/status", headers={"authorization": f"Basic {TOKEN}"})
        good = await client.get(base + "/status", headers=_auth())
        health = await client.get(base + "/healthz")  # public: probes carry no token
        stop_without = await client.post(base + "/stop", json={})
    assert (missing.status_code, wrong.status_code, basic.status_code) == (401, 401, 401)
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert "control.token" in missing.json()["error"]
    assert good.status_code == 200 and health.status_code == 200
    assert stop_without.status_code == 401
    assert calls == ["status"]


async def test_browser_csrf_text_plain_post_from_a_foreign_page_is_refused(nursery: trio.Nursery) -> None:
    """What `<form method=post enctype=text/plain action=http://127.0.0.1:7410/stop>` or a no-cors fetch sends.
    Even a page that somehow had the token cannot make a simple cross-site request reach a route."""
    port, calls = await _start(nursery)
    base = f"http://127.0.0.1:{port}"
    browser = {"content-type": "text/plain;charset=UTF-8", "origin": "http://evil.example",
               "sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}
    async with httpx.AsyncClient() as client:
        forged = await client.post(base + "/stop", content=b'{"x":1}', headers=browser)
        forged_with_token = await client.post(base + "/stop", content=b"{}", headers={**browser, **_auth()})
        null_origin = await client.post(base + "/stop", json={}, headers={"origin": "null", **_auth()})
        same_site_text = await client.post(base + "/stop", content=b"{}",
                                           headers={"content-type": "text/plain", **_auth()})
        form = await client.post(base + "/stop", data={"a": "b"}, headers=_auth())
        ok = await client.post(base + "/stop", json={}, headers={"origin": base, **_auth()})
    assert forged.status_code == 403 and forged_with_token.status_code == 403 and null_origin.status_code == 403
    assert same_site_text.status_code == 415 and form.status_code == 415
    assert ok.status_code == 200
    assert calls == ["stop"]  # only the legitimate one reached the route


async def test_dns_rebinding_a_foreign_host_header_is_refused(nursery: trio.Nursery) -> None:
    """A rebinding page reaches 127.0.0.1 under its own name: its requests say `Host: evil.example:PORT`."""
    port, calls = await _start(nursery)
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        rebound = await client.get(base + "/status", headers={"host": f"evil.example:{port}", **_auth()})
        rebound_health = await client.get(base + "/healthz", headers={"host": f"evil.example:{port}"})
        other_port = await client.get(base + "/status", headers={"host": f"127.0.0.1:{port + 1}", **_auth()})
        localhost = await client.get(base + "/status", headers={"host": f"localhost:{port}", **_auth()})
        other_ip = await client.get(base + "/status", headers={"host": f"10.1.2.3:{port}", **_auth()})
    assert rebound.status_code == 421 and rebound_health.status_code == 421 and other_port.status_code == 421
    assert other_ip.status_code == 421  # bound to 127.0.0.1: another address is not this endpoint
    assert localhost.status_code == 200
    assert calls == ["status"]


def test_the_token_file_is_made_once_with_mode_0600(tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path)
    path = tmp_path / TOKEN_FILE
    assert len(token) >= 32 and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_token(tmp_path) == token  # kept across restarts
    path.chmod(0o644)
    assert load_or_create_token(tmp_path) == token and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_token(tmp_path, "operator-set-token-123") == "operator-set-token-123"
    assert path.read_text().strip() == "operator-set-token-123"
    with pytest.raises(ValueError, match="at least 16"):
        load_or_create_token(tmp_path, "short")


async def test_peerctl_reads_the_token_from_the_data_dir(nursery: trio.Nursery, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    port, calls = await _start(nursery)
    (tmp_path / "control.addr").write_text(f"127.0.0.1:{port}\n")
    monkeypatch.delenv("PEERCRAWL_CONTROL_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./peercrawl-data here
    assert await trio.to_thread.run_sync(peerctl_main, ["stop", "--control", f"127.0.0.1:{port}"]) == 2
    assert "401" in capsys.readouterr().err
    (tmp_path / TOKEN_FILE).write_text(TOKEN + "\n")
    os.chmod(tmp_path / TOKEN_FILE, 0o600)
    assert await trio.to_thread.run_sync(peerctl_main, ["stop", "--data-dir", str(tmp_path)]) == 0
    assert calls == ["stop"]


async def test_without_a_token_set_the_control_endpoint_stays_on_loopback(tmp_path: Path) -> None:
    """What the container image relies on: PEERCRAWL_CONTROL=0.0.0.0:7410 binds loopback until a token is set."""
    from peer.config import load
    from peer.node import Node

    for token, expected in ((None, "127.0.0.1"), ("operator-token-0123456789", "0.0.0.0")):
        data = tmp_path / (token or "none")
        flags = {"node_id": "loop", "data_dir": str(data), "control": "0.0.0.0:0", "listen": "127.0.0.1:0",
                 "exit_when_done": False}
        env = {"PEERCRAWL_CONTROL_TOKEN": token} if token else {}
        node = Node(load(env=env, flags=flags))
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            host = (data / "control.addr").read_text().strip().rsplit(":", 1)[0]
            node.request_stop()
        assert host == expected
        assert (data / TOKEN_FILE).read_text().strip() == (token or (data / TOKEN_FILE).read_text().strip())
