"""A node crawls the local web with ``--render auto`` and a real headless chromium: every link only a script
writes is found (the oracle's ``scripted``), the browser's requests keep the host's politeness (the web's own
log), few pages are rendered, renders of a path pattern that find nothing are learned, and the WARC files hold
the browser's fetches and each rendered DOM as a conversion record."""

from __future__ import annotations

import itertools
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from storage import CaptureSearch, find_captures

from peer.node import Node
from peer.render import BrowserError, find_chromium
from peer.render.browser import SCRATCH_NOTE
from peer.render.decision import FRUITLESS
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import max_concurrent_connections_per_host

from .support.crawl import node_config, start_local_web, urls_fetched

pytestmark = pytest.mark.slow

try:
    find_chromium()
except BrowserError as exc:  # pragma: no cover - the suite's machine has Debian's chromium
    pytest.skip(str(exc), allow_module_level=True)

DELAY = 0.1


def spacing_violations(log, graph, delay: float, tolerance: float = 0.02) -> list[tuple[str, float]]:  # type: ignore[no-untyped-def]
    """Consecutive requests to one host that started closer than `delay` (robots.txt and the redirects it
    follows left out: the crawler follows those at once, before it knows the host's delay)."""
    by_host = defaultdict(list)
    for record in log:
        spec = graph.robots(record.host)
        if record.path == "/robots.txt" or (spec is not None and record.path == spec.redirect_path):
            continue
        by_host[record.host].append(record.start)
    out = []
    for host, starts in by_host.items():
        for a, b in itertools.pairwise(sorted(starts)):
            if b - a < delay - tolerance:
                out.append((host, b - a))
    return out


async def test_render_auto_finds_every_scripted_link_politely(tmp_path) -> None:  # type: ignore[no-untyped-def]
    graph = SiteGraph.generate(seed=3, hosts=16, pages_per_host=8)
    # a browser profile an earlier node killed left in this data dir, with its temporary files' directory
    stale = tmp_path / "node" / "browser" / "peercrawl-browser-killed"
    stale.mkdir(parents=True)
    stale_scratch = Path(tempfile.mkdtemp(prefix="peercrawl-browser-"))
    (stale / SCRATCH_NOTE).write_text(str(stale_scratch))
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        node = Node(node_config(tmp_path / "node", web, dns, render="auto", delay=DELAY, render_timeout=15.0))
        with trio.fail_after(240):
            await node.run()
        nursery.cancel_scope.cancel()
    # the node removed what the killed one left, and its own browsers left nothing
    assert list((tmp_path / "node" / "browser").iterdir()) == [] and not stale_scratch.exists()
    expected = web.expected(max_body=node.cfg.max_body, render=True)
    plain = web.expected(max_body=node.cfg.max_body)
    fetched = urls_fetched(web, expected)
    subresources = set(graph.feature("script_resource", port=web.port))
    assert expected.scripted and expected.scripted <= expected.fetched
    assert expected.scripted & plain.fetched == set(), "the oracle without rendering must not reach them"
    assert expected.scripted - fetched == set(), "links only a script writes were missed"
    assert expected.fetched - fetched == set()
    assert fetched - expected.fetched <= subresources, "only the pages' scripts and their data came extra"
    assert fetched & subresources, "the browser's requests went out through the node"
    # politeness of every request, the browser's among them, by the web's own log
    assert max(max_concurrent_connections_per_host(web.log).values()) == 1
    assert spacing_violations(web.log, graph, DELAY) == []
    # few pages rendered; the quiet pattern learned after FRUITLESS renders
    counts = node.stats.render
    pages = node.stats.status["2xx"]
    assert counts["rendered"] <= 0.10 * pages, (counts, pages)
    assert node.crawler.render_decider.counts["learned"] >= 1
    quiet = set(graph.feature("script_quiet", port=web.port))
    conversions: dict[str, bytes] = {}
    responses: set[str] = set()
    for path in sorted((tmp_path / "node" / "warc").glob("*.warc.gz")):
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                uri = record.rec_headers.get_header("WARC-Target-URI")
                if record.rec_type == "conversion":
                    conversions[uri] = record.content_stream().read()
                    assert record.rec_headers.get_header("WARC-Refers-To-Target-URI") == uri
                elif record.rec_type == "response":
                    responses.add(uri)
    assert len(set(conversions) & quiet) == FRUITLESS
    home = web.url(graph.role("content").name, "/app/home.html")
    assert b"/app/made-1.html" in conversions[home] and home in responses
    assert subresources & fetched <= responses, "every fetch of the browser is in the WARC files"
    assert set(conversions) <= responses
    # the rendered DOM is in the node's index (what GET /cdx reads): a line without a status beside the response's
    captures = find_captures(tmp_path / "node" / "warc", CaptureSearch.of(home))
    assert sorted(c.fields.get("status", "none") for c in captures) == ["200", "none"], captures
