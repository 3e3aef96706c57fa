"""A full read of an LMDB store, run in a child process, and the data directory's record of a run under way.

LMDB trusts its file: most damage inside the tree is reported (`MDB_CORRUPTED`, `MDB_PAGE_NOTFOUND`), but some
damage to a branch page trips one of its assertions and the process aborts (SIGABRT) with no error to catch. A
node whose store was damaged there would abort at every start. So:

- `check_store(path)` reads all of one store in this process: the main database (the names of the others),
  then every named database with a cursor from its first key to its last, every key and value read, the keys
  required in order and their count equal to the count in the database's header; a search from the root for
  every key it walked (the path a `get` takes, which a cursor walk does not); on a store that is not sound it
  raises the `StorageError` that opening or reading it would. What it maps is handed back to the kernel whenever
  its file-backed memory passes 64 MiB (`madvise`), so its memory stays bounded on a store of any size.
- `check_store_in_child(path, timeout=...)` runs that in a child process: a child killed by a signal (the abort)
  or reporting an lmdb error becomes that same `StorageError` ("store file D/data.mdb is corrupt (...); stop the
  node, move D aside ..."), naming LMDB's own last words; a child still reading at `timeout` is killed and the
  error says how far it got.
- `RUNNING` (a file in the data directory) says a process is using the stores: `mark_running` writes it (synced)
  before they open, `mark_stopped` removes it after they close. Found at a start, it means the last run did not
  stop cleanly (a crash, kill -9, power loss, an abort), and `check_data_dir` checks every store under the
  directory first. A store found damaged is remembered in the marker with the data file's identity (inode,
  size, ctime), so a supervisor restarting the node does not read the whole store again each time: the next
  start fails at once with the same message, until the file is moved aside or replaced.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lmdb

from ._errors import StorageError
from ._lmdb import _MADV_DONTNEED, _MADVISE, _MAX_DBS, _fault, _what_to_do, check_data_file, mapped_ranges

if TYPE_CHECKING:
    from ._lmdb import Txn

__all__ = [
    "RUNNING",
    "StoreCheck",
    "StoreCheckError",
    "check_data_dir",
    "check_store",
    "check_store_in_child",
    "mark_running",
    "mark_stopped",
    "running_marker",
    "stores_in",
]

#: The marker file in a data directory while a process uses its stores.
RUNNING = "RUNNING"
#: The child reports its progress every this many keys.
_PROGRESS_EVERY = 1 << 16
#: ... and looks at its file-backed memory every this many keys (a read of /proc/self/statm, a few µs): past
#: _MAPPED_BOUND it hands the store's mapped pages back to the kernel. A page cache with large folios maps a whole
#: folio on a fault, so a count of keys alone says little about what is mapped (2^16 keys of a node store mapped
#: about 100 MiB).
_LOOK_EVERY = 1 << 12
_MAPPED_BOUND = 64 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: At most this much of the child's stderr is kept (LMDB's assertion is its last line).
_STDERR_TAIL = 4096
_CHILD_FAILED = 3  # the child's exit status when it found damage and said so on stdout
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class StoreCheckError(StorageError):
    """The check itself could not finish (out of time, or its child failed for another reason than damage):
    the store may well be sound."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreCheck:
    """What a check read from one store."""

    path: str
    databases: int  # named databases (the main one not counted)
    keys: int  # keys walked (each also searched for from the root), the main database's included
    bytes: int  # key and value bytes read
    file_bytes: int  # size of data.mdb
    seconds: float
    peak_rss: int = 0  # the checking process's peak resident memory in bytes (0 where /proc does not say)


def check_store(path: str | os.PathLike[str]) -> StoreCheck:
    """Read the whole LMDB store in directory `path` in this process (see the module's docstring); raise
    `StorageError` naming the file and what to do if it is not sound. A directory without `data.mdb` is sound
    and empty. Use it in a child process: on some damage LMDB aborts the process (`check_store_in_child`)."""
    where = os.fspath(path)
    data = os.path.join(where, "data.mdb")
    started = time.monotonic()
    if not os.path.exists(data):
        return StoreCheck(path=where, databases=0, keys=0, bytes=0, file_bytes=0, seconds=0.0)
    check_data_file(where)
    try:
        env = lmdb.open(where, readonly=True, lock=True, max_dbs=_MAX_DBS, readahead=False, subdir=True,
                        create=False)
    except lmdb.Error as exc:
        raise _fault("check", where, exc) from exc
    keys = size = 0
    try:
        with env.begin() as txn:
            names = [key for key, _value in txn.cursor()]
            keys += len(names)
            for name in names:
                try:
                    db = env.open_db(name, txn=txn, create=False)
                except lmdb.IncompatibleError:
                    continue  # a plain key of the main database, not a named one: read above
                flags = db.flags(txn)  # type: ignore[call-arg]  # lmdb's stub lacks its txn argument
                count, read = _walk(txn, db, dups=bool(flags.get("dupsort")), data=data, name=name,
                                    progress=keys, ordered=not (flags.get("reverse_key") or flags.get("integerkey")))
                keys += count
                size += read
                entries = int(txn.stat(db)["entries"])
                if count != entries:
                    raise StorageError(
                        f"store file {data} is corrupt (database {name.decode(errors='replace')}: {count} keys "
                        f"read, its header counts {entries}); {_what_to_do(data)}"
                    )
    except lmdb.Error as exc:
        raise _fault("check", where, exc) from exc
    finally:
        env.close()
    return StoreCheck(path=where, databases=len(names), keys=keys, bytes=size, file_bytes=os.path.getsize(data),
                      seconds=round(time.monotonic() - started, 3), peak_rss=_peak_rss())


def _peak_rss() -> int:
    """VmHWM of this process, in bytes (0 where there is no /proc)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def _walk(txn: Txn, db: Any, *, dups: bool, data: str, name: bytes, progress: int,
          ordered: bool = True) -> tuple[int, int]:
    """Walk `db` first to last: (keys, bytes read). Every key is also searched for from the root, and must
    come after the one before it (in byte order: `ordered`, a database without LMDB's other key orders)."""
    walk, search = txn.cursor(db), txn.cursor(db)
    count = size = 0
    previous: bytes | None = None
    for key, value in walk.iternext(keys=True, values=True):
        if ordered and previous is not None and (key < previous or (key == previous and not dups)):
            raise StorageError(f"store file {data} is corrupt (database {name.decode(errors='replace')}: keys out "
                               f"of order after {count} keys); {_what_to_do(data)}")
        found = search.set_key_dup(key, value) if dups else search.set_key(key)
        if not found or (not dups and search.value() != value):
            raise StorageError(f"store file {data} is corrupt (database {name.decode(errors='replace')}: a key "
                               f"the walk read is not found from the root); {_what_to_do(data)}")
        previous = key
        count += 1
        size += len(key) + len(value)
        if (progress + count) % _LOOK_EVERY == 0:
            if _mapped() > _MAPPED_BOUND:
                _release(data)
            if (progress + count) % _PROGRESS_EVERY == 0:
                print(f"progress {progress + count}", flush=True)
    return count, size


def _mapped() -> int:
    """File-backed (and shared) resident bytes of this process, from /proc/self/statm (0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[2]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _release(data: str) -> None:
    """Hand the pages of `data` this process maps back to the kernel (they stay in the page cache)."""
    if _MADVISE is None:
        return
    for start, end in mapped_ranges(data):
        _MADVISE(start, end - start, _MADV_DONTNEED)


def check_store_in_child(path: str | os.PathLike[str], *, timeout: float, bound: float | None = None) -> StoreCheck:
    """`check_store(path)` in a child process, at most `timeout` seconds. Raises `StorageError` when the store
    is damaged (the child found it, or was killed by a signal reading it), `StoreCheckError` when the check did
    not finish (the message names `bound`, the caller's whole time limit, if given, else `timeout`)."""
    where = os.fspath(path)
    data = os.path.join(where, "data.mdb")
    root = str(Path(__file__).resolve().parents[1])  # where the `storage` package is, for the child to import
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    command = [sys.executable, "-m", "storage._check", where]
    try:
        done = subprocess.run(command, capture_output=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise StoreCheckError(
            f"the check of store file {data} did not finish within {bound or timeout:g} s ({_progress(exc.stdout):,} "
            "keys read); give it more time (store_check_timeout) or run `peerd check` with --store-check-timeout"
        ) from exc
    out = done.stdout.decode(errors="replace").splitlines()
    last = out[-1] if out else ""
    if done.returncode == 0 and last.startswith("{"):
        return StoreCheck(**json.loads(last))
    if done.returncode == _CHILD_FAILED and last.startswith("{"):
        raise StorageError(json.loads(last)["error"])
    said = _last_words(done.stderr)
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        read = _progress(done.stdout)
        raise StorageError(
            f"store file {data} is corrupt (LMDB stopped the process reading it with {name}"
            f"{': ' + said if said else ''}{f', after {read} keys' if read else ''}); {_what_to_do(data)}"
        )
    raise StoreCheckError(f"the check of store file {data} failed (exit status {done.returncode}"
                       f"{': ' + said if said else ''})")


def _progress(stdout: bytes | None) -> int:
    lines = [line for line in (stdout or b"").decode(errors="replace").splitlines() if line.startswith("progress ")]
    return int(lines[-1].split()[1]) if lines else 0


def _last_words(stderr: bytes) -> str:
    """The last non-empty line of a child's stderr (LMDB's assertion message), without LMDB's build path."""
    lines = [line.strip() for line in stderr[-_STDERR_TAIL:].decode(errors="replace").splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[-1]
    head, sep, tail = text.partition(": ")
    return tail if sep and "/" in head and "mdb.c" in head else text  # "/build/.../mdb.c:6273: Assertion ..."


# --------------------------------------------------------------------------- the data directory


def stores_in(data_dir: str | os.PathLike[str]) -> list[Path]:
    """The LMDB store directories directly under `data_dir` (each holding a `data.mdb`), sorted."""
    try:
        return sorted(p.parent for p in Path(data_dir).glob("*/data.mdb"))
    except OSError:
        return []


def running_marker(data_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What `RUNNING` in `data_dir` says ({} when it cannot be read), or None when it is not there."""
    try:
        text = (Path(data_dir) / RUNNING).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot read {Path(data_dir) / RUNNING}: {exc.strerror or exc}") from exc
    try:
        said = json.loads(text)
    except ValueError:
        return {}  # torn by a power cut while it was written: still a run that did not stop cleanly
    return said if isinstance(said, dict) else {}


def mark_running(data_dir: str | os.PathLike[str], *, damaged: dict[str, Any] | None = None) -> None:
    """Write `RUNNING` in `data_dir` (this process, now) and force it and its directory entry to disk."""
    path = Path(data_dir) / RUNNING
    record: dict[str, Any] = {"pid": os.getpid(), "started": round(time.time(), 3)}
    if damaged is not None:
        record["damaged"] = damaged
    try:
        temp = path.with_name(RUNNING + ".tmp")
        with open(temp, "w", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
        _sync_dir(path.parent)
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc


def mark_stopped(data_dir: str | os.PathLike[str]) -> None:
    """Remove `RUNNING` from `data_dir` (the stores were closed cleanly)."""
    path = Path(data_dir) / RUNNING
    try:
        path.unlink(missing_ok=True)
        _sync_dir(path.parent)
    except OSError as exc:
        raise StorageError(f"cannot remove {path}: {exc.strerror or exc}") from exc


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _identity(data: Path) -> list[int] | None:
    try:
        st = data.stat()
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns]  # ctime: any write, chmod or rename moves it


def check_data_dir(data_dir: str | os.PathLike[str], *, timeout: float, remembered: bool = True) -> list[StoreCheck]:
    """Check every store under `data_dir` (`stores_in`), one at a time in a child process, within `timeout`
    seconds in all. On damage, remember it in `RUNNING` and raise its `StorageError`; with `remembered`, a store
    already found damaged whose data file has not changed since fails at once with the same message."""
    marker = running_marker(data_dir) or {}
    damaged = marker.get("damaged")
    if remembered and isinstance(damaged, dict):
        file = Path(str(damaged.get("file", "")))
        if damaged.get("identity") is not None and _identity(file) == damaged.get("identity"):
            raise StorageError(str(damaged.get("error")))
    deadline = time.monotonic() + timeout
    results = []
    for store in stores_in(data_dir):
        try:
            results.append(check_store_in_child(store, timeout=max(0.001, deadline - time.monotonic()),
                                                bound=timeout))
        except StoreCheckError:
            raise
        except StorageError as exc:
            data = store / "data.mdb"
            mark_running(data_dir, damaged={"file": str(data), "identity": _identity(data), "error": str(exc),
                                            "at": round(time.time(), 3)})
            raise
    return results


def _die_with_parent() -> None:
    """Ask Linux to kill this child when its parent dies (a parent killed mid-check leaves no reader behind)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return


def main(argv: list[str]) -> int:
    """The child: check the store in argv[0]; the last stdout line is the result or the error, as JSON."""
    _die_with_parent()
    try:
        result = check_store(argv[0])
    except StorageError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return _CHILD_FAILED
    print(json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
