"""Captures in a node's CDXJ indexes, found as pywb's CDX server finds them: by SURT key, for one URL (`exact`),
a path and what is under it (`prefix`), a host (`host`) or a host and its subdomains (`domain`), in a time range.

A closed index is sorted, so its first match is found by a binary search over the file's bytes (a look-up reads
a few pages of a large index, not all of it); the index of the file being written (`.cdxj.open`) is read
through. An index stays on the disk after its WARC file was uploaded (it is small), so every capture this node
made can be found; `Uploads.uploaded` says where its record went.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from ._cdxj import surt

__all__ = ["MATCH_TYPES", "Capture", "CaptureSearch", "find_captures"]

MATCH_TYPES = ("exact", "prefix", "host", "domain")


class CaptureSearch(NamedTuple):
    """What to find: the SURT prefix a matching key starts with, the characters that may follow it (empty: any),
    the time range (14-digit timestamps, inclusive) and how many at most."""

    prefix: str
    follow: str
    since: str
    until: str
    limit: int

    @classmethod
    def of(cls, url: str, match: str = "exact", since: str = "", until: str = "", limit: int = 10_000) -> CaptureSearch:
        """The query of pywb's CDX API parameters: `url` (a trailing `*` means prefix, a leading `*.` domain),
        `matchType`, `from` and `to` (up to 14 digits, padded down and up), `limit`. ValueError when one is bad."""
        if match not in MATCH_TYPES:
            raise ValueError(f"matchType must be one of {', '.join(MATCH_TYPES)}, got {match!r}")
        if url.startswith("*."):
            url, match = url[2:], "domain"
        elif url.endswith("*"):
            url, match = url[:-1], "prefix" if match == "exact" else match
        if not url:
            raise ValueError("url is required")
        if "://" not in url:
            url = "http://" + url
        key = surt(url)
        authority = key.split(")", 1)[0]
        if not authority:
            raise ValueError(f"no host in url {url!r}")
        for name, ts in (("from", since), ("to", until)):
            if ts and (not ts.isdigit() or len(ts) > 14):
                raise ValueError(f"{name} must be up to 14 digits (YYYYMMDDhhmmss), got {ts!r}")
        if limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit}")
        since, until = since.ljust(14, "0"), until.ljust(14, "9")
        if match == "exact":
            return cls(key + " ", "", since, until, limit)
        if match == "prefix":
            return cls(key, "", since, until, limit)
        if match == "host":
            return cls(authority + ")", "", since, until, limit)
        return cls(authority, "),:", since, until, limit)


class Capture(NamedTuple):
    """One capture: its SURT key, 14-digit timestamp and the index's fields (url, mime, status, digest, length,
    offset, filename: strings, as pywb writes them)."""

    urlkey: str
    timestamp: str
    fields: dict[str, str]


def _line_at(fh: BinaryIO, position: int) -> tuple[int, bytes]:
    """The first whole line that starts at or after `position`: (its offset, the line)."""
    if position == 0:
        fh.seek(0)
    else:
        fh.seek(position - 1)
        fh.readline()
    start = fh.tell()
    return start, fh.readline()


def _first_at_least(fh: BinaryIO, size: int, prefix: bytes) -> int:
    """The offset of the first line of a sorted file that is not below `prefix`."""
    lo, hi = 0, size
    while lo < hi:
        mid = (lo + hi) // 2
        _start, line = _line_at(fh, mid)
        if not line or line >= prefix:
            hi = mid
        else:
            lo = mid + 1
    return _line_at(fh, lo)[0]


def _matching(path: Path, query: CaptureSearch, *, sorted_file: bool) -> Iterator[Capture]:
    prefix = query.prefix.encode("utf-8")
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        if sorted_file:
            fh.seek(_first_at_least(fh, os.fstat(fh.fileno()).st_size, prefix))
        for line in fh:
            if not line.startswith(prefix):
                if sorted_file and line > prefix:
                    return
                continue
            if query.follow and line[len(prefix):len(prefix) + 1].decode("ascii", "replace") not in query.follow:
                continue
            try:
                key, timestamp, blob = line.decode("utf-8").rstrip("\n").split(" ", 2)
                fields = json.loads(blob)
            except ValueError:
                continue  # a torn last line of an open index
            if query.since <= timestamp <= query.until:
                yield Capture(key, timestamp, fields)


def find_captures(directory: str | os.PathLike[str], query: CaptureSearch) -> list[Capture]:
    """The captures the CDXJ indexes in `directory` hold for `query`, in key then time order, at most `limit`."""
    directory = Path(directory)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found: list[Capture] = []
    for name in sorted(names):
        if name.endswith(".cdxj"):  # in key order: its first `limit` are all it can add
            found.extend(itertools.islice(_matching(directory / name, query, sorted_file=True), query.limit))
        elif name.endswith(".cdxj.open"):
            found.extend(_matching(directory / name, query, sorted_file=False))
    found.sort(key=lambda c: (c.urlkey, c.timestamp))
    return found[: query.limit]
