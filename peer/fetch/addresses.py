"""Which IP addresses a crawler may connect to.

A crawler that follows links from the open web must not be steered into the operator's own network: a
public page can link to ``http://10.0.0.1/admin`` or to a name that resolves to ``127.0.0.1``. The resolver
checks every answer here, so the HTTP stack (which connects only to addresses the resolver returned) is
covered too. Tests and the local demo run on loopback and turn the check off (``allow_private``).
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

__all__ = ["ip_literal", "is_public_address", "refusal_reason"]


def ip_literal(host: str) -> str | None:
    """The canonical text of ``host`` if it is an IP literal (``[v6]`` brackets allowed), else None."""
    if not host:
        return None
    # Fast path: an IPv4 literal ends with a digit and an IPv6 literal holds a colon; a host name does
    # neither (a top-level domain is never all digits).
    if ":" not in host and not host[-1].isdigit():
        return None
    text = host[1:-1] if host[0] == "[" and host[-1] == "]" else host
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


@lru_cache(maxsize=4096)
def refusal_reason(ip: str) -> str | None:
    """Why a crawler must not connect to ``ip`` ("loopback", "private", ...), or None if it is public.

    Raises ValueError when ``ip`` is not an IP address.
    """
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address):
        mapped = addr.ipv4_mapped or addr.sixtofour
        if mapped is not None:
            return refusal_reason(str(mapped))
    if addr.is_loopback:
        return "loopback"
    if addr.is_link_local:
        return "link-local"
    if addr.is_unspecified:
        return "unspecified"
    if addr.is_multicast:
        return "multicast"
    if addr.is_reserved:
        return "reserved"
    if addr.is_private or not addr.is_global:
        # is_private covers RFC 1918, ULA, documentation and benchmarking ranges; not is_global adds
        # shared address space (100.64/10) and the like.
        return "private"
    return None


def is_public_address(ip: str) -> bool:
    """True when ``ip`` is an address on the public internet (not private, loopback, link-local, ...)."""
    return refusal_reason(ip) is None
