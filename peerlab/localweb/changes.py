"""Pages that change on a schedule, for revisit tests: which pages change, how often, and how the server
answers conditional requests.

Each HTML page is given a period from `periods` by a hash of its host and path (None: it never changes); its
version at wall-clock time t is `floor((t - start) / period)`, and every version has its own body (a comment
naming it is appended), ETag and Last-Modified. A host answers `If-None-Match` / `If-Modified-Since` with
304 Not Modified when `conditional(host)` is true (by default half the hosts, chosen by hash), so both kinds of
unchanged revisit are exercised: a 304, and a 200 with the same payload.
"""

from __future__ import annotations

import email.utils
import hashlib
from dataclasses import dataclass

__all__ = ["ChangeSchedule"]


def _pick(text: str, n: int) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") % n


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeSchedule:
    start: float
    periods: tuple[float | None, ...] = (None, 4.0, 8.0)
    conditional_share: float = 0.5

    def period(self, host: str, path: str) -> float | None:
        return self.periods[_pick(f"{host}{path}", len(self.periods))]

    def version(self, host: str, path: str, now: float) -> int:
        period = self.period(host, path)
        return 0 if period is None else max(0, int((now - self.start) // period))

    def conditional(self, host: str) -> bool:
        return _pick(host, 1000) < self.conditional_share * 1000

    def validators(self, host: str, path: str, version: int) -> tuple[str, str]:
        """The (ETag, Last-Modified) of one version of a page."""
        period = self.period(host, path) or 0.0
        modified = int(self.start + version * period)
        tag = hashlib.blake2b(f"{host}{path}#{version}".encode(), digest_size=6).hexdigest()
        return f'"{tag}"', email.utils.formatdate(modified, usegmt=True)

    def not_modified(self, etag: str, last_modified: str, if_none_match: str | None,
                     if_modified_since: str | None) -> bool:
        """RFC 9110 13.1: If-None-Match decides when present; else If-Modified-Since."""
        if if_none_match is not None:
            return etag in [t.strip() for t in if_none_match.split(",")] or if_none_match.strip() == "*"
        if if_modified_since is not None:
            try:
                since = email.utils.parsedate_to_datetime(if_modified_since).timestamp()
                return email.utils.parsedate_to_datetime(last_modified).timestamp() <= since
            except (TypeError, ValueError):
                return False
        return False
