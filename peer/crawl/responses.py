"""What the crawler reads off a fetch's response: a header, Retry-After as seconds, the headers that describe the
body as it is stored, and the status classes a host turn acts on. Shared by the host turn (`hostturns`), the
sitemap turn (`sitemapturns`), the page's storing (`pagework`) and the revisit schedule (`revisits`).
"""

from __future__ import annotations

import email.utils
import math

from peer.fetch.http import Response

__all__ = ["REDIRECTS", "RETRY_STATUSES", "as_decoded", "header", "retry_after"]

REDIRECTS = frozenset((301, 302, 303, 307, 308))
RETRY_STATUSES = frozenset((429, 503))

_DECODED_DROP = frozenset(("content-encoding", "transfer-encoding", "content-length"))


def as_decoded(resp: Response) -> list[tuple[str, str]]:
    """Response headers that describe the body as stored: the fetcher hands us the body with its
    Content-Encoding undone and de-chunked, so those headers go and Content-Length is the stored length."""
    if not any(k in _DECODED_DROP for k, _ in resp.headers):
        return resp.headers
    headers = [(k, v) for k, v in resp.headers if k not in _DECODED_DROP]
    headers.append(("content-length", str(len(resp.body))))
    return headers


def header(resp: Response, name: str) -> str | None:
    for key, value in resp.headers:
        if key == name:
            return value
    return None


def retry_after(resp: Response, now: float) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None when absent or unreadable."""
    value = header(resp, "retry-after")
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        # str.isdigit is true of other scripts' digits and of '²', which int() cannot read or reads as a number
        # the server did not mean: only ASCII delta-seconds count, and a huge one is capped (by max_backoff later).
        if not value.isascii():
            return None
        return float(int(value[:12]))
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, when - now) if math.isfinite(when) else None
