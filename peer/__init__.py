"""The daemon: crawl engine, cluster, control API and CLI, composed under trio.

Public names are re-exported here and loaded on first use, so ``python -m peer.localweb.server`` and the
CLI's ``--help`` do not pay for importing the whole node.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Config": "config", "ConfigError": "config", "load": "config",
    "Node": "node", "NodeError": "node", "run_node": "node",
    "Crawler": "crawler", "Link": "crawler",
    "HostScheduler": "scheduler",
    "CachingResolver": "dns", "DnsError": "dns", "Resolver": "dns",
    "Fetcher": "http", "FetchError": "http", "Response": "http", "HttpxTransport": "http",
    "RobotsTxt": "robots", "can_fetch": "robots", "decide": "robots",
    "Scope": "urls", "normalize": "urls", "host_of": "urls", "origin_of": "urls",
    "Page": "links", "extract": "links",
    "Stats": "stats",
    "Transport": "transport", "TcpTransport": "transport", "MemoryNetwork": "transport",
    "PeerLinks": "peerlink", "Membership": "membership", "MembershipConfig": "membership",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'peer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
