"""Fetching: getting bytes from the web safely. The HTTP client (h11 over trio, a per-origin connection pool,
bounded body decoding), the node's caching DNS resolver, and the address policy that refuses private,
loopback and link-local addresses unless the operator allows them. Knows nothing of crawling or the cluster.
"""

from peer.fetch.addresses import ip_literal, is_public_address, refusal_reason
from peer.fetch.decoding import BodyDecoder, DecodeError, make_decoder
from peer.fetch.dns import CachingResolver, DnsError, DnsStats, Resolver, parse_nameserver, system_nameservers
from peer.fetch.http import BodySink, FetchError, Fetcher, HttpxTransport, Response

__all__ = [
    "BodyDecoder", "CachingResolver", "DecodeError", "DnsError", "DnsStats", "FetchError", "Fetcher",
    "HttpxTransport", "Resolver", "Response", "ip_literal", "is_public_address", "make_decoder",
    "parse_nameserver", "refusal_reason", "system_nameservers",
]
