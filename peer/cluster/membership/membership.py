"""Cluster membership in the SWIM manner of HashiCorp's memberlist, over peer links.

Failure detection: every probe interval a node pings the next member of a shuffled round (Ping/Pong). With no
Pong within the probe timeout it asks `indirect_probes` other members to ping the target for it (ProbeRequest/
ProbeReply), which tells a dead node from a bad link. If nobody reaches the target by the end of the interval it
is marked SUSPECT, and any node that still sees it SUSPECT at the same incarnation a suspicion timeout later
marks it DEAD. A node that hears it is suspected (or dead, or leaving when it is not) refutes by bumping its
incarnation, which supersedes the rumour everywhere (see ring/_view.py for the merge order).

Dissemination: every change of a record is gossiped (Gossip, full=False) to a few random members each gossip
interval, a bounded number of times (retransmit_mult * log10(n+1), as memberlist). Full views travel on join,
every sync interval to one random member, and whenever a Ping shows the sender's epoch differs from ours; the
receiver of a full view answers with its own when the sender lacked something (push-pull), so any two nodes
that talk converge. Dead members are retried now and then (serf's reconnect), so a healed partition merges.
Two changes go to every member at once, as one record each: a leave (the leaver's record, from the leaver) and a
join (the newcomer's record, from the member it joined through), so the ring changes everywhere within one
delivery instead of after log(n) gossip rounds; the gossip that follows repairs what a lost datagram missed.

Probes and partial gossip travel as datagrams (protocol version 5) where the transport carries them, as
memberlist sends them over UDP: Ping, Pong, ProbeRequest, ProbeReply and a Gossip of changed records that fits
one datagram need no link, so probing a different member every second, or gossiping to three random ones, costs
no handshake however large the cluster. An answer goes back the way its question came. A member that has never
sent us a datagram is pinged by datagram and, with no answer by the probe timeout, over its link too (it may
run an older version, or its UDP may be blocked); a member whose link agreed on a version before 5 gets all of
it over links. Full views (join, sync, leave, a differing epoch) stay on the links.

Every change of the merged view notifies subscribers with the new View; the ring follows from `View.ring()`.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import trio

import protocol
from protocol import Gossip, Limits, Message, Ping, Pong, ProbeReply, ProbeRequest
from ring import Member, MemberState, View, check_zone, merge

from peer.config import DEFAULTS
from peer.cluster.net.peerlinks import LinkConfig, LinkError, MessageHandler, PeerLinks
from peer.cluster.net.transport import Transport

__all__ = ["Membership", "MembershipConfig", "ViewWatch", "from_wire", "to_wire"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.membership")

_LIVE = (MemberState.ALIVE, MemberState.SUSPECT)
_MAX_INDIRECT_TASKS = 64
#: A joiner sends its view to the seed again this often until the seed's answer is merged (a lost message).
JOIN_RESEND = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipConfig:
    """SWIM timing; every default has its reason (memberlist's LAN profile, unless said otherwise)."""

    # The operator's settings: default and reason in peer.config (FIELDS).
    probe_interval: float = DEFAULTS["probe_interval"]
    probe_timeout: float = DEFAULTS["probe_timeout"]
    suspicion_timeout: float = DEFAULTS["suspicion_timeout"]
    # Three other nodes try the target before it is suspected, so one bad link does not condemn a node.
    indirect_probes: int = 3
    # Changes spread every 200 ms to a few random members: a view change reaches everyone in about a second.
    gossip_interval: float = 0.2
    gossip_fanout: int = 3
    # A change is gossiped retransmit_mult * ceil(log10(n + 1)) times: enough to reach all n with high probability.
    retransmit_mult: int = 4
    # Full-view exchange with one random member: repairs whatever gossip missed (memberlist uses 30 s).
    sync_interval: float = 10.0
    # ... stretched by (live members / sync_members) past that many: a full view of n members costs n records, so
    # the cluster as a whole then does sync_members / sync_interval (1.6) syncs a second and a node's sync bytes
    # per second stay flat as the fleet grows (every Ping still compares epochs and pulls a view that differs).
    sync_members: int = 16
    # Retry one dead member this often, so the two sides of a healed partition find each other (serf: 30 s).
    reconnect_interval: float = 10.0

    def __post_init__(self) -> None:
        for name in ("probe_interval", "probe_timeout", "suspicion_timeout", "gossip_interval", "sync_interval",
                     "reconnect_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)!r}")
        if not self.probe_timeout < self.probe_interval:
            raise ValueError(
                f"probe_timeout ({self.probe_timeout}) must be below probe_interval ({self.probe_interval}): "
                "the rest of the interval is for indirect probes"
            )
        for name in ("indirect_probes", "gossip_fanout", "retransmit_mult", "sync_members"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")


def to_wire(member: Member) -> protocol.Member:
    return protocol.Member(
        node_id=member.node_id,
        address=member.address,
        weight=member.weight,
        incarnation=member.incarnation,
        state=member.state.value,
        zone=member.zone,
    )


def from_wire(member: protocol.Member) -> Member:
    """The view record of a wire member; ValueError if the peer sent an impossible one."""
    return Member(
        node_id=member.node_id,
        address=member.address,
        weight=member.weight,
        incarnation=member.incarnation,
        state=MemberState(member.state),
        zone=member.zone,
    )


class ViewWatch:
    """Waits for views newer than the last one it returned; intermediate views may be skipped (latest wins)."""

    def __init__(self, membership: Membership) -> None:
        self._membership = membership
        self._last: View | None = None

    async def next(self) -> View:
        while self._membership.view is self._last:
            await self._membership._view_event.wait()
        self._last = self._membership.view
        return self._last


def _anyone(peer_id: str) -> bool:
    return True


def _no_one(node_id: str) -> bool:
    return False


class Membership:
    """One node's membership service. Start it with `await nursery.start(membership.run)` (reports the address).

    Messages other than membership ones go to `on_message(peer_id, message)` (dispatch and hand-off use it);
    `links` is the node's PeerLinks, for the layers that send their own messages to peers.
    """

    def __init__(
        self,
        *,
        node_id: str,
        weight: int,
        secret: bytes,
        transport: Transport,
        rng: random.Random,
        config: MembershipConfig | None = None,
        link_config: LinkConfig | None = None,
        limits: Limits | None = None,
        nonce: Callable[[int], bytes] = os.urandom,
        on_view: Callable[[View], None] | None = None,
        on_message: MessageHandler | None = None,
        admits: Callable[[str], bool] = _anyone,
        refuses: Callable[[str], bool] = _no_one,
        link_busy: Callable[[str], bool] | None = None,
        codecs: Sequence[str] | None = None,
        compressions: Sequence[str] | None = None,
        zone: str = "",
        members: View | None = None,
    ) -> None:
        self.node_id = node_id
        # the members this node starts with besides itself (a simulation's cluster that starts converged, as
        # n joins would end); by default it starts alone and joins
        self._members = members
        self.weight = weight
        self.zone = check_zone(zone)
        self.config = config or MembershipConfig()
        self.address: str | None = None
        self.view = View()
        # the live peers of `_live_of`, listed once per view: the gossip loop asks five times a second while news
        # spreads, the probe loop once a round, and a pass over a thousand members each time is the cluster's size
        self._live_of: View | None = None
        self._live: tuple[Member, ...] = ()
        link_options: dict[str, Any] = {}  # what is not given keeps PeerLinks' default
        if codecs:
            link_options["codecs"] = tuple(codecs)
        if compressions:
            link_options["compressions"] = tuple(compressions)
        self.links = PeerLinks(
            node_id=node_id,
            secret=secret,
            transport=transport,
            on_message=self._on_message,
            rng=rng,
            config=link_config,
            limits=limits,
            nonce=nonce,
            busy=link_busy,
            address_of=self._address_of,
            on_datagram=self._on_datagram,
            **link_options,
        )
        self._rng = rng
        self._on_other = on_message
        # who may join through this node: `admits(peer)` before the view of a node that is not a live member
        # here is merged (the plug-in chains compared: peer/cluster/core/pluginjoin.py); `refuses(node)` leaves
        # a node out of every view merged here, whoever gossips of it
        self._admits = admits
        self._refuses = refuses
        self.gossip_refused = 0  # gossips not merged: from a node not (yet) admitted, or of refused nodes
        # peer -> when any message from it last arrived (trio time): the cluster's partition fence reads it
        self.last_heard: dict[str, float] = {}
        # when this node last refuted a record of itself DEAD (trio time): members that held it dead took its arcs
        # over meanwhile (a partition longer than the suspicion timeout), and hand them back now
        self.declared_dead_at = -math.inf
        self._subscribers: list[Callable[[View], None]] = [on_view] if on_view is not None else []
        self._view_event = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._seq = 0
        self._acks: dict[int, trio.Event] = {}
        self._probe_round: list[str] = []
        self._broadcast: dict[str, int] = {}
        # Suspicions as data: (member, incarnation) -> the time it is declared dead unless refuted. One loop
        # (`_suspicion_loop`) checks the deadlines; `_apply` only records them and wakes it.
        self._suspicions: dict[tuple[str, int], float] = {}
        self._suspicion_added = trio.Event()
        self._indirect_tasks = 0
        # Probe requests from peers, as data for the indirect-probe loop (the message handler only records them).
        self._probe_requests: list[tuple[str, ProbeRequest, bool]] = []  # (requester, request, came by datagram)
        self._probe_requested = trio.Event()
        self._leaving = False
        self._left = False

    # -- service ------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve links and run the probe, gossip, sync and reconnect loops until cancelled."""
        async with trio.open_nursery() as nursery:
            self.address = await nursery.start(self.links.run)
            self._nursery = nursery
            alone = View().join(self.node_id, self.address, self.weight, self.zone)
            self._apply(merge(alone, self._members) if self._members is not None else alone)
            for loop in (self._probe_loop, self._gossip_loop, self._sync_loop, self._reconnect_loop,
                         self._suspicion_loop, self._indirect_probe_loop):
                nursery.start_soon(loop)
            task_status.started(self.address)

    # -- public API ---------------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[View], None]) -> Callable[[], None]:
        """Call `callback(view)` on every change of the view; returns the function that unsubscribes."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def watch(self) -> ViewWatch:
        """An awaitable stream of view changes that always yields the newest view."""
        return ViewWatch(self)

    async def join(self, seed_address: str, *, attempts: int = 3) -> View:
        """Join the cluster through the member at `seed_address`; returns once the seed's view is merged.

        Tries `attempts` times with the links' back-off between tries, then raises LinkError saying why; each try
        waits at most the handshake timeout for the seed's answer, sending our view again every `JOIN_RESEND`
        meanwhile. The caller may bound it further.
        """
        if self.address is None:
            raise RuntimeError("Membership.run() must be started before join()")
        wait = self.links.config.handshake_timeout
        problem = LinkError(f"cannot join through {seed_address}: no attempt made")
        for attempt in range(1, attempts + 1):
            try:
                seed_id = await self.links.introduce(seed_address)
            except LinkError as exc:
                problem = LinkError(f"cannot join through {seed_address}: {exc}")
            else:
                # Our full view again every JOIN_RESEND until the seed's answer is merged: one lost message (a
                # connection that broke after the write) would otherwise cost the attempt's whole wait, and
                # three in a row the join. The exchange is idempotent; the seed answers each while we lack its view.
                watch = self.watch()
                with trio.move_on_after(wait):
                    while self.view.member(seed_id) is None:
                        self.links.send_nowait(seed_id, self._full_gossip(), address=seed_address)
                        with trio.move_on_after(JOIN_RESEND):
                            while self.view.member(seed_id) is None:
                                await watch.next()
                if self.view.member(seed_id) is not None:
                    return self.view
                problem = LinkError(f"cannot join through {seed_address}: the seed did not answer within {wait} s")
            if attempt < attempts:
                await trio.sleep(self.links.backoff(attempt))
        raise problem

    async def leave(self, *, close_links: bool = True) -> None:
        """Leave gracefully: gossip our LEAVING record to every member, then say Goodbye on every link.

        With `close_links=False` the links stay up (membership itself falls silent): the node still has its
        arcs to hand off, and closes them with `links.close_all` when that is done.

        The record carries a bumped incarnation, so it supersedes any rumour about us (even a DEAD one from a
        partition that healed a moment ago), and it is sent to dead members too: they may be alive. Bounded by
        the link timeouts (a dial in progress, then the goodbyes).
        """
        if self.address is None or self._left:
            return
        self._leaving = True
        me = self.view.member(self.node_id)
        assert me is not None
        leaving = replace(me, incarnation=me.incarnation + 1, state=MemberState.LEAVING)
        self._apply(self.view.with_member(leaving))
        # Our record alone, a partial gossip: it is the news. The whole view to every member would cost this node n
        # records n times, and every member whose view differed from it would answer with its own whole view.
        gossip = Gossip(epoch=self.view.epoch, full=False, members=(to_wire(leaving),))
        for member in self.view.members:
            if member.node_id != self.node_id and member.state is not MemberState.LEAVING:
                self._send(member.node_id, gossip)
        self._left = True
        if close_links:
            await self.links.close_all("leaving")

    # -- view changes -------------------------------------------------------------------------------------

    def _apply(self, new: View) -> bool:
        """Adopt `new` (already merged with the current view); refute rumours about us; notify. Changed?"""
        old = self.view
        me = new.member(self.node_id)
        rumour = me is not None and (me.state, me.address, me.weight, me.zone) != (
            MemberState.ALIVE, self.address, self.weight, self.zone)
        if rumour and not self._leaving and self.address is not None:
            assert me is not None
            new = new.join(self.node_id, self.address, self.weight, self.zone)
            log.info("%s refutes %s at incarnation %d", self.node_id, me.state.value, me.incarnation)
            if me.state is MemberState.DEAD:
                self.declared_dead_at = trio.current_time()
        if new.epoch == old.epoch and new.members == old.members:
            return False
        self.view = new
        limit = self.config.retransmit_mult * max(1, math.ceil(math.log10(len(new.members) + 1)))
        # both views list their members sorted by node id: one walk pairs each record with its old one (a lookup
        # per member made every change of one record cost n binary searches)
        olds, i = old.members, 0
        for member in new.members:
            node_id = member.node_id
            while i < len(olds) and olds[i].node_id < node_id:
                i += 1
            before = olds[i] if i < len(olds) and olds[i].node_id == node_id else None
            if before is member or before == member:
                continue
            self._broadcast[member.node_id] = limit
            if member.node_id == self.node_id:
                continue
            if member.state is MemberState.SUSPECT and (member.node_id, member.incarnation) not in self._suspicions:
                deadline = trio.current_time() + self.config.suspicion_timeout
                self._suspicions[(member.node_id, member.incarnation)] = deadline
                self._suspicion_added.set()
            was_live = before is not None and before.state in _LIVE
            if member.state not in _LIVE and was_live:
                self.links.forget(member.node_id, f"{member.node_id} is {member.state.value}")
        self._view_event.set()
        self._view_event = trio.Event()
        for callback in list(self._subscribers):
            callback(new)
        return True

    async def _suspicion_loop(self) -> None:
        """Declare dead each suspect whose deadline passed unrefuted; sleep until the next deadline or a new one."""
        while True:
            self._suspicion_added = added = trio.Event()
            now = trio.current_time()
            for key, deadline in list(self._suspicions.items()):
                if deadline <= now:
                    del self._suspicions[key]
                    self._suspicion_expired(*key)
            with trio.move_on_at(min(self._suspicions.values(), default=math.inf)):
                await added.wait()

    def _suspicion_expired(self, node_id: str, incarnation: int) -> None:
        if self._leaving:
            # A leaving node runs no failure detection: it no longer probes, and the members that stay stop
            # gossiping to it, so it would never hear the suspect's refutation and would declare a live member
            # dead (and hand its arcs to the wrong owners). A DEAD record from the members that stay still counts.
            return
        member = self.view.member(node_id)
        if member is not None and member.state is MemberState.SUSPECT and member.incarnation == incarnation:
            log.info("%s declares %s dead after %.1f s of suspicion", self.node_id, node_id,
                     self.config.suspicion_timeout)
            self._apply(self.view.update(node_id, state=MemberState.DEAD))

    # -- sending ------------------------------------------------------------------------------------------

    def _live_peers(self) -> tuple[Member, ...]:
        view = self.view
        if view is not self._live_of:
            self._live_of = view
            self._live = tuple(m for m in view.members if m.state in _LIVE and m.node_id != self.node_id)
        return self._live

    def _news(self) -> Gossip | None:
        """The records being gossiped (changed lately) as a partial gossip; None if there are none."""
        if not self._broadcast:
            return None
        members = tuple(to_wire(m) for node_id in sorted(self._broadcast) if (m := self.view.member(node_id)))
        return Gossip(epoch=self.view.epoch, full=False, members=members)

    def _full_gossip(self) -> Gossip:
        return Gossip(epoch=self.view.epoch, full=True, members=tuple(to_wire(m) for m in self.view.members))

    def _address_of(self, peer_id: str) -> str | None:
        member = self.view.member(peer_id)
        return member.address if member else None

    def _send(self, peer_id: str, message: Message) -> bool:
        if self._left or self._nursery is None:
            return False
        member = self.view.member(peer_id)
        return self.links.send_nowait(peer_id, message, address=member.address if member else None)

    def _send_datagram_first(self, peer_id: str, message: Message) -> bool:
        """A probe message or a partial gossip by datagram, or over the link if the peer takes no datagrams (or we
        send none, or the message is too large for one)."""
        if self._left or self._nursery is None:
            return False
        if self.links.datagram_peers.get(peer_id) is not False and self.links.send_datagram(
                peer_id, message, address=self._address_of(peer_id)):
            return True
        return self._send(peer_id, message)

    def _reply(self, peer_id: str, message: Message, datagram: bool) -> bool:
        """An answer, the way its question came (by datagram, else over the link)."""
        if datagram and not self._left and self.links.send_datagram(peer_id, message, address=self._address_of(peer_id)):
            return True
        return self._send(peer_id, message)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- loops --------------------------------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        while True:
            started = trio.current_time()
            target = None if self._leaving else self._next_probe_target()
            if target is not None:
                await self._probe(target, started)
            await trio.sleep_until(started + self.config.probe_interval)

    def _next_probe_target(self) -> str | None:
        for _ in range(2):
            while self._probe_round:
                node_id = self._probe_round.pop()
                member = self.view.member(node_id)
                if member is not None and member.state in _LIVE:
                    return node_id
            self._probe_round = [m.node_id for m in self._live_peers()]
            self._rng.shuffle(self._probe_round)
        return None

    async def _probe(self, target: str, started: float) -> None:
        seq = self._next_seq()
        acked = self._acks[seq] = trio.Event()
        try:
            member = self.view.member(target)
            self._send_datagram_first(target, Ping(seq=seq, epoch=self.view.epoch))
            with trio.move_on_after(self.config.probe_timeout):
                await acked.wait()
            if acked.is_set():
                return
            if self.links.datagrams and target not in self.links.datagram_peers:
                # It never sent us a datagram: it may take none (an older version, UDP blocked). Ask over its link.
                self._send(target, Ping(seq=seq, epoch=self.view.epoch))
            helpers = [m.node_id for m in self._live_peers() if m.node_id != target and m.state is MemberState.ALIVE]
            for helper in self._rng.sample(helpers, min(self.config.indirect_probes, len(helpers))):
                self._send_datagram_first(helper, ProbeRequest(seq=seq, target=target))
            with trio.move_on_at(started + self.config.probe_interval):
                await acked.wait()
            if acked.is_set():
                return
        finally:
            del self._acks[seq]
        if self._leaving:
            return  # we started leaving during the probe: its indirect probes were not sent, it proves nothing
        current = self.view.member(target)
        # Suspect only the record we probed: a refutation that arrived meanwhile (higher incarnation) stands.
        if current is not None and current.state is MemberState.ALIVE and current == member:
            log.info("%s suspects %s: no answer to direct or indirect probes", self.node_id, target)
            self._apply(self.view.update(target, state=MemberState.SUSPECT))

    async def _ping(self, target: str, timeout: float) -> bool:
        seq = self._next_seq()
        acked = self._acks[seq] = trio.Event()
        try:
            self._send_datagram_first(target, Ping(seq=seq, epoch=self.view.epoch))
            with trio.move_on_after(timeout):
                await acked.wait()
            return acked.is_set()
        finally:
            del self._acks[seq]

    async def _indirect_probe_loop(self) -> None:
        """Probe the targets peers asked about, each in a task of this loop's own nursery."""
        async with trio.open_nursery() as nursery:
            while True:
                self._probe_requested = added = trio.Event()
                requests, self._probe_requests = self._probe_requests, []
                for requester, request, datagram in requests:
                    nursery.start_soon(self._probe_for, requester, request, datagram)
                await added.wait()

    async def _probe_for(self, requester: str, request: ProbeRequest, datagram: bool) -> None:
        try:
            member = self.view.member(request.target)
            alive = False
            if member is not None and request.target != self.node_id:
                alive = await self._ping(request.target, self.config.probe_timeout)
            self._reply(requester, ProbeReply(seq=request.seq, target=request.target, alive=alive), datagram)
        finally:
            self._indirect_tasks -= 1

    async def _gossip_loop(self) -> None:
        while True:
            await trio.sleep(self.config.gossip_interval)
            gossip = self._news()
            if gossip is None or self._left:
                continue
            peers = self._live_peers()
            for member in self._rng.sample(peers, min(self.config.gossip_fanout, len(peers))):
                self._send_datagram_first(member.node_id, gossip)
            for node_id in list(self._broadcast):
                self._broadcast[node_id] -= 1
                if self._broadcast[node_id] <= 0:
                    del self._broadcast[node_id]

    async def _sync_loop(self) -> None:
        first = True
        while True:
            # The first wait is a random part of one period (nodes that start together do not sync together); the
            # stretch is taken again when a wait ends, so a node that started alone and then joined (or was given)
            # a large cluster waits as that cluster's member, not as a cluster of one.
            started, draw = trio.current_time(), self._rng.uniform(0.0, 1.0) if first else self._rng.uniform(0.5, 1.5)
            first = False
            for _ in range(8):  # bounded: each pass waits longer, for a cluster that grew meanwhile
                stretch = max(1.0, (len(self._live_peers()) + 1) / self.config.sync_members)
                due = started + self.config.sync_interval * stretch * draw
                if trio.current_time() >= due:
                    break
                await trio.sleep_until(due)
            peers = self._live_peers()
            if peers and not self._left:
                self._send(self._rng.choice(peers).node_id, self._full_gossip())

    async def _reconnect_loop(self) -> None:
        while True:
            await trio.sleep(self.config.reconnect_interval * self._rng.uniform(0.5, 1.5))
            if self._left:
                continue
            dead = [m for m in self.view.members if m.state is MemberState.DEAD and m.node_id != self.node_id]
            for member in dead:
                self.links.forget(member.node_id, "retry done")
            if dead:
                self._send(self._rng.choice(dead).node_id, self._full_gossip())

    # -- receiving ----------------------------------------------------------------------------------------

    async def _on_datagram(self, peer_id: str, message: Message) -> None:
        await self._on_message(peer_id, message, datagram=True)

    async def _on_message(self, peer_id: str, message: Message, datagram: bool = False) -> None:
        self.last_heard[peer_id] = trio.current_time()
        if isinstance(message, Ping):
            self._reply(peer_id, Pong(seq=message.seq, epoch=self.view.epoch), datagram)
            if message.epoch != self.view.epoch:
                # Views differ. A pinger behind us (a lower epoch) while records are being gossiped most likely lacks
                # just those (a change spreading): they go, not the whole view, which pings from members that have
                # not yet merged a change would otherwise fetch n records each. Otherwise the whole view goes (and,
                # from a pinger ahead of us, comes back whole: how a node that restarted catches up at once).
                news = self._news() if message.epoch < self.view.epoch else None
                if news is None:
                    self._send(peer_id, self._full_gossip())
                else:
                    self._reply(peer_id, news, datagram)
        elif isinstance(message, Pong):
            if (acked := self._acks.get(message.seq)) is not None:
                acked.set()
        elif isinstance(message, ProbeReply):
            if message.alive and (acked := self._acks.get(message.seq)) is not None:
                acked.set()
        elif isinstance(message, ProbeRequest):
            if self._indirect_tasks < _MAX_INDIRECT_TASKS and self._nursery is not None:
                self._indirect_tasks += 1
                self._probe_requests.append((peer_id, message, datagram))
                self._probe_requested.set()
            else:
                self._reply(peer_id, ProbeReply(seq=message.seq, target=message.target, alive=False), datagram)
        elif isinstance(message, Gossip):
            self._on_gossip(peer_id, message)
        elif self._on_other is not None:
            await self._on_other(peer_id, message)
        else:
            log.debug("%s ignores %s from %s", self.node_id, type(message).__name__, peer_id)

    def _on_gossip(self, peer_id: str, gossip: Gossip) -> None:
        if self._refuses(peer_id) or (self.view.member(peer_id) is None and not self._admits(peer_id)):
            self.gossip_refused += 1
            return
        try:
            members = tuple(from_wire(m) for m in gossip.members if not self._refuses(m.node_id)
                            or m.node_id == self.node_id)
            incoming = View(members=members)
            # A partial gossip's epoch is that of the sender's whole view; only a full view keeps it.
            incoming = View(epoch=gossip.epoch if gossip.full else incoming.rank, members=members)
        except ValueError as exc:
            log.warning("gossip from %s ignored, it holds an impossible record: %s", peer_id, exc)
            return
        # a node that joins through us: its first full view holds only itself, and we did not know it
        newcomer = gossip.full and self.view.member(peer_id) is None and [m.node_id for m in members] == [peer_id]
        self._apply(merge(self.view, incoming))
        if gossip.full and (self.view.epoch, self.view.members) != (incoming.epoch, incoming.members):
            self._send(peer_id, self._full_gossip())
        if newcomer:
            self._announce(peer_id)

    def _announce(self, newcomer: str) -> None:
        """Tell every other live member of `newcomer`, which joined through us: its record alone, a partial
        gossip by datagram (a leave's news travels the same way). Each member's ring then changes within one
        delivery, not after the log(n) rounds of gossip it would take to reach the last of a thousand members."""
        record = self.view.member(newcomer)
        if record is None or record.state is not MemberState.ALIVE:
            return
        gossip = Gossip(epoch=self.view.epoch, full=False, members=(to_wire(record),))
        for member in self._live_peers():
            if member.node_id != newcomer:
                self._send_datagram_first(member.node_id, gossip)
