"""The crawler's memory of URLs it answered for and routed (peer/crawl/admission.py `_seen`), under an ownership
that is not the lone node's: a link routed once is dropped on later pages before it is screened or routed
again; a link queued here is a seen hit without asking `owns`; and after `forget_seen` (what the cluster calls
at every new ring) both are screened against the new ownership again, so a URL routed to an owner that has
since gone goes to the new one.

The real `Crawler` and on-disk LMDB `NodeStore`; the ownership is a recording stand-in in the first tests. The
last three use the real `Cluster`: it calls `forget_seen` when, and only when, its ring changes; it gives the
crawler the URLs a peer's queued-URL replicas say that peer queued; and its dispatcher counts a peer's URL the
crawler answered for as seen without a look-up (tests/test_cluster_sim.py and
the daemon tests crawl through the whole of it).
"""

from __future__ import annotations

import random

from peer.cluster.core.cluster import Cluster
from peer.cluster.net.memtransport import MemoryNetwork
from peer.config import load
from peer.crawl.admission import Batch
from peer.crawl.crawler import Crawler
from peer.stats import Stats
from protocol import QueueReplica, UrlBatch, UrlEntry
from ring import Ring
from storage import NodeStore, NullPageStore, QueuedUrl


class Owners:
    """Owns the hosts in `mine`; records what it is asked and what is routed."""

    solo = False

    def __init__(self, mine: set[str]) -> None:
        self.mine = mine
        self.asked: list[str] = []
        self.routed: list[str] = []

    def owns(self, host: str) -> bool:
        self.asked.append(host)
        return host in self.mine

    def blocked(self, host: str) -> bool:
        return False

    def route(self, item: QueuedUrl) -> None:
        self.routed.append(item.url)

    def take_routed(self) -> list[tuple[str, QueuedUrl]]:
        return []

    def queued(self, items) -> None:
        pass

    def fetched(self, item: QueuedUrl) -> None:
        pass


class NoFetch:
    async def fetch(self, url, *, headers=(), sink=None, address=None):
        raise AssertionError("no fetch in this test")

    async def address(self, host: str) -> str:
        raise AssertionError("no fetch in this test")


def _page(crawler: Crawler, links: list[str]) -> None:
    """What a fetched page's links go through: screening, then one store transaction."""
    batch = Batch()
    crawler._screen_found(batch, links, 1, "http://here.test/")
    crawler._commit(batch)


async def test_routed_links_are_dropped_on_later_pages_and_screened_again_after_a_new_ring(tmp_path) -> None:
    cfg = load(env={}, flags={"node_id": "t", "data_dir": str(tmp_path), "allow_private": True})
    owners = Owners({"here.test"})
    with NodeStore.open(tmp_path / "store") as store:
        crawler = Crawler(cfg, fetcher=NoFetch(), store=store, pages=NullPageStore(), ownership=owners)
        links = ["http://here.test/a", "http://there.test/b", "http://there.test/c"]
        _page(crawler, links)
        assert owners.routed == ["http://there.test/b", "http://there.test/c"]
        assert crawler.stats.urls_new == 1 and len(store.frontier) == 1
        owners.asked.clear()
        for _ in range(3):  # the same links on three more pages: nothing routed, screened or asked again
            _page(crawler, links)
        assert owners.routed == ["http://there.test/b", "http://there.test/c"]
        assert owners.asked == []
        assert crawler.stats.routed_repeats == 6 and crawler.stats.urls_seen == 3
        assert crawler.stats.as_dict()["routed_repeats"] == 6
        # a new ring: there.test is ours now, here.test another node's
        owners.mine = {"there.test"}
        crawler.forget_seen()
        _page(crawler, links)
        assert owners.routed == ["http://there.test/b", "http://there.test/c", "http://here.test/a"]
        assert {i.url for i in store.frontier.scan_queued()} == set(links)
        assert crawler.stats.urls_new == 3


async def test_a_lone_node_keeps_its_memory_of_answered_urls(tmp_path) -> None:
    cfg = load(env={}, flags={"node_id": "t", "data_dir": str(tmp_path), "allow_private": True})
    with NodeStore.open(tmp_path / "store") as store:
        crawler = Crawler(cfg, fetcher=NoFetch(), store=store, pages=NullPageStore())
        _page(crawler, ["http://a.test/1", "http://b.test/2"])
        _page(crawler, ["http://a.test/1", "http://b.test/2", "http://b.test/3"])
        assert crawler.stats.urls_new == 3 and crawler.stats.urls_seen == 2 and crawler.stats.routed_repeats == 0


async def test_urls_queued_at_their_owner_are_dropped_like_routed_repeats_until_a_new_ring(tmp_path) -> None:
    cfg = load(env={}, flags={"node_id": "t", "data_dir": str(tmp_path), "allow_private": True})
    owners = Owners({"here.test"})
    with NodeStore.open(tmp_path / "store") as store:
        crawler = Crawler(cfg, fetcher=NoFetch(), store=store, pages=NullPageStore(), ownership=owners)
        # the owner of there.test queued /b (its replica came here); /c it did not say
        assert crawler.known_elsewhere(["http://there.test/b"]) == 1
        assert crawler.known_elsewhere(["http://there.test/b"]) == 0  # already known
        _page(crawler, ["http://here.test/a", "http://there.test/b", "http://there.test/c"])
        assert owners.routed == ["http://there.test/c"]
        assert crawler.stats.routed_repeats == 1 and crawler.stats.urls_new == 1
        # a URL answered here stays a seen hit: what an owner's replica says does not overwrite it
        crawler.known_elsewhere(["http://here.test/a"])
        _page(crawler, ["http://here.test/a"])
        assert crawler.stats.urls_seen == 1 and crawler.stats.routed_repeats == 1
        crawler.forget_seen()  # a new ring: the owner of there.test may be another node now
        _page(crawler, ["http://there.test/b"])
        assert owners.routed == ["http://there.test/c", "http://there.test/b"]


class Links:
    """The peer links' seam: what is sent is recorded."""

    def __init__(self, sent: list[tuple[str, object]]) -> None:
        self.sent = sent

    def send_nowait(self, peer_id: str, message: object) -> bool:
        self.sent.append((peer_id, message))
        return True

    def get(self, peer_id: str) -> None:
        return None


class Forgetful:
    """A crawler stand-in that counts `forget_seen` calls."""

    def __init__(self) -> None:
        self.forgotten = 0

    def forget_seen(self) -> None:
        self.forgotten += 1

    def answered(self, url: str) -> bool:
        return False


async def test_the_cluster_clears_the_crawlers_memory_when_its_ring_changes_and_only_then(tmp_path) -> None:
    """`Cluster._set_ring` runs at every view change; the crawler's memory goes only when the owners may have
    changed (another ring), not when a view change keeps the ring (a suspicion, a new incarnation)."""
    cfg = load(env={}, flags={"node_id": "a", "data_dir": str(tmp_path)})
    with NodeStore.open(tmp_path / "store") as store:
        net = MemoryNetwork(random.Random(1))
        cluster = Cluster(cfg, node_id="a", store=store, secret=b"s" * 32, stats=Stats(),
                          transport=net.transport("10.0.0.1:7000"), points_per_weight=20)
        crawler = Forgetful()
        cluster.attach(crawler)  # type: ignore[arg-type]
        two = Ring({"a": 100, "b": 100}, points_per_weight=20)
        cluster._set_ring(two)
        assert crawler.forgotten == 1
        cluster._set_ring(two)  # a view change with the same ring
        cluster._set_ring(Ring({"a": 100, "b": 100}, points_per_weight=20))  # the same ring, built again
        assert crawler.forgotten == 1
        cluster._set_ring(Ring({"a": 100, "b": 100, "c": 100}, points_per_weight=20))  # c joined
        assert crawler.forgotten == 2


def _node_a_of_two(tmp_path, store: NodeStore) -> tuple[Cluster, Crawler, Ring, list[tuple[str, object]]]:
    """Node a of a ring {a, b} (one replica) with its real crawler; what its dispatcher and replicas send is
    recorded (the network's seam), not sent."""
    cfg = load(env={}, flags={"node_id": "a", "data_dir": str(tmp_path), "allow_private": True, "replicas": 1})
    net = MemoryNetwork(random.Random(1))
    cluster = Cluster(cfg, node_id="a", store=store, secret=b"s" * 32, stats=Stats(),
                      transport=net.transport("10.0.0.1:7000"), points_per_weight=20)
    crawler = Crawler(cfg, fetcher=NoFetch(), store=store, pages=NullPageStore(), ownership=cluster)
    cluster.attach(crawler)
    sent: list[tuple[str, object]] = []
    cluster.backups.links = cluster.dispatcher.links = Links(sent)
    ring = Ring({"a": 100, "b": 100}, points_per_weight=20)
    cluster._set_ring(ring)
    return cluster, crawler, ring, sent


async def test_the_cluster_tells_the_crawler_what_a_peers_replicas_say_it_queued_for_its_own_hosts_only(tmp_path) -> None:
    """A `QueueReplica` held here names URLs its sender queued. Those of hosts the sender owns under this node's
    ring, sent under this node's view, are not routed to it again when found; the others (hosts this node owns,
    a message of another view) change nothing."""
    with NodeStore.open(tmp_path / "store") as store:
        cluster, crawler, ring, acks = _node_a_of_two(tmp_path, store)
        hosts = [f"h{i}.test" for i in range(40)]
        theirs = [h for h in hosts if ring.owner(h) == "b"][:3]
        mine = [h for h in hosts if ring.owner(h) == "a"][:1]
        assert len(theirs) == 3 and mine

        def replica(seq: int, epoch: int, urls: list[str]) -> QueueReplica:
            return QueueReplica(seq=seq, epoch=epoch, released=(), hosts=(),
                                urls=tuple(UrlEntry(url=u, depth=1, found_on=None, hops=0) for u in urls))

        epoch = cluster.epoch
        held = [f"http://{theirs[0]}/p", f"http://{mine[0]}/p"]
        assert cluster.backups.on_message("b", replica(1, epoch, held))
        assert cluster.backups.on_message("b", replica(2, epoch + 1, [f"http://{theirs[1]}/p"]))  # another view
        assert [peer for peer, _ack in acks] == ["b", "b"]  # both held and acknowledged
        assert cluster.urls_known_elsewhere == 1
        assert cluster.status()["dispatch"]["urls_known_elsewhere"] == 1
        found = [f"http://{theirs[0]}/p", f"http://{theirs[1]}/p", f"http://{theirs[2]}/p"]
        _page(crawler, found + [f"http://{mine[0]}/p"])
        assert crawler.stats.routed_repeats == 1
        assert cluster.dispatcher.stats.urls_routed == 2  # theirs[1] and theirs[2]: routed as before
        assert {i.url for i in store.frontier.scan_queued()} == {f"http://{mine[0]}/p"}


async def test_a_peers_batch_is_seen_without_a_look_up_for_the_urls_the_crawler_answered_for(tmp_path) -> None:
    """The dispatcher asks the crawler's memory first (`Crawler.answered`): a URL it answered for is counted seen
    without reaching the store; the rest go through the store as before, and after a new ring (`forget_seen`)
    everything does."""
    with NodeStore.open(tmp_path / "store") as store:
        cluster, crawler, ring, _acks = _node_a_of_two(tmp_path, store)
        mine = [h for h in (f"h{i}.test" for i in range(40)) if ring.owner(h) == "a"][:2]
        known, fresh = f"http://{mine[0]}/known", f"http://{mine[1]}/fresh"
        _page(crawler, [known])  # found here first: queued, and answered for in the memory
        assert crawler.answered(known) and not crawler.answered(fresh)
        looked_up: list[list[str]] = []
        accept = store.accept

        def recording_accept(owned, forward, **kw):
            looked_up.append([i.url for i in owned])
            return accept(owned, forward, **kw)

        store.accept = recording_accept  # type: ignore[method-assign]

        def batch(seq: int) -> UrlBatch:
            return UrlBatch(seq=seq, sender="b", epoch=cluster.epoch,
                            urls=tuple(UrlEntry(url=u, depth=2, found_on=None, hops=0) for u in (known, fresh)))

        cluster.dispatcher._receive("b", batch(1))
        assert looked_up == [[fresh]]
        stats = cluster.dispatcher.stats
        assert (stats.urls_new, stats.urls_seen) == (1, 1)
        assert {i.url for i in store.frontier.scan_queued()} == {known, fresh}
        crawler.forget_seen()  # a new ring: the memory is not trusted, the store answers for both
        cluster.dispatcher._receive("b", batch(2))
        assert looked_up[1] == [known, fresh]
        assert (stats.urls_new, stats.urls_seen) == (1, 3)
