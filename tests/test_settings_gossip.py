"""The crawl settings' gossip rounds (peer/cluster/core/settingsgossip.py): each round repeats the record to
`SETTINGS_FANOUT` live peers at random, picked among those the node has a connection to while there are enough,
so that in a cluster larger than the links a node keeps a round opens no new connection. MockClock."""

from __future__ import annotations

import trio
import trio.testing

from protocol import Message, Settings
from ring import View

from peer.cluster.core.settingsgossip import SETTINGS_FANOUT, SETTINGS_INTERVAL, SettingsGossip
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


def _gossip(links: _Links) -> SettingsGossip:
    crawler = _Crawler()
    return SettingsGossip("n999", links=links, view=View, live_peers=lambda: list(PEERS),
                          crawler=lambda: crawler)


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
