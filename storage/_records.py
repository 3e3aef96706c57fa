"""The records the frontier keeps: a queued URL and a host's politeness state.

Frozen, slotted, keyword-only dataclasses, like every message in the project: safe to share, cheap to make.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HostState", "QueuedUrl"]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedUrl:
    """A URL waiting to be fetched.

    `host` is the lower-case IDNA host without port (the partition key); `depth` counts links from a seed
    (the frontier is breadth-first by depth); `hops` counts redirects followed to reach this URL;
    `found_on` is the page it was found on, if any. `lastmod` is the last modification a sitemap gave for
    it (epoch seconds), kept for revisits. `sitemap` marks a sitemap to read rather than a page; for one,
    `found_on` is the robots.txt that named it (or the index that listed it) and `hops` counts the steps
    from robots.txt (redirects and index levels).
    """

    url: str
    host: str
    depth: int
    hops: int = 0
    found_on: str | None = None
    lastmod: float | None = None
    sitemap: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class HostState:
    """A host's politeness state, durable so that a restart stays polite.

    `next_allowed` is wall-clock epoch seconds (a monotonic clock does not survive a restart);
    `crawl_delay` is the delay in force (max of configured and robots.txt Crawl-delay); `backoff` the extra
    delay after 429/503; `failures` consecutive failures; `pages` pages fetched from the host so far and
    `bytes` their body bytes (the host's budgets count both, and they move with the host).
    """

    host: str
    next_allowed: float
    crawl_delay: float = 0.0
    backoff: float = 0.0
    failures: int = 0
    pages: int = 0
    bytes: int = 0
