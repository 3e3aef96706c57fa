"""A Redis dedup backend (`redis`) for operators who already run Redis, as the companion study did.

Keys go into 256 Redis sets, one per 8-bit bucket of the host's ring position (the key's top 8 bits),
under `peercrawl:seen:<namespace>:<bucket>`. A set keeps Redis's cheapest per-member encoding and SADD
answers "was it new" per key. A batch of up to 10,000 keys is one round trip: a small Lua script runs the
SADDs server-side, atomically, instead of one pipelined command per key. Because buckets follow the ring,
an arc is a run of whole buckets plus two partial ones: `scan`/`delete` read only those. Several nodes may
share one server with distinct namespaces.

Durability is the server's (RDB/AOF settings): `sync()` only checks that the server is still there. Unlike
`NodeStore`, the check and the frontier push cannot be one transaction: if the connection drops after the
server ran a batch but before its answer arrived, the caller gets `StorageError`, and on a retry those keys
answer "seen": unless the caller re-admits such a batch from the page that gave it, its new URLs are lost.
`redis` (redis-py >= 5) is imported when this backend is opened, so the package does not need it otherwise:
`pip install peercrawl[redis]`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ._closing import Closing
from ._dedup_alt import UrlKeyedMixin, check_key
from ._errors import StorageError
from ._keys import arc_ranges

__all__ = ["RedisDedup"]

_BUCKET_BITS = 8  # few buckets keep len() and a whole-ring scan cheap; 10M keys is 39,000 a bucket
_BUCKETS = 1 << _BUCKET_BITS
_SHIFT = 64 - _BUCKET_BITS
_PIPELINE = 10_000  # commands per round trip: large enough to amortise it, small enough to bound memory
_READ_BUCKETS = 16  # buckets read per round trip in scan/delete
_SADD_EACH = """
local out = {}
for i = 1, #KEYS do out[i] = redis.call('SADD', KEYS[i], ARGV[i]) end
return out
"""


class RedisDedup(UrlKeyedMixin, Closing):
    """Seen-URL keys in Redis sets bucketed by ring position. One client per store, one thread at a time."""

    def __init__(self, client: Any, where: str, namespace: str) -> None:
        self._client = client
        self._where = where
        self._prefix = f"peercrawl:seen:{namespace}:".encode()
        import redis.exceptions

        self._errors: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)
        self._sadd_each = client.register_script(_SADD_EACH)

    @classmethod
    def open(cls, redis_url: str, *, namespace: str = "default", timeout: float = 10.0) -> RedisDedup:
        """Connect to `redis_url` (e.g. redis://127.0.0.1:6379/0) and check that the server answers."""
        try:
            import redis
        except ImportError as exc:
            raise StorageError("dedup kind 'redis' needs the redis package: pip install 'peercrawl[redis]'") from exc
        try:
            client = redis.Redis.from_url(redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)
        except ValueError as exc:
            raise StorageError(f"redis URL {redis_url!r} is not usable: {exc}") from exc
        kw = client.connection_pool.connection_kwargs
        where = f"redis at {kw.get('host', kw.get('path', '?'))}:{kw.get('port', '')}"
        store = cls(client, where, namespace)
        store._call(lambda: client.ping())
        return store

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except self._errors as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StorageError(f"{self._where}: {reason}") from exc

    def _bucket(self, key: bytes) -> bytes:
        return self._prefix + b"%02x" % (int.from_bytes(key[:8], "big") >> _SHIFT)


    def add_new(self, keys: Sequence[bytes]) -> list[bool]:
        """Check-and-insert, one script call per 10,000 keys: True where the key was new (first in a batch)."""
        for key in keys:
            check_key(key)
        out: list[bool] = []
        for lo in range(0, len(keys), _PIPELINE):

            def run(chunk: Sequence[bytes] = keys[lo : lo + _PIPELINE]) -> list[int]:
                added: list[int] = self._sadd_each(keys=[self._bucket(key) for key in chunk], args=list(chunk))
                return added

            out.extend(added == 1 for added in self._call(run))
        return out

    def insert(self, keys: Iterable[bytes]) -> int:
        return sum(self.add_new(list(keys)))

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, bytes) or len(key) != 16:
            return False
        return bool(self._call(lambda: self._client.sismember(self._bucket(key), key)))

    def __len__(self) -> int:
        def count() -> int:
            pipe = self._client.pipeline(transaction=False)
            for bucket in range(_BUCKETS):
                pipe.scard(self._prefix + b"%02x" % bucket)
            return sum(pipe.execute())

        return int(self._call(count))

    def _arc_buckets(self, start: int, end: int) -> Iterator[tuple[bytes, list[bytes], list[bytes]]]:
        """(bucket name, all members, members in the arc) for every bucket the arc touches."""
        ranges = arc_ranges(start, end)
        buckets: list[int] = []
        for first, last in ranges:
            lo_bucket = int.from_bytes(first, "big") >> _SHIFT
            buckets.extend(range(lo_bucket, (int.from_bytes(last, "big") >> _SHIFT) + 1))
        buckets = sorted(set(buckets))  # a wrapping arc's two ranges may share a bucket
        for lo in range(0, len(buckets), _READ_BUCKETS):
            names = [self._prefix + b"%02x" % b for b in buckets[lo : lo + _READ_BUCKETS]]

            def read(names: list[bytes] = names) -> list[set[bytes]]:
                pipe = self._client.pipeline(transaction=False)
                for name in names:
                    pipe.smembers(name)
                members: list[set[bytes]] = pipe.execute()
                return members

            for name, members in zip(names, self._call(read)):
                inside = [k for k in members if any(first <= k[:8] <= last for first, last in ranges)]
                yield name, list(members), inside

    def scan(self, start: int, end: int) -> Iterator[bytes]:
        """Keys of the ring arc [start, end) in key order (buckets are in ring order; each is sorted)."""
        for _name, _members, inside in self._arc_buckets(start, end):
            yield from sorted(inside)

    def delete(self, start: int, end: int) -> int:
        """Remove the keys of the arc: whole buckets are unlinked, partial ones lose only the arc's members."""
        removed = 0
        for name, members, inside in self._arc_buckets(start, end):
            if not inside:
                continue
            if len(inside) == len(members):
                self._call(lambda name=name: self._client.unlink(name))
            else:
                for lo in range(0, len(inside), _PIPELINE):
                    self._call(lambda name=name, lo=lo: self._client.srem(name, *inside[lo : lo + _PIPELINE]))
            removed += len(inside)
        return removed

    def sync(self) -> None:
        """Check that the server still answers; what survives a server crash is its own RDB/AOF setting."""
        self._call(lambda: self._client.ping())

    def used_memory(self) -> int:
        """The server's `used_memory` in bytes (the whole server, not only this namespace)."""
        return int(self._call(lambda: self._client.info("memory"))["used_memory"])

    def close(self) -> None:
        self._client.close()
