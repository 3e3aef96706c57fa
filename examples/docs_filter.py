"""A URL filter for a documentation site: follow its chapters once each, not their print versions, not the
archive of old versions, and not the same chapter again under tracking parameters.

    [[plugins]]
    use = "examples.docs_filter:DocsFilter"
    hosts = ["docs.example.org"]          # the sites it applies to (none: every site)
    drop = ["/docs/print/", "/docs/archive/"]
    strip_params = ["utm_"]

Links to other sites pass untouched.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from peer.plugins import Link


class DocsFilter:
    version = "1"

    def __init__(self, hosts: list[str] | None = None, drop: list[str] | None = None,
                 strip_params: list[str] | None = None) -> None:
        self.hosts = frozenset(h.lower() for h in hosts or ())
        self.drop = tuple(drop if drop is not None else ("/docs/print/", "/docs/archive/"))
        self.strip = tuple(strip_params if strip_params is not None else ("utm_",))
        if not all(isinstance(x, str) and x for x in (*self.hosts, *self.drop, *self.strip)):
            raise ValueError("hosts, drop and strip_params are lists of non-empty strings")

    def filter(self, source_url: str, url: str, link: Link | None) -> str | None:
        parts = urlsplit(url)
        if self.hosts and (parts.hostname or "") not in self.hosts:
            return url
        if parts.path.startswith(self.drop):
            return None
        if parts.query and self.strip:
            kept = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if not k.startswith(self.strip)]
            return urlunsplit(parts._replace(query=urlencode(kept)))
        return url
