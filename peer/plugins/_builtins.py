"""Two built-in plug-ins: the main text of articles (`MainTextExtractor`) and a page filter by content type and
language (`ContentFilter`).

The main text comes from Resiliparse (``resiliparse.extract.html2text``, main-content mode); on 150 pages of
the Python documentation (python3-doc), against each page's reStructuredText source, it scored a token F1 of
0.905 at 4-5 ms of CPU per page, and trafilatura 0.891 at 73-102 ms (docs/plugins.md has the command). Its
fast language detector (``resiliparse.parse.lang.detect_fast``) is the filter's last resort.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLTree
from resiliparse.parse.lang import detect_fast

from peer.plugins._api import Decision, FetchedPage

__all__ = ["ContentFilter", "MainTextExtractor", "page_language"]

_HTML_LANG = re.compile(r"<html\b[^>]*?\blang\s*=\s*[\"']?([A-Za-z]{2,3})", re.IGNORECASE)


def page_language(page: FetchedPage, *, detect: bool = True) -> str | None:
    """The page's language (ISO 639-1, lower-case): ``<html lang>``, else Content-Language, else (``detect``)
    guessed from its text; None when none says and the guess is unsure."""
    match = _HTML_LANG.search(page.text, 0, 4096)
    if match:
        return match.group(1).lower()
    header = page.headers.get("content-language", "").split(",")[0].strip()
    if header:
        return header.split("-")[0].lower()
    if not detect:
        return None
    text = extract_plain_text(HTMLTree.parse(page.text), main_content=True)
    if len(text) < 40:
        return None
    lang, _score = detect_fast(text[:4000])
    return None if lang in ("", "unknown") else lang


class MainTextExtractor:
    """``{"type": "article", "title", "text", "language"}`` for each HTML page whose URL matches ``url`` (a
    regular expression, default every page) and whose main text has at least ``min_chars`` characters."""

    version = "1"
    needs_tree = False

    def __init__(self, url: str = "", min_chars: int = 200) -> None:
        try:
            self.url = re.compile(url)
        except re.error as exc:
            raise ValueError(f"url: {exc}") from exc
        if not isinstance(min_chars, int) or min_chars < 0:
            raise ValueError(f"min_chars must be an integer >= 0, got {min_chars!r}")
        self.min_chars = min_chars

    def extract(self, page: FetchedPage) -> list[dict[str, Any]]:
        if page.mime not in ("", "text/html", "application/xhtml+xml") or not self.url.search(page.url):
            return []
        tree = HTMLTree.parse(page.text)
        text = extract_plain_text(tree, main_content=True, alt_texts=False, comments=False)
        text = "\n".join(line.strip() for line in text.splitlines() if line.strip())
        if len(text) < self.min_chars:
            return []
        title = tree.title.strip() if tree.title else None
        return [{"type": "article", "title": title or None, "text": text,
                 "language": page_language(page, detect=True)}]


class ContentFilter:
    """Keep only pages of the given content types and languages. A page that is not kept is not stored; its
    links are followed unless ``follow_others = false`` (an English page may be linked from a French one)."""

    version = "1"
    needs_tree = False

    def __init__(self, types: Iterable[str] = (), languages: Iterable[str] = (), follow_others: bool = True,
                 detect: bool = True) -> None:
        self.types = frozenset(t.lower() for t in types)
        self.languages = frozenset(lang.lower() for lang in languages)
        if not self.types and not self.languages:
            raise ValueError("give types, languages or both")
        if not isinstance(follow_others, bool) or not isinstance(detect, bool):
            raise ValueError("follow_others and detect are true or false")
        self.other = Decision(store=False, follow=follow_others)
        self.detect = detect

    def decide(self, page: FetchedPage) -> Decision | None:
        if self.types and page.mime not in self.types:
            return self.other
        if self.languages and page.mime in ("", "text/html", "application/xhtml+xml"):
            lang = page_language(page, detect=self.detect)
            if lang not in self.languages:
                return self.other
        return None
