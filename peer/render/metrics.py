"""The render pool's figures as Prometheus metric families, built at scrape time from the pool's counters and
the node's render counts (``Stats.render``, which the crawl's renders bump)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from peer.render.pool import RenderPool

__all__ = ["render_families"]


def render_families(pool: RenderPool, counts: Counter[str]) -> Iterator[Metric]:
    """Renders, their failures and time-outs, the browser's restarts and memory, the tabs, and the browser's
    requests by outcome (``served`` or the reason of a refusal, docs/rendering.md)."""
    yield CounterMetricFamily("peercrawl_renders", "Pages rendered in the browser", value=pool.renders)
    failures = CounterMetricFamily("peercrawl_render_failures", "Renders that ended without a DOM, by kind",
                                   labels=["kind"])
    for kind, n in sorted(pool.failures.items()):
        failures.add_metric([kind], n)
    yield failures
    yield CounterMetricFamily("peercrawl_render_timeouts",
                              "Renders whose page was still busy at the time limit (scripts stopped, DOM read)",
                              value=counts["timed-out"])
    restarts = CounterMetricFamily("peercrawl_browser_restarts", "Browser restarts, by reason", labels=["reason"])
    for reason, n in sorted(pool.restarts.items()):
        restarts.add_metric([reason], n)
    yield restarts
    yield GaugeMetricFamily("peercrawl_render_tabs_in_use", "Tabs rendering a page now", value=pool.tabs_in_use)
    yield GaugeMetricFamily("peercrawl_render_tabs_open", "Tabs open: rendering, or kept for the next render",
                            value=pool.tabs_open)
    yield GaugeMetricFamily("peercrawl_browser_memory_bytes",
                            "The browser's memory at its last check (proportional set size of its processes)",
                            value=pool.last_rss)
    yield GaugeMetricFamily("peercrawl_browser_memory_peak_bytes", "The browser's largest memory so far",
                            value=pool.peak_rss)
    requests = CounterMetricFamily("peercrawl_render_requests", "Requests of the browser, by outcome",
                                   labels=["outcome"])
    requests.add_metric(["served"], counts["requests-served"])
    for key, n in sorted(counts.items()):
        if key.startswith("refused-"):
            requests.add_metric([key], n)
    yield requests
