"""Low disk as a state of the node, not a crash.

The data directory's filesystem is read once a second (`os.statvfs`: free blocks an unprivileged writer may
use). Below `low` bytes free the node is *disk-held*: it starts no new host turn (the crawler's hold "disk",
the same mechanism as the upload queue's hold "upload": two reasons, each shown by name in /status), admits no
new URL from outside (a peer's batch is left unacknowledged, so its sender keeps it and sends it again; a seed
request is answered 507), and finishes what it holds: the pages under way are stored with their links, in
their one commit each. At `resume` bytes free (above `low`, so that the pages just finished do not flip the
state at once) it resumes by itself.

`low` leaves room for what a held node still writes: the pages under way with their links and WARC records,
and LMDB's copy-on-write pages, so the node stops fetching before the disk is full and a store's write never
fails for want of space.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

__all__ = ["CHECK_INTERVAL", "DiskGuard", "DiskMarks", "statvfs_free"]

log = logging.getLogger(__name__)

#: Seconds between readings of the free space (one statvfs call: a few microseconds).
CHECK_INTERVAL = 1.0


def statvfs_free(path: str | os.PathLike[str]) -> Callable[[], int]:
    """A reader of the bytes free to an unprivileged writer on the filesystem that holds `path`."""
    where = Path(path)

    def free() -> int:
        st = os.statvfs(where)
        return st.f_bavail * st.f_frsize

    return free


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskMarks:
    """Below `low` bytes free the node holds; at `resume` or more it goes on (`resume` > `low`)."""

    low: int
    resume: int

    @classmethod
    def from_mib(cls, min_free_mib: int) -> DiskMarks:
        """`min_free_mib` as the low mark, and a quarter more (at least 1 MiB) to resume."""
        low = min_free_mib << 20
        return cls(low=low, resume=low + max(1 << 20, low // 4))

    def __post_init__(self) -> None:
        if self.low < 0 or self.resume <= self.low:
            raise ValueError(f"need 0 <= low < resume, got low={self.low} resume={self.resume}")


class DiskGuard:
    """The node's low-disk state: `check()` reads the free space and turns the state on or off; `hold(on)` is
    told each change (the crawler's hold "disk")."""

    def __init__(self, free_bytes: Callable[[], int], marks: DiskMarks, *, hold: Callable[[bool], None]) -> None:
        self._free_bytes = free_bytes
        self.marks = marks
        self._hold = hold
        self.low = False
        self.free = -1  # bytes free at the last reading (-1: not read yet, or the reading failed)
        self.holds = 0  # times the node went into the low-disk state
        self.read_errors = 0

    def admitting(self) -> bool:
        """Whether new URLs from outside (peers' batches, seeds) are taken now."""
        return not self.low

    def check(self) -> bool:
        """Read the free space and change state if it crossed a mark; return whether the node is disk-held. A
        failed reading changes nothing (logged once per failure run)."""
        try:
            free = int(self._free_bytes())
        except OSError as exc:
            if not self.read_errors:
                log.warning("cannot read the data directory's free space", extra={"error": str(exc)})
            self.read_errors += 1
            return self.low
        self.read_errors = 0
        self.free = free
        if not self.low and free < self.marks.low:
            self.low = True
            self.holds += 1
            self._hold(True)
            log.warning("disk low: fetching held and no new URL admitted until space returns",
                        extra={"free_bytes": free, "low_bytes": self.marks.low, "resume_bytes": self.marks.resume})
        elif self.low and free >= self.marks.resume:
            self.low = False
            self._hold(False)
            log.info("disk space back: fetching and admitting again",
                     extra={"free_bytes": free, "resume_bytes": self.marks.resume})
        return self.low

    def status(self) -> dict[str, Any]:
        return {"low": self.low, "free_bytes": self.free, "low_bytes": self.marks.low,
                "resume_bytes": self.marks.resume, "holds": self.holds}

    async def serve(self, interval: float = CHECK_INTERVAL, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Check now (a node started on a full disk holds before its first fetch), then every `interval` s."""
        self.check()
        task_status.started()
        while True:
            await trio.sleep(interval)
            self.check()
