"""The crawl settings (scope, budgets, the paused flag: peer/crawl/settings.py) shared across the cluster: sent to
every live peer at each change; to a member that joins by `SETTINGS_FANOUT` members picked for it (`greeters`),
while the joiner asks as many peers for theirs; repeated as gossip to a few peers at random (among those this node
has a connection to, when it has enough); and a record from a peer adopted when it ranks above the one in force
(docs/operations.md, "Steering a running crawl").

`SettingsGossip` is a part of `peer.cluster.core.cluster.Cluster`, built with what it uses: the links, the view
(for the peers' addresses), the live peers, and the crawler that holds the settings in force (`SettingsHolder`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Iterable, Sequence
from hashlib import blake2b
from typing import Protocol

import trio

from protocol import Message, Settings
from ring import View

from peer.crawl.settings import CrawlSettings, SettingsError

__all__ = ["SETTINGS_FANOUT", "SETTINGS_INTERVAL", "GossipLinks", "SettingsGossip", "SettingsHolder", "greeters"]

# the cluster's records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.cluster")

#: The crawl settings go to every live peer at each change, to a member that joins, and again this often to
#: `SETTINGS_FANOUT` live peers picked at random (links deliver at most once per connection: the repeat is what
#: makes a lost record harmless). As gossip, a record reaches every member in about log4(n) intervals, and a
#: node sends three small messages per interval whatever the cluster's size. The peers are picked among those
#: with a live connection when there are enough: in a cluster larger than the links a node keeps, a peer picked
#: among all would mostly be a first contact, a handshake (and, past `max_links`, another link's eviction) for
#: one small message.
SETTINGS_INTERVAL = 5.0
SETTINGS_FANOUT = 3


def greeters(joiner: str, owners: Iterable[str]) -> list[str]:
    """The `SETTINGS_FANOUT` members of `owners` (the joiner left out) that send the crawl settings to `joiner`
    when it is admitted: the first by a hash of the pair, the same on every node whose view holds the same
    owners. Every owner sending would cost each joiner a connection from every member, and a cluster of n nodes
    n messages per join for a record three copies deliver."""
    key = joiner.encode()
    ranked = sorted((blake2b(key + b"\0" + owner.encode(), digest_size=8).digest(), owner)
                    for owner in set(owners) if owner != joiner)
    return [owner for _, owner in ranked[:SETTINGS_FANOUT]]


class GossipLinks(Protocol):
    """What the settings' gossip needs of `PeerLinks`."""

    def send_nowait(self, peer_id: str, message: Message, *, address: str | None = None) -> bool: ...

    def connected_peers(self) -> list[str]: ...


class SettingsHolder(Protocol):
    """What the settings' gossip needs of the crawler: the settings in force, and adopting a peer's."""

    settings: CrawlSettings

    def adopt(self, settings: CrawlSettings) -> bool: ...


class SettingsGossip:
    """Sharing the crawl settings with the peers."""

    def __init__(
        self,
        node_id: str,
        *,
        links: GossipLinks,
        view: Callable[[], View],
        live_peers: Callable[[], list[str]],
        crawler: Callable[[], SettingsHolder | None],
    ) -> None:
        self.node_id = node_id
        self.links = links
        self._view = view  # () -> this node's current view (a peer's address)
        self._live_peers = live_peers  # () -> the other members that own arcs
        self._crawler = crawler  # () -> the crawler once attached, or None (nothing to share yet)
        self._rng = random.Random(f"{node_id}:settings")  # whom the settings are repeated to
        self.sent = 0
        self.adopted = 0
        self.refused = 0

    def share(self, peers: Iterable[str] | None = None) -> int:
        """Send the crawl settings in force to `peers` (every live peer by default); the number sent."""
        crawler = self._crawler()
        if crawler is None:
            return 0
        current = crawler.settings
        message = Settings(version=current.version, origin=current.origin, body=current.body())
        view = self._view()
        sent = 0
        for peer in (self._live_peers() if peers is None else peers):
            member = view.member(peer)
            sent += bool(self.links.send_nowait(peer, message, address=member.address if member else None))
        self.sent += sent
        return sent

    def welcome(self, joined: Sequence[str], owners: Collection[str]) -> int:
        """Members that were admitted (`joined`) among `owners` (every member owning arcs, this node among
        them): each gets the settings from this node when it is one of its `greeters`; when this node is itself
        among them, it sends its record to a round's peers, who answer with theirs if it ranks above (a joiner
        starts with its flags as version 0). The number sent."""
        if self.node_id in joined:
            return self.share(self.pick())
        mine = [peer for peer in joined if self.node_id in greeters(peer, owners)]
        return self.share(mine) if mine else 0

    async def run(self) -> None:
        """Repeat the settings to a few live peers at random every `SETTINGS_INTERVAL`, until cancelled."""
        while True:
            await trio.sleep(SETTINGS_INTERVAL)
            self.share(self.pick())

    def pick(self) -> list[str]:
        """`SETTINGS_FANOUT` live peers at random for a round of gossip: among those this node has a connection
        to, and only as many others as those fall short."""
        peers = self._live_peers()
        connected = set(self.links.connected_peers())
        near = [peer for peer in peers if peer in connected]
        picked = self._rng.sample(near, min(SETTINGS_FANOUT, len(near)))
        if len(picked) < SETTINGS_FANOUT:
            far = [peer for peer in peers if peer not in connected]
            picked += self._rng.sample(far, min(SETTINGS_FANOUT - len(picked), len(far)))
        return picked

    def arrived(self, peer_id: str, message: Settings) -> None:
        """A peer's settings: adopted if they rank above those in force; a peer behind gets ours at once."""
        crawler = self._crawler()
        if crawler is None:
            return
        try:
            settings = CrawlSettings.from_record(message.version, message.origin, message.body)
        except SettingsError as exc:
            self.refused += 1
            log.warning("a peer sent crawl settings this node cannot use; ignored",
                        extra={"peer": peer_id, "error": str(exc)})
            return
        if crawler.adopt(settings):
            self.adopted += 1
        elif settings.rank() < crawler.settings.rank():
            self.share([peer_id])  # the sender is behind: it gets ours now, not at the next round
