"""A damaged store file gives one clear StorageError naming the file and what to do: when it is opened or read,
or, where LMDB aborts on the damage, from the store check at the next start (never a signal at that start).

The damage is done to real on-disk LMDB files: cut short (LMDB would SIGBUS on the first read past the end),
random bytes over the meta pages (an abort or a cryptic error) and over pages inside the tree.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from storage import (
    DedupStore,
    FrontierStore,
    StorageError,
    check_store_in_child,
    host_position,
    mark_running,
    running_marker,
    url_key,
)

from .support.crawl import child_env

WHAT_TO_DO = "move"


def filled(path: Path, count: int = 20_000) -> Path:
    store = DedupStore.open(path)
    rng = random.Random(5)
    keys = [url_key(host_position(f"h{rng.randrange(300)}.example"), f"https://h.example/{i}") for i in range(count)]
    store.insert(keys)
    store.sync()
    store.close()
    return path / "data.mdb"


def read_all(path: Path) -> int:
    store = DedupStore.open(path)
    try:
        return sum(1 for _ in store.scan(0, 0))
    finally:
        store.close()


def test_an_intact_store_reads_back(tmp_path: Path) -> None:
    filled(tmp_path)
    assert read_all(tmp_path) == 20_000


@pytest.mark.parametrize("keep", [100, 4096, 8191, 0.5])
def test_a_truncated_file_is_refused_before_it_is_mapped(tmp_path: Path, keep: float) -> None:
    data = filled(tmp_path)
    size = data.stat().st_size
    os.truncate(data, int(size * keep) if isinstance(keep, float) else keep)
    with pytest.raises(StorageError) as info:
        read_all(tmp_path)
    message = str(info.value)
    assert str(data) in message and "truncated" in message and WHAT_TO_DO in message
    assert "\n" not in message


def test_a_truncated_file_ends_the_process_with_a_message_not_a_signal(tmp_path: Path) -> None:
    """The same, in a child process: before the check, this was SIGBUS (exit -7) with no message at all."""
    data = filled(tmp_path)
    os.truncate(data, data.stat().st_size // 3)
    script = (
        "import sys\nfrom storage import DedupStore, StorageError\n"
        "try:\n    s = DedupStore.open(sys.argv[1]); print(sum(1 for _ in s.scan(0, 0)))\n"
        "except StorageError as exc:\n    print(exc); sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 3, (done.returncode, done.stderr[-500:])
    assert "truncated" in done.stdout and str(data) in done.stdout


def test_garbage_over_the_meta_pages_is_refused(tmp_path: Path) -> None:
    data = filled(tmp_path)
    with open(data, "r+b") as file:
        file.write(random.Random(1).randbytes(8192))
    with pytest.raises(StorageError, match="not an LMDB file or its first page is damaged") as info:
        read_all(tmp_path)
    assert str(data) in str(info.value) and WHAT_TO_DO in str(info.value)
    # Only the second meta page damaged: also refused, by name.
    data = filled(tmp_path / "second")
    with open(data, "r+b") as file:
        file.seek(4096)
        file.write(bytes(4096))
    with pytest.raises(StorageError, match="damaged second meta page"):
        read_all(tmp_path / "second")


def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data.mdb").write_bytes(b"this is a text file, not a store\n" * 1000)
    with pytest.raises(StorageError, match="not an LMDB file"):
        FrontierStore.open(tmp_path)


def peerd_start(data_dir: Path) -> subprocess.CompletedProcess:
    """A real `peerd start` on `data_dir` with nothing to crawl (it exits 0 at once if it gets going)."""
    argv = [sys.executable, "-m", "peer", "start", "--node-id", "t", "--data-dir", str(data_dir), "--control",
            "127.0.0.1:0", "--exit-when-done", "--store", "none", "--log-format", "json"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=child_env())


@pytest.mark.parametrize("seed", [*range(16), 18])
def test_random_bytes_inside_the_tree_give_a_clear_error(tmp_path: Path, seed: int) -> None:
    """4 KiB of random bytes at a random place. Damage inside the file is mostly found by LMDB when it reads the
    page, and becomes a StorageError naming the file. Some damage to a branch page makes LMDB abort the process
    instead (seed 18: "Assertion 'IS_LEAF(mp)' failed in mdb_cursor_next()"): the read here runs in a child so
    that the abort is seen, and then the next start of a real peerd on that data dir, whose marker says the
    run before did not stop cleanly, must end with the message, exit status 2 and no signal, twice in a row.
    Whatever the read did, the store check finds the damage."""
    data = filled(tmp_path / "state")
    rng = random.Random(seed)
    size = data.stat().st_size
    with open(data, "r+b") as file:
        file.seek(rng.randrange(2 * 4096, size - 4096))
        file.write(rng.randbytes(4096))
    script = (
        "import sys\nfrom storage import DedupStore, StorageError\n"
        "try:\n    s = DedupStore.open(sys.argv[1]); print('read', sum(1 for _ in s.scan(0, 0)))\n"
        "except StorageError as exc:\n    print(exc); sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(data.parent)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 3 or done.returncode < 0, (done.returncode, done.stdout[-300:], done.stderr[-500:])
    if done.returncode == 3:
        assert "is corrupt" in done.stdout and str(data) in done.stdout and WHAT_TO_DO in done.stdout
    else:
        mark_running(tmp_path)  # what the aborted run left behind
        for _ in range(2):  # the second start fails at once on the remembered verdict, with the same line
            start = peerd_start(tmp_path)
            assert start.returncode == 2, (start.returncode, start.stderr[-1000:])
            last = start.stderr.strip().splitlines()[-1]
            assert last.startswith("peerd: error: store file ") and "is corrupt" in last, last
            assert str(data) in last and WHAT_TO_DO in last and "Traceback" not in start.stderr
            assert (running_marker(tmp_path) or {}).get("damaged"), "the marker stays until the store is replaced"
    with pytest.raises(StorageError, match="is corrupt") as info:
        check_store_in_child(data.parent, timeout=60)
    assert str(data) in str(info.value) and WHAT_TO_DO in str(info.value) and "\n" not in str(info.value)
