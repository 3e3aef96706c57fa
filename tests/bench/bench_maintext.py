"""The main-text extractors compared on real pages: Resiliparse (the built-in `MainTextExtractor`'s) and
trafilatura, for CPU per page and quality, in the same run.

Run: ``python -m tests.bench.bench_maintext [--pages 150]`` (needs ``apt-get install python3-doc`` for the pages
and ``pip install trafilatura`` for the comparison).

The pages are the Python documentation's library pages (``/usr/share/doc/python3-dev/html/library/*.html``),
real markup with navigation, sidebars and footers; each page's reStructuredText source
(``_sources/library/*.rst.txt``) is its known main text. Quality is the token F1 (words of three letters or
more, as a multiset) of what each extractor gives against that source; CPU is process time per page. Each
extractor runs twice, in turn.
"""

from __future__ import annotations

import argparse
import collections
import re
import time
from pathlib import Path

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLTree

ROOT = Path("/usr/share/doc/python3-dev/html")


def _tokens(text: str) -> collections.Counter[str]:
    return collections.Counter(re.findall(r"[A-Za-z]{3,}", text.lower()))


def f1(got: str, truth: str) -> float:
    a, b = _tokens(got), _tokens(truth)
    common = sum((a & b).values())
    if not common:
        return 0.0
    precision, recall = common / sum(a.values()), common / sum(b.values())
    return 2 * precision * recall / (precision + recall)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_maintext", description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=150)
    args = p.parse_args()
    try:
        import trafilatura  # noqa: PLC0415 - the reference is optional
    except ImportError as exc:
        raise SystemExit("bench_maintext: pip install trafilatura (the reference)") from exc
    pages = []
    for src in sorted((ROOT / "_sources" / "library").glob("*.rst.txt"))[: args.pages]:
        page = ROOT / "library" / (src.name[: -len(".rst.txt")] + ".html")
        if page.exists():
            pages.append((page.read_text(encoding="utf-8"), src.read_text(encoding="utf-8")))
    if not pages:
        raise SystemExit(f"bench_maintext: no pages under {ROOT} (apt-get install python3-doc)")
    extractors = {
        "resiliparse": lambda h: extract_plain_text(HTMLTree.parse(h), main_content=True),
        "trafilatura": lambda h: trafilatura.extract(h, include_comments=False, include_tables=True) or "",
    }
    size = sum(len(h) for h, _ in pages) / len(pages) / 1024
    print(f"{len(pages)} pages of python3-doc, {size:.0f} KiB on average")
    for _round in range(2):
        for name, fn in extractors.items():
            start = time.process_time()
            outs = [fn(h) for h, _ in pages]
            cpu = (time.process_time() - start) / len(pages) * 1e3
            quality = sum(f1(o, s) for o, (_, s) in zip(outs, pages)) / len(pages)
            print(f"  {name:<12} {cpu:7.2f} ms CPU/page   token F1 against the source {quality:.3f}")


if __name__ == "__main__":
    main()
