"""The crawl log: its spool in the node's store (numbering, one mark per reader, the bound and its counted drops),
its two layouts, the rotating files, the readers' retries under MockClock with a stand-in broker, and the Redis
stream against a real redis-server killed and restarted while records flow."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from peer.config import ConfigError, load, stream_target
from peer.outputs import CrawlLog, LocalLog, StreamLog
from peer.outputs.crawllog import RotatingFile, StreamError, json_line, record_fields, text_line
from storage import LOG_FIELDS, NodeStore, QueuedUrl, StorageError
from storage._crawllog import CRAWLLOG_DB, JOURNAL

from .support.crawl import child_env, kill_pid
from .support.redisserver import RedisServer


def _record(n: int, *, at: float = 1_700_000_000.0, warc: str = "a.warc.gz") -> list:
    return [at + n, 200, 1000 + n, f"http://a.example/{n}", "L", "http://a.example/", "text/html", at + n - 0.25,
            250, "sha1:AAAA", "-", warc, 100 * n]


@pytest.fixture
def store(tmp_path):
    with NodeStore.open(tmp_path / "state") as s:
        yield s


# ------------------------------------------------------------------------------------------------ the spool


def test_records_are_numbered_and_kept_until_every_reader_passed_them(store):
    spool = store.crawl_log
    spool.configure(limit=100, readers=("file", "stream"))
    assert spool.put([_record(n) for n in range(5)]) == 0
    assert [seq for seq, _f in spool.after("file", 10)] == [0, 1, 2, 3, 4]
    assert spool.after("file", 2)[1] == (1, _record(1))
    assert spool.handed_on("file", 3) == 0  # the stream has not passed any: nothing deleted
    assert [seq for seq, _f in spool.after("file", 10)] == [4]
    assert [seq for seq, _f in spool.after("stream", 10)] == [0, 1, 2, 3, 4]
    assert spool.handed_on("stream", 1) == 2  # 0 and 1: both readers passed them
    assert len(spool) == 3 and spool.waiting("stream") == (3, _record(2)[0]) and spool.waiting("file") == (1, _record(4)[0])
    assert spool.handed_on("stream", 4) == 2 and len(spool) == 1
    # numbers never repeat, even once the spool is empty
    spool.handed_on("file", 4)
    assert len(spool) == 0 and spool.waiting("file") == (0, None)
    spool.put([_record(9)])
    assert spool.after("stream", 10) == [(5, _record(9))]


def test_a_page_and_its_record_are_one_commit(store):
    item = QueuedUrl(url="http://a.example/x", host="a.example", depth=1)
    store.admit([item])
    popped = store.frontier.pop("a.example")
    assert popped == item
    store.finish(popped, [], logged=_record(0))
    assert store.crawl_log.after("file", 10) == [(0, _record(0))] and store.frontier.in_flight() == 0


_KILLED_CHILD = """
import sys, time
from storage import NodeStore, QueuedUrl
store = NodeStore.open(sys.argv[1])
store.crawl_log.configure(limit=1000, readers=("file",))
for n in range(int(sys.argv[2])):
    item = QueuedUrl(url=f"http://a.example/{n}", host="a.example", depth=1)
    store.admit([item])
    store.finish(store.frontier.pop("a.example"), [], logged=[1.7e9 + n, 200, n, item.url, "L", "-", "text/html",
                                                               1.7e9 + n, 1, "-", "-", "", -1])
print("committed", flush=True)
time.sleep(60)
"""


def test_a_record_written_with_its_page_survives_a_kill_and_moves_into_the_table_once(tmp_path):
    """SIGKILL after the pages' commits: their records are in the journal, not yet in the table; the next open
    moves them there, and an open after a kill between that move and the journal's emptying moves none again."""
    state = tmp_path / "state"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(state), "30"], stdout=subprocess.PIPE,
                             text=True, env=child_env())
    try:
        assert child.stdout is not None and child.stdout.readline() == "committed\n"
    finally:
        kill_pid(child.pid)
        child.wait()
    journal = (state / JOURNAL).read_bytes()
    assert journal
    with NodeStore.open(state) as store:
        assert not (state / JOURNAL).read_bytes()  # moved at the open
        got = store.crawl_log.after("file", 100)
        assert [seq for seq, _f in got] == list(range(30)) and store.frontier.in_flight() == 0
        assert [fields[3] for _seq, fields in got] == [f"http://a.example/{n}" for n in range(30)]
        store.crawl_log.handed_on("file", 9)
    (state / JOURNAL).write_bytes(journal)  # as if killed between the move's commit and the journal's emptying
    with NodeStore.open(state) as store:
        assert [seq for seq, _f in store.crawl_log.after("file", 100)] == list(range(10, 30))
        store.crawl_log.put([_record(99)])
        assert store.crawl_log.after("file", 100)[-1] == (30, _record(99))  # numbered on, never again


def _table(store: NodeStore) -> list[int]:
    """The record numbers in the spool's LMDB table (not the journal)."""
    with store._env.read() as txn:
        return [int.from_bytes(key[1:], "big") for key, _v in txn.cursor(store._env.db(CRAWLLOG_DB))
                if key[:1] == b"r"]


def test_records_every_reader_keeps_up_with_never_enter_the_table(tmp_path):
    state = tmp_path / "state"
    with NodeStore.open(state) as store:
        spool = store.crawl_log
        spool.configure(limit=100, readers=("file", "stream"))
        spool.put([_record(n) for n in range(5)])
        journal = (state / JOURNAL).read_bytes()
        assert journal and _table(store) == []
        assert [seq for seq, _f in spool.after("file", 10)] == [0, 1, 2, 3, 4]
        spool.handed_on("file", 4)  # the stream has passed none: all stay
        assert (state / JOURNAL).read_bytes() == journal and _table(store) == [] and len(spool) == 5
        assert spool.waiting("stream") == (5, _record(0)[0]) and spool.waiting("file") == (0, None)
        assert [seq for seq, _f in spool.after("stream", 3)] == [0, 1, 2]
        assert spool.handed_on("stream", 2) == 3  # 0-2 passed by both, never in the table; 3 and 4 move there
        assert _table(store) == [3, 4] and not (state / JOURNAL).read_bytes()
        assert spool.after("stream", 10) == [(3, _record(3)), (4, _record(4))] and spool.waiting("stream")[0] == 2
    (state / JOURNAL).write_bytes(journal)  # as if killed between the marks' commit and the journal's emptying
    with NodeStore.open(state) as store:
        assert _table(store) == [3, 4]  # what every reader passed is not moved again, nor what is there
        store.crawl_log.configure(limit=100, readers=("file", "stream"))
        assert [seq for seq, _f in store.crawl_log.after("stream", 10)] == [3, 4]
        assert store.crawl_log.after("file", 10) == []


def test_a_record_the_disk_refuses_fails_its_pages_commit(store, tmp_path):
    (tmp_path / "state" / JOURNAL).mkdir()  # the journal cannot be opened for writing
    item = QueuedUrl(url="http://a.example/x", host="a.example", depth=1)
    store.admit([item])
    popped = store.frontier.pop("a.example")
    with pytest.raises(StorageError, match="journal"):
        store.finish(popped, [], logged=_record(0))
    assert store.frontier.in_flight() == 1  # the page is not finished: fetched again, and logged then


def test_past_its_bound_the_spool_drops_and_counts_durably(tmp_path):
    with NodeStore.open(tmp_path / "state") as store:
        store.crawl_log.configure(limit=3, readers=("stream",))
        assert store.crawl_log.put([_record(n) for n in range(5)]) == 2
        assert store.crawl_log.put([_record(5)]) == 1
        assert len(store.crawl_log) == 3 and store.crawl_log.dropped() == 3
        store.crawl_log.handed_on("stream", 0)
        assert store.crawl_log.put([_record(6)]) == 0  # room again: kept, numbered after the last kept
        assert [seq for seq, _f in store.crawl_log.after("stream", 10)] == [1, 2, 3]
    with NodeStore.open(tmp_path / "state") as store:
        assert store.crawl_log.dropped() == 3 and len(store.crawl_log) == 3


# ------------------------------------------------------------------------------------------------ layouts


def test_the_text_line_has_heritrix_columns_and_the_json_line_every_field():
    fields = _record(3)
    line = text_line("node-a", 42, fields)
    assert line.endswith("\n")
    cols = line.split()
    assert len(cols) == 13
    assert cols[0] == "2023-11-14T22:13:23.000Z" and cols[1] == "200" and cols[2] == "1003"
    assert cols[3:8] == ["http://a.example/3", "L", "http://a.example/", "text/html", "-"]
    assert cols[8] == "20231114221322750+250" and cols[9] == "sha1:AAAA" and cols[10] == "-" and cols[11] == "-"
    assert json.loads(cols[12]) == {"id": "node-a-42", "node": "node-a", "warc": "a.warc.gz", "offset": 300}
    # columns are padded as Heritrix pads them: status 5 wide, size 10 wide
    assert line[25:42] == "  200       1003 "
    unstored = [*fields[:2], -1, *fields[3:11], "", -1]
    assert text_line("n", 1, unstored).split()[2] == "-"
    assert json.loads(text_line("n", 1, unstored).split()[12]) == {"id": "n-1", "node": "n"}
    body = json.loads(json_line("node-a", 42, fields))
    assert list(body) == ["id", "node", "seq", *LOG_FIELDS]
    assert body["id"] == "node-a-42" and body["time"] == cols[0] and body["offset"] == 300
    assert json.loads(json_line("n", 1, unstored))["warc"] is None


_text = st.text(st.characters(codec="utf-8"), max_size=12)


@given(node=_text.filter(bool), seq=st.integers(0, 2**63), at=st.floats(0, 4e9), status=st.integers(-9999, 999),
       size=st.integers(-1, 2**40), url=_text, path=_text, via=_text, mime=_text, began=st.floats(0, 4e9),
       took=st.integers(0, 10**7), digest=_text, notes=_text, warc=_text, offset=st.integers(-1, 2**40))
@settings(max_examples=100, deadline=None)
def test_both_layouts_write_what_the_json_module_writes(node, seq, at, status, size, url, path, via, mime, began,
                                                       took, digest, notes, warc, offset):
    """The lines are written field by field (the crawl log's CPU is per page); they are the same text as
    `json.dumps` of the record: quotes, backslashes, control and non-ASCII characters included."""
    fields = [at, status, size, url, path, via, mime, began, took, digest, notes, warc, offset]
    assert json_line(node, seq, fields) == json.dumps(record_fields(node, seq, fields), separators=(",", ":"),
                                                      ensure_ascii=False) + "\n"
    extra = {"id": f"{node}-{seq}", "node": node, **({"warc": warc, "offset": offset} if warc else {})}
    line = text_line(node, seq, fields)
    assert line.endswith(" " + json.dumps(extra, separators=(",", ":")) + "\n")


def test_files_rotate_at_a_size_or_an_age_and_keep_the_newest(tmp_path):
    now = [1_700_000_000.0]
    f = RotatingFile(tmp_path / "crawl.log", max_bytes=100, max_age=60.0, keep=2, now=lambda: now[0])
    f.write("x" * 60 + "\n")
    f.write("y" * 60 + "\n")  # under the bound before it: same file
    assert f.rotations == 0
    now[0] += 1
    f.write("z\n")  # full: rotated first
    assert f.rotations == 1 and (tmp_path / "crawl.log").read_text() == "z\n"
    now[0] += 61
    f.write("w\n")  # an old file rotates even when small
    assert f.rotations == 2 and (tmp_path / "crawl.log").read_text() == "w\n"
    for _ in range(3):
        now[0] += 61
        f.write("v\n")
    assert f.rotations == 5 and len(f.rotated()) == 2
    assert [p.read_text() for p in f.rotated()] == ["v\n", "v\n"]
    assert f.rotated()[0].name == "crawl.log.20231114T221624Z"
    f.close()


# ------------------------------------------------------------------------------------------------ readers


class Broker:
    """A stand-in stream output: refuses while `down`, records what it took."""

    reader = "stream"
    uses_json = False

    def __init__(self) -> None:
        self.down = True
        self.tries = 0
        self.got: list[tuple[str, int]] = []

    def target(self) -> str:
        return "broker"

    async def hand_on(self, node, records) -> None:
        self.tries += 1
        await trio.sleep(0.01)
        if self.down:
            raise ConnectionError("connection refused")
        self.got += [(node, seq) for seq, _f in records]

    def close(self) -> None:
        pass


async def test_a_dead_broker_is_retried_with_back_off_and_gets_every_record_once(store, tmp_path, autojump_clock):
    broker = Broker()
    local = LocalLog(tmp_path / "log", ("text", "json"), max_bytes=1 << 20, max_age=3600.0, keep=2)
    log = CrawlLog(store.crawl_log, "node-a", [local, broker], limit=1000)  # type: ignore[list-item]
    store.crawl_log.put([_record(n) for n in range(700)])
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        await trio.sleep(10.0)
        # the files have everything; the broker was tried at 0, 1, 3 and 7 s, and the records wait for it
        status = log.status()["readers"]
        assert broker.tries == 4 and broker.got == []
        assert status["file"]["ok"] and status["file"]["handed_on"] == 700 and status["file"]["waiting"] == 0
        assert not status["stream"]["ok"] and status["stream"]["error"] == "ConnectionError: connection refused"
        assert status["stream"]["waiting"] == 700 and status["stream"]["failures"] == 4 and len(store.crawl_log) == 700
        broker.down = False
        await trio.sleep(20.0)
        nursery.cancel_scope.cancel()
    assert broker.got == [("node-a", n) for n in range(700)]
    assert log.status()["readers"]["stream"]["ok"] and len(store.crawl_log) == 0
    lines = (tmp_path / "log" / "crawl.log").read_text().splitlines()
    assert [json.loads(line.split()[-1])["id"] for line in lines] == [f"node-a-{n}" for n in range(700)]
    assert len((tmp_path / "log" / "crawl.jsonl").read_text().splitlines()) == 700
    local.close()


async def test_a_reader_that_caught_up_reads_the_store_again_only_once_records_come(store, tmp_path, autojump_clock):
    """An idle node's readers cost no transaction: after catching up, a reader looks at the spool again only when
    the crawl put records there; those reach it within a second, in one batch."""
    local = LocalLog(tmp_path / "log", ("json",), max_bytes=1 << 20, max_age=3600.0, keep=2)
    log = CrawlLog(store.crawl_log, "node-a", [local], limit=1000)
    looks = []
    after = store.crawl_log.after
    store.crawl_log.after = lambda reader, limit: looks.append(trio.current_time()) or after(reader, limit)  # type: ignore[method-assign]
    store.crawl_log.put([_record(n) for n in range(10)])
    async with trio.open_nursery() as nursery:
        await nursery.start(log.run)
        await trio.sleep(30.5)  # between two of the reader's looks
        assert len(looks) == 1 and log.status()["readers"]["file"]["handed_on"] == 10
        start = trio.current_time()
        store.crawl_log.put([_record(n) for n in range(10, 15)])
        store.crawl_log.put([_record(n) for n in range(15, 20)])
        await trio.sleep(1.0)
        assert len(looks) == 2 and looks[1] - start <= 1.0 and log.status()["readers"]["file"]["handed_on"] == 20
        await trio.sleep(30.0)
        assert len(looks) == 2
        nursery.cancel_scope.cancel()
    assert len((tmp_path / "log" / "crawl.jsonl").read_text().splitlines()) == 20
    local.close()


async def test_drops_past_the_bound_are_counted_and_warned_about(store, autojump_clock, caplog):
    broker = Broker()
    log = CrawlLog(store.crawl_log, "node-a", [broker], limit=50)  # type: ignore[list-item]
    assert store.crawl_log.put([_record(n) for n in range(80)]) == 30
    with caplog.at_level(logging.WARNING, logger="peer.outputs.crawllog"):
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            broker.down = False
            await trio.sleep(5.0)
            nursery.cancel_scope.cancel()
    assert broker.got == [("node-a", n) for n in range(50)]
    assert log.status()["dropped"] == 30
    warned = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warned) == 1 and warned[0].dropped == 30  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------ settings


def test_a_bad_stream_url_is_one_clear_error_at_start():
    target = stream_target("redis://:pw@10.0.0.5:6380/2?stream=crawl&maxlen=5000")
    assert (target.host, target.port, target.db, target.password, target.stream, target.maxlen) == (
        "10.0.0.5", 6380, 2, "pw", "crawl", 5000)
    assert target.url() == "redis://10.0.0.5:6380/2?stream=crawl&maxlen=5000"  # no password shown
    assert stream_target("redis://h").stream == "peercrawl:crawl-log"
    for bad, why in [("kafka://h:9092", "only redis://"), ("redis://h/x", "database must be a number"),
                     ("redis://h?maxlen=0", "maxlen must be >= 1"), ("redis://h?topic=x", "unknown parameter"),
                     ("redis://:pw@h:99999", "Port out of range"), ("redis:///0", "no host")]:
        with pytest.raises(ConfigError, match=why) as info:
            load(env={}, flags={"crawl_log": bad})
        assert "pw" not in str(info.value)
    with pytest.raises(ConfigError, match="crawl_log_local must be"):
        load(env={}, flags={"crawl_log_local": "xml"})
    assert load(env={"PEERCRAWL_CRAWL_LOG": "redis://h:1/0"}, flags={}).crawl_log == "redis://h:1/0"


# ------------------------------------------------------------------------------------------------ real Redis


@pytest.mark.slow  # a real redis-server, killed and restarted
async def test_the_stream_gets_every_record_through_a_broker_kill(store, tmp_path):
    server = RedisServer(str(tmp_path))
    try:
        stream = StreamLog(stream_target(server.url + "?stream=log&maxlen=100000"))
        log = CrawlLog(store.crawl_log, "node-a", [stream], limit=100_000)
        store.crawl_log.put([_record(n) for n in range(1200)])
        async with trio.open_nursery() as nursery:
            await nursery.start(log.run)
            with trio.fail_after(30):
                while log.status()["readers"]["stream"]["handed_on"] < 1200:
                    await trio.sleep(0.02)
            await trio.to_thread.run_sync(server.kill)
            store.crawl_log.put([_record(n) for n in range(1200, 1500)])  # the crawl goes on: spooled
            with trio.fail_after(30):
                while log.status()["readers"]["stream"]["ok"]:
                    await trio.sleep(0.02)
            assert log.status()["readers"]["stream"]["waiting"] == 300
            await trio.to_thread.run_sync(server.start)
            with trio.fail_after(60):
                while log.status()["readers"]["stream"]["waiting"]:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        entries = server.entries("log")
        ids = [e["id"] for e in entries]
        assert set(ids) == {f"node-a-{n}" for n in range(1500)}  # every record at least once
        first = entries[0]
        assert set(first) == {"id", "url", "record"} and first["url"] == "http://a.example/0"
        record = json.loads(first["record"])
        assert record == json.loads(json_line("node-a", 0, _record(0))) and record["id"] == first["id"]
        assert record["status"] == 200 and record["warc"] == "a.warc.gz"
        stream.close()
    finally:
        server.close()


@pytest.mark.slow  # a real redis-server
async def test_the_stream_signs_in_picks_its_database_and_raises_error_replies():
    """The stream speaks Redis's protocol itself: AUTH and SELECT from the URL before its first XADD, and an error
    reply (a refused password, a key of another type) is an error of the hand-on, so the batch is sent again."""
    import redis

    server = RedisServer()
    try:
        server.client().config_set("requirepass", "s3cret")
        client = redis.Redis(host="127.0.0.1", port=server.port, db=3, password="s3cret", decode_responses=True)
        for url, error in ((f"redis://:nope@127.0.0.1:{server.port}/3?stream=s", "WRONGPASS"),
                           (f"redis://127.0.0.1:{server.port}/3?stream=s", "NOAUTH")):
            refused = StreamLog(stream_target(url))
            with pytest.raises(StreamError, match=error):
                await refused.hand_on("n", [(0, _record(0))])
            refused.close()
        stream = StreamLog(stream_target(f"redis://:s3cret@127.0.0.1:{server.port}/3?stream=s"))
        await stream.hand_on("n", [(n, _record(n)) for n in range(3)])
        await stream.hand_on("n", [(3, _record(3))])  # the same connection again
        assert [fields["id"] for _id, fields in client.xrange("s")] == ["n-0", "n-1", "n-2", "n-3"]
        client.set("taken", "a string")
        taken = StreamLog(stream_target(f"redis://:s3cret@127.0.0.1:{server.port}/3?stream=taken"))
        with pytest.raises(StreamError, match="WRONGTYPE"):
            await taken.hand_on("n", [(n, _record(n)) for n in range(3)])
        await stream.hand_on("n", [(4, _record(4))])
        assert client.xlen("s") == 5 and client.dbsize() == 2
        stream.close()
        taken.close()
    finally:
        server.close()


@pytest.mark.slow  # a real redis-server
async def test_the_stream_is_bounded_by_maxlen(store, tmp_path):
    server = RedisServer()
    try:
        stream = StreamLog(stream_target(server.url + "?stream=small&maxlen=100"))
        log = CrawlLog(store.crawl_log, "n", [stream], limit=10_000)
        store.crawl_log.put([_record(n) for n in range(3000)])
        await log.flush()
        length = server.client().xlen("small")
        assert 100 <= length < 3000  # MAXLEN ~: trimmed whole macro-nodes at a time, never under the bound
        assert server.entries("small")[-1]["id"] == "n-2999"
        stream.close()
    finally:
        server.close()



# ------------------------------------------------------------------------------------------------ a real node


@pytest.mark.slow  # a whole crawl of the local web and a real redis-server
async def test_a_node_logs_every_fetched_url_to_its_files_and_the_stream(tmp_path):
    from warcio.archiveiterator import ArchiveIterator

    from peer.node import Node
    from peerlab.localweb import SiteGraph

    from .support.crawl import node_config, start_local_web, urls_fetched

    server = RedisServer()
    try:
        graph = SiteGraph.generate(seed=12, hosts=4, pages_per_host=12, features=False)
        async with trio.open_nursery() as nursery:
            web, dns = await start_local_web(nursery, graph)
            expected = web.expected()
            cfg = node_config(tmp_path / "node", web, dns, exit_when_done=False,
                              crawl_log=server.url + "?stream=crawl")
            node = Node(cfg)
            await nursery.start(node.run)
            with trio.fail_after(60):
                while not node.crawler.is_done() or node.crawl_log.status()["readers"]["stream"]["waiting"]:
                    await trio.sleep(0.05)
            status = node.status()
            metrics = (await trio.to_thread.run_sync(_get, node, "/metrics")).decode()
            some = sorted(expected.fetched)[0]
            host = some.split("/")[2]
            looked = (await trio.to_thread.run_sync(_get, node, f"/cdx?url={host}&matchType=host&output=json")).decode()
            exact = (await trio.to_thread.run_sync(_get, node, f"/cdx?url={some}")).decode()
            node.request_stop()
            with trio.fail_after(30):
                while node.final_status is None:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        fetched = urls_fetched(web, expected)
        entries = server.entries("crawl")
        assert {e["url"] for e in entries} == fetched
        assert len({e["id"] for e in entries}) == len(entries)  # one record per fetch, no repeat without a fault
        jsonl = [json.loads(line) for line in (tmp_path / "node" / "crawl-log" / "crawl.jsonl").read_text().splitlines()]
        text = (tmp_path / "node" / "crawl-log" / "crawl.log").read_text().splitlines()
        assert [r["id"] for r in jsonl] == [json.loads(line.split()[-1])["id"] for line in text]
        assert {r["id"] for r in jsonl} == {e["id"] for e in entries}
        # a stored page's record points at its response record in the WARC file
        stored = [r for r in jsonl if r["warc"]]
        assert {r["url"] for r in stored} == set(expected.fetched)
        for r in stored[:20]:
            with open(tmp_path / "node" / "warc" / r["warc"], "rb") as fh:
                fh.seek(r["offset"])
                record = next(iter(ArchiveIterator(fh)))
            assert record.rec_headers.get_header("WARC-Target-URI") == r["url"]
            assert record.rec_headers.get_header("WARC-Payload-Digest") == r["digest"]
            assert r["status"] == 200 and r["mime"] == "text/html" and r["node"] == "test-node"
        seeds = {r["url"] for r in jsonl if r["path"] == "-"}
        assert seeds == set(cfg.seeds) & fetched
        assert all(r["via"] != "-" for r in jsonl if r["path"] != "-")
        # the node's own look-up (standalone: its indexes): every stored page of the host, and one line per capture
        captures = [json.loads(line) for line in looked.splitlines()]
        assert {c["url"] for c in captures} == {u for u in expected.fetched if u.split("/")[2] == host}
        assert all(c["node"] == "test-node" and "object" not in c for c in captures)
        assert len(exact.splitlines()) == 1 and json.loads(exact.split(" ", 2)[2])["url"] == some
        readers = status["crawl_log"]["readers"]
        assert readers["stream"]["ok"] and readers["stream"]["handed_on"] == len(entries)
        assert status["crawl_log"]["dropped"] == 0
        kinds = {o["kind"] for o in status["detail"]["outputs"]}
        assert kinds == {"crawl-log", "crawl-log-stream"}
        assert 'peercrawl_crawl_log_records_total{reader="stream"}' in metrics
        assert 'peercrawl_crawl_log_waiting{reader="stream"} 0.0' in metrics
    finally:
        server.close()


def _get(node, path: str) -> bytes:
    import httpx

    token = (Path(node.cfg.data_dir) / "control.token").read_text().strip()
    return httpx.get(f"http://127.0.0.1:{node.control_port}{path}", headers={"authorization": f"Bearer {token}"}).content
