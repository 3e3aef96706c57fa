"""One peercrawl node: opens its data directory and stores, and runs the crawler and control endpoint.

Data directory layout (docs/architecture.md has the full picture)::

    DIR/LOCK          flock held while a node runs: two processes never share one store
    DIR/NODE_ID       the node id this directory belongs to (a directory is never reused for another id)
    DIR/control.addr  HOST:PORT of the running node's control endpoint, for peerctl --data-dir
    DIR/control.token the control endpoint's bearer token (mode 0600), for peerctl and the dashboard link
    DIR/dropped-urls.jsonl  URLs given up because the node stopped while fetching them max_crashes times in a row
    DIR/items/items.jsonl   the items the plug-ins extracted, moved there from the store (peer/plugins/_sink.py)
    DIR/peer.addr     HOST:PORT peers dial (cluster nodes only), for --join and peerctl join --seed
    DIR/RUNNING       written before the stores open, removed after they close: found at a start, the last run did
                      not stop cleanly and the stores are read through in a child process first (storage/_check.py)
    DIR/settings.json the crawl settings last changed at runtime (scope, budgets, paused), kept over restarts
    DIR/state/        one LMDB environment: seen URLs, queued URLs, in-flight records, per-host politeness,
                      the items extracted and not yet exported, the upload queue and the record of uploaded files
    DIR/warc/         WARC files and their CDXJ indexes
"""

from __future__ import annotations

import fcntl
import functools
import gc
import importlib.util
import ipaddress
import json
import logging
import os
import resource
import signal
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any, NoReturn

import trio

from storage import (
    PageStore,
    StorageError,
    check_data_dir,
    mark_running,
    mark_stopped,
    open_page_store,
    running_marker,
)

from peer.cluster.core.cluster import Cluster, ClusterError
from peer.cluster.net.discovery import DiscoveryError, srv_seeds
from peer.cluster.net.transport import TransportError
from peer.config import (Config, ConfigError, parse_address, read_control_token, read_secret, read_seeds,
                         stream_target)
from peer.control import load_or_create_token, serve_control
from peer.crawl.crawler import Crawler
from peer.crawl.pageworkers import PageWorkers, PageWriter, open_page_workers
from peer.crawl.settings import CrawlSettings, SettingsError, SettingsFile
from peer.crawl.seenstores import open_node_store
from peer.crawl.syncs import StoreSyncs
from peer.dashboard import NodeWatch, file_rss_bytes, peak_rss_bytes
from peer.diskguard import DiskGuard, DiskMarks, statvfs_free
from peer.fetch.dns import CachingResolver
from peer.fetch.http import Fetcher
from peer.fetch.policy import HostPolicies
from peer.render import BrowserError, PoolLimits, RenderPool, clear_workdir, find_chromium
from peer.noderoutes import ControlRoutes
from peer.plugins import ItemExporter, JsonLinesSink, PluginError, Plugins, PluginSpec
from peer.outputs import CrawlLog, LocalIndex, LocalLog, ObjectStore, S3Target, StreamLog, Uploader, WebhookSender
from peer.stats import Stats

__all__ = ["Node", "run_node", "NodeError"]

log = logging.getLogger(__name__)


#: DNS SRV look-ups tried before a node gives up (about a minute with the back-off between them).
SRV_ATTEMPTS = 8

#: A clean stop waits this long for fetches under way (each is bounded by total_timeout anyway).
DRAIN_TIMEOUT = 10.0

#: A clean stop closes the WARC file being written and spends up to this long uploading what is queued and
#: sending the webhook's notices; the rest goes after the next start.
UPLOAD_AT_STOP = 30.0

#: Seconds between checks of the file-backed memory against `store_resident_mib` (a check reads /proc).
RESIDENT_CHECK = 0.25


def _publish(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all: scripts and `peerctl` wait for these files to appear and read
    them at once, so a reader must never see one created but not yet written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class NodeError(RuntimeError):
    """The node cannot start or must stop; the message is one line for the operator."""


def lock_data_dir(path: Path, stack: ExitStack) -> None:
    """Hold `path`'s LOCK (flock) until `stack` closes: one process at a time uses a data directory (a node, or
    `peerd check`). NodeError if another holds it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise NodeError(f"data dir {path}: {exc.strerror or exc}") from exc
    stack.callback(os.close, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise NodeError(f"data dir {path} is in use by another running node") from exc


def plugin_specs(cfg: Config) -> list[PluginSpec]:
    """The configuration's [[plugins]] entries as specs, in chain order."""
    return [PluginSpec(use, json.loads(settings)) for use, settings in cfg.plugins]


def _lock_data_dir(path: Path, node_id: str, stack: ExitStack) -> None:
    lock_data_dir(path, stack)
    id_file = path / "NODE_ID"
    if id_file.exists():
        existing = id_file.read_text().strip()
        if existing != node_id:
            raise NodeError(
                f"data dir {path} belongs to node {existing!r}, not {node_id!r}; "
                "use that --node-id or another --data-dir"
            )
    else:
        id_file.write_text(node_id + "\n")


class Node:
    """The composition of one node's parts; ``run()`` is its lifetime."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.node_id = cfg.resolved_node_id()
        self.data_dir = Path(cfg.data_dir)
        self.stats = Stats()
        self.started_wall = time.time()
        self.crawler: Crawler | None = None
        self.page_workers: PageWorkers | None = None
        self.cluster: Cluster | None = None
        self.resolver: CachingResolver | None = None
        self.fetch_policies: HostPolicies | None = None  # per-host HTTP/2, proxies, TLS (status shows proxies)
        self.control_port: int | None = None
        self.final_status: dict[str, Any] | None = None  # the last status, taken before the stores close
        self.plugins: Plugins | None = None  # the plug-in chain (peer/plugins), loaded at start
        self.exporter: ItemExporter | None = None  # moves spooled items to DATA_DIR/items/ and the chain's sinks
        self.watch: NodeWatch | None = None  # figures over time for the dashboard (pages/s, flows, last page)
        self.uploader: Uploader | None = None  # --upload: closed WARC files to object storage
        self.webhook: WebhookSender | None = None  # --webhook: a signed POST per WARC file uploaded or closed
        self.crawl_log: CrawlLog | None = None  # one record per finished URL: local files, --crawl-log stream
        self.index: LocalIndex | None = None  # this node's captures, for the cluster's GET /cdx
        self.store_releases = 0  # times the store's mapped pages were handed back (store_resident_mib)
        # low disk on the data directory's filesystem: a state in which the node holds (peer/diskguard.py)
        self.disk = DiskGuard(statvfs_free(self.data_dir), DiskMarks.from_mib(cfg.disk_min_free_mib),
                              hold=self._hold_for_disk)
        self._stop = trio.Event()
        self._leave = trio.Event()
        self.control = ControlRoutes(self)  # the control endpoint's routes and what they show of this node

    def request_stop(self) -> None:
        self._stop.set()

    def _hold_for_disk(self, on: bool) -> None:
        """The disk guard's hold: the crawler's hold "disk" (the guard is served only once the crawler exists)."""
        if self.crawler is not None:
            self.crawler.hold("disk", on)

    def request_leave(self) -> None:
        self._leave.set()

    def status(self) -> dict[str, Any]:
        """What `/status` shows (`ControlRoutes.status`)."""
        return self.control.status()

    def summary(self) -> dict[str, Any]:
        """This node as the dashboard shows it (`ControlRoutes.summary`)."""
        return self.control.summary()

    # -------------------------------------------------------------- lifetime

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> int:
        cfg = self.cfg
        seeds = read_seeds(cfg)
        try:  # an import error or a bad setting stops the start, naming the plug-in
            plugins = self.plugins = Plugins(plugin_specs(cfg), timeout=cfg.plugin_timeout)
        except PluginError as exc:
            raise NodeError(str(exc)) from exc
        with ExitStack() as stack:
            _lock_data_dir(self.data_dir, self.node_id, stack)
            await self._check_stores()
            stack.enter_context(_marked_running(self.data_dir))  # its exit runs after the stores closed
            try:
                store = stack.enter_context(open_node_store(
                    self.data_dir, cfg.dedup, expected=cfg.dedup_expected, fp_rate=cfg.dedup_fp_rate,
                    redis_url=cfg.redis_url or None, namespace=self.node_id,
                    filter_max_bytes=cfg.seen_filter_mib << 20))
                _log_filter_open(store.dedup)  # the LMDB seen-set's; another --dedup kind has no filter
                pages = open_page_store(cfg.store, self.data_dir / "warc", max_file_bytes=cfg.warc_max_bytes)
                stack.callback(pages.close)
            except StorageError as exc:
                raise NodeError(str(exc)) from exc
            self.index = LocalIndex(self.data_dir / "warc", self.node_id, getattr(store, "uploads", None))
            spool = getattr(store, "items", None)
            if plugins.active and spool is None:
                raise NodeError(f"plug-ins need --dedup lmdb (got {cfg.dedup}): a page's items are stored in "
                                "the page's own transaction")
            if spool is not None:
                self.exporter = ItemExporter(spool, [JsonLinesSink(self.data_dir / "items"), *plugins.chain.sinks],
                                             interval=cfg.sync_interval)
            try:
                self.resolver = CachingResolver(
                    cfg.nameservers,
                    cache_size=cfg.dns_cache_size,
                    min_ttl=cfg.dns_min_ttl,
                    max_ttl=cfg.dns_max_ttl,
                    allow_private=cfg.allow_private,
                )
            except ValueError as exc:
                raise NodeError(f"nameserver: {exc}") from exc
            try:
                secret = read_secret(cfg)
            except ConfigError as exc:
                raise NodeError(str(exc)) from exc
            try:
                settings_file = SettingsFile(self.data_dir / "settings.json")
                saved = settings_file.load()
                configured = CrawlSettings.from_config(
                    cfg, origin=self.node_id, joining=secret is not None and bool(cfg.join or cfg.join_srv))
            except SettingsError as exc:
                raise NodeError(str(exc)) from exc
            settings = configured
            # the one place that forces the store to disk: once per sync_interval, and a peer's batch is
            # acknowledged after the next one (peer/crawl/syncs.py)
            syncs = StoreSyncs(store, period=cfg.sync_interval)
            if saved is not None and saved.rank() > configured.rank():
                settings = saved
                log.info("crawling by the settings last changed at runtime (DATA_DIR/settings.json), not the "
                         "configuration's", extra={"version": saved.version, "settings": saved.body()})
            if secret is not None:
                if cfg.dedup != "lmdb":
                    raise NodeError(f"a cluster node needs --dedup lmdb (got {cfg.dedup}): peers' batches and "
                                    "hand-offs are stored in the same transactions as the seen-set")
                try:
                    self.cluster = Cluster(cfg, node_id=self.node_id, store=store, secret=secret, stats=self.stats,
                                           syncs=syncs, summary=self.summary, plugins=plugins.description,
                                           admitting=self.disk.admitting,
                                           captures=self.index.captures,
                                           control=self.control.answer_peer)
                except TransportError as exc:
                    raise NodeError(str(exc)) from exc
            try:
                policies = HostPolicies.build(
                    http2=cfg.http2, proxy=cfg.proxy, tls={}, hosts=[(p, dict(r)) for p, r in cfg.hosts],
                    credentials=(cfg.proxy_user, cfg.proxy_password) if cfg.proxy_user else None,
                    proxy_retry=cfg.proxy_retry)
            except ValueError as exc:
                raise NodeError(str(exc)) from exc
            self.fetch_policies = policies
            renderer = self._render_pool()
            async with Fetcher(
                self.resolver,
                policies=policies,
                user_agent=cfg.full_user_agent(),
                connect_timeout=cfg.connect_timeout,
                read_timeout=cfg.read_timeout,
                total_timeout=cfg.total_timeout,
                max_body=cfg.max_body,
            ) as fetcher, self._open_page_workers(pages) as workers:
                self.page_workers = workers
                cluster = self.cluster
                crawler = self.crawler = Crawler(
                    cfg, fetcher=fetcher, store=store, pages=pages, stats=self.stats, ownership=cluster,
                    limits=cluster.lanes if cluster is not None else None,
                    settings=settings, settings_file=settings_file, page_workers=workers, plugins=plugins,
                    originals=cluster.digests if cluster is not None else None,
                    renderer=renderer,
                )
                if cluster is not None:
                    cluster.attach(crawler)
                recovered = crawler.restore()
                if cfg.upload:
                    self.uploader = self._uploader(store, crawler)
                if cfg.webhook:
                    self.webhook = WebhookSender(uploads=store.uploads, url=cfg.webhook,
                                                 secret=cfg.webhook_secret.encode(), node_id=self.node_id,
                                                 directory=self.data_dir / "warc", closed_files=not cfg.upload)
                self.crawl_log = self._crawl_log(store)
                self.watch = NodeWatch(lambda: self.stats.pages, self.control.sent, trio.current_time())
                self._record_dropped(crawler.dropped_urls)
                configured_token = read_control_token(cfg)
                try:
                    token = load_or_create_token(self.data_dir, configured_token)
                except (OSError, ValueError) as exc:
                    raise ConfigError(f"control token: {exc}") from exc
                async with trio.open_nursery() as nursery:
                    # SIGTERM and SIGINT stop the node cleanly from before control.addr says it is up
                    await nursery.start(self._watch_signals)
                    chost, cport = parse_address(cfg.control, "control")
                    if configured_token is None and not _is_loopback(chost):
                        # A token nobody chose is only in this data dir: then only this machine may ask.
                        log.warning("control endpoint kept on loopback: set control_token or control_token_file "
                                    "to listen on %s", chost, extra={"control": cfg.control})
                        chost = "127.0.0.1"
                    self.control_port = await nursery.start(
                        functools.partial(serve_control, chost, cport, self.control.routes(), token=token)
                    )
                    _publish(self.data_dir / "control.addr", f"{chost}:{self.control_port}\n")
                    await nursery.start(self._syncs, syncs)
                    if self.uploader is not None:
                        await nursery.start(self.uploader.run)
                    if self.webhook is not None:
                        await nursery.start(self.webhook.run)
                    if self.crawl_log is not None:
                        await nursery.start(self.crawl_log.run)
                    nursery.start_soon(self._housekeeping, pages)
                    nursery.start_soon(self._bound_store_pages, store)
                    nursery.start_soon(self._sample)
                    await nursery.start(self.disk.serve)
                    if self.exporter is not None:
                        await nursery.start(self.exporter.serve)
                    if cluster is not None:
                        await nursery.start(cluster.run)
                        _publish(self.data_dir / "peer.addr", f"{cluster.address}\n")
                        await self._join(cluster)
                    if renderer is not None:
                        await nursery.start(renderer.serve_pool)
                    new = crawler.seed(seeds)
                    if cluster is not None:
                        cluster.ready.set()
                    log.info("node starting", extra={"node_id": self.node_id, "recovered_in_flight": recovered,
                                                     "queued": len(store.frontier), "new_seeds": new})
                    await nursery.start(crawler.run)
                    task_status.started(self)
                    nursery.start_soon(self._wait_done_or_stop, nursery)
                if self.uploader is not None or self.webhook is not None or self.crawl_log is not None:
                    pages.close()  # the file being written is closed now, so that it can go too
                    with trio.move_on_after(UPLOAD_AT_STOP):
                        if self.crawl_log is not None:
                            await self.crawl_log.flush()
                        if self.uploader is not None:
                            await self.uploader.flush()
                        if self.webhook is not None:
                            await self.webhook.flush()
                if self.crawl_log is not None:
                    self.crawl_log.close()
                store.sync()
                self._export_rest()
                self.final_status = self.status()
                usage = resource.getrusage(resource.RUSAGE_SELF)
                log.info("node stopped", extra={"node_id": self.node_id, **self.stats.as_dict(),
                                                "peak_rss": peak_rss_bytes(),
                                                "store_releases": self.store_releases,
                                                "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)})
        return 0

    def _export_rest(self) -> None:
        """At a clean stop: what is spooled goes to the sinks now (else at the next start)."""
        if self.exporter is None:
            return
        try:
            while self.exporter.export_once():
                pass
        except Exception as exc:  # noqa: BLE001 - the items stay spooled for the next start
            log.warning("items not exported at stop; they stay spooled", extra={"error": str(exc)})

    def _uploader(self, store, crawler: Crawler) -> Uploader:
        """The upload task of --upload s3://BUCKET/PREFIX (peer/outputs/uploads.py)."""
        cfg = self.cfg
        if importlib.util.find_spec("boto3") is None:
            raise NodeError("upload needs the S3 client: pip install 'peercrawl[s3]' (boto3)")
        try:
            target = S3Target.from_config(cfg, os.environ)
            objects = ObjectStore(target, part_size=cfg.upload_part_bytes)
            objects.connect()
            # botocore's service model (some 70,000 objects) lives as long as the node: out of the collector's
            # generations, so that its full passes do not walk it again and again
            gc.freeze()
        except ConfigError as exc:
            raise NodeError(str(exc)) from exc
        return Uploader(uploads=store.uploads, directory=self.data_dir / "warc", objects=objects,
                        node_id=self.node_id, keep_local=cfg.keep_local, max_local_bytes=cfg.upload_max_local_bytes,
                        hold=functools.partial(crawler.hold, "upload"), notify=bool(cfg.webhook))

    def _crawl_log(self, store) -> CrawlLog | None:
        """The crawl log's readers: DATA_DIR/crawl-log/ unless crawl_log_local is off, and the --crawl-log stream
        (peer/outputs/crawllog.py). None when both are off, or the store keeps no spool."""
        cfg = self.cfg
        spool = getattr(store, "crawl_log", None)
        if spool is None:
            return None
        outputs: list[LocalLog | StreamLog] = []
        if cfg.crawl_log_local != "off":
            formats = ("text", "json") if cfg.crawl_log_local == "both" else (cfg.crawl_log_local,)
            outputs.append(LocalLog(self.data_dir / "crawl-log", formats, max_bytes=cfg.crawl_log_max_bytes,
                                    max_age=cfg.crawl_log_rotate_seconds, keep=cfg.crawl_log_keep))
        if cfg.crawl_log:
            try:
                outputs.append(StreamLog(stream_target(cfg.crawl_log)))
            except ConfigError as exc:
                raise NodeError(str(exc)) from exc
        if not outputs:
            return None
        return CrawlLog(spool, self.node_id, outputs, limit=cfg.crawl_log_spool)

    async def _check_stores(self) -> None:
        """If the last run did not stop cleanly (DATA_DIR/RUNNING is there), read every store through in a child
        process before opening one: damage LMDB would abort on (SIGABRT) is then one clear error and exit status
        2, not a signal at every start. Bounded by `store_check_timeout` (0: no check)."""
        try:
            marker = running_marker(self.data_dir)
        except StorageError as exc:
            raise NodeError(str(exc)) from exc
        if marker is None:
            return
        timeout = self.cfg.store_check_timeout
        if not timeout:
            log.warning("the last run did not stop cleanly; the store check is off (store_check_timeout 0)",
                        extra={"previous_pid": marker.get("pid")})
            return
        log.info("the last run did not stop cleanly: checking the stores before opening them",
                 extra={"previous_pid": marker.get("pid"), "previous_start": marker.get("started"),
                        "timeout": timeout})
        started = time.monotonic()
        try:
            checks = await trio.to_thread.run_sync(functools.partial(check_data_dir, self.data_dir, timeout=timeout))
        except StorageError as exc:
            raise NodeError(str(exc)) from exc
        seconds = time.monotonic() - started
        log.info("stores checked: sound", extra={
            "seconds": round(seconds, 3), "keys": sum(c.keys for c in checks),
            "file_bytes": sum(c.file_bytes for c in checks), "stores": [c.path for c in checks]})

    def _render_pool(self) -> RenderPool | None:
        """The render pool when any page may be rendered (`--render`, a host rule's ``render``); a browser
        binary that is not there is an error at start, not a render failure per page."""
        cfg = self.cfg
        rules = [str(v) for _, settings in cfg.hosts for k, v in settings if k == "render"]
        if cfg.render == "never" and all(rule == "never" for rule in rules):
            return None
        if not cfg.browser_ws:
            try:
                find_chromium(cfg.chromium)
            except BrowserError as exc:
                raise NodeError(str(exc)) from exc
        limits = PoolLimits(tabs=cfg.render_tabs, max_pages=cfg.browser_max_pages,
                            max_rss=cfg.browser_max_mib * 2**20, time_limit=cfg.render_timeout,
                            max_requests=cfg.render_max_requests)
        workdir = self.data_dir / "browser"
        left = clear_workdir(workdir)  # the profiles of browsers a killed node left (its data dir is locked)
        if left:
            log.info("browser profiles left by a killed node removed", extra={"count": left})
        return RenderPool(limits, chromium=cfg.chromium, ws_url=cfg.browser_ws, counts=self.stats.render,
                          workdir=str(workdir))

    def _open_page_workers(self, pages: PageStore) -> AbstractAsyncContextManager[PageWorkers | None]:
        """The page worker processes of --page-processes N (none: a page's work is done inline). With WARC
        output each worker appends the records it builds to WARC files of its own in the same directory."""
        if self.cfg.page_processes <= 0:
            return nullcontext(None)
        return open_page_workers(self.cfg.page_processes, timeout=self.cfg.page_process_timeout,
                                 writer=PageWriter.of(pages, self.cfg.sync_interval))

    def _record_dropped(self, urls: list[str]) -> None:
        """Append the URLs the crawler gave up at this start to DATA_DIR/dropped-urls.jsonl (one JSON a line)."""
        if not urls:
            return
        with open(self.data_dir / "dropped-urls.jsonl", "a", encoding="utf-8") as out:
            for url in urls:
                out.write(json.dumps({"url": url, "at": time.time(), "reason": "in flight at "
                                      f"{self.cfg.max_crashes} stops in a row"}) + "\n")

    async def _join(self, cluster: Cluster) -> None:
        """Join through --join seeds, then the --join-srv record's members; none given: a new cluster."""
        seeds = list(self.cfg.join)
        if self.cfg.join_srv:
            # A failed look-up is retried: starting a new cluster on a passing DNS error would split the fleet.
            # Only a record that lists no one but us (the first pod of a StatefulSet) starts a new cluster.
            problem: DiscoveryError | None = None
            for attempt in range(SRV_ATTEMPTS):
                try:
                    seeds += await srv_seeds(self.cfg.join_srv, nameservers=self.cfg.nameservers,
                                             exclude=[cluster.address or ""])
                    problem = None
                    break
                except DiscoveryError as exc:
                    problem = exc
                    log.warning("DNS SRV look-up failed; trying again", extra={"error": str(exc), "attempt": attempt + 1})
                    await trio.sleep(min(10.0, 2.0 ** attempt))
            if problem is not None:
                raise NodeError(f"cannot find the cluster's members: {problem}")
        seeds = [seed for seed in dict.fromkeys(seeds) if seed != cluster.address]
        if not seeds:
            log.info("starting a new cluster", extra={"address": cluster.address})
            return
        try:
            await cluster.join(seeds)
        except ClusterError as exc:
            if self.cfg.join_srv and not self.cfg.join:
                # Pods of a StatefulSet come up together: members listed in DNS may not be serving yet.
                log.warning("no listed member answered; starting a new cluster", extra={"error": str(exc)})
                return
            raise NodeError(f"cannot join the cluster: {exc}") from exc

    async def _wait_done_or_stop(self, nursery: trio.Nursery) -> None:
        assert self.crawler is not None
        crawler = self.crawler
        async with trio.open_nursery() as inner:
            async def on_done() -> None:
                if not self.cfg.exit_when_done:
                    await trio.sleep_forever()
                if self.cluster is not None:
                    await self.cluster.finished.wait()
                    await self.cluster.linger()
                else:
                    await crawler.done.wait()
                log.info("crawl done: frontier empty and nothing in flight")
                inner.cancel_scope.cancel()

            async def on_leave() -> None:
                await self._leave.wait()
                assert self.cluster is not None
                log.info("leaving the cluster: handing everything off")
                await self.cluster.leave(self.cfg.leave_timeout)
                self.request_stop()
                await trio.sleep_forever()

            async def on_stop() -> None:
                await self._stop.wait()
                log.info("stop requested: finishing the fetches under way")
                if not await crawler.drain(DRAIN_TIMEOUT):
                    log.warning("fetches still under way at stop; they are fetched again after a restart",
                                extra={"in_progress": crawler.active})
                if self.cluster is not None:
                    self.cluster.dispatcher.flush_staged()  # routed links of the last pages wait in the outbox
                    if not self._leave.is_set():
                        await self.cluster.links.close_all("stopping")
                inner.cancel_scope.cancel()

            inner.start_soon(on_done)
            inner.start_soon(on_stop)
            if self.cluster is not None:
                inner.start_soon(on_leave)
        nursery.cancel_scope.cancel()

    async def _syncs(self, syncs: StoreSyncs, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The node's sync service (the node store, once per sync interval); a failed sync stops the node."""
        try:
            await syncs.run(task_status=task_status)
        except StorageError as exc:
            self._storage_failed(exc)

    async def _housekeeping(self, pages) -> None:
        """Once per sync interval: force the page store to disk and sample the page rate."""
        while True:
            await trio.sleep(self.cfg.sync_interval)
            self.stats.sample(trio.current_time())
            try:
                pages.sync()
            except StorageError as exc:
                self._storage_failed(exc)

    def _storage_failed(self, exc: StorageError) -> NoReturn:
        log.error("storage failed, stopping", extra={"error": str(exc)})
        self.request_stop()
        raise NodeError(str(exc)) from exc

    async def _bound_store_pages(self, store) -> None:
        """Hand the store's mapped pages back to the kernel (`release_resident`) whenever the process's
        file-backed memory passes `store_resident_mib`, checked every `RESIDENT_CHECK` seconds from the first
        moment on (the restart's restore has just read the window's hosts). A page cache with large folios maps
        a whole folio on a fault, so a few thousand reads can map hundreds of MB: the check must be frequent,
        and it is cheap (a read of /proc, about 20 µs; a release of 400 MB, about 5 ms)."""
        limit = self.cfg.store_resident_mib << 20
        if not limit:
            return
        while True:
            if file_rss_bytes() > limit and store.release_resident():
                self.store_releases += 1
            await trio.sleep(RESIDENT_CHECK)

    async def _sample(self) -> None:
        """Once a second: the dashboard's figures over time (pages per second, URLs sent, the last page)."""
        while True:
            await trio.sleep(1.0)
            if self.watch is not None:
                self.watch.sample(trio.current_time())

    async def _watch_signals(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                log.info("signal received, stopping", extra={"signal": signal.Signals(signum).name})
                self.request_stop()
                return


def _log_filter_open(dedup: object) -> None:
    """Say how the seen store's filter was made at open: read from the file a clean stop saved, or built from
    every key (the long part of a start on a large store), and why."""
    made = getattr(dedup, "filter_open", None)
    if made is None:
        return
    if made.source == "saved":
        log.info("seen filter (%d MiB, %d keys) read from its file in %.1f s", made.nbytes >> 20, made.keys,
                 made.seconds)
    else:
        log.info("seen filter (%d MiB) built from %d keys in %.1f s (%s)", made.nbytes >> 20, made.keys,
                 made.seconds, made.reason)


@contextmanager
def _marked_running(data_dir: Path) -> Iterator[None]:
    """DATA_DIR/RUNNING while the stores are open. Removed when the node unwinds; kept when the process dies
    without unwinding (a crash, kill -9, a power cut) and when a store fault stopped it, so that the next start
    checks the stores first (`Node._check_stores`)."""
    try:
        mark_running(data_dir)
    except StorageError as exc:
        raise NodeError(str(exc)) from exc
    try:
        yield
    except BaseException as exc:
        if not _store_fault(exc):
            mark_stopped(data_dir)
        raise
    mark_stopped(data_dir)


def _store_fault(exc: BaseException) -> bool:
    """Whether a StorageError is among `exc`, the exceptions it groups and their causes (a bounded walk)."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo and len(seen) < 1000:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, StorageError):
            return True
        if isinstance(error, BaseExceptionGroup):
            todo.extend(error.exceptions)
        todo.extend(e for e in (error.__cause__, error.__context__) if e is not None)
    return False


async def run_node(cfg: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> int:
    try:
        node = Node(cfg)
    except ConfigError as exc:
        raise NodeError(str(exc)) from exc
    return await node.run(task_status=task_status)


def _is_loopback(host: str) -> bool:
    if host.strip("[]").lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
