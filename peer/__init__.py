"""The daemon: crawl engine, cluster, control API and CLI, composed under trio.

Public names are re-exported here and loaded on first use, so ``python -m peerlab.localweb.server`` and the
CLI's ``--help`` do not pay for importing the whole node.
"""

from __future__ import annotations

from peer.lazy import lazy_exports

_EXPORTS = {
    "Config": "config", "ConfigError": "config", "load": "config",
    "Node": "node", "NodeError": "node", "run_node": "node",
    "Crawler": "crawl", "HostScheduler": "crawl",
    "RobotsTxt": "crawl", "can_fetch": "crawl", "decide": "crawl",
    "Scope": "crawl", "normalize": "crawl", "host_of": "crawl", "origin_of": "crawl",
    "Page": "crawl", "extract": "crawl",
    "CachingResolver": "fetch", "DnsError": "fetch", "Resolver": "fetch",
    "Fetcher": "fetch", "FetchError": "fetch", "Response": "fetch", "HttpxTransport": "fetch",
    "Stats": "stats",
    "Cluster": "cluster", "Transport": "cluster", "TcpTransport": "cluster", "MemoryNetwork": "cluster",
    "PeerLinks": "cluster", "Membership": "cluster", "MembershipConfig": "cluster",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
