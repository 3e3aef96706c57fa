"""What the dashboard shows of one node, and the page itself.

The dashboard is one static HTML file (`dashboard.html`, package data: no build step, nothing loaded from
outside) that the control endpoint serves at ``GET /``. It polls ``GET /cluster`` (``GET /status`` on a
standalone node) with the control token, and any node answers for the whole cluster: each node describes itself
with `NodeWatch.summary`, and a node that is watched asks its peers for theirs (``StatusQuery`` /
``StatusReport``, peer/cluster/core/report.py).

`NodeWatch` samples once a second what a summary needs over time: the pages fetched in each of the last
`HISTORY_SECONDS` seconds (the pages/s chart), the URLs sent to each peer (the flows of the last `FLOW_WINDOW`
seconds) and when the last page came in (stall detection).
"""

from __future__ import annotations

import collections
import heapq
import os
import resource
from collections.abc import Callable
from importlib import resources
from typing import Any

__all__ = ["FLOW_WINDOW", "HISTORY_SECONDS", "SLOW_HOSTS", "STALL_AFTER", "NodeWatch", "file_rss_bytes", "page",
           "rss_bytes"]

#: The pages/s chart covers the last five minutes, one point a second.
HISTORY_SECONDS = 300
#: Flows are the URLs sent over the last ten seconds: long enough to hold a few dispatch batches per peer.
FLOW_WINDOW = 10.0
#: Slowest hosts listed per node.
SLOW_HOSTS = 10
#: A node with queued URLs and no page for this long is shown as stalled.
STALL_AFTER = 30.0

_PAGE: bytes | None = None


def page() -> bytes:
    """The dashboard's HTML (read once from the package)."""
    global _PAGE
    if _PAGE is None:
        _PAGE = resources.files(__package__).joinpath("dashboard.html").read_bytes()
    return _PAGE


def rss_bytes() -> int:
    """This process's resident memory: /proc's current figure where there is one, else the peak."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _status_bytes(field: bytes) -> int | None:
    """A `kB` figure of /proc/self/status (`field` with its colon) in bytes; None where /proc does not say."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def file_rss_bytes() -> int:
    """This process's file-backed resident memory (RssFile: mapped files, the store's pages among them); 0 where
    /proc does not say."""
    return _status_bytes(b"RssFile:") or 0


def peak_rss_bytes() -> int:
    """This process's peak resident memory since it started its program: /proc's VmHWM where there is one (the
    peak of the current address space: `ru_maxrss` would also count the parent's memory when the process was
    started by vfork and exec), else `ru_maxrss`."""
    peak = _status_bytes(b"VmHWM:")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class NodeWatch:
    """One node's figures over time, sampled by the node's housekeeping (`sample`, about once a second)."""

    def __init__(self, pages: Callable[[], int], sent: Callable[[], dict[str, int]], now: float) -> None:
        self._pages = pages
        self._sent = sent
        self._started = now
        self._last_pages = pages()
        self._last_page_at: float | None = None
        self._per_second: collections.deque[int] = collections.deque(maxlen=HISTORY_SECONDS)
        self._sent_samples: collections.deque[tuple[float, dict[str, int]]] = collections.deque(
            maxlen=int(FLOW_WINDOW) * 4 + 2)

    def sample(self, now: float) -> None:
        pages = self._pages()
        self._per_second.append(max(0, pages - self._last_pages))
        if pages != self._last_pages:
            self._last_page_at = now
        self._last_pages = pages
        self._sent_samples.append((now, dict(self._sent())))

    def history(self) -> list[int]:
        """Pages fetched in each of the last sampled seconds, oldest first."""
        return list(self._per_second)

    def idle_for(self, now: float) -> float:
        """Seconds since a page last came in (since the start if none has)."""
        return max(0.0, now - (self._last_page_at if self._last_page_at is not None else self._started))

    def sent_recent(self, now: float) -> tuple[float, dict[str, int]]:
        """(window, URLs sent to each peer over it): against the sample about `FLOW_WINDOW` seconds old."""
        current = dict(self._sent())
        base_t, base = now, current
        for t, sample in self._sent_samples:
            if now - t <= FLOW_WINDOW + 0.5:
                base_t, base = t, sample
                break
        window = now - base_t
        return window, {peer: n - base.get(peer, 0) for peer, n in current.items() if n - base.get(peer, 0) > 0}


def slow_hosts(turns: Any, queued: Callable[[str], int], base_delay: float, limit: int = SLOW_HOSTS) -> list[dict[str, Any]]:
    """The hosts with work that wait longest between requests (delay, Crawl-delay, back-off), slowest first."""
    slowest = heapq.nlargest(limit, (t for t in turns.values() if t.waiting or t.busy),
                             key=lambda t: (max(base_delay, t.crawl_delay) + t.backoff, t.failures))
    return [{"host": t.host, "delay": round(max(base_delay, t.crawl_delay), 3), "backoff": round(t.backoff, 3),
             "failures": t.failures, "queued": queued(t.host)} for t in slowest]
