"""The durable upload queue: closed WARC files and their CDXJ indexes waiting to reach object storage.

A file enters the queue once it is closed (its WARC cut to its last whole record and its index sorted) and
leaves it only when its object was verified in the bucket. Both steps are LMDB commits in the node's store, so
a kill -9 at any moment leaves every closed file either queued or recorded as uploaded; nothing else.

Layout, one database `outputs` in the node's environment, four key ranges:

- `q/` + file name (UTF-8)  ->  msgpack [size, queued_at]: the upload queue
- `u/` + file name          ->  msgpack [object key, size, sha256 hex, etag, uploaded_at]: uploaded files
- `n/` + event id (UTF-8)   ->  JSON of a webhook's body, kept until the receiver accepted it
- `c/` + file name          ->  b"" for a closed file whose notice was made (webhook without upload)

A WARC file's notice is put in the same commit as its upload record (`done(..., notice=...)`), so an uploaded
file is always announced; without uploads, `notice_closed` records a closed file's notice once.

What is closed is read from the directory (`closed_files`): `NAME.warc.gz` with its `NAME.cdxj` and no
`NAME.cdxj.open`. `sweep` queues every closed file that is in neither table, so a file closed just before a
kill (or by a page worker process, which writes WARC files of its own) is queued at the next sweep.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import lmdb
import msgpack

from ._lmdb import LmdbEnv

if TYPE_CHECKING:
    from ._lmdb import Txn

__all__ = ["UPLOAD_DBS", "Uploaded", "Uploads", "closed_files"]

OUTPUTS_DB = b"outputs"
UPLOAD_DBS = (OUTPUTS_DB,)
_QUEUE, _DONE, _NOTICE, _NOTICED = b"q/", b"u/", b"n/", b"c/"

_WARC = ".warc.gz"
_INDEX = ".cdxj"
_OPEN = ".cdxj.open"


def _upload_order(name: str) -> tuple[str, int]:
    if name.endswith(_WARC):
        return name[: -len(_WARC)], 0
    if name.endswith(_INDEX):
        return name[: -len(_INDEX)], 1
    return name, 2


class Uploaded(NamedTuple):
    """Where a file went: its object key, size, SHA-256 (hex), the server's ETag, and when (wall clock)."""

    key: str
    size: int
    sha256: str
    etag: str
    at: float


def closed_files(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """The closed WARC files in `directory` and their indexes, WARC first, oldest name first."""
    directory = Path(directory)
    try:
        names = set(os.listdir(directory))
    except FileNotFoundError:
        return
    for name in sorted(names):
        if not name.endswith(_WARC):
            continue
        stem = name[: -len(_WARC)]
        if stem + _INDEX in names and stem + _OPEN not in names:
            yield directory / name
            yield directory / (stem + _INDEX)


class Uploads:
    """The queue (`uploads`) and the record of what was uploaded (`uploaded`), in one LMDB environment."""

    def __init__(self, env: LmdbEnv) -> None:
        self._env = env
        self._db = env.db(OUTPUTS_DB)
        #: Notices written through this object, counted in memory: a sender that saw the same count has nothing
        #: new to look for.
        self.notices_added = 0

    def _range(self, txn: Txn, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The (key without `prefix`, value) pairs of one key range, in key order."""
        cursor = txn.cursor(self._db)
        if not cursor.set_range(prefix):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            yield key[len(prefix):], value

    def sweep(self, directory: str | os.PathLike[str], now: float) -> list[str]:
        """Queue the closed files of `directory` that are neither queued nor uploaded, in one transaction;
        return their names."""
        with self._env.read() as txn:
            found = [(path.name, path) for path in closed_files(directory)
                     if txn.get(_QUEUE + path.name.encode("utf-8"), db=self._db) is None
                     and txn.get(_DONE + path.name.encode("utf-8"), db=self._db) is None]
        if not found:
            return []  # nothing new: no write transaction

        def run(txn: Txn) -> list[str]:
            added = []
            for name, path in found:
                key = name.encode("utf-8")
                if txn.get(_QUEUE + key, db=self._db) is not None or txn.get(_DONE + key, db=self._db) is not None:
                    continue
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    continue
                txn.put(_QUEUE + key, msgpack.packb([size, now]), db=self._db)
                added.append(name)
            return added

        return self._env.write(run)

    def pending(self) -> list[tuple[str, int, float]]:
        """Every queued file: (name, size, queued_at), oldest file first, a WARC file before its index."""
        with self._env.read() as txn:
            found = [(key.decode("utf-8"), *msgpack.unpackb(value)) for key, value in self._range(txn, _QUEUE)]
        return sorted(found, key=lambda entry: _upload_order(entry[0]))

    def pending_bytes(self) -> int:
        return sum(size for _name, size, _at in self.pending())

    def done(self, name: str, record: Uploaded, notice: tuple[str, bytes] | None = None) -> None:
        """Record `name` as uploaded and take it off the queue, with its webhook `notice` (event id, body) if
        any, in one transaction, forced to disk: the caller removes the local file next."""
        key = name.encode("utf-8")

        def run(txn: Txn) -> None:
            txn.delete(_QUEUE + key, db=self._db)
            txn.put(_DONE + key, msgpack.packb(list(record)), db=self._db)
            if notice is not None:
                txn.put(_NOTICE + notice[0].encode("utf-8"), notice[1], db=self._db)

        self._env.write(run)
        self._env.sync()
        if notice is not None:
            self.notices_added += 1

    def forget(self, name: str) -> None:
        """Take `name` off the queue without a record (its file is gone and its object is not there)."""
        key = name.encode("utf-8")
        self._env.write(lambda txn: txn.delete(_QUEUE + key, db=self._db))

    def uploaded(self, name: str) -> Uploaded | None:
        with self._env.read() as txn:
            value = txn.get(_DONE + name.encode("utf-8"), db=self._db)
        return None if value is None else Uploaded(*msgpack.unpackb(value))

    def uploaded_count(self) -> int:
        with self._env.read() as txn:
            return sum(1 for _ in self._range(txn, _DONE))

    # -- webhook notices

    def unnoticed(self, directory: str | os.PathLike[str]) -> list[Path]:
        """The closed WARC files of `directory` whose notice was not made yet (webhook without upload)."""
        with self._env.read() as txn:
            return [path for path in closed_files(directory) if path.name.endswith(_WARC)
                    and txn.get(_NOTICED + path.name.encode("utf-8"), db=self._db) is None]

    def notice_closed(self, name: str, event_id: str, body: bytes) -> None:
        """Record a closed file's notice, and that it was made, in one transaction."""

        def run(txn: Txn) -> None:
            txn.put(_NOTICED + name.encode("utf-8"), b"", db=self._db)
            txn.put(_NOTICE + event_id.encode("utf-8"), body, db=self._db)

        self._env.write(run)
        self.notices_added += 1

    def notices(self, limit: int = 100) -> list[tuple[str, bytes]]:
        """Notices not yet accepted by their receiver, in event id order: (event id, body)."""
        out = []
        with self._env.read() as txn:
            for key, value in self._range(txn, _NOTICE):
                out.append((key.decode("utf-8"), bytes(value)))
                if len(out) >= limit:
                    break
        return out

    def notice_sent(self, event_id: str) -> None:
        key = event_id.encode("utf-8")
        self._env.write(lambda txn: txn.delete(_NOTICE + key, db=self._db))

    def notices_waiting(self) -> int:
        with self._env.read() as txn:
            return sum(1 for _ in self._range(txn, _NOTICE))
