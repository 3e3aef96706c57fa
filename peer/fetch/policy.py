"""What the fetcher does per host: HTTP/2 on or off, which proxies, which TLS settings.

A `HostPolicy` is the node-wide default; `HostPolicies` adds rules by host pattern (``example.com`` is that host
and its subdomains, ``*.example.com`` the subdomains only, ``*`` every host), tried in the order given; the first
rule that matches decides every setting it names, and the default decides the rest. A ``*`` rule sets the
default itself, wherever it stands. The answer for a host is
remembered (a crawl asks once per connection, for the same few thousand hosts).

Each distinct TLS policy gets one `ssl.SSLContext`, built on first use and kept: contexts are expensive to build
(the system's CA store is read) and cheap to share.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from peer.config import HOST_KEYS
from peer.fetch.proxies import ProxyPool, parse_proxy

__all__ = ["HostPolicies", "HostPolicy", "POLICY_KEYS", "TLS_VERSIONS", "host_matches"]

#: ``tls_min_version`` / ``tls_max_version`` names, as OpenSSL spells them.
TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = {
    "TLSv1": ssl.TLSVersion.TLSv1,
    "TLSv1.1": ssl.TLSVersion.TLSv1_1,
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}

#: The settings of a host rule (TOML ``[hosts."PATTERN"]`` tables) that the fetcher applies; the rest
#: (``render``) are the render decision's (peer/render/decision.py).
POLICY_KEYS = HOST_KEYS - {"render"}


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsPolicy:
    """One TLS configuration; hashable, so equal policies share one context."""

    min_version: str = ""  # "" : OpenSSL's default floor (TLS 1.2 on Debian 12)
    max_version: str = ""
    ciphers: str = ""  # OpenSSL cipher list for TLS 1.2 and below; "" : OpenSSL's default
    verify: bool = True
    ca_file: str = ""  # "" : the system's CA store
    client_cert: str = ""
    client_key: str = ""
    legacy_renegotiation: bool = False

    def context(self, alpn: Sequence[str]) -> ssl.SSLContext:
        return _context(self, tuple(alpn))


@lru_cache(maxsize=256)
def _context(policy: TlsPolicy, alpn: tuple[str, ...]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=policy.ca_file or None)
    if not policy.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if policy.min_version:
        if TLS_VERSIONS[policy.min_version] < ssl.TLSVersion.TLSv1_2:
            # OpenSSL's security level 2 refuses TLS 1.0/1.1 whatever the floor says; level 0 lets the floor decide.
            context.set_ciphers((policy.ciphers or "DEFAULT") + ":@SECLEVEL=0")
        context.minimum_version = TLS_VERSIONS[policy.min_version]
    if policy.max_version:
        context.maximum_version = TLS_VERSIONS[policy.max_version]
    if policy.ciphers and not (policy.min_version and TLS_VERSIONS[policy.min_version] < ssl.TLSVersion.TLSv1_2):
        context.set_ciphers(policy.ciphers)
    if policy.legacy_renegotiation:
        context.options |= getattr(ssl, "OP_LEGACY_SERVER_CONNECT", 0x4)
    if policy.client_cert:
        context.load_cert_chain(policy.client_cert, policy.client_key or None)
    context.set_alpn_protocols(list(alpn))
    return context


@dataclass(frozen=True, slots=True, kw_only=True)
class HostPolicy:
    """What to do with one host's connections."""

    http2: bool = True
    proxies: ProxyPool | None = None
    tls: TlsPolicy = TlsPolicy()

    def alpn(self) -> tuple[str, ...]:
        return ("h2", "http/1.1") if self.http2 else ("http/1.1",)

    def ssl_context(self) -> ssl.SSLContext:
        return self.tls.context(self.alpn())


def host_matches(pattern: str, host: str) -> bool:
    """``*`` : every host; ``*.example.com`` : its subdomains; ``example.com`` : it and its subdomains."""
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern or host.endswith("." + pattern)


class HostPolicies:
    """The default policy and rules by host pattern; `for_host` answers which applies (first match wins)."""

    def __init__(self, default: HostPolicy, rules: Sequence[tuple[str, HostPolicy]] = ()) -> None:
        self.default = default
        self._rules = list(rules)
        self._cache: dict[str, HostPolicy] = {}

    @classmethod
    def build(cls, *, http2: bool, proxy: Sequence[str], tls: Mapping[str, Any],
              hosts: Sequence[tuple[str, Mapping[str, Any]]], credentials: tuple[str, str] | None = None,
              proxy_retry: float = 30.0) -> HostPolicies:
        """From the node's settings: ``http2`` and ``proxy`` (URLs) and ``tls`` (``tls_*`` keys) for every host,
        and rules ``(pattern, settings)`` whose settings name any of `POLICY_KEYS`. Raises ValueError for a
        value that cannot be used (a bad proxy URL, an unknown TLS version, a certificate that does not load)."""
        base_tls = _tls(TlsPolicy(), tls)
        pools: dict[tuple[str, ...], ProxyPool] = {}

        def pool(urls: Sequence[str]) -> ProxyPool | None:
            key = tuple(urls)
            if not key:
                return None
            if key not in pools:
                pools[key] = ProxyPool([parse_proxy(u, credentials) for u in key], retry_after=proxy_retry)
            return pools[key]

        default = HostPolicy(http2=http2, proxies=pool(proxy), tls=base_tls)
        # `*` sets every host's defaults (beneath the other patterns, wherever it stands); the others override
        for pattern, settings in hosts:
            if pattern.strip() == "*":
                default = cls._apply(default, "*", settings, pool)
        rules = []
        for pattern, settings in hosts:
            if pattern.strip() == "*":
                continue
            rules.append((pattern.lower(), cls._apply(default, pattern, settings, pool)))
        default.ssl_context()
        return cls(default, rules)

    @staticmethod
    def _apply(policy: HostPolicy, pattern: str, settings: Mapping[str, Any],
               pool: Callable[[Sequence[str]], ProxyPool | None]) -> HostPolicy:
        unknown = set(settings) - HOST_KEYS
        if unknown:
            raise ValueError(f"hosts {pattern!r}: unknown setting {sorted(unknown)[0]!r}")
        if not pattern or (pattern != "*" and not pattern.lstrip("*.")):
            raise ValueError(f"hosts: empty host pattern {pattern!r}")
        if "http2" in settings:
            policy = dataclasses.replace(policy, http2=_bool(settings["http2"], f"hosts {pattern!r}: http2"))
        if "proxy" in settings:
            urls = settings["proxy"]
            urls = [urls] if isinstance(urls, str) else list(urls)
            policy = dataclasses.replace(policy, proxies=pool([u for u in urls if u and u != "direct"]))
        policy = dataclasses.replace(policy, tls=_tls(policy.tls, settings, pattern))
        policy.ssl_context()  # a certificate that does not load is an error at start, not at the first fetch
        return policy

    def for_host(self, host: str) -> HostPolicy:
        policy = self._cache.get(host)
        if policy is None:
            policy = next((p for pattern, p in self._rules if host_matches(pattern, host)), self.default)
            if len(self._cache) >= 65536:
                self._cache.clear()
            self._cache[host] = policy
        return policy

    def proxy_pools(self) -> list[ProxyPool]:
        pools = [] if self.default.proxies is None else [self.default.proxies]
        for _, policy in self._rules:
            if policy.proxies is not None and all(policy.proxies is not p for p in pools):
                pools.append(policy.proxies)
        return pools


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "1", "yes"):
        return True
    if text in ("off", "false", "0", "no"):
        return False
    raise ValueError(f"{what}: expected on or off, got {value!r}")


def _tls(base: TlsPolicy, settings: Mapping[str, Any], pattern: str = "") -> TlsPolicy:
    where = f"hosts {pattern!r}: " if pattern else ""
    changes: dict[str, Any] = {}
    for key in ("tls_min_version", "tls_max_version"):
        value = settings.get(key)
        if value:
            if value not in TLS_VERSIONS:
                raise ValueError(f"{where}{key} must be one of {', '.join(TLS_VERSIONS)}, got {value!r}")
            changes[key[4:]] = value
    for key in ("tls_ciphers", "tls_ca_file", "tls_client_cert", "tls_client_key"):
        if settings.get(key):
            changes[key[4:]] = str(settings[key])
    if "tls_verify" in settings:
        changes["verify"] = _bool(settings["tls_verify"], f"{where}tls_verify")
    if "tls_legacy_renegotiation" in settings:
        changes["legacy_renegotiation"] = _bool(settings["tls_legacy_renegotiation"],
                                                f"{where}tls_legacy_renegotiation")
    policy = dataclasses.replace(base, **changes)
    if policy.min_version and policy.max_version and (
            TLS_VERSIONS[policy.min_version] > TLS_VERSIONS[policy.max_version]):
        raise ValueError(f"{where}tls_min_version {policy.min_version} is above tls_max_version {policy.max_version}")
    if policy.client_key and not policy.client_cert:
        raise ValueError(f"{where}tls_client_key needs tls_client_cert")
    try:
        policy.context(("http/1.1",))
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"{where}TLS settings do not load: {exc}") from exc
    return policy
