"""Plug-ins the tests load by name ("tests.support.plugin_cases:Class"): each does one thing a test needs."""

from __future__ import annotations

import json
import os
import time
import zlib

from peer.plugins import Decision


class Raises:
    """An extractor that raises on every `every`-th page (chosen by the URL, so the same in every process)."""

    version = "1"

    def __init__(self, every: int = 10) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.every = every

    def extract(self, page):
        if zlib.crc32(page.url.encode()) % self.every == 0:
            raise RuntimeError("raised on purpose")
        return [{"type": "seen", "length": len(page.body)}]


class Sleeps:
    """An extractor that takes `seconds` on every page."""

    def __init__(self, seconds: float = 5.0) -> None:
        self.seconds = seconds

    def extract(self, page):
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:  # busy, so that only an interruption ends it early
            pass
        return [{"slept": True}]


class NoOp:
    """Each kind, doing nothing: the benchmark's cost of a plug-in itself."""

    version = "1"

    def __init__(self, kind: str = "extract") -> None:
        if kind not in ("extract", "decide", "filter"):
            raise ValueError(f"kind is extract, decide or filter, got {kind!r}")

    def extract(self, page):
        return ()


class NoOpFilter:
    def filter(self, source_url, url, link):
        return url


class NoOpPageFilter:
    def decide(self, page):
        return None


class TreeUser:
    """A page filter that asks for the tree and says nothing."""

    needs_tree = True

    def decide(self, page):
        return None


class DropAll:
    """A page filter that keeps nothing and follows nothing."""

    def decide(self, page):
        return Decision(store=False, follow=False)


class Contexts:
    """A URL filter that writes each call's (source URL, URL, link tag or None) as a JSON line to `log` and drops
    the URLs whose path ends with one of `drop`."""

    def __init__(self, log: str, drop: list[str] | None = None) -> None:
        self.log = log
        self.drop = tuple(drop or ())

    def filter(self, source_url, url, link):
        with open(self.log, "a") as fh:
            fh.write(json.dumps([source_url, url, link.tag if link is not None else None]) + "\n")
        return None if self.drop and url.endswith(self.drop) else url


class RefusesWhere:
    """A page filter with no opinion that refuses to load (a bad setting) in a process whose environment has
    `variable` set: a chain that loads on some nodes and not on others."""

    version = "1"

    def __init__(self, variable: str = "PLUGIN_CASE_REFUSE") -> None:
        if os.environ.get(variable):
            raise ValueError(f"refuses to load where {variable} is set")

    def decide(self, page):
        return None
