"""A node's control endpoint: its routes (status, the dashboard and its cluster picture, Prometheus metrics,
health, stop, join and leave, and steering: settings, scope, pause, resume, seeds), what `/status` and the
dashboard show of this node (`status`, `summary`), and its metrics (docs/operations.md has every route).

`ControlRoutes` is a part of `peer.node.Node`, built with the node (`RoutedNode`: what the routes read of it, as
the parts are made in `Node.run`, and the two requests they make of it, stop and leave).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import trio
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from protocol import CaptureAsk

from peer.cluster.core.cluster import Cluster, ClusterError
from peer.config import Config, ConfigError, parse_address
from peer.control import QueryRoute, Reply, json_reply
from peer.crawl.crawler import Crawler
from peer.crawl.pageworkers import PageWorkers
from peer.crawl.settings import CONFIG_VERSION_FOUNDER, SettingsError
from peer.dashboard import STALL_AFTER, NodeWatch, file_rss_bytes, page, rss_bytes, slow_hosts
from peer.diskguard import DiskGuard
from peer.fetch.dns import CachingResolver
from peer.fetch.policy import HostPolicies
from peer.outputs import CrawlLog, LocalIndex, Uploader, WebhookSender, cdx_body, parse_cdx_query
from peer.outputs.captures import OUTPUTS
from peer.plugins import ItemExporter, PluginError, Plugins, PluginSpec, read_items
from peer.render import RenderPool
from peer.render.metrics import render_families
from peer.stats import Stats, StatsCollector

__all__ = ["MAX_SEEDS_PER_REQUEST", "ControlRoutes", "RoutedNode"]

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


#: Items asked of a node at once, and the most bytes of them (as JSON) one answer carries between peers.
_ITEMS_PAGE = 1000
_ITEMS_BYTES = 600_000


def _specs(entries: Any) -> list[PluginSpec]:
    """The [[plugins]] entries of a reload request ([[use, settings as JSON], ...]) as specs; ValueError."""
    if not isinstance(entries, list):
        raise ValueError("plugins is a list of [use, settings JSON]")
    try:
        return [PluginSpec(str(use), json.loads(settings)) for use, settings in entries]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"plugins is a list of [use, settings JSON] ({exc})") from exc


class RoutedNode(Protocol):
    """What the control routes read of the node (`peer.node.Node` has each): its settings and counters, and its
    parts once `Node.run` has made them (None before, and for a standalone node's cluster)."""

    cfg: Config
    node_id: str
    started_wall: float  # when the node started (wall clock)
    store_releases: int  # times the store's mapped pages were handed back
    stats: Stats
    crawler: Crawler | None
    cluster: Cluster | None
    resolver: CachingResolver | None
    fetch_policies: HostPolicies | None  # per-host HTTP/2, proxies, TLS
    page_workers: PageWorkers | None
    watch: NodeWatch | None
    plugins: Plugins | None  # the plug-in chain, once loaded
    exporter: ItemExporter | None  # the items' export, once started
    data_dir: Path
    uploader: Uploader | None  # --upload, once started
    webhook: WebhookSender | None  # --webhook, once started
    disk: DiskGuard  # the low-disk state (peer/diskguard.py)
    crawl_log: CrawlLog | None  # the crawl log's files and stream, once started
    index: LocalIndex | None  # this node's captures, once its stores are open

    def request_stop(self) -> None: ...

    def request_leave(self) -> None: ...


class ControlRoutes:
    """The control endpoint's routes, and what they show of the node."""

    def __init__(self, node: RoutedNode) -> None:
        self.node = node

    def status(self) -> dict[str, Any]:
        c = self.node.crawler
        assert c is not None
        out: dict[str, Any] = {
            "node_id": self.node.node_id,
            "weight": self.node.cfg.weight,
            "uptime": round(time.time() - self.node.started_wall, 1),
            "done": c.is_done(),
            "queue": {"urls": len(c.frontier), "in_flight": c.frontier.in_flight(),
                      "hosts_waiting": len(c.sched), "hosts_known": len(c.sched.turns),
                      "hosts_parked": c.hosts_parked(), "workers_busy": c.active},
            "seen_urls": len(c.dedup),
            "settings": {"version": c.settings.version, "paused": c.settings.paused},
            "held": sorted(c.holds),
            "disk": self.node.disk.status(),
            "upload": self.node.uploader.status() if self.node.uploader is not None else {"enabled": False},
            "webhook": self.node.webhook.status() if self.node.webhook is not None else {"enabled": False},
            "crawl_log": self.node.crawl_log.status() if self.node.crawl_log is not None else {"enabled": False},
            "revisit": c.revisit_status(),
            "store_resident": {"file_rss": file_rss_bytes(), "limit": self.node.cfg.store_resident_mib << 20,
                               "released": self.node.store_releases},
        }
        out.update(self.node.stats.as_dict())
        workers = self.node.page_workers
        out["page_workers"] = workers.status() if workers is not None else {"processes": 0}
        if self.node.resolver is not None:
            out["dns"] = self.node.resolver.stats.as_dict()
        policies = self.node.fetch_policies
        if policies is not None and policies.proxy_pools():
            now = trio.current_time()
            out["proxies"] = [p for pool in policies.proxy_pools() for p in pool.status(now)]
        out["cluster"] = self.node.cluster.status() if self.node.cluster is not None else {"enabled": False}
        if self.node.cluster is not None:
            out["done"] = out["cluster"]["done"]
        out["plugins"] = self.plugins_status()
        out["detail"] = self.summary()
        out["stall_after"] = STALL_AFTER
        return out

    def plugins_status(self) -> dict[str, Any]:
        """The plug-in chain this node runs, its counts per plug-in, and the items' export."""
        out: dict[str, Any] = {"node_id": self.node.node_id}
        if self.node.plugins is not None:
            out.update(self.node.plugins.status())
        out["items"] = self.node.exporter.status() if self.node.exporter is not None else None
        # nodes that asked to join through this one with a different chain (they refuse themselves)
        out["refused_joins"] = self.node.cluster.plugin_join.refused if self.node.cluster is not None else 0
        # ... and the nodes refused now, with what differs
        out["refused_nodes"] = dict(self.node.cluster.plugin_join.refused_nodes) if self.node.cluster else {}
        return out

    # -- for the whole cluster through this node (peer/cluster/core/controlfan.py) ---------------------------

    async def answer_peer(self, what: str, body: Any) -> Any:
        """A control request a peer passed on (or this node's own part of one): ValueError saying why not."""
        if not isinstance(body, dict):
            raise ValueError(f"a {what} request's body is a JSON object")
        if what == "plugins":
            return self.plugins_status()
        if what == "items":
            return await self._items(int(body.get("offset", 0)), int(body.get("limit", _ITEMS_PAGE)))
        plugins = self.node.plugins
        if plugins is None:
            raise ValueError("the plug-ins are not loaded yet")
        token = str(body.get("token", ""))
        if what == "reload-prepare":
            try:
                chain = plugins.prepare(token, _specs(body.get("plugins")))
            except PluginError as exc:
                raise ValueError(str(exc)) from exc
            return {"fingerprint": chain.fingerprint}
        if what == "reload-commit":
            try:
                plugins.commit(token)
            except KeyError as exc:
                raise ValueError(f"nothing prepared to commit: {exc}") from exc
            self._chain_changed()
            return self.plugins_status()
        if what == "reload-abort":
            if plugins.abort(token):
                self._chain_changed()
            return self.plugins_status()
        raise ValueError(f"unknown control request {what!r}")

    def _chain_changed(self) -> None:
        plugins, exporter = self.node.plugins, self.node.exporter
        if exporter is not None and plugins is not None:
            exporter.sinks = exporter.sinks[:1] + plugins.chain.sinks

    async def _items(self, offset: int, limit: int) -> dict[str, Any]:
        """A page of this node's exported items from `offset`: at most `limit`, and no more than fit in one
        peer message as JSON (the page is then shorter; the asker goes on from where it ends)."""
        found = await trio.to_thread.run_sync(functools.partial(
            read_items, self.node.data_dir / "items", offset=offset, limit=max(0, min(limit, 10_000))))
        size, kept = 0, 0
        for item in found:
            size += len(json.dumps(item)) + 2
            if size > _ITEMS_BYTES and kept:
                break
            kept += 1
        return {"node_id": self.node.node_id, "offset": offset, "items": found[:kept],
                "more": kept < len(found) or len(found) == limit}

    async def reload_cluster(self, entries: Any) -> tuple[int, dict[str, Any]]:
        """`peerctl plugins reload`: the new chain on every live member or on none. Every member loads it aside
        first; only when all have does each run it; a member that cannot (a plug-in that does not load, no
        answer) keeps every node on the chain it runs, and the error names the member and the plug-in."""
        specs = _specs(entries)  # ValueError: the request is malformed
        cluster = self.node.cluster
        assert self.node.plugins is not None
        if cluster is None:
            try:
                self.node.plugins.reload(specs)
            except PluginError as exc:
                return 400, {"error": f"{self.node.node_id}: {exc}"}
            self._chain_changed()
            return 200, {"nodes": [self.plugins_status()], "missing": {}}
        token = f"{self.node.node_id}-{time.time_ns()}"
        fan = cluster.control
        prepared = await fan.ask_all("reload-prepare", {"token": token, "plugins": entries})
        if prepared.missing or len({a["fingerprint"] for a in prepared.answers.values()}) > 1:
            await fan.ask_all("reload-abort", {"token": token}, nodes=list(prepared.answers))
            why = "; ".join(f"{node}: {reason}" for node, reason in sorted(prepared.missing.items()))
            return 409, {"error": f"the reload failed, every node keeps the chain it runs: {why or 'the chains loaded differ'}"}
        committed = await fan.ask_all("reload-commit", {"token": token}, nodes=list(prepared.answers))
        if committed.missing:
            await fan.ask_all("reload-abort", {"token": token}, nodes=list(prepared.answers))
            why = "; ".join(f"{node}: {reason}" for node, reason in sorted(committed.missing.items()))
            return 409, {"error": f"the reload failed while the nodes swapped, every node went back to the chain "
                                  f"it ran: {why}"}
        return 200, {"nodes": [committed.answers[n] for n in sorted(committed.answers)], "missing": {}}

    def _metric_families(self) -> Iterator[Any]:
        """The dashboard's figures as Prometheus metrics (deploy/grafana/ draws them)."""
        c = self.node.crawler
        if c is None:
            return
        for name, doc, hits, misses in (
            ("dns_cache", "DNS cache", self.node.resolver.stats.hits if self.node.resolver else 0,
             self.node.resolver.stats.misses if self.node.resolver else 0),
            ("robots_cache", "robots.txt cache", c.robots.hits, c.robots.misses),
        ):
            yield CounterMetricFamily(f"peercrawl_{name}_hits", f"{doc} look-ups answered from the cache", value=hits)
            yield CounterMetricFamily(f"peercrawl_{name}_misses", f"{doc} look-ups not in the cache", value=misses)
        yield from self._upload_families()
        if isinstance(c.renderer, RenderPool):
            yield from render_families(c.renderer, self.node.stats.render)
        disk = self.node.disk
        yield GaugeMetricFamily("peercrawl_disk_free_bytes", "Free bytes on the data directory's filesystem",
                                value=disk.free)
        yield GaugeMetricFamily("peercrawl_disk_low", "1 while the disk is low: no new fetch, no new URL admitted",
                                value=1 if disk.low else 0)
        if self.node.watch is not None:
            yield GaugeMetricFamily("peercrawl_seconds_since_last_page", "Seconds since a page last came in",
                                    value=self.node.watch.idle_for(trio.current_time()))
        cluster = self.node.cluster
        if cluster is None:
            return
        sent = CounterMetricFamily("peercrawl_urls_sent", "URLs sent to each peer (their owner)", labels=["peer"])
        for peer, n in sorted(self.sent().items()):
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

    def sent(self) -> dict[str, int]:
        return dict(self.node.cluster.dispatcher.stats.urls_sent) if self.node.cluster is not None else {}

    def _upload_families(self) -> Iterator[Any]:
        """--upload's, --webhook's and the crawl log's figures: what waits, what went, and whether the receiver
        takes it now."""
        if self.node.crawl_log is not None:
            c = self.node.crawl_log.status()
            families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
                "waiting": GaugeMetricFamily("peercrawl_crawl_log_waiting",
                                             "Crawl-log records a reader has not handed on yet", labels=["reader"]),
                "lag": GaugeMetricFamily("peercrawl_crawl_log_lag_seconds",
                                         "Age of the oldest crawl-log record a reader has not handed on",
                                         labels=["reader"]),
                "handed_on": CounterMetricFamily("peercrawl_crawl_log_records",
                                                 "Crawl-log records handed on since the start", labels=["reader"]),
                "failures": CounterMetricFamily("peercrawl_crawl_log_failures", "Failed crawl-log hand-ons",
                                                labels=["reader"]),
                "ok": GaugeMetricFamily("peercrawl_crawl_log_ok", "1 when a reader's last hand-on worked, 0 while "
                                        "they fail", labels=["reader"]),
            }
            for reader, r in sorted(c["readers"].items()):
                for name, family in families.items():
                    family.add_metric([reader], float(r[name]))
            yield from families.values()
            yield GaugeMetricFamily("peercrawl_crawl_log_spooled", "Crawl-log records in the node's spool",
                                    value=c["spooled"])
            yield CounterMetricFamily("peercrawl_crawl_log_dropped",
                                      "Crawl-log records dropped because the spool was full", value=c["dropped"])
        if self.node.webhook is not None:
            w = self.node.webhook.status()
            yield GaugeMetricFamily("peercrawl_webhook_waiting", "Webhook notices not yet accepted", value=w["waiting"])
            yield CounterMetricFamily("peercrawl_webhook_sent", "Webhook notices accepted", value=w["sent"])
            yield CounterMetricFamily("peercrawl_webhook_failures", "Failed webhook tries", value=w["failures"])
            yield GaugeMetricFamily("peercrawl_webhook_ok", "1 when the last webhook try was accepted, 0 while they fail",
                                    value=1 if w["ok"] else 0)
        if self.node.uploader is None:
            return
        u = self.node.uploader.status()
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

    def summary(self) -> dict[str, Any]:
        """This node as the dashboard shows it (peers send theirs as a StatusReport: peer/cluster/core/report.py)."""
        c = self.node.crawler
        assert c is not None
        now = trio.current_time()
        watch = self.node.watch
        window, recent = watch.sent_recent(now) if watch is not None else (0.0, {})
        turns = c.sched.turns
        dns = self.node.resolver.stats if self.node.resolver is not None else None
        return {
            "pages": self.node.stats.pages,
            "bytes": self.node.stats.bytes,
            "queued": len(c.frontier),
            "in_flight": c.frontier.in_flight(),
            "hosts_queued": sum(1 for t in turns.values() if t.waiting or t.busy),
            "hosts_known": len(turns),
            "rss": rss_bytes(),
            "idle_for": round(watch.idle_for(now), 1) if watch is not None else 0.0,
            "errors": dict(self.node.stats.errors),
            "dns": {"hits": dns.hits if dns else 0, "misses": dns.misses if dns else 0},
            "robots": {"hits": c.robots.hits, "misses": c.robots.misses},
            "history": watch.history() if watch is not None else [],
            "window": round(window, 2),
            "sent": self.sent(),
            "sent_recent": recent,
            "slow_hosts": slow_hosts(turns, c.frontier.queued, self.node.cfg.delay),
            "transfers": self.node.cluster.transfers() if self.node.cluster is not None else [],
            "upload": self.node.uploader.status() if self.node.uploader is not None else None,
            "webhook": self.node.webhook.status() if self.node.webhook is not None else None,
            "disk": self.node.disk.status(),
            "outputs": self.outputs(),
            "plugins_off": ([{"use": use, "reason": why} for use, why in self.node.plugins.switched_off()]
                            if self.node.plugins is not None else []),
        }

    def outputs(self) -> list[dict[str, Any]]:
        """Each output of this node in one form (the `OutputState` its peers receive): what waits, how late,
        what went, and whether its receiver takes it now."""
        out = []
        if self.node.uploader is not None:
            u = self.node.uploader.status()
            out.append({"kind": "upload", "target": u["target"], "ok": u["ok"], "error": u["error"] or "",
                        "failing_for": u["failing_for"], "waiting": u["queued_files"], "waiting_bytes": u["queued_bytes"],
                        "lag": u["lag"], "done": u["uploaded_files"], "failures": u["failures"], "dropped": u["lost_files"],
                        "paused": u["fetching_paused"]})
        if self.node.webhook is not None:
            w = self.node.webhook.status()
            out.append({"kind": "webhook", "target": w["url"], "ok": w["ok"], "error": w.get("error") or "",
                        "failing_for": w.get("failing_for", 0.0), "waiting": w["waiting"], "waiting_bytes": 0,
                        "lag": 0.0, "done": w["sent"], "failures": w["failures"], "dropped": 0, "paused": False})
        if self.node.crawl_log is not None:
            c = self.node.crawl_log.status()
            for reader, r in c["readers"].items():
                out.append({"kind": "crawl-log" if reader == "file" else "crawl-log-stream", "target": r["target"],
                            "ok": r["ok"], "error": r["error"] or "", "failing_for": r["failing_for"],
                            "waiting": r["waiting"], "waiting_bytes": 0, "lag": r["lag"], "done": r["handed_on"],
                            "failures": r["failures"], "dropped": c["dropped"], "paused": False})
        return out

    def routes(self) -> dict[tuple[str, str], Any]:
        registry = CollectorRegistry(auto_describe=True)
        registry.register(StatsCollector(self.node.stats, lambda: self.node.crawler.gauges() if self.node.crawler else {},
                                         self._metric_families))
        ProcessCollector(registry=registry)  # process_resident_memory_bytes, CPU seconds, open files

        async def status(_body: bytes) -> Reply:
            return json_reply(self.status())

        async def dashboard(_body: bytes) -> Reply:
            return Reply(content_type="text/html; charset=utf-8", body=page(), headers=_PAGE_HEADERS)

        async def metrics(_body: bytes) -> Reply:
            return Reply(content_type="text/plain; version=0.0.4; charset=utf-8", body=generate_latest(registry))

        async def cdx(query: str) -> Reply:
            """pywb's CDX server API for the whole cluster: every live member's captures, merged."""
            try:
                look, output = parse_cdx_query(query)
            except ValueError as exc:
                return json_reply({"error": str(exc)}, status=400)
            if self.node.cluster is not None:
                found = await self.node.cluster.captures.lookup(**look)
            else:
                assert self.node.index is not None
                lines = await self.node.index.captures(CaptureAsk(seq=0, **look))
                found = {"lines": lines[: look["limit"]], "missing": {}, "more": len(lines) > look["limit"]}
            headers = [("x-peercrawl-nodes-missing", ", ".join(f"{peer} ({why})" for peer, why in
                                                              sorted(found["missing"].items())))] if found["missing"] else []
            if found["more"]:
                headers.append(("x-peercrawl-more", "1"))
            return Reply(content_type=OUTPUTS[output], body=cdx_body(found["lines"], output), headers=tuple(headers))

        async def health(_body: bytes) -> Reply:
            return json_reply({"ok": True, "node_id": self.node.node_id})

        async def stop(_body: bytes) -> Reply:
            self.node.request_stop()
            return json_reply({"stopping": True})

        def no_cluster() -> Reply:
            return json_reply({"error": "this node runs standalone (no cluster secret)"}, status=409)

        async def cluster(_body: bytes) -> Reply:
            if self.node.cluster is None:
                return no_cluster()
            self.node.cluster.watched()  # peers send their detailed status while someone looks
            out = self.node.cluster.cluster_status(detail=True)
            out["stall_after"] = STALL_AFTER
            return json_reply(out)

        async def join(body: bytes) -> Reply:
            if self.node.cluster is None:
                return no_cluster()
            try:
                seed = str(json.loads(body or b"{}")["seed"])
                parse_address(seed, "seed")
            except (ValueError, KeyError, TypeError, ConfigError) as exc:
                return json_reply({"error": f"expected a JSON body {{\"seed\": \"HOST:PORT\"}} ({exc})"}, status=400)
            try:
                await self.node.cluster.join([seed])
            except ClusterError as exc:
                return json_reply({"error": str(exc)}, status=502)
            return json_reply({"joined": seed, "members": len(self.node.cluster.view.members),
                               "epoch": self.node.cluster.epoch})

        def json_body(body: bytes) -> Any:
            try:
                return json.loads(body or b"{}")
            except ValueError as exc:
                raise SettingsError(f"the request body is not JSON: {exc}") from exc

        def change(changes: Any) -> Reply:
            crawler = self.node.crawler
            assert crawler is not None
            try:
                current = crawler.settings
                new = current.changed(changes, version=max(current.version, CONFIG_VERSION_FOUNDER) + 1,
                                      origin=self.node.node_id)
            except SettingsError as exc:
                return json_reply({"error": str(exc)}, status=400)
            if new.body() != current.body():  # the same rules again change nothing (and no version)
                crawler.adopt(new)
            shared = self.node.cluster.share_settings() if self.node.cluster is not None else 0
            return json_reply({"settings": crawler.settings.as_dict(), "peers_told": shared})

        async def settings(_body: bytes) -> Reply:
            assert self.node.crawler is not None
            return json_reply({"settings": self.node.crawler.settings.as_dict()})

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
            assert self.node.crawler is not None
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
            if not self.node.disk.admitting():
                return json_reply({"error": "disk low: no new URL is admitted until space returns",
                                   "disk": self.node.disk.status()}, status=507)
            report = self.node.crawler.add_seeds(urls)
            return json_reply(report.as_dict())

        async def leave(_body: bytes) -> Reply:
            if self.node.cluster is None:
                return no_cluster()
            self.node.request_leave()
            return json_reply({"leaving": True})

        async def plugins(_body: bytes) -> Reply:
            return json_reply(self.plugins_status())

        async def plugins_reload(body: bytes) -> Reply:
            try:
                specs = _specs(json_body(body).get("plugins"))
            except (SettingsError, AttributeError, ValueError) as exc:
                return json_reply({"error": f"expected a JSON body {{\"plugins\": [[use, settings JSON], ...]}} "
                                            f"({exc})"}, status=400)
            assert self.node.plugins is not None
            try:
                self.node.plugins.reload(specs)
            except PluginError as exc:
                return json_reply({"error": str(exc)}, status=400)
            self._chain_changed()
            return json_reply(self.plugins_status())

        async def cluster_plugins(_body: bytes) -> Reply:
            if self.node.cluster is None:
                return json_reply({"nodes": [self.plugins_status()], "missing": {}})
            fan = await self.node.cluster.control.ask_all("plugins", {})
            return json_reply({"nodes": [fan.answers[n] for n in sorted(fan.answers)], "missing": fan.missing})

        async def cluster_reload(body: bytes) -> Reply:
            try:
                status, answer = await self.reload_cluster(json_body(body).get("plugins"))
            except (SettingsError, AttributeError, ValueError) as exc:
                return json_reply({"error": f"expected a JSON body {{\"plugins\": [[use, settings JSON], ...]}} "
                                            f"({exc})"}, status=400)
            return json_reply(answer, status=status)

        async def cluster_items(body: bytes) -> Reply:
            try:
                ask = json_body(body)
                offsets = {str(k): int(v) for k, v in (ask.get("offsets") or {}).items()}
                nodes = ask.get("nodes")
                limit = int(ask.get("limit", _ITEMS_PAGE))
                if nodes is not None and not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
                    raise ValueError("nodes is a list of node ids")
            except (SettingsError, AttributeError, TypeError, ValueError) as exc:
                return json_reply({"error": f"expected a JSON body {{\"offsets\": {{node: N}}, \"nodes\": [node, ...], "
                                            f"\"limit\": N}} ({exc})"}, status=400)
            if self.node.cluster is None:
                page = await self._items(offsets.get(self.node.node_id, 0), limit)
                return json_reply({"pages": {self.node.node_id: page}, "missing": {}})
            fan = await self.node.cluster.control.ask_all(
                "items", lambda node: {"offset": offsets.get(node, 0), "limit": limit}, nodes=nodes)
            return json_reply({"pages": fan.answers, "missing": fan.missing})

        async def items(body: bytes) -> Reply:
            try:
                ask = json_body(body)
                offset, limit = int(ask.get("offset", 0)), min(int(ask.get("limit", 1000)), 10_000)
            except (SettingsError, AttributeError, TypeError, ValueError) as exc:
                return json_reply({"error": f"expected a JSON body {{\"offset\": N, \"limit\": N}} ({exc})"},
                                  status=400)
            found = await trio.to_thread.run_sync(
                functools.partial(read_items, self.node.data_dir / "items", offset=offset, limit=limit))
            return json_reply({"node_id": self.node.node_id, "offset": offset, "items": found})

        return {
            ("GET", "/plugins"): plugins,
            ("POST", "/plugins/reload"): plugins_reload,
            ("GET", "/cluster/plugins"): cluster_plugins,
            ("POST", "/cluster/plugins/reload"): cluster_reload,
            ("POST", "/cluster/items"): cluster_items,
            ("POST", "/items"): items,
            ("GET", "/"): dashboard,
            ("GET", "/cluster"): cluster,
            ("POST", "/join"): join,
            ("POST", "/leave"): leave,
            ("GET", "/status"): status,
            ("GET", "/cdx"): QueryRoute(cdx),
            ("GET", "/metrics"): metrics,
            ("GET", "/healthz"): health,
            ("POST", "/stop"): stop,
            ("GET", "/settings"): settings,
            ("POST", "/scope"): scope,
            ("POST", "/pause"): pause,
            ("POST", "/resume"): resume,
            ("POST", "/seed"): seed,
        }
