"""A CPU-time sampler for benchmark processes, loaded by Python at start-up when this directory is on PYTHONPATH
(``bench_scaling --cpu-profile``) and ``BENCH_CPU_PROFILE`` names the output file.

Why not py-spy alone: py-spy samples a thread whenever it is runnable, so a process preempted by its neighbours
(two nodes and a web server on two cores) is charged for time it did not run, and two runs under different
contention cannot be compared function by function. This sampler fires on the process's own CPU time
(``ITIMER_PROF``: user and system), so each sample is the same slice of CPU whatever the machine does. It
samples the main thread (the node's trio loop; with ``--page-threads 0`` it does all the work); time in a C call
(an LMDB commit, a socket send, the kernel's work for it) is charged to the Python line that made the call.

Output: collapsed stacks, one line per distinct stack, ``frame;frame;... count``, frames as ``function
(file:line)`` (py-spy's raw format), written when the process exits.
"""

from __future__ import annotations

import atexit
import collections
import os
import signal

_PATH = os.environ.get("BENCH_CPU_PROFILE")
_INTERVAL = float(os.environ.get("BENCH_CPU_PROFILE_INTERVAL", "0.002"))


def _install(path: str) -> None:
    counts: collections.Counter[tuple[tuple[str, str, int], ...]] = collections.Counter()

    def sample(_signum, frame) -> None:
        stack = []
        depth = 0
        while frame is not None and depth < 200:
            code = frame.f_code
            stack.append((code.co_qualname, code.co_filename, frame.f_lineno or 0))
            frame = frame.f_back
            depth += 1
        counts[tuple(stack)] += 1

    def dump() -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        with open(f"{path}.{os.getpid()}", "w", encoding="utf-8") as out:
            for stack, n in counts.items():
                frames = ";".join(f"{name} ({file.split('site-packages/')[-1]}:{line})"
                                  for name, file, line in reversed(stack))
                out.write(f"{frames} {n}\n")

    signal.signal(signal.SIGPROF, sample)
    signal.siginterrupt(signal.SIGPROF, False)  # restart system calls (LMDB's among them) the timer interrupts
    signal.setitimer(signal.ITIMER_PROF, _INTERVAL, _INTERVAL)
    atexit.register(dump)


if _PATH:
    _install(_PATH)
