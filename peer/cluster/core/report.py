"""What a cluster node tells about itself and its ring, in the forms the dashboard and the peers read: the ring
folded into slices for the picture, the slices still awaiting a hand-off, and a node's summary as the
`StatusReport` its peers receive (and back). Pure functions of what they are given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol import Count, OutputState, PluginOff, SlowHost, StatusReport, Transfer
from ring import RING_SPACE, Ring

__all__ = ["SLICE_SAMPLES", "ring_pending", "ring_slices", "status_dict", "status_report"]

#: Positions sampled per slice of the ring's picture.
SLICE_SAMPLES = 16


def ring_slices(ring: Ring, slices: int, samples: int = SLICE_SAMPLES) -> list[dict[str, float]]:
    """Each node's share of each of `slices` equal slices of the ring, estimated from `samples` evenly spaced
    positions per slice: a picture's worth (a ring of a few hundred thousand points folded exactly takes most of
    a second; this takes milliseconds)."""
    step = RING_SPACE // (slices * samples)
    owners = ring.owners_at([i * step + step // 2 for i in range(slices * samples)])
    out = []
    for k in range(slices):
        counts: dict[str, int] = {}
        for owner in owners[k * samples:(k + 1) * samples]:
            counts[owner] = counts.get(owner, 0) + 1
        out.append({node: round(n / samples, 4) for node, n in counts.items()})
    return out


def ring_pending(blocked: Callable[[int], bool], slices: int, samples: int = SLICE_SAMPLES) -> list[float]:
    """The fraction of each slice of the ring that waits for a hand-off, from the same sampled positions."""
    step = RING_SPACE // (slices * samples)
    return [sum(1 for i in range(k * samples, (k + 1) * samples) if blocked(i * step + step // 2)) / samples
            for k in range(slices)]


def _short(text: str, size: int = 1000) -> str:
    """`text` cut to at most `size` bytes of UTF-8 (a string of a message is bounded in bytes)."""
    return text.encode("utf-8")[:size].decode("utf-8", "ignore")


def status_report(seq: int, d: dict[str, Any]) -> StatusReport:
    """A node's summary (`Node.summary`) as the message its peers receive."""
    def counts(m: dict[str, int]) -> tuple[Count, ...]:
        return tuple(Count(name=str(k), count=int(v)) for k, v in sorted(m.items()))

    return StatusReport(
        seq=seq, pages=d["pages"], bytes=d["bytes"], queued=d["queued"], in_flight=d["in_flight"],
        hosts_queued=d["hosts_queued"], hosts_known=d["hosts_known"], rss=d["rss"], idle_for=float(d["idle_for"]),
        errors=counts(d["errors"]), dns_hits=d["dns"]["hits"], dns_misses=d["dns"]["misses"],
        robots_hits=d["robots"]["hits"], robots_misses=d["robots"]["misses"], history=tuple(d["history"]),
        window=float(d["window"]), sent=counts(d["sent"]), sent_recent=counts(d["sent_recent"]),
        slow_hosts=tuple(SlowHost(host=h["host"], delay=float(h["delay"]), backoff=float(h["backoff"]),
                                  failures=h["failures"], queued=h["queued"]) for h in d["slow_hosts"]),
        transfers=tuple(Transfer(peer=t["peer"], incoming=t["incoming"], share=float(t["share"]), chunks=t["chunks"])
                        for t in d["transfers"]),
        outputs=tuple(OutputState(**{**o, "failing_for": float(o["failing_for"]), "lag": float(o["lag"])})
                      for o in d.get("outputs", ())),
        plugins_off=tuple(PluginOff(use=_short(p["use"]), reason=_short(p["reason"])) for p in d.get("plugins_off", ())),
    )


def status_dict(r: StatusReport) -> dict[str, Any]:
    """A peer's StatusReport in the form of `Node.summary`."""
    return {
        "pages": r.pages, "bytes": r.bytes, "queued": r.queued, "in_flight": r.in_flight,
        "hosts_queued": r.hosts_queued, "hosts_known": r.hosts_known, "rss": r.rss, "idle_for": r.idle_for,
        "errors": {c.name: c.count for c in r.errors}, "dns": {"hits": r.dns_hits, "misses": r.dns_misses},
        "robots": {"hits": r.robots_hits, "misses": r.robots_misses}, "history": list(r.history),
        "window": r.window, "sent": {c.name: c.count for c in r.sent},
        "sent_recent": {c.name: c.count for c in r.sent_recent},
        "slow_hosts": [{"host": h.host, "delay": h.delay, "backoff": h.backoff, "failures": h.failures,
                        "queued": h.queued} for h in r.slow_hosts],
        "transfers": [{"peer": t.peer, "incoming": t.incoming, "share": t.share, "chunks": t.chunks}
                      for t in r.transfers],
        "outputs": [{"kind": o.kind, "target": o.target, "ok": o.ok, "error": o.error, "failing_for": o.failing_for,
                     "waiting": o.waiting, "waiting_bytes": o.waiting_bytes, "lag": o.lag, "done": o.done,
                     "failures": o.failures, "dropped": o.dropped, "paused": o.paused} for o in r.outputs],
        "plugins_off": [{"use": p.use, "reason": p.reason} for p in r.plugins_off],
    }
