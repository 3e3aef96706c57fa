"""The webhook against a real HTTP receiver on loopback: one signed POST per closed WARC file, retried with the
same event id until accepted, kept in the node's store while the receiver is away."""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from pathlib import Path

import pytest
import trio

from peer.config import ConfigError, load
from peer.outputs import WebhookSender, sign
from storage import NodeStore, WarcPageStore, closed_files

from .support.webhook_receiver import SECRET, Receiver

@pytest.fixture
def receiver():
    r = Receiver(fail=2)
    yield r
    r.close()


def _write_pages(warc: Path, count: int) -> None:
    rng = random.Random(5)
    pages = WarcPageStore(warc, max_file_bytes=30_000)
    for n in range(count):
        pages.store(url=f"http://a.example/{n}", request_headers=[("host", "a.example")], status=200, reason="OK",
                    response_headers=[("content-type", "text/html")], body=rng.randbytes(8000), ip="127.0.0.1",
                    fetched_at=1_700_000_000.0 + n)
    # left open (as at a kill): not closed, so not announced


async def _until(check, timeout: float = 30.0):
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.05)


@pytest.mark.slow  # a whole crawl, a child process or real nodes: seconds
async def test_each_closed_file_is_announced_once_signed_and_retried_with_its_id(tmp_path, receiver):
    warc = tmp_path / "warc"
    _write_pages(warc, 20)
    closed = [p for p in closed_files(warc) if p.name.endswith(".warc.gz")]
    assert len(closed) >= 3
    with NodeStore.open(tmp_path / "state") as store:
        sender = WebhookSender(uploads=store.uploads, url=receiver.url, secret=SECRET, node_id="node-a",
                               directory=warc, closed_files=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(sender.run)
            await _until(lambda: sender.sent == len(closed))
            nursery.cancel_scope.cancel()
        assert store.uploads.notices() == [] and store.uploads.unnoticed(warc) == []
        assert sender.status()["ok"] is True and sender.failures == 2 and sender.sent == len(closed)
        # at the stop: a file closed last is announced by the same client, which is closed then
        with WarcPageStore(warc / "last", max_file_bytes=30_000) as pages:
            pages.store(url="http://a.example/last", request_headers=[("host", "a.example")], status=200,
                        reason="OK", response_headers=[("content-type", "text/html")], body=b"last", ip="127.0.0.1",
                        fetched_at=1_700_000_500.0)
        for path in (warc / "last").iterdir():
            path.rename(warc / path.name)
        await sender.flush()
        assert sender.sent == len(closed) + 1 and store.uploads.unnoticed(warc) == []
    closed += [p for p in closed_files(warc) if p.name.endswith(".warc.gz") and p not in closed]
    by_file = {body["file"]: body for body in receiver.accepted()}
    assert set(by_file) == {p.name for p in closed}
    for path in closed:
        body = by_file[path.name]
        index = path.with_name(path.name[: -len(".warc.gz")] + ".cdxj")
        assert body == {"id": f"node-a/closed/{path.name}", "event": "closed", "node": "node-a", "file": path.name,
                        "key": None, "size": path.stat().st_size,
                        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                        "records": len(index.read_text().splitlines()), "at": body["at"]}
    for headers, raw, _status in receiver.posts:
        expected = "sha256=" + hmac.new(SECRET, raw, hashlib.sha256).hexdigest()
        assert headers["x-peercrawl-signature"] == expected == sign(SECRET, raw)
        assert headers["x-peercrawl-event"] == json.loads(raw)["id"]
    # the two refused tries were of the first notice, sent again with the same id
    ids = [json.loads(raw)["id"] for _h, raw, _s in receiver.posts]
    assert ids[0] == ids[1] == ids[2] and len(set(ids)) == len(closed)


async def test_notices_wait_in_the_store_while_the_receiver_is_away(tmp_path):
    warc = tmp_path / "warc"
    _write_pages(warc, 12)
    closed = {p.name for p in closed_files(warc) if p.name.endswith(".warc.gz")}
    away = Receiver()
    url = away.url
    away.close()  # nothing listens at its address now
    with NodeStore.open(tmp_path / "state") as store:
        sender = WebhookSender(uploads=store.uploads, url=url, secret=SECRET, node_id="n", directory=warc,
                               closed_files=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(sender.run)
            await _until(lambda: sender.failures >= 2)
            nursery.cancel_scope.cancel()
        status = sender.status()
        assert status["ok"] is False and "ConnectError" in status["error"] and status["sent"] == 0
        assert {json.loads(body)["file"] for _id, body in store.uploads.notices()} == closed
    # a restarted node (a new store object on the same directory) delivers them to a receiver that is back
    back = Receiver()
    try:
        with NodeStore.open(tmp_path / "state") as store:
            sender = WebhookSender(uploads=store.uploads, url=back.url, secret=SECRET, node_id="n", directory=warc,
                                   closed_files=True)
            async with trio.open_nursery() as nursery:
                await nursery.start(sender.run)
                await _until(lambda: sender.sent == len(closed))
                nursery.cancel_scope.cancel()
            assert store.uploads.notices() == []
    finally:
        back.close()
    assert {body["file"] for body in back.accepted()} == closed


@pytest.mark.parametrize("flags, message", [
    ({"webhook": "ftp://x/"}, "http"),
    ({"webhook": "http://x/"}, "webhook_secret"),
    ({"webhook": "http://x/", "webhook_secret": "short"}, "webhook_secret"),
])
def test_wrong_webhook_settings_are_one_clear_error(flags, message):
    with pytest.raises(ConfigError, match=message):
        load(env={}, flags=flags)
