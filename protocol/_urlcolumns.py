"""Protocol version 3's msgpack form of a URL list: columns, each URL front-coded against the one before it.

A batch of URLs bound for one owner repeats itself: many URLs share a scheme and host (and so a prefix with the
URL before them once the sender sorts the batch), and a page's cross-host links share one referrer. Version 1
writes every entry whole (`[url, depth, found_on, hops, lastmod, sitemap]`, about 128 bytes per URL); version 3
writes the same list as eleven columns, which a general-purpose compressor then shrinks much further because
like sits with like:

    [prefix, size, text, depth, hops, found, found_prefix, found_size, found_text, lastmod, sitemap]

- `prefix[i]`: how many characters URL i shares with URL i-1 (URL -1 is ""); the rest of it is the next
  `size[i]` characters of the one string `text` (the suffixes joined, so no per-string header sits among them).
- `depth[i]`, `hops[i]`: as in version 1.
- `found[i]`: 0 when URL i has no referrer, else 1 + its index in the referrer table.
- `found_prefix[j]`, `found_size[j]`, `found_text`: the referrer table, sorted and distinct, front-coded the
  same way.
- `lastmod`, `sitemap`: as in version 2, one per entry; an empty array when every entry has none (nil, false).

The order of the list is kept exactly (the front coding works in any order; a sorted list codes best, so the
sender sorts). The JSON codec keeps version 2's readable objects in every version. Decoding only rebuilds the
version 2 tree, under the same bounds, and hands it to `UrlList.load`: every check on an entry lives in one place.
"""

from __future__ import annotations

from typing import Any

from ._limits import Limits
from ._schema import Invalid
from ._urllist import UrlList

__all__ = ["UrlColumns"]

_COLUMNS = 11


def _shared(a: str, b: str) -> int:
    """Length of the common prefix of a and b."""
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    lo, hi = 0, limit  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect on slices, which compare in C
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _front_code(strings: list[str]) -> tuple[list[int], list[int], str]:
    prefixes: list[int] = []
    suffixes: list[str] = []
    previous = ""
    for text in strings:
        k = _shared(previous, text)
        prefixes.append(k)
        suffixes.append(text[k:])
        previous = text
    return prefixes, [len(rest) for rest in suffixes], "".join(suffixes)


def _front_decode(prefixes: Any, sizes: Any, text: Any, longest: int, what: str) -> list[str]:
    if type(prefixes) is not list or type(sizes) is not list or type(text) is not str:
        raise Invalid(f"{what}: expected two arrays and a string")
    if len(prefixes) != len(sizes):
        raise Invalid(f"{what}: {len(prefixes)} prefix lengths for {len(sizes)} suffix sizes")
    out: list[str] = []
    previous = ""
    at = 0
    for index, (k, size) in enumerate(zip(prefixes, sizes, strict=True)):
        if type(k) is not int or not 0 <= k <= len(previous):
            raise Invalid(f"{what}[{index}]: prefix length {k!r} is not in 0..{len(previous)}")
        if type(size) is not int or not 0 <= size <= longest - k:
            # characters <= UTF-8 bytes: UrlList.load checks the exact byte length after this
            raise Invalid(f"{what}[{index}]: suffix size {size!r} with prefix {k} exceeds max_url_length={longest}")
        end = at + size
        if end > len(text):
            raise Invalid(f"{what}[{index}]: suffix runs past the end of the text ({len(text)} characters)")
        previous = previous[:k] + text[at:end]
        at = end
        out.append(previous)
    if at != len(text):
        raise Invalid(f"{what}: {len(text) - at} characters of text left over")
    return out


class UrlColumns(UrlList):
    """`UrlList` whose msgpack form is the front-coded columns above; its JSON form is version 2's."""

    __slots__ = ()

    def dump(self, value: Any, js: bool, limits: Limits) -> Any:
        rows = super().dump(value, js, limits)  # every entry checked as in version 2
        if js:
            return rows
        urls = [row[0] for row in rows]
        referrers = sorted({row[2] for row in rows if row[2] is not None})
        slot = {referrer: index for index, referrer in enumerate(referrers, 1)}
        prefix, size, text = _front_code(urls)
        found_prefix, found_size, found_text = _front_code(referrers)
        return [
            prefix,
            size,
            text,
            [row[1] for row in rows],
            [row[3] for row in rows],
            [0 if row[2] is None else slot[row[2]] for row in rows],
            found_prefix,
            found_size,
            found_text,
            [] if all(row[4] is None for row in rows) else [row[4] for row in rows],
            [] if all(row[5] is False for row in rows) else [row[5] for row in rows],
        ]

    def load(self, value: Any, js: bool, limits: Limits) -> tuple[Any, ...]:
        if js:
            return super().load(value, js, limits)
        if type(value) is not list or len(value) != _COLUMNS:
            raise Invalid(f"expected an array of {_COLUMNS} columns")
        prefix, size, text, depth, hops, found, found_prefix, found_size, found_text, lastmod, sitemap = value
        bound = getattr(limits, self.limit)
        for name, column in (("depth", depth), ("hops", hops), ("found", found), ("prefix", prefix)):
            if type(column) is not list:
                raise Invalid(f"column {name}: expected an array, got {type(column).__name__}")
            if len(column) > bound:
                raise Invalid(f"list of {len(column)} items exceeds {self.limit}={bound}")
        n = len(prefix)
        if type(size) is not list or not len(size) == len(depth) == len(hops) == len(found) == n:
            raise Invalid("columns differ in length")
        if type(lastmod) is not list or type(sitemap) is not list or len(lastmod) not in (0, n) or len(sitemap) not in (0, n):
            raise Invalid("lastmod and sitemap must each be empty or one per entry")
        lastmods = lastmod or [None] * n
        sitemaps = sitemap or [False] * n
        if type(found_prefix) is not list or len(found_prefix) > n:
            raise Invalid(f"referrer table longer than the {n} entries that could use it")
        longest = limits.max_url_length
        urls = _front_decode(prefix, size, text, longest, "url")
        table: list[str | None] = [None]
        table += _front_decode(found_prefix, found_size, found_text, longest, "found_on")
        slots = len(table)
        rows: list[Any] = []
        for index in range(n):
            slot = found[index]
            if type(slot) is not int or not 0 <= slot < slots:
                raise Invalid(f"found[{index}]: {slot!r} is not an index into the {slots - 1} referrers")
            rows.append([urls[index], depth[index], table[slot], hops[index], lastmods[index], sitemaps[index]])
        return super().load(rows, js, limits)
