"""The simulating process's CPU split between the nodes' tasks and trio's run loop, by sampling (cluster mode).

A simulated cluster runs every node's tasks in one ``trio.run``: the run loop that wakes the tasks whose timers
expired (from one deadline heap holding every node's timers), delivers their cancellations and switches between
them is work that n separate processes would each do over their own few hundred timers. ``LoopShare`` samples the
process's CPU time (``ITIMER_PROF``: one sample per kernel tick of CPU, 4 ms at HZ=250, whatever the machine's
load) and counts the samples that fell in the run loop outside any task: every frame between the sampled one and
trio's ``unrolled_run`` is trio's own (or ``outcome``'s, which trio uses to resume a task). A sample in a task
counts as the task's, trio's calls within it (a sleep, a checkpoint) included. A window's run-loop CPU is its CPU
time times the share of its samples taken in the loop: an estimate, good to a few per cent over a thousand samples.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

__all__ = ["LoopShare"]

#: CPU seconds between samples asked of the kernel (it delivers them at its tick, 4 ms at HZ=250).
INTERVAL = 0.005
_OWN = ("/trio/", "/outcome/")


def in_run_loop(frame: FrameType | None) -> bool | None:
    """Whether `frame` runs in trio's run loop outside any task (True), in a task (False), or outside trio (None)."""
    own = True
    while frame is not None:
        code = frame.f_code
        if code.co_name == "unrolled_run" and "/trio/" in code.co_filename:
            return own
        if own and not (any(part in code.co_filename for part in _OWN) or code.co_filename.startswith("<attrs")):
            own = False
        frame = frame.f_back
    return None


class LoopShare:
    """Counts CPU samples of this process, and those taken in trio's run loop, while started (main thread only)."""

    def __init__(self) -> None:
        self.samples = 0  # samples taken inside trio.run
        self.loop = 0  # of them, in the run loop outside any task
        self._previous: object = None
        self._running = False

    def start(self) -> bool:
        """Start sampling; False (and nothing started) where the platform or the thread cannot."""
        if self._running or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
            return False
        self._previous = signal.signal(signal.SIGPROF, self._sample)
        signal.siginterrupt(signal.SIGPROF, False)  # restart the system calls (LMDB's among them) it interrupts
        signal.setitimer(signal.ITIMER_PROF, INTERVAL, INTERVAL)
        self._running = True
        return True

    def stop(self) -> None:
        if not self._running:
            return
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, self._previous if self._previous is not None else signal.SIG_DFL)  # type: ignore[arg-type]
        self._running = False

    def snapshot(self) -> tuple[int, int]:
        """(samples in the run loop, samples inside trio.run) so far."""
        return self.loop, self.samples

    def _sample(self, _signum: int, frame: FrameType | None) -> None:
        where = in_run_loop(frame)
        if where is None:
            return
        self.samples += 1
        self.loop += where
