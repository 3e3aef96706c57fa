"""The hot path: lists of URL entries, which is nearly all of the protocol's traffic.

`UrlList` means exactly what `Many(url entry record)` means (same limits, same wire form, same errors), but
checks the common entry (ASCII URLs, integers in range, no lastmod, not a sitemap) inline instead of through one kind object per field.
Any entry that is not plainly valid goes through the general record code, which accepts or explains it, so
the fast path can only be faster, never more permissive.
"""

from __future__ import annotations

from typing import Any

from ._limits import Limits
from ._schema import Invalid, Many, Record

__all__ = ["UrlList"]

_U32_MAX = 0xFFFF_FFFF
_FIELDS = ("url", "depth", "found_on", "hops", "lastmod", "sitemap")


class UrlList(Many):
    """A list of URL entries with at most `getattr(limits, limit)` items."""

    __slots__ = ()

    def __init__(self, entry: Record, limit: str) -> None:
        if tuple(name for name, _ in entry.fields) != _FIELDS:
            raise TypeError(f"UrlList needs a record with fields {_FIELDS}")
        super().__init__(entry, limit)

    def _count(self, value: Any, limits: Limits) -> None:
        bound = getattr(limits, self.limit)
        if len(value) > bound:
            raise Invalid(f"list of {len(value)} items exceeds {self.limit}={bound}")

    def _slow(self, step: Any, item: Any, index: int, js: bool, limits: Limits) -> Any:
        try:
            return step(item, js, limits)
        except Invalid as exc:
            exc.path.append(f"[{index}]")
            raise

    def dump(self, value: Any, js: bool, limits: Limits) -> list[Any]:
        if type(value) is not tuple:
            raise Invalid(f"expected a tuple, got {type(value).__name__}")
        self._count(value, limits)
        record = self.inner
        assert isinstance(record, Record)
        cls: Any = record.cls
        longest = limits.max_url_length
        out: list[Any] = []
        entry: Any
        for index, entry in enumerate(value):
            if type(entry) is cls and entry.lastmod is None and entry.sitemap is False:
                url, depth, found, hops = entry.url, entry.depth, entry.found_on, entry.hops
                if (
                    type(url) is str
                    and len(url) <= longest
                    and url.isascii()
                    and type(depth) is int
                    and 0 <= depth <= _U32_MAX
                    and type(hops) is int
                    and 0 <= hops <= _U32_MAX
                    and (found is None or (type(found) is str and len(found) <= longest and found.isascii()))
                ):
                    out.append(
                        {"url": url, "depth": depth, "found_on": found, "hops": hops, "lastmod": None,
                         "sitemap": False}
                        if js
                        else [url, depth, found, hops, None, False]
                    )
                    continue
            out.append(self._slow(record.dump, entry, index, js, limits))
        return out

    def load(self, value: Any, js: bool, limits: Limits) -> tuple[Any, ...]:
        if type(value) is not list:
            raise Invalid(f"expected a list, got {type(value).__name__}")
        self._count(value, limits)
        record = self.inner
        assert isinstance(record, Record)
        build = record.build
        longest = limits.max_url_length
        out: list[Any] = []
        for index, item in enumerate(value):
            fields: Any = None
            if js:
                if type(item) is dict and len(item) == 6 and item.get("lastmod", 0) is None:
                    try:
                        fields = item["url"], item["depth"], item["found_on"], item["hops"], None, item["sitemap"]
                    except KeyError:
                        fields = None
            elif type(item) is list and len(item) == 6 and item[4] is None:
                fields = item
            if fields is not None and fields[5] is False:
                url, depth, found, hops = fields[:4]
                if (
                    type(url) is str
                    and len(url) <= longest
                    and url.isascii()
                    and type(depth) is int
                    and 0 <= depth <= _U32_MAX
                    and type(hops) is int
                    and 0 <= hops <= _U32_MAX
                    and (found is None or (type(found) is str and len(found) <= longest and found.isascii()))
                ):
                    out.append(build(url, depth, found, hops, None, False))
                    continue
            out.append(self._slow(record.load, item, index, js, limits))
        return tuple(out)
