"""Every relative link between the docs reaches a file that exists and, with a `#anchor`, a heading in it.

The README links each figure and guarantee to the section that has its command, date and limits; a section
renamed without its links leaves a reader at the top of a long page.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "deploy" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]


def slug(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"^#{1,6}\s+(.*)", line)
        if heading:
            base = slug(heading.group(1))
            n = counts.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            counts[base] = n + 1
    return found


def links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"^[a-z]+:", t)]


def test_slug_matches_github() -> None:
    assert slug("View change at total weight 10,000") == "view-change-at-total-weight-10000"
    assert slug("Store check (`storage/_check.py`, `peerd check`)") == "store-check-storage_checkpy-peerd-check"
    assert anchors("# A\n## B\n```\n# not a heading\n```\n## B\n") == {"a", "b", "b-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target}: no such heading")
    assert broken == []
