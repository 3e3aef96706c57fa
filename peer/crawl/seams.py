"""The crawler's two seams to the world around it, each one named protocol (as memberlist's delegate and
httpx's transports are), with the default a single node needs.

- `PageFetcher`: how a URL becomes a response. `peer.fetch.Fetcher` is the real one (DNS, HTTP, limits); a
  simulation may hand the real crawler an in-memory web instead.
- `Ownership`: who owns which host, and what happens to links for hosts owned elsewhere. `Solo` (one node owns
  every host) is the default; `peer.cluster.Cluster` is the fleet's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from storage import QueuedUrl

from peer.fetch.http import Response

__all__ = ["Link", "Ownership", "PageFetcher", "Solo"]


@dataclass(frozen=True, slots=True)
class Link:
    """A URL on its way into the frontier: normalized, with its depth, redirect hops and referrer. What the
    crawler hands its `Ownership` for a host owned elsewhere."""

    url: str
    depth: int
    hops: int = 0
    found_on: str | None = None


class PageFetcher(Protocol):
    """One method: fetch `url` with these request headers and return the response (status, headers, body), or
    raise `peer.fetch.FetchError` / `peer.fetch.DnsError`."""

    async def fetch(self, url: str, *, headers: Sequence[tuple[str, str]] = ()) -> Response: ...


class Ownership(Protocol):
    """What the crawler asks of the cluster around it.

    `solo` is True only where one node owns every host: the crawler then skips the ownership checks in its
    hot loops and decides by itself when the crawl is finished (a cluster decides that together)."""

    solo: bool

    def owns(self, host: str) -> bool:
        """Whether this node owns `host` now: links to it are queued here, not routed."""

    def blocked(self, host: str) -> bool:
        """Whether `host` is owned here but may not be fetched yet (its arc's hand-off has not arrived)."""

    def route(self, host: str, link: Link) -> None:
        """Take a link for a host owned elsewhere (the dispatcher stages it for its owner)."""

    def take_routed(self) -> list[tuple[str, QueuedUrl]]:
        """The staged routed links, to be stored in the transaction that finishes their page."""

    def queued(self, items: Sequence[QueuedUrl]) -> None:
        """URLs were queued here by the crawler (a page's links, seeds): the cluster replicates them to the
        arc's backups (`--replicas`)."""

    def fetched(self, item: QueuedUrl) -> None:
        """The crawler is done with a queued URL: its page was committed as fetched, or it was refused (robots,
        limits) or given up. The cluster replicates its seen key and releases its queued-URL replicas."""


class Solo:
    """The ownership of a node on its own: it owns every host, nothing is blocked, nothing is routed."""

    solo = True

    def owns(self, host: str) -> bool:
        return True

    def blocked(self, host: str) -> bool:
        return False

    def route(self, host: str, link: Link) -> None:
        raise AssertionError(f"a node on its own owns every host; nothing to route ({host})")

    def take_routed(self) -> list[tuple[str, QueuedUrl]]:
        return []

    def queued(self, items: Sequence[QueuedUrl]) -> None:
        pass

    def fetched(self, item: QueuedUrl) -> None:
        pass
