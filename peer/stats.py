"""Counters the crawl engine bumps on its hot path (plain ints: no lock, no label lookup per page) and their
export, both as the ``/status`` JSON and as Prometheus metrics built at scrape time."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["Stats", "StatsCollector"]


class Stats:
    def __init__(self) -> None:
        self.pages = 0  # responses received (any status)
        self.bytes = 0
        self.status: collections.Counter[str] = collections.Counter()  # "2xx", "3xx", ...
        self.errors: collections.Counter[str] = collections.Counter()  # fetch/dns errors by kind
        self.skipped: collections.Counter[str] = collections.Counter()  # scope/robots refusals by reason
        self.links_found = 0
        self.items = 0  # items the plug-ins extracted, spooled with their pages (peer/plugins)
        self.urls_new = 0
        self.urls_seen = 0
        # links for hosts owned elsewhere that this node routed recently, dropped before screening (DESIGN
        # decision 4: a sender may drop URLs it sent recently; the owner's dedup decides the rest)
        self.routed_repeats = 0
        self.robots_fetches = 0
        self.sitemap_fetches = 0  # sitemap requests (any outcome)
        self.sitemap_urls = 0  # URLs the sitemaps read listed (before scope, robots and dedup)
        self.retries = 0
        self.address_waits = 0  # host turns put off because their server address had no free lane
        self.stored = 0
        self.revisits = 0  # revisits fetched (the page was on the schedule)
        self.revisits_changed = 0  # ... that found a new payload (a full record)
        self.revisits_unchanged = 0  # ... that found the same payload or a 304 (a revisit record)
        self.revisits_not_modified = 0  # ... answered 304 to a conditional GET
        self.revisit_bytes = 0  # bytes of revisit records written
        self.revisit_bytes_saved = 0  # bytes the page's last full record would have taken again, minus those
        #: rendering (peer/render): pages rendered, fallen back to their HTML, browser requests served and
        #: refused (by reason), links only the rendered DOM had
        self.render: collections.Counter[str] = collections.Counter()
        self.revisit_lateness: collections.deque[float] = collections.deque(maxlen=10_000)  # fetched - due, s
        # identical payloads across URLs (peer/crawl/payloads.py)
        self.payload_revisits = 0  # pages written as a revisit of a payload stored before under another URL
        self.payload_revisit_bytes = 0  # bytes of those revisit records
        self.payload_bytes_not_stored = 0  # payload bytes those pages did not store again
        self.payload_lookups = 0  # digests looked up before storing a page
        self._samples: collections.deque[tuple[float, int]] = collections.deque(maxlen=64)

    def sample(self, now: float) -> None:
        """Record (time, pages) for the rate; called about once a second."""
        self._samples.append((now, self.pages))

    def rate(self, window: float = 10.0) -> float:
        """Pages per second over roughly the last ``window`` seconds."""
        if len(self._samples) < 2:
            return 0.0
        t1, p1 = self._samples[-1]
        t0, p0 = self._samples[0]
        for t, p in self._samples:
            if t1 - t <= window:
                t0, p0 = t, p
                break
        return (p1 - p0) / (t1 - t0) if t1 > t0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "pages": self.pages,
            "bytes": self.bytes,
            "rate": round(self.rate(), 2),
            "status": dict(self.status),
            "errors": dict(self.errors),
            "skipped": dict(self.skipped),
            "links_found": self.links_found,
            "items": self.items,
            "urls_new": self.urls_new,
            "urls_seen": self.urls_seen,
            "routed_repeats": self.routed_repeats,
            "robots_fetches": self.robots_fetches,
            "sitemap_fetches": self.sitemap_fetches,
            "sitemap_urls": self.sitemap_urls,
            "retries": self.retries,
            "address_waits": self.address_waits,
            "stored": self.stored,
            "revisits": {"fetched": self.revisits, "changed": self.revisits_changed,
                         "unchanged": self.revisits_unchanged, "not_modified": self.revisits_not_modified,
                         "record_bytes": self.revisit_bytes, "bytes_saved": self.revisit_bytes_saved,
                         "late_s": _quantiles(self.revisit_lateness)},
            "payload_revisits": {"records": self.payload_revisits, "record_bytes": self.payload_revisit_bytes,
                                 "payload_bytes_not_stored": self.payload_bytes_not_stored,
                                 "lookups": self.payload_lookups},
            "render": dict(self.render),
        }


def _quantiles(values: collections.deque[float]) -> dict[str, float]:
    """Median, 95th percentile and maximum of the latest values (0 when there are none)."""
    if not values:
        return {"p50": 0.0, "p95": 0.0, "max": 0.0}
    ordered = sorted(values)
    return {"p50": round(ordered[len(ordered) // 2], 3), "p95": round(ordered[int(len(ordered) * 0.95)], 3),
            "max": round(ordered[-1], 3)}


class StatsCollector(Collector):
    """Prometheus view of a node: counters from Stats plus gauges read from ``gauges()`` at scrape time."""

    def __init__(self, stats: Stats, gauges: Callable[[], dict[str, float]],
                 families: Callable[[], Iterable[Any]] | None = None) -> None:
        self._stats = stats
        self._gauges = gauges
        self._families = families  # labelled or computed metric families from the node's other parts

    def collect(self) -> Iterator[Any]:
        s = self._stats
        simple = [
            ("peercrawl_pages", "Responses received", s.pages),
            ("peercrawl_bytes", "Body bytes received", s.bytes),
            ("peercrawl_links_found", "Links extracted from pages", s.links_found),
            ("peercrawl_items", "Items the plug-ins extracted from pages", s.items),
            ("peercrawl_urls_new", "URLs that were new to the dedup store", s.urls_new),
            ("peercrawl_urls_seen", "URLs the dedup store had already seen", s.urls_seen),
            ("peercrawl_routed_repeats", "Links for hosts owned elsewhere dropped as routed recently",
             s.routed_repeats),
            ("peercrawl_robots_fetches", "robots.txt requests", s.robots_fetches),
            ("peercrawl_sitemap_fetches", "sitemap requests", s.sitemap_fetches),
            ("peercrawl_sitemap_urls", "URLs listed by the sitemaps read", s.sitemap_urls),
            ("peercrawl_retries", "URLs re-queued after a transient failure", s.retries),
            ("peercrawl_stored", "Pages written to the page store", s.stored),
            ("peercrawl_revisits", "Revisits of scheduled pages fetched", s.revisits),
            ("peercrawl_revisits_changed", "Revisits that found a changed page (full record)", s.revisits_changed),
            ("peercrawl_revisits_unchanged", "Revisits that found the page unchanged (revisit record)",
             s.revisits_unchanged),
            ("peercrawl_revisits_not_modified", "Revisits answered 304 Not Modified", s.revisits_not_modified),
            ("peercrawl_revisit_bytes_saved", "WARC bytes saved by revisit records", s.revisit_bytes_saved),
            ("peercrawl_payload_revisits", "Pages written as a revisit of a payload stored under another URL",
             s.payload_revisits),
            ("peercrawl_payload_bytes_not_stored", "Payload bytes not stored again (identical payloads)",
             s.payload_bytes_not_stored),
        ]
        for name, doc, value in simple:
            yield CounterMetricFamily(name, doc, value=value)
        for name, doc, label, counter in (
            ("peercrawl_responses", "Responses by status class", "status", s.status),
            ("peercrawl_errors", "Fetch errors by kind", "kind", s.errors),
            ("peercrawl_skipped", "URLs refused by scope or robots, by reason", "reason", s.skipped),
        ):
            fam = CounterMetricFamily(name, doc, labels=[label])
            for key, value in sorted(counter.items()):
                fam.add_metric([key], value)
            yield fam
        for name, gauge in self._gauges().items():
            yield GaugeMetricFamily(f"peercrawl_{name}", name.replace("_", " "), value=gauge)
        if self._families is not None:
            yield from self._families()
