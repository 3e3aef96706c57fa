"""One LMDB environment: opening, write transactions that grow the map when full, error translation.

LMDB is a copy-on-write B+tree in one memory-mapped file. A commit either lands whole or not at all, so a
process killed at any moment leaves the last committed state. We open it without fsync on commit
(`sync=False`): a committed transaction is in the OS page cache and survives kill -9 of the process; `sync()`
forces it to the disk (the engine calls it before acknowledging anything to a peer, and on a timer). We never
use `writemap`: with it a full disk would be a SIGBUS instead of an error we can report.

A damaged data file must give a message, never a signal. LMDB maps the file and trusts it: a file cut short
(a copy that stopped, a full disk during a restore) makes the first read past its end a SIGBUS, and a wrong
meta page an abort. So before mapping, `check_data_file` reads the two meta pages with ordinary reads and
checks the magic, the version, the page size and that the file holds every page the newest meta page names;
after mapping, LMDB's own corruption errors (a damaged page inside the file) become a `StorageError` that names
the file and says what to do.

Every page LMDB reads stays mapped in the process, and counts in its resident memory (RSS), until the map is
closed: a node that crawls through a store of ten million URLs would touch, and so hold, most of it.
`release_resident` hands the mapped pages back with `madvise(MADV_DONTNEED)`; the map is read-only and shared
(no `writemap`), so the pages stay in the kernel's page cache and the next read maps them again (a minor fault,
no disk read while the cache holds them). The node calls it when its file-backed memory passes a bound.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import lmdb

from ._errors import StorageError

__all__ = ["DEFAULT_MAP_SIZE", "MAX_MAP_SIZE", "Cursor", "Db", "LmdbEnv", "Txn", "check_data_file", "put_keys"]

T = TypeVar("T")

if TYPE_CHECKING:
    #: A transaction as the stores open them (never `buffers=True`): what it reads is bytes.
    Txn: TypeAlias = lmdb.Transaction[bytes]
    #: The handle of one named database of the environment.
    Db: TypeAlias = lmdb._Database
    #: A cursor of such a transaction.
    Cursor: TypeAlias = lmdb.Cursor[bytes]

DEFAULT_MAP_SIZE = 1 << 30  # the file grows only as pages are used; the map doubles when it fills
MAX_MAP_SIZE = 1 << 40  # 1 TiB: past this a full map is reported, not grown
_MAX_DBS = 24
_LOW_SPACE = 64 << 20  # below this much free space a failed write is reported as a full disk
_MADV_DONTNEED = 4  # <sys/mman.h> on Linux


def _madvise() -> Callable[..., int] | None:
    """libc's madvise(addr, length, advice), or None where there is none to call (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def mapped_ranges(path: str, maps: str = "/proc/self/maps") -> list[tuple[int, int]]:
    """The (start, end) address ranges this process maps from the file `path`, from /proc's maps."""
    target = os.path.realpath(path)
    out = []
    try:
        with open(maps, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") == target:
                    start, _, end = fields[0].partition("-")
                    out.append((int(start, 16), int(end, 16)))
    except OSError:
        return []
    return out


# LMDB's meta page (lmdb.h / mdb.c, 64-bit builds): a 16-byte page header, then MDB_meta: magic u32, version u32,
# address u64, map size u64, two MDB_db of 48 bytes (the free-list db's first u32 holds the page size), the last
# page number u64 and the transaction id u64. Little-endian on every platform this runs on.
_META = struct.Struct("<QHHHH II QQ I4x40x I44x QQ")
_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_CORRUPT_ERRORS = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.VersionMismatchError)


def put_keys(txn: Txn, db: Db, keys: Iterable[bytes]) -> int:
    """Store `keys` in `db` with empty values, keeping those already there, in one `putmulti` (sorted keys share
    leaf pages); return how many were new."""
    _consumed, added = txn.cursor(db).putmulti([(key, b"") for key in keys], dupdata=False, overwrite=False)
    return int(added)


def _what_to_do(data: str) -> str:
    return (
        f"stop the node, move {os.path.dirname(data)} aside (keep it to inspect) and start again with an empty data "
        "directory or one restored from a backup"
    )


def check_data_file(where: str) -> None:
    """Raise StorageError if `where/data.mdb` exists but cannot be a whole LMDB file (before LMDB maps it)."""
    data = os.path.join(where, "data.mdb")
    try:
        with open(data, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == 0:
                return  # created and never written: LMDB initializes it
            head = file.read(64 * 1024)
            metas = []
            offset = 0
            for _ in range(2):
                if len(head) < offset + _META.size:
                    break
                fields = _META.unpack_from(head, offset)
                magic, version, psize, last_pg, txnid = fields[5], fields[6], fields[9], fields[11], fields[12]
                if magic != _MAGIC:
                    break
                if version != _DATA_VERSION:
                    raise StorageError(
                        f"store file {data} has LMDB data version {version}, this build reads {_DATA_VERSION}; "
                        "open it with the peercrawl version that wrote it"
                    )
                if psize < 512 or psize > 65536 or psize & (psize - 1):
                    break
                metas.append((txnid, last_pg, psize))
                offset = psize
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StorageError(f"cannot read store file {data}: {_reason(exc)}") from exc
    if not metas:
        raise StorageError(
            f"store file {data} is not an LMDB file or its first page is damaged ({size} bytes); {_what_to_do(data)}"
        )
    psize = metas[0][2]
    if size < 2 * psize:
        raise StorageError(
            f"store file {data} is truncated: {size} bytes, less than its two {psize}-byte meta pages; "
            f"{_what_to_do(data)}"
        )
    if len(metas) < 2:
        raise StorageError(f"store file {data} has a damaged second meta page; {_what_to_do(data)}")
    txnid, last_pg, psize = max(metas)
    needed = (last_pg + 1) * psize
    if size < needed:
        raise StorageError(
            f"store file {data} is truncated: {size} bytes, but its last transaction ({txnid}) uses {needed}; "
            f"{_what_to_do(data)}"
        )


def _fault(action: str, path: str, exc: BaseException) -> StorageError:
    """A StorageError for a failed LMDB call: a corrupt file says so and what to do, anything else its reason."""
    if isinstance(exc, _CORRUPT_ERRORS):
        data = os.path.join(path, "data.mdb")
        return StorageError(f"store file {data} is corrupt ({_reason(exc)}); {_what_to_do(data)}")
    return StorageError(f"cannot {action} store at {path}: {_reason(exc)}")


def _reason(exc: BaseException) -> str:
    """The readable tail of an lmdb or OS error, without its path (we add our own)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    # lmdb messages look like "/path/to/dir: No space left on device" or "mdb_put: MDB_MAP_FULL: ..."
    return text.rsplit(": ", 1)[-1] if ": " in text else text


class LmdbEnv:
    """An open LMDB environment with named databases. Not thread-safe: use it from one thread at a time."""

    def __init__(self, env: lmdb.Environment, path: str, dbs: dict[bytes, Db], max_map_size: int) -> None:
        self._env = env
        self.path = path
        self._dbs = dbs
        self._max_map_size = max_map_size
        self._closed = False

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        names: Sequence[bytes],
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = MAX_MAP_SIZE,
    ) -> LmdbEnv:
        """Open (creating if needed) the environment in directory `path` with the named databases."""
        where = os.fspath(path)
        if map_size <= 0 or max_map_size < map_size:
            raise ValueError(f"need 0 < map_size <= max_map_size, got {map_size} and {max_map_size}")
        try:
            os.makedirs(where, exist_ok=True)
            if not os.access(where, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), where)
            check_data_file(where)
            env = lmdb.open(
                where,
                map_size=map_size,
                max_dbs=_MAX_DBS,
                sync=False,
                metasync=False,
                readahead=False,
                writemap=False,
                meminit=False,
                lock=True,
            )
        except (OSError, lmdb.Error) as exc:
            raise _fault("open", where, exc) from exc
        try:
            dbs = {name: env.open_db(name) for name in names}
        except lmdb.Error as exc:
            env.close()
            raise _fault("open", where, exc) from exc
        return cls(env, where, dbs, max_map_size)

    def db(self, name: bytes) -> Db:
        return self._dbs[name]

    @property
    def map_size(self) -> int:
        return int(self._env.info()["map_size"])

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"store at {self.path} is closed")

    def _grow(self) -> None:
        current = self.map_size
        if current >= self._max_map_size:
            raise StorageError(
                f"store at {self.path} is full at its maximum map size of {current} bytes"
            )
        self._env.set_mapsize(min(current * 2, self._max_map_size))

    def write(self, fn: Callable[[Txn], T]) -> T:
        """Run `fn` in one write transaction and commit it; return what `fn` returned.

        If the map is full the transaction is aborted, the map doubled and `fn` run again from the start, so
        `fn` must keep its state in the transaction only. Disk faults become `StorageError`; the store stays
        at its last committed state.
        """
        self._check_open()
        while True:
            try:
                txn = self._env.begin(write=True)
            except lmdb.Error as exc:
                raise _fault("write", self.path, exc) from exc
            try:
                result = fn(txn)
                txn.commit()
                return result
            except lmdb.MapFullError:
                txn.abort()
                self._grow()
            except lmdb.BadValsizeError as exc:
                txn.abort()
                raise ValueError(f"key or value size not accepted by the store: {_reason(exc)}") from exc
            except _CORRUPT_ERRORS as exc:
                txn.abort()
                raise _fault("write", self.path, exc) from exc
            except lmdb.Error as exc:
                txn.abort()
                raise StorageError(f"cannot write store at {self.path}: {self._write_failure(exc)}") from exc
            except BaseException:
                txn.abort()
                raise

    def _write_failure(self, exc: lmdb.Error) -> str:
        """The reason a commit failed; LMDB reports a short write as EIO, so look at the free space too."""
        reason = _reason(exc)
        try:
            free = os.statvfs(self.path)
        except OSError:
            return reason
        if free.f_bavail * free.f_frsize < _LOW_SPACE:
            return f"{reason} (the disk is full: {free.f_bavail * free.f_frsize} bytes free)"
        return reason

    @contextmanager
    def read(self) -> Iterator[Txn]:
        """A read-only transaction (a consistent snapshot); keep it short."""
        self._check_open()
        try:
            txn = self._env.begin(write=False)
        except lmdb.Error as exc:
            raise _fault("read", self.path, exc) from exc
        try:
            yield txn
        except lmdb.Error as exc:
            raise _fault("read", self.path, exc) from exc
        finally:
            txn.abort()

    def scan(
        self, name: bytes, ranges: Sequence[tuple[bytes, bytes]], *, chunk: int = 4096
    ) -> Iterator[tuple[bytes, bytes]]:
        """Yield (key, value) of database `name` whose 8-byte position prefix lies in one of `ranges`.

        Reads `chunk` items per short read transaction, so a long scan neither pins old pages nor sees a
        torn state within a chunk; writes made between chunks may or may not be seen.
        """
        db = self._dbs[name]
        for first, last in ranges:
            at = first
            while True:
                batch: list[tuple[bytes, bytes]] = []
                ended = False
                with self.read() as txn:
                    cur = txn.cursor(db)
                    if not cur.set_range(at):
                        break
                    for key, value in cur:
                        if key[:8] > last:
                            ended = True
                            break
                        batch.append((key, value))
                        if len(batch) >= chunk:
                            break
                yield from batch
                if ended or len(batch) < chunk:
                    break
                at = batch[-1][0] + b"\x00"  # the smallest key after the last one seen

    def scan_each(self, name: bytes, ranges: Sequence[tuple[bytes, bytes]]) -> list[list[tuple[bytes, bytes]]]:
        """(key, value) of database `name` in each of `ranges` (as `scan`), one list per range, read in ONE read
        transaction: a seek per range and no transaction per range, for the many small arcs of a view change.
        The caller bounds the ranges it asks for at once (a hand-off asks for a few dozen arcs at a time)."""
        db = self._dbs[name]
        found: list[list[tuple[bytes, bytes]]] = []
        with self.read() as txn:
            cur = txn.cursor(db)
            for first, last in ranges:
                items: list[tuple[bytes, bytes]] = []
                if cur.set_range(first):
                    for key, value in cur:
                        if key[:8] > last:
                            break
                        items.append((key, value))
                found.append(items)
        return found

    def key_prefixes(self, name: bytes) -> bytes:
        """The 8-byte position prefix of every key of database `name`, concatenated in key order (for a caller
        that locates keys on the ring with numpy), read in one transaction."""
        db = self._dbs[name]
        with self.read() as txn:
            return b"".join(key[:8] for key in txn.cursor(db).iternext(keys=True, values=False))

    def delete_ranges(self, name: bytes, ranges: Sequence[tuple[bytes, bytes]], *, chunk: int = 50_000) -> int:
        """Delete every key of database `name` in `ranges`, `chunk` keys per transaction; return the count."""
        db = self._dbs[name]
        total = 0
        for first, last in ranges:

            def delete_some(txn: Txn, first: bytes = first, last: bytes = last) -> int:
                cur = txn.cursor(db)
                if not cur.set_range(first):
                    return 0
                n = 0
                while n < chunk:
                    key = cur.key()
                    if not key or key[:8] > last:
                        break
                    cur.delete()
                    n += 1
                return n

            while True:
                n = self.write(delete_some)
                total += n
                if n < chunk:
                    break
        return total

    def last_txnid(self) -> int:
        """The id of the last committed write transaction: it changes with every commit."""
        self._check_open()
        return int(self._env.info()["last_txnid"])

    def entries(self, name: bytes) -> int:
        with self.read() as txn:
            return int(txn.stat(self._dbs[name])["entries"])

    def db_bytes(self, names: Iterable[bytes]) -> int:
        """Bytes of the pages the named databases hold (branch, leaf and overflow pages times the page size): their
        share of the data file, not counting pages free for reuse."""
        with self.read() as txn:
            total = 0
            for name in names:
                st = txn.stat(self._dbs[name])
                total += (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
            return int(total)

    def sync(self) -> None:
        """Force everything committed so far to the disk."""
        self._check_open()
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise StorageError(f"cannot sync store at {self.path}: {_reason(exc)}") from exc

    def disk_bytes(self) -> int:
        """Bytes the data file occupies on disk (allocated blocks, not the map size)."""
        return os.stat(os.path.join(self.path, "data.mdb")).st_blocks * 512

    def release_resident(self) -> int:
        """Hand the data file's mapped pages back to the kernel (see the module's docstring); returns the bytes
        of address space released, 0 where the platform gives no way to (then nothing changes)."""
        self._check_open()
        if _MADVISE is None:
            return 0
        released = 0
        for start, end in mapped_ranges(os.path.join(self.path, "data.mdb")):
            if _MADVISE(start, end - start, _MADV_DONTNEED) == 0:
                released += end - start
        return released

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()

    @property
    def closed(self) -> bool:
        return self._closed
