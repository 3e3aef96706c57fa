"""URL dispatch: batching at exact virtual times, acks, re-sends, forwarding under a stale view, re-routing on a
view change, and simulations of several nodes over the in-memory network with link breaks and a restarted
receiver (every routed URL ends admitted exactly once, at its owner)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import trio
import trio.testing

from peer.cluster.core.dispatch import DispatchConfig, Dispatcher
from peer.cluster.net.peerlinks import PeerLinks
from peer.cluster.net.memtransport import MemoryNetwork
from peer.crawl.syncs import StoreSyncs
from protocol import BatchAck, UrlBatch, UrlEntry
from ring import Ring
from storage import NodeStore, QueuedUrl

SECRET = b"dispatch-test-secret-0123456789"


def owned_hosts(ring: Ring, owner: str, count: int, start: int = 0) -> list[str]:
    hosts = []
    i = start
    while len(hosts) < count:
        host = f"h{i}.test"
        if ring.owner(host) == owner:
            hosts.append(host)
        i += 1
    return hosts


class FakeLinks:
    """Records what the dispatcher sends; a test delivers (or loses) messages by hand."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, object]] = []
        self.refuse = False
        self.connects: dict[str, int] = {}  # a peer's connection number; raising it is a reconnect

    def send_nowait(self, peer_id: str, message: object) -> bool:
        if self.refuse:
            return False
        self.sent.append((trio.current_time(), peer_id, message))
        return True

    def get(self, peer_id: str) -> object:
        return _Link(self.connects.get(peer_id, 0))


class _Link:
    def __init__(self, connects: int) -> None:
        self.connects = connects
        self.connected = True


@pytest.fixture
def store(tmp_path):
    with NodeStore.open(tmp_path / "a", map_size=1 << 24) as s:
        yield s


RING2 = Ring({"a": 100, "b": 100})


def batches(links: FakeLinks) -> list[tuple[float, str, UrlBatch]]:
    return [(t, p, m) for t, p, m in links.sent if isinstance(m, UrlBatch)]


async def test_batches_by_interval_and_by_size_at_exact_times(store, autojump_clock):
    links = FakeLinks()
    config = DispatchConfig(batch_size=4, interval=0.2, resend_after=5.0)
    d = Dispatcher("a", store, links, ring_of=lambda: (1, RING2), config=config)
    hosts = owned_hosts(RING2, "b", 6)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        start = trio.current_time()
        await trio.sleep(0.05)
        for host in hosts[:3]:
            d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        await trio.sleep(0.1)
        assert batches(links) == []  # a partial batch waits for the timer
        await trio.sleep(0.1)
        [(t, peer, batch)] = batches(links)
        assert (t - start, peer) == (pytest.approx(0.2), "b")
        assert [e.url for e in batch.urls] == [f"http://{h}/" for h in hosts[:3]]
        assert batch.sender == "a" and batch.epoch == 1
        # four more: a full batch leaves at once, not at the next tick
        await trio.sleep(0.01)
        for i in range(4):
            d.route(QueuedUrl(url=f"http://{hosts[3]}/{i}", host=hosts[3], depth=2, hops=1, found_on="http://x.test/"))
        await trio.sleep(0.001)
        assert len(batches(links)) == 2
        t2, _, full = batches(links)[1]
        assert t2 - start == pytest.approx(0.26)  # the moment the 4th URL was routed
        assert [(e.depth, e.hops, e.found_on) for e in full.urls] == [(2, 1, "http://x.test/")] * 4
        assert d.stats.urls_sent["b"] == 7 and d.stats.batches_sent == 2
        nursery.cancel_scope.cancel()


async def test_recently_sent_urls_are_dropped_but_bounded(store, autojump_clock):
    links = FakeLinks()
    d = Dispatcher("a", store, links, ring_of=lambda: (1, RING2), config=DispatchConfig(recent_size=2))
    host = owned_hosts(RING2, "b", 1)[0]
    for path in ["1", "1", "2", "3", "1"]:
        d.route(QueuedUrl(url=f"http://{host}/{path}", host=host, depth=1))
    # "1" repeated at once is dropped; after "2" and "3" it has left the 2-entry filter and goes again
    assert [i.url for _, i in d.take_routed()] == [f"http://{host}/{p}" for p in ["1", "2", "3", "1"]]
    assert d.stats.urls_recent == 1


async def test_unacked_batches_are_resent_and_acks_remove_them(store, autojump_clock):
    links = FakeLinks()
    d = Dispatcher("a", store, links, ring_of=lambda: (1, RING2), config=DispatchConfig(resend_after=5.0))
    host = owned_hosts(RING2, "b", 1)[0]
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        start = trio.current_time()
        d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        await trio.sleep(0.3)
        [(_, _, first)] = batches(links)
        # the link to b carries an unacknowledged batch: the Cluster reports it busy (never closed for idleness)
        assert d.in_flight_to("b") == 1 and d.in_flight_to("c") == 0
        await trio.sleep(5.0)  # lost: sent again after resend_after, same seq
        assert [m.seq for _, _, m in batches(links)] == [first.seq, first.seq]
        assert batches(links)[1][0] - start == pytest.approx(5.2)
        # a reconnect triggers a re-send at the next tick
        links.connects["b"] = 1
        await trio.sleep(0.2)
        assert len(batches(links)) == 3
        await d.on_message("b", BatchAck(seq=first.seq, new=1, seen=0, forwarded=0, epoch=1))
        assert store.outbox.counts() == {}
        await d.on_message("b", BatchAck(seq=first.seq, new=1, seen=0, forwarded=0, epoch=1))
        assert d.stats.acks_unmatched == 1 and d.stats.batches_acked == 1
        await trio.sleep(10.0)
        assert len(batches(links)) == 3  # nothing more to send
        assert d.outstanding() == 0 and d.in_flight() == 0 and d.in_flight_to("b") == 0
        nursery.cancel_scope.cancel()


async def test_a_full_link_queue_is_retried_at_the_next_tick(store, autojump_clock):
    links = FakeLinks()
    links.refuse = True
    d = Dispatcher("a", store, links, ring_of=lambda: (1, RING2))
    host = owned_hosts(RING2, "b", 1)[0]
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        await trio.sleep(0.25)
        assert d.stats.send_refused == 1 and batches(links) == []
        links.refuse = False
        await trio.sleep(0.2)
        assert len(batches(links)) == 1
        nursery.cancel_scope.cancel()


async def test_receiver_admits_owned_forwards_the_rest_then_acks(store, autojump_clock):
    links = FakeLinks()
    ring3 = Ring({"a": 100, "b": 100, "c": 100})
    admitted: list[QueuedUrl] = []
    d = Dispatcher("a", store, links, ring_of=lambda: (7, ring3), on_admitted=admitted.extend)
    mine = owned_hosts(ring3, "a", 2)
    theirs = owned_hosts(ring3, "c", 1)
    urls = [f"http://{mine[0]}/", f"http://{mine[1]}/", f"http://{mine[0]}/", f"http://{theirs[0]}/", "junk"]
    entries = tuple(UrlEntry(url=u, depth=2, found_on=None, hops=0) for u in urls)
    batch = UrlBatch(seq=42, sender="b", epoch=3, urls=entries)
    await d.on_message("b", batch)
    [(_, peer, ack)] = links.sent
    assert peer == "b"
    assert ack == BatchAck(seq=42, new=2, seen=1, forwarded=1, epoch=7)
    assert [i.url for i in admitted] == urls[:2]
    assert [i.url for _, i in store.outbox.take("c", 10)] == urls[3:4]
    assert d.stats.urls_received["b"] == 5 and d.stats.urls_rejected == 1
    # the same batch again (a re-send): idempotent, everything is seen, the forward is harmlessly repeated
    await d.on_message("b", batch)
    assert links.sent[-1][2] == BatchAck(seq=42, new=0, seen=3, forwarded=1, epoch=7)
    assert len(admitted) == 2


class CountingStore:
    """A real NodeStore whose fsyncs are timed (the virtual time of each)."""

    def __init__(self, store: NodeStore) -> None:
        self._store = store
        self.synced_at: list[float] = []

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def sync(self) -> None:
        self._store.sync()
        self.synced_at.append(trio.current_time())


def _batch(seq: int, host: str) -> UrlBatch:
    return UrlBatch(seq=seq, sender="b", epoch=1, urls=(UrlEntry(url=f"http://{host}/{seq}", depth=1,
                                                                   found_on=None, hops=0),))


async def test_receiver_acks_after_the_nodes_next_sync_one_fsync_for_all(store, autojump_clock):
    """A received batch is acknowledged at the node's next sync (its sync service), never before a sync that
    began after the batch was committed; the batches of one period share that sync."""
    counting = CountingStore(store)
    links = FakeLinks()
    syncs = StoreSyncs(counting, period=1.0)
    d = Dispatcher("a", counting, links, ring_of=lambda: (1, RING2), syncs=syncs)  # type: ignore[arg-type]
    mine = owned_hosts(RING2, "a", 4)
    acks = lambda: [(t, m.seq) for t, _p, m in links.sent if isinstance(m, BatchAck)]  # noqa: E731
    async with trio.open_nursery() as nursery:
        await nursery.start(syncs.run)
        start = trio.current_time()  # the service syncs at start + 1, + 2, ...
        await trio.sleep(0.3)
        await d.on_message("b", _batch(1, mine[0]))
        await trio.sleep(0.4)
        await d.on_message("b", _batch(2, mine[1]))
        await trio.sleep(0.2)
        await d.on_message("b", _batch(3, mine[2]))
        assert acks() == [] and counting.synced_at == []  # stored, not yet on disk: no ack
        await trio.sleep(0.2)  # past start + 1: one fsync, then all three acks
        assert [t - start for t in counting.synced_at] == pytest.approx([1.0])
        assert [seq for _t, seq in acks()] == [1, 2, 3]
        assert [t - start for t, _seq in acks()] == pytest.approx([1.0, 1.0, 1.0])
        assert d._unsynced == [] and syncs.waiting() == 0
        # a sync by someone else (a hand-off's) covers what was committed before it; the service tells its
        # waiters at its own next sync
        await d.on_message("b", _batch(4, mine[3]))
        counting.sync()
        await trio.sleep(1.0)
        assert acks()[-1][1] == 4 and acks()[-1][0] == pytest.approx(start + 2.0)
        # a re-send (the same seq) while the first copy waits for its sync is not acknowledged on its own: the
        # ack would let the sender drop URLs before this node has them on disk (and on its backups)
        await trio.sleep(0.5)
        await d.on_message("b", _batch(5, mine[0]))
        await d.on_message("b", _batch(5, mine[0]))
        assert acks()[-1][1] == 4 and d.stats.batches_held == 1
        await trio.sleep(1.0)
        assert [seq for _t, seq in acks()].count(5) == 1 and acks()[-1][0] == pytest.approx(start + 3.0)
        # every ack came after a sync that began after its batch's commit
        received = {1: 0.3, 2: 0.7, 3: 0.9, 4: 1.2, 5: 2.5}
        for t, seq in acks():
            assert any(received[seq] <= s - start <= t - start for s in counting.synced_at), seq
        nursery.cancel_scope.cancel()


async def test_receiver_without_a_running_sync_service_syncs_each_batch_at_once(store, autojump_clock):
    counting = CountingStore(store)
    links = FakeLinks()
    d = Dispatcher("a", counting, links, ring_of=lambda: (1, RING2))  # type: ignore[arg-type]
    mine = owned_hosts(RING2, "a", 2)
    await d.on_message("b", _batch(1, mine[0]))
    await d.on_message("b", _batch(2, mine[1]))
    assert len(counting.synced_at) == 2
    assert [m.seq for _t, _p, m in links.sent if isinstance(m, BatchAck)] == [1, 2]


async def test_view_change_reroutes_the_outbox(store, autojump_clock):
    links = FakeLinks()
    ring3 = Ring({"a": 100, "b": 100, "c": 100})
    ring2 = Ring({"a": 100, "b": 100})
    view = [(1, ring3)]
    admitted: list[QueuedUrl] = []
    d = Dispatcher("a", store, links, ring_of=lambda: view[0], on_admitted=admitted.extend)
    to_c = owned_hosts(ring3, "c", 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        for host in to_c:
            d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        await trio.sleep(0.3)  # between ticks (0.2, 0.4), so task order at a tick does not matter
        assert {p for _, p, _ in batches(links)} == {"c"}
        view[0] = (2, ring2)  # c left before acking
        await trio.sleep(0.2)
        to_b = [h for h in to_c if ring2.owner(h) == "b"]
        to_a = [h for h in to_c if ring2.owner(h) == "a"]
        assert to_a and to_b
        sent_b = [e.url for _, p, m in batches(links) if p == "b" for e in m.urls]
        assert sorted(sent_b) == sorted(f"http://{h}/" for h in to_b)
        assert sorted(i.url for i in admitted) == sorted(f"http://{h}/" for h in to_a)
        assert d.stats.urls_rerouted == len(to_b) and d.stats.urls_reclaimed == len(to_a)
        # a late ack from c removes nothing that moved, and c's stale batch is not sent again
        c_seq = batches(links)[0][2].seq
        await d.on_message("c", BatchAck(seq=c_seq, new=20, seen=0, forwarded=0, epoch=1))
        assert store.outbox.counts() == {"b": len(to_b)}
        await trio.sleep(6.0)
        assert all(p == "b" for _, p, _ in batches(links)[2:])
        nursery.cancel_scope.cancel()


async def test_passed_on_replicas_go_to_their_owner_and_only_its_dedup_decides(store, autojump_clock):
    """A backup passes on the replicas it no longer backs (`QueueReplicas.collect`): each goes to its owner's
    outbox, sent and re-sent as a routed link, and re-routed to its heir if that owner dies before it acks;
    those this node owns now are admitted here. No recently-sent filter drops them: the owner's dedup decides."""
    links = FakeLinks()
    ring3 = Ring({"a": 100, "b": 100, "c": 100})
    view = [(1, ring3)]
    admitted: list[QueuedUrl] = []
    d = Dispatcher("a", store, links, ring_of=lambda: view[0], on_admitted=admitted.extend)
    to_b, to_c, mine = owned_hosts(ring3, "b", 6), owned_hosts(ring3, "c", 6), owned_hosts(ring3, "a", 4)
    items = [QueuedUrl(url=f"http://{h}/q", host=h, depth=2, hops=1, found_on="http://x.test/") for h in
             to_b + to_c + mine]
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        d.route(items[0])  # the same URL routed a moment ago as a link: passed on all the same
        new = d.pass_on(items)
        assert sorted(i.url for i in new) == sorted(f"http://{h}/q" for h in mine)
        assert sorted(i.url for i in admitted) == sorted(f"http://{h}/q" for h in mine)
        assert d.pass_on(items[-len(mine):]) == []  # known here now: the dedup store drops them
        await trio.sleep(0.3)
        sent = {p: sorted(e.url for _, q, m in batches(links) if q == p for e in m.urls) for p in ("b", "c")}
        assert sorted(set(sent["b"])) == sorted(f"http://{h}/q" for h in to_b)
        assert sent["c"] == sorted(f"http://{h}/q" for h in to_c)
        assert all(e.depth == 2 and e.hops == 1 and e.found_on == "http://x.test/"
                   for _, _, m in batches(links) for e in m.urls)
        view[0] = (2, Ring({"a": 100, "b": 100}))  # c dies before it acknowledged them: they go to its heirs
        await trio.sleep(0.4)
        heirs = {h: view[0][1].owner(h) for h in to_c}
        resent_b = {e.url for _, p, m in batches(links) if p == "b" for e in m.urls}
        assert all(f"http://{h}/q" in resent_b for h, o in heirs.items() if o == "b")
        assert {i.url for i in admitted} >= {f"http://{h}/q" for h, o in heirs.items() if o == "a"}
        nursery.cancel_scope.cancel()


async def test_links_staged_before_a_view_change_follow_the_new_view(store, autojump_clock):
    links = FakeLinks()
    ring3 = Ring({"a": 100, "b": 100, "c": 100})
    ring2 = Ring({"a": 100, "b": 100})
    view = [(1, ring3)]
    admitted: list[QueuedUrl] = []
    d = Dispatcher("a", store, links, ring_of=lambda: view[0], on_admitted=admitted.extend)
    to_c = owned_hosts(ring3, "c", 20)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        for host in to_c:  # routed while c owned them, stored with a page after c left
            d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        view[0] = (2, ring2)
        routed = d.take_routed()
        assert {owner for owner, _ in routed} == {"b"}
        store.finish(None, [], routed=routed)
        await trio.sleep(0.3)
        to_a = sorted(f"http://{h}/" for h in to_c if ring2.owner(h) == "a")
        assert sorted(i.url for i in admitted) == to_a and to_a
        sent = sorted(e.url for _, p, m in batches(links) if p == "b" for e in m.urls)
        assert sent == sorted(f"http://{h}/" for h in to_c if ring2.owner(h) == "b")
        # the view change also emptied the recently-sent filter: a link found again is sent again
        d.route(QueuedUrl(url=f"http://{to_c[0]}/", host=to_c[0], depth=1))
        assert d.stats.urls_recent == 0
        d.route(QueuedUrl(url=f"http://{to_c[0]}/", host=to_c[0], depth=1))
        assert d.stats.urls_recent == 1
        nursery.cancel_scope.cancel()


# -- simulations over MemoryNetwork and PeerLinks ---------------------------------------------------------------


class Node:
    """One node's dispatcher, peer links and store, under its own cancel scope so it can be killed."""

    def __init__(self, node_id: str, path, net: MemoryNetwork, view: list, admitted: Counter, rng: random.Random):
        self.node_id = node_id
        self.path = path
        self.net = net
        self.view = view
        self.admitted = admitted
        self.rng = rng
        self.scope: trio.CancelScope | None = None
        self.store: NodeStore | None = None
        self.dispatcher: Dispatcher | None = None
        self.links: PeerLinks | None = None
        self.mine: set[str] = set()  # URLs this node admitted

    def ring_of(self) -> tuple[int, Ring]:
        return self.view[0]

    def _admit(self, items: list[QueuedUrl]) -> None:
        for item in items:
            assert self.view[0][1].owner(item.host) == self.node_id
            self.admitted[item.url] += 1
            self.mine.add(item.url)

    async def start(self, nursery: trio.Nursery, peers: list[str]) -> None:
        self.store = NodeStore.open(self.path, map_size=1 << 24)

        async def on_message(peer_id, message):
            await self.dispatcher.on_message(peer_id, message)

        self.links = PeerLinks(
            node_id=self.node_id, secret=SECRET, transport=self.net.transport(self.node_id),
            on_message=on_message, rng=self.rng,
        )
        self.dispatcher = Dispatcher(
            self.node_id, self.store, self.links, ring_of=self.ring_of,
            config=DispatchConfig(batch_size=50, interval=0.2, resend_after=2.0), on_admitted=self._admit,
        )
        self.scope = trio.CancelScope()

        async def body(task_status=trio.TASK_STATUS_IGNORED):
            with self.scope:
                async with trio.open_nursery() as inner:
                    await inner.start(self.links.run)
                    for peer in peers:
                        if peer != self.node_id:
                            self.links.link(peer, peer)
                    await inner.start(self.dispatcher.run)
                    task_status.started()
                    await trio.sleep_forever()

        await nursery.start(body)

    def kill(self) -> None:
        self.scope.cancel()
        self.store.close()


async def wait_drained(nodes: list[Node], limit: float = 120.0) -> float:
    start = trio.current_time()
    with trio.fail_after(limit):
        while any(n.dispatcher.outstanding() for n in nodes):
            await trio.sleep(0.5)
    return trio.current_time() - start


def urls_for(ring: Ring, sender: str, count: int, rng: random.Random) -> list[QueuedUrl]:
    out = []
    while len(out) < count:
        host = f"h{rng.randrange(300)}.test"
        if ring.owner(host) != sender:
            out.append(QueuedUrl(url=f"http://{host}/p{rng.randrange(400)}", host=host, depth=1))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
async def test_simulation_with_link_breaks_and_a_restarted_receiver(tmp_path, seed, autojump_clock):
    rng = random.Random(seed)
    ids = ["a:1", "b:1", "c:1", "d:1"]
    ring = Ring({"a:1": 150, "b:1": 80, "c:1": 200, "d:1": 40})
    view = [(1, ring)]
    net = MemoryNetwork(random.Random(seed), delay=0.002, jitter=0.003, break_probability=0.05)
    admitted: Counter = Counter()
    nodes = [Node(i, tmp_path / i, net, view, admitted, random.Random(seed * 10 + k)) for k, i in enumerate(ids)]
    routed: set[str] = set()
    async with trio.open_nursery() as nursery:
        for node in nodes:
            await node.start(nursery, ids)
        for round_ in range(6):
            for node in nodes:
                for item in urls_for(ring, node.node_id, 120, rng):
                    routed.add(item.url)
                    node.dispatcher.route(item)
            if round_ == 4:  # a link breaks under a batch not acknowledged yet, which must go again
                # bounded: batches leave at the next tick (0.2 s); a batch can be in flight on a link that is
                # still opening or that a random break just closed, so wait for one on an open link
                broke = 0
                for _ in range(2_000):
                    in_flight = [(n.node_id, o) for n in nodes for o in ids
                                 if o != n.node_id and n.dispatcher.in_flight_to(o)]
                    broke = next((k for k in (net.break_links(*pair) for pair in in_flight) if k), 0)
                    if broke:
                        break
                    await trio.sleep(0.001)
                assert broke > 0, "no batch was ever in flight on an open link"
            await trio.sleep(0.3)
            if round_ == 2:  # c dies and comes back with its store; unacked batches reach it again
                victim = nodes[2]
                victim.kill()
                await trio.sleep(1.0)
                await victim.start(nursery, ids)
        net.break_probability = 0.0
        await wait_drained(nodes)
        nursery.cancel_scope.cancel()
    assert set(admitted) == routed  # nothing lost
    assert set(admitted.values()) == {1}  # each admitted once, by its owner (checked in _admit)
    resent = sum(n.dispatcher.stats.batches_resent for n in nodes)
    assert net.breaks > 0 and resent > 0  # the faults did happen
    for node in nodes:
        node.store.close()


async def test_stale_view_receiver_forwards_to_the_owner(tmp_path, autojump_clock):
    ids = ["a:1", "b:1", "d:1"]
    old = Ring({"a:1": 100, "b:1": 100})
    new = Ring({"a:1": 100, "b:1": 100, "d:1": 100})
    net = MemoryNetwork(random.Random(3), delay=0.001)
    admitted: Counter = Counter()
    a_view, new_view = [(1, old)], [(2, new)]
    a = Node("a:1", tmp_path / "a", net, a_view, admitted, random.Random(1))
    b = Node("b:1", tmp_path / "b", net, new_view, admitted, random.Random(2))
    d = Node("d:1", tmp_path / "d", net, new_view, admitted, random.Random(3))
    # a still routes by the old view: hosts that moved from b to d are sent to b, which forwards them
    moved = [h for h in owned_hosts(old, "b:1", 200) if new.owner(h) == "d:1"][:30]
    assert moved
    async with trio.open_nursery() as nursery:
        for node in (a, b, d):
            await node.start(nursery, ids)
        for host in moved:
            a.dispatcher.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        await wait_drained([a, b, d])
        nursery.cancel_scope.cancel()
    assert set(admitted) == {f"http://{h}/" for h in moved}
    assert set(admitted.values()) == {1}
    assert a.dispatcher.stats.urls_sent == {"b:1": len(moved)}
    assert b.dispatcher.stats.urls_forwarded == len(moved)
    assert b.dispatcher.stats.urls_sent == {"d:1": len(moved)}
    for node in (a, b, d):
        node.store.close()


async def test_a_sender_killed_before_sending_loses_nothing(tmp_path, autojump_clock):
    ids = ["a:1", "b:1"]
    ring = Ring({"a:1": 100, "b:1": 100})
    view = [(1, ring)]
    net = MemoryNetwork(random.Random(4), delay=0.001)
    admitted: Counter = Counter()
    a = Node("a:1", tmp_path / "a", net, view, admitted, random.Random(1))
    b = Node("b:1", tmp_path / "b", net, view, admitted, random.Random(2))
    hosts = owned_hosts(ring, "b:1", 30)
    async with trio.open_nursery() as nursery:
        await a.start(nursery, ids)
        await b.start(nursery, ids)
        # as the crawler does: the routed links go into the store with their page, then the process dies
        for host in hosts:
            a.dispatcher.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        a.store.finish(None, [], routed=a.dispatcher.take_routed())
        a.kill()
        assert admitted == Counter()
        await trio.sleep(1.0)
        await a.start(nursery, ids)
        await wait_drained([a, b])
        nursery.cancel_scope.cancel()
    assert set(admitted) == {f"http://{h}/" for h in hosts}
    assert set(admitted.values()) == {1}
    assert a.dispatcher.stats.urls_sent == {"b:1": 30}
    assert a.dispatcher.run_number == 2  # batch numbers of the second process cannot match an ack meant for the first
    for node in (a, b):
        node.store.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [5, 6, 7])
async def test_view_change_mid_flight_reroutes_and_loses_nothing(tmp_path, seed, autojump_clock):
    rng = random.Random(seed)
    ids = ["a:1", "b:1", "c:1", "d:1"]
    before = Ring({"a:1": 100, "b:1": 100, "c:1": 100, "d:1": 100})
    after = Ring({"a:1": 100, "b:1": 100, "d:1": 100})  # c leaves
    view = [(1, before)]
    # 0.1 s per message: batches sent at a tick are still unacknowledged when the view changes
    net = MemoryNetwork(random.Random(seed), delay=0.1, jitter=0.02, break_probability=0.02)
    admitted: Counter = Counter()
    nodes = [Node(i, tmp_path / i, net, view, admitted, random.Random(k)) for k, i in enumerate(ids)]
    c = nodes[2]
    routed: set[str] = set()
    async with trio.open_nursery() as nursery:
        for node in nodes:
            await node.start(nursery, ids)
        for round_ in range(4):
            for node in nodes:
                for item in urls_for(view[0][1], node.node_id, 100, rng):
                    routed.add(item.url)
                    node.dispatcher.route(item)
            await trio.sleep(0.25)
            if round_ == 1:
                view[0] = (2, after)  # every node sees it at once; batches to c are in flight
        net.break_probability = 0.0
        await wait_drained(nodes)
        nursery.cancel_scope.cancel()
    assert set(admitted) == routed  # nothing lost
    assert c.mine  # c had admitted some before it left
    assert sum(n.dispatcher.stats.urls_rerouted for n in nodes) > 0  # unacked entries for c moved
    assert c.dispatcher.stats.urls_forwarded > 0  # c received batches after the change and passed them on
    for url, count in admitted.items():
        # twice only when c admitted it before leaving and the new owner got it too (hand-off dedups that)
        assert count == 1 or (count == 2 and url in c.mine), url
    for node in nodes:
        node.store.close()


async def test_a_partial_batch_for_few_owners_goes_at_the_next_tick_however_many_peers(store, autojump_clock):
    """With 39 peers and links for one owner, the partial batch leaves at the tick that stores it: a URL's wait
    does not grow with the cluster's size; a full batch still leaves at once."""
    ring40 = Ring({"a": 100, **{f"p{i:02d}": 100 for i in range(39)}}, points_per_weight=10)
    links = FakeLinks()
    config = DispatchConfig(batch_size=4, interval=0.2, resend_after=50.0)
    d = Dispatcher("a", store, links, ring_of=lambda: (1, ring40), config=config)
    hosts = owned_hosts(ring40, "p07", 6)
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        start = trio.current_time()
        await trio.sleep(0.05)
        for host in hosts[:2]:
            d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        await trio.sleep(0.1)
        assert batches(links) == []  # a partial batch waits for the timer
        await trio.sleep(0.1)  # the tick at 0.2 stores the links and sends them
        [(t, peer, batch)] = batches(links)
        assert (t - start, peer, len(batch.urls)) == (pytest.approx(0.2), "p07", 2)
        for i in range(4):
            d.route(QueuedUrl(url=f"http://{hosts[2]}/{i}", host=hosts[2], depth=1))
        await trio.sleep(0.001)
        assert [len(b.urls) for _, _, b in batches(links)] == [2, 4]  # full: at once
        assert batches(links)[1][0] - start == pytest.approx(0.25)  # the moment the 4th URL was routed
        nursery.cancel_scope.cancel()


async def test_a_tick_sends_at_most_twelve_partial_batches_to_the_owners_that_waited_longest(store, autojump_clock):
    """Links for 30 owners at once: 12 partial batches a tick, in the order the owners' links started waiting, so
    a node's message rate stays bounded whatever its number of peers and no owner waits behind a later one; full
    batches are not counted against the 12."""
    ring = Ring({"a": 100, **{f"p{i:02d}": 100 for i in range(40)}}, points_per_weight=10)
    links = FakeLinks()
    config = DispatchConfig(batch_size=3, interval=0.2, resend_after=50.0)
    d = Dispatcher("a", store, links, ring_of=lambda: (1, ring), config=config)
    owners = [f"p{i:02d}" for i in range(40)]
    host_of = {owner: owned_hosts(ring, owner, 2) for owner in owners}
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        start = trio.current_time()
        for owner in owners[:30]:  # one link each, in this order, stored at one tick
            d.route(QueuedUrl(url=f"http://{host_of[owner][0]}/", host=host_of[owner][0], depth=1))
        await trio.sleep(0.21)  # the tick at 0.2 stores them all and sends the first 12
        assert [p for _, p, _ in batches(links)] == owners[:12]
        for owner in owners[30:33]:  # later links: they wait behind the 18 stored before
            d.route(QueuedUrl(url=f"http://{host_of[owner][0]}/", host=host_of[owner][0], depth=1))
        store.finish(None, [], routed=d.take_routed())  # stored now, as the crawler commits a page
        for i in range(3):  # a full batch for an owner still waiting: at once, outside the 12
            d.route(QueuedUrl(url=f"http://{host_of[owners[20]][1]}/{i}", host=host_of[owners[20]][1], depth=1))
        store.finish(None, [], routed=d.take_routed())
        await trio.sleep(0.001)
        assert [(p, len(b.urls)) for _, p, b in batches(links)[12:]] == [(owners[20], 3)]
        await trio.sleep(0.2)  # the tick at 0.4: the next 12 of the first 30 (owners[20] with its 4th link)
        assert [p for _, p, _ in batches(links)[13:]] == owners[12:24]
        assert all(t - start == pytest.approx(0.4) for t, _, _ in batches(links)[13:])
        await trio.sleep(0.2)  # the tick at 0.6: the last 6 of the first 30, then the later 3
        assert [p for _, p, _ in batches(links)[25:]] == owners[24:33]
        assert sorted(e.url for _, _, b in batches(links) for e in b.urls) == sorted(
            [f"http://{host_of[o][0]}/" for o in owners[:33]] + [f"http://{host_of[owners[20]][1]}/{i}" for i in range(3)])
        nursery.cancel_scope.cancel()


async def test_a_leaving_node_sends_every_partial_batch_at_once(store, autojump_clock):
    """Once draining (the node leaves), the sender sends every owner what waits for it at once and at each tick,
    not 12 a tick: the outbox empties and the node may go, however many owners it routed to."""
    ring = Ring({"a": 100, **{f"p{i:02d}": 100 for i in range(40)}}, points_per_weight=10)
    links = FakeLinks()
    d = Dispatcher("a", store, links, ring_of=lambda: (1, ring), config=DispatchConfig(batch_size=3, interval=0.2))
    owners = [f"p{i:02d}" for i in range(40)]
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        start = trio.current_time()
        for owner in owners:
            host = owned_hosts(ring, owner, 1)[0]
            d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        await trio.sleep(0.21)
        assert len(batches(links)) == 12  # the tick at 0.2: 12 of the 40
        d.drain()
        await trio.sleep(0.001)  # draining wakes the sender: the 28 others go at once
        assert [p for _, p, _ in batches(links)] == owners
        assert batches(links)[-1][0] - start == pytest.approx(0.21)
        nursery.cancel_scope.cancel()


async def test_a_restart_sends_what_was_sent_unacknowledged_and_what_was_never_sent(tmp_path, autojump_clock):
    """What the sender had taken (sent, never acknowledged) and what it had not taken yet are both sent by the
    next process, from the store."""
    hosts = owned_hosts(RING2, "b", 6)
    path = tmp_path / "a"
    with NodeStore.open(path, map_size=1 << 24) as store:
        links = FakeLinks()
        d = Dispatcher("a", store, links, ring_of=lambda: (1, RING2), config=DispatchConfig(interval=0.2))
        async with trio.open_nursery() as nursery:
            await nursery.start(d.run)
            for host in hosts[:3]:
                d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
            store.finish(None, [], routed=d.take_routed())  # as the crawler commits a page
            await trio.sleep(0.25)
            [(_t, _p, first)] = batches(links)
            assert sorted(e.url for e in first.urls) == sorted(f"http://{h}/" for h in hosts[:3])
            for host in hosts[3:]:
                d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
            store.finish(None, [], routed=d.take_routed())
            nursery.cancel_scope.cancel()  # the process dies: no ack came
    with NodeStore.open(path, map_size=1 << 24) as store:
        links = FakeLinks()
        d = Dispatcher("a", store, links, ring_of=lambda: (1, RING2), config=DispatchConfig(interval=0.2))
        async with trio.open_nursery() as nursery:
            await nursery.start(d.run)
            await trio.sleep(0.25)
            sent = sorted(e.url for _t, _p, m in batches(links) for e in m.urls)
            assert sent == sorted(f"http://{h}/" for h in hosts)
            nursery.cancel_scope.cancel()


async def test_a_tick_reads_the_store_only_for_owners_with_work(store, autojump_clock):
    """A node that has sent to many owners looks in its outbox, at each tick, only for the owners with entries
    it has not batched or batches unacknowledged; entries another part stores (a hand-off's forwarded URLs,
    `store.accept`) still leave at the next tick."""
    ring = Ring({name: 100 for name in ["a", *(f"p{i}" for i in range(20))]})
    links = FakeLinks()
    d = Dispatcher("a", store, links, ring_of=lambda: (1, ring), config=DispatchConfig(interval=0.2, partials_per_interval=100))
    taken: Counter[str] = Counter()
    take = store.outbox.take

    def counted_take(owner: str, limit: int, *, after: int = 0):
        taken[owner] += 1
        return take(owner, limit, after=after)

    store.outbox.take = counted_take  # type: ignore[method-assign]
    peers = [f"p{i}" for i in range(20)]
    async with trio.open_nursery() as nursery:
        await nursery.start(d.run)
        for peer in peers:
            host = owned_hosts(ring, peer, 1)[0]
            d.route(QueuedUrl(url=f"http://{host}/", host=host, depth=1))
        await trio.sleep(0.3)
        sent = batches(links)
        assert sorted(p for _, p, _ in sent) == sorted(peers)
        for _, peer, batch in sent:
            await d.on_message(peer, BatchAck(seq=batch.seq, new=1, seen=0, forwarded=0, epoch=1))
        await trio.sleep(0.2)  # the tick after the acks finds every owner idle
        taken.clear()
        await trio.sleep(2.0)  # ten ticks with nothing to send: no owner is looked up
        assert taken == Counter()
        # a hand-off applied here forwards a URL of p7's host through the outbox, without the dispatcher
        host = owned_hosts(ring, "p7", 2)[1]
        store.accept([], [("p7", QueuedUrl(url=f"http://{host}/late", host=host, depth=1))])
        await trio.sleep(0.2)
        [(_, peer, late)] = batches(links)[len(sent):]
        assert peer == "p7" and [e.url for e in late.urls] == [f"http://{host}/late"]
        assert set(taken) == {"p7"}
        nursery.cancel_scope.cancel()
