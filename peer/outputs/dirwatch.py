"""Whether a directory may hold something new: the uploader and the webhook look at the WARC directory (a listing
and a transaction in the node's store) only when it changed, not once a second whatever happens.

A WARC file is closed by renaming its index (`NAME.cdxj.open` to `NAME.cdxj`), which changes the directory's
modification time; so does every file created or removed there, by the node or by its page workers. One `stat`
says whether anything happened since the last look. A change within the file system's timestamp granularity of
the last look could leave the time unchanged, so a full look is made at least every `every` seconds anyway.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["DirWatch"]

#: Seconds between looks at a directory whose modification time did not change.
FULL_LOOK = 10.0


class DirWatch:
    """`changed()`: True if `directory` changed since the last call that said so (and at the first call), or
    `every` seconds passed (`now` is a monotonic clock: `trio.current_time` in a task)."""

    def __init__(self, directory: Path, now: Callable[[], float], *, every: float = FULL_LOOK) -> None:
        self.directory = directory
        self._now = now
        self.every = every
        self._seen: int | None = None
        self._looked = 0.0

    def _mtime(self) -> int | None:
        try:
            return os.stat(self.directory).st_mtime_ns
        except FileNotFoundError:
            return None

    def changed(self) -> bool:
        mtime, now = self._mtime(), self._now()
        if self._seen is not None and mtime == self._seen and now - self._looked < self.every:
            return False
        self._seen, self._looked = mtime, now  # read before the caller's look: a change during it shows next time
        return True
