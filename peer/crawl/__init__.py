"""The crawl engine of one node: which URL to fetch next and what a fetched page yields. The crawler (host
turns, politeness, back-off, durability), the per-host scheduler, robots.txt, URL normalization and scope,
link extraction and charsets, and the choice of seen-URL store. Fetches through `peer.fetch`; asks the
cluster (when there is one) only through the callbacks it is given.
"""

from peer.crawl.crawler import Crawler
from peer.crawl.links import Page, extract, is_html
from peer.crawl.robots import RobotsTxt, can_fetch, decide
from peer.crawl.scheduler import HostScheduler, HostTurn
from peer.crawl.seenstores import DEDUP_KINDS, SplitStore, open_node_store
from peer.crawl.urls import Scope, host_of, normalize, origin_of

__all__ = [
    "DEDUP_KINDS", "Crawler", "HostScheduler", "HostTurn", "Page", "RobotsTxt", "Scope", "SplitStore",
    "can_fetch", "decide", "extract", "host_of", "is_html", "normalize", "open_node_store", "origin_of",
]
