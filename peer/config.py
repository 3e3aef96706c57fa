"""Node configuration: built-in defaults < TOML file < ``PEERCRAWL_*`` environment < command-line flags.

``load()`` is pure: it takes the TOML text (or path), the environment mapping and the flag overrides as
arguments, so every precedence rule is testable without touching the process. Every default carries a
one-line reason in ``FIELDS``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Config", "ConfigError", "load", "FIELDS", "parse_address", "read_seeds", "read_secret"]

DEFAULT_UA = "peercrawl/0.1"


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the setting and where it came from."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    # identity and cluster
    node_id: str = ""
    weight: int = 100
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
    batch_size: int = 500
    dispatch_interval: float = 0.2
    handoff_wait: float = 30.0
    leave_timeout: float = 120.0
    probe_interval: float = 1.0
    probe_timeout: float = 0.5
    suspicion_timeout: float = 5.0
    replicas: int = 1
    # what to crawl
    seeds: tuple[str, ...] = ()
    seeds_file: str = ""
    allowed_hosts: tuple[str, ...] = ()
    denied_hosts: tuple[str, ...] = ()
    max_depth: int = -1
    max_pages_per_host: int = -1
    max_redirect_hops: int = 5
    max_url_length: int = 2048
    # network
    nameservers: tuple[str, ...] = ()
    allow_private: bool = False
    user_agent: str = DEFAULT_UA
    contact: str = ""
    concurrency: int = 256
    delay: float = 1.0
    max_backoff: float = 600.0
    max_retries: int = 3
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    total_timeout: float = 60.0
    max_body: int = 10 * 2**20
    dns_cache_size: int = 50_000
    dns_min_ttl: float = 60.0
    dns_max_ttl: float = 1800.0
    robots_cache_size: int = 100_000
    # storage
    dedup: str = "lmdb"
    dedup_expected: int = 10_000_000
    dedup_fp_rate: float = 0.001
    redis_url: str = ""
    store: str = "warc"
    store_types: tuple[str, ...] = ("text/html", "application/xhtml+xml")
    warc_max_bytes: int = 1 << 30
    sync_interval: float = 1.0
    # behaviour
    exit_when_done: bool = False
    max_crashes: int = 3
    control_token: str = ""
    control_token_file: str = ""
    parse_in_thread: bool = False
    log_level: str = "info"
    log_format: str = "auto"

    def full_user_agent(self) -> str:
        """The honest User-Agent: product token, version, and the operator's contact URL when given."""
        if self.contact:
            return f"{self.user_agent} (+{self.contact})"
        return self.user_agent

    def resolved_node_id(self) -> str:
        if self.node_id:
            return self.node_id
        _, port = parse_address(self.listen, "listen")
        return f"{socket.gethostname()}:{port}"


#: One-line reason for every default, shown by ``peerd config --explain`` and in docs/operations.md.
FIELDS: dict[str, str] = {
    "node_id": "stable name of this node; empty means host name + listen port",
    "weight": "share of the ring; 100 is a neutral unit so weights read as percentages",
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
    "batch_size": "500 URLs per batch: about 60 KB, one write, far under the 1 MiB frame limit",
    "dispatch_interval": "200 ms: the design's flush timer; few messages, and links reach owners quickly",
    "handoff_wait": "30 s: a gained arc waits this long for its previous owner's hand-off before it is crawled anyway",
    "leave_timeout": "120 s for a graceful leave to hand everything off before the process exits regardless",
    "probe_interval": "1 s: each node probes one peer a second (memberlist's LAN profile)",
    "probe_timeout": "0.5 s for a Pong before indirect probes; raise it on links slower than a few hundred ms",
    "suspicion_timeout": "5 s to refute a suspicion before a silent node is declared dead",
    "replicas": "1: every queued URL is also held durably by the ring's next node, so one death at a time loses no URL; 0 turns it off",
    "seeds": "start URLs",
    "seeds_file": "file with one start URL per line (# comments allowed)",
    "allowed_hosts": "if set, only these hosts (and subdomains) are crawled",
    "denied_hosts": "hosts (and subdomains) never crawled",
    "max_depth": "-1 is unlimited: the scope and trap guards bound a crawl instead",
    "max_pages_per_host": "-1 is unlimited; set it to sample many hosts broadly",
    "max_redirect_hops": "5, as browsers and RFC 9309 do for robots.txt",
    "max_url_length": "2048: longer URLs are nearly always traps or session junk",
    "nameservers": "empty means /etc/resolv.conf; tests and the demo point at their own server",
    "allow_private": "private/loopback addresses are refused so a crawl cannot be turned on the local network",
    "user_agent": "product token first so robots.txt groups for 'peercrawl' match",
    "contact": "a URL or mail address where site owners can reach the operator; put it in the User-Agent",
    "concurrency": "256 fetches in flight keep one core busy on a wide crawl without piling up sockets",
    "delay": "1 s between requests to one host: polite by default; robots Crawl-delay can only raise it",
    "max_backoff": "10 min cap on per-host back-off after 429/503/errors",
    "max_retries": "3 retries of a URL after transient errors before it is given up",
    "connect_timeout": "10 s: a host that cannot connect in 10 s is effectively down",
    "read_timeout": "30 s between bytes: slow-drip servers are cut off",
    "total_timeout": "60 s for a whole response: bounds the time any one URL can hold a worker",
    "max_body": "10 MiB: larger bodies are cut there and marked truncated",
    "dns_cache_size": "50,000 names, as in the resolver study the design draws on",
    "dns_min_ttl": "60 s floor: very short TTLs would make the cache useless",
    "dns_max_ttl": "1800 s ceiling: the refresh period of the resolver study",
    "robots_cache_size": "robots.txt decisions kept for this many origins (each up to 24 h)",
    "dedup": "lmdb: the seen-set shares the frontier's transactions, so a crash loses nothing",
    "dedup_expected": "URLs a Bloom filter is sized for (--dedup bloom)",
    "dedup_fp_rate": "a Bloom filter's false-positive target: each false positive is a URL never crawled",
    "redis_url": "redis://HOST:PORT/DB for --dedup redis",
    "store": "warc keeps every page as WARC 1.1; none only crawls",
    "store_types": "content types written to the page store",
    "warc_max_bytes": "1 GiB WARC files, the usual rotation size",
    "sync_interval": "stores are forced to disk once a second; kill -9 loses nothing committed anyway",
    "exit_when_done": "exit 0 once the frontier is empty and nothing is in flight",
    "max_crashes": "3: a URL in flight at 3 stops in a row is dropped and recorded, so no page can make a node crash-loop (0: never)",
    "control_token": "bearer token of the control endpoint; empty: one is made at start in DATA_DIR/control.token (mode 0600) and the endpoint stays on loopback",
    "control_token_file": "file holding the control token (a Kubernetes secret); a set token lets the control endpoint listen beyond loopback",
    "parse_in_thread": "lxml parsing in a worker thread; inline is cheaper for small pages on few cores",
    "log_level": "info: one line per notable event, not per page",
    "log_format": "auto: JSON lines when stderr is not a terminal, text otherwise",
}

_TUPLES = {f.name for f in dataclasses.fields(Config) if f.type == "tuple[str, ...]"}
_TYPES = {f.name: f.type for f in dataclasses.fields(Config)}


def parse_address(text: str, name: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) to a pair; a clear error otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"{name}: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _coerce(name: str, value: Any, source: str) -> Any:
    kind = _TYPES[name]
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
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} (from {source}): {exc}") from exc


def _validate(cfg: Config) -> None:
    if cfg.weight <= 0:
        raise ConfigError(f"weight must be an integer > 0, got {cfg.weight}")
    if cfg.concurrency <= 0:
        raise ConfigError(f"concurrency must be > 0, got {cfg.concurrency}")
    if cfg.delay < 0:
        raise ConfigError(f"delay must be >= 0, got {cfg.delay}")
    if cfg.max_crashes < 0:
        raise ConfigError(f"max_crashes must be >= 0 (0: never drop), got {cfg.max_crashes}")
    token = cfg.control_token
    if token and (len(token) < 16 or not token.isascii() or not token.isprintable() or " " in token):
        raise ConfigError("control_token must be at least 16 printable ASCII characters without spaces")
    kinds = ("lmdb", "memory-urls", "memory-md5", "md5-tree", "bloom", "redis")
    if cfg.dedup not in kinds:
        raise ConfigError(f"dedup must be one of {', '.join(kinds)}, got {cfg.dedup!r}")
    if cfg.dedup == "redis" and not cfg.redis_url:
        raise ConfigError("dedup redis needs redis_url (--redis-url redis://HOST:PORT/DB)")
    if cfg.store not in ("warc", "none"):
        raise ConfigError(f"store must be 'warc' or 'none', got {cfg.store!r}")
    if cfg.log_format not in ("auto", "json", "text"):
        raise ConfigError(f"log_format must be auto, json or text, got {cfg.log_format!r}")
    parse_address(cfg.listen, "listen")
    parse_address(cfg.control, "control")
    if cfg.advertise:
        parse_address(cfg.advertise, "advertise")
    for seed in cfg.join:
        parse_address(seed, "join")
    if cfg.codec not in ("msgpack", "json"):
        raise ConfigError(f"codec must be msgpack or json, got {cfg.codec!r}")
    if not 0 <= cfg.replicas <= 8:
        raise ConfigError(f"replicas must be 0 (off) to 8, got {cfg.replicas}")
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {cfg.batch_size}")
    for name in ("dispatch_interval", "handoff_wait", "leave_timeout", "probe_interval", "probe_timeout",
                 "suspicion_timeout"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be > 0 seconds, got {getattr(cfg, name)}")
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
            if name not in _TYPES:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            values[name] = _coerce(name, value, str(path))
    for key, value in (env or {}).items():
        if not key.startswith("PEERCRAWL_"):
            continue
        name = key[len("PEERCRAWL_"):].lower()
        if name not in _TYPES:
            raise ConfigError(f"environment {key}: unknown setting")
        values[name] = _coerce(name, value, f"environment {key}")
    for name, value in (flags or {}).items():
        if value is None:
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

