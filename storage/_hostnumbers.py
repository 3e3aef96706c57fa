"""Host numbers: how the frontier's queue keys name a host in a byte or so instead of by its name.

A queue key is position(8) + host number + depth(4) + sequence(8) (storage/_frontier.py). The position alone
almost always names the host, but two hosts may share one (a 64-bit hash), so a number tells them apart: the
smallest that no other host at the same position holds, 0 nearly always. Its code is one byte for 0 to 254,
else 0xFF and 4 bytes, so no host's key prefix (position + code) is the start of another's. The number lives
in the host's entry of the `hosts` table after its queued count (8 bytes), from when its first URL is queued
until its queue is empty; then it is free. It is this store's own: a hand-off and a queue replica carry host
names, and the node that takes them numbers the hosts in its own store.

Stores written before host numbers kept the host's name in every queue key (`hp` + depth + sequence, in the
`queue` table) and the count alone in `hosts`. `migrate` moves such a queue into the numbered one when the
store opens, whole hosts of some `MIGRATE_CHUNK` records per transaction: the values are the same, a record's
depth and sequence (its place) are kept, and each host's count is written as the records moved, so a crash
between two transactions leaves every host in one table, counted, and the next open goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lmdb import LmdbEnv

if TYPE_CHECKING:
    from ._lmdb import Cursor, Db, Txn

__all__ = ["MIGRATE_CHUNK", "TAIL", "HostNumbers", "queued_count"]

TAIL = 12  # a queue key ends with depth (4) and sequence (8)
MIGRATE_CHUNK = 20_000  # old queue records moved per transaction at open
_COUNT = 8  # a `hosts` value: the queued count (8 bytes), then the host number's code


def number_code(n: int) -> bytes:
    """Host number `n` as it follows the position in a queue key."""
    return bytes((n,)) if n < 255 else b"\xff" + (n - 255).to_bytes(4, "big")


def queued_count(raw: bytes) -> int:
    """The queued count of a `hosts` value."""
    return int.from_bytes(raw[:_COUNT], "big")


class HostNumbers:
    """The host numbers of a frontier whose `hosts` and queue databases are `hosts` and `queue`. Every call
    works in the caller's transaction."""

    def __init__(self, hosts: Db, queue: Db) -> None:
        self._hosts = hosts
        self._queue = queue

    def get(self, txn: Txn, hp: bytes) -> tuple[int, bytes] | None:
        """The host's queued count and queue-key prefix (position + number code), None if it has no number."""
        raw = txn.get(hp, db=self._hosts)
        if raw is None or len(raw) <= _COUNT:
            return None
        return int.from_bytes(raw[:_COUNT], "big"), hp[:8] + raw[_COUNT:]

    def assign(self, txn: Txn, hp: bytes) -> tuple[int, bytes]:
        """`get`, numbering the host first if it has no number: the smallest that no host at its position holds
        and no record is queued under, written with its count (0 for a host not in the table)."""
        found = self.get(txn, hp)
        if found is not None:
            return found
        raw = txn.get(hp, db=self._hosts)
        count = queued_count(raw) if raw is not None else 0
        position = hp[:8]
        taken = set()
        cur = txn.cursor(self._hosts)
        if cur.set_range(position):
            for key, value in cur:
                if key[:8] != position:
                    break
                taken.add(value[_COUNT:])
        queue = txn.cursor(self._queue)
        n = 0
        while True:
            prefix = position + number_code(n)
            if prefix[8:] not in taken and not (queue.set_range(prefix) and queue.key().startswith(prefix)):
                break
            n += 1
        txn.put(hp, count.to_bytes(_COUNT, "big") + prefix[8:], db=self._hosts)
        return count, prefix

    def set_count(self, txn: Txn, hp: bytes, prefix: bytes, n: int) -> None:
        """Write the host's queued count with its number (its queue-key prefix), or at 0 delete its entry: the
        number is free again."""
        if n > 0:
            txn.put(hp, n.to_bytes(_COUNT, "big") + prefix[8:], db=self._hosts)
        else:
            txn.delete(hp, db=self._hosts)

    def host_at(self, cur: Cursor, prefix: bytes) -> str | None:
        """The host whose queue-key prefix is `prefix`, looked up with `cur` (a cursor on `hosts`) among the
        hosts at its position; None if no host holds it."""
        position, code = prefix[:8], prefix[8:]
        if cur.set_range(position):
            for key, value in cur:
                if key[:8] != position:
                    break
                if value[_COUNT:] == code:
                    return key[8:-1].decode("utf-8")
        return None

    def migrate(self, env: LmdbEnv, old: Db) -> int:
        """Move every record of `old` (a queue keyed by host name) into the numbered queue, `MIGRATE_CHUNK` per
        transaction; return how many moved."""

        def move_some(txn: Txn) -> int:
            cur = txn.cursor(old)
            if not cur.first():
                return 0
            n = 0
            key = cur.key()
            while key and n < MIGRATE_CHUNK:  # whole hosts: each one's count is then its records, counted
                hp = key[:-TAIL]
                prefix = self.assign(txn, hp)[1]
                count = 0
                while key.startswith(hp) and len(key) == len(hp) + TAIL:
                    txn.put(prefix + key[-TAIL:], cur.value(), db=self._queue)
                    cur.delete()
                    count += 1
                    key = cur.key()
                self.set_count(txn, hp, prefix, count)
                n += count
            return n

        moved = 0
        while True:
            n = env.write(move_some)
            moved += n
            if n == 0:
                return moved
