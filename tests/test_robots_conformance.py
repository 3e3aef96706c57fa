"""Every conformance case (RFC 9309's examples, Google's reference parser) against our parser and matcher."""

from __future__ import annotations

import pytest

from peer.crawl.robots import escape_pattern, parse, path_params_query, can_fetch
from tests.support.robots_cases import CASES, Case


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Case) -> None:
    assert can_fetch(case.robots, case.agent, case.url) is case.allowed


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("", "/"), ("http://www.example.com", "/"), ("http://www.example.com/", "/"),
        ("http://www.example.com/a", "/a"), ("http://www.example.com/a/", "/a/"),
        ("http://www.example.com/a/b?c=http://d.e/", "/a/b?c=http://d.e/"),
        ("http://www.example.com/a/b?c=d&e=f#fragment", "/a/b?c=d&e=f"), ("example.com", "/"),
        ("example.com/", "/"), ("example.com/a", "/a"), ("example.com/a/", "/a/"),
        ("example.com/a/b?c=d&e=f#fragment", "/a/b?c=d&e=f"), ("a", "/"), ("a/", "/"), ("/a", "/a"),
        ("a/b", "/b"), ("example.com?a", "/?a"), ("example.com/a;b#c", "/a;b"), ("//a/b/c", "/b/c"),
    ],
)
def test_path_params_query(url: str, path: str) -> None:
    assert path_params_query(url) == path


@pytest.mark.parametrize(
    ("pattern", "escaped"),
    [("http://www.example.com", "http://www.example.com"), ("/a/b/c", "/a/b/c"), ("á", "%C3%A1"),
     ("%aa", "%AA"), ("/SanJoséSellers", "/SanJos%C3%A9Sellers"), ("%zz%4a", "%zz%4A"), ("%", "%")],
)
def test_escape_pattern(pattern: str, escaped: str) -> None:
    assert escape_pattern(pattern) == escaped


def test_sitemap_lines_anywhere() -> None:
    loc = "http://foo.bar/sitemap.xml"
    body = "User-Agent: foo\nAllow: /some/path\nUser-Agent: bar\n\n\n"
    assert parse(body + f"Sitemap: {loc}\n").sitemaps == (loc,)
    assert parse(f"Sitemap: {loc}\n" + body).sitemaps == (loc,)
