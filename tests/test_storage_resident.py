"""The store hands its mapped pages back to the kernel (`release_resident`) and reads the same afterwards."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from storage import NodeStore, QueuedUrl
from storage._frontier import QUEUE
from storage._keys import arc_ranges
from storage._lmdb import mapped_ranges

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def _resident(path: str) -> int:
    """Bytes of `path`'s mappings resident in this process (the Rss lines of /proc/self/smaps)."""
    target = os.path.realpath(path)
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = len(head) == 6 and head[5] == target
            elif inside and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


def _fill(store: NodeStore, hosts: int, per_host: int) -> list[QueuedUrl]:
    items = [QueuedUrl(url=f"http://h{h}.example/{'p' * 200}/{i}", host=f"h{h}.example", depth=1)
             for h in range(hosts) for i in range(per_host)]
    store.admit(items)
    return items


@linux_only
def test_release_resident_drops_the_mapped_pages_and_the_data_reads_the_same(tmp_path: Path) -> None:
    with NodeStore.open(tmp_path / "state") as store:
        _fill(store, hosts=2_000, per_host=20)  # about 10 MB of records
        data = str(tmp_path / "state" / "data.mdb")
        hosts_before = list(store.frontier.hosts())
        queue_before = list(store._env.scan(QUEUE, arc_ranges(0, 0)))  # reads every page of the queue
        assert len(queue_before) == 40_000
        touched = _resident(data)
        assert touched > 1 << 20, "reading the store maps its pages"
        released = store.release_resident()
        assert released >= os.path.getsize(data)  # the whole mapping, at least the file
        assert _resident(data) < touched / 4
        assert list(store.frontier.hosts()) == hosts_before  # the next read maps them again
        assert list(store._env.scan(QUEUE, arc_ranges(0, 0))) == queue_before
        item = store.frontier.pop("h7.example")
        assert item is not None and item.url.endswith("/0")


@linux_only
def test_release_keeps_later_writes(tmp_path: Path) -> None:
    with NodeStore.open(tmp_path / "state") as store:
        _fill(store, hosts=50, per_host=10)
        store.release_resident()
        store.admit([QueuedUrl(url="http://new.example/", host="new.example", depth=0)])
        store.release_resident()
        assert store.frontier.queued("new.example") == 1
        assert len(store.frontier) == 501


def test_mapped_ranges_reads_the_lines_of_one_file(tmp_path: Path) -> None:
    data = tmp_path / "data.mdb"
    data.write_bytes(b"")
    target = os.path.realpath(data)
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f0000000000-7f0000400000 r--s 00000000 08:01 1234 {target}\n"
        "7f0000400000-7f0000500000 r-xp 00000000 08:01 99 /usr/lib/libc.so.6\n"
        f"7f0000600000-7f0000700000 r--s 00400000 08:01 1234 {target}\n"
        "7f0000800000-7f0000900000 rw-p 00000000 00:00 0\n",
        encoding="utf-8",
    )
    assert mapped_ranges(str(data), str(maps)) == [(0x7F0000000000, 0x7F0000400000), (0x7F0000600000, 0x7F0000700000)]
    assert mapped_ranges(str(data), str(tmp_path / "missing")) == []
