"""The partition fence: a node on the minority side of a partition starts no fetch, and an heir waits before it
fetches the hosts of a member declared dead (docs/cluster.md, "The partition fence").

Promotion of a dead member's queue makes a partition dangerous: the majority takes over the hosts of a node it
declares dead while that node, alive behind the partition, may still fetch them. So:

- a node that has heard from no strict majority of the members owning arcs (itself counted) within
  `CONTACT_WINDOW` of its own running time is *fenced*; a stall of its own is not counted as the peers' silence.
  Hearing from a majority may be direct (any message from a peer counts, whatever ring or epoch it holds), or a
  proof of contact that the progress waves (peer/cluster/core/progress.py) carry down the tree, dated by the root's
  count of a majority it comes from (`majority_heard`): in a cluster of hundreds a node talks to a few dozen
  peers at a time;
- once in contact again, and after any freeze long enough for the others to have declared it dead, it holds for
  the suspicion timeout + `CONTACT_WINDOW` + `TAKEOVER_GRACE`: a suspicion raised before the heal may still fire,
  be heard, be refuted, and the heir must stop and give the hosts back;
- an heir holds the arcs it inherits from a dead member until `CONTACT_WINDOW + TAKEOVER_GRACE` after it last
  heard from it (by then, were it alive on the other side, it has fenced itself and its requests have ended),
  and `TAKEOVER_GRACE` more for a host whose timer it does not know.

`PartitionFence` keeps that state; the cluster asks it (`fenced`, `holds`) before each host turn and runs its
`contact_loop`. It reads the membership's view and last-heard times and the trio clock, nothing else.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import trio

from ring import MemberState, View

if TYPE_CHECKING:
    from peer.cluster.handoff.arcs import ArcSet

__all__ = ["CONTACT_TICK", "CONTACT_WINDOW", "TAKEOVER_GRACE", "PartitionFence"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.fence")

#: Heard from within this much of this node's running time counts as contact: directly, or through a proof of
#: contact carried by a progress wave (one a second), dated by the root's count of a majority; SWIM probes and
#: gossip come on top.
CONTACT_WINDOW = 2.5
#: An heir's hold past CONTACT_WINDOW after it last heard from the dead member: the member's last requests end.
TAKEOVER_GRACE = 2.0
#: How often the contact loop counts who was heard from.
CONTACT_TICK = 0.25
#: Ticks at most between two counts while a fresh proof of contact keeps the fence off (`contact_loop`).
_RECOUNT = 16

_OWNING = (MemberState.ALIVE, MemberState.SUSPECT)


class PartitionFence:
    """Whether this node may start a fetch now, and which inherited arcs are still held."""

    def __init__(
        self,
        node_id: str,
        *,
        view: Callable[[], View],
        last_heard: Mapping[str, float],
        suspicion_timeout: float,
        probe_interval: float,
        majority_heard: Callable[[], float] = lambda: -math.inf,
    ) -> None:
        self.node_id = node_id
        self.view = view
        self.last_heard = last_heard  # peer -> trio time it was last heard from (the membership's)
        self.suspicion_timeout = suspicion_timeout
        self.probe_interval = probe_interval
        self.majority_heard = majority_heard  # trio time of this node's newest proof of contact with a majority
        self.fences = 0  # times this node fenced itself
        self._fence = False
        self._until = -math.inf  # the hold after a heal or a freeze
        self._last_tick = math.inf  # set when the contact loop starts
        self._holds: list[tuple[ArcSet, float]] = []  # arcs inherited from dead members, until when
        # The contact count (`contact_loop`): per member, its silence at the last count; this node's running time
        # (elapsed time, a stall counted as two ticks at most); the ticks since the last count, as (when the tick
        # began, the running time after it).
        self._silent: dict[str, float] = {}
        self._running = 0.0
        self._counted = 0.0  # the running time at the last count
        self._ticks: list[tuple[float, float]] = []

    @property
    def hold_seconds(self) -> float:
        return self.suspicion_timeout + CONTACT_WINDOW + TAKEOVER_GRACE

    def fenced(self) -> bool:
        """This node starts no fetch now: it heard from no strict majority of the members owning arcs within
        CONTACT_WINDOW of its own running time, or it is in the hold after such a silence or after being
        frozen (a stop, a stall) long enough to have been declared dead."""
        now = trio.current_time()
        if now - self._last_tick > 2 * CONTACT_TICK + 0.5:
            return True  # frozen since the last tick: nothing is known until the contact loop has run again
        return self._fence or now < self._until

    def holding(self) -> bool:
        """Whether any inherited arcs are held (their holds are dropped as they end, at the next `held`)."""
        return bool(self._holds)

    def held(self, position: int) -> bool:
        """`position` lies in an arc inherited from a dead member whose hold has not ended."""
        if not self._holds:
            return False
        now = trio.current_time()
        self._holds = [(arcs, until) for arcs, until in self._holds if until > now]
        return any(position in arcs for arcs, _until in self._holds)

    def inherit(self, dead: str, arcs: ArcSet) -> float:
        """This node inherits `arcs` from `dead`. Returns the fence's end for them, in trio time: CONTACT_WINDOW +
        TAKEOVER_GRACE after `dead` was last heard from (were it alive behind a partition, its last request has
        ended by then); a host's Crawl-delay runs from there. The arcs are held TAKEOVER_GRACE longer: a host
        whose state did not reach this node (its URLs arriving by a batch or from the outbox rather than from the
        dead node's replicas) has no known timer, and waits that much past the fence's end."""
        until = self.last_heard.get(dead, -math.inf) + CONTACT_WINDOW + TAKEOVER_GRACE
        if until + TAKEOVER_GRACE > trio.current_time():
            self._holds.append((arcs, until + TAKEOVER_GRACE))
        return until

    def _count(self, owning: list[str]) -> int:
        """The members heard from within CONTACT_WINDOW (this node counted) after the ticks since the last count;
        each member's silence brought up to the last of them."""
        ticks, self._ticks = self._ticks, []
        counted, self._counted = self._counted, ticks[-1][1]  # the running time at the last count, and now
        now = ticks[-1][1]
        begun = [start for start, _running in ticks]
        silent, heard = self._silent, self.last_heard
        contact = 1
        for peer in owning:
            if peer == self.node_id:
                continue
            k = bisect_right(begun, heard.get(peer, -math.inf)) - 1
            # found heard from by tick k (the last that began at or before it was last heard from): silent for
            # the running time since; else silent through every tick since the last count
            quiet = now - ticks[k][1] if k >= 0 else silent.get(peer, 0.0) + now - counted
            silent[peer] = quiet
            contact += quiet < CONTACT_WINDOW
        return contact

    async def contact_loop(self) -> None:
        """Every CONTACT_TICK: count, per member owning arcs, how long it has been silent while this node ran (a
        stall of this node's own is not the peers' silence), and fence this node while most are silent.

        The count costs a pass over the members; while a fresh proof of contact keeps the fence off whatever the
        count, it is put off (up to `_RECOUNT` ticks, or until the view changes): the ticks in between are kept
        (when each began and this node's running time after it), and the count made then gives every member the
        silence the tick-by-tick count would have (a member's silence restarts at the last tick that found it
        heard from: the last one that began at or before its last-heard time)."""
        self._silent, self._ticks, self._counted = {}, [], self._running
        self._last_tick = trio.current_time()
        view: View | None = None
        owning: list[str] = []
        while True:
            last = self._last_tick
            await trio.sleep(CONTACT_TICK)
            now = trio.current_time()
            self._last_tick = now
            elapsed = now - last
            hold = self.hold_seconds
            if elapsed > self.suspicion_timeout + self.probe_interval:
                # frozen long enough for the others to have declared this node dead and taken its hosts over (a
                # probe must fail first, then the suspicion run out)
                self._until = max(self._until, now + hold)
                log.warning("this node was frozen: no fetch starts here for a while",
                            extra={"frozen": elapsed, "hold": hold})
            current = self.view()
            if current is not view:
                if self._ticks:
                    self._count(owning)  # the ticks before this one counted with the members they had
                view = current
                owning = [m.node_id for m in current.members if m.state in _OWNING]
            self._running += min(elapsed, 2 * CONTACT_TICK)
            self._ticks.append((last, self._running))
            proven = now - self.majority_heard() < CONTACT_WINDOW
            if proven and len(self._ticks) < _RECOUNT:
                fence = False
            else:
                contact = self._count(owning)
                fence = (self.node_id in owning and len(owning) > 1 and 2 * contact <= len(owning)
                         and not proven)
            if fence != self._fence:
                self._fence = fence
                self.fences += fence
                if not fence:
                    # Back in contact after a partition: the majority may have declared this node dead meanwhile
                    # (a suspicion raised before the heal fires up to suspicion_timeout after it) and taken its
                    # hosts over. Start nothing until such a declaration has been made, heard, refuted, and the
                    # hosts given back (the heir stops at its next ring; its requests under way end).
                    self._until = max(self._until, now + hold)
                log.warning("no contact with most of the cluster: no fetch starts here" if fence
                            else "contact with most of the cluster again: fetching resumes after a hold",
                            extra={"hold": 0.0 if fence else hold})
