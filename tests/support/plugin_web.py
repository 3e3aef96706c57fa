"""The examples' chain and what the local web's oracle says it must give (tests of plug-ins on real crawls)."""

from __future__ import annotations

import json
from pathlib import Path

from peer.config import load

ROOT = Path(__file__).resolve().parents[2]


def example_plugins(*extra: tuple[str, dict]) -> tuple[tuple[str, str], ...]:
    """examples/products.toml, the main text of the articles, the documentation filter (and `extra`)."""
    products = load(toml=ROOT / "examples" / "products.toml", env={}).plugins
    return (*products, ("peer.plugins:MainTextExtractor", json.dumps({"url": "/articles/a", "min_chars": 100})),
            ("examples.docs_filter:DocsFilter", "{}"),
            *((use, json.dumps(settings)) for use, settings in extra))


def expected_fetched(graph, expected, port: int) -> set[str]:
    """The oracle's fetched set with the documentation filter on: its dropped pages never, its rewritten links
    fetched under their bare URLs."""
    truth = graph.structured
    fetched = set(expected.fetched) - {truth.url(p, port) for p in truth.docs_dropped}
    fetched -= {truth.url(p, port) for p in truth.docs_rewritten}
    return fetched | {truth.url(p, port) for p in truth.docs_rewritten.values()}


def check_items(graph, items: list[dict], port: int) -> None:
    """Exactly one item per product page, the oracle's fields; one article per article page, its paragraphs in
    its text and its language; every item with its page, fetch time and WARC record."""
    truth = graph.structured
    products = {i["_page"]: i for i in items if i.get("type") == "product"}
    articles = {i["_page"]: i for i in items if i.get("type") == "article"}
    assert len(products) + len(articles) == len(items), "no other item, and none twice"
    assert set(products) == {truth.url(p, port) for p in truth.products}
    for path, want in truth.products.items():
        got = products[truth.url(path, port)]
        assert {k: v for k, v in got.items() if not k.startswith("_")} == want
    assert set(articles) == {truth.url(p, port) for p in truth.articles}
    for path, want in truth.articles.items():
        got = articles[truth.url(path, port)]
        assert got["title"] == want["title"] and got["language"] == want["language"]
        assert all(p in got["text"] for p in want["paragraphs"]), got["text"]
        assert "Copyright" not in got["text"] and "Docs" not in got["text"]
    for item in items:
        assert item["_fetched_at"] > 0 and isinstance(item["_seq"], int)
        assert item["_warc"] is not None and item["_warc"]["file"].endswith(".warc.gz")
