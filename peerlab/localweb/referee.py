"""The server's request log and the referees that read it: politeness is judged by what the web saw.

A crawler can claim anything about itself; the log of the web it crawled cannot lie. Tests read it to
check that no host had two connections busy at once, that Crawl-delay held between requests to a host,
and that no URL the oracle forbids was ever requested.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .model import make_url

if TYPE_CHECKING:
    from .graph import SiteGraph

__all__ = [
    "CrawlDelayViolation",
    "RequestRecord",
    "crawl_delay_violations",
    "max_concurrent_connections_per_host",
    "read_log",
    "requested_paths",
    "requested_urls",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """One request the server answered. ``start``/``end`` are trio times (when the request head was
    read, when the last byte was sent or the client went away); ``wall_*`` are Unix times."""

    host: str
    path: str
    status: int
    conn_id: int
    start: float
    end: float
    wall_start: float
    wall_end: float
    user_agent: str
    bytes_sent: int
    address: str = ""  # the server address the request came in on (several with `serve_web(addresses=...)`)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        return cls(**json.loads(line))


@dataclass(frozen=True, slots=True, kw_only=True)
class CrawlDelayViolation:
    """Two consecutive requests to ``host`` whose starts were ``gap`` seconds apart, under ``delay``."""

    host: str
    delay: float
    gap: float
    first: RequestRecord
    second: RequestRecord


def read_log(path: str | Path) -> list[RequestRecord]:
    """Records from a JSON-lines log written by ``python -m peerlab.localweb.server --log FILE``.

    A last line cut short (the server was killed mid-write) is ignored.
    """
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            records.append(RequestRecord.from_json(line))
        except (ValueError, TypeError):
            continue
    return records


def requested_paths(log: Iterable[RequestRecord]) -> set[tuple[str, str]]:
    """Every (host, path-and-query) that was requested at least once."""
    return {(r.host, r.path) for r in log}


def requested_urls(log: Iterable[RequestRecord], *, port: int | None = None) -> Counter[str]:
    """How many times each URL was requested, written like the oracle's URLs."""
    return Counter(make_url(r.host, r.path, port) for r in log)


def max_in_service_per_address(log: Iterable[RequestRecord], *, slack: float = 0.0) -> dict[str, int]:
    """The most requests in service at one moment on one server address, per address (as
    `max_concurrent_connections_per_host`, keyed by the address the server answered on). ``slack`` takes that
    much off each end: the server stamps an end when its task runs again after the last byte went to the
    kernel, which under load can be a fraction of a millisecond after the client read it and sent its next
    request."""
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in log:
        events[r.address].append((r.start, 1))
        events[r.address].append((max(r.start, r.end - slack), 0))
    result = {}
    for address, evs in events.items():
        evs.sort()  # at equal times, ends (0) come before starts (1)
        active = best = 0
        for _, is_start in evs:
            active += 1 if is_start else -1
            best = max(best, active)
        result[address] = best
    return result


def address_gaps(log: Iterable[RequestRecord]) -> dict[str, float]:
    """Per address, the shortest time from the end of a request to the start of the next one to start
    (negative when they overlapped); an address with one request is left out."""
    by_address: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in log:
        by_address[r.address].append(r)
    result: dict[str, float] = {}
    for address, records in by_address.items():
        records.sort(key=lambda r: r.start)
        last_end = records[0].end
        for r in records[1:]:
            gap = r.start - last_end
            result[address] = min(result.get(address, gap), gap)
            last_end = max(last_end, r.end)
    return result


def max_concurrent_connections_per_host(log: Iterable[RequestRecord]) -> dict[str, int]:
    """The most connections that had a request in progress to one host at the same moment, per host.

    Intervals are closed at the start and open at the end: a request that begins exactly when the
    previous one ended does not overlap it.
    """
    events: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    for r in log:
        events[r.host].append((r.start, 1, r.conn_id))
        events[r.host].append((r.end, 0, r.conn_id))
    result = {}
    for host, evs in events.items():
        evs.sort()  # at equal times, ends (0) come before starts (1)
        active: Counter[int] = Counter()
        best = 0
        for _, is_start, conn in evs:
            if is_start:
                active[conn] += 1
                best = max(best, len(active))
            else:
                active[conn] -= 1
                if active[conn] <= 0:
                    del active[conn]
        result[host] = best
    return result


def crawl_delay_violations(
    log: Sequence[RequestRecord],
    graph: SiteGraph,
    *,
    user_agent: str = "peercrawl",
    tolerance: float = 0.05,
    include_robots: bool = False,
) -> list[CrawlDelayViolation]:
    """Consecutive requests to a host with a Crawl-delay (for ``user_agent``) that started closer
    together than the delay minus ``tolerance`` seconds.

    robots.txt requests are left out unless ``include_robots``: a crawler learns the delay from them.
    """
    by_host: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in log:
        if include_robots or not _is_robots(graph, r):
            by_host[r.host].append(r)
    violations = []
    for host, records in sorted(by_host.items()):
        delay = graph.crawl_delay(host, user_agent)
        if delay is None:
            continue
        records.sort(key=lambda r: r.start)
        for first, second in itertools.pairwise(records):
            gap = second.start - first.start
            if gap < delay - tolerance:
                violations.append(CrawlDelayViolation(host=host, delay=delay, gap=gap, first=first, second=second))
    return violations


def _is_robots(graph: SiteGraph, record: RequestRecord) -> bool:
    if record.path == "/robots.txt":
        return True
    spec = graph.robots(record.host)
    return spec is not None and spec.redirect_path == record.path
