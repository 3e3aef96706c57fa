"""Fetching: getting bytes from the web safely. The HTTP client (HTTP/1.1 or HTTP/2 by ALPN over trio, a
per-origin connection pool, bounded body decoding, proxies and TLS settings per host pattern), the node's caching DNS resolver, and the address policy that refuses private,
loopback and link-local addresses unless the operator allows them. Failures are a tree of types
(`peer.fetch.errors`) whose labels are the metric labels. Knows nothing of crawling or the cluster.
"""

from peer.fetch.addresses import ip_literal, is_public_address, refusal_reason
from peer.fetch.decoding import BodyDecoder, DecodeError, make_decoder
from peer.fetch.dns import CachingResolver, DnsStats, Resolver, parse_nameserver, system_nameservers
from peer.fetch.errors import (
    TRANSIENT,
    AddressRefused,
    ConnectFailed,
    ConnectTimeout,
    CorruptBody,
    DnsError,
    DnsTimeout,
    FetchError,
    FetchTimeout,
    HttpProtocolError,
    InvalidUrl,
    NoAddress,
    NxDomain,
    ProxyFailed,
    ReadTimeout,
    RefusedAddress,
    ResolveFailed,
    ResponseTooLarge,
    ServFail,
    SocketsExhausted,
    TlsCertificateFailed,
    TlsFailed,
    TlsVersionFailed,
)
from peer.fetch.http import BodySink, Fetcher, HttpxTransport, Response
from peer.fetch.policy import HostPolicies, HostPolicy, TlsPolicy
from peer.fetch.proxies import Proxy, ProxyPool, parse_proxy

__all__ = [
    "TRANSIENT", "AddressRefused", "ConnectFailed", "ConnectTimeout", "CorruptBody", "DnsTimeout", "FetchTimeout",
    "HttpProtocolError", "InvalidUrl", "NoAddress", "NxDomain", "ProxyFailed", "ReadTimeout", "RefusedAddress",
    "ResolveFailed", "ResponseTooLarge", "ServFail", "SocketsExhausted", "TlsCertificateFailed", "TlsFailed",
    "TlsVersionFailed", "HostPolicies", "HostPolicy", "Proxy", "ProxyPool", "TlsPolicy", "parse_proxy",
    "BodyDecoder", "BodySink", "CachingResolver", "DecodeError", "DnsError", "DnsStats", "FetchError", "Fetcher",
    "HttpxTransport", "Resolver", "Response", "ip_literal", "is_public_address", "make_decoder",
    "parse_nameserver", "refusal_reason", "system_nameservers",
]
