"""Finding members to join through: the peer addresses a DNS SRV record lists (``--join-srv``).

A Kubernetes headless service with a named port publishes one SRV record per pod under
``_PORT._tcp.SERVICE.NAMESPACE.svc.cluster.local``; any member found there is a seed to join through. The
look-up is dnspython's asynchronous resolver, which runs on trio through its trio backend, pointed at the
given name servers (``"ADDR[:PORT]"``, as ``Config.nameservers``) or at those of /etc/resolv.conf (with its
search list, so a relative name works as it does for libc).

The answer is ordered by priority (lowest first), then weight (highest first), then target and port, so the
same records always give the same order on every node; a node tries seeds in that order. Our own address is
left out (``exclude``): a new cluster's first member finds only itself and gets an empty list, which means
"start a new cluster". Every failure is one :class:`DiscoveryError` line naming the SRV name and the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import dns.asyncresolver
import dns.exception
import dns.name
import dns.nameserver
import dns.rdatatype
import dns.resolver
import trio

from peer.fetch.dns import parse_nameserver

__all__ = ["DiscoveryError", "srv_seeds"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.discovery")

_PER_SERVER_TIMEOUT = 2.0  # dnspython's own default wait for one server before it asks the next


class DiscoveryError(Exception):
    """The SRV name gave no seeds; the message names it and says why (one line)."""


def _host_port(text: str) -> str:
    """``host:port`` in the form compared against ``exclude``: lower case, no trailing dot on the host."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        return text.strip().lower().rstrip(".")
    return f"{host.lower().rstrip('.')}:{port}"


def _make_resolver(nameservers: Sequence[str], name: str) -> dns.asyncresolver.Resolver:
    if not nameservers:
        try:
            return dns.asyncresolver.Resolver(configure=True)
        except dns.resolver.NoResolverConfiguration as exc:
            raise DiscoveryError(f"SRV {name}: no name server configured ({exc})") from exc
    resolver = dns.asyncresolver.Resolver(configure=False)
    servers: list[str | dns.nameserver.Nameserver] = []
    for text in nameservers:
        try:
            ip, port = parse_nameserver(text)
        except ValueError as exc:
            raise DiscoveryError(f"SRV {name}: {exc}") from exc
        servers.append(dns.nameserver.Do53Nameserver(ip, port))
    resolver.nameservers = servers
    return resolver


async def srv_seeds(
    name: str,
    *,
    nameservers: Sequence[str] = (),
    timeout: float = 5.0,
    exclude: Collection[str] = (),
) -> list[str]:
    """The ``"target:port"`` peer addresses the SRV record ``name`` lists, best first, without ``exclude``.

    Raises :class:`DiscoveryError` when the name does not exist, has no SRV record, or no name server
    answered within ``timeout`` seconds (the bound on the whole look-up, retransmissions included).
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if not name.strip():
        raise DiscoveryError("SRV name is empty")
    try:
        dns.name.from_text(name)
    except dns.exception.DNSException as exc:
        raise DiscoveryError(f"SRV {name}: not a valid DNS name ({exc})") from exc
    resolver = _make_resolver(nameservers, name)
    # Each server gets a share of the time, so a silent first server leaves time to ask the others.
    resolver.timeout = min(_PER_SERVER_TIMEOUT, timeout / (2 * max(1, len(resolver.nameservers))))
    servers = ", ".join(str(s) for s in resolver.nameservers) or "no servers"
    answer = None
    # dnspython bounds the look-up with ``lifetime`` (on the wall clock); the trio deadline is the backstop.
    with trio.move_on_after(timeout + 1.0):
        try:
            answer = await resolver.resolve(name, dns.rdatatype.SRV, search=True, lifetime=timeout)
        except dns.resolver.NXDOMAIN as exc:
            raise DiscoveryError(f"SRV {name}: no such name (NXDOMAIN)") from exc
        except dns.resolver.NoAnswer as exc:
            raise DiscoveryError(f"SRV {name}: the name exists but has no SRV record") from exc
        except dns.exception.Timeout as exc:
            raise DiscoveryError(f"SRV {name}: no answer from {servers} within {timeout:g} s") from exc
        except dns.resolver.NoNameservers as exc:
            raise DiscoveryError(f"SRV {name}: every name server failed ({_first_line(exc)})") from exc
        except dns.exception.DNSException as exc:
            raise DiscoveryError(f"SRV {name}: {_first_line(exc)}") from exc
    if answer is None:
        raise DiscoveryError(f"SRV {name}: no answer from {servers} within {timeout:g} s")
    records = sorted(
        (r.priority, -r.weight, r.target.to_text(omit_final_dot=True).lower(), r.port) for r in answer
    )
    # RFC 2782: a target of "." means the service is decidedly not available there.
    available = [f"{target}:{port}" for _, _, target, port in records if target not in ("", ".")]
    if not available:
        raise DiscoveryError(f"SRV {name}: every record says the service is not available (target '.')")
    excluded = {_host_port(e) for e in exclude}
    seeds: list[str] = []
    for address in available:
        if address not in excluded and address not in seeds:
            seeds.append(address)
    log.info("SRV seeds", extra={"srv": name, "seeds": seeds, "records": len(records)})
    return seeds


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
