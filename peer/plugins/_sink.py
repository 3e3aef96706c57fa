"""Where items go: the exporter task moves them from the node's spool (`NodeStore.items`, an `ItemSpool` of
storage/_items.py, written with their pages) to a sink, by default JSON lines under DATA_DIR/items/.

Every item carries ``_seq``, its number in the node's spool. The exporter writes a batch to the sink, which
returns once it is durable there, then deletes the batch from the spool; `JsonLinesSink` remembers the last
number it holds (the last line of its file), so a crash between its write and the delete repeats nothing. A
sink that fails (a full disk) leaves the items in the spool: the exporter counts it, logs it and tries again,
and the crawl goes on (the spool is on disk, bounded by the store's map).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

__all__ = ["EXPORT_BATCH", "ItemExporter", "JsonLinesSink", "read_items"]

log = logging.getLogger("peer.plugins")

EXPORT_BATCH = 1000  # items moved to the sink at once
ITEMS_FILE = "items.jsonl"


class JsonLinesSink:
    """Items as JSON lines in ``directory/items.jsonl``, appended and fsynced."""

    version = "1"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / ITEMS_FILE
        self.last = self._last_seq()

    def _last_seq(self) -> int:
        """The number of the last whole item in the file (-1: none); a torn last line is cut off."""
        if not self.path.exists():
            return -1
        with open(self.path, "rb+") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - (1 << 20))
            fh.seek(start)
            tail = fh.read()
            if tail and not tail.endswith(b"\n"):  # a write cut by a crash: cut back to the last whole line
                keep = tail.rfind(b"\n") + 1
                fh.truncate(start + keep)
                tail = tail[:keep]
            lines = tail.splitlines()
        for line in reversed(lines):
            try:
                return int(json.loads(line)["_seq"])
            except (ValueError, KeyError, TypeError):
                continue
        return -1

    def write(self, items: Sequence[Mapping[str, Any]]) -> None:
        fresh = [item for item in items if int(item["_seq"]) > self.last]
        if not fresh:
            return
        data = "".join(json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n" for item in fresh)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self.last = int(fresh[-1]["_seq"])


def read_items(directory: str | os.PathLike[str], *, offset: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
    """Exported items of one node, from the `offset`-th on, at most `limit` (the control API's `/items`)."""
    path = Path(directory) / ITEMS_FILE
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i < offset or not line.endswith("\n"):
                continue
            if len(out) >= limit:
                break
            out.append(json.loads(line))
    return out


class ItemExporter:
    """Moves spooled items to the sinks, every `interval` seconds (sooner when a batch is full)."""

    def __init__(self, spool: Any, sinks: Sequence[Any], *, interval: float = 1.0) -> None:
        self.spool = spool
        self.sinks = list(sinks)
        self.interval = interval
        self.exported = 0
        self.failures = 0
        self.last_error = ""

    def export_once(self) -> int:
        """One batch to every sink, then out of the spool; the items moved."""
        batch = self.spool.first(EXPORT_BATCH)
        if not batch:
            return 0
        items = [json.loads(raw) for _seq, raw in batch]
        for sink in self.sinks:
            sink.write(items)
        self.spool.delete_through(batch[-1][0])
        self.exported += len(items)
        return len(items)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                moved = await trio.to_thread.run_sync(self.export_once)
            except Exception as exc:  # noqa: BLE001 - a sink's failure leaves the items spooled; tried again
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("items could not be exported; they stay spooled and are tried again",
                            extra={"error": self.last_error})
                moved = 0
            if moved < EXPORT_BATCH:
                await trio.sleep(self.interval)

    def status(self) -> dict[str, Any]:
        return {"spooled": len(self.spool), "exported": self.exported, "failures": self.failures,
                "last_error": self.last_error}
