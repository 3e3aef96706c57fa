"""Arc hand-off: when the view changes, the previous owner of each moved arc streams its state to the new owner.

DESIGN decision 6: the queued URLs, the seen-URL keys and the hosts' politeness state of an arc go to its new
owner in `HandoffChunk`s; the old owner keeps all of it until every chunk of the arc is acknowledged, and only
then deletes it (but the seen keys of fetched pages: those it sent, and those marked here meanwhile as the new
owner's backup, `marked_seen`). The receiver applies chunks idempotently and acknowledges only after `sync()`,
so a lost chunk, a lost ack, a re-send and a receiver restart all end with each URL queued once at the new owner.

Why the receiver can apply chunks in any order and any number of times: queued URLs go through `store.admit`
(dedup + frontier in one transaction), and the seen keys sent are those of the arc *minus* the keys of the
queued URLs being sent, so a URL is never marked seen before it is queued. Host states are merged by keeping
the later `next_allowed`. See docs/cluster.md, "Hand-off", for the politeness rule.

The hand-off is one `Handoff` made of parts, a module each: here the view changes (which transfers to start,
and when), what the crawler and the cluster consult (lost and awaited arcs, progress, asks and waits), and the
message entry point; `handoffsend` (the sending side, `Sending`), `handoffreceive` (the receiving side,
`Receiving`), `handoffconfig` (the config, the links and the delegate it is built with), `arcs` (arc sets and
the plan of a view change, pure numpy).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import trio

from protocol import HandoffAck, HandoffAsk, HandoffChunk, Message
from ring import RING_SPACE, ArcMove, Moves, Ring, host_position
from storage import NodeStore

from peer.cluster.handoff.arcs import KEY_POSITION, ArcSet, ViewPlan, handoff_arcs, plan_view
from peer.cluster.handoff.config import Alone, HandoffConfig, HandoffDelegate, HandoffLinks, Hold
from peer.cluster.handoff.receive import Incoming, Receiving
from peer.cluster.handoff.send import Outgoing, Sending

__all__ = ["Alone", "ArcSet", "Handoff", "HandoffConfig", "HandoffDelegate", "HandoffLinks", "Hold", "ViewPlan",
           "handoff_arcs", "plan_view"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.handoff")

#: Transfers started in one step of the event loop (each reads the flight records and locates the hosts); the
#: rest start at the next pump, which `run` makes at once when some were left.
_STARTS_PER_STEP = 16


def _positions(values: Iterable[int]) -> np.ndarray:
    return np.fromiter(values, dtype=np.uint64)


class Handoff(Sending, Receiving):
    """Both ends of the hand-off for one node: outgoing transfers of lost arcs, incoming chunks of gained ones.

    A transfer is everything this node hands to one peer at one view epoch: one chunk sequence (numbered from
    0, the final one marked `last`) over the arcs that hold anything; each chunk names the arc its content
    lies in. `view_changed(epoch, old, new)` starts the transfers; `run` sends and re-sends chunks;
    `on_message` takes `HandoffChunk` and `HandoffAck`. The crawler consults `blocked(position)` before
    fetching a host and stops fetching hosts in `lost_arcs()`.
    """

    def __init__(
        self,
        node_id: str,
        store: NodeStore,
        links: HandoffLinks,
        *,
        config: HandoffConfig = HandoffConfig(),
        wall_clock: Callable[[], float] = time.time,
        delegate: HandoffDelegate | None = None,
    ) -> None:
        self.node_id = node_id
        self.store = store
        self.links = links
        self.config = config
        self.wall_clock = wall_clock  # host states keep wall-clock next_allowed; the wire carries durations
        # What the hand-off asks of the node around it (the cluster), as one named protocol.
        self.delegate: HandoffDelegate = delegate if delegate is not None else Alone(node_id)
        # peer -> ring ids of its completed transfers. Transfers are labelled with the id of the ring they hand
        # off to (not the view epoch: two nodes can number the same ring differently), so both ends agree.
        self._completed: dict[str, set[int]] = {}
        self._ring_id: int | None = None
        self._ring: Ring | None = None  # the ring `_ring_id` names
        self._asked: dict[str, int] = {}  # peer -> the ring it waits for arcs up to (its HandoffAsk)
        self._asks_sent: dict[str, float] = {}  # peer -> when we last asked it
        self.asks_sent = 0
        self.asks_answered = 0  # empty transfers sent because a peer asked
        self.urls_forwarded = 0
        self.urls_discarded = 0  # queued here, but the previous owner had already fetched them
        self._run = 0  # the store's run counter, set by `run`: transfer ids never repeat an earlier process's
        self._transfers = 0
        # transfers not started yet: (transfer id, ring id, peer, arcs, the ring it hands off to (None: a sweep))
        self._waiting: list[tuple[int, int, str, ArcSet, Ring | None]] = []
        # transfer id -> (its arcs, the keys of pages fetched elsewhere marked seen here since it was queued that
        # lie in them), for each transfer waiting, under way or being dropped: those keys stay after its drop
        self._marked: dict[int, tuple[ArcSet, set[bytes]]] = {}
        self._dropping = 0  # completed transfers whose arcs are being dropped from the store, a slice at a time
        self._hosts_here: np.ndarray | None = None  # positions of the hosts held here, while transfers start
        self._deferred = False  # transfers that may start were left for the next step
        self._wake: trio.Event | None = None  # set to wake `run` before its interval is up
        self._latest: set[int] = set()  # ids of the transfers of the latest view change (their arcs are `_lost`)
        self._quiet: set[int] = set()  # ids of waiting transfers sent only if they carry something (`_queue`)
        self.transfers_unneeded = 0  # quiet transfers that found nothing to send, and so sent nothing
        self._outgoing: dict[int, Outgoing] = {}
        self._incoming: dict[tuple[str, int], Incoming] = {}
        # chunks applied here whose ack waits for their URLs' replicas: (sender, transfer, chunk) -> None
        self._held: dict[tuple[str, int, int], None] = {}
        self.acks_held = 0  # chunks whose ack waited for their replicas
        self._lost = ArcSet(())  # arcs lost at the latest view change
        self._pending: dict[tuple[str, int], ArcSet] = {}  # (previous owner, epoch) -> arcs gained from it
        self._pending_since: dict[tuple[str, int], float | None] = {}
        self.chunks_sent = 0
        self.chunks_resent = 0
        self.chunks_applied = 0
        self.transfers_completed = 0
        self.transfers_received = 0
        self.waits_expired = 0  # gained arcs released after `wait` without their transfer
        self.urls_sent = 0  # queued URLs exported in transfers
        self.urls_received = 0  # queued URLs that arrived in chunks and were new here
        self.revisits_sent = 0  # revisit schedule entries sent in transfers
        self.revisits_received = 0  # ... and applied here
        self.keys_sent = 0
        self.keys_withheld = 0  # seen keys sent only once their page's release was no longer held
        self.withheld_expired = 0  # ... or after `withhold_limit`, still held

    # -- view changes --

    def view_changed(
        self,
        epoch: int,
        old: Ring,
        new: Ring,
        *,
        gone: Iterable[str] = (),
        gains_from: Ring | None = None,
        arcs: Moves | Sequence[ArcMove] | None = None,
        gain_arcs: Moves | Sequence[ArcMove] | None = None,
        plan: ViewPlan | None = None,
    ) -> Moves:
        """Start handing off the arcs this node loses from `old` to `new`, and note the arcs it gains.

        `gone` names previous owners that will send nothing (dead nodes): their arcs are not waited for.
        `gains_from` is the ring to compute gained arcs against when it is not `old`: a node that just joined
        had only itself in `old`, but the arcs it gains come from the owners in the cluster's previous ring.
        `arcs` and `gain_arcs` may carry the moves of `old` to `new` and of `gains_from` to `new` computed
        beforehand, as `diff_moves` (or `wire_moves` of it), or as a list in the form of `handoff_arcs(diff(...))`;
        or `plan` carries all of it worked out (`plan_view`, in the cluster's worker thread: a node that joins
        loses ten million arcs at 1,000 points per weight). The moves are handled as arrays: nothing here makes
        an object per arc. Returns the arcs this node loses, in the hand-off's form (a wrapping arc is one).
        """
        if not 0 <= epoch < 1 << 64:
            raise ValueError(f"ring id {epoch} must be in [0, 2**64)")
        if plan is None:
            plan = plan_view(self.node_id, old, new, gone=gone, gains_from=gains_from, arcs=arcs,
                             gain_arcs=gain_arcs)
        if self._ring_id is not None and self._ring_id != epoch:
            # A completed transfer to the ring we leave said "nothing more from me up to this ring" then. Should
            # we come back to that ring (a partition that heals, a member that dies and comes back), the peer
            # may have held our arcs in between: only a transfer made since then says so again. Remembered from
            # before, a transfer labelled with that ring would release at once the arcs the peer is still
            # handing back.
            for rings in self._completed.values():
                rings.discard(self._ring_id)
        self._ring_id = epoch
        self._ring = new
        self._lost = plan.lost_set
        first = self._transfers + 1
        for peer in sorted(plan.by_peer):
            self._queue(epoch, peer, plan.by_peer[peer], new, quiet=peer in plan.quiet)
        self._latest = {self._run << 40 | n for n in range(first, self._transfers + 1)}  # within `_lost`
        # A peer that asked for this ring before we adopted it hears "nothing more from me up to this ring" (an
        # empty transfer, after any earlier one to it) if this change gives it nothing of ours: a receiver that
        # saw the rings in another order, and waits for arcs this node labelled with a ring it never adopted, is
        # released by it instead of by the wait timeout. Peers ask only for what they wait for (`HandoffAsk`).
        for peer, ring in sorted(self._asked.items()):
            if ring == epoch:
                self._answer_ask(peer)
        self._start_quiet()
        for peer, peer_arcs in plan.gained.items():
            if epoch in self._completed.get(peer, ()):
                self._release(peer, epoch)  # its transfer for this ring arrived before we adopted the ring
                continue
            self._pending[(peer, epoch)] = peer_arcs
            self._pending_since[(peer, epoch)] = None  # the next pump starts the clock
        # A peer whose transfer to this ring arrived before we adopted it has nothing more for us up to this
        # ring, so it releases what we still wait for from it under older rings too, even if it hands us nothing
        # in this one (a joiner whose first ring still held a leaving node waited 30 s for such arcs).
        for peer in {key[0] for key in self._pending}:
            if epoch in self._completed.get(peer, ()):
                self._release(peer, epoch)
        return plan.lost

    def sweep(self, epoch: int, owner_of: Callable[[str], str], hosts: Iterable[str]) -> int:
        """Hand off the state of `hosts` this node holds but does not own (a chunk that arrived after the
        arc moved on, a restart with an older view): each host's point of the ring becomes a one-position
        arc sent to its owner. Returns how many hosts were swept."""
        by_peer: dict[str, set[int]] = {}
        for host in hosts:
            owner = owner_of(host)
            if owner == self.node_id:
                continue
            by_peer.setdefault(owner, set()).add(host_position(host))
        for peer, positions in sorted(by_peer.items()):
            self._queue(epoch, peer, ArcSet((position, (position + 1) % RING_SPACE) for position in positions), None)
        self._start_quiet()
        return sum(len(positions) for positions in by_peer.values())

    def _next_transfer_id(self) -> int:
        self._transfers += 1
        return self._run << 40 | self._transfers

    def _queue(self, epoch: int, peer: str, arcs: ArcSet, ring: Ring | None, *, quiet: bool = False) -> None:
        """A transfer of `arcs` to `peer` waits to start (`_start_quiet`); from now on the seen marks of its arcs
        are kept for its drop (`marked_seen`). A `quiet` one goes only if it finds something to send: the peer
        waits for nothing from us (`ViewPlan.quiet`), so an empty "nothing more from me" would tell it nothing."""
        transfer_id = self._next_transfer_id()
        self._waiting.append((transfer_id, epoch, peer, arcs, ring))
        if quiet:
            self._quiet.add(transfer_id)
        if len(arcs):
            self._marked[transfer_id] = (arcs, set())

    def marked_seen(self, keys: Sequence[bytes]) -> None:
        """Keys of pages fetched elsewhere were just marked seen here: this node is a backup of their owner (a
        page's release, a seen-key replica). Those in the arcs of a transfer waiting, under way or being dropped
        stay after its drop, as the keys of fetched pages it sent do.

        Why: the drop takes the arcs' seen keys but those sent as seen, and the keys of the URLs sent queued are
        not among those. The new owner fetches such a URL and releases it to its backups, often this node (the
        arc's owner before it); the release marks it seen here, and were the drop to take the mark, at the new
        owner's death this node, its heir, would fetch the page again though it was not under way. A release
        that lands here in the last moments of a long hand-off is the usual case."""
        if not self._marked or not keys:
            return
        positions = np.frombuffer(b"".join(key[:KEY_POSITION] for key in keys), dtype=">u8").astype(np.uint64)
        for arcs, kept in self._marked.values():
            inside = (arcs.locate(positions) >= 0).tolist()
            kept.update(key for key, hit in zip(keys, inside) if hit)

    def _start_quiet(self) -> None:
        """Start the waiting transfers that may go now. A transfer waits while
        - a fetch is in flight here in one of its arcs (the states it carries must include that fetch), or of any
          host the ring it hands off to gives its peer: a complete transfer to the peer's ring releases every arc
          the peer waits for from us, even one whose content went elsewhere first (to a node that owned it in a
          ring between), so even a transfer with no arcs must not release a host we are fetching;
        - an earlier transfer to the same peer is unacknowledged (a complete transfer to the receiver's ring
          releases every arc it waits for from us, so it must not overtake one still streaming);
        - one of its arcs is still awaited here from its previous owner (an arc that moves on while it arrives
          must reach its next owner with the timers and keys it is bringing, not without them);
        - a transfer to an older ring, to any peer, is still waiting or unacknowledged: it may carry the timers
          of hosts this ring gives this peer (to the node that owned them in the ring between, which passes
          them on), and "nothing more from me up to this ring" must not release those hosts before."""
        if not self._waiting:
            return
        self._hosts_here = None  # read once per call, by the first transfer that starts
        busy_list = list(self.delegate.busy_positions())
        busy = _positions(busy_list)
        sending = {transfer.peer for transfer in self._outgoing.values()}
        # (transfer id, ring id) of every transfer not yet acknowledged, started or not
        open_transfers = [(t.transfer_id, t.epoch) for t in self._outgoing.values()]
        open_transfers += [(w[0], w[1]) for w in self._waiting]
        pending = list(self._pending.values())
        # A transfer of the latest ring hands off arcs within `_lost`: if those touch no awaited arc (a joiner
        # awaits its 150,000 arcs and hands off the others), no such transfer needs the check one by one.
        lost_touches = any(self._lost.touches(arcs) for arcs in pending)
        still: list[tuple[int, int, str, ArcSet, Ring | None]] = []
        started = 0
        self._deferred = False
        for transfer_id, epoch, peer, arc_set, ring in self._waiting:
            if started >= _STARTS_PER_STEP:  # a leaving node starts 64 transfers: a few per step of the loop
                still.append((transfer_id, epoch, peer, arc_set, ring))
                self._deferred = True
                continue
            if (
                peer in sending
                or arc_set.holds_any(busy)
                or (ring is not None and busy_list and peer in ring.weights and peer in ring.owners_at(busy_list))
                or ((lost_touches or transfer_id not in self._latest)
                    and any(arc_set.touches(arcs) for arcs in pending))
                or any(tid < transfer_id and ring_id != epoch for tid, ring_id in open_transfers)
            ):
                still.append((transfer_id, epoch, peer, arc_set, ring))
                sending.add(peer)  # keep this peer's later transfers behind this one
            else:
                quiet = transfer_id in self._quiet
                self._quiet.discard(transfer_id)
                if self._start_transfer(transfer_id, epoch, peer, arc_set, quiet=quiet):
                    sending.add(peer)
                started += 1
        self._waiting = still

    # -- what the crawler consults --

    def lost(self, position: int) -> bool:
        """Whether a host at ring `position` lies in an arc lost at the latest view change: no new fetch of it
        may start here (the crawler's ownership check under the current ring covers earlier changes)."""
        return position in self._lost

    def lost_arcs(self) -> list[tuple[int, int]]:
        """Arcs [start, end) lost at the latest view change, in position order (end <= start: it wraps)."""
        return list(self._lost.arcs)

    def pending_arcs(self) -> list[tuple[int, int]]:
        """Arcs gained whose transfer is not complete: their hosts must not be fetched yet."""
        return [arc for arcs in self._pending.values() for arc in arcs.arcs]

    def pending_count(self) -> int:
        """How many gained arcs wait for their transfer (`len(pending_arcs())` without making the list)."""
        return sum(len(arcs) for arcs in self._pending.values())

    def progress(self) -> list[tuple[str, bool, float, int]]:
        """Transfers under way, for the dashboard: (peer, True, share of the key space awaited from it, 0) for
        incoming ones, (peer, False, 0.0, chunks not yet acknowledged) for outgoing ones."""
        awaited: dict[str, int] = {}
        for (peer, _epoch), arcs in self._pending.items():
            awaited[peer] = awaited.get(peer, 0) + arcs.length()
        sending: dict[str, int] = {}
        for transfer in self._outgoing.values():
            sending[transfer.peer] = sending.get(transfer.peer, 0) + len(transfer.chunks)
        for _tid, _epoch, peer, _arcs, _ring in self._waiting:
            sending[peer] = sending.get(peer, 0) + 1
        return ([(peer, True, length / RING_SPACE, 0) for peer, length in sorted(awaited.items())]
                + [(peer, False, 0.0, n) for peer, n in sorted(sending.items()) if n])

    def waiting(self) -> bool:
        """Whether any gained arc still waits for its transfer (a cheap check before `blocked`)."""
        return bool(self._pending)

    def blocked(self, position: int) -> bool:
        """Whether a host at ring `position` lies in an incoming arc whose transfer is not complete."""
        return any(position in arcs for arcs in self._pending.values())

    def waits_for(self, peer_id: str) -> bool:
        """Whether gained arcs still wait for a transfer from `peer_id`."""
        return any(key[0] == peer_id for key in self._pending)

    def abandon(self, peer_id: str) -> None:
        """`peer_id` died or left: stop waiting for its arcs (what it held is rebuilt from re-sent batches, or
        reached the owners of its last ring)."""
        for key in [key for key in self._pending if key[0] == peer_id]:
            del self._pending[key]
            self._pending_since.pop(key, None)

    def cancel_to(self, peer_id: str) -> int:
        """`peer_id` left or died: stop the transfers to it. Nothing is dropped: what they carried stays in
        this store, outside our arcs, and `sweep` sends it to the hosts' current owners. Returns how many."""
        gone = [tid for tid, t in self._outgoing.items() if t.peer == peer_id]
        gone += [w[0] for w in self._waiting if w[2] == peer_id]
        for tid in gone:
            self._outgoing.pop(tid, None)
            self._marked.pop(tid, None)
        self._waiting = [w for w in self._waiting if w[2] != peer_id]
        self._quiet.difference_update(gone)
        return len(gone)

    def _release(self, peer_id: str, epoch: int) -> None:
        """A transfer from `peer_id` to the ring `epoch` is complete. If that is our current ring, the peer has
        handed off everything it held in arcs that ring gives away, which covers every arc we still wait for
        from it (whatever rings it went through); an older ring's transfer covers only that ring's arcs."""
        self._completed.setdefault(peer_id, set()).add(epoch)
        current = epoch == self._ring_id
        for key in [key for key in self._pending if key[0] == peer_id and (current or key[1] == epoch)]:
            del self._pending[key]
            self._pending_since.pop(key, None)

    def _answer_ask(self, peer: str) -> None:
        """`peer` waits for arcs from us up to our current ring: a transfer labelled with it, an empty one
        unless one to it is on its way already."""
        epoch = self._asked.pop(peer)
        waiting = [w[0] for w in self._waiting if w[2] == peer and w[1] == epoch]
        if waiting or any(t.peer == peer and t.epoch == epoch for t in self._outgoing.values()):
            self._quiet.difference_update(waiting)  # it waits after all: sent even if it carries nothing
            return
        self._waiting.append((self._next_transfer_id(), epoch, peer, ArcSet(), self._ring))
        self.asks_answered += 1

    def _asked_by(self, peer_id: str, ask: HandoffAsk) -> None:
        """`peer_id` waits for arcs from us up to its ring `ask.ring`: answered at once if that is our ring and the
        peer is in it or leaving (a leaving node is in no ring of ours, yet its transfers wait for the arcs it
        still awaits from us), else when we adopt that ring (`view_changed`). A peer that is neither (dead or
        gone, as we see it) is not answered now: a transfer to it would stay unacknowledged."""
        self._asked[peer_id] = ask.ring
        members = self._ring.weights if self._ring is not None else ()
        if ask.ring == self._ring_id and (peer_id in members or self.delegate.departing(peer_id)):
            self._answer_ask(peer_id)
            self._start_quiet()
            if self._wake is not None:
                self._wake.set()

    def _expire(self, now: float) -> None:
        ask: set[str] = set()
        for key, since in list(self._pending_since.items()):
            if since is not None and now - since >= self.config.ask_after:
                ask.add(key[0])
            if since is None:
                self._pending_since[key] = now
            elif now - since >= self.config.wait:
                self._pending.pop(key, None)
                del self._pending_since[key]
                self.waits_expired += 1
                log.warning("gained arcs released without their hand-off after %.0f s", self.config.wait,
                            extra={"peer": key[0], "epoch": key[1]})
        if self._ring_id is None:
            return
        for peer in sorted(ask):
            if now - self._asks_sent.get(peer, -float("inf")) >= self.config.resend_after and self.links.send_nowait(
                    peer, HandoffAsk(ring=self._ring_id)):
                self._asks_sent[peer] = now
                self.asks_sent += 1
        for peer in [peer for peer in self._asks_sent if not self.waits_for(peer)]:
            del self._asks_sent[peer]

    def outstanding(self) -> int:
        """Chunks sent or to send and not yet acknowledged, over all outgoing transfers (at least one for a
        transfer still waiting for its arcs' fetches to finish, or whose chunks are not all made yet, and for one
        completed whose arcs are still being dropped here)."""
        return (sum(len(transfer.chunks) or not transfer.done for transfer in self._outgoing.values())
                + len(self._waiting) + self._dropping)

    # -- receiving --

    async def on_message(self, peer_id: str, message: Message) -> None:
        """Take a `HandoffChunk` (apply, sync, ack), a `HandoffAck` or a `HandoffAsk`; ignore anything else."""
        if isinstance(message, HandoffChunk):
            self._receive(peer_id, message)
        elif isinstance(message, HandoffAck):
            await self._acked(peer_id, message)
        elif isinstance(message, HandoffAsk):
            self._asked_by(peer_id, message)
