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
import gc
import json
import os
import signal
import time

_PATH = os.environ.get("BENCH_CPU_PROFILE")
_INTERVAL = float(os.environ.get("BENCH_CPU_PROFILE_INTERVAL", "0.002"))


def _install(path: str) -> None:
    counts: collections.Counter[tuple[tuple[str, str, int], ...]] = collections.Counter()

    # With BENCH_CPU_PROFILE_WINDOW=1 the sampler counts only between SIGUSR1 and SIGUSR2, which the benchmark
    # sends at 20% and 80% of the crawl: the steady state, without start-up and the end.
    active = [os.environ.get("BENCH_CPU_PROFILE_WINDOW") != "1"]

    def window(signum, _frame) -> None:
        active[0] = signum == signal.SIGUSR1

    def sample(_signum, frame) -> None:
        if not active[0]:
            return
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

    # The cyclic collector's own time, which the sampler charges to whatever allocation set it off: per
    # generation, the collections, the CPU seconds they took and the objects they looked at, into PATH.gc.PID.
    gc_runs = [0, 0, 0]
    gc_cpu = [0.0, 0.0, 0.0]
    gc_started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if not active[0]:
            return
        if phase == "start":
            gc_started[0] = time.thread_time()
        else:
            gc_runs[info["generation"]] += 1
            gc_cpu[info["generation"]] += time.thread_time() - gc_started[0]

    def dump_gc() -> None:
        with open(f"{path}.gc.{os.getpid()}", "w", encoding="utf-8") as out:
            out.write(json.dumps({"collections": gc_runs, "cpu_s": gc_cpu, "thresholds": gc.get_threshold(),
                                  "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}) + "\n")

    gc.callbacks.append(on_gc)
    atexit.register(dump_gc)
    signal.signal(signal.SIGUSR1, window)
    signal.signal(signal.SIGUSR2, window)
    signal.signal(signal.SIGPROF, sample)
    signal.siginterrupt(signal.SIGPROF, False)  # restart system calls (LMDB's among them) the timer interrupts
    signal.setitimer(signal.ITIMER_PROF, _INTERVAL, _INTERVAL)
    atexit.register(dump)


if _PATH:
    _install(_PATH)
