"""The crawl settings an operator may change while the crawl runs: scope rules, budgets, and the paused flag.

A `CrawlSettings` record is what every node of a cluster crawls by. It starts from the node's configuration
(flags and TOML) and changes at runtime through the control API (`peerctl scope`, `peerctl pause`,
`peerctl resume`); the cluster gossips it (`protocol.Settings`) so every member, and every node that joins
later, crawls by the same record.

Which record wins: the higher `rank()`, that is `(version, digest)`. A runtime change takes the highest version
the node knows plus one, so it beats everything before it; two records of one version (two changes made at the
same moment on two nodes, or two founders started with different flags) are ordered by the digest of their
body, so every member picks the same one whatever the order of arrival. A node that starts a cluster takes its
configuration as version 1; a node that joins one takes it as version 0, so the cluster's record replaces it.
Records changed at runtime (version 2 and up) are written to `DATA_DIR/settings.json` and beat the
configuration after a restart.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from peer.config import Config
from peer.crawl.urls import Scope

__all__ = ["CrawlSettings", "SettingsError", "SettingsFile", "CONFIG_VERSION_FOUNDER", "CONFIG_VERSION_JOINER"]

#: The version of a node's configured settings when it starts a cluster (or runs alone) ...
CONFIG_VERSION_FOUNDER = 1
#: ... and when it joins one: any record the cluster has replaces it.
CONFIG_VERSION_JOINER = 0
#: Patterns per list and characters per pattern: the record is gossiped whole (protocol max_settings, 64 KiB).
MAX_PATTERNS = 200
MAX_PATTERN_LENGTH = 256
#: The record's JSON body, under the protocol's max_settings (64 KiB).
MAX_BODY = 60_000

_LISTS = ("include", "exclude", "allowed_hosts", "denied_hosts")
_INTS = ("max_depth", "max_pages_per_host", "max_bytes_per_host", "max_url_length", "max_query_params")
#: The fields an operator may change (`paused` through pause/resume, the rest through scope).
CHANGEABLE = frozenset(_LISTS + _INTS + ("paused",))


class SettingsError(ValueError):
    """A settings change or record is wrong; the message names the field (the caller's fault)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CrawlSettings:
    """What may be crawled and whether crawling goes on; -1 means "no limit" for every integer bound.

    `include`/`exclude`: regular expressions searched in the normalized URL (`re.search`; anchor with ^ and $):
    with any include pattern a URL must match one, and it must match no exclude pattern. `allowed_hosts`/
    `denied_hosts`: host suffixes ("example.com" is the host and its subdomains, "*.example.com" only the
    subdomains). `max_depth`: links from a seed. `max_pages_per_host`/`max_bytes_per_host`: what the host's owner
    fetches from one host, counted with the host's state (it moves with the host). `max_url_length` and
    `max_query_params`: bounds on a URL's length and its number of query parameters.
    """

    version: int = CONFIG_VERSION_FOUNDER
    origin: str = ""
    paused: bool = False
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    denied_hosts: tuple[str, ...] = ()
    max_depth: int = -1
    max_pages_per_host: int = -1
    max_bytes_per_host: int = -1
    max_url_length: int = 2048
    max_query_params: int = -1

    @classmethod
    def from_config(cls, cfg: Config, *, origin: str, joining: bool) -> CrawlSettings:
        settings = cls(
            version=CONFIG_VERSION_JOINER if joining else CONFIG_VERSION_FOUNDER,
            origin=origin,
            include=cfg.include,
            exclude=cfg.exclude,
            allowed_hosts=cfg.allowed_hosts,
            denied_hosts=cfg.denied_hosts,
            max_depth=cfg.max_depth,
            max_pages_per_host=cfg.max_pages_per_host,
            max_bytes_per_host=cfg.max_bytes_per_host,
            max_url_length=cfg.max_url_length,
            max_query_params=cfg.max_query_params,
        )
        settings.scope()  # a bad pattern in the configuration is refused at start, with its name
        return settings

    # -- the record on the wire and on disk --

    def body(self) -> str:
        """The rules as a JSON object (without version and origin), in a canonical form."""
        return json.dumps(self._rules(), sort_keys=True, separators=(",", ":"))

    def _rules(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in ("version", "origin")}

    def digest(self) -> int:
        return int.from_bytes(hashlib.blake2b(self.body().encode(), digest_size=8).digest(), "big")

    def rank(self) -> tuple[int, int]:
        """Of two records the higher rank wins on every node."""
        return self.version, self.digest()

    @classmethod
    def from_record(cls, version: int, origin: str, body: str) -> CrawlSettings:
        """A record from a peer or from disk; a malformed one raises SettingsError."""
        try:
            rules = json.loads(body)
        except ValueError as exc:
            raise SettingsError(f"settings record is not JSON: {exc}") from exc
        if not isinstance(rules, dict):
            raise SettingsError("settings record is not a JSON object")
        return cls(version=version, origin=origin).changed(rules, version=version, origin=origin)

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "origin": self.origin, **self._rules()}

    # -- changes --

    def changed(self, changes: Mapping[str, Any], *, version: int, origin: str) -> CrawlSettings:
        """These settings with `changes` applied (field -> value, only fields in CHANGEABLE), checked."""
        if not isinstance(changes, Mapping):
            raise SettingsError("expected a JSON object of settings")
        unknown = sorted(set(changes) - CHANGEABLE)
        if unknown:
            raise SettingsError(f"unknown settings {unknown}; the changeable ones are {sorted(CHANGEABLE)}")
        values: dict[str, Any] = {}
        for name, value in changes.items():
            if name in _LISTS:
                if isinstance(value, str) or not isinstance(value, (list, tuple)):
                    raise SettingsError(f"{name}: expected a list of strings, got {type(value).__name__}")
                if len(value) > MAX_PATTERNS:
                    raise SettingsError(f"{name}: at most {MAX_PATTERNS} patterns, got {len(value)}")
                items = []
                for item in value:
                    if not isinstance(item, str) or not item or len(item) > MAX_PATTERN_LENGTH:
                        raise SettingsError(f"{name}: each pattern is a non-empty string of at most "
                                            f"{MAX_PATTERN_LENGTH} characters, got {str(item)[:40]!r}")
                    items.append(item)
                values[name] = tuple(items)
            elif name in _INTS:
                if isinstance(value, bool) or not isinstance(value, int) or value < -1:
                    raise SettingsError(f"{name}: expected an integer >= -1 (-1: no limit), got {value!r}")
                values[name] = value
            else:  # paused
                if not isinstance(value, bool):
                    raise SettingsError(f"{name}: expected true or false, got {value!r}")
                values[name] = value
        new = replace(self, version=version, origin=origin, **values)
        if new.max_url_length < 1:
            raise SettingsError(f"max_url_length: expected an integer >= 1, got {new.max_url_length}")
        new.scope()
        size = len(new.body().encode())
        if size > MAX_BODY:
            raise SettingsError(f"the settings would take {size} bytes; at most {MAX_BODY} are gossiped")
        return new

    def scope(self) -> Scope:
        """The URL scope these settings define; a bad pattern raises SettingsError naming it."""
        try:
            return Scope(
                allowed_hosts=self.allowed_hosts,
                denied_hosts=self.denied_hosts,
                include=self.include,
                exclude=self.exclude,
                max_depth=None if self.max_depth < 0 else self.max_depth,
                max_url_length=self.max_url_length,
                max_query_params=None if self.max_query_params < 0 else self.max_query_params,
            )
        except (ValueError, re.error) as exc:
            raise SettingsError(str(exc)) from exc


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


class SettingsFile:
    """`DATA_DIR/settings.json`: the last record changed at runtime, so a restart crawls by it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> CrawlSettings | None:
        """The saved record; None when there is none. A damaged file is an error naming the file."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise SettingsError(f"settings file {self.path}: {exc}; remove it to crawl by the configuration") from exc
        try:
            version, origin = int(data.pop("version")), str(data.pop("origin"))
            return CrawlSettings.from_record(version, origin, json.dumps(data))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SettingsError(f"settings file {self.path}: {exc}; remove it to crawl by the configuration") from exc

    def save(self, settings: CrawlSettings) -> None:
        """Write atomically (a temporary file renamed over the old one)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(settings.as_dict(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
