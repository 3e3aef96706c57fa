"""When a page is worth rendering: the setting for its host (`never`, `auto`, `always`), the signals its HTML
shows, and what renders of pages like it found.

Signals (`auto`), read from the HTML the server sent:

- ``mount``: an element a script framework mounts into (``<div id="root">``, ``id="app"``, ``id="__next"``,
  ``id="__nuxt"``, ``ng-app``, ``data-reactroot``) with nothing in it, and a script on the page;
- ``noscript``: a ``<noscript>`` that asks for JavaScript;
- ``script-built``: scripts on the page and little visible text (under ``MIN_TEXT`` characters) with few
  links (under ``MIN_LINKS``): the body is left for a script to build.

A page without a script is never rendered under ``auto``. What a render found is learned per host and path
pattern (the path's last segment and its digits generalized: ``/js/item-12.html`` is ``/js/*``): once
``FRUITLESS`` renders in a row of one pattern found nothing new (no link the HTML did not have, and text
within ``SIMILAR_TEXT`` of it), later pages of that pattern are not rendered (``learned`` in the counts); a render
that finds something resets its pattern. The memory is bounded (`MAX_PATTERNS`, least recently used first).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from selectolax.lexbor import LexborHTMLParser

from peer.fetch.policy import host_matches

__all__ = ["MODES", "Decider", "Signals", "path_pattern", "signals"]

MODES = ("never", "auto", "always")
MIN_TEXT = 200
MIN_LINKS = 3
FRUITLESS = 2
SIMILAR_TEXT = 1.2
MAX_PATTERNS = 10_000
_MOUNTS = ("root", "app", "__next", "__nuxt", "svelte", "main-app", "react-root")
_NOSCRIPT = re.compile(r"javascript|enable js|js is|browser", re.I)
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class Signals:
    """What an HTML page shows of its scripts."""

    scripts: int
    text: int  # visible characters (whitespace runs as one)
    links: int
    mount: bool
    noscript: bool

    def reason(self) -> str | None:
        """The signal that asks for a render, or None."""
        if not self.scripts:
            return None
        if self.mount:
            return "mount"
        if self.noscript:
            return "noscript"
        if self.text < MIN_TEXT and self.links < MIN_LINKS:
            return "script-built"
        return None


def visible_text(tree: LexborHTMLParser) -> int:
    body = tree.body
    if body is None:
        return 0
    text = body.text(separator=" ", strip=True)
    return len(" ".join(text.split()))


def signals(html: bytes | str) -> Signals:
    """Read a page's signals (an unparseable page shows none)."""
    tree = LexborHTMLParser(html)
    scripts = len(tree.css("script"))
    mount = False
    for node in tree.css("[id], [ng-app], [data-reactroot]"):
        attrs = node.attributes
        if (attrs.get("id") in _MOUNTS or "ng-app" in attrs or "data-reactroot" in attrs) and not (
                node.child and (node.child.tag != "-text" or (node.text(deep=True) or "").strip())):
            mount = True
            break
    noscript = any(_NOSCRIPT.search(node.text(deep=True) or "") for node in tree.css("noscript"))
    links = len(tree.css("a[href]"))
    for node in tree.css("script, style, noscript, template"):
        node.decompose()
    return Signals(scripts=scripts, text=visible_text(tree), links=links, mount=mount, noscript=noscript)


def path_pattern(host: str, path: str) -> str:
    """The pattern a page's renders are learned under: host, the path's directories, its last segment as ``*``
    (a path that ends in ``/`` stays as it is), digits as ``N``."""
    path = path.split("?", 1)[0].split("#", 1)[0] or "/"
    head, _, last = path.rpartition("/")
    return host + _DIGITS.sub("N", head) + ("/*" if last else "/")


class Decider:
    """The node's decision (see the module's text): the default mode and the host rules ``(pattern, mode)``,
    first match first (``*`` after the others), as the fetch policies read ``[hosts."PATTERN"]`` tables."""

    def __init__(self, mode: str, rules: Sequence[tuple[str, str]] = ()) -> None:
        if mode not in MODES:
            raise ValueError(f"render must be one of {', '.join(MODES)}, got {mode!r}")
        for pattern, rule in rules:
            if rule not in MODES:
                raise ValueError(f"hosts {pattern!r}: render must be one of {', '.join(MODES)}, got {rule!r}")
        self.mode = mode
        # as the fetch policies read them: ``*`` sets every host's default, beneath the other patterns
        self.rules = [r for r in rules if r[0].strip() != "*"] + [r for r in rules if r[0].strip() == "*"]
        self._patterns: OrderedDict[str, int] = OrderedDict()  # pattern -> fruitless renders in a row
        self.counts = {"considered": 0, "rendered": 0, "learned": 0, "fruitful": 0, "fruitless": 0}
        self.reasons: dict[str, int] = {}

    @property
    def active(self) -> bool:
        """Whether any page may be rendered (a browser is needed)."""
        return self.mode != "never" or any(rule != "never" for _, rule in self.rules)

    def mode_for(self, host: str) -> str:
        for pattern, rule in self.rules:
            if host_matches(pattern, host):
                return rule
        return self.mode

    def decide(self, host: str, path: str, html: bytes) -> str | None:
        """Why to render this page (``always``, a signal's name), or None not to."""
        mode = self.mode_for(host)
        if mode == "never":
            return None
        self.counts["considered"] += 1
        if mode == "always":
            reason: str | None = "always"
        else:
            reason = signals(html).reason()
            if reason is not None and self._patterns.get(path_pattern(host, path), 0) >= FRUITLESS:
                self._patterns.move_to_end(path_pattern(host, path))
                self.counts["learned"] += 1
                return None
        if reason is not None:
            self.counts["rendered"] += 1
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        return reason

    def learn(self, host: str, path: str, *, new_links: int, text_before: int, text_after: int) -> bool:
        """Record what a render of the page found; True when it found something new."""
        fruitful = new_links > 0 or text_after > text_before * SIMILAR_TEXT + 50
        key = path_pattern(host, path)
        self.counts["fruitful" if fruitful else "fruitless"] += 1
        self._patterns[key] = 0 if fruitful else self._patterns.get(key, 0) + 1
        self._patterns.move_to_end(key)
        while len(self._patterns) > MAX_PATTERNS:
            self._patterns.popitem(last=False)
        return fruitful

