"""The one error type storage raises for faults of the disk or the data directory.

Callers (the engine, the CLI) turn a `StorageError` into one readable line and a clean stop. A caller's own
misuse (a bad key, a negative depth) is a `ValueError`/`TypeError` instead: that is a bug, not a disk fault.
"""

from __future__ import annotations

__all__ = ["StorageError"]


class StorageError(Exception):
    """The data directory or the disk failed us: unwritable, full, locked, or not a store we can read.

    The message is one line naming the path and the reason, fit to show to an operator as is.
    """
