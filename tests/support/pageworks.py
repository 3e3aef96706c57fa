"""Work functions for the page worker pool's tests, importable by a spawned worker process.

Each does the real page work (`process_page`) except for pages whose URL names a failure: such a page stands
for one that kills its worker (lxml or zlib crashing, the OOM killer) or hangs it, as a test web stands for a
hostile server. The pool under test is the real one, with real processes.
"""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

from peer.crawl.pageworkers import PageJob, PageResult, process_page


def crashing(job: PageJob) -> PageResult:
    """`/poison` kills every worker it reaches; `/crash-once-<name>` kills the first only (a marker file in
    the directory named by the URL's query remembers it); `/slow` takes 0.2 s."""
    if "/poison" in job.url:
        os._exit(9)
    if "/crash-once" in job.url:
        path, _, where = job.url.partition("?")
        marker = Path(where) / path.rsplit("/", 1)[1]
        if not marker.exists():
            marker.write_text("crashed\n")
            os._exit(9)
    if "/slow" in job.url:
        time.sleep(0.2)
    return process_page(job)


def hanging(job: PageJob) -> PageResult:
    """`/hang` never returns (a parser in an endless loop)."""
    if "/hang" in job.url:
        while True:
            time.sleep(1)
    return process_page(job)


def collector(job: PageJob) -> tuple[int, int]:
    """The worker's collector settings: (young generation threshold, objects frozen)."""
    return gc.get_threshold()[0], gc.get_freeze_count()
