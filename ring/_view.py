"""Membership views: who is in the cluster, in which state, and which version of that knowledge this is.

A view is a set of member records, one per node id. Records only ever move "up": a record supersedes another
when its incarnation is higher, or at the same incarnation when its state is worse in the SWIM order
alive < suspect < leaving < dead (so news of a failure beats an older all-clear, and only the node itself can
refute it, by bumping its incarnation). ``merge`` takes the per-node maximum, which makes it commutative,
associative and idempotent: any two nodes that have seen the same records hold the same members.

The epoch orders views. It is ``rank(members) + offset``: the rank counts every step a record took
(``4 * incarnation + state rank + 1`` per member, so a new member, a bumped incarnation or a worse state
raises it) and the offset is carried over by the helpers and maxed by ``merge``. That keeps the epoch growing
strictly on every real change while ``merge`` stays associative; the tempting "max + 1 when the members
changed" is not associative (three views with epochs 5, 0, 0 and different members merge to 7 or 6 depending on
grouping), so two nodes could reach the same members with different epochs.

Arcs: ALIVE and SUSPECT members own arcs (a suspicion may be wrong; moving arcs on every hiccup would churn
state), LEAVING and DEAD members do not (a leaving node hands its arcs off while it still serves them).
"""

from __future__ import annotations

import enum
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from hashlib import blake2b

from ._ring import DEFAULT_POINTS_PER_WEIGHT, Ring
from ._zones import Zones, check_zone

__all__ = ["Member", "MemberState", "View", "merge"]


class MemberState(enum.Enum):
    """SWIM states, from best to worst news."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    LEAVING = "leaving"
    DEAD = "dead"

    @property
    def rank(self) -> int:
        """0 for ALIVE up to 3 for DEAD: at equal incarnation the higher rank wins a merge."""
        return _STATE_RANK[self]

    @property
    def owns_arcs(self) -> bool:
        """Whether a member in this state holds arcs of the ring."""
        return self in (MemberState.ALIVE, MemberState.SUSPECT)


_STATE_RANK = {state: rank for rank, state in enumerate(MemberState)}


def _check_address(node_id: str, address: str) -> None:
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"member {node_id!r}: address must be host:port with a port 1-65535, got {address!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """One node as a view knows it."""

    node_id: str
    address: str
    weight: int
    incarnation: int = 0
    state: MemberState = MemberState.ALIVE
    zone: str = ""  # the failure zone the node named ("" for none): see ring/_zones.py

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not self.node_id:
            raise ValueError(f"member node_id must be a non-empty string, got {self.node_id!r}")
        _check_address(self.node_id, self.address)
        if isinstance(self.weight, bool) or not isinstance(self.weight, int) or self.weight < 1:
            raise ValueError(f"member {self.node_id!r}: weight must be an integer >= 1, got {self.weight!r}")
        if isinstance(self.incarnation, bool) or not isinstance(self.incarnation, int) or self.incarnation < 0:
            raise ValueError(f"member {self.node_id!r}: incarnation must be an integer >= 0, got {self.incarnation!r}")
        if not isinstance(self.state, MemberState):
            raise ValueError(f"member {self.node_id!r}: state must be a MemberState, got {self.state!r}")
        check_zone(self.zone, f"member {self.node_id!r}: zone")

    def precedence(self) -> tuple[int, int, int, str, str]:
        """Merge order: incarnation, then worse state; weight, address and zone only break ties between records
        that a correct node never produces (changing them requires a new incarnation)."""
        return (self.incarnation, self.state.rank, self.weight, self.address, self.zone)

    @property
    def rank(self) -> int:
        """This record's contribution to its view's rank."""
        return 4 * self.incarnation + self.state.rank + 1


def _rank(members: Iterable[Member]) -> int:
    return sum(member.rank for member in members)


@dataclass(frozen=True, slots=True, kw_only=True)
class View:
    """A versioned membership view. ``members`` is kept sorted by node id; ids are unique."""

    epoch: int = 0
    members: tuple[Member, ...] = ()
    # the members' rank, computed once: a merge compares views' offsets (epoch - rank) without summing them again
    _rank: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.epoch, bool) or not isinstance(self.epoch, int) or self.epoch < 0:
            raise ValueError(f"view epoch must be an integer >= 0, got {self.epoch!r}")
        members = tuple(sorted(self.members, key=lambda member: member.node_id))
        for before, after in zip(members, members[1:]):
            if before.node_id == after.node_id:
                raise ValueError(f"view lists node {before.node_id!r} twice")
        object.__setattr__(self, "members", members)
        object.__setattr__(self, "_rank", _rank(members))

    # -- reading -------------------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """The number of record steps this view has seen (see the module docstring)."""
        return self._rank

    def member(self, node_id: str) -> Member | None:
        """The record of ``node_id``, or None."""
        members = self.members
        index = bisect_left(members, node_id, key=lambda member: member.node_id)
        if index < len(members) and members[index].node_id == node_id:
            return members[index]
        return None

    def owner_weights(self) -> dict[str, int]:
        """Weights of the members that own arcs (ALIVE and SUSPECT)."""
        return {member.node_id: member.weight for member in self.members if member.state.owns_arcs}

    def zones(self) -> Zones:
        """The zones of the members that own arcs (the nodes of ``ring()``), for ``Ring.holders_at``."""
        return Zones({member.node_id: member.zone for member in self.members if member.state.owns_arcs})

    def ring(self, *, points_per_weight: int = DEFAULT_POINTS_PER_WEIGHT) -> Ring:
        """The ring of this view. Building one costs about a second per 500,000 points: cache it per epoch."""
        return Ring(self.owner_weights(), points_per_weight=points_per_weight)

    def fingerprint(self) -> bytes:
        """A 16-byte digest of the members, equal for equal member sets: a cheap "same view?" check for gossip."""
        digest = blake2b(digest_size=16)
        for member in self.members:
            fields: tuple[str, ...] = (member.node_id, member.address, str(member.weight), str(member.incarnation),
                                       member.state.value)
            if member.zone:  # a member with no zone digests as it did before zones
                fields += (member.zone,)
            digest.update("\x00".join(fields).encode() + b"\n")
        return digest.digest()

    # -- changing (each returns a new view; the epoch rises exactly when the members change) ----------------

    def with_member(self, record: Member) -> View:
        """This view with ``record`` merged in: it replaces the current record of its node only if it supersedes it."""
        current = self.member(record.node_id)
        if current is not None and current.precedence() >= record.precedence():
            return self
        members = [member for member in self.members if member.node_id != record.node_id]
        members.append(record)
        rank_gain = record.rank - (current.rank if current is not None else 0)
        return View(epoch=self.epoch + rank_gain, members=tuple(members))

    def join(self, node_id: str, address: str, weight: int, zone: str = "") -> View:
        """The node announces itself alive with this address, weight and zone; a rejoin or a change bumps its
        incarnation."""
        current = self.member(node_id)
        if current is None:
            return self.with_member(Member(node_id=node_id, address=address, weight=weight, zone=zone))
        if current.state is MemberState.ALIVE and (current.address, current.weight, current.zone) == (
                address, weight, zone):
            return self
        return self.with_member(
            Member(
                node_id=node_id,
                address=address,
                weight=weight,
                incarnation=current.incarnation + 1,
                state=MemberState.ALIVE,
                zone=zone,
            )
        )

    def update(
        self,
        node_id: str,
        *,
        weight: int | None = None,
        address: str | None = None,
        state: MemberState | None = None,
    ) -> View:
        """Change a member's record. Worse news about its state keeps the incarnation (what a peer may say);
        anything else (an all-clear, a new weight or address) bumps it, as only the node itself may do."""
        current = self.member(node_id)
        if current is None:
            raise KeyError(f"no member {node_id!r} in this view (epoch {self.epoch})")
        wanted = replace(
            current,
            weight=current.weight if weight is None else weight,
            address=current.address if address is None else address,
            state=current.state if state is None else state,
        )
        if wanted == current:
            return self
        same_details = (wanted.weight, wanted.address) == (current.weight, current.address)
        if not (same_details and wanted.state.rank > current.state.rank):
            wanted = replace(wanted, incarnation=current.incarnation + 1)
        return self.with_member(wanted)


def merge(a: View, b: View) -> View:
    """The deterministic union of two views: per node the superseding record (see ``Member.precedence``).

    Commutative, associative and idempotent. The epoch is ``rank(members) + max(offset of a, offset of b)``
    where a view's offset is ``epoch - rank``: it is at least both epochs, and strictly above both whenever the
    merged members differ from both.
    """
    small, large = (b, a) if len(b.members) <= len(a.members) else (a, b)
    if len(small.members) * 8 <= len(large.members) and all(
            (current := large.member(member.node_id)) is not None and current.precedence() >= member.precedence()
            for member in small.members):
        # Nothing in the much smaller view supersedes the larger one (the common case: a gossip of a few records
        # this node already holds): the members are the larger view's, found with a lookup per record of the smaller
        # one instead of a pass over both, so merging a partial gossip does not cost the size of the cluster.
        offset = max(a.epoch - a.rank, b.epoch - b.rank)
        if large.epoch - large.rank == offset:
            return large
        return View(epoch=large.rank + offset, members=large.members)
    records = {member.node_id: member for member in a.members}
    for member in b.members:
        current = records.get(member.node_id)
        if current is None or member.precedence() > current.precedence():
            records[member.node_id] = member
    members = tuple(records.values())
    offset = max(a.epoch - a.rank, b.epoch - b.rank)
    return View(epoch=_rank(members) + offset, members=members)
