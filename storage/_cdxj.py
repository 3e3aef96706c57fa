"""CDXJ index lines, as pywb reads them: `SURT-key 14-digit-timestamp {json}`, sorted by key then time.

The SURT key follows pywb's default canonicalization for ordinary URLs: lower case, scheme and a leading
`www.` dropped, host labels reversed and comma-joined, default port dropped, query arguments sorted.
"""

from __future__ import annotations

import json
import re
import time
from typing import NamedTuple
from urllib.parse import urlsplit

__all__ = ["CdxjEntry", "cdxj_line", "parse_cdxj_line", "surt", "warc_timestamp"]

_WWW = re.compile(r"^www\d*\.")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def surt(url: str) -> str:
    """The SURT sort key of a URL, e.g. `http://www.Example.com/A?b=2&a=1` -> `com,example)/a?a=1&b=2`."""
    parts = urlsplit(url.strip())
    host = _WWW.sub("", (parts.hostname or "").lower().strip("."))
    key = ",".join(reversed(host.split("."))) if host else ""
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme.lower()):
        key += f":{port}"
    path = parts.path or "/"
    key += ")" + path
    if parts.query:
        key += "?" + "&".join(sorted(parts.query.split("&")))
    return key.lower()


def warc_timestamp(epoch: float) -> str:
    """14-digit UTC timestamp (YYYYmmddHHMMSS) of epoch seconds."""
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(epoch))


class CdxjEntry(NamedTuple):
    url: str
    timestamp: str
    filename: str
    offset: int
    length: int
    status: int
    mime: str
    digest: str
    truncated: bool = False  # the body was cut at the size limit (the record says WARC-Truncated: length)


def cdxj_line(entry: CdxjEntry) -> str:
    """One index line (with its newline); values are strings, as pywb writes them."""
    fields = {
        "url": entry.url,
        "mime": entry.mime,
        "status": str(entry.status),
        "digest": entry.digest,
        "length": str(entry.length),
        "offset": str(entry.offset),
        "filename": entry.filename,
    }
    if entry.truncated:
        fields["truncated"] = "length"
    return f"{surt(entry.url)} {entry.timestamp} {json.dumps(fields, ensure_ascii=False)}\n"


def parse_cdxj_line(line: str) -> CdxjEntry:
    """The entry of one index line; raises ValueError on a malformed line."""
    _key, timestamp, blob = line.rstrip("\n").split(" ", 2)
    fields = json.loads(blob)
    return CdxjEntry(
        url=fields["url"], timestamp=timestamp, filename=fields["filename"], offset=int(fields["offset"]),
        length=int(fields["length"]), status=int(fields["status"]), mime=fields["mime"],
        digest=fields["digest"], truncated=fields.get("truncated") == "length",
    )
