"""The crawl settings (scope, budgets, the paused flag: peer/crawl/settings.py) shared across the cluster: sent to
every live peer at each change and to a member that joins, repeated as gossip to a few peers at random, and a
record from a peer adopted when it ranks above the one in force (docs/operations.md, "Steering a running crawl").

A mixin of `peer.cluster.core.cluster.Cluster`: it works on the cluster's attributes, set in `Cluster.__init__`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import trio

from protocol import Settings

from peer.crawl.settings import CrawlSettings, SettingsError

__all__ = ["SETTINGS_FANOUT", "SETTINGS_INTERVAL", "SettingsGossip"]

# the cluster's records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.cluster")

#: The crawl settings go to every live peer at each change, to a member that joins, and again this often to
#: `SETTINGS_FANOUT` live peers picked at random (links deliver at most once per connection: the repeat is what
#: makes a lost record harmless). As gossip, a record reaches every member in about log4(n) intervals, and a
#: node sends three small messages per interval whatever the cluster's size.
SETTINGS_INTERVAL = 5.0
SETTINGS_FANOUT = 3


class SettingsGossip:
    """Sharing the crawl settings with the peers."""

    # -- crawl settings -----------------------------------------------------------------------------------

    def share_settings(self, peers: Iterable[str] | None = None) -> int:
        """Send the crawl settings in force to `peers` (every live peer by default); the number sent."""
        if self.crawler is None:
            return 0
        current = self.crawler.settings
        message = Settings(version=current.version, origin=current.origin, body=current.body())
        sent = 0
        for peer in (self._live_peers() if peers is None else peers):
            member = self.view.member(peer)
            sent += bool(self.links.send_nowait(peer, message, address=member.address if member else None))
        self.settings_sent += sent
        return sent

    async def _settings_loop(self) -> None:
        while True:
            await trio.sleep(SETTINGS_INTERVAL)
            peers = self._live_peers()
            self.share_settings(self._gossip_rng.sample(peers, min(SETTINGS_FANOUT, len(peers))))

    def _settings_arrived(self, peer_id: str, message: Settings) -> None:
        if self.crawler is None:
            return
        try:
            settings = CrawlSettings.from_record(message.version, message.origin, message.body)
        except SettingsError as exc:
            self.settings_refused += 1
            log.warning("a peer sent crawl settings this node cannot use; ignored",
                        extra={"peer": peer_id, "error": str(exc)})
            return
        if self.crawler.adopt(settings):
            self.settings_adopted += 1
        elif settings.rank() < self.crawler.settings.rank():
            self.share_settings([peer_id])  # the sender is behind: it gets ours now, not at the next round
