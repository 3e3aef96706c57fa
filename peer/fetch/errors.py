"""The fetch room's errors, as a tree of types (as httpx's): callers catch by class, and each class's ``label``
is the string the node's counters and metrics use (``peercrawl_errors{kind=...}``, the DNS failure counts).

```
FetchError                      a fetch failed                                   label
├── InvalidUrl                  the URL cannot be fetched (scheme, host)         protocol
├── ResolveFailed               the host name did not resolve (DnsError below)   dns
├── AddressRefused              it resolved to an address the policy refuses     refused-address
├── ConnectFailed               TCP connect refused, unreachable, reset          connect
│   └── ProxyFailed             the proxy is unreachable or broke its handshake  proxy
├── TlsFailed                   TLS handshake failed (reset, no shared cipher)   tls
│   ├── TlsCertificateFailed    untrusted, expired or wrong-name certificate     tls-certificate
│   └── TlsVersionFailed        no TLS version both sides allow                  tls-version
├── FetchTimeout                no complete response within the total timeout    timeout
│   ├── ConnectTimeout          the TCP and TLS handshakes took too long         timeout
│   └── ReadTimeout             no data for the read timeout                     timeout
└── HttpProtocolError           the server broke HTTP (/1.1 or /2)               protocol
    ├── CorruptBody             a Content-Encoding that does not decode          protocol
    └── ResponseTooLarge        a response head over 64 KiB                      too-large

DnsError                        a name did not resolve to a usable address
├── NxDomain                    no such name (or not a valid host name)          nxdomain
├── ServFail                    the server answered an error, or TCP retry failed servfail
├── DnsTimeout                  no answer from any server in time                timeout
├── NoAddress                   the name exists but has no A or AAAA record      no-address
├── RefusedAddress              the answer is a private/loopback/link-local IP   refused-address
└── SocketsExhausted            the node could not open a socket (EMFILE, ENOBUFS) resources
```

A subclass keeps its parent's label unless it names its own, so the tree may grow finer than the metrics
without changing what operators see. Transient failures (worth another try later) are ``TRANSIENT``.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "TRANSIENT", "AddressRefused", "ConnectFailed", "ConnectTimeout", "CorruptBody", "DnsError", "DnsTimeout",
    "FetchError", "FetchTimeout", "HttpProtocolError", "InvalidUrl", "NoAddress", "NxDomain", "ReadTimeout",
    "ProxyFailed", "RefusedAddress", "ResolveFailed", "ResponseTooLarge", "ServFail", "SocketsExhausted",
    "TlsCertificateFailed", "TlsFailed", "TlsVersionFailed",
]


class FetchError(Exception):
    """A fetch failed; the message names the URL and what went wrong. ``label`` is the metric label."""

    label: ClassVar[str] = "error"


class InvalidUrl(FetchError):
    """The URL cannot be fetched: not http(s), no host, or a host that is not a valid name (the caller's)."""

    label = "protocol"


class ResolveFailed(FetchError):
    """The host name did not resolve; ``__cause__`` is the `DnsError` that says why."""

    label = "dns"


class AddressRefused(FetchError):
    """The host resolved to an address the node's policy refuses (private, loopback, link-local)."""

    label = "refused-address"


class ConnectFailed(FetchError):
    """The TCP connection could not be made (refused, unreachable, reset)."""

    label = "connect"


class TlsFailed(FetchError):
    """The TLS handshake failed: untrusted or wrong certificate, or the server closed it."""

    label = "tls"


class ProxyFailed(ConnectFailed):
    """The proxy could not be reached, or broke or garbled its handshake (it then rests: `ProxyPool`)."""

    label = "proxy"


class TlsCertificateFailed(TlsFailed):
    """The server's certificate is not trusted, has expired, or does not name the host."""

    label = "tls-certificate"


class TlsVersionFailed(TlsFailed):
    """The server and the host's TLS policy share no protocol version."""

    label = "tls-version"


class FetchTimeout(FetchError):
    """No complete response within the whole-fetch timeout (DNS, the origin's slot, connect and read)."""

    label = "timeout"


class ConnectTimeout(FetchTimeout):
    """The TCP and TLS handshakes took longer than the connect timeout."""


class ReadTimeout(FetchTimeout):
    """No data from the server for the read timeout."""


class HttpProtocolError(FetchError):
    """The server broke HTTP (/1.1 or /2): a malformed response or frame, a reset stream, a connection closed or
    broken mid-response."""

    label = "protocol"


class CorruptBody(HttpProtocolError):
    """The body does not decode from its Content-Encoding."""


class ResponseTooLarge(HttpProtocolError):
    """The response head (status line and headers) exceeds the limit."""

    label = "too-large"


# Failures that may pass: the crawler re-queues the URL with back-off for these (and 429/503).
TRANSIENT: tuple[type[FetchError], ...] = (ConnectFailed, FetchTimeout)


class DnsError(Exception):
    """A name could not be resolved to an address the crawler may use. ``label`` is the metric label."""

    label: ClassVar[str] = "dns"


class NxDomain(DnsError):
    """No such name (NXDOMAIN), or a name that is not a valid host name."""

    label = "nxdomain"


class ServFail(DnsError):
    """The name server answered with an error code, or asking again over TCP failed."""

    label = "servfail"


class DnsTimeout(DnsError):
    """No answer from any name server within the look-up timeout."""

    label = "timeout"


class NoAddress(DnsError):
    """The name exists but has no A or AAAA record."""

    label = "no-address"


class RefusedAddress(DnsError):
    """The name resolves only to an address the policy refuses (private, loopback, link-local)."""

    label = "refused-address"


class SocketsExhausted(DnsError):
    """The node could not open a socket for the question (out of file descriptors or buffers): the node's
    trouble, not the name's; the name fails now and the node goes on."""

    label = "resources"
