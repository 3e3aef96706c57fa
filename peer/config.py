"""Node configuration: built-in defaults < TOML file < ``PEERCRAWL_*`` environment < command-line flags.

``load()`` is pure: it takes the TOML text (or path), the environment mapping and the flag overrides as
arguments, so every precedence rule is testable without touching the process. Every default carries a
one-line reason in ``FIELDS``.

Each operator-visible default is stated once, here: the components take theirs from ``DEFAULTS`` (the
membership, dispatch and hand-off configs, the fetcher, the resolver, URL normalization), and the flags'
``(default ...)`` help text, ``peerd config`` and docs/configuration.md are generated from it. Config sits on
the base floor that every room may import, so it cannot import the components' configs; the defaults flow
down to up instead (docs/architecture.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import socket
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ring import MAX_ZONE, check_zone

__all__ = ["DEFAULTS", "HOST_KEYS", "TOML_ONLY", "Config", "ConfigError", "load", "FIELDS", "default_text",
           "parse_address", "read_seeds", "read_secret", "StreamTarget", "stream_target"]

DEFAULT_UA = "peercrawl/0.1"

#: Per-host-pattern fetch settings (TOML ``[hosts."PATTERN"]`` tables, in file order): (pattern, settings).
HostRules = tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
#: What a ``[hosts."PATTERN"]`` table may set (peer.fetch.policy checks the values when the node starts).
HOST_KEYS = frozenset({"http2", "proxy", "tls_min_version", "tls_max_version", "tls_ciphers", "tls_verify",
                       "tls_ca_file", "tls_client_cert", "tls_client_key", "tls_legacy_renegotiation", "render"})


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the setting and where it came from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    # identity and cluster
    node_id: str = ""
    weight: int = 100
    zone: str = ""
    listen: str = "127.0.0.1:7400"
    advertise: str = ""
    control: str = "127.0.0.1:7410"
    data_dir: str = "./peercrawl-data"
    cluster_secret: str = ""
    cluster_secret_file: str = ""
    join: tuple[str, ...] = ()
    join_srv: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    codec: str = "msgpack"
    compression: str = "br"
    batch_size: int = 500
    dispatch_interval: float = 0.2
    handoff_wait: float = 30.0
    leave_timeout: float = 120.0
    probe_interval: float = 1.0
    probe_timeout: float = 0.5
    suspicion_timeout: float = 5.0
    replicas: int = 1
    link_idle_timeout: float = 60.0
    max_links: int = 512
    peer_datagrams: bool = True
    # what to crawl
    seeds: tuple[str, ...] = ()
    seeds_file: str = ""
    allowed_hosts: tuple[str, ...] = ()
    denied_hosts: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    max_depth: int = -1
    max_pages_per_host: int = -1
    max_bytes_per_host: int = -1
    max_redirect_hops: int = 5
    max_url_length: int = 2048
    max_query_params: int = -1
    # network
    nameservers: tuple[str, ...] = ()
    allow_private: bool = False
    user_agent: str = DEFAULT_UA
    contact: str = ""
    concurrency: int = 256
    delay: float = 1.0
    ip_connections: int = 4
    ip_delay: float = 0.0
    max_backoff: float = 600.0
    max_retries: int = 3
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    total_timeout: float = 60.0
    max_body: int = 10 * 2**20
    http2: bool = True
    proxy: tuple[str, ...] = ()
    proxy_user: str = ""
    proxy_password: str = ""
    proxy_retry: float = 30.0
    hosts: HostRules = ()
    dns_cache_size: int = 50_000
    dns_min_ttl: float = 60.0
    dns_max_ttl: float = 1800.0
    robots_cache_size: int = 100_000
    max_active_hosts: int = 100_000
    host_window_turns: int = 100
    sitemaps: bool = True
    sitemap_xml: bool = False
    # rendering (peer/render)
    render: str = "never"
    browser_ws: str = ""
    chromium: str = ""
    render_tabs: int = 2
    render_timeout: float = 20.0
    render_max_requests: int = 50
    browser_max_pages: int = 200
    browser_max_mib: int = 1024
    # storage
    dedup: str = "lmdb"
    dedup_expected: int = 10_000_000
    dedup_fp_rate: float = 0.001
    redis_url: str = ""
    store: str = "warc"
    store_types: tuple[str, ...] = ("text/html", "application/xhtml+xml")
    warc_max_bytes: int = 1 << 30
    sync_interval: float = 1.0
    store_resident_mib: int = 256
    seen_filter_mib: int = 512
    store_check_timeout: float = 600.0
    disk_min_free_mib: int = 1024
    # outputs
    upload: str = ""
    upload_endpoint: str = ""
    upload_region: str = ""
    upload_access_key: str = ""
    upload_secret_key: str = ""
    upload_part_bytes: int = 64 << 20
    upload_max_local_bytes: int = 16 << 30
    keep_local: bool = False
    webhook: str = ""
    webhook_secret: str = ""
    crawl_log: str = ""
    crawl_log_local: str = "both"
    crawl_log_max_bytes: int = 256 << 20
    crawl_log_rotate_seconds: float = 86400.0
    crawl_log_keep: int = 10
    crawl_log_spool: int = 1_000_000
    # revisits
    revisit: bool = False
    revisit_min: float = 3600.0
    revisit_max: float = 30 * 86400.0
    payload_revisits: bool = True
    # behaviour
    exit_when_done: bool = False
    max_crashes: int = 3
    control_token: str = ""
    control_token_file: str = ""
    parse_in_thread: bool = False
    page_threads: int = 0
    page_processes: int = 0
    page_process_timeout: float = 60.0
    log_level: str = "info"
    log_format: str = "auto"
    # plug-ins (peer/plugins): the [[plugins]] tables of the TOML file, each (use, its settings as JSON)
    plugins: tuple[tuple[str, str], ...] = ()
    plugin_timeout: float = 2.0

    def full_user_agent(self) -> str:
        """The honest User-Agent: product token, version, and the operator's contact URL when given."""
        if self.contact:
            return f"{self.user_agent} (+{self.contact})"
        return self.user_agent

    def resolved_zone(self) -> str:
        """The failure zone this node names: the setting, else the machine's host name (nodes on one machine go
        down together)."""
        return self.zone or socket.gethostname()[:MAX_ZONE]

    def resolved_node_id(self) -> str:
        if self.node_id:
            return self.node_id
        _, port = parse_address(self.listen, "listen")
        return f"{socket.gethostname()}:{port}"


#: Every setting's built-in default, by name: what the components take their own defaults from.
DEFAULTS: Mapping[str, Any] = MappingProxyType({f.name: f.default for f in dataclasses.fields(Config)})


def default_text(name: str) -> str | None:
    """How a setting's default reads in help text (``None`` when it is empty: its reason says what that means)."""
    value = DEFAULTS[name]
    if value in ("", (), False):
        return None
    if isinstance(value, tuple):
        return " and ".join(str(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
            if value >= size and value % size == 0:
                return f"{value} ({value // size} {unit})"
    return str(value)


#: One-line reason for every default, shown by ``peerd config`` and in docs/configuration.md. A reason says why
#: the default is what it is; it does not repeat the value (``peerd config`` prints that beside it).
FIELDS: dict[str, str] = {
    "node_id": "stable name of this node; empty means host name + listen port",
    "weight": "share of the ring; a neutral unit of 100 lets weights read as percentages",
    "zone": "nodes that go down together (one machine, one rack) name one zone, and each queued URL keeps a copy outside its owner's zone; empty means this machine's host name",
    "listen": "peer port on loopback: nothing is exposed until the operator says so",
    "advertise": "address peers dial to reach this node; empty means the listen address (set it when listening on 0.0.0.0)",
    "control": "control/metrics endpoint on loopback: status and metrics are not public by default",
    "data_dir": "all durable state lives under one directory, never shared between node ids",
    "cluster_secret": "shared secret (>= 16 bytes) proved by every peer connection; empty runs a standalone node",
    "cluster_secret_file": "file holding the cluster secret, so it stays out of the process list and environment",
    "join": "HOST:PORT of any member to join through at start (repeatable; tried in order); empty starts a new cluster",
    "join_srv": "DNS SRV name listing members to join through (a Kubernetes headless service); tried after join",
    "tls_cert": "PEM certificate of this node for mutual TLS between peers; empty: plain TCP (the secret still authenticates)",
    "tls_key": "PEM private key of tls_cert",
    "tls_ca": "PEM CA that signed every node's certificate: peers without one are refused",
    "codec": "msgpack: compact and fast; json is the readable option for debugging the wire",
    "compression": "br: about 29 bytes per routed URL instead of 57 unpacked, for about 3 µs of CPU per URL; none on a fast LAN",
    "batch_size": "URLs per batch to a peer: about 60 KB, one write, far under the 1 MiB frame limit",
    "dispatch_interval": "the design's flush timer for partial batches: few messages, and links reach owners quickly",
    "handoff_wait": "a gained arc waits this long for its previous owner's hand-off before it is crawled anyway",
    "leave_timeout": "time a graceful leave has to hand everything off before the process exits regardless",
    "probe_interval": "each node probes one peer per interval: failure detection in seconds at a constant load (memberlist's LAN profile)",
    "probe_timeout": "wait for a Pong before indirect probes: half the interval, the rest is theirs; raise it on links slower than a few hundred ms",
    "suspicion_timeout": "time a suspect has to hear the rumour and refute it (several probe and gossip rounds) before it is declared dead",
    "replicas": "every queued URL is also held durably by the ring's next node(s), so that many deaths at once lose no URL; 0 turns it off",
    "link_idle_timeout": "a peer link with no traffic either way this long closes, and reopens at its next use: probes reach a given peer once per n seconds, so in a large fleet most links would sit idle between uses; 0 keeps links open",
    "max_links": "live peer links at most (the least recently used idle one closes first): room for 256 fetches and the stores under a 1,024-descriptor limit; links carrying unacknowledged batches or an awaited hand-off are never closed, so the bound can be passed briefly; 0: no bound",
    "peer_datagrams": "membership's probes and gossip go as UDP datagrams on the peer port (one packet each, no connection to set up; memberlist does the same): a node of a large cluster reaches a different peer every second, and over TCP each would first cost a handshake. Off keeps them on TCP links, for a network that passes only TCP between nodes; under TLS they stay on the links anyway",
    "seeds": "start URLs",
    "seeds_file": "file with one start URL per line (# comments allowed)",
    "allowed_hosts": "if set, only these hosts (and subdomains) are crawled",
    "denied_hosts": "hosts (and subdomains) never crawled",
    "include": "regular expressions searched in the normalized URL; if any is set, a URL must match one",
    "exclude": "regular expressions searched in the normalized URL; a URL matching one is not crawled",
    "max_depth": "unlimited (-1): the scope and trap guards bound a crawl instead",
    "max_pages_per_host": "unlimited (-1); set it to sample many hosts broadly (counted by the host's owner)",
    "max_bytes_per_host": "unlimited (-1); body bytes fetched from one host before it is left alone",
    "max_redirect_hops": "as browsers and RFC 9309 (for robots.txt) do",
    "max_url_length": "longer URLs are nearly always traps or session junk",
    "max_query_params": "unlimited (-1); a low bound (say 5) cuts faceted-search and calendar traps",
    "nameservers": "empty means /etc/resolv.conf; tests and the demo point at their own server",
    "allow_private": "private/loopback addresses are refused so a crawl cannot be turned on the local network",
    "user_agent": "product token first so robots.txt groups for 'peercrawl' match",
    "contact": "a URL or mail address where site owners can reach the operator; put it in the User-Agent",
    "concurrency": "fetches in flight: enough to keep one core busy on a wide crawl without piling up sockets",
    "delay": "seconds between requests to one host: polite by default; robots Crawl-delay can only raise it",
    "ip_connections": "requests at once per server address: shared hosts serve hundreds of sites from one address, and a browser opens about six connections to a server; 0 turns per-address limits off",
    "ip_delay": "the connection cap and each host's delay already space a shared server; raise it for servers that ask for a pause between requests (needs ip_connections >= 1)",
    "max_backoff": "cap on per-host back-off after 429/503/errors: a dead host is asked again within minutes",
    "max_retries": "retries of a URL after transient errors before it is given up",
    "connect_timeout": "a host that cannot complete TCP and TLS handshakes in this time is effectively down",
    "read_timeout": "longest wait for the next bytes: stalled servers are cut off",
    "total_timeout": "bound on a whole response: the time any one URL can hold a worker",
    "max_body": "larger bodies are cut there and marked truncated: far above a normal HTML page",
    "http2": "offer HTTP/2 by ALPN on HTTPS (HTTP/1.1 when the server does not choose it): some servers speak nothing else, and one request is still in flight per host",
    "proxy": "proxy URLs (http://, socks5://, socks5h://; user:password@ allowed) every fetch goes through, taken in turn; empty: direct",
    "proxy_user": "user for proxies whose URL names none (keep credentials in the TOML file or environment, not on the command line)",
    "proxy_password": "password that goes with proxy_user",
    "proxy_retry": "seconds a proxy that failed (unreachable, a broken handshake) rests while the others take its turns",
    "hosts": "TOML only: [hosts.\"PATTERN\"] tables that set render, http2, proxy and tls_* (min/max version, ciphers, verify, CA file, client certificate, legacy renegotiation) for hosts matching PATTERN (example.com: it and its subdomains; *.example.com: subdomains; *: every host); the first match wins",
    "dns_cache_size": "names cached, as in the resolver study the design draws on",
    "dns_min_ttl": "floor on TTLs: very short TTLs would make the cache useless",
    "dns_max_ttl": "ceiling on TTLs: the refresh period of the resolver study",
    "robots_cache_size": "robots.txt decisions kept for this many origins (each up to 24 h)",
    "max_active_hosts": "hosts with work the scheduler holds in memory (about 330 B each); the rest wait in the frontier's host table on disk (0: no bound)",
    "host_window_turns": "turns a host keeps its place among the active hosts while others wait on disk, so none starves behind deep queues (0: until its queue is empty)",
    "sitemaps": "read the sitemaps robots.txt names: the site's own list of its pages, with last-modified times",
    "sitemap_xml": "off: /sitemap.xml is a guess that costs a request on every host whose robots.txt names none",
    "render": "never: a page is what its server sends; auto renders a page in a headless chromium when its HTML shows a script builds it (docs/rendering.md), always renders every HTML page",
    "browser_ws": "DevTools URL (ws://HOST:PORT/devtools/browser/ID) of a browser that already runs, used instead of starting one; empty: the node starts its own",
    "chromium": "the browser binary; empty: Debian's /usr/lib/chromium/chromium, else chromium or google-chrome on the PATH",
    "render_tabs": "renders at once: each takes a browser process of about 50-100 MB and a share of a core",
    "render_timeout": "seconds one render may take, its requests and their politeness waits included; a page still busy then is stopped and read as it is",
    "render_max_requests": "requests one render may make (documents, scripts, XHR): a page that asks for more gets the rest refused",
    "browser_max_pages": "renders before the browser is restarted: a browser's memory grows with the pages it has seen",
    "browser_max_mib": "memory of the browser's processes (proportional set size) past which it is restarted, checked 4 times a second while it renders",
    "dedup": "lmdb: the seen-set shares the frontier's transactions, so a crash loses nothing",
    "dedup_expected": "URLs a Bloom filter is sized for (--dedup bloom)",
    "dedup_fp_rate": "a Bloom filter's false-positive target: each false positive is a URL never crawled",
    "redis_url": "redis://HOST:PORT/DB for --dedup redis",
    "store": "warc keeps every page as WARC 1.1; none only crawls",
    "store_types": "content types written to the page store",
    "warc_max_bytes": "the usual WARC file rotation size",
    "sync_interval": "how often stores are forced to disk (kill -9 loses nothing committed anyway); a peer's batch is acknowledged after the next sync, one fsync for all",
    "store_check_timeout": "bound on the full read of the stores a start does after a run that did not stop cleanly (a crash, kill -9, power loss), in a child process, so damage LMDB would abort on is one clear error instead (0: no check)",
    "disk_min_free_mib": "below this much free space on the data directory's filesystem the node holds: no new fetch, no new URL admitted, what is under way finishes; it resumes by itself at a quarter more (room for the pages under way, their WARC records and the store's copy-on-write pages; 0: never hold)",
    "seen_filter_mib": "memory the seen-URL store's Bloom filter may take (8 bits a key for 1.25 times the keys it holds, up to this): 512 MiB is 8 bits a key up to 5.4 * 10^8 seen URLs (1.7% of checks of a new URL read the store); past that the share of such reads grows (12.7% at 10^9). A clean stop saves it beside the store, so the next start reads it instead of every key",
    "store_resident_mib": "file-backed memory (the store's mapped pages) the node holds before it hands them back to the kernel's page cache, checked 4 times a second: keeps RSS flat over a store of any size (0: never)",
    "upload": "s3://BUCKET/PREFIX: every closed WARC file and its CDXJ index go to S3-compatible storage as PREFIX/NODE_ID/FILE; empty: files stay on this disk",
    "upload_endpoint": "the S3 server's URL; empty: AWS_ENDPOINT_URL, else AWS's endpoint for the region",
    "upload_region": "the bucket's region; empty: AWS_REGION, else us-east-1",
    "upload_access_key": "empty: AWS_ACCESS_KEY_ID",
    "upload_secret_key": "empty: AWS_SECRET_ACCESS_KEY",
    "upload_part_bytes": "files larger than this go in parts of this size (S3 takes at least 5 MiB a part, at most 10,000 parts)",
    "upload_max_local_bytes": "closed files waiting for upload this node keeps before it stops fetching until the queue drains: 16 WARC files of the usual size",
    "keep_local": "off: a file is removed from this disk once its upload is verified",
    "webhook": "URL that gets a signed JSON POST for every WARC file uploaded (with upload) or closed (without); empty: none",
    "crawl_log": "redis://[:PASSWORD@]HOST:PORT/DB?stream=NAME&maxlen=N: every crawl-log record also goes to that Redis stream (XADD, MAXLEN ~ N; stream peercrawl:crawl-log, maxlen 10000000 when not given); empty: the local files only",
    "crawl_log_local": "both: DATA_DIR/crawl-log/crawl.log in Heritrix's layout and crawl.jsonl as JSON lines, one record per finished URL; text or json: one of them; off: none (the stream, if any, still gets every record)",
    "crawl_log_max_bytes": "a local crawl-log file this large is rotated (renamed with its UTC time); a day of a busy node's log",
    "crawl_log_rotate_seconds": "a local crawl-log file this old is rotated too, so a quiet node's log still turns over daily",
    "crawl_log_keep": "rotated local crawl-log files kept per format; the oldest go first",
    "crawl_log_spool": "crawl-log records the node's store keeps for a reader that is behind (a dead broker): about 200 MB; past it, records are dropped, counted and warned about, and the crawl goes on",
    "webhook_secret": "HMAC-SHA256 key of the webhook's X-Peercrawl-Signature header (at least 16 bytes; PEERCRAWL_WEBHOOK_SECRET keeps it out of the process list)",
    "revisit": "a crawl is one pass; on, every stored page is fetched again on an adaptive schedule",
    "revisit_min": "an hour (in seconds): the shortest revisit interval, for pages that change at every visit",
    "revisit_max": "30 days (in seconds): the longest revisit interval, for pages that never change",
    "payload_revisits": "a payload the cluster stored already under another URL costs a WARC revisit record, not a "
                        "second copy; off, every page is stored in full",
    "exit_when_done": "exit 0 once the frontier is empty and nothing is in flight",
    "max_crashes": "a URL in flight at this many stops in a row is dropped and recorded, so no page can make a node crash-loop (0: never)",
    "control_token": "bearer token of the control endpoint; empty: one is made at start in DATA_DIR/control.token (mode 0600) and the endpoint stays on loopback",
    "control_token_file": "file holding the control token (a Kubernetes secret); a set token lets the control endpoint listen beyond loopback",
    "parse_in_thread": "lxml parsing in a worker thread; inline is cheaper for small pages on few cores",
    "page_threads": "threads that store and parse pages (gzip, digests, lxml release the GIL); 0 = inline",
    "page_processes": "worker processes that parse pages and build their WARC records; 0 = inline: one node per core is cheaper per page (docs/operations.md, sizing)",
    "page_process_timeout": "seconds one page may hold a page worker before the worker is killed and the page sent again (a 10 MiB page parses in about 1 s)",
    "log_level": "info: one line per notable event, not per page",
    "log_format": "auto: JSON lines when stderr is not a terminal, text otherwise",
    "plugins": "the plug-in chain, from the TOML file's [[plugins]] tables in order (use = \"module:Class\" and the plug-in's settings; docs/plugins.md); none: pages go as they are",
    "plugin_timeout": "seconds one plug-in may take on one page (for a URL filter, on all its links): far above an extractor's milliseconds, far under a page worker's timeout",
}

_TUPLES = {f.name for f in dataclasses.fields(Config) if f.type == "tuple[str, ...]"}
#: Settings read from the TOML file only (tables, which the environment and flags cannot spell).
TOML_ONLY = frozenset({"hosts", "plugins"})
_TYPES = {f.name: f.type for f in dataclasses.fields(Config)}


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamTarget:
    """Where the crawl log streams to: a Redis server, its database and password, the stream and its bound."""

    host: str
    port: int
    db: int
    password: str | None
    stream: str
    maxlen: int

    def url(self) -> str:
        """The target as status shows it (no password)."""
        return f"redis://{self.host}:{self.port}/{self.db}?stream={self.stream}&maxlen={self.maxlen}"


#: The stream and its bound when the crawl_log URL names none: ten million records, a few GB in Redis.
DEFAULT_STREAM, DEFAULT_MAXLEN = "peercrawl:crawl-log", 10_000_000


def stream_target(url: str) -> StreamTarget:
    """Parse crawl_log (redis://[:PASSWORD@]HOST[:PORT][/DB][?stream=NAME&maxlen=N]); ConfigError if it is not
    one."""
    def bad(why: str) -> ConfigError:
        return ConfigError(f"crawl_log: {why}; expected redis://[:PASSWORD@]HOST:PORT/DB?stream=NAME&maxlen=N, "
                           f"got {url.split('@')[-1]!r}")

    try:
        parts = urlsplit(url)
        port = parts.port or 6379
    except ValueError as exc:
        raise bad(str(exc)) from None
    if parts.scheme != "redis":
        raise bad("only redis:// streams are supported")
    if not parts.hostname:
        raise bad("no host")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise bad(f"the database must be a number, not {path!r}")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = set(query) - {"stream", "maxlen"}
    if unknown:
        raise bad(f"unknown parameter {sorted(unknown)[0]!r}")
    stream = query.get("stream", [DEFAULT_STREAM])[-1]
    if not stream:
        raise bad("empty stream name")
    try:
        maxlen = int(query.get("maxlen", [str(DEFAULT_MAXLEN)])[-1])
    except ValueError:
        raise bad("maxlen must be a whole number") from None
    if maxlen < 1:
        raise bad("maxlen must be >= 1")
    return StreamTarget(host=parts.hostname, port=port, db=int(path or 0),
                        password=unquote(parts.password) if parts.password else None, stream=stream, maxlen=maxlen)


def parse_address(text: str, name: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) to a pair; a clear error otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"{name}: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _host_rules(value: Any, source: str) -> HostRules:
    if not isinstance(value, dict):
        raise ConfigError(f"hosts (from {source}): expected [hosts.\"PATTERN\"] tables")
    rules = []
    for pattern, settings in value.items():
        if not isinstance(settings, dict):
            raise ConfigError(f"hosts (from {source}): {pattern!r} must be a table of settings")
        unknown = sorted(set(k.replace("-", "_") for k in settings) - HOST_KEYS)
        if unknown:
            raise ConfigError(f"hosts (from {source}): {pattern!r}: unknown setting {unknown[0]!r} (known: "
                              f"{', '.join(sorted(HOST_KEYS))})")
        items = tuple((k.replace("-", "_"), tuple(v) if isinstance(v, list) else v) for k, v in settings.items())
        rules.append((str(pattern).strip().lower(), items))
    return tuple(rules)


def _coerce(name: str, value: Any, source: str) -> Any:
    kind = _TYPES[name]
    if name == "hosts":
        return _host_rules(value, source)
    try:
        if name in _TUPLES:
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)):
                raise TypeError("expected a list")
            return tuple(str(v) for v in value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"not a boolean: {value!r}")
        if kind == "int":
            if isinstance(value, bool):
                raise TypeError("expected an integer")
            return int(value)
        if kind == "float":
            return float(value)
        if not isinstance(value, (str, int, float)):
            raise TypeError(f"expected a {kind}")
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} (from {source}): {exc}") from exc


def _plugin_entries(value: Any, source: str) -> tuple[tuple[str, str], ...]:
    """The [[plugins]] tables as (use, settings as JSON): checked for form here, loaded by the node at start."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"plugins (from {source}): write each plug-in as a [[plugins]] table")
    entries = []
    for i, entry in enumerate(value):
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], str):
            entry = {**json.loads(entry[1]), "use": entry[0]}  # (use, settings as JSON), as Config keeps them
        use = entry.get("use") if isinstance(entry, dict) else None
        if not isinstance(use, str) or use.count(":") != 1 or not all(use.split(":")):
            raise ConfigError(f"plugins[{i}] (from {source}): use = \"module:Class\" is required, got {use!r}")
        settings = {k.replace("-", "_"): v for k, v in entry.items() if k != "use"}
        entries.append((use, json.dumps(settings, sort_keys=True, default=str)))
    return tuple(entries)


def _validate(cfg: Config) -> None:
    if cfg.weight <= 0:
        raise ConfigError(f"weight must be an integer > 0, got {cfg.weight}")
    if cfg.concurrency <= 0:
        raise ConfigError(f"concurrency must be > 0, got {cfg.concurrency}")
    if not 0 <= cfg.page_threads <= 256:
        raise ConfigError(f"page_threads must be within [0, 256], got {cfg.page_threads}")
    if not 0 <= cfg.page_processes <= 256:
        raise ConfigError(f"page_processes must be within [0, 256], got {cfg.page_processes}")
    if cfg.page_threads and cfg.page_processes:
        raise ConfigError(f"page_threads ({cfg.page_threads}) and page_processes ({cfg.page_processes}) both "
                          "move the same page work: set one of them")
    if not cfg.page_process_timeout > 0:
        raise ConfigError(f"page_process_timeout must be > 0 seconds, got {cfg.page_process_timeout}")
    if not cfg.plugin_timeout > 0:
        raise ConfigError(f"plugin_timeout must be > 0 seconds, got {cfg.plugin_timeout}")
    if cfg.disk_min_free_mib < 0:
        raise ConfigError(f"disk_min_free_mib must be >= 0 (0: never hold for disk space), got {cfg.disk_min_free_mib}")
    if cfg.seen_filter_mib < 1:
        raise ConfigError(f"seen_filter_mib must be >= 1, got {cfg.seen_filter_mib}")
    if cfg.store_resident_mib < 0:
        raise ConfigError(f"store_resident_mib must be >= 0 (0: never hand pages back), got {cfg.store_resident_mib}")
    if cfg.max_active_hosts < 0 or cfg.host_window_turns < 0:
        raise ConfigError(f"max_active_hosts and host_window_turns must be >= 0 (0: no bound), got "
                          f"{cfg.max_active_hosts} and {cfg.host_window_turns}")
    if cfg.delay < 0:
        raise ConfigError(f"delay must be >= 0, got {cfg.delay}")
    if not (cfg.store_check_timeout >= 0 and math.isfinite(cfg.store_check_timeout)):
        raise ConfigError(f"store_check_timeout must be a finite number of seconds >= 0 (0: no check), got "
                          f"{cfg.store_check_timeout}")
    if cfg.max_crashes < 0:
        raise ConfigError(f"max_crashes must be >= 0 (0: never drop), got {cfg.max_crashes}")
    token = cfg.control_token
    if token and (len(token) < 16 or not token.isascii() or not token.isprintable() or " " in token):
        raise ConfigError("control_token must be at least 16 printable ASCII characters without spaces")
    if cfg.ip_connections < 0:
        raise ConfigError(f"ip_connections must be >= 0 (0: no per-address limits), got {cfg.ip_connections}")
    if not (cfg.ip_delay >= 0 and math.isfinite(cfg.ip_delay)):
        raise ConfigError(f"ip_delay must be a finite number >= 0, got {cfg.ip_delay}")
    if cfg.ip_delay > 0 and cfg.ip_connections == 0:
        raise ConfigError("ip_delay needs ip_connections >= 1: the delay is kept per connection lane of an address")
    for name in ("max_depth", "max_pages_per_host", "max_bytes_per_host", "max_query_params"):
        if getattr(cfg, name) < -1:
            raise ConfigError(f"{name} must be -1 (no limit) or >= 0, got {getattr(cfg, name)}")
    if cfg.max_url_length < 1:
        raise ConfigError(f"max_url_length must be >= 1, got {cfg.max_url_length}")
    for name in ("include", "exclude"):
        for pattern in getattr(cfg, name):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{name}: invalid regular expression {pattern!r}: {exc}") from exc
    kinds = ("lmdb", "memory-urls", "memory-md5", "md5-tree", "bloom", "redis")
    if cfg.dedup not in kinds:
        raise ConfigError(f"dedup must be one of {', '.join(kinds)}, got {cfg.dedup!r}")
    if cfg.dedup == "redis" and not cfg.redis_url:
        raise ConfigError("dedup redis needs redis_url (--redis-url redis://HOST:PORT/DB)")
    if not 0 < cfg.revisit_min <= cfg.revisit_max:
        raise ConfigError(f"revisit_min ({cfg.revisit_min} s) must be > 0 and at most revisit_max "
                          f"({cfg.revisit_max} s)")
    if cfg.revisit and cfg.dedup != "lmdb":
        raise ConfigError(f"revisit needs dedup lmdb (got {cfg.dedup}): the schedule lives in the node's LMDB store")
    for url in cfg.proxy:
        if not re.match(r"(http|socks5h?)://[^/?#]+/?$", url):
            raise ConfigError(f"proxy: expected http://, socks5:// or socks5h://[USER:PASSWORD@]HOST[:PORT], got "
                              f"{url.split('://')[0]}://…")
    if cfg.proxy_retry <= 0:
        raise ConfigError(f"proxy_retry must be > 0 seconds, got {cfg.proxy_retry}")
    if cfg.store not in ("warc", "none"):
        raise ConfigError(f"store must be 'warc' or 'none', got {cfg.store!r}")
    if cfg.upload:
        bucket, _sep, _prefix = cfg.upload.removeprefix("s3://").partition("/")
        if not cfg.upload.startswith("s3://") or not bucket:
            raise ConfigError(f"upload must be s3://BUCKET/PREFIX, got {cfg.upload!r}")
        if cfg.store != "warc":
            raise ConfigError("upload needs store warc: there are no files to upload otherwise")
        if cfg.upload_part_bytes < 5 << 20:
            raise ConfigError(f"upload_part_bytes must be at least 5 MiB (S3's smallest part), got {cfg.upload_part_bytes}")
        if cfg.upload_max_local_bytes <= 0:
            raise ConfigError(f"upload_max_local_bytes must be > 0, got {cfg.upload_max_local_bytes}")
    if cfg.webhook:
        if not cfg.webhook.startswith(("http://", "https://")):
            raise ConfigError(f"webhook must be an http:// or https:// URL, got {cfg.webhook!r}")
        if len(cfg.webhook_secret.encode()) < 16:
            raise ConfigError("webhook needs webhook_secret (at least 16 bytes; PEERCRAWL_WEBHOOK_SECRET)")
        if cfg.store != "warc":
            raise ConfigError("webhook needs store warc: it announces WARC files")
    if cfg.crawl_log:
        stream_target(cfg.crawl_log)  # a bad URL is one clear error at start
    if cfg.crawl_log_local not in ("both", "text", "json", "off"):
        raise ConfigError(f"crawl_log_local must be both, text, json or off, got {cfg.crawl_log_local!r}")
    if cfg.crawl_log_max_bytes <= 0 or cfg.crawl_log_rotate_seconds <= 0 or cfg.crawl_log_keep < 1:
        raise ConfigError("crawl_log_max_bytes and crawl_log_rotate_seconds must be > 0 and crawl_log_keep >= 1")
    if cfg.crawl_log_spool < 1:
        raise ConfigError(f"crawl_log_spool must be >= 1 record, got {cfg.crawl_log_spool}")
    if cfg.render not in ("never", "auto", "always"):
        raise ConfigError(f"render must be never, auto or always, got {cfg.render!r}")
    for pattern, settings in cfg.hosts:
        for key, value in settings:
            if key == "render" and value not in ("never", "auto", "always"):
                raise ConfigError(f"hosts {pattern!r}: render must be never, auto or always, got {value!r}")
    if cfg.browser_ws and not cfg.browser_ws.startswith(("ws://", "wss://")):
        raise ConfigError(f"browser_ws must be a ws:// or wss:// DevTools URL, got {cfg.browser_ws!r}")
    if not 1 <= cfg.render_tabs <= 64:
        raise ConfigError(f"render_tabs must be within [1, 64], got {cfg.render_tabs}")
    if not cfg.render_timeout > 2:
        raise ConfigError(f"render_timeout must be > 2 seconds, got {cfg.render_timeout}")
    if cfg.render_max_requests < 1 or cfg.browser_max_pages < 1 or cfg.browser_max_mib < 64:
        raise ConfigError("render_max_requests and browser_max_pages must be >= 1, browser_max_mib >= 64")
    if cfg.log_format not in ("auto", "json", "text"):
        raise ConfigError(f"log_format must be auto, json or text, got {cfg.log_format!r}")
    try:
        check_zone(cfg.zone)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    parse_address(cfg.listen, "listen")
    parse_address(cfg.control, "control")
    if cfg.advertise:
        parse_address(cfg.advertise, "advertise")
    for seed in cfg.join:
        parse_address(seed, "join")
    if cfg.codec not in ("msgpack", "json"):
        raise ConfigError(f"codec must be msgpack or json, got {cfg.codec!r}")
    if cfg.compression not in ("br", "zlib", "none"):
        raise ConfigError(f"compression must be br, zlib or none, got {cfg.compression!r}")
    if not 0 <= cfg.replicas <= 8:
        raise ConfigError(f"replicas must be 0 (off) to 8, got {cfg.replicas}")
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {cfg.batch_size}")
    for name in ("dispatch_interval", "handoff_wait", "leave_timeout", "probe_interval", "probe_timeout",
                 "suspicion_timeout"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be > 0 seconds, got {getattr(cfg, name)}")
    if cfg.link_idle_timeout < 0:
        raise ConfigError(f"link_idle_timeout must be >= 0 seconds (0: links stay open), got {cfg.link_idle_timeout}")
    if cfg.max_links < 0:
        raise ConfigError(f"max_links must be >= 0 (0: no bound), got {cfg.max_links}")
    if cfg.probe_timeout >= cfg.probe_interval:
        raise ConfigError(f"probe_timeout ({cfg.probe_timeout} s) must be shorter than probe_interval "
                          f"({cfg.probe_interval} s): indirect probes need the rest of the interval")
    tls = (cfg.tls_cert, cfg.tls_key, cfg.tls_ca)
    if any(tls) and not all(tls):
        raise ConfigError("mutual TLS needs all three of tls_cert, tls_key and tls_ca")
    if cfg.control_token and cfg.control_token_file:
        raise ConfigError("give control_token or control_token_file, not both")
    if cfg.cluster_secret and cfg.cluster_secret_file:
        raise ConfigError("give cluster_secret or cluster_secret_file, not both")
    if cfg.cluster_secret and len(cfg.cluster_secret.encode()) < 16:
        raise ConfigError("cluster_secret must be at least 16 bytes")
    if (cfg.join or cfg.join_srv) and not (cfg.cluster_secret or cfg.cluster_secret_file):
        raise ConfigError("joining a cluster needs its secret (--cluster-secret-file FILE or PEERCRAWL_CLUSTER_SECRET)")


def load(
    *,
    toml: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Build a Config. ``toml`` is a file path; ``env`` the environment; ``flags`` the parsed CLI overrides
    (``None`` values mean "not given")."""
    values: dict[str, Any] = {}
    if toml:
        path = Path(toml)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
        for key, value in data.items():
            name = key.replace("-", "_")
            if name == "plugins":
                values[name] = _plugin_entries(value, str(path))
                continue
            if name not in _TYPES:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            values[name] = _coerce(name, value, str(path))
    for key, value in (env or {}).items():
        if not key.startswith("PEERCRAWL_"):
            continue
        name = key[len("PEERCRAWL_"):].lower()
        if name not in _TYPES:
            raise ConfigError(f"environment {key}: unknown setting")
        if name in TOML_ONLY:
            raise ConfigError(f"environment {key}: {name} is set in the TOML file only")
        values[name] = _coerce(name, value, f"environment {key}")
    for name, value in (flags or {}).items():
        if value is None:
            continue
        if name == "plugins":
            values[name] = _plugin_entries(value, "command line")
            continue
        if name not in _TYPES:
            raise ConfigError(f"unknown setting {name!r}")
        values[name] = _coerce(name, value, "command line")
    cfg = Config(**values)
    _validate(cfg)
    return cfg


def read_secret(cfg: Config) -> bytes | None:
    """The cluster secret as bytes, from the setting or its file; None for a standalone node."""
    if cfg.cluster_secret:
        return cfg.cluster_secret.encode()
    if not cfg.cluster_secret_file:
        return None
    try:
        secret = Path(cfg.cluster_secret_file).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cluster secret file {cfg.cluster_secret_file}: {exc.strerror or exc}") from exc
    if len(secret) < 16:
        raise ConfigError(f"cluster secret file {cfg.cluster_secret_file}: the secret must be at least 16 bytes")
    return secret


def read_control_token(cfg: Config) -> str | None:
    """The control token the operator set (the setting or its file), or None: the node then makes its own."""
    if cfg.control_token:
        return cfg.control_token
    if not cfg.control_token_file:
        return None
    try:
        token = Path(cfg.control_token_file).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"control token file {cfg.control_token_file}: {exc}") from exc
    if len(token) < 16 or not token.isprintable() or " " in token:
        raise ConfigError(f"control token file {cfg.control_token_file}: the token must be at least 16 printable "
                          "ASCII characters without spaces")
    return token


def read_seeds(cfg: Config) -> list[str]:
    """Seeds from flags/config plus the seeds file (one URL a line, blank lines and # comments skipped)."""
    seeds = list(cfg.seeds)
    if cfg.seeds_file:
        try:
            text = Path(cfg.seeds_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"seeds file {cfg.seeds_file}: {exc.strerror or exc}") from exc
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                seeds.append(line)
    return seeds

