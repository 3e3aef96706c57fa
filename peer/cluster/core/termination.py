"""Progress and cluster-wide termination: this node's progress report, its part of the progress waves over the
tree of the ring's members (peer/cluster/core/progress.py), concluding when two waves find every member idle, and
releasing the wait for arcs of members that left.

`Termination` is a part of `peer.cluster.core.cluster.Cluster`, built with what it reads (the Protocols below): the
view and the ring's members, the links, the dispatcher's and the hand-off's outstanding work, the crawler, the
node's counters. It owns the progress tree and the `finished` event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import trio

from protocol import Message, ProgressQuery, ProgressReport
from ring import MemberState, View

from peer.cluster.core.progress import Local, ProgressTree

__all__ = ["LEFT_GRACE", "LINGER_TIMEOUT", "PROGRESS_INTERVAL", "Termination", "TerminationHandoff", "TerminationLinks",
           "TerminationWork"]

# the cluster's records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.cluster")

#: Progress waves: the ring's first member starts one this often (peer/cluster/core/progress.py).
PROGRESS_INTERVAL = 1.0
#: A node seen LEAVING this long and no longer connected has left: its arcs are not waited for any more. Its
#: links stay up while it hands off, so this only needs to cover a link that is not up yet.
LEFT_GRACE = 2.0
#: After concluding the crawl is finished, a node keeps answering until the members it answers for (its range of
#: the progress tree) have concluded too.
LINGER_TIMEOUT = 5.0


class TerminationLinks(Protocol):
    """What termination needs of `PeerLinks`."""

    def send_nowait(self, peer_id: str, message: Message, *, address: str | None = None) -> bool: ...

    def connected_peers(self) -> list[str]: ...


class TerminationWork(Protocol):
    """What termination reads of the dispatcher: its counters and the batches not yet acknowledged."""

    stats: Any  # DispatchStats: urls_new, batches_received, urls_received

    def outstanding(self) -> int: ...


class TerminationHandoff(Protocol):
    """What termination reads and asks of the hand-off."""

    chunks_applied: int
    urls_received: int

    def outstanding(self) -> int: ...

    def waiting(self) -> bool: ...

    def waits_for(self, peer_id: str) -> bool: ...

    def abandon(self, peer_id: str) -> None: ...

    def cancel_to(self, peer_id: str) -> int: ...


class Termination:
    """Progress reports and waves, and concluding that the whole cluster's crawl is finished."""

    def __init__(
        self,
        node_id: str,
        *,
        view: Callable[[], View],
        members: Callable[[], tuple[int, tuple[str, ...]]],
        links: TerminationLinks,
        dispatcher: TerminationWork,
        handoff: TerminationHandoff,
        crawler: Callable[[], Any],
        stats: Any,
        queued: Callable[[], int],
        ready: trio.Event,
    ) -> None:
        self.node_id = node_id
        self._view = view  # () -> this node's current view
        self._members = members  # () -> (the ring's id, its members sorted by node id)
        self.links = links
        self.dispatcher = dispatcher
        self.handoff = handoff
        self._crawler = crawler  # () -> the crawler once attached (`is_done`), or None
        self.stats = stats  # the node's counters: pages, urls_new, rate()
        self._queued = queued  # () -> URLs queued in this node's frontier
        self.ready = ready  # joined (or started a new cluster) and seeded: progress waves may begin
        self.finished = trio.Event()  # the whole cluster's crawl is finished (set once)
        self._leaving_since: dict[str, float] = {}  # peer -> when this node first saw it LEAVING
        self._departed_view: View | None = None  # the view `_departing` was found in
        self._departing: list[str] = []  # its members LEAVING, this node aside
        self.progress = ProgressTree(node_id, members=members, local=self._wave_local, send=self._send_to,
                                     concluded=self._conclude, suspect=self._suspect)

    def local_progress(self, seq: int = 0) -> ProgressReport:
        """This node's progress as the report it sends (``seq`` answers a query; 0 when unasked or kept here)."""
        crawler = self._crawler()
        d, h = self.dispatcher.stats, self.handoff
        idle = (
            crawler is not None
            and crawler.is_done()
            and self.dispatcher.outstanding() == 0
            and h.outstanding() == 0
            and not h.waiting()
        )
        activity = self.stats.pages + self.stats.urls_new + d.urls_new + d.batches_received + h.chunks_applied
        return ProgressReport(
            seq=seq, ring=self._members()[0], idle=idle, finished=self.finished.is_set(),
            activity=activity, pages=self.stats.pages, queued=self._queued(),
            urls_received=sum(d.urls_received.values()) + h.urls_received, rate=max(0.0, self.stats.rate()),
        )

    def asked(self, peer_id: str, message: ProgressQuery) -> None:
        """A peer asks for this node's progress (someone looks at its dashboard)."""
        self.links.send_nowait(peer_id, self.local_progress(message.seq))

    def _send_to(self, peer: str, message: Message) -> bool:
        member = self._view().member(peer)
        return self.links.send_nowait(peer, message, address=member.address if member else None)

    async def run(self) -> None:
        """Once ready, take part in the progress waves (started here when this node is a tree's root) and stop
        waiting for departed members' arcs, until cancelled."""
        await self.ready.wait()  # a node that is still joining must not conclude anything from its lone view
        second = True
        while True:
            # the two trees' waves half an interval apart: each root starts one every interval
            await trio.sleep(PROGRESS_INTERVAL / 2)
            self.release_departed()
            second = not second
            if self.progress.is_root(second):
                self.progress.tick(second)

    def release_departed(self) -> list[str]:
        """Stop waiting for arcs from nodes that left: LEAVING for LEFT_GRACE and no longer connected (a leaving
        node keeps its links until it has handed everything off, then exits). It handed off under its own last
        ring; what we wait for under a ring it never adopted will not come, and without this the wait runs out
        only after `handoff_wait` (30 s), the arcs' hosts unfetched meanwhile. A transfer to it that it did not
        acknowledge before it went (our answer to its `HandoffAsk`) is cancelled too: a node that left causes no
        view change, and the transfer would keep this node from ever being idle. Returns the peers released."""
        now = trio.current_time()
        view = self._view()
        if view is not self._departed_view:  # the members LEAVING, found once per view (a pass over the members)
            self._departed_view = view
            self._departing = [m.node_id for m in view.members
                               if m.state is MemberState.LEAVING and m.node_id != self.node_id]
            for peer in set(self._leaving_since) - set(self._departing):
                del self._leaving_since[peer]
        if not self._departing:
            return []
        connected = set(self.links.connected_peers())
        released = []
        for peer in self._departing:
            since = self._leaving_since.setdefault(peer, now)
            if now - since < LEFT_GRACE or peer in connected:
                continue
            if self.handoff.waits_for(peer):
                self.handoff.abandon(peer)
                released.append(peer)
                log.info("a node that left hands nothing more: its arcs are no longer waited for",
                         extra={"peer": peer})
            if self.handoff.cancel_to(peer):
                log.info("a node that left takes nothing more: transfers to it cancelled", extra={"peer": peer})
        return released

    def _suspect(self, peer: str) -> bool:
        """Whether this node's view holds `peer` SUSPECT (the progress waves go around it)."""
        member = self._view().member(peer)
        return member is not None and member.state is MemberState.SUSPECT

    def _wave_local(self, finished: bool) -> Local:
        """This node's part of a wave's tally; a wave from a root that concluded makes an idle node conclude."""
        me = self.local_progress()
        if finished and me.idle and not self.finished.is_set():
            self._conclude("the ring's first member concluded it")
        return Local(idle=me.idle, activity=me.activity, finished=self.finished.is_set())

    def _conclude(self, why: str) -> None:
        log.info("crawl finished across the cluster", extra={"reason": why, "members": len(self._members()[1])})
        self.finished.set()

    async def linger(self, timeout: float = LINGER_TIMEOUT) -> None:
        """After concluding, keep answering until every member this node answers for in the progress tree has
        concluded too (bounded): they learn it from the waves that pass through this node."""
        with trio.move_on_after(timeout):
            while not self.progress.range_concluded:
                await trio.sleep(0.2)
