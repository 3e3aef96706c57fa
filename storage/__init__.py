"""Synchronous node state: dedup store, frontier store, page store, caches. Never imports peer.

Everything that must survive a kill -9 lives here, organised so that handing an arc of the ring to another
node is a range scan: every per-host key begins with the host's 64-bit ring position (DESIGN decision 7).
The on-disk layout and the durability model are in docs/storage.md.
"""

from ._bloom import BloomDedup
from ._cache import LruTtlCache
from ._cdxj import surt
from ._check import (
    RUNNING,
    StoreCheck,
    StoreCheckError,
    check_data_dir,
    check_store,
    check_store_in_child,
    mark_running,
    mark_stopped,
    running_marker,
    stores_in,
)
from ._dedup import FILTER_FILE, DedupStore, FilterOpen, MemoryDedupStore
from ._wacz import WACZ_VERSION, WaczReport, pack_wacz
from ._dedup_alt import FingerprintSetDedup, UrlSetDedup, md5_key
from ._digests import MemoryPayloadDigests, PayloadDigests, StoredPayload, digest_ring_key
from ._digittree import DigitTreeDedup
from ._errors import StorageError
from ._frontier import FrontierStore
from ._keys import (
    RING_SIZE,
    arc_ranges,
    host_position,
    host_position_bytes,
    host_prefix,
    in_arc,
    url_fingerprint,
    url_key,
)
from ._memfrontier import MemoryFrontierStore
from ._node import MemoryNodeStore, NodeStore, queued_url_keys
from ._outbox import Outbox, OutboxEntry
from ._pages import BuiltPage, NullPageStore, PageStore, WarcPageStore, build_page_records, open_page_store
from ._records import HostState, QueuedUrl
from ._redis_dedup import RedisDedup
from ._seenfilter import MAX_BYTES as SEEN_FILTER_MAX_BYTES
from ._replicas import Replicas
from ._revisits import RevisitRecord, RevisitSchedule
from ._captures import MATCH_TYPES, Capture, CaptureSearch, find_captures
from ._crawllog import LOG_FIELDS, CrawlLogSpool
from ._uploads import Uploaded, Uploads, closed_files
from ._warc import payload_digest
from .dedup_kinds import DEDUP_KINDS, DedupUnsupported, LmdbDedup, open_dedup

__all__ = [
    "FILTER_FILE",
    "FilterOpen",
    "SEEN_FILTER_MAX_BYTES",
    "RING_SIZE",
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
    "BuiltPage",
    "DedupStore",
    "FrontierStore",
    "HostState",
    "LruTtlCache",
    "MemoryDedupStore",
    "MemoryFrontierStore",
    "MemoryNodeStore",
    "NodeStore",
    "NullPageStore",
    "Outbox",
    "OutboxEntry",
    "PageStore",
    "QueuedUrl",
    "RevisitRecord",
    "RevisitSchedule",
    "StorageError",
    "WarcPageStore",
    "arc_ranges",
    "build_page_records",
    "host_position",
    "host_position_bytes",
    "host_prefix",
    "in_arc",
    "open_page_store",
    "payload_digest",
    "queued_url_keys",
    "surt",
    "url_fingerprint",
    "url_key",
    "BloomDedup",
    "DEDUP_KINDS",
    "DedupUnsupported",
    "DigitTreeDedup",
    "WACZ_VERSION",
    "WaczReport",
    "pack_wacz",
    "MemoryPayloadDigests",
    "PayloadDigests",
    "StoredPayload",
    "digest_ring_key",
    "FingerprintSetDedup",
    "LmdbDedup",
    "RedisDedup",
    "Replicas",
    "UrlSetDedup",
    "Uploaded",
    "Uploads",
    "CrawlLogSpool",
    "Capture",
    "CaptureSearch",
    "MATCH_TYPES",
    "find_captures",
    "LOG_FIELDS",
    "closed_files",
    "md5_key",
    "open_dedup",
]
