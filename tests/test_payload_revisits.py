"""Identical payloads across URLs: a page whose payload was stored in full before (under another URL) is a WARC
revisit record, profile identical-payload-digest, naming the original by URL, date and record id.

- (`DigestAsks`, the sans-I/O part in protocol/, has its own tests: tests/test_protocol_digestasks.py)
- `PayloadDigests` (storage/): the first original put for a digest stays, across a reopen;
- `DigestLookups` (the cluster's side) over an in-memory link with MockClock: the owner answers; a node that
  owns the digest answers itself; an owner that never answers costs exactly the timeout, and "not known";
- a node alone crawls a local web of mirrored documents (the same bytes on every host): one full record per
  document, revisit records for the other copies, read back with warcio; and with the option off, every copy
  is stored in full (the disk saved is measured in tests/bench/bench_payload_revisits.py).
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from peer.cluster.core.digests import DigestLookups
from peer.node import Node
from peerlab.localweb.graph import SiteGraph, mirror_path
from protocol import DigestAsk
from storage import NodeStore, StoredPayload, digest_ring_key, payload_digest

from .support.crawl import node_config, start_local_web

PROFILE = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"


# -- the store -------------------------------------------------------------------------------------------------

def test_the_first_original_of_a_digest_stays_across_a_reopen(tmp_path) -> None:
    store = NodeStore.open(tmp_path)
    first = StoredPayload("D1", "http://a.test/", 100.0, "<urn:uuid:1>")
    assert store.digests.put_many([first, StoredPayload("D2", "http://b.test/", 101.0, "")]) == 2
    assert store.digests.put_many([StoredPayload("D1", "http://c.test/", 102.0, "<urn:uuid:3>")]) == 0
    store.close()
    store = NodeStore.open(tmp_path)
    assert store.digests.get_many(["D1", "D3"]) == {"D1": first}
    assert len(store.digests) == 2
    store.close()


# -- the cluster's look-ups over an in-memory link ----------------------------------------------------------------

class _Wire:
    """Links between DigestLookups in one trio run: a message goes to the receiver's `on_message` through a
    bounded channel (a link's queue); `cut` peers drop everything sent to them, as a dead link does."""

    def __init__(self) -> None:
        self.nodes: dict[str, DigestLookups] = {}
        self.sent: list[tuple[str, str, object]] = []
        self.cut: set[str] = set()
        self.send, self.receive = trio.open_memory_channel[tuple[str, str, object]](100)

    def links_of(self, node_id: str):
        wire = self

        class Links:
            def send_nowait(self, peer_id: str, message, *, address: str | None = None) -> bool:
                wire.sent.append((node_id, peer_id, message))
                if peer_id in wire.cut:
                    return True  # queued on a link that will never deliver
                wire.send.send_nowait((node_id, peer_id, message))
                return True

        return Links()

    async def deliver(self) -> None:
        async for sender, peer, message in self.receive:
            self.nodes[peer].on_message(sender, message)


def _two_nodes(tmp_path, owner: str):
    wire = _Wire()
    stores = {name: NodeStore.open(tmp_path / name) for name in ("A", "B")}
    for name in ("A", "B"):
        wire.nodes[name] = DigestLookups(name, stores[name].digests, wire.links_of(name), owner_of=lambda key: owner)
    return wire, stores


async def test_the_owner_answers_an_ask_and_keeps_what_it_is_told(tmp_path, autojump_clock) -> None:
    wire, stores = _two_nodes(tmp_path, owner="B")
    a, b = wire.nodes["A"], wire.nodes["B"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wire.deliver)
        await nursery.start(a.run)
        await nursery.start(b.run)
        start = trio.current_time()
        assert await a.original("P") is None  # nobody stored it yet
        asked_at = trio.current_time() - start
        a.stored(StoredPayload("P", "http://a.test/1", 50.0, "<urn:uuid:p>"))
        await trio.sleep(0.1)  # the note goes with the next batch (20 ms)
        assert stores["B"].digests.get_many(["P"])["P"].uri == "http://a.test/1"
        assert len(stores["A"].digests) == 0  # A does not own it: nothing kept there
        # two asks at once for the same digest: one message
        results = []

        async def ask() -> None:
            results.append(await a.original("P"))

        before = sum(1 for _s, _p, m in wire.sent if isinstance(m, DigestAsk) and m.digests)
        async with trio.open_nursery() as two:
            two.start_soon(ask)
            two.start_soon(ask)
        after = sum(1 for _s, _p, m in wire.sent if isinstance(m, DigestAsk) and m.digests)
        assert after - before == 1
        assert results == [StoredPayload("P", "http://a.test/1", 50.0, "<urn:uuid:p>")] * 2
        assert b.status()["notes_received"] == 1 and a.status()["found"] == 1
        nursery.cancel_scope.cancel()
    assert asked_at == pytest.approx(0.02)  # an ask waits for the batch's tick, the link takes no time here
    for store in stores.values():
        store.close()


async def test_a_node_with_nothing_to_ask_sleeps_until_it_has(tmp_path, autojump_clock) -> None:
    # the sender wakes for work, not every tick: a node that stores no page costs nothing here
    wire, stores = _two_nodes(tmp_path, owner="B")
    a, b = wire.nodes["A"], wire.nodes["B"]
    flushes = []
    flush = a.flush
    a.flush = lambda now: (flushes.append(now), flush(now))  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wire.deliver)
        await nursery.start(a.run)
        await nursery.start(b.run)
        await trio.sleep(60.0)
        assert flushes == []
        start = trio.current_time()
        assert await a.original("P") is None
        assert trio.current_time() - start == pytest.approx(0.02)  # queued, sent one interval later, answered
        await trio.sleep(60.0)
        assert len(flushes) <= 2  # the ask's batch, and the tick that saw its answer
        nursery.cancel_scope.cancel()
    for store in stores.values():
        store.close()


async def test_a_node_that_owns_the_digest_answers_itself(tmp_path, autojump_clock) -> None:
    wire, stores = _two_nodes(tmp_path, owner="A")
    a = wire.nodes["A"]
    a.stored(StoredPayload("Q", "http://a.test/q", 5.0, ""))
    assert await a.original("Q") == StoredPayload("Q", "http://a.test/q", 5.0, "")
    assert wire.sent == []  # no message
    for store in stores.values():
        store.close()


async def test_an_owner_that_never_answers_costs_the_timeout_and_the_page_is_stored_in_full(
        tmp_path, autojump_clock) -> None:
    wire, stores = _two_nodes(tmp_path, owner="B")
    wire.cut.add("B")
    a = wire.nodes["A"]
    stores["B"].digests.put_many([StoredPayload("R", "http://b.test/r", 1.0, "")])  # B knows, but cannot say
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        start = trio.current_time()
        assert await a.original("R") is None
        waited = trio.current_time() - start
        nursery.cancel_scope.cancel()
    # sent at the first tick (0.02 s), given up at the tick 2 s after it
    assert waited == pytest.approx(2.02)
    assert a.status()["unanswered"] == 1 and a.status()["waiting"] == 0
    for store in stores.values():
        store.close()


async def test_a_view_change_that_moves_a_digest_to_a_node_that_never_heard_of_it_answers_not_known(
        tmp_path, autojump_clock) -> None:
    owner = {"now": "A"}
    wire = _Wire()
    stores = {name: NodeStore.open(tmp_path / name) for name in ("A", "B")}
    for name in ("A", "B"):
        wire.nodes[name] = DigestLookups(name, stores[name].digests, wire.links_of(name),
                                         owner_of=lambda key: owner["now"])
    a, b = wire.nodes["A"], wire.nodes["B"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wire.deliver)
        await nursery.start(a.run)
        await nursery.start(b.run)
        b.stored(StoredPayload("S", "http://b.test/s", 1.0, ""))  # A owns S: told with the next batch
        await trio.sleep(0.1)
        assert (await b.original("S")).uri == "http://b.test/s"
        owner["now"] = "B"  # the ring moved S to B, which never kept it: the page is stored in full again
        assert await a.original("S") is None
        a.stored(StoredPayload("S", "http://a.test/s", 2.0, ""))
        await trio.sleep(0.1)
        assert (await a.original("S")).uri == "http://a.test/s"  # the copy stored after the change is the original
        nursery.cancel_scope.cancel()
    for store in stores.values():
        store.close()


def test_a_digest_is_a_ring_key_as_a_host_is() -> None:
    from ring import Ring
    ring = Ring({"A": 1, "B": 1, "C": 1})
    owners = {ring.owner(digest_ring_key(payload_digest(bytes([i])))) for i in range(64)}
    assert owners == {"A", "B", "C"}  # digests spread over the ring's nodes


# -- a node alone over a web of mirrored documents --------------------------------------------------------------

def _records(warc_dir) -> list[dict]:
    out = []
    for path in sorted(warc_dir.glob("*.warc.gz")):
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh, check_digests="raise"):
                if record.rec_type in ("response", "revisit"):
                    h = record.rec_headers
                    out.append({name: h.get_header(name) for name in (
                        "WARC-Type", "WARC-Record-ID", "WARC-Target-URI", "WARC-Date", "WARC-Profile",
                        "WARC-Refers-To", "WARC-Refers-To-Target-URI", "WARC-Refers-To-Date",
                        "WARC-Payload-Digest")} | {"status": record.http_headers.get_statuscode()})
    return out


@pytest.mark.slow  # two crawls of a small web by a real node
@pytest.mark.parametrize("work", [{}, {"page_threads": 2}, {"page_processes": 1}],
                         ids=["inline", "page-threads", "page-processes"])
async def test_a_node_alone_writes_one_full_copy_of_each_mirrored_document(tmp_path, work) -> None:
    mirrored = 3
    graph = SiteGraph.generate(seed=5, hosts=5, pages_per_host=3, features=False, mirrored=mirrored)
    statuses = {}
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        # the crawl without payload revisits once, beside the inline one (the page's work is the same elsewhere)
        for name, on in (("on", True), ("off", False)) if not work else (("on", True),):
            node = Node(node_config(tmp_path / name, web, dns, payload_revisits=on, **work))
            with trio.fail_after(60):
                await node.run()
            statuses[name] = node.final_status
        nursery.cancel_scope.cancel()
    mirror_urls = {web.url(spec.name, mirror_path(k)) for spec in graph.hosts for k in range(mirrored)}
    records = _records(tmp_path / "on" / "warc")
    by_uri = defaultdict(list)
    for r in records:
        by_uri[r["WARC-Target-URI"]].append(r)
    assert mirror_urls <= set(by_uri) and all(len(by_uri[u]) == 1 for u in mirror_urls)
    full = {(r["WARC-Target-URI"], r["WARC-Date"]): r for r in records if r["WARC-Type"] == "response"}
    revisits = [r for r in records if r["WARC-Type"] == "revisit"]
    # one full copy per document, the other hosts' copies are revisits naming it
    assert sum(1 for u in mirror_urls if by_uri[u][0]["WARC-Type"] == "response") == mirrored
    assert {r["WARC-Target-URI"] for r in revisits} == mirror_urls - {u for u in mirror_urls
                                                                      if by_uri[u][0]["WARC-Type"] == "response"}
    for r in revisits:
        original = full[(r["WARC-Refers-To-Target-URI"], r["WARC-Refers-To-Date"])]
        assert r["WARC-Profile"] == PROFILE and r["status"] == "200"
        assert original["WARC-Payload-Digest"] == r["WARC-Payload-Digest"]
        assert original["WARC-Record-ID"] == r["WARC-Refers-To"]
        assert original["WARC-Target-URI"] != r["WARC-Target-URI"]
    assert statuses["on"]["payload_revisits"]["records"] == len(revisits) == len(graph.hosts) * mirrored - mirrored
    if work:
        return
    # with the option off every copy is a full record, and the crawl found the same pages
    off = _records(tmp_path / "off" / "warc")
    assert all(r["WARC-Type"] == "response" for r in off)
    assert {r["WARC-Target-URI"] for r in off} == set(by_uri)
    assert statuses["off"]["payload_revisits"]["records"] == 0
    assert statuses["on"]["pages"] == statuses["off"]["pages"]
    size = {name: sum(p.stat().st_size for p in (tmp_path / name / "warc").glob("*.warc.gz")) for name in statuses}
    assert size["on"] < size["off"]
    print(f"WARC bytes with payload revisits {size['on']}, without {size['off']}, "
          f"revisit records {len(revisits)}")
