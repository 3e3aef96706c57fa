"""CDXJ index lines, as pywb reads them: `SURT-key 14-digit-timestamp {json}`, sorted by key then time.

The SURT key follows pywb's default canonicalization for ordinary URLs: lower case, scheme and a leading
`www.` dropped, host labels reversed and comma-joined, default port dropped, query arguments sorted.
"""

from __future__ import annotations

import json
import re
import time
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import SplitResult, urlsplit

__all__ = ["CdxjEntry", "cdxj_join", "cdxj_line", "cdxj_parts", "parse_cdxj_line", "surt", "warc_timestamp"]

_WWW = re.compile(r"^www\d*\.")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def surt(url: str) -> str:
    """The SURT sort key of a URL, e.g. `http://www.Example.com/A?b=2&a=1` -> `com,example)/a?a=1&b=2`.

    A plain "http(s)://authority..." URL (what the crawler stores) has its authority's part of the key
    remembered, and its path and query split as `urlsplit` splits them; any other string takes `urlsplit`."""
    url = url.strip()
    if (url.startswith("http://") or url.startswith("https://")) and not _UNUSUAL.search(url):
        start = url.find("//") + 2
        end = len(url)
        for sep in "/?#":
            i = url.find(sep, start)
            if 0 <= i < end:
                end = i
        rest = url[end:]
        hash_at = rest.find("#")
        if hash_at >= 0:
            rest = rest[:hash_at]
        path, _, query = rest.partition("?")
        return _surt_key(_surt_authority(url[:end]), path, query)
    parts = urlsplit(url)
    return _surt_key(_surt_authority_of(parts), parts.path, parts.query)


# characters `urlsplit` drops or reads specially, and any non-ASCII: such URLs take the general path
_UNUSUAL = re.compile(r"[^\x21-\x7e]")


@lru_cache(maxsize=4096)
def _surt_authority(origin: str) -> str:
    return _surt_authority_of(urlsplit(origin))


def _surt_authority_of(parts: SplitResult) -> str:
    host = _WWW.sub("", (parts.hostname or "").lower().strip("."))
    key = ",".join(reversed(host.split("."))) if host else ""
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme.lower()):
        key += f":{port}"
    return key


def _surt_key(authority: str, path: str, query: str) -> str:
    key = authority + ")" + (path or "/")
    if query:
        key += "?" + "&".join(sorted(query.split("&")))
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
    status: int  # 0: a record with no HTTP status of its own (a `conversion`): the line has no "status"
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
    if not entry.status:  # pywb's indexer writes no status for a record that is not a response
        del fields["status"]
    if entry.truncated:
        fields["truncated"] = "length"
    values = fields.values()
    if _NEEDS_ESCAPE.search("".join(values)) is None:
        # nothing JSON would escape (ensure_ascii=False escapes only quotes, backslashes and controls): the
        # same text as json.dumps, written directly
        blob = "{" + ", ".join([f'"{k}": "{v}"' for k, v in zip(fields, values)]) + "}"
    else:
        blob = json.dumps(fields, ensure_ascii=False)
    return f"{surt(entry.url)} {entry.timestamp} {blob}\n"


_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')


def cdxj_parts(*, url: str, timestamp: str, length: int, status: int, mime: str, digest: str,
               truncated: bool = False) -> tuple[str, str] | None:
    """The index line of a record whose place (WARC file and offset) is not known yet, in two pieces:
    `cdxj_join` puts the offset and the file name between them. A page worker makes them (the SURT key is most
    of a line's cost); the writer only joins. None when a value needs JSON escapes (`cdxj_line` then)."""
    values = (url, mime, str(status), digest, str(length))
    if _NEEDS_ESCAPE.search("".join(values)) is not None:
        return None
    return (f'{surt(url)} {timestamp} {{"url": "{url}", "mime": "{mime}", "status": "{values[2]}", '
            f'"digest": "{digest}", "length": "{values[4]}", "offset": "',
            '"}\n' if not truncated else '", "truncated": "length"}\n')


def cdxj_join(parts: tuple[str, str], offset: int, filename: str) -> str | None:
    """The line of `cdxj_parts` at its place: the same text as `cdxj_line`. None when the file name needs
    JSON escapes."""
    if _NEEDS_ESCAPE.search(filename) is not None:
        return None
    return f'{parts[0]}{offset}", "filename": "{filename}{parts[1]}'


def parse_cdxj_line(line: str) -> CdxjEntry:
    """The entry of one index line; raises ValueError on a malformed line."""
    _key, timestamp, blob = line.rstrip("\n").split(" ", 2)
    fields = json.loads(blob)
    return CdxjEntry(
        url=fields["url"], timestamp=timestamp, filename=fields["filename"], offset=int(fields["offset"]),
        length=int(fields["length"]), status=int(fields.get("status", 0)), mime=fields["mime"],
        digest=fields["digest"], truncated=fields.get("truncated") == "length",
    )
