"""Items the plug-ins extracted, spooled in the node's LMDB environment until they are exported.

A page's items are put in the same transaction that finishes the page (`NodeStore.finish`), so after a kill -9
either the page is fetched again and gives its items then, or its items are here: none is lost, none is made
twice for one fetch. Each item gets the next number of a counter kept in the same table (so numbers never
repeat, even once the spool is empty); the exporter writes items in number order to their sink and then
deletes them, and a sink that remembers the last number it holds skips what it already has (a crash between
the sink's write and the delete repeats nothing).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import lmdb

from ._lmdb import LmdbEnv

__all__ = ["ITEMS_DB", "ItemSpool"]

ITEMS_DB = b"items"
_NEXT = b"\xff" * 8  # the counter's key, after every item's
_SEQ = 8


class ItemSpool:
    """Items waiting for export: item number (8 bytes, big-endian) -> the item as JSON."""

    def __init__(self, env: LmdbEnv) -> None:
        self._env = env
        self._db = env.db(ITEMS_DB)

    def _put_in(self, txn: lmdb.Transaction, items: Sequence[dict[str, Any]]) -> None:
        raw = txn.get(_NEXT, db=self._db)
        seq = int.from_bytes(raw, "big") if raw is not None else 0
        for item in items:
            txn.put(seq.to_bytes(_SEQ, "big"), json.dumps({**item, "_seq": seq}, separators=(",", ":"),
                                                          ensure_ascii=False).encode("utf-8"), db=self._db)
            seq += 1
        txn.put(_NEXT, seq.to_bytes(_SEQ, "big"), db=self._db)

    def put(self, items: Sequence[dict[str, Any]]) -> None:
        """Spool items in a transaction of their own (a test's call; the crawl puts them with their page)."""
        if items:
            self._env.write(lambda txn: self._put_in(txn, items))

    def first(self, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` spooled items in number order: (number, the item as JSON)."""
        out: list[tuple[int, bytes]] = []
        with self._env.read() as txn:
            cursor = txn.cursor(self._db)
            for key, value in cursor:
                if key == _NEXT or len(out) >= limit:
                    break
                out.append((int.from_bytes(key, "big"), bytes(value)))
        return out

    def delete_through(self, last: int) -> int:
        """Delete every spooled item numbered up to `last` (exported); how many."""

        def run(txn: lmdb.Transaction) -> int:
            cursor = txn.cursor(self._db)
            gone = 0
            while cursor.first() and cursor.key() != _NEXT and int.from_bytes(cursor.key(), "big") <= last:
                cursor.delete()
                gone += 1
            return gone

        return self._env.write(run)

    def __len__(self) -> int:
        entries = self._env.entries(ITEMS_DB)
        return max(0, entries - 1) if entries else 0
