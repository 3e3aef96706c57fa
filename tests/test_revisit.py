"""Revisits: a node with --revisit fetches every stored page again within its bounds, with conditional GETs;
unchanged pages cost a WARC revisit record (a 304: server-not-modified; the same payload: identical-payload-
digest), changed pages a full record. Judged by the local web's own log (which pages changed when, what it
answered) and by reading the WARC files back with warcio. The schedule's side of a hand-off is tested on the real
`Handoff` and LMDB `NodeStore`, chunks delivered by hand in either order: a revisit is queued at a node exactly
when its page's URL is."""

from __future__ import annotations

import time
from dataclasses import replace
from collections import defaultdict

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from peer.cli.format import format_status
from peer.cluster.handoff.handoff import Handoff, handoff_arcs
from peer.config import load
from peer.crawl.crawler import Crawler
from peer.node import Node
from peerlab.localweb.changes import ChangeSchedule
from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.server import serve_web
from protocol import HandoffChunk, Limits, Message, RevisitEntry, encode_body
from ring import Ring, diff, host_position
from storage import NodeStore, NullPageStore, QueuedUrl, RevisitRecord, RevisitSchedule, in_arc, queued_url_keys
from storage._lmdb import LmdbEnv
from storage._revisits import REVISIT_DB, REVISIT_DUE_DB

from .support.crawl import node_config

MIN, MAX = 1.0, 4.0


def test_the_schedule_reads_only_what_is_due_and_keeps_the_later_time_on_a_merge(tmp_path):
    env = LmdbEnv.open(tmp_path, (REVISIT_DB, REVISIT_DUE_DB))
    sched = RevisitSchedule(env)
    for i in range(50):
        sched.put(RevisitRecord(url=f"http://h{i % 5}.test/{i}", host=f"h{i % 5}.test", depth=1, due=100.0 + i,
                                interval=10.0))
    assert len(sched) == 50 and sched.waiting() == 50
    assert [url for _, url in sched.next_due(3)] == ["http://h0.test/0", "http://h1.test/1", "http://h2.test/2"]
    taken = env.write(lambda txn: sched._take_due_in(txn, 109.5, 100, lambda host: host != "h3.test"))
    assert [r.url for r in taken] == [f"http://h{i % 5}.test/{i}" for i in range(10) if i % 5 != 3]
    assert all(r.queued for r in taken) and sched.waiting() == 50 - len(taken)
    assert [r.due for r in taken][:2] == [100.0, 101.0]  # the time it was due is kept (its lateness is measured)
    # a record handed over for a page queued here keeps "queued"; an earlier due time never wins
    sched.put_arc([RevisitRecord(url="http://h0.test/0", host="h0.test", depth=1, due=50.0, interval=1.0),
                   RevisitRecord(url="http://h0.test/20", host="h0.test", depth=1, due=99.0, interval=1.0),
                   RevisitRecord(url="http://h0.test/10", host="h0.test", depth=1, due=500.0, interval=1.0)])
    assert sched.get("h0.test", "http://h0.test/0").queued and sched.waiting() == 50 - len(taken)
    assert sched.get("h0.test", "http://h0.test/20").due == 120.0  # waiting here until 120: not 99
    assert sched.get("h0.test", "http://h0.test/10").due == 500.0
    assert sched.forget("h0.test", "http://h0.test/10") and sched.get("h0.test", "http://h0.test/10") is None
    env.close()


@pytest.mark.slow  # a node revisits every page of a small web for several seconds
async def test_one_node_revisits_within_bounds_and_writes_revisit_records(tmp_path):
    graph = SiteGraph.generate(seed=41, hosts=6, pages_per_host=6, features=False)
    changes = ChangeSchedule(start=time.time(), periods=(None, 2.5))
    async with trio.open_nursery() as nursery:
        web = await nursery.start(lambda task_status: serve_web(graph, changes=changes, task_status=task_status))
        dns = await nursery.start(serve_dns, graph.zone())
        cfg = node_config(tmp_path / "node", web, dns, exit_when_done=False, revisit=True, revisit_min=MIN,
                          revisit_max=MAX, delay=0.05)
        node = Node(cfg)
        await nursery.start(node.run)
        await trio.sleep(14.0)
        # no new host turn, and the ones under way finish: every request the web served is then in the WARC
        # files (a stop would cancel the fetches in flight, which are fetched again after a restart)
        crawler = node.crawler
        assert crawler is not None
        crawler.hold("test", True)
        with trio.fail_after(20):
            while crawler.active or crawler.frontier.in_flight():
                await trio.sleep(0.02)
        status = node.status()
        node.request_stop()
        with trio.fail_after(20):
            while node.final_status is None:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    fetches: dict[tuple[str, str], list] = defaultdict(list)
    for r in web.log:
        if not r.path.endswith("robots.txt"):
            fetches[(r.host, r.path)].append(r)
    assert len(fetches) >= 20
    # every page fetched again, never sooner than the minimum nor later than the maximum (plus the read tick
    # of the schedule, 1 s, and the host's turn)
    gaps = []
    for key, records in fetches.items():
        times = sorted(r.wall_start for r in records)
        assert len(times) >= 3, (key, times)
        gaps += [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= MIN - 0.05 and max(gaps) <= MAX + 1.5, (min(gaps), max(gaps))
    # 304s only on hosts that answer conditional requests, and only for pages that had not changed
    answered_304 = [r for records in fetches.values() for r in records if r.status == 304]
    assert answered_304 and all(changes.conditional(r.host) for r in answered_304)
    # the WARC files, read back
    kinds: dict[str, list] = defaultdict(list)
    for path in sorted((tmp_path / "node" / "warc").glob("*.warc.gz")):
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh, check_digests="raise"):
                if record.rec_type in ("response", "revisit"):
                    h = record.rec_headers
                    kinds[h.get_header("WARC-Target-URI")].append(
                        (record.rec_type, h.get_header("WARC-Date"), h.get_header("WARC-Profile"),
                         h.get_header("WARC-Refers-To-Target-URI"), h.get_header("WARC-Refers-To-Date"),
                         h.get_header("WARC-Payload-Digest"), record.http_headers.get_statuscode()))
    profiles = defaultdict(int)
    for (host, path), records in fetches.items():
        url = web.url(host, path)
        written = sorted(kinds[url], key=lambda k: k[1])
        assert len(written) == len(records), (url, written, [r.status for r in records])
        assert written[0][0] == "response"
        originals = {}
        for kind, date, profile, ref_uri, ref_date, digest, code in written:
            if kind == "response":
                originals[date] = digest
                continue
            profiles[profile.rsplit("/", 1)[-1]] += 1
            assert ref_uri == url and ref_date in originals and originals[ref_date] == digest, (url, written)
            assert code == ("304" if profile.endswith("server-not-modified") else "200")
        if changes.period(host, path) is None:
            assert [k[0] for k in written].count("response") == 1, (url, written)  # never changed: one full
        else:
            assert [k[0] for k in written].count("response") >= 2, (url, written)  # changed: full records
    assert profiles["server-not-modified"] > 0 and profiles["identical-payload-digest"] > 0, profiles
    revisits = status["revisits"]
    assert revisits["unchanged"] == sum(profiles.values()) and revisits["not_modified"] == len(answered_304)
    assert revisits["changed"] > 0 and revisits["bytes_saved"] > 0
    # a due page is queued at the next read of the schedule (1 s) and fetched at its host's next turn; one whose
    # node was starved of CPU for a moment may be later, never by the longest interval
    late = revisits["late_s"]
    assert 0.0 <= late["p50"] <= late["p95"] <= 1.5 and late["max"] <= MAX, late
    assert status["revisit"]["scheduled"] == len(fetches) and status["done"] is False
    shown = format_status(status)  # what `peerctl status` prints
    assert f"changed {revisits['changed']}, unchanged {revisits['unchanged']}" in shown
    assert f"bytes saved {revisits['bytes_saved']}" in shown and "next in" in shown
    print(f"pages {len(fetches)}, fetches {sum(len(r) for r in fetches.values())}, revisit records {dict(profiles)}, "
          f"gaps {min(gaps):.2f}-{max(gaps):.2f} s, saved {revisits['bytes_saved']} B")


async def test_a_revisit_whose_turn_fails_unexpectedly_stays_on_the_schedule(tmp_path, monkeypatch):
    """The crawler's containment (an unexpected exception finishes the URL and backs the host off) must not take a
    page off the schedule: its queued revisit goes back on the time index, due after its interval."""
    import peer.crawl.crawler as crawler_module

    real = crawler_module.Crawler._next_visit
    failed: list[str] = []

    def next_visit(self, item, before, *args, **kw):
        if before is not None and not failed:
            failed.append(item.url)
            raise RuntimeError("a defect reached by this revisit")
        return real(self, item, before, *args, **kw)

    monkeypatch.setattr(crawler_module.Crawler, "_next_visit", next_visit)
    graph = SiteGraph.generate(seed=42, hosts=2, pages_per_host=3, features=False)
    async with trio.open_nursery() as nursery:
        web = await nursery.start(lambda task_status: serve_web(graph, task_status=task_status))
        dns = await nursery.start(serve_dns, graph.zone())
        cfg = node_config(tmp_path / "node", web, dns, exit_when_done=False, revisit=True, revisit_min=MIN,
                          revisit_max=MIN, delay=0.05, max_backoff=0.3)
        node = Node(cfg)
        await nursery.start(node.run)
        with trio.fail_after(30):
            while not failed:
                await trio.sleep(0.05)
            at = len([r for r in web.log if web.url(r.host, r.path) == failed[0]])
            while len([r for r in web.log if web.url(r.host, r.path) == failed[0]]) <= at:
                await trio.sleep(0.05)  # fetched again after the failure: still scheduled
        status = node.status()
        node.request_stop()
        with trio.fail_after(20):
            while node.final_status is None:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert status["errors"]["internal"] == 1


# -- the schedule in a hand-off: a record whose revisit is queued here has its URL in this node's frontier --------

RING_A = Ring({"a": 1}, points_per_weight=1)
RING_AB = Ring({"a": 1, "b0": 1}, points_per_weight=1)
WALL = 1_700_000_000.0


class _Sent:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send_nowait(self, peer_id: str, message: Message) -> bool:
        self.sent.append(message)
        return True


def _moving_page(n: int = 0) -> QueuedUrl:
    """A page on a host that moves from "a" to "b0" when b0 joins (RING_A -> RING_AB)."""
    (arc,) = handoff_arcs(diff(RING_A, RING_AB))
    host = [h for h in (f"h{i}.example" for i in range(1000)) if in_arc(host_position(h), arc.start, arc.end)][n]
    return QueuedUrl(url=f"http://{host}/p", host=host, depth=1, hops=0, found_on=None)


def _fetched_and_due(store: NodeStore, page: QueuedUrl, due: float, interval: float) -> RevisitRecord:
    """`page` fetched here, its schedule written, then queued for its revisit (due at `due`)."""
    assert store.admit([page]) == [page]
    assert store.frontier.pop(page.host) == page
    record = RevisitRecord(url=page.url, host=page.host, depth=page.depth, due=due, interval=interval, etag='"v1"')
    store.finish_revisit(page, record)
    assert store.queue_due(due, 10, lambda host: True) == [page]
    queued = store.revisits.get(page.host, page.url)
    assert queued is not None
    return queued


def _queued(store: NodeStore, page: QueuedUrl) -> int:
    items, _ = store.frontier.export_arc(0, 0)
    return sum(1 for item in items if item.url == page.url)


@pytest.mark.parametrize("order", ["keys first", "schedule first"])
async def test_a_queued_revisit_the_previous_owner_holds_as_fetched_goes_back_on_the_schedule(tmp_path, order):
    """A node queued a page's revisit, then lost the page's host for a while (it was killed and restarted, or
    declared dead while it ran) and gets it back: the heir's hand-off brings the page's key as fetched, and the
    queued URL is discarded here. Its revisit must not be lost with it: the record goes back on the time index,
    due at the later of its time here and the heir's (never early), whichever chunk comes first."""
    store = NodeStore.open(tmp_path / "b0", map_size=1 << 24)
    page = _moving_page()
    here = _fetched_and_due(store, page, due=WALL - 5.0, interval=4.0)
    assert here.queued and store.revisits.waiting() == 0 and _queued(store, page) == 1
    (arc,) = handoff_arcs(diff(RING_A, RING_AB))
    b = Handoff("b0", store, _Sent(), wall_clock=lambda: WALL)
    keys = HandoffChunk(transfer_id=1, chunk_seq=0, epoch=1, arc_start=arc.start, arc_end=arc.end, urls=(),
                        seen_keys=tuple(queued_url_keys([page])), hosts=(), last=False)
    schedule = HandoffChunk(transfer_id=1, chunk_seq=1, epoch=1, arc_start=arc.start, arc_end=arc.end, urls=(),
                            seen_keys=(), hosts=(), last=True, revisits=(RevisitEntry(
                                url=page.url, depth=1, due_in=3.0, queued=False, interval=8.0, etag='"v2"',
                                last_modified=None, digest="D", stored_at=WALL - 20.0, size=100, changed=1,
                                unchanged=0),))
    for chunk in ([keys, schedule] if order == "keys first" else [schedule, keys]):
        await b.on_message("a", chunk)
    assert b.urls_discarded == 1 and _queued(store, page) == 0
    record = store.revisits.get(page.host, page.url)
    assert record is not None and not record.queued and store.revisits.waiting() == 1
    assert (record.due, record.interval, record.etag) == (WALL + 3.0, 8.0, '"v2"')
    assert store.queue_due(WALL + 2.9, 10, lambda host: True) == []
    assert store.queue_due(WALL + 3.0, 10, lambda host: True) == [page]
    store.close()


@pytest.mark.parametrize("order", ["urls first", "schedule first"])
@pytest.mark.parametrize("seen_here", [False, True])
async def test_a_revisit_queued_at_the_sender_is_queued_once_at_the_receiver(tmp_path, order, seen_here):
    """The sender had a page's revisit queued: the URL travels in the queue's chunk, the record marked queued.
    The receiver queues the page once: with the URL (the record off its time index) when its dedup store takes
    the URL as new, or through the schedule at once when it already knew the page (the URL is not queued
    again), whichever chunk comes first."""
    store_a = NodeStore.open(tmp_path / "a", map_size=1 << 24)
    store_b = NodeStore.open(tmp_path / "b0", map_size=1 << 24)
    page = _moving_page()
    _fetched_and_due(store_a, page, due=WALL - 1.0, interval=4.0)
    if seen_here:
        store_b.dedup.insert(queued_url_keys([page]))
    out = _Sent()
    a = Handoff("a", store_a, out, wall_clock=lambda: WALL)
    b = Handoff("b0", store_b, _Sent(), wall_clock=lambda: WALL)
    a.view_changed(1, RING_A, RING_AB)
    b.view_changed(1, RING_A, RING_AB)
    a.pump()
    chunks = [m for m in out.sent if isinstance(m, HandoffChunk)]
    assert any(page.url in {u.url for u in m.urls} for m in chunks)
    assert any(e.queued for m in chunks for e in m.revisits)
    for chunk in (chunks if order == "urls first" else list(reversed(chunks))):
        await b.on_message("a", chunk)
    record = store_b.revisits.get(page.host, page.url)
    assert record is not None and record.etag == '"v1"'
    if seen_here:
        assert _queued(store_b, page) == 0 and not record.queued and record.due == WALL
        assert store_b.queue_due(WALL, 10, lambda host: True) == [page]
    else:
        assert _queued(store_b, page) == 1 and record.queued and store_b.revisits.waiting() == 0
    assert store_b.queue_due(WALL + 1000.0, 10, lambda host: True) == []  # never a second time while queued
    assert _queued(store_b, page) == 1
    store_a.close()
    store_b.close()


async def test_a_validator_longer_than_the_wire_takes_is_handed_over_as_none(tmp_path):
    """A server's ETag past the wire's string limit would make the chunk invalid at every send and stall the
    hand-off: the schedule goes without it (the next revisit is an unconditional GET)."""
    store_a = NodeStore.open(tmp_path / "a", map_size=1 << 24)
    page = _moving_page()
    long_etag = '"' + "x" * Limits().max_string + '"'
    record = _fetched_and_due(store_a, page, due=WALL + 5.0, interval=4.0)
    store_a.revisits.put(replace(record, etag=long_etag))
    out = _Sent()
    a = Handoff("a", store_a, out, wall_clock=lambda: WALL)
    a.view_changed(1, RING_A, RING_AB)
    a.pump()
    entries = [e for m in out.sent if isinstance(m, HandoffChunk) for e in m.revisits]
    assert [(e.url, e.etag) for e in entries] == [(page.url, None)]
    for m in out.sent:
        encode_body(m, "msgpack", Limits())  # every chunk goes on the wire
    store_a.close()


async def test_a_revisit_dropped_at_a_crash_loop_leaves_the_schedule(tmp_path):
    """A revisit in flight at `max_crashes` stops in a row is dropped at restart (it may be what stops the node):
    its page leaves the schedule with it, not left queued with nothing queued to fetch it."""
    cfg = load(env={}, flags={"node_id": "t", "data_dir": str(tmp_path), "allow_private": True, "revisit": True,
                              "max_crashes": 1})
    page = _moving_page()
    with NodeStore.open(tmp_path / "store") as store:
        _fetched_and_due(store, page, due=WALL, interval=4.0)
        assert store.frontier.pop(page.host) == page  # in flight when the process stopped
        crawler = Crawler(cfg, fetcher=None, store=store, pages=NullPageStore())
        assert crawler.restore() == 0 and crawler.dropped_urls == [page.url]
        assert store.revisits.get(page.host, page.url) is None and len(store.revisits) == 0
