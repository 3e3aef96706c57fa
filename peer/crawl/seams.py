"""The crawler's four seams to the world around it, each one named protocol (as memberlist's delegate and
httpx's transports are), with the default a single node needs.

- `PageFetcher`: how a URL becomes a response. `peer.fetch.Fetcher` is the real one (DNS, HTTP, limits); a
  simulation may hand the real crawler an in-memory web instead.
- `AddressLimits`: lanes per server address: `peer.crawl.addressgate` on one node, the cluster's `FleetLanes`
  across a fleet.
- `Ownership`: who owns which host, and what happens to links for hosts owned elsewhere. `Solo` (one node owns
  every host) is the default; `peer.cluster.Cluster` is the fleet's.
- `PageRenderer`: pages rendered in a browser (`peer.render.RenderPool`); none by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from storage import QueuedUrl

from peer.crawl.addressgate import Lane
from peer.fetch.http import BodySink, Response
from peer.render.tabs import Rendered, Serve

__all__ = ["AddressLimits", "Ownership", "PageFetcher", "PageRenderer", "Solo"]


class PageFetcher(Protocol):
    """`fetch`: fetch `url` with these request headers and return the response (status, headers, body), or
    raise a `peer.fetch.FetchError` (whose class says what failed: `peer/fetch/errors.py`). With a `sink` the body is streamed to it instead
    (`peer.fetch.http.BodySink`: sitemaps are read as they arrive, never held whole); with an `address` the
    request goes to that address (the one its per-address lane is for). `address`: the address a host's
    requests go to now (the node's DNS cache), or DnsError."""

    async def fetch(
        self,
        url: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        sink: BodySink | None = None,
        address: str | None = None,
    ) -> Response: ...

    async def address(self, host: str) -> str: ...


class AddressLimits(Protocol):
    """Lanes per server address (peer/crawl/addressgate.py on one node; the Cluster's `FleetLanes` across a
    fleet). `try_acquire` answers a lane for a request starting now, or the time to try again (inf: the host
    waits until the crawler's `address_ready(address)` is called, or a lane of the address is given back here);
    `release` gives the lane back when the request ended (or, `used=False`, was not made)."""

    @property
    def active(self) -> bool: ...

    def try_acquire(self, address: str, now: float) -> Lane | float: ...

    def release(self, lane: Lane, now: float, *, used: bool = True) -> None: ...


class Ownership(Protocol):
    """What the crawler asks of the cluster around it.

    `solo` is True only where one node owns every host: the crawler then skips the ownership checks in its
    hot loops and decides by itself when the crawl is finished (a cluster decides that together).

    The crawler remembers URLs it has answered for or routed, and trusts that memory without asking `owns`
    again: an ownership whose `owns` answers change (a new ring) calls the crawler's `forget_seen()` first."""

    solo: bool

    def owns(self, host: str) -> bool:
        """Whether this node owns `host` now: links to it are queued here, not routed."""

    def blocked(self, host: str) -> bool:
        """Whether `host` is owned here but may not be fetched yet (its arc's hand-off has not arrived)."""

    def route(self, item: QueuedUrl) -> None:
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

    def route(self, item: QueuedUrl) -> None:
        raise AssertionError(f"a node on its own owns every host; nothing to route ({item.host})")

    def take_routed(self) -> list[tuple[str, QueuedUrl]]:
        return []

    def queued(self, items: Sequence[QueuedUrl]) -> None:
        pass

    def fetched(self, item: QueuedUrl) -> None:
        pass


class PageRenderer(Protocol):
    """Renders a page in a browser whose every request `serve` answers (`peer.render.RenderPool`); raises
    `peer.render.RenderFailed`."""

    async def render(self, url: str, serve: Serve) -> Rendered: ...
