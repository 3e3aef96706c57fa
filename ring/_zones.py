"""Failure zones: which nodes go down together (one machine, one rack), so replicas can be kept apart from them.

A node names its zone at start (`peerd start --zone NAME`, by default the machine's host name); the view carries
it. Several nodes on one machine are the house's way to use every core (docs/operations.md, "Sizing a machine"),
and the ring places a position's backups on the nodes that follow its owner, whichever machine they are on: with
one replica, a machine of 14 nodes that dies takes with it every queued URL whose backup was one of its own.
`Ring.holders_at` adds, when every backup shares the owner's zone, the first node after them in another zone.
That node is exactly the one that owns the position once the owner's whole zone is gone (the ring's order of
succession does not depend on who left), so a zone lost at once still hands each arc to a node holding its queue.

An empty zone means "unknown": such a node is taken to share its zone with nobody (a peer that speaks an older
protocol, or a record made before zones existed), which is the placement the ring had before zones.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

__all__ = ["MAX_ZONE", "Zones", "check_zone"]

#: A zone name is at most this many bytes of printable ASCII without spaces.
MAX_ZONE = 64


def check_zone(zone: object, who: str = "zone") -> str:
    """``zone`` if it is a valid zone name ("" for none), else ValueError saying why."""
    if not isinstance(zone, str):
        raise ValueError(f"{who} must be a string, got {zone!r}")
    if len(zone) > MAX_ZONE or not all("!" <= ch <= "~" for ch in zone):
        raise ValueError(f"{who} must be at most {MAX_ZONE} printable ASCII characters without spaces, got {zone!r}")
    return zone


class Zones(Mapping[str, str]):
    """An immutable node id -> zone map (nodes with no zone are left out) with the count of nodes per zone."""

    __slots__ = ("_of", "_sizes")

    def __init__(self, zones: Mapping[str, str] | None = None) -> None:
        self._of: dict[str, str] = {node: zone for node, zone in (zones or {}).items() if zone}
        sizes: dict[str, int] = {}
        for zone in self._of.values():
            sizes[zone] = sizes.get(zone, 0) + 1
        self._sizes = sizes

    def __getitem__(self, node: str) -> str:
        return self._of[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._of)

    def __len__(self) -> int:
        return len(self._of)

    def zone(self, node: str) -> str:
        """The node's zone, "" if it named none."""
        return self._of.get(node, "")

    def alone(self, node: str, nodes: int) -> bool:
        """Whether, of ``nodes`` nodes that include ``node`` and are all in this map or zoneless, none is in
        another zone than ``node``'s: then no copy can be kept off its zone."""
        zone = self._of.get(node, "")
        return bool(zone) and self._sizes.get(zone, 0) >= nodes

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Zones):
            return self._of == other._of
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._of.items()))

    def __repr__(self) -> str:
        return f"Zones({self._of!r})"
