"""One node's captures for the cluster's look-up (`GET /cdx`, `peerctl lookup`), in the forms of pywb's CDX server
API: CDXJ lines (`urlkey timestamp {json}`, the default), JSON lines (`output=json`) or space-delimited fields
(`output=text`).

Each capture's JSON has pywb's fields (url, mime, status, digest, length, offset, filename) and where the record
is: `node` (the node that wrote it) and, once its WARC file was uploaded, `object` (its key in the bucket).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import trio

from protocol import CaptureAsk
from storage import MATCH_TYPES, CaptureSearch, Uploads, find_captures

__all__ = ["LocalIndex", "OUTPUTS", "cdx_body", "parse_cdx_query"]

#: The `output` forms and their content types.
OUTPUTS = {"cdxj": "text/x-cdxj; charset=utf-8", "json": "application/x-ndjson; charset=utf-8",
           "text": "text/plain; charset=utf-8"}
#: Captures one look-up returns at most (pywb returns all when no limit is given; a cluster's could be millions).
MAX_LIMIT = 100_000
_TEXT_FIELDS = ("url", "mime", "status", "digest", "length", "offset", "filename")


class LocalIndex:
    """This node's CDXJ indexes (`directory`) and its upload records (`uploads`: None without an upload queue)."""

    def __init__(self, directory: Path, node_id: str, uploads: Uploads | None) -> None:
        self.directory = directory
        self.node_id = node_id
        self.uploads = uploads

    async def captures(self, ask: CaptureAsk) -> list[str]:
        """The captures here for `ask`, as CDXJ lines naming this node (and the object of an uploaded file)."""
        search = CaptureSearch.of(ask.url, ask.match, ask.since, ask.until, ask.limit)
        found = await trio.to_thread.run_sync(find_captures, self.directory, search)
        out = []
        objects: dict[str, str | None] = {}
        for capture in found:
            fields: dict[str, Any] = {**capture.fields, "node": self.node_id}
            name = fields.get("filename", "")
            if name not in objects:
                done = self.uploads.uploaded(name) if self.uploads is not None else None
                objects[name] = done.key if done is not None else None
            if objects[name] is not None:
                fields["object"] = objects[name]
            out.append(f"{capture.urlkey} {capture.timestamp} {json.dumps(fields, ensure_ascii=False)}")
        return out


def parse_cdx_query(query: str) -> tuple[dict[str, Any], str]:
    """The look-up a `/cdx` query string asks for (url, match, since, until, limit) and its output form;
    ValueError with the reason when a parameter is bad."""
    params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
    url = params.get("url", "")
    match = params.get("matchType", "exact")
    output = params.get("output", "cdxj")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    if match not in MATCH_TYPES:
        raise ValueError(f"matchType must be one of {', '.join(MATCH_TYPES)}, got {match!r}")
    try:
        limit = int(params.get("limit", str(MAX_LIMIT)))
    except ValueError:
        raise ValueError(f"limit must be a positive integer, got {params['limit']!r}") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    since, until = params.get("from", ""), params.get("to", "")
    CaptureSearch.of(url, match, since, until, limit)  # raises what is wrong with them
    return {"url": url, "match": match, "since": since, "until": until, "limit": limit}, output


def cdx_body(lines: list[str], output: str) -> bytes:
    """CDXJ lines in the asked `output` form, one capture a line."""
    if output == "cdxj":
        return "".join(line + "\n" for line in lines).encode("utf-8")
    out = []
    for line in lines:
        urlkey, timestamp, blob = line.split(" ", 2)
        fields = json.loads(blob)
        if output == "json":
            out.append(json.dumps({"urlkey": urlkey, "timestamp": timestamp, **fields}, ensure_ascii=False))
        else:
            out.append(" ".join([urlkey, timestamp, *(str(fields.get(k, "-")) for k in _TEXT_FIELDS),
                                 fields["node"], fields.get("object", "-")]))
    return "".join(line + "\n" for line in out).encode("utf-8")
