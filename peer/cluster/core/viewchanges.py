"""View changes of one node's cluster side: the ring of each view (built in a worker thread, cached), the moved
arcs and who hands which to whom (`plan_view`), the crawler and the hand-off told in one step; the queued URLs of
arcs inherited from dead members promoted from their replicas; queued hosts this node does not own swept to their
owners (docs/cluster.md, "In the node" and "Queued-URL replicas").

A mixin of `peer.cluster.core.cluster.Cluster`: it works on the cluster's attributes, set in `Cluster.__init__`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING

import trio

from ring import MemberState, Moves, Ring, View, diff_moves, host_position, wire_moves
from storage import HostState

from peer.cluster.handoff.arcs import ArcSet, plan_view
from peer.cluster.core.fence import TAKEOVER_GRACE
from peer.cluster.core.rings import _Owners, ring_id

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from storage import NodeStore

    from peer.cluster.core.dispatch import Dispatcher
    from peer.cluster.core.rings import RingCache
    from peer.cluster.handoff.handoff import Handoff
    from peer.cluster.membership.membership import Membership
    from peer.cluster.replicas.seenreplicas import SeenReplicas
    from peer.cluster.replicas.queuereplicas import QueueReplicas
    from peer.cluster.core.fence import PartitionFence
    from peer.cluster.core.settingsgossip import SettingsGossip
    from peer.config import Config
    from peer.crawl.crawler import Crawler

__all__ = ["FRESH_WINDOW", "SWEEP_INTERVAL", "ViewChanges"]

# the cluster's records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.cluster")

#: How often a node looks for queued hosts it no longer owns (state that arrived late or from an older view).
SWEEP_INTERVAL = 5.0
#: A node that joined (or restarted) less than this many suspicion timeouts ago takes the arcs it gains at a view
#: change as coming from the owners of the ring without it: its first views may have been partial.
FRESH_WINDOW = 2.0


class ViewChanges:
    """Following the views: rings, moved arcs, promotion of a dead member's queues, stray hosts."""

    if TYPE_CHECKING:
        # What this part uses of the Cluster it is mixed into: attributes and its other parts' methods.
        backups: QueueReplicas
        cfg: Config
        crawler: Crawler | None
        dispatcher: Dispatcher
        epoch: int
        fence: PartitionFence
        handoff: Handoff
        hosts_swept: int
        membership: Membership
        node_id: str
        _owners: _Owners | None
        points_per_weight: int
        promotions: list[tuple[float, str, int]]
        ready: trio.Event
        _ready_at: float | None
        replicas: SeenReplicas
        ring: Ring | None
        _rings: RingCache
        store: NodeStore
        view: View
        view_changes: int
        wall_clock: Callable[[], float]

        gossip: SettingsGossip

        def live_peers(self) -> list[str]: ...
        def _set_ring(self, ring: Ring) -> None: ...

    # -- views --------------------------------------------------------------------------------------------

    async def _ring(self, view: View) -> Ring:
        weights = view.owner_weights()
        if not weights:  # nobody owns arcs (the last member is leaving): keep the ring we had
            assert self.ring is not None
            return self.ring
        return await self._ring_of(weights, self.ring)

    async def _ring_of(self, weights: dict[str, int], base: Ring | None) -> Ring:
        ppw = self.points_per_weight
        ring = self._rings.ring(weights, ppw)
        if ring is None:
            if base is not None and base.points_per_weight == ppw:
                # only the points of the members that joined, left or changed weight are inserted or removed
                ring = await trio.to_thread.run_sync(lambda: base.with_weights(weights))
            else:
                ring = await trio.to_thread.run_sync(lambda: Ring(weights, points_per_weight=ppw))
            ring = self._rings.put(ring)
        return ring

    async def _moves(self, old: Ring, new: Ring) -> Moves:
        """The moved arcs from `old` to `new` in the hand-off's form (computed in a worker thread, once per
        cache)."""
        moves = self._rings.moves(old, new)
        if moves is None:
            moves = await trio.to_thread.run_sync(lambda: wire_moves(diff_moves(old, new)))
            moves = self._rings.put_moves(old, new, moves)
        return moves

    async def _follow_views(self, watch) -> None:
        while True:
            view = await watch.next()
            await self._view_changed(view)

    def _fresh(self) -> bool:
        """Still joining, or joined less than FRESH_WINDOW suspicion timeouts ago: the views this node merges may
        still be partial (a restarted node's first view can lack members the cluster has)."""
        if not self.ready.is_set() or self._ready_at is None:
            return True
        return trio.current_time() - self._ready_at < FRESH_WINDOW * self.cfg.suspicion_timeout

    def _taken_over(self) -> bool:
        """This node refuted a record of itself DEAD less than FRESH_WINDOW suspicion timeouts ago: members that
        held it dead (the other side of a partition longer than the suspicion timeout) took its arcs over and
        crawled them, and hand them back as their views take it in again."""
        return trio.current_time() - self.membership.declared_dead_at < FRESH_WINDOW * self.cfg.suspicion_timeout

    async def _note_ready(self) -> None:
        await self.ready.wait()
        self._ready_at = trio.current_time()

    async def _view_changed(self, view: View) -> None:
        old_view, old_ring = self.view, self.ring
        assert old_ring is not None
        new_ring = await self._ring(view)
        alone_before = not any(
            m.state.owns_arcs for m in old_view.members if m.node_id != self.node_id
        )
        gain_arcs: Moves | None = None
        extra_gains: list[Moves] = []
        if new_ring == old_ring:
            arcs = Moves.empty(wire=True)
        else:
            # the moved arcs as arrays (a join at 1,000 points per weight moves one arc per point of the joiner)
            arcs = await self._moves(old_ring, new_ring)
            replace = alone_before or not self.ready.is_set()
            taken_over = self._taken_over()
            if (replace or self._fresh() or taken_over) and new_ring.nodes != (self.node_id,):
                # Our own previous ring had only us, or we are still joining (a partial view merged first): the
                # arcs we gain come from the owners in the cluster's ring without us. Joined (or back from a
                # restart) only a moment ago, we wait for those owners too, besides the previous owners in our own
                # previous ring: that ring may have been built from a partial view (a restarted node merges its
                # last view or the seed's first), which gave us an arc "from" a node that never had it, so the next
                # ring shows the arc as ours in both. We ask each owner we wait for (`HandoffAsk`), which answers with
                # a transfer (empty at least) once it has adopted our ring, so waiting for one that holds nothing
                # costs the ask's delay and a round trip.
                without = {n: w for n, w in new_ring.weights.items() if n != self.node_id}
                if without and self.node_id in new_ring.weights:
                    before = await self._ring_of(without, new_ring)
                    moved = await self._moves(before, new_ring)
                else:
                    moved = Moves.empty(wire=True)
                if replace:
                    gain_arcs = moved
                else:
                    extra_gains.append(moved)
            if taken_over and not replace and self.node_id in new_ring.weights and new_ring.nodes != (self.node_id,):
                # Declared dead a moment ago (a partition longer than the suspicion timeout): our own rings may
                # show our arcs as ours all along, while the other side crawled them under a ring of its own,
                # without us and without whoever was on our side. Its members come back to our view as they
                # refute our record of them: our arcs came from the owners in the ring of the members that
                # were not ours before this change, as well as from those of the ring without us (above). We
                # wait for their hand-offs, which carry the timers of their last requests: the hold after the
                # heal may run out sooner after the heir's last request to a host than the host's Crawl-delay,
                # and without those timers this node would fetch it too early.
                before_members = {m.node_id for m in old_view.members if m.state.owns_arcs}
                back = {n: w for n, w in new_ring.weights.items() if n not in before_members and n != self.node_id}
                if back:
                    extra_gains.append(await self._moves(await self._ring_of(back, new_ring), new_ring))
        gone = {m.node_id for m in view.members if m.state is MemberState.DEAD}
        plan = None
        extra_gains = [moves for moves in extra_gains if moves]
        if arcs or gain_arcs or extra_gains:
            # who gets which arcs, worked out in the worker thread too (a joiner loses millions of arcs at once)
            node_id = self.node_id
            plan = await trio.to_thread.run_sync(lambda: plan_view(node_id, old_ring, new_ring, gone=gone, arcs=arcs,
                                                                   gain_arcs=gain_arcs,
                                                                   extra_gains=extra_gains or None))
        # No await from here on: the ring, the hand-off and the crawler change together.
        self.view, self.epoch = view, view.epoch
        self._set_ring(new_ring)
        # Fetched-page keys held for arcs owned elsewhere go to their owners now, ahead of the transfers below
        # on the same links: a receiver released by a transfer must not fetch those pages again.
        self.replicas.ring_changed(new_ring, view.epoch)
        self.backups.ring_changed(new_ring)
        self.view_changes += 1
        if self.crawler is not None:
            self.crawler.release_moved()  # parked URLs of moved hosts go back to the queue, into the hand-off
        for node in gone:
            self.handoff.abandon(node)
        for m in view.members:
            if m.node_id != self.node_id and not m.state.owns_arcs and self.handoff.cancel_to(m.node_id):
                log.info("hand-off to a departed node stopped; its content goes to the current owners",
                         extra={"peer": m.node_id, "state": m.state.value})
        if plan is not None:
            lost = self.handoff.view_changed(ring_id(new_ring), old_ring, new_ring, gone=gone, plan=plan)
            log.info("ring changed", extra={
                "epoch": view.epoch, "members": ",".join(f"{n}={w}" for n, w in sorted(new_ring.weights.items())),
                "arcs_moved": len(arcs), "arcs_lost": len(lost),
                "arcs_pending": self.handoff.pending_count()})
            if plan.inherited:
                self._promote(plan.inherited)
        if self.crawler is not None:
            self.crawler.rewake()
        self.dispatcher.wake()
        # a member that joined gets the crawl settings at once from a few members (the others have them: they are
        # not sent again); this node, if it is the one that joined, asks a few peers for theirs
        owned_before = old_view.owner_weights()
        owners = view.owner_weights()
        joined = [peer for peer in owners if peer not in owned_before]
        if joined and len(owners) > 1:
            self.gossip.welcome(joined, owners)

    def _promote(self, inherited: dict[str, ArcSet]) -> int:
        """Arcs this node inherits from dead members (per dead node, from `plan_view`): their queued URLs come out
        of the replicas held here into the frontier, with the dead owner's last known host states (merged with
        ours: the later ready time and the longer Crawl-delay win), and the crawler takes those hosts over with
        those timers."""
        if not inherited:
            return 0
        by_arc = inherited
        every = ArcSet.union(inherited.values())
        promoted, states = self.store.promote(lambda position: position in every)
        by_node: dict[str, int] = {node: 0 for node in inherited}
        for item in promoted:
            position = host_position(item.host)
            for node, arc_set in by_arc.items():
                if position in arc_set:
                    by_node[node] += 1
                    break
        now = trio.current_time()
        hold_end = max(self.fence.inherit(node, by_arc[node]) for node in inherited)
        # Were the dead node alive behind a partition, its last request may end as late as the hold: its hosts'
        # Crawl-delay then runs from the end of the hold, not from its last replicated state.
        fence_end = self.wall_clock() + (hold_end - now)
        # A host with no replicated state (its first pages' releases had not arrived) gets TAKEOVER_GRACE more:
        # its Crawl-delay is not known here until its robots.txt is fetched again.
        if math.isfinite(fence_end):
            states = [dataclasses.replace(st, next_allowed=max(st.next_allowed, fence_end + st.crawl_delay))
                      for st in states]
            known = {st.host for st in states}
            for host in sorted({item.host for item in promoted} - known):
                here = self.store.frontier.get_state(host)
                if here is None or here.next_allowed < fence_end + TAKEOVER_GRACE:
                    states.append(HostState(host=host, next_allowed=fence_end + TAKEOVER_GRACE,
                                            crawl_delay=here.crawl_delay if here else 0.0))
        if states:
            self.store.frontier.put_states(states)
        for node, count in by_node.items():
            self.promotions.append((now, node, count))
        del self.promotions[:-100]
        self.backups.urls_promoted += len(promoted)
        if self.crawler is not None and (promoted or states):
            self.crawler.take_over(promoted, states)
        log.info("queued URLs of a dead node promoted from its replicas",
                 extra={"urls": len(promoted), "hosts": len(states), "dead": ",".join(sorted(by_node))})
        return len(promoted)

    # -- stray state --------------------------------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        """Queued hosts this node does not own (a chunk that arrived after its arc moved on, a restart with an
        older view) go to their owners, so nothing waits forever where nobody fetches it."""
        while True:
            await trio.sleep(SWEEP_INTERVAL)
            self.sweep()

    def sweep(self) -> int:
        if self.ring is None or self.handoff.outstanding():
            return 0
        ring, owners = self.ring, self._owners
        assert owners is not None
        strays = [host for host, _ in self.store.frontier.hosts() if owners.owner(host) != self.node_id]
        if not strays:
            return 0
        n = self.handoff.sweep(ring_id(ring), owners.owner, strays)
        self.hosts_swept += n
        log.info("handing queued hosts to their owners", extra={"hosts": n})
        return n
