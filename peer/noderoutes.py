"""A node's control endpoint: its routes (status, the dashboard and its cluster picture, Prometheus metrics,
health, stop, join and leave, and steering: settings, scope, pause, resume, seeds), what `/status` and the
dashboard show of this node (`status`, `summary`), and its metrics (docs/operations.md has every route).

A mixin of `peer.node.Node`: it works on the node's attributes, set in `Node.__init__` and `Node.run`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import trio
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from peer.cluster.cluster import ClusterError
from peer.config import ConfigError, parse_address
from peer.control import Reply, json_reply
from peer.crawl.settings import CONFIG_VERSION_FOUNDER, SettingsError
from peer.dashboard import STALL_AFTER, file_rss_bytes, page, rss_bytes, slow_hosts
from peer.stats import StatsCollector

__all__ = ["MAX_SEEDS_PER_REQUEST", "ControlRoutes"]

#: Seeds per POST /seed (the body is at most 1 MiB; `peerctl seed --file` sends a long list in parts).
MAX_SEEDS_PER_REQUEST = 5_000

#: The dashboard page may run its own inline script and style and talk to this node only.
_PAGE_HEADERS = (
    ("content-security-policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                                "frame-ancestors 'none'"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
)


class ControlRoutes:
    """The control endpoint's routes, and what they show of the node."""

    # -------------------------------------------------------------- control routes

    def status(self) -> dict[str, Any]:
        c = self.crawler
        assert c is not None
        out: dict[str, Any] = {
            "node_id": self.node_id,
            "weight": self.cfg.weight,
            "uptime": round(time.time() - self.started_wall, 1),
            "done": c.is_done(),
            "queue": {"urls": len(c.frontier), "in_flight": c.frontier.in_flight(),
                      "hosts_waiting": len(c.sched), "hosts_known": len(c.sched.turns),
                      "workers_busy": c.active},
            "seen_urls": len(c.dedup),
            "settings": {"version": c.settings.version, "paused": c.settings.paused},
            "held": sorted(c.holds),
            "upload": self.uploader.status() if self.uploader is not None else {"enabled": False},
            "webhook": self.webhook.status() if self.webhook is not None else {"enabled": False},
            "revisit": c.revisit_status(),
            "store_resident": {"file_rss": file_rss_bytes(), "limit": self.cfg.store_resident_mib << 20,
                               "released": self.store_releases},
        }
        out.update(self.stats.as_dict())
        workers = self.page_workers
        out["page_workers"] = workers.status() if workers is not None else {"processes": 0}
        if self.resolver is not None:
            out["dns"] = self.resolver.stats.as_dict()
        out["cluster"] = self.cluster.status() if self.cluster is not None else {"enabled": False}
        if self.cluster is not None:
            out["done"] = out["cluster"]["done"]
        out["detail"] = self.summary()
        out["stall_after"] = STALL_AFTER
        return out

    def _metric_families(self) -> Iterator[Any]:
        """The dashboard's figures as Prometheus metrics (deploy/grafana/ draws them)."""
        c = self.crawler
        if c is None:
            return
        for name, doc, hits, misses in (
            ("dns_cache", "DNS cache", self.resolver.stats.hits if self.resolver else 0,
             self.resolver.stats.misses if self.resolver else 0),
            ("robots_cache", "robots.txt cache", c.robots.hits, c.robots.misses),
        ):
            yield CounterMetricFamily(f"peercrawl_{name}_hits", f"{doc} look-ups answered from the cache", value=hits)
            yield CounterMetricFamily(f"peercrawl_{name}_misses", f"{doc} look-ups not in the cache", value=misses)
        yield from self._upload_families()
        if self.watch is not None:
            yield GaugeMetricFamily("peercrawl_seconds_since_last_page", "Seconds since a page last came in",
                                    value=self.watch.idle_for(trio.current_time()))
        cluster = self.cluster
        if cluster is None:
            return
        sent = CounterMetricFamily("peercrawl_urls_sent", "URLs sent to each peer (their owner)", labels=["peer"])
        for peer, n in sorted(self._sent().items()):
            sent.add_metric([peer], n)
        yield sent
        yield GaugeMetricFamily("peercrawl_handoff_outstanding", "Hand-off chunks not yet acknowledged",
                                value=cluster.handoff.outstanding())
        yield GaugeMetricFamily("peercrawl_handoff_pending_arcs", "Gained arcs waiting for their hand-off",
                                value=cluster.handoff.pending_count())
        key = GaugeMetricFamily("peercrawl_ring_key_share", "Each member's share of the ring's key space",
                                labels=["node"])
        weight = GaugeMetricFamily("peercrawl_ring_weight_share", "Each member's share of the weight", labels=["node"])
        member = GaugeMetricFamily("peercrawl_member", "1 for each member's state in this node's view",
                                   labels=["node", "state"])
        shares = cluster.shares()
        for m in cluster.view.members:
            ks, ws = shares.get(m.node_id, (0.0, 0.0))
            key.add_metric([m.node_id], ks)
            weight.add_metric([m.node_id], ws)
            member.add_metric([m.node_id, m.state.value], 1)
        yield key
        yield weight
        yield member

    def _upload_families(self) -> Iterator[Any]:
        """--upload's and --webhook's figures: what waits, what went, and whether the receiver takes it now."""
        if self.webhook is not None:
            w = self.webhook.status()
            yield GaugeMetricFamily("peercrawl_webhook_waiting", "Webhook notices not yet accepted", value=w["waiting"])
            yield CounterMetricFamily("peercrawl_webhook_sent", "Webhook notices accepted", value=w["sent"])
            yield CounterMetricFamily("peercrawl_webhook_failures", "Failed webhook tries", value=w["failures"])
            yield GaugeMetricFamily("peercrawl_webhook_ok", "1 when the last webhook try was accepted, 0 while they fail",
                                    value=1 if w["ok"] else 0)
        if self.uploader is None:
            return
        u = self.uploader.status()
        yield GaugeMetricFamily("peercrawl_upload_queued_files", "Closed WARC and CDXJ files waiting for upload",
                                value=u["queued_files"])
        yield GaugeMetricFamily("peercrawl_upload_queued_bytes", "Bytes of the files waiting for upload",
                                value=u["queued_bytes"])
        yield GaugeMetricFamily("peercrawl_upload_lag_seconds", "Age of the oldest file waiting for upload",
                                value=u["lag"])
        yield CounterMetricFamily("peercrawl_uploaded_files", "Files uploaded and verified", value=u["uploaded_files"])
        yield CounterMetricFamily("peercrawl_uploaded_bytes", "Bytes uploaded and verified", value=u["uploaded_bytes"])
        yield CounterMetricFamily("peercrawl_upload_failures", "Failed upload tries", value=u["failures"])
        yield GaugeMetricFamily("peercrawl_upload_ok", "1 when the last upload try worked, 0 while they fail",
                                value=1 if u["ok"] else 0)
        yield GaugeMetricFamily("peercrawl_upload_fetching_paused",
                                "1 while fetching waits for the upload queue to drain under its bound",
                                value=1 if u["fetching_paused"] else 0)

    def _sent(self) -> dict[str, int]:
        return dict(self.cluster.dispatcher.stats.urls_sent) if self.cluster is not None else {}

    def summary(self) -> dict[str, Any]:
        """This node as the dashboard shows it (peers send theirs as a StatusReport: peer/cluster.py)."""
        c = self.crawler
        assert c is not None
        now = trio.current_time()
        watch = self.watch
        window, recent = watch.sent_recent(now) if watch is not None else (0.0, {})
        turns = c.sched.turns
        dns = self.resolver.stats if self.resolver is not None else None
        return {
            "pages": self.stats.pages,
            "bytes": self.stats.bytes,
            "queued": len(c.frontier),
            "in_flight": c.frontier.in_flight(),
            "hosts_queued": sum(1 for t in turns.values() if t.waiting or t.busy),
            "hosts_known": len(turns),
            "rss": rss_bytes(),
            "idle_for": round(watch.idle_for(now), 1) if watch is not None else 0.0,
            "errors": dict(self.stats.errors),
            "dns": {"hits": dns.hits if dns else 0, "misses": dns.misses if dns else 0},
            "robots": {"hits": c.robots.hits, "misses": c.robots.misses},
            "history": watch.history() if watch is not None else [],
            "window": round(window, 2),
            "sent": self._sent(),
            "sent_recent": recent,
            "slow_hosts": slow_hosts(turns, c.frontier.queued, self.cfg.delay),
            "transfers": self.cluster.transfers() if self.cluster is not None else [],
            "upload": self.uploader.status() if self.uploader is not None else None,
            "webhook": self.webhook.status() if self.webhook is not None else None,
        }

    def _routes(self):
        registry = CollectorRegistry(auto_describe=True)
        registry.register(StatsCollector(self.stats, lambda: self.crawler.gauges() if self.crawler else {},
                                         self._metric_families))
        ProcessCollector(registry=registry)  # process_resident_memory_bytes, CPU seconds, open files

        async def status(_body: bytes) -> Reply:
            return json_reply(self.status())

        async def dashboard(_body: bytes) -> Reply:
            return Reply(content_type="text/html; charset=utf-8", body=page(), headers=_PAGE_HEADERS)

        async def metrics(_body: bytes) -> Reply:
            return Reply(content_type="text/plain; version=0.0.4; charset=utf-8", body=generate_latest(registry))

        async def health(_body: bytes) -> Reply:
            return json_reply({"ok": True, "node_id": self.node_id})

        async def stop(_body: bytes) -> Reply:
            self.request_stop()
            return json_reply({"stopping": True})

        def no_cluster() -> Reply:
            return json_reply({"error": "this node runs standalone (no cluster secret)"}, status=409)

        async def cluster(_body: bytes) -> Reply:
            if self.cluster is None:
                return no_cluster()
            self.cluster.watched()  # peers send their detailed status while someone looks
            out = self.cluster.cluster_status(detail=True)
            out["stall_after"] = STALL_AFTER
            return json_reply(out)

        async def join(body: bytes) -> Reply:
            if self.cluster is None:
                return no_cluster()
            try:
                seed = str(json.loads(body or b"{}")["seed"])
                parse_address(seed, "seed")
            except (ValueError, KeyError, TypeError, ConfigError) as exc:
                return json_reply({"error": f"expected a JSON body {{\"seed\": \"HOST:PORT\"}} ({exc})"}, status=400)
            try:
                await self.cluster.join([seed])
            except ClusterError as exc:
                return json_reply({"error": str(exc)}, status=502)
            return json_reply({"joined": seed, "members": len(self.cluster.view.members),
                               "epoch": self.cluster.epoch})

        def json_body(body: bytes) -> Any:
            try:
                return json.loads(body or b"{}")
            except ValueError as exc:
                raise SettingsError(f"the request body is not JSON: {exc}") from exc

        def change(changes: Any) -> Reply:
            crawler = self.crawler
            assert crawler is not None
            try:
                current = crawler.settings
                new = current.changed(changes, version=max(current.version, CONFIG_VERSION_FOUNDER) + 1,
                                      origin=self.node_id)
            except SettingsError as exc:
                return json_reply({"error": str(exc)}, status=400)
            if new.body() != current.body():  # the same rules again change nothing (and no version)
                crawler.adopt(new)
            shared = self.cluster.share_settings() if self.cluster is not None else 0
            return json_reply({"settings": crawler.settings.as_dict(), "peers_told": shared})

        async def settings(_body: bytes) -> Reply:
            assert self.crawler is not None
            return json_reply({"settings": self.crawler.settings.as_dict()})

        async def scope(body: bytes) -> Reply:
            try:
                changes = json_body(body)
            except SettingsError as exc:
                return json_reply({"error": str(exc)}, status=400)
            if isinstance(changes, dict) and "paused" in changes:
                return json_reply({"error": "paused is changed by POST /pause and POST /resume"}, status=400)
            return change(changes)

        async def pause(_body: bytes) -> Reply:
            return change({"paused": True})

        async def resume(_body: bytes) -> Reply:
            return change({"paused": False})

        async def seed(body: bytes) -> Reply:
            assert self.crawler is not None
            try:
                urls = json_body(body).get("urls")
                if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                    raise SettingsError("expected \"urls\": a list of strings")
            except (SettingsError, AttributeError) as exc:
                return json_reply({"error": f"expected a JSON body {{\"urls\": [\"URL\", ...]}} ({exc})"},
                                  status=400)
            if len(urls) > MAX_SEEDS_PER_REQUEST:
                return json_reply({"error": f"at most {MAX_SEEDS_PER_REQUEST} URLs per request, got {len(urls)}"},
                                  status=413)
            report = self.crawler.add_seeds(urls)
            return json_reply(report.as_dict())

        async def leave(_body: bytes) -> Reply:
            if self.cluster is None:
                return no_cluster()
            if not self._leave.is_set():
                self._leave.set()
            return json_reply({"leaving": True})

        return {
            ("GET", "/"): dashboard,
            ("GET", "/cluster"): cluster,
            ("POST", "/join"): join,
            ("POST", "/leave"): leave,
            ("GET", "/status"): status,
            ("GET", "/metrics"): metrics,
            ("GET", "/healthz"): health,
            ("POST", "/stop"): stop,
            ("GET", "/settings"): settings,
            ("POST", "/scope"): scope,
            ("POST", "/pause"): pause,
            ("POST", "/resume"): resume,
            ("POST", "/seed"): seed,
        }
