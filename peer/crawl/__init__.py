"""The crawl engine of one node: which URL to fetch next and what a fetched page yields. The crawler (host
turns, politeness, back-off, durability), the per-host scheduler, robots.txt, URL normalization and scope,
link extraction and charsets, and the choice of seen-URL store. Fetches through `peer.fetch`; asks the
cluster (when there is one) only through the callbacks it is given.

Public names are re-exported here and loaded on first use, so a page worker process, which imports
`peer.crawl.pagejobs` and the link extractor, does not import the whole engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from peer.lazy import lazy_exports

if TYPE_CHECKING:
    from peer.crawl.crawler import Crawler
    from peer.crawl.links import Page, extract, is_html
    from peer.crawl.robots import RobotsTxt, can_fetch, decide
    from peer.crawl.scheduler import HostScheduler, HostTurn
    from peer.crawl.seenstores import DEDUP_KINDS, SplitStore, open_node_store
    from peer.crawl.urls import Scope, host_of, normalize, origin_of

_EXPORTS = {
    "Crawler": "crawler", "Page": "links", "extract": "links", "is_html": "links",
    "RobotsTxt": "robots", "can_fetch": "robots", "decide": "robots",
    "HostScheduler": "scheduler", "HostTurn": "scheduler",
    "DEDUP_KINDS": "seenstores", "SplitStore": "seenstores", "open_node_store": "seenstores",
    "Scope": "urls", "host_of": "urls", "normalize": "urls", "origin_of": "urls",
}

__all__ = [
    "DEDUP_KINDS", "Crawler", "HostScheduler", "HostTurn", "Page", "RobotsTxt", "Scope", "SplitStore",
    "can_fetch", "decide", "extract", "host_of", "is_html", "normalize", "open_node_store", "origin_of",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
