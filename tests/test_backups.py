"""Queued-URL replicas (peer/cluster/replicas/queuereplicas.py, storage/_replicas.py): what the owner sends its backups and when a
batch may be acknowledged; what a backup holds, releases and promotes.

Real LMDB stores, a recording stand-in for the peer links, rings of the design's weights, under MockClock. The
whole-cluster effect (a node dead for good loses no URL) is checked by tests/test_replicas_sim.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing

from peer.cluster.replicas.queuereplicas import FOLD_AGE, FOLD_ENTRIES, FULL, QueueAlone, QueueReplicas
from protocol import TYPE_CODES, Limits, QueueReplica, ReplicaAck, RevisitEntry, UrlEntry, encode_body
from protocol import HostState as WireHostState
from ring import Ring, Zones, host_position
from storage import HostState, NodeStore, QueuedUrl, RevisitRecord, queued_url_keys

WEIGHTS = {"A": 150, "B": 80, "C": 200}


class Links:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def send_nowait(self, peer_id: str, message: object) -> bool:
        self.sent.append((peer_id, message))
        return True

    def replicas_to(self, peer: str) -> list[QueueReplica]:
        return [m for p, m in self.sent if p == peer and isinstance(m, QueueReplica)]


def _items(ring: Ring, owner: str, count: int, start: int = 0) -> list[QueuedUrl]:
    items, i = [], start
    while len(items) < count:
        host = f"h{i}.test"
        i += 1
        if ring.owner(host) == owner:
            items.append(QueuedUrl(url=f"http://{host}/p{i}", host=host, depth=1, hops=0, found_on=None))
    return items


def _backed_by(ring: Ring, node: str, items: list[QueuedUrl]) -> tuple[list[QueuedUrl], list[QueuedUrl]]:
    """`items` split into those whose position `node` backs under `ring`, and the others."""
    backed = [i for i in items if node in ring.holders_at(host_position(i.host), 1)]
    return backed, [i for i in items if i not in backed]


def _entries(items: list[QueuedUrl]) -> tuple[UrlEntry, ...]:
    """`items` as a `QueueReplica` carries them."""
    return tuple(UrlEntry(url=i.url, depth=i.depth, found_on=i.found_on, hops=i.hops) for i in items)


@pytest.fixture
def stores(tmp_path: Path):
    opened = {name: NodeStore.open(tmp_path / name) for name in WEIGHTS}
    yield opened
    for s in opened.values():
        s.close()


def test_a_backup_holds_releases_and_promotes_with_the_owners_host_states(stores) -> None:
    ring = Ring(WEIGHTS, points_per_weight=20)
    held = stores["B"]
    items = _items(ring, "A", 50)
    keys = queued_url_keys(items)
    state = HostState(host=items[0].host, next_allowed=1000.0, crawl_delay=7.0, failures=1)
    held.hold_replicas(list(zip(keys, items)), [], [state])
    assert len(held.replicas) == 50
    held.hold_replicas([], keys[:10])  # the owner fetched ten of them
    assert len(held.replicas) == 40
    assert all(key in held.dedup for key in keys[:10])  # done: never queued again here
    new, states = held.promote(lambda position: True)
    assert {i.url for i in new} == {i.url for i in items[10:]}
    assert len(held.frontier) == 40 and len(held.replicas) == 0
    assert states and states[0].crawl_delay == 7.0 and held.frontier.get_state(state.host).next_allowed == 1000.0


def test_promotion_takes_only_the_inherited_positions(stores) -> None:
    ring = Ring(WEIGHTS, points_per_weight=20)
    held = stores["B"]
    items = _items(ring, "A", 40)
    held.hold_replicas(list(zip(queued_url_keys(items), items)), [])
    half = sorted(host_position(i.host) for i in items)[20]
    new, _ = held.promote(lambda position: position < half)
    assert {i.url for i in new} == {i.url for i in items if host_position(i.host) < half}
    assert len(held.replicas) == 40 - len(new)


def test_the_journal_folds_in_order_as_one(stores) -> None:
    """A backup journals each message and folds the journal as one, in the order the messages came: a URL added
    and released within it is not held (only marked seen), one released and added again is held, a host's states
    merge (the later ready time, the newest Crawl-delay)."""
    ring = Ring(WEIGHTS, points_per_weight=20)
    held = stores["B"]
    items = _items(ring, "A", 6)
    keys = queued_url_keys(items)
    pairs = list(zip(keys, items))
    host = items[0].host
    held.hold_replicas(pairs[:4], [], [HostState(host=host, next_allowed=500.0, crawl_delay=3.0, failures=0)])
    held.hold_replicas(pairs[4:], keys[:2], [HostState(host=host, next_allowed=400.0, crawl_delay=5.0, failures=2)])
    held.hold_replicas([pairs[1]], keys[5:], [])  # the second released, then queued again; the sixth released
    assert held.replicas.folded() == 0 and held.replicas.journaled == (4 + 1) + (2 + 2 + 1) + (1 + 1)
    assert not any(key in held.dedup for key in keys)  # journaled only
    folds_before = held.replicas.folds
    assert set(held.replicas.keys()) == {keys[1], keys[2], keys[3], keys[4]}  # a read folds first
    assert held.replicas.folds == folds_before + 1 and held.replicas.journaled == 0
    assert all(key in held.dedup for key in (keys[0], keys[1], keys[5]))  # every release marks its key seen
    assert keys[2] not in held.dedup
    _items_held, states = held.replicas.where(lambda position: True)
    assert [(s.host, s.next_allowed, s.crawl_delay, s.failures) for s in states] == [(host, 500.0, 5.0, 2)]
    # a later message merges with what the table holds: the later ready time still wins
    held.hold_replicas([], [], [HostState(host=host, next_allowed=450.0, crawl_delay=1.0, failures=0)], fold=True)
    assert held.replicas.journaled == 0
    _items_held, states = held.replicas.where(lambda position: True)
    assert [(s.next_allowed, s.crawl_delay) for s in states] == [(500.0, 1.0)]


def test_a_journal_left_by_a_killed_node_is_folded_when_its_store_opens(tmp_path) -> None:
    ring = Ring(WEIGHTS, points_per_weight=20)
    items = _items(ring, "A", 5)
    keys = queued_url_keys(items)
    store = NodeStore.open(tmp_path / "b")
    store.hold_replicas(list(zip(keys, items)), [])
    store.hold_replicas([], keys[:2])
    store.sync()
    store.close()  # as after kill -9: the journal is committed, never folded
    again = NodeStore.open(tmp_path / "b")
    try:
        assert again.replicas.journaled == 0 and again.replicas.folded() == 3
        assert keys[0] in again.dedup and keys[4] not in again.dedup
        again.hold_replicas([], keys[2:3])  # the journal goes on after what was there
        new, _states = again.promote(lambda position: True)
        assert {i.url for i in new} == {i.url for i in items[3:]}
    finally:
        again.close()


async def test_a_backup_folds_its_journal_after_fold_entries_or_fold_age(stores, autojump_clock) -> None:
    ring = Ring(WEIGHTS, points_per_weight=20)
    backup = QueueReplicas("B", stores["B"], Links(), ring_of=lambda: (1, ring), copies=1, wall_clock=lambda: 0.0)
    journal = stores["B"].replicas
    items = _items(ring, "A", 40)
    entries = tuple(UrlEntry(url=i.url, depth=i.depth, found_on=None, hops=0) for i in items)
    backup.on_message("A", QueueReplica(seq=1, epoch=1, urls=entries[:20], released=()))
    await trio.sleep(FOLD_AGE / 2)
    backup.on_message("A", QueueReplica(seq=2, epoch=1, urls=entries[20:30], released=()))
    assert journal.journaled == 30 and journal.folds == 0 and backup.status()["journaled"] == 30
    await trio.sleep(FOLD_AGE / 2)
    backup.on_message("A", QueueReplica(seq=3, epoch=1, urls=entries[30:], released=()))  # the oldest is FOLD_AGE old
    assert journal.journaled == 0 and journal.folds == 1 and backup.status()["held"] == 40
    many = _items(ring, "A", FOLD_ENTRIES, start=1000)
    for n in range(0, len(many), 1000):
        assert journal.folds == 1 and journal.journaled == n  # below FOLD_ENTRIES (and FOLD_AGE): journaled
        batch = tuple(UrlEntry(url=i.url, depth=1, found_on=None, hops=0) for i in many[n:n + 1000])
        backup.on_message("A", QueueReplica(seq=4 + n, epoch=1, urls=batch, released=()))
    # the message that brought FOLD_ENTRIES folded them, itself included
    assert journal.folds == 2 and journal.journaled == 0
    assert len(journal) == 40 + len(many)


async def test_while_views_change_a_backup_applies_each_message_at_once(stores, autojump_clock) -> None:
    """A message sent under another view than the backup's, or one that comes within FOLD_AGE of the backup's ring
    change, is folded at once: the arc it names may be moving to this node, whose crawler reads those seen keys."""
    ring = Ring(WEIGHTS, points_per_weight=20)
    view = [1]
    backup = QueueReplicas("B", stores["B"], Links(), ring_of=lambda: (view[0], ring), copies=1,
                           wall_clock=lambda: 0.0)
    journal = stores["B"].replicas
    keys = queued_url_keys(_items(ring, "A", 3))
    backup.on_message("A", QueueReplica(seq=1, epoch=1, urls=(), released=keys[:1]))
    assert journal.journaled == 1 and keys[0] not in stores["B"].dedup  # same view: journaled
    backup.on_message("A", QueueReplica(seq=2, epoch=2, urls=(), released=keys[1:2]))  # the sender's view is newer
    assert journal.journaled == 0 and keys[0] in stores["B"].dedup and keys[1] in stores["B"].dedup
    view[0] = 2
    backup.ring_changed(ring)
    await trio.sleep(FOLD_AGE / 2)
    backup.on_message("A", QueueReplica(seq=3, epoch=2, urls=(), released=keys[2:]))  # soon after our change
    assert journal.journaled == 0 and keys[2] in stores["B"].dedup
    await trio.sleep(FOLD_AGE / 2)
    backup.on_message("A", QueueReplica(seq=4, epoch=2, urls=(), released=keys[:1]))  # settled: journaled again
    assert journal.journaled == 1


def _node(name: str, stores, links: Links, ring: Ring, copies: int = 1) -> QueueReplicas:
    return QueueReplicas(name, stores[name], links, ring_of=lambda: (1, ring), copies=copies, wall_clock=lambda: 0.0)


async def test_a_ticket_is_done_only_once_every_backup_acknowledged_and_releases_follow_adds(stores) -> None:
    ring = Ring(WEIGHTS, points_per_weight=20)
    links = Links()
    owner = _node("A", stores, links, ring, copies=2)
    items = _items(ring, "A", 30)
    ticket = owner.replicate(items)
    assert ticket is not None and not owner.done(ticket)
    owner.pump(trio.current_time())
    backups = {b for b in ticket.targets}
    assert backups == {"B", "C"}
    acked: list[str] = []
    owner.then(ticket, lambda: acked.append("done"))
    first = {peer: owner_msgs[-1] for peer in backups for owner_msgs in [links.replicas_to(peer)]}
    owner.released(items[0])  # fetched, routed nothing: its release queues behind the add
    owner.pump(trio.current_time())
    assert all(len(links.replicas_to(p)) == 1 for p in backups), "a second message went before the first's ack"
    owner.on_message("B", ReplicaAck(seq=first["B"].seq))
    assert not acked and not owner.done(ticket)
    owner.on_message("C", ReplicaAck(seq=first["C"].seq))
    assert acked == ["done"] and owner.done(ticket)
    owner.pump(trio.current_time())
    second = links.replicas_to("B")[-1]
    assert second.released == tuple(queued_url_keys(items[:1])) and not second.urls


async def test_a_release_waits_for_the_links_its_page_routed(stores) -> None:
    ring = Ring(WEIGHTS, points_per_weight=20)
    links = Links()
    store = stores["A"]
    owner = _node("A", stores, links, ring)
    page = _items(ring, "A", 1)[0]
    routed = _items(ring, "C", 1)[0]
    store.outbox.put([("C", routed)])  # the page's link for C, unacknowledged
    owner.released(page, ["C"])
    owner.pump(trio.current_time())
    assert owner.unreleased() == {page.url}
    assert not any(m.released for _p, m in links.sent if isinstance(m, QueueReplica))
    seq = store.outbox.take("C", 10)[0][0]
    store.outbox.ack("C", [seq])
    owner.pump(trio.current_time())
    assert any(m.released == tuple(queued_url_keys([page])) for _p, m in links.sent if isinstance(m, QueueReplica))


async def test_a_release_waits_for_its_links_after_a_view_change_moved_them_to_another_owner(stores) -> None:
    """The owner of a page's link dies before acknowledging it: a view change re-keys the outbox entry to the
    heir, under a new sequence number. The old owner's queue is empty then, and the release counted the link as
    acknowledged: the page was released while its link lived only in this node's outbox, and a death a second
    later lost it (the replica simulation, seed 27). Now the release waits for the heir's ack too."""
    ring = Ring(WEIGHTS, points_per_weight=20)
    links = Links()
    store = stores["A"]
    owner = _node("A", stores, links, ring)
    without_c = Ring({k: v for k, v in WEIGHTS.items() if k != "C"}, points_per_weight=20)
    page = _items(ring, "A", 1)[0]
    routed = next(i for i in _items(ring, "C", 20) if without_c.owner(i.host) == "B")
    store.outbox.put([("C", routed)])  # the page's link for C, unacknowledged
    owner.released(page, ["C"])
    moved, mine = store.reroute(without_c.owner, "A")  # C is dead: its entries go to their new owners
    assert (moved, mine) == ({"B": 1}, [])
    heir = "B"
    owner.rerouted(moved, None)
    owner.pump(trio.current_time())
    owner._stage_releases(force=True)
    released = lambda: any(m.released == tuple(queued_url_keys([page]))  # noqa: E731
                           for _p, m in links.sent if isinstance(m, QueueReplica))
    assert owner.unreleased() == {page.url} and not released()
    seq = store.outbox.take(heir, 10)[0][0]
    store.outbox.ack(heir, [seq])
    owner.pump(trio.current_time())
    assert released()


async def test_a_held_release_goes_once_its_links_backup_has_left_and_come_back(stores) -> None:
    # Found by counting replicas in flight as "not idle" in the 5 s partition simulation: a page's release waited
    # for a routed link's owner (on the other side) while the replicas of the links it queued here were already
    # acknowledged by backup B. The partition took B out of the ring and the heal brought it back with its counts
    # started again from 0: the ticket, which still wanted B's old count, was never done, and the release (and
    # the node's idleness) waited forever. A backup that left and came back now counts as having left.
    ring = Ring(WEIGHTS, points_per_weight=20)
    current = [ring]
    links = Links()
    store = stores["A"]
    owner = QueueReplicas("A", store, links, ring_of=lambda: (1, current[0]), copies=1, wall_clock=lambda: 0.0)
    queued = [i for i in _items(ring, "A", 200) if ring.backups_at(host_position(i.host), 1) == ("B",)][:20]
    ticket = owner.replicate(queued)  # the page's links, queued here: their replicas go to B
    owner.pump(trio.current_time())
    owner.on_message("B", ReplicaAck(seq=links.replicas_to("B")[-1].seq))
    assert ticket is not None and owner.done(ticket)
    page = queued[0]
    routed = _items(ring, "C", 1)[0]
    store.outbox.put([("C", routed)])  # and a link for C, unacknowledged: the release is held for it
    owner.released(page, ["C"], ticket)
    assert owner.unreleased() == {page.url}
    without_b = Ring({"A": 150, "C": 200}, points_per_weight=20)
    for step in (without_b, ring):  # B declared dead, then back after the heal
        current[0] = step
        owner.ring_changed(step)
    owner.replicate(_items(ring, "A", 5, start=10_000))  # B's new state counts again from 0
    seq = store.outbox.take("C", 10)[0][0]
    store.outbox.ack("C", [seq])
    owner.pump(trio.current_time())
    assert owner.done(ticket)
    for _ in range(3):  # B acknowledges what it gets; the release follows the adds staged before it
        owner.on_message("B", ReplicaAck(seq=links.replicas_to("B")[-1].seq))
        owner.pump(trio.current_time())
    key = queued_url_keys([page])[0]
    assert any(key in m.released for m in links.replicas_to("B")) and page.url not in owner.unreleased()


async def test_a_backup_acks_once_committed_without_a_sync_and_drops_malformed_entries(stores) -> None:
    links = Links()
    backup = QueueReplicas("B", stores["B"], links, ring_of=lambda: (1, None), copies=1, wall_clock=lambda: 100.0)
    message = QueueReplica(
        seq=7, epoch=1, released=(b"short",),
        urls=(UrlEntry(url="http://ok.test/a", depth=1, found_on=None, hops=0),
              UrlEntry(url="not a url", depth=1, found_on=None, hops=0)),
        hosts=(WireHostState(host="ok.test", crawl_delay=2.0, ready_in=5.0, failures=0),
               WireHostState(host="x" * 300, crawl_delay=2.0, ready_in=5.0, failures=0)))
    assert backup.on_message("A", message)
    assert links.sent == [("A", ReplicaAck(seq=7))]
    assert len(stores["B"].replicas) == 1 and backup.refused == 3
    syncs = stores["B"].syncs
    assert backup.on_message("A", replace(message, seq=8))
    assert links.sent[-1] == ("A", ReplicaAck(seq=8))
    assert stores["B"].syncs == syncs  # acked once committed: the node's sync service forces it later
    _new, states = stores["B"].promote(lambda position: True)
    assert [s.next_allowed for s in states] == [105.0]


async def test_rehoming_sends_each_queued_url_to_its_new_backup_and_restores(stores) -> None:
    ring = Ring(WEIGHTS, points_per_weight=20)
    links = Links()
    store = stores["A"]
    items = _items(ring, "A", 40)
    store.admit(items)
    owner = _node("A", stores, links, ring)
    assert await owner.rehome(ring) == 40  # after a start: every queued URL to its backup
    assert not owner.restored()
    for _ in range(5):
        owner.pump(trio.current_time())
        for peer, message in list(links.sent):
            if isinstance(message, QueueReplica):
                owner.on_message(peer, ReplicaAck(seq=message.seq))
    assert owner.restored()
    sent = {u.url for _p, m in links.sent if isinstance(m, QueueReplica) for u in m.urls}
    assert sent == {i.url for i in items}
    grown = Ring({**WEIGHTS, "D": 300}, points_per_weight=20)
    owner.ring_of = lambda: (2, grown)
    owner.ring_changed(grown)
    moved = await owner.rehome(grown)
    expect = sum(1 for i in items if grown.owner(i.host) == "A"
                 and grown.backups_at(host_position(i.host), 1) != ring.backups_at(host_position(i.host), 1))
    assert moved == expect


async def test_rehoming_sends_a_page_whose_release_is_held_to_its_new_backup(stores) -> None:
    """A page fetched here waits for its routed link to be acknowledged; its replica at the backup is what brings
    the link back if this node dies. The backup dies (and the link's owner with it): the new backup must get the
    page's replica too, or this node's death before the link is acknowledged loses it (the search: 1 page)."""
    ring = Ring(WEIGHTS, points_per_weight=20)
    without_b = Ring({k: v for k, v in WEIGHTS.items() if k != "B"}, points_per_weight=20)
    links = Links()
    store = stores["A"]
    owner = _node("A", stores, links, ring)
    page = next(i for i in _items(ring, "A", 200)
                if ring.backups_at(host_position(i.host), 1) == ("B",) and without_b.owner(i.host) == "A")
    routed = _items(ring, "C", 1)[0]
    store.outbox.put([("C", routed)])  # the page's link, unacknowledged
    owner.released(page, ["C"])
    await owner.rehome(ring)
    owner.ring_of = lambda: (2, without_b)
    owner.ring_changed(without_b)
    links.sent.clear()
    assert await owner.rehome(without_b) == 1
    owner.pump(trio.current_time())
    new_backup = without_b.backups_at(host_position(page.host), 1)[0]
    assert [u.url for m in links.replicas_to(new_backup) for u in m.urls] == [page.url]
    assert owner.unreleased() == {page.url}


def test_promotion_keeps_the_budget_counts_of_a_host_known_here(stores) -> None:
    """A host's page and byte counts (its budgets) survive the merge of a dead owner's state into ours."""
    ring = Ring(WEIGHTS, points_per_weight=20)
    held = stores["B"]
    items = _items(ring, "A", 5)
    host = items[0].host
    held.frontier.put_state(HostState(host=host, next_allowed=10.0, crawl_delay=1.0, pages=5, bytes=5_000))
    dead_owners = HostState(host=host, next_allowed=20.0, crawl_delay=3.0, failures=2)
    held.hold_replicas(list(zip(queued_url_keys(items), items)), [], [dead_owners])
    _new, states = held.promote(lambda position: True)
    merged = held.frontier.get_state(host)
    assert (merged.next_allowed, merged.crawl_delay, merged.failures) == (20.0, 3.0, 2)
    assert (merged.pages, merged.bytes) == (5, 5_000)
    assert any(s.host == host and s.bytes == 5_000 for s in states)


async def test_held_releases_are_looked_at_again_only_after_an_ack_or_the_timer(stores) -> None:
    """A release held for its page's routed links is staged at the first pump after the outbox ack, not
    before; pumps in between (one per page in a crawl) do not scan the held list; a release whose links' replica
    ticket completes is staged once that ack arrives."""
    ring = Ring(WEIGHTS, points_per_weight=20)
    links = Links()
    store = stores["A"]
    owner = _node("A", stores, links, ring)
    pages = _items(ring, "A", 3)
    routed = _items(ring, "C", 1)[0]
    store.outbox.put([("C", routed)])
    owner.released(pages[0], ["C"])
    scans = 0
    original = store.outbox.oldest_seq

    def counting(owner_id: str) -> int | None:
        nonlocal scans
        scans += 1
        return original(owner_id)

    store.outbox.oldest_seq = counting  # type: ignore[method-assign]
    owner.pump(trio.current_time())
    assert scans == 1 and owner.unreleased() == {pages[0].url}
    for _ in range(5):  # nothing was acknowledged meanwhile: the held list is not scanned again
        owner.pump(trio.current_time())
    assert scans == 1
    seq = store.outbox.take("C", 10)[0][0]
    store.outbox.ack("C", [seq])
    owner.pump(trio.current_time())
    assert scans == 2
    released = [m for _p, m in links.sent if isinstance(m, QueueReplica) and m.released]
    assert [m.released for m in released] == [tuple(queued_url_keys(pages[:1]))]
    for peer, message in list(links.sent):
        owner.on_message(peer, ReplicaAck(seq=message.seq))
    assert owner.unreleased() == set()
    # a page whose local links' replicas are on their way: released at the replica ack that completes them
    ticket = owner.replicate(_items(ring, "A", 2, start=1000))
    owner.released(pages[1], (), ticket)
    owner.pump(trio.current_time())
    adds = [(p, m) for p, m in links.sent if isinstance(m, QueueReplica) and m.urls]
    assert adds and not any(pages[1].url in {e.url for e in m.urls} or m.released == tuple(queued_url_keys(pages[1:2]))
                            for _p, m in links.sent[len(released):] if isinstance(m, QueueReplica) and m.released)
    for peer, message in adds:
        owner.on_message(peer, ReplicaAck(seq=message.seq))
    assert ticket is not None and owner.done(ticket)
    owner.pump(trio.current_time())
    assert [m.released for _p, m in links.sent if isinstance(m, QueueReplica) and m.released][-1] == tuple(
        queued_url_keys(pages[1:2]))


async def test_the_send_loop_stages_a_release_within_an_interval_of_its_ack(stores, autojump_clock) -> None:
    """Under MockClock: the owner's loop, woken by nothing but its timer, sends a held release at the first
    tick after the outbox ack (within `interval`), not before the ack."""
    ring = Ring(WEIGHTS, points_per_weight=20)
    links = Links()
    store = stores["A"]
    owner = _node("A", stores, links, ring)
    page = _items(ring, "A", 1)[0]
    store.outbox.put([("C", _items(ring, "C", 1)[0])])

    def releases() -> list[QueueReplica]:
        return [m for _p, m in links.sent if isinstance(m, QueueReplica) and m.released]

    async with trio.open_nursery() as nursery:
        await nursery.start(owner.run)
        await trio.sleep(0.5)  # the first re-homing scan ran; nothing is queued
        owner.released(page, ["C"])
        await trio.sleep(0.35)
        assert releases() == []
        store.outbox.ack("C", [s for s, _ in store.outbox.take("C", 10)])
        acked_at = trio.current_time()
        while not releases():
            await trio.sleep(0.001)
        assert 0 < trio.current_time() - acked_at <= owner.interval + 0.001
        assert releases()[0].released == tuple(queued_url_keys([page]))
        nursery.cancel_scope.cancel()


def test_backups_are_remembered_per_host_for_the_current_ring_only(stores) -> None:
    ring = Ring(WEIGHTS, points_per_weight=20)
    current = [ring]
    owner = QueueReplicas("A", stores["A"], Links(), ring_of=lambda: (1, current[0]), copies=2)
    host = _items(ring, "A", 1)[0].host
    first = owner._backups_of(ring, host)
    assert first == tuple(b for b in ring.backups_at(host_position(host), 2) if b != "A")
    assert owner._backups_of(ring, host) is first  # remembered
    smaller = Ring({"A": 150, "B": 80}, points_per_weight=20)
    current[0] = smaller
    assert owner._backups_of(smaller, host) == ("B",)  # a new ring: looked up again, not the old answer
    assert owner._backups_of(ring, host) == first  # an older ring is answered, never remembered over the new one
    assert owner._backups_of(smaller, host) == ("B",)


async def test_the_send_loop_sends_a_backup_one_message_per_interval_and_full_ones_at_once(stores,
                                                                                          autojump_clock) -> None:
    """Under MockClock: URLs queued page by page within an interval go to their backup in one message at the
    loop's next tick (not one message per page as each is queued); an ack with more staged waits for that tick
    too, unless FULL entries wait, which go at once."""
    ring = Ring({"A": 100, "B": 100}, points_per_weight=20)
    links = Links()
    owner = QueueReplicas("A", stores["A"], links, ring_of=lambda: (1, ring), copies=1, wall_clock=lambda: 0.0)
    pages = _items(ring, "A", 10 + FULL)
    async with trio.open_nursery() as nursery:
        await nursery.start(owner.run)
        await trio.sleep(0.55)  # the first re-homing scan ran (nothing queued) and a tick passed
        start = trio.current_time()
        for item in pages[:5]:  # five pages' links, 10 ms apart
            owner.queued([item])
            await trio.sleep(0.01)
        await trio.sleep(0.1)
        [first] = links.replicas_to("B")
        assert [e.url for e in first.urls] == [i.url for i in pages[:5]]
        owner.queued(pages[5:10])  # staged behind the message in flight
        owner.on_message("B", ReplicaAck(seq=first.seq))
        assert len(links.replicas_to("B")) == 1  # the ack does not send them: the next tick does
        await trio.sleep(0.1)
        [_first, second] = links.replicas_to("B")
        assert [e.url for e in second.urls] == [i.url for i in pages[5:10]]
        owner.on_message("B", ReplicaAck(seq=second.seq))
        await trio.sleep(0.05)  # half-way to the next tick
        owner.queued(pages[10:])  # FULL entries: at once, without waiting for the tick
        await trio.sleep(0.001)
        assert len(links.replicas_to("B")) == 3 and len(links.replicas_to("B")[2].urls) == FULL
        assert trio.current_time() - start == pytest.approx(0.301)  # the next tick is at 0.35
        nursery.cancel_scope.cancel()


async def test_a_joiner_keeps_the_replicas_sent_under_a_newer_view_than_its_own_until_it_holds_that_view(
        stores, autojump_clock) -> None:
    """The cluster adopts a ring with a joiner in it and re-homes queued URLs to it before the joiner has built
    that ring itself. Under its own older ring (only itself) the joiner backs nothing, and a clean-up then would
    drop them all, acknowledged already: a death before the owners' next re-homing loses those URLs (14 pages in
    a five-daemon run). The clean-up waits for a view at least as new as the replicas' own."""
    full = Ring(WEIGHTS, points_per_weight=20)
    alone = Ring({"C": WEIGHTS["C"]}, points_per_weight=20)
    view = [(1, alone)]
    joiner = QueueReplicas("C", stores["C"], Links(), ring_of=lambda: view[0], copies=1, wall_clock=lambda: 0.0)
    items = _items(full, "A", 60)
    backed, elsewhere = _backed_by(full, "C", items)
    assert backed and elsewhere
    entries = _entries(items)
    async with trio.open_nursery() as nursery:
        await nursery.start(joiner.run)
        assert joiner.on_message("A", QueueReplica(seq=1, epoch=5, urls=entries, released=()))
        await trio.sleep(5.0)  # its own ring stable for far longer than GC_DELAY
        assert len(stores["C"].replicas) == len(items)
        view[0] = (5, full)
        await trio.sleep(2.0)
        # under the cluster's ring: what it backs is kept, the rest is no longer its to hold
        assert set(stores["C"].replicas.keys()) == set(queued_url_keys(backed))
        nursery.cancel_scope.cancel()


async def test_replicas_no_longer_backed_here_are_passed_on_to_their_owner_before_they_are_dropped(
        stores, autojump_clock) -> None:
    """A join makes another node the backup of some of A's positions. C's copies there may be the only second
    copies until A's re-homing reaches the new backup (a lost frame is re-sent 2 s later), and A may die before:
    C does not just drop them once the ring is stable, it first hands each to its owner (`pass_on`, the
    dispatcher's outbox), whose dedup store keeps what it does not know; what C still backs stays."""
    two = Ring({"A": WEIGHTS["A"], "C": WEIGHTS["C"]}, points_per_weight=20)
    full = Ring(WEIGHTS, points_per_weight=20)
    view = [(1, two)]
    passed: list[list[QueuedUrl]] = []

    class Passing(QueueAlone):  # the cluster's part of the delegate that this test looks at
        def pass_on(self, items: list[QueuedUrl]) -> None:
            passed.append(items)

    c = QueueReplicas("C", stores["C"], Links(), ring_of=lambda: view[0], copies=1, wall_clock=lambda: 0.0,
                      delegate=Passing())
    items = [i for i in _items(two, "A", 80) if full.owner(i.host) == "A"]
    backed, moved = _backed_by(full, "C", items)
    assert backed and moved
    entries = _entries(items)
    async with trio.open_nursery() as nursery:
        await nursery.start(c.run)
        assert c.on_message("A", QueueReplica(seq=1, epoch=1, urls=entries, released=()))
        await trio.sleep(3.0)
        assert passed == [] and len(stores["C"].replicas) == len(items)  # C backs them all
        view[0] = (2, full)
        await trio.sleep(3.0)
        assert sorted(i.url for batch in passed for i in batch) == sorted(i.url for i in moved)
        assert set(stores["C"].replicas.keys()) == set(queued_url_keys(backed))
        assert c.status()["urls_passed_on"] == len(moved)
        nursery.cancel_scope.cancel()


async def test_a_release_reaches_the_seen_key_backups_too_and_is_sent_again_until_acknowledged(
        stores, autojump_clock) -> None:
    """With one replica a page's queued URL is on one backup, but its seen key on two (the seen-key replicas):
    the release, which marks the page seen where it lands, goes to both and is re-sent until each acknowledges
    it. (The key used to go to the second by a best-effort message: one lost frame, and the heir of both deaths
    fetched the page again, beyond what was under way at the kill.)"""
    ring = Ring(WEIGHTS, points_per_weight=20)
    links = Links()
    owner = QueueReplicas("A", stores["A"], links, ring_of=lambda: (1, ring), copies=1, seen_copies=2,
                          wall_clock=lambda: 0.0)
    item = _items(ring, "A", 1)[0]
    first, second = ring.backups_at(host_position(item.host), 2)
    owner.replicate([item])
    owner.pump(trio.current_time())
    add = links.replicas_to(first)[-1]
    assert add.urls and links.replicas_to(second) == []  # the queued URL: one backup
    owner.on_message(first, ReplicaAck(seq=add.seq))
    owner.released(item)
    owner.pump(trio.current_time())
    key = queued_url_keys([item])[0]
    assert [m.released for m in (links.replicas_to(first)[-1], links.replicas_to(second)[-1])] == [(key,), (key,)]
    assert owner.unreleased() == {item.url}
    await trio.sleep(owner.resend_after + 0.01)  # the second's frame was lost: sent again
    owner.pump(trio.current_time())
    assert len(links.replicas_to(second)) == 2 and links.replicas_to(second)[-1].released == (key,)
    for peer in (first, second):
        owner.on_message(peer, ReplicaAck(seq=links.replicas_to(peer)[-1].seq))
    assert owner.unreleased() == set()


async def test_seen_marks_go_in_the_fifo_acknowledged_and_are_held_as_seen(stores, autojump_clock) -> None:
    """The seen-key replicas' keys (a ring change's re-sends, a backup a release did not reach) go to a backup
    as seen marks in its FIFO with `--replicas`: re-sent until acknowledged, marked seen where they land, never
    counted as unreleased URLs; a FIFO without room for them says so (they then go best effort)."""
    ring = Ring(WEIGHTS, points_per_weight=20)
    links = Links()
    owner = QueueReplicas("A", stores["A"], links, ring_of=lambda: (1, ring), copies=1, wall_clock=lambda: 0.0,
                          max_staged=10)
    keys = queued_url_keys(_items(ring, "A", 3))
    assert owner.mark_seen("B", keys) and not owner.mark_seen("B", queued_url_keys(_items(ring, "A", 4, 50)))
    owner.pump(trio.current_time())
    message = links.replicas_to("B")[-1]
    assert message.released == tuple(keys) and not message.urls and owner.unreleased() == set()
    await trio.sleep(owner.resend_after + 0.01)
    owner.pump(trio.current_time())
    assert len(links.replicas_to("B")) == 2  # not acknowledged: sent again
    backup = QueueReplicas("B", stores["B"], Links(), ring_of=lambda: (1, ring), copies=1, wall_clock=lambda: 0.0)
    assert backup.on_message("A", links.replicas_to("B")[-1])
    assert stores["B"].replicas.journaled == len(keys)  # journaled; folded at the latest when B inherits them
    assert stores["B"].promote(lambda position: True) == ([], [])
    assert all(key in stores["B"].dedup for key in keys)
    owner.on_message("B", ReplicaAck(seq=links.replicas_to("B")[-1].seq))
    assert owner.outstanding() == 0
    assert owner.mark_seen("D", keys)  # not in the ring: nothing to do
    assert "D" not in owner.status() and owner.outstanding() == 0


def _schedule(item: QueuedUrl, due: float) -> RevisitRecord:
    return RevisitRecord(url=item.url, host=item.host, depth=item.depth, due=due, interval=300.0, etag='"v1"',
                         last_modified="Sun, 29 Nov 2026 05:00:00 GMT", digest="SHA1DIGEST", stored_at=700.0,
                         size=1234, changed=1, unchanged=2)


async def test_a_release_carries_its_pages_revisit_schedule_and_the_heir_revisits_it(stores, autojump_clock) -> None:
    """With `--revisit`, a page's release takes its revisit schedule to the backups (the clocks are unrelated:
    it travels as a duration); the backup holds it, and when it inherits the page's host it revisits the page
    when it is due, with the owner's validators; a page whose URL was promoted queued has its revisit queued."""
    ring = Ring(WEIGHTS, points_per_weight=20)
    links = Links()
    owner = QueueReplicas("A", stores["A"], links, ring_of=lambda: (1, ring), copies=1, wall_clock=lambda: 1000.0)
    fetched, queued = _items(ring, "A", 2)
    stores["A"].revisits.put(_schedule(fetched, due=1300.0))
    # a validator longer than the wire takes goes as none (the whole message refused would stall the FIFO)
    stores["A"].revisits.put(replace(_schedule(queued, due=1300.0), etag='"' + "x" * 2000 + '"'))
    backup = ring.backups_at(host_position(fetched.host), 1)[0]
    owner.replicate([fetched, queued])  # both queued, then one fetched (and its schedule written)
    owner.released(fetched)
    owner.pump(trio.current_time())
    message = links.replicas_to(backup)[-1]
    assert [(r.url, r.due_in, r.etag, r.digest) for r in message.revisits] == [
        (fetched.url, 300.0, '"v1"', "SHA1DIGEST")]
    held = QueueReplicas(backup, stores[backup], Links(), ring_of=lambda: (1, ring), copies=1,
                         wall_clock=lambda: 5000.0)
    assert held.on_message("A", message)
    # the queued page's schedule comes with a seen mark (a ring change's re-send), the same way
    assert owner.mark_seen(backup, queued_url_keys([queued]))
    owner.on_message(backup, ReplicaAck(seq=message.seq))
    owner.pump(trio.current_time())
    mark = links.replicas_to(backup)[-1]
    assert [(r.url, r.etag, r.last_modified) for r in mark.revisits] == [
        (queued.url, None, "Sun, 29 Nov 2026 05:00:00 GMT")]
    assert encode_body(mark, "msgpack", Limits())[0] == TYPE_CODES[QueueReplica]  # it goes on the wire
    assert held.on_message("A", replace(mark, released=()))  # (held as a schedule, the URL still queued)
    assert held.status()["revisits_received"] == 2
    heir = stores[backup]
    promoted, _states = heir.promote(lambda position: True)
    assert {i.url for i in promoted} == {queued.url}
    assert heir.replicas.revisits_held() == 0 and heir.replicas.revisits_promoted == 2
    # recorded as fetched here: the heir's seen-key scan after this ring change sends them to its own backups
    assert set(queued_url_keys([fetched, queued])) <= set(heir.fetched_keys())
    mine = heir.revisits.get(fetched.host, fetched.url)
    assert mine is not None and (mine.due, mine.queued, mine.etag, mine.interval) == (5300.0, False, '"v1"', 300.0)
    still = heir.revisits.get(queued.host, queued.url)
    assert still is not None and still.queued  # its promoted queue entry is its revisit: not queued twice
    assert heir.queue_due(5299.9, 10, lambda host: True) == []
    assert [i.url for i in heir.queue_due(5300.0, 10, lambda host: True)] == [fetched.url]


async def test_a_backup_drops_the_schedules_of_positions_it_no_longer_holds(stores, autojump_clock) -> None:
    ring = Ring(WEIGHTS, points_per_weight=20)
    item = _items(ring, "A", 1)[0]
    backup = ring.backups_at(host_position(item.host), 1)[0]
    held = QueueReplicas(backup, stores[backup], Links(), ring_of=lambda: (1, ring), copies=1,
                         wall_clock=lambda: 0.0)
    entry = RevisitEntry(url=item.url, depth=1, due_in=60.0, queued=False, interval=60.0, etag=None,
                         last_modified=None, digest="", stored_at=0.0, size=0, changed=0, unchanged=0)
    held.on_message("A", QueueReplica(seq=1, epoch=1, urls=(), released=(), revisits=(entry,)))
    held.collect(ring)  # still a holder: kept
    assert stores[backup].replicas.revisits_held() == 1
    held.collect(Ring({node: w for node, w in WEIGHTS.items() if node != backup}, points_per_weight=20))
    assert stores[backup].replicas.revisits_held() == 0


class _CountedZones(Zones):
    """Zones that count their look-ups: what finding a position's backups costs."""

    calls = 0

    def zone(self, node: str) -> str:
        _CountedZones.calls += 1
        return super().zone(node)


async def test_rehoming_after_a_leave_finds_the_old_backups_with_the_old_rings_zones(tmp_path) -> None:
    """Every node in one zone, one leaves: the backups a URL had under the ring before are found with that ring's
    zones. With today's (the leaver gone from them) the leaver counted as another zone, and each position's
    backups cost a walk of the old ring to the leaver's nearest point: O(members) per queued URL at every leave."""
    weights = {f"n{i:02}": 1 + i % 3 for i in range(60)}
    weights["X"] = 1
    before = Ring(weights, points_per_weight=4)
    after = Ring({k: v for k, v in weights.items() if k != "X"}, points_per_weight=4)
    zones_before = _CountedZones(dict.fromkeys(weights, "rack-1"))
    zones_after = _CountedZones(dict.fromkeys(after.weights, "rack-1"))
    store = NodeStore.open(tmp_path / "n00")
    try:
        items = [i for i in _items(before, "n00", 60) if after.owner(i.host) == "n00"]
        store.admit(items)
        current = {"ring": before, "zones": zones_before}
        owner = QueueReplicas("n00", store, Links(), ring_of=lambda: (1, current["ring"]), copies=1,
                              wall_clock=lambda: 0.0, zones_of=lambda: current["zones"])
        assert await owner.rehome(before) == len(items)
        current.update(ring=after, zones=zones_after)
        owner.ring_changed(after)
        _CountedZones.calls = 0
        moved = await owner.rehome(after)
        assert moved == sum(1 for i in items if after.backups_at(host_position(i.host), 1)
                            != before.backups_at(host_position(i.host), 1))
        # two look-ups per position per ring (the owner's zone, its backup's): no walk round the ring
        assert _CountedZones.calls <= 4 * len(items)
    finally:
        store.close()
