"""Real documents for the local web: the HTML of Debian's python3-doc package, with its links made the web's own.

A document is cut at the value of every ``href`` of its ``<a>`` and ``<area>`` elements that is not a bare
fragment (``href="#x"`` stays as written: it names the page itself), and at its ``<link rel="canonical">``.
The web fills the cuts: each link slot gets the written form of a link the graph drew (``Link.href``) with the
original fragment kept, the canonical slot gets the page's own URL. Everything else (markup, text, entities,
inline scripts, relative ``src`` of stylesheets and images, which a crawler does not follow) is served as
shipped, so the crawler parses real markup while the graph, and so the oracle, decides where every link goes.

The package is optional: :func:`load_corpus` gives None when it is not installed, and the graph then serves
generated pages only (``SiteGraph.doc_hosts`` is 0; the benchmarks print it).
"""

from __future__ import annotations

import glob
import html
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["CORPUS_GLOBS", "Corpus", "Document", "load_corpus"]

#: Where Debian puts python3-doc's HTML (``apt-get install python3-doc``); the first that holds pages is used.
CORPUS_GLOBS = ("/usr/share/doc/python3/html", "/usr/share/doc/python3.*/html", "/usr/share/doc/python3-doc/html")
#: Documents outside these bounds are left out: the index pages (genindex-all.html is 2.5 MB, thousands of
#: links) are no page a site serves to every visitor, and tiny stubs are not documents.
MIN_BYTES = 8_000
MAX_BYTES = 160_000

# An <a> or <area> start tag's href value (Sphinx writes every attribute in double quotes; single quotes too).
_HREF = re.compile(r"""<(?:a|area)\b[^>]*?\bhref=(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
_CANONICAL = re.compile(r"""<link\b[^>]*?\brel="canonical"[^>]*?\bhref="([^"]*)\"""", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Document:
    """A real page cut at its link slots: ``pieces[k]`` is the text before slot ``k`` (one more piece than slots).

    ``slots[k]`` is the original fragment to keep after the new link (``"#os.path"`` or ``""``), or None for
    the canonical slot (filled with the page's own absolute URL)."""

    name: str
    pieces: tuple[str, ...]
    slots: tuple[str | None, ...]
    size: int
    self_links: int

    @property
    def link_slots(self) -> int:
        """How many links of the graph this document carries."""
        return sum(1 for s in self.slots if s is not None)

    def render(self, hrefs: Sequence[str], self_url: str) -> str:
        """The page with its link slots filled by ``hrefs`` (written forms, in order) and its canonical by
        ``self_url``; ``len(hrefs)`` must be :attr:`link_slots`."""
        if len(hrefs) != self.link_slots:
            raise ValueError(f"{self.name} has {self.link_slots} link slots, {len(hrefs)} hrefs given")
        out: list[str] = []
        k = 0
        for piece, slot in zip(self.pieces, self.slots):
            out.append(piece)
            if slot is None:
                out.append(html.escape(self_url))
            else:
                out.append(html.escape(hrefs[k] + slot))
                k += 1
        out.append(self.pieces[-1])
        return "".join(out)


def cut(name: str, text: str) -> Document:
    """Cut ``text`` at its link slots (see :class:`Document`)."""
    marks: list[tuple[int, int, str | None]] = []
    self_links = 0
    for m in _HREF.finditer(text):
        group = 1 if m.group(1) is not None else 2
        value = html.unescape(m.group(group))
        if value.startswith("#") or value == "":
            self_links += 1
            continue
        fragment = value[value.index("#"):] if "#" in value else ""
        marks.append((m.start(group), m.end(group), fragment))
    for m in _CANONICAL.finditer(text):
        marks.append((m.start(1), m.end(1), None))
    marks.sort()
    pieces: list[str] = []
    pos = 0
    for start, end, _ in marks:
        pieces.append(text[pos:start])
        pos = end
    pieces.append(text[pos:])
    return Document(name=name, pieces=tuple(pieces), slots=tuple(s for _, _, s in marks),
                    size=len(text.encode("utf-8")), self_links=self_links)


@dataclass(frozen=True, slots=True)
class Corpus:
    """The documents of one installed package, in a fixed order (sorted by path)."""

    root: str
    documents: tuple[Document, ...]


def find_root(globs: Sequence[str] = CORPUS_GLOBS) -> str | None:
    """The directory holding python3-doc's HTML, or None when the package is not installed."""
    for pattern in globs:
        for root in sorted(glob.glob(pattern)):
            if os.path.isfile(os.path.join(root, "index.html")):
                return os.path.realpath(root)
    return None


@lru_cache(maxsize=4)
def load_corpus(root: str | None = None) -> Corpus | None:
    """The documents under ``root`` (default: :func:`find_root`) between MIN_BYTES and MAX_BYTES, index pages
    left out; None when there is no such directory or no document in it."""
    root = root if root is not None else find_root()
    if root is None or not os.path.isdir(root):
        return None
    docs: list[Document] = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.html"), recursive=True)):
        rel = os.path.relpath(path, root)
        base = os.path.basename(rel)
        if base.startswith(("genindex", "py-modindex", "search")) or not MIN_BYTES <= os.path.getsize(path) <= MAX_BYTES:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            docs.append(cut(rel, f.read()))
    return Corpus(root=root, documents=tuple(docs)) if docs else None
