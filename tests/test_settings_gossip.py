"""The crawl settings' gossip rounds (peer/cluster/core/settingsgossip.py): each round repeats the record to
`SETTINGS_FANOUT` live peers at random, picked among those the node has a connection to while there are enough,
so that in a cluster larger than the links a node keeps a round opens no new connection; a member that joins gets
the record from `SETTINGS_FANOUT` members picked for it, the same on every node, and asks as many peers itself.
MockClock."""

from __future__ import annotations

import trio
import trio.testing

from protocol import Message, Settings
from ring import View

from peer.cluster.core.settingsgossip import SETTINGS_FANOUT, SETTINGS_INTERVAL, SettingsGossip, greeters
from peer.crawl.settings import CrawlSettings

PEERS = [f"n{i:03d}" for i in range(200)]


class _Links:
    """The links as the gossip sees them: which peers have a connection, and what was queued to whom."""

    def __init__(self, connected: list[str]) -> None:
        self.connected = connected
        self.sent: list[tuple[str, Message]] = []

    def send_nowait(self, peer_id: str, message: Message, *, address: str | None = None) -> bool:
        self.sent.append((peer_id, message))
        return True

    def connected_peers(self) -> list[str]:
        return sorted(self.connected)


class _Crawler:
    def __init__(self) -> None:
        self.settings = CrawlSettings()

    def adopt(self, settings: CrawlSettings) -> bool:
        return False


def _gossip(links: _Links, node_id: str = "n999") -> SettingsGossip:
    crawler = _Crawler()
    return SettingsGossip(node_id, links=links, view=View,
                          live_peers=lambda: [peer for peer in PEERS if peer != node_id], crawler=lambda: crawler)


def test_a_round_goes_to_connected_peers_while_there_are_enough() -> None:
    connected = PEERS[10:15]
    links = _Links(connected)
    gossip = _gossip(links)
    seen: set[str] = set()
    for _ in range(50):
        picked = gossip.pick()
        assert len(picked) == len(set(picked)) == SETTINGS_FANOUT
        assert set(picked) <= set(connected), picked
        seen.update(picked)
    assert seen == set(connected)  # still at random among them


def test_a_round_fills_up_with_other_live_peers_when_too_few_are_connected() -> None:
    links = _Links(["n007"])
    gossip = _gossip(links)
    others: set[str] = set()
    for _ in range(20):
        picked = gossip.pick()
        assert len(picked) == len(set(picked)) == SETTINGS_FANOUT and "n007" in picked
        others.update(set(picked) - {"n007"})
    assert len(others) > 10 and others <= set(PEERS)
    assert len(_gossip(_Links([])).pick()) == SETTINGS_FANOUT  # no connection at all: live peers at random


def test_the_gossip_loop_sends_the_settings_to_the_picked_peers_each_interval() -> None:
    async def main() -> None:
        links = _Links(PEERS[:4])
        gossip = _gossip(links)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(gossip.run)
            await trio.sleep(SETTINGS_INTERVAL * 3 + 0.5)
            nursery.cancel_scope.cancel()
        assert len(links.sent) == 3 * SETTINGS_FANOUT
        assert all(isinstance(message, Settings) for _, message in links.sent)
        assert {peer for peer, _ in links.sent} <= set(PEERS[:4])

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_joiner_gets_the_settings_from_its_greeters_only_and_asks_a_rounds_peers_itself() -> None:
    joiner = "n200"
    owners = [*PEERS, joiner]
    sent: dict[str, list[str]] = {}
    for node in owners:
        links = _Links(PEERS[:5])
        _gossip(links, node).welcome([joiner], owners)
        sent[node] = [peer for peer, _ in links.sent]
    senders = sorted(node for node in PEERS if sent[node])
    assert senders == sorted(greeters(joiner, owners)) and len(senders) == SETTINGS_FANOUT
    assert all(sent[node] == [joiner] for node in senders)
    # the joiner itself sends its record (a joiner's version 0) to a round's peers: those ahead answer with theirs
    assert len(sent[joiner]) == SETTINGS_FANOUT and set(sent[joiner]) <= set(PEERS[:5])


def test_greeters_are_the_same_on_every_node_and_spread_over_the_members() -> None:
    joiners = [f"j{i:03d}" for i in range(100)]
    picked = [greeters(joiner, [*PEERS, joiner]) for joiner in joiners]
    assert all(len(set(p)) == SETTINGS_FANOUT and joiner not in p for p, joiner in zip(picked, joiners))
    # the order of the owners does not matter, only who they are
    assert all(greeters(joiner, reversed([*PEERS, joiner])) == p for p, joiner in zip(picked, joiners))
    load = [sum(peer in p for p in picked) for peer in PEERS]
    assert max(load) <= 8 and sum(1 for n in load if n) > 100  # 300 greetings over 200 members, none singled out
