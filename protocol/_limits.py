"""Every size the protocol accepts is bounded, and every bound lives here.

The defaults fit the cluster's traffic with room to spare (a batch of 1,000 typical URLs is about 90 KB in
msgpack); a peer that needs more is either misconfigured or hostile. All members of a cluster should share the
same limits: a sender checks its own limits before sending, a receiver rejects anything over its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["Limits"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Upper bounds on what a peer may send; the unit is bytes (UTF-8 for strings) or items."""

    # 1 MiB: ten times a default batch, small enough that one frame per connection is cheap to buffer.
    max_frame: int = 1 << 20
    # 4 KiB: the largest frame accepted before the handshake completes. A real Hello or Challenge is under 300
    # bytes and a Reject under 600; a stranger who has proved nothing may make us hold no more than this.
    max_handshake_frame: int = 4096
    # Dispatch flushes at 1,000 URLs by default; 10,000 leaves headroom for a large --batch-size.
    max_urls_per_batch: int = 10_000
    # 2,048 bytes: the sitemaps protocol's limit; longer URLs are nearly always traps or session junk.
    max_url_length: int = 2048
    # Node ids, addresses, host names, codec names and reasons; a host name alone is at most 253 bytes.
    max_string: int = 1024
    # Members in a view, hosts in a hand-off chunk, offered versions and codecs.
    max_list: int = 10_000
    # Seen-URL keys per hand-off chunk: 65,536 keys of 16 bytes is about 1.2 MB with framing, near max_frame.
    max_keys_per_chunk: int = 65_536
    # The crawl settings as JSON (scope rules, budgets): 64 KiB is hundreds of patterns.
    max_settings: int = 65_536
    # A control request or answer passed between peers as JSON (a page of items): under max_frame with framing.
    max_control: int = 786_432
    # A seen-URL key is a ring position plus a fingerprint (16 bytes today); 64 leaves room to grow.
    max_key_length: int = 64
    # A server address as text: an IPv6 address with a zone fits in 64 bytes.
    max_address: int = 64
    # Lanes of one address in one grant or return: --ip-connections beyond this is not a per-address limit.
    max_lanes: int = 1024

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if type(value) is not int or value < 1:
                raise ValueError(f"Limits.{field.name} must be a positive integer, got {value!r}")
        if self.max_frame > 0xFFFF_FFFF:
            raise ValueError(f"Limits.max_frame must fit the 4-byte length field (<= {0xFFFF_FFFF})")
