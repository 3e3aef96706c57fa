"""The store check (storage/_check.py) and `peerd check`: real on-disk LMDB, real child processes.

A sound store is read through and its figures reported; a damaged one gives the store's StorageError, also where
LMDB aborts the reader (seed 18 of the random damage in test_storage_corrupt.py); the data directory's RUNNING
marker records a run under way and a store found damaged.
"""

from __future__ import annotations

import fcntl
import os
import random
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

import storage._check as check_module
from peer.node import NodeError, _marked_running
from storage import (
    RUNNING,
    NodeStore,
    QueuedUrl,
    StorageError,
    StoreCheckError,
    check_data_dir,
    check_store,
    check_store_in_child,
    mark_running,
    mark_stopped,
    running_marker,
)

from .support.crawl import child_env
from .test_storage_corrupt import filled

ABORTS = 18  # the seed of test_storage_corrupt's random damage on which LMDB aborts the reader


def node_store(path: Path, urls: int = 3000) -> None:
    store = NodeStore.open(path)
    store.admit([QueuedUrl(url=f"https://h{i % 40}.example/{i}", host=f"h{i % 40}.example", depth=1)
                 for i in range(urls)])
    store.sync()
    store.close()


def damage(data: Path, seed: int) -> None:
    """test_storage_corrupt's damage: 4 KiB of random bytes at a random place after the meta pages."""
    rng = random.Random(seed)
    size = data.stat().st_size
    with open(data, "r+b") as file:
        file.seek(rng.randrange(2 * 4096, size - 4096))
        file.write(rng.randbytes(4096))


def entries(path: Path) -> tuple[int, int]:
    """(named databases, keys in them plus the main database's) as LMDB's headers count them."""
    env = lmdb.open(str(path), readonly=True, max_dbs=24)
    with env.begin() as txn:
        names = [key for key, _ in txn.cursor()]
        total = len(names) + sum(int(txn.stat(env.open_db(n, txn=txn, create=False))["entries"]) for n in names)
    env.close()
    return len(names), total


def peerd_check(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "peer", "check", "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=120, check=False, env=child_env())


def test_a_sound_store_is_read_through_in_this_process_and_in_a_child(tmp_path: Path) -> None:
    node_store(tmp_path / "state")
    databases, keys = entries(tmp_path / "state")
    here = check_store(tmp_path / "state")
    assert (here.databases, here.keys) == (databases, keys)
    assert keys > 2 * 3000  # seen + queue + hosts at least
    assert here.bytes > 3000 * 16 and here.file_bytes == (tmp_path / "state" / "data.mdb").stat().st_size
    child = check_store_in_child(tmp_path / "state", timeout=60)
    assert (child.databases, child.keys, child.bytes) == (here.databases, here.keys, here.bytes)
    # a directory without a store yet is sound and empty
    assert check_store(tmp_path / "empty").keys == 0


def test_an_abort_in_the_child_is_the_stores_error(tmp_path: Path) -> None:
    data = filled(tmp_path)
    damage(data, ABORTS)
    with pytest.raises(StorageError) as info:
        check_store_in_child(tmp_path, timeout=60)
    message = str(info.value)
    assert message.startswith(f"store file {data} is corrupt (LMDB stopped the process reading it with SIGABRT: ")
    assert "Assertion" in message and "move" in message and "\n" not in message
    assert not isinstance(info.value, StoreCheckError)


def test_a_check_out_of_time_says_so_and_is_not_taken_for_damage(tmp_path: Path) -> None:
    node_store(tmp_path / "state")
    with pytest.raises(StoreCheckError, match=r"did not finish within 0\.001 s \(0 keys read\)"):
        check_data_dir(tmp_path, timeout=0.001)
    assert running_marker(tmp_path) is None  # nothing remembered: the store may be sound


def test_the_marker(tmp_path: Path) -> None:
    assert running_marker(tmp_path) is None
    mark_running(tmp_path)
    said = running_marker(tmp_path)
    assert said is not None and said["pid"] == os.getpid() and "damaged" not in said
    (tmp_path / RUNNING).write_text('{"pid": 12')  # torn by a power cut: still a run that did not stop cleanly
    assert running_marker(tmp_path) == {}
    mark_stopped(tmp_path)
    assert running_marker(tmp_path) is None and not (tmp_path / RUNNING).exists()
    mark_stopped(tmp_path)  # twice is fine


def test_a_damaged_store_is_remembered_until_its_file_is_replaced(tmp_path: Path, monkeypatch) -> None:
    data = filled(tmp_path / "state")
    damage(data, 0)
    with pytest.raises(StorageError, match="is corrupt") as first:
        check_data_dir(tmp_path, timeout=60)
    remembered = (running_marker(tmp_path) or {}).get("damaged")
    assert remembered and remembered["file"] == str(data) and remembered["error"] == str(first.value)

    def no_child(*_args, **_kwargs):
        raise AssertionError("the store was read again")

    monkeypatch.setattr(check_module, "check_store_in_child", no_child)
    with pytest.raises(StorageError) as again:
        check_data_dir(tmp_path, timeout=60)
    assert str(again.value) == str(first.value)
    monkeypatch.undo()
    # moved aside, as the message says: a new store is checked (and sound)
    (tmp_path / "state").rename(tmp_path / "state.damaged")
    node_store(tmp_path / "state", urls=100)
    (tmp_path / "state.damaged" / "data.mdb").unlink()  # stores_in would find it too
    assert [c.keys > 100 for c in check_data_dir(tmp_path, timeout=60)] == [True]


@pytest.mark.slow  # a whole crawl, a child process or real nodes: seconds
def test_peerd_check_on_a_sound_store(tmp_path: Path) -> None:
    node_store(tmp_path / "state")
    mark_running(tmp_path)  # a run that did not stop cleanly
    done = peerd_check(tmp_path)
    assert done.returncode == 0, done.stderr
    _databases, keys = entries(tmp_path / "state")
    assert f"{tmp_path / 'state'}: sound: {keys:,} keys in " in done.stdout
    assert "removed" in done.stdout and running_marker(tmp_path) is None  # the next start need not check again
    again = peerd_check(tmp_path)
    assert again.returncode == 0 and "removed" not in again.stdout


@pytest.mark.slow  # a whole crawl, a child process or real nodes: seconds
@pytest.mark.parametrize("seed", [0, ABORTS])
def test_peerd_check_on_a_damaged_store(tmp_path: Path, seed: int) -> None:
    data = filled(tmp_path / "state")
    damage(data, seed)
    done = peerd_check(tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"peerd: error: store file {data} is corrupt ("), lines
    assert ("SIGABRT" in lines[0]) == (seed == ABORTS)
    assert (running_marker(tmp_path) or {}).get("damaged"), "remembered for the next start"


@pytest.mark.slow  # a whole crawl, a child process or real nodes: seconds
def test_peerd_check_refuses_a_data_dir_in_use(tmp_path: Path) -> None:
    node_store(tmp_path / "state")
    fd = os.open(tmp_path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running node holds it
        done = peerd_check(tmp_path)
    finally:
        os.close(fd)
    assert done.returncode == 2 and "is in use by another running node; stop it first" in done.stderr
    missing = peerd_check(tmp_path / "nowhere")
    assert missing.returncode == 2 and "no data dir at" in missing.stderr


def test_the_node_keeps_the_marker_only_when_it_dies_or_a_store_fault_stopped_it(tmp_path: Path) -> None:
    with _marked_running(tmp_path):
        assert running_marker(tmp_path)["pid"] == os.getpid()
    assert running_marker(tmp_path) is None  # a clean stop
    with pytest.raises(ValueError), _marked_running(tmp_path):
        raise ValueError("a bug, not the store's")
    assert running_marker(tmp_path) is None  # unwound: the stores were closed
    with pytest.raises(ExceptionGroup), _marked_running(tmp_path):
        try:
            raise StorageError("cannot write store at D: I/O error")
        except StorageError as exc:
            raise ExceptionGroup("tasks", [NodeError(str(exc))]) from exc
    assert running_marker(tmp_path) is not None  # a store fault: the next start checks the stores
