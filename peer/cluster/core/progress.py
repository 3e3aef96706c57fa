"""Crawl progress gathered over a tree of the ring's members, so that each node handles a bounded number of
progress messages a second however large the cluster is.

The members of a ring, sorted by node id, are numbered 0..n-1; the ring's id names that list on every node that
built the same ring. A wave asks the first member of a contiguous range of that list for the range: the range's
ids travel with the wave (`ProgressWave.members`), so the tree is the root's whatever ring the receivers hold.
The receiver asks the first member of each of up to `FANOUT` equal parts of the rest of its range for theirs,
adds its own, and answers its parent with one `ProgressTally`: how many members of the range answered at all
(`heard`), how many answered on the wave's ring (`nodes`), how many of those are idle, the sum of their activity
counters, how many have concluded the crawl finished. Member 0 (the root) starts a wave every
`PROGRESS_INTERVAL` (and the last member another, below); the tree is `log_FANOUT(n)` deep, so a wave costs each
node one query and one answer from its parent, and at most `FANOUT` of each with its children: O(1) messages per
node a wave, against 2(n - 1) when every node asked every peer. The ids cost bytes, not messages: a wave carries each member's id once per level
above it (about n log_FANOUT(n) ids a wave in all).

A node whose ring is not the wave's (a view change under way) is heard but counts in no other field; it still
passes the wave to the rest of its range, which it reads from the wave, so one member behind or ahead of the
others hides nobody else. A child that does not answer within the wave's time counts nobody. The root starts a
wave every interval whether or not the last one has returned, so one member that does not answer slows no wave
but the ones it is in.

Contact. The root has proof of contact with a strict majority of its ring when a wave's `heard`, with itself,
is more than half its members; the proof is dated by that wave's start (each answer was sent after it).
`contact_at` holds the date of the newest proof. Every wave carries the sender's proof as an age (`proof`,
seconds, None if older than `CONTACT_WINDOW`), and a receiver takes it as its own, as old as it was sent: a
node that heard from a node that heard from a majority has heard from a majority, no later than that. A proof is
never refreshed by passing it on, so on the minority side of a partition every proof runs out within
`CONTACT_WINDOW` of the last majority count made before the split. Every member on the root's list gets a wave
a second, leaves included, whatever ring it holds; a root that took over (its ring changed) carries the proof it
received from the root before. The partition fence (`peer/cluster/core/fence.py`) counts `contact_at` as contact
with the majority. This is what lets a node talk to a bounded number of peers and still know it is not on the
minority side of a partition.

Two trees, and around dead members. One tree has one root, and the members that answer for parts of it
(about one in eight): the death of one of them stops the waves below it, and the root's death stops them all,
until the views drop it (the suspicion timeout, then the ring change), so every node below would fence itself
for that long and then hold (docs/cluster.md). So there are two trees over the same list, their waves half an
interval apart: the first rooted at the list's first member, the second at its last (the list reversed). The
last member is a leaf of the first tree and the first a leaf of the second, so either root's death leaves the
other tree whole, and a member below a dead member in one tree is seldom below it in the other: its proofs keep
coming from the other tree, each a count of a majority, whichever root made it. Then, once its view holds a
member SUSPECT (`suspect(peer)`, the membership's first word on a silent member, about a probe after a
death), a node routes its waves around it: a suspect first member of a part is asked for itself alone, not
waited for (counted if it answers in time), and the rest of the part goes to the next member that is not
suspect; and the first member of a tree's list that is not suspect is that tree's root, with the list turned so
that it comes first. Two roots of one tree (a root wrongly suspected and its stand-in) are harmless: each count
is a count, each conclusion the four-counter method's. The price is twice the progress messages: each node
handles at most 2 (FANOUT + 1) of each a second.

Termination (the four-counter method, as before): the root concludes when two waves in a row, the second begun
after the first had returned, counted every member of the same ring, all idle, with the same sum of activity.
Every snapshot of the second wave is then taken after every snapshot of the first; activity counters only grow,
so an unchanged sum means no node's changed in between, and an idle node has nothing queued, nothing in flight,
and every batch and chunk it sent acknowledged. The root then sends a wave marked `finished`: a node on the
wave's ring that is idle when it gets one concludes too, and lingers until its range has answered that it
concluded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import trio

from protocol import Message, ProgressTally, ProgressWave

from peer.cluster.core.fence import CONTACT_WINDOW

__all__ = ["FANOUT", "HOP_WAIT", "MAX_GATHERS", "MAX_WAVES", "Local", "ProgressTree", "Tally", "children", "depth"]

# its records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.cluster.progress")

#: Children per node in the tree: 1,000 members are 4 levels deep.
FANOUT = 8
#: How long a level of the tree may take to answer: a round trip on a slow network (1.2 s), with room to spare.
#: Only a member that does not answer makes a wave wait this long; the others answer as soon as their range has.
HOP_WAIT = 2.0
#: Waves a node gathers at once (each lasts at most a wave's time): more are answered at once, counting nobody.
MAX_GATHERS = 32
#: Waves the root has under way at once: a member that does not answer holds each for up to HOP_WAIT per level
#: (10 s at 1,000 members), and one must start every second for the contact proof to stay fresh.
MAX_WAVES = 16


def children(lo: int, hi: int, fanout: int = FANOUT) -> list[tuple[int, int]]:
    """The ranges the member at `lo` asks, for the range `lo..hi-1`: `lo+1..hi-1` cut into up to `fanout`
    contiguous parts of sizes differing by at most one; each part's first member answers for it."""
    rest = hi - lo - 1
    if rest <= 0:
        return []
    parts = min(fanout, rest)
    out = []
    start = lo + 1
    for i in range(parts):
        size = rest // parts + (1 if i < rest % parts else 0)
        out.append((start, start + size))
        start += size
    return out


def depth(n: int, fanout: int = FANOUT) -> int:
    """Levels of questions below the root for `n` members (0 for one member)."""
    levels = 0
    while n > 1:
        n = math.ceil((n - 1) / fanout)
        levels += 1
    return levels


@dataclass(frozen=True, slots=True)
class Local:
    """One node's own progress, as a tally counts it."""

    idle: bool
    activity: int
    finished: bool


@dataclass(frozen=True, slots=True)
class Tally:
    """What a wave counted over a range of members of `ring`: `heard` answered at all, `nodes` on `ring`."""

    ring: int
    heard: int
    nodes: int
    idle: int
    activity: int
    concluded: int

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.ring, self.heard + other.heard, self.nodes + other.nodes, self.idle + other.idle,
                     self.activity + other.activity, self.concluded + other.concluded)


def _never(peer: str) -> bool:
    return False


class _Gather:
    __slots__ = ("waiting", "tally", "done", "majority")

    def __init__(self, waiting: int, tally: Tally, majority: Callable[[int], None] | None = None) -> None:
        self.waiting = waiting
        self.tally = tally
        self.done = trio.Event()
        self.majority = majority  # the root's: called with the members heard (itself counted) as answers come


class ProgressTree:
    """One node's part in the progress waves. `members()` gives the current ring's id and its members sorted by
    node id; `local(finished_wave)` this node's own progress (a wave marked finished may make it conclude first);
    `send(peer, message)` queues a message without waiting; `suspect(peer)` whether this node's view holds that
    member SUSPECT (waves go around it, and it is not the root while it is)."""

    def __init__(self, node_id: str, *, members: Callable[[], tuple[int, tuple[str, ...]]],
                 local: Callable[[bool], Local], send: Callable[[str, Message], bool],
                 concluded: Callable[[str], None] = lambda why: None,
                 suspect: Callable[[str], bool] = _never) -> None:
        self.node_id = node_id
        self._members = members
        self._suspect = suspect
        self._local = local
        self._send = send
        self._concluded = concluded
        self.contact_at = -math.inf  # trio time of the newest proof of contact with a majority (when it was heard)
        self.reached = 0  # members the root's last returned wave heard from (itself counted)
        self._waves = 0  # the root's waves under way
        self._seq = 0
        # seq of a wave we sent -> (child, its gathering, whether the gathering waits for its answer)
        self._waits: dict[int, tuple[str, _Gather, bool]] = {}
        self._gathers = 0
        self._nursery: trio.Nursery | None = None
        self.waves_started = 0
        self.waves_answered = 0
        self.waves_refused = 0  # answered at once counting itself alone: too many gatherings, or not addressed
        self.waves_off_ring = 0  # waves of another ring than ours, passed on all the same
        self.routed_around = 0  # suspect first members of a part asked for themselves alone
        self.range_concluded = False  # a finished wave came back with every member of our range concluded
        # per tree (False: the first, True: the second), (ring, members, activity, when it returned) of the root's
        # last wave that counted every member idle
        self._last: dict[bool, tuple[int, int, int, float] | None] = {False: None, True: None}

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def is_root(self, second: bool = False) -> bool:
        """Whether this node starts the waves of the first tree (the second with `second`): the first member of
        the ring's list (of the list reversed) that its view does not hold SUSPECT. A ring of one member has
        one tree."""
        _ring, members = self._tree(second)
        return (len(members) > 1 or not second) and self.node_id in members[:1]

    def _tree(self, second: bool = False) -> tuple[int, tuple[str, ...]]:
        """The ring's id and its members in the order a wave of the first tree (the second: the list reversed)
        from this node lists them: turned so that the first member not suspect comes first (the suspect members
        before it go last)."""
        ring, members = self._members()
        if second:
            members = members[::-1]
        for i, member in enumerate(members):
            if member == self.node_id or not self._suspect(member):
                return ring, (members[i:] + members[:i]) if i else members
        return ring, members

    def proof(self) -> float | None:
        """How long ago this node's newest proof of contact with a majority was heard, if within the window."""
        age = trio.current_time() - self.contact_at
        return max(0.0, age) if age <= CONTACT_WINDOW else None

    def tick(self, second: bool = False) -> bool:
        """As the root, start a wave (without waiting for it): it concludes the crawl when it and a wave that
        returned before it began both counted every member idle with the same activity. False if too many waves
        are under way."""
        if self._nursery is None or self._waves >= MAX_WAVES:
            return False
        self._waves += 1
        self._nursery.start_soon(self._tick, second)
        return True

    async def _tick(self, second: bool) -> None:
        try:
            if self._local(False).finished:
                await self.wave(finished=True, second=second)
                return
            why = await self.round(second)
            if why is not None and not self._local(False).finished:
                self._concluded(why)
                await self.wave(finished=True, second=second)  # every member learns it now, not a wave later
        finally:
            self._waves -= 1

    async def wave(self, *, finished: bool, second: bool = False) -> Tally:
        """Start a wave of the first tree (the second with `second`) over every member from its root (this
        node); what it counted: nothing if this node is not that tree's root now (it was when it ticked, standing
        in for a suspect member whose suspicion has been refuted since: the list it would gather now begins with
        that member, and its own part would be asked of itself)."""
        ring, members = self._tree(second)
        if members[:1] != (self.node_id,):
            return Tally(ring, 0, 0, 0, 0, 0)
        self.waves_started += 1
        wait = HOP_WAIT * (depth(len(members)) + 1)
        began = trio.current_time()

        def counted(heard: int) -> None:
            # every answer counted was sent after the wave began: a majority heard is a proof dated by the start,
            # known as soon as the answers come (a silent member holds the wave's return for seconds)
            if 2 * heard > len(members):
                self.contact_at = max(self.contact_at, began)

        tally = await self._gather(ring, members, wait, finished, counted)
        counted(tally.heard)
        self.reached = tally.heard
        if finished and tally.concluded == len(members):
            self.range_concluded = True
        return tally

    async def round(self, second: bool = False) -> str | None:
        """As the root: one wave; why the crawl is finished everywhere, or None. Finished when this wave and one
        that had returned before this one began each counted every member of the same ring, all idle, with the
        same sum of activity; or when a member has concluded it (under an earlier root) and we are idle."""
        ring, members = self._members()
        n = len(members)
        began = trio.current_time()
        tally = await self.wave(finished=False, second=second)
        if tally.concluded > 0 and self._local(False).idle:
            return "a member concluded it"
        if tally.ring != ring or self._members()[0] != ring or tally.nodes != n or tally.idle != n:
            self._last[second] = None
            return None
        last = self._last[second]
        if last is not None and last[:3] == (ring, n, tally.activity):
            if began >= last[3]:
                return "two waves with every member idle"
            return None  # this wave overlapped that one: the next may conclude
        self._last[second] = (ring, n, tally.activity, trio.current_time())
        return None

    def on_wave(self, peer_id: str, wave: ProgressWave) -> None:
        # the sender's proof of contact is ours, as old as it was (a wave of another ring proves it just as well)
        if wave.proof is not None and wave.proof <= CONTACT_WINDOW:
            self.contact_at = max(self.contact_at, trio.current_time() - wave.proof)
        addressed = bool(wave.members) and wave.members[0] == self.node_id
        if not addressed or self._nursery is None or self._gathers >= MAX_GATHERS:
            # we answered: heard (if it was us it asked), though our range is not gathered
            self.waves_refused += 1
            self._send(peer_id, ProgressTally(seq=wave.seq, ring=wave.ring, heard=int(addressed), nodes=0, idle=0,
                                              activity=0, concluded=0))
            return
        on_ring = wave.ring == self._members()[0]
        self.waves_off_ring += not on_ring
        self._gathers += 1
        self._nursery.start_soon(self._answer, peer_id, wave, on_ring)

    def on_tally(self, peer_id: str, tally: ProgressTally) -> None:
        entry = self._waits.pop(tally.seq, None)
        if entry is None or entry[0] != peer_id:
            return  # late (its wave gave up on it) or not ours
        _child, gather, waited = entry
        if tally.ring == gather.tally.ring:
            gather.tally = gather.tally + Tally(tally.ring, tally.heard, tally.nodes, tally.idle, tally.activity,
                                               tally.concluded)
        if not waited:  # a suspect member asked for itself: counted, but nothing waits for it
            return
        gather.waiting -= 1
        if gather.majority is not None:
            gather.majority(gather.tally.heard + 1)
        if gather.waiting == 0:
            gather.done.set()

    async def _answer(self, parent: str, wave: ProgressWave, on_ring: bool) -> None:
        try:
            tally = await self._gather(wave.ring, wave.members, wave.wait - HOP_WAIT, wave.finished,
                                       on_ring=on_ring)
            if wave.finished and tally.concluded == len(wave.members):
                self.range_concluded = True
            self.waves_answered += 1
            self._send(parent, ProgressTally(seq=wave.seq, ring=tally.ring, heard=tally.heard, nodes=tally.nodes,
                                             idle=tally.idle, activity=tally.activity, concluded=tally.concluded))
        finally:
            self._gathers -= 1

    async def _gather(self, ring: int, members: tuple[str, ...], wait: float, finished: bool,
                      counted: Callable[[int], None] | None = None, *, on_ring: bool = True) -> Tally:
        """Ask the first member of each part of `members[1:]` for its part, wait for their answers (at most
        `wait`), add this node's own snapshot (`members[0]` is this node); counted on `ring` only if `on_ring`."""
        asks: list[tuple[int, int, bool]] = []  # (start, end, waited) of each wave this node sends
        for start, end in children(0, len(members)):
            # around suspect first members: each asked for itself alone, unwaited; the rest goes to the next
            while end - start > 1 and self._suspect(members[start]):
                asks.append((start, start + 1, False))
                start += 1
            asks.append((start, end, end - start > 1 or not self._suspect(members[start])))
        self.routed_around += sum(1 for ask in asks if not ask[2])
        waited = sum(1 for ask in asks if ask[2])
        gather = _Gather(waited, Tally(ring, 0, 0, 0, 0, 0), counted)
        proof = self.proof()
        mine = []
        for start, end, wait_for in asks:
            self._seq += 1
            self._waits[self._seq] = (members[start], gather, wait_for)
            mine.append(self._seq)
            self._send(members[start], ProgressWave(seq=self._seq, ring=ring, members=members[start:end],
                                                    wait=max(0.0, wait - HOP_WAIT), finished=finished,
                                                    proof=proof))
        if waited:
            with trio.move_on_after(max(wait, HOP_WAIT)):
                await gather.done.wait()
        for seq in mine:
            self._waits.pop(seq, None)
        if not on_ring:
            return gather.tally + Tally(ring, 1, 0, 0, 0, 0)  # heard, but its progress is of another ring
        # our own snapshot last: after every child's (a wave's snapshots all fall between its start and its end)
        me = self._local(finished)
        return gather.tally + Tally(ring, 1, 1, int(me.idle), me.activity, int(me.finished))
