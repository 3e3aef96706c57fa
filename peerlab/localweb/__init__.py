"""A local web for tests, the demo and benchmarks: a generated site graph, its HTTP server and DNS server.

``SiteGraph.generate(seed=...)`` builds the web; ``graph.expected()`` is the oracle a crawl is judged by;
``serve_web`` serves it over loopback and logs every request for the referees
(``max_concurrent_connections_per_host``, ``crawl_delay_violations``); ``serve_dns`` resolves its names;
``start_bench_web`` serves a large static copy with nginx for benchmarks. See docs/localweb.md.
"""

from typing import Any

from .bench import BenchWeb, start_bench_web
from .graph import SiteGraph, mirror_body, mirror_path, page_path
from .model import HostSpec, Link, Resource
from .oracle import DEFAULT_SKIP_SUFFIXES, Expected, TrapGuard
from .referee import (
    CrawlDelayViolation,
    RequestRecord,
    crawl_delay_violations,
    max_concurrent_connections_per_host,
    read_log,
    requested_paths,
    requested_urls,
)
from .robots_spec import RobotsGroup, RobotsSpec, Rule
from .static import write_site

# The two servers are loaded on first use: both are also run as ``python -m peerlab.localweb.server`` and
# ``python -m peerlab.localweb.dns_server``, which must not find their module imported already.
_LAZY = {"WebServer": "server", "serve_web": "server", "DnsServer": "dns_server", "serve_dns": "dns_server"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'peerlab.localweb' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "DEFAULT_SKIP_SUFFIXES",
    "BenchWeb",
    "CrawlDelayViolation",
    "DnsServer",
    "Expected",
    "HostSpec",
    "Link",
    "RequestRecord",
    "Resource",
    "RobotsGroup",
    "RobotsSpec",
    "Rule",
    "SiteGraph",
    "TrapGuard",
    "WebServer",
    "crawl_delay_violations",
    "max_concurrent_connections_per_host",
    "mirror_body",
    "mirror_path",
    "page_path",
    "read_log",
    "requested_paths",
    "requested_urls",
    "serve_dns",
    "serve_web",
    "start_bench_web",
    "write_site",
]
