"""Seen-key replicas (peer/cluster/replicas/seenreplicas.py): which keys go to which backup, when, and what a receiver does with them.

Real LMDB stores, a recording stand-in for the peer links, rings of the design's weights; the run loop under
MockClock. The whole-cluster effect (a death repeats only what was under way) is checked by the real-daemon
test in tests/test_cluster_daemons.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from peer.cluster.replicas.seenreplicas import MAX_KEYS_PER_MESSAGE, SeenReplicas
from protocol import BatchAck, SeenReplica
from ring import Ring, host_position
from storage import NodeStore, QueuedUrl, queued_url_keys
from storage._node import FETCHED_FOLD

WEIGHTS = {"A": 150, "B": 80, "C": 200}


class Links:
    """Records what would be sent; `refuse` names peers whose send queue is full."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, SeenReplica]] = []
        self.refuse: set[str] = set()

    def send_nowait(self, peer_id: str, message: SeenReplica) -> bool:
        if peer_id in self.refuse:
            return False
        self.sent.append((peer_id, message))
        return True

    def keys_to(self) -> dict[str, set[bytes]]:
        out: dict[str, set[bytes]] = {}
        for peer, message in self.sent:
            out.setdefault(peer, set()).update(message.keys)
        return out


def _items(ring: Ring, owner: str, count: int) -> list[QueuedUrl]:
    """`count` pages on hosts that `owner` owns in `ring`."""
    items, i = [], 0
    while len(items) < count:
        host = f"h{i}.test"
        i += 1
        if ring.owner(host) == owner:
            items.append(QueuedUrl(url=f"http://{host}/p{i}", host=host, depth=1, hops=0, found_on=None))
    return items


@pytest.fixture
def store(tmp_path: Path):
    s = NodeStore.open(tmp_path / "a")
    yield s
    s.close()


def test_each_fetched_key_goes_to_the_owner_of_its_position_once_the_sender_is_gone(store) -> None:
    ring = Ring(WEIGHTS, points_per_weight=50)
    without_a = Ring({"B": 80, "C": 200}, points_per_weight=50)
    links = Links()
    replicas = SeenReplicas("A", store, links, ring_of=lambda: (7, ring), copies=1)
    items = _items(ring, "A", 300)
    for item in items:
        replicas.fetched(item)
    assert replicas.flush() == 300 and replicas.flush() == 0
    expected: dict[str, set[bytes]] = {}
    for item, key in zip(items, queued_url_keys(items)):
        expected.setdefault(without_a.owner(item.host), set()).add(key)
    assert links.keys_to() == expected and set(expected) == {"B", "C"}
    assert all(message.epoch == 7 for _, message in links.sent)
    assert store.fetched_count() == 300  # recorded, for the next ring change

    # by default every key also goes to the second backup: here, with three nodes, both others get them all
    links.sent.clear()
    both = SeenReplicas("A", store, links, ring_of=lambda: (7, ring))
    for item in items:
        both.fetched(item)
    assert both.flush() == 600 and links.keys_to() == {"B": set(queued_url_keys(items)), "C": set(queued_url_keys(items))}


def test_a_full_send_queue_drops_and_counts_and_a_cluster_of_one_sends_nothing(store) -> None:
    ring = Ring(WEIGHTS, points_per_weight=50)
    links = Links()
    links.refuse = {"C"}
    replicas = SeenReplicas("A", store, links, ring_of=lambda: (1, ring), copies=1)
    for item in _items(ring, "A", 100):
        replicas.fetched(item)
    sent = replicas.flush()
    assert sent + replicas.keys_dropped == 100 and replicas.keys_dropped > 0 and set(links.keys_to()) == {"B"}

    alone = SeenReplicas("A", store, Links(), ring_of=lambda: (1, Ring({"A": 1}, points_per_weight=50)))
    alone.fetched(_items(ring, "A", 1)[0])
    assert alone.flush() == 0 and alone.links.sent == []


def test_pending_keys_are_bounded_and_messages_fit_the_frame_limit(store) -> None:
    ring = Ring({"A": 1, "B": 1}, points_per_weight=50)
    links = Links()
    replicas = SeenReplicas("A", store, links, ring_of=lambda: (1, ring), max_pending=MAX_KEYS_PER_MESSAGE + 10)
    items = _items(ring, "A", MAX_KEYS_PER_MESSAGE + 30)
    for item in items:
        replicas.fetched(item)
    assert replicas.keys_dropped == 20  # the oldest went
    assert replicas.flush() == MAX_KEYS_PER_MESSAGE + 10
    assert [len(m.keys) for _, m in links.sent] == [MAX_KEYS_PER_MESSAGE, 10]


async def test_a_ring_change_resends_keys_whose_backup_changed_and_forgets_lost_arcs(
    store, autojump_clock
) -> None:
    before = Ring(WEIGHTS, points_per_weight=50)
    after = Ring({**WEIGHTS, "E": 300}, points_per_weight=50)  # E joins: some backups and arcs change
    current = {"ring": before}
    links = Links()
    replicas = SeenReplicas("A", store, links, ring_of=lambda: (1, current["ring"]))
    items = _items(before, "A", 400)
    keys = dict(zip(queued_url_keys(items), items))
    async with trio.open_nursery() as nursery:
        await nursery.start(replicas.run)
        for item in items:
            replicas.fetched(item)
        await trio.sleep(0.15)  # one tick: sent, then the first scan (every key, as after a start)
        assert replicas.rescans == 1 and replicas.keys_sent == 800 and replicas.keys_resent == 800
        links.sent.clear()
        current["ring"] = after
        await trio.sleep(0.1)
        assert replicas.rescans == 2
        nursery.cancel_scope.cancel()
    kept = {k for k, item in keys.items() if after.owner(item.host) == "A"}
    expected: dict[str, set[bytes]] = {}
    for k, item in keys.items():
        if k in kept:
            position = host_position(item.host)
            for peer in set(after.backups_at(position, 2)) - set(before.backups_at(position, 2)):
                expected.setdefault(peer, set()).add(k)
    assert 0 < len(kept) < 400 and expected  # the join took arcs from A and changed some backups
    assert links.keys_to() == expected and "E" in expected
    assert set(store.fetched_keys()) == kept  # the keys of arcs that moved to E left with the hand-off


def test_the_receiver_marks_keys_seen_and_refuses_malformed_ones(store) -> None:
    replicas = SeenReplicas("B", store, Links(), ring_of=lambda: (1, None))
    item = QueuedUrl(url="http://x.test/", host="x.test", depth=0, hops=0, found_on=None)
    (key,) = queued_url_keys([item])
    assert replicas.on_message("A", SeenReplica(epoch=3, keys=(key, b"short")))
    assert key in store.dedup and replicas.keys_received == 1 and replicas.keys_refused == 1
    assert store.admit([item]) == []  # the page the dead owner fetched is not queued again here
    assert not replicas.on_message("A", BatchAck(seq=1, new=0, seen=0, forwarded=0, epoch=1))


def test_hand_off_keys_of_our_arcs_are_replicated_and_the_others_passed_on_at_each_ring_change(store) -> None:
    abcd = Ring({"A": 150, "B": 80, "C": 200, "D": 40}, points_per_weight=50)
    abde = Ring({"A": 150, "B": 80, "D": 40, "E": 300}, points_per_weight=50)
    current = {"ring": abcd}
    links = Links()
    replicas = SeenReplicas("A", store, links, ring_of=lambda: (4, current["ring"]), copies=1)
    # A still holds the ring with C when C's leave hands it C's pages (C's arcs go to A in the ring without C)
    abd = Ring({"A": 150, "B": 80, "D": 40}, points_per_weight=50)
    items = [i for i in _items(abcd, "C", 400) if abd.owner(i.host) == "A"]
    keys = dict(zip(queued_url_keys(items), items))
    replicas.adopt(list(keys))
    assert set(links.keys_to()) == {"C"}  # the owner in A's ring: C, which is leaving, so no help
    links.sent.clear()
    # A skips the ring without C: its next ring already holds E, which takes some of those arcs
    current["ring"] = abde
    replicas.ring_changed(abde, 5)
    to_e = {k for k, item in keys.items() if abde.owner(item.host) == "E"}
    assert to_e and links.keys_to() == {"E": to_e}
    # the others are A's own now: recorded and replicated at the next flush
    mine = set(keys) - to_e
    assert mine and replicas.flush() == len(mine) and set(store.fetched_keys()) == mine
    assert replicas.keys_passed_on == len(items) + len(to_e)


def test_politeness_states_go_on_to_the_owner_and_are_merged_there(store) -> None:
    from protocol import HostState as WireHostState

    abd = Ring({"A": 150, "B": 80, "D": 40}, points_per_weight=50)
    host = next(f"s{i}.test" for i in range(1000) if abd.owner(f"s{i}.test") == "D")
    wall = {"now": 1000.0}
    links = Links()
    applied: list[WireHostState] = []
    a = SeenReplicas("A", store, links, ring_of=lambda: (3, abd), apply_states=applied.extend,
                     wall_clock=lambda: wall["now"])
    # a hand-off gave A a timer for a host that D owns in A's ring: it goes to D at once, as a duration
    a.pass_states([WireHostState(host=host, crawl_delay=1.0, ready_in=0.8, failures=0)])
    ((peer, message),) = links.sent
    assert peer == "D" and message.keys == () and message.hosts[0].host == host
    assert message.hosts[0].ready_in == pytest.approx(0.8)
    # D merges it (its own apply), and a node that does not own the host keeps it for its next ring change
    applied_d: list[WireHostState] = []
    d = SeenReplicas("D", store, Links(), ring_of=lambda: (3, abd), apply_states=applied_d.extend)
    assert d.on_message("A", message) and [s.host for s in applied_d] == [host]
    b_links = Links()
    b = SeenReplicas("B", store, b_links, ring_of=lambda: (3, abd), apply_states=applied.extend,
                     wall_clock=lambda: wall["now"])
    assert b.on_message("A", message) and applied == [] and b_links.sent == []  # never straight back
    # at B's next ring change the host is B's own: merged there, with what is left of the wait
    wall["now"] += 0.5
    b.ring_changed(Ring({"B": 1}, points_per_weight=50), 4)
    assert [s.host for s in applied] == [host] and applied[0].ready_in == pytest.approx(0.3)
    assert b.status()["states_foreign"] == 0


def test_a_released_pages_key_skips_the_backups_its_release_reached(store) -> None:
    """With --replicas R the release of a page (a QueueReplica) marks its key seen at the backups it went to: the
    seen-key replicas send that key only to the other backups of its position; a key that came another way (a
    hand-off's, a node without queued-URL replicas) still goes to all of them. All are recorded."""
    ring = Ring(WEIGHTS, points_per_weight=50)
    links = Links()
    replicas = SeenReplicas("A", store, links, ring_of=lambda: (7, ring))  # two copies
    items = _items(ring, "A", 40)
    keys = queued_url_keys(items)
    for item, key in zip(items[:20], keys[:20]):
        replicas.fetched(item, key, released=frozenset(ring.backups_at(host_position(item.host), 1)))
    for item in items[20:]:
        replicas.fetched(item)
    assert replicas.flush() == 20 + 2 * 20
    sent = links.keys_to()
    for item, key in zip(items, keys):
        first, second = ring.backups_at(host_position(item.host), 2)
        released = key in keys[:20]
        assert (key in sent.get(first, set())) is not released and key in sent[second]
    assert store.fetched_count() == 40
    # in a cluster of two the release's backup is the only one: a released key goes nowhere else
    links.sent.clear()
    two = Ring({"A": 150, "B": 80}, points_per_weight=50)
    pair = SeenReplicas("A", store, links, ring_of=lambda: (8, two))
    pair.fetched(items[0], keys[0], released=frozenset({"B"}))
    assert pair.flush() == 0 and links.sent == []


def test_a_released_pages_key_reaches_the_backups_a_ring_change_made_first_before_it_left(store) -> None:
    """A page's release went to its backup, which then died: the ring without it, adopted before the key's tick,
    makes another node the first backup, the heir if this node dies too. That node got no release, so it gets
    the key (it used to be skipped as the first backup under the ring at the tick: the heir fetched the page
    again after this node's death, a duplicate beyond what was under way)."""
    full = Ring(WEIGHTS, points_per_weight=50)
    current = [full]
    links = Links()
    replicas = SeenReplicas("A", store, links, ring_of=lambda: (7, current[0]))
    item = next(i for i in _items(full, "A", 40) if full.backups_at(host_position(i.host), 1) == ("B",))
    key = queued_url_keys([item])[0]
    replicas.fetched(item, key, released=frozenset({"B"}))  # staged to B under the full ring
    current[0] = Ring({n: w for n, w in WEIGHTS.items() if n != "B"}, points_per_weight=50)
    heir = current[0].backups_at(host_position(item.host), 1)[0]
    assert replicas.flush() >= 1
    assert key in links.keys_to()[heir]



def test_the_backups_remembered_per_position_follow_the_ring(store) -> None:
    """A flush remembers each host position's backups for the ring of the moment; a key of the same position
    flushed under a new ring goes to the new ring's backups, not to those remembered."""
    full = Ring(WEIGHTS, points_per_weight=50)
    current = [full]
    links = Links()
    replicas = SeenReplicas("A", store, links, ring_of=lambda: (7, current[0]), copies=1)
    item = next(i for i in _items(full, "A", 40) if full.backups_at(host_position(i.host), 1) == ("B",))
    again = QueuedUrl(url=item.url + "?again", host=item.host, depth=1, hops=0, found_on=None)
    replicas.fetched(item)
    assert replicas.flush() == 1 and links.keys_to() == {"B": set(queued_url_keys([item]))}
    links.sent.clear()
    current[0] = Ring({n: w for n, w in WEIGHTS.items() if n != "B"}, points_per_weight=50)
    replicas.fetched(again)
    assert replicas.flush() == 1
    assert links.keys_to() == {current[0].backups_at(host_position(item.host), 1)[0]: set(queued_url_keys([again]))}


async def test_with_queued_url_replicas_a_ring_changes_re_sent_keys_go_the_acknowledged_way(store) -> None:
    """With `--replicas` the keys a ring change sends again go through the queued-URL replicas' FIFO (`reliable`),
    not as best-effort `SeenReplica` messages; a FIFO without room sends them best effort."""
    ring = Ring(WEIGHTS, points_per_weight=50)
    links = Links()
    taken: dict[str, list[bytes]] = {}
    room = [True]

    def reliable(backup: str, keys) -> bool:
        if room[0]:
            taken.setdefault(backup, []).extend(keys)
        return room[0]

    replicas = SeenReplicas("A", store, links, ring_of=lambda: (7, ring), reliable=reliable)
    items = _items(ring, "A", 20)
    for item in items:
        replicas.fetched(item)
    replicas.flush()
    assert links.sent == [] and sum(len(k) for k in taken.values()) == 2 * 20
    taken.clear()
    room[0] = False
    assert await replicas.rescan(ring) == 2 * 20  # a first scan: every key to both backups, best effort now
    assert taken == {} and sum(len(k) for k in links.keys_to().values()) == 2 * 20


def test_fetched_keys_are_journaled_and_folded_into_the_record_when_read_or_full(tmp_path: Path) -> None:
    """A tick's keys are one append to the journal; they reach the record (sorted, FETCHED_FOLD at a time) when
    it is read or when FETCHED_FOLD of them wait, and a store opened again folds what a killed node journaled."""
    store = NodeStore.open(tmp_path / "j")
    ring = Ring(WEIGHTS, points_per_weight=50)
    keys = queued_url_keys(_items(ring, "A", 60))
    store.mark_fetched(keys[:30])
    store.mark_fetched(keys[20:] + [b"short"])  # an overlap, and a key of the wrong size (not recorded)
    assert store.fetched_journaled == 30 + 40
    assert store.fetched_count() == 60 and store.fetched_journaled == 0
    assert list(store.fetched_keys()) == sorted(keys)
    assert store.forget_fetched(keys[:10]) == 10
    more = [bytes([n % 256, n // 256]) + bytes(14) for n in range(FETCHED_FOLD)]
    store.mark_fetched(more[:-1])
    assert store.fetched_journaled == FETCHED_FOLD - 1
    store.mark_fetched(more[-1:])  # the FETCHED_FOLD-th key folds them all
    assert store.fetched_journaled == 0
    store.mark_fetched(keys[:5])
    store.close()  # as after kill -9: journaled, committed, never folded
    again = NodeStore.open(tmp_path / "j")
    try:
        assert again.fetched_journaled == 1  # something waits
        assert again.fetched_count() == 50 + FETCHED_FOLD + 5
        again.mark_fetched(keys[5:10])  # the journal goes on after what was there
        assert set(again.fetched_keys()) == set(keys) | set(more)
    finally:
        again.close()
