"""Plug-ins on a real crawl of the local web (one node in this process, over loopback): the examples' items are
exactly what the oracle expects, where the page work runs inline, in page threads or in page processes; a
plug-in raising on every tenth page loses no page; the items point at their WARC records."""

from __future__ import annotations

import gzip
import json

import pytest
from warcio.archiveiterator import ArchiveIterator
import trio

from peer.node import Node
from peer.plugins import read_items
from peer.plugins._running import MIN_PAGES
from peerlab.localweb.graph import SiteGraph

from .support.crawl import node_config, start_local_web, urls_fetched
from .support.plugin_web import check_items, example_plugins, expected_fetched

# whole crawls of the local web with plug-ins (10-16 s each): the slow tier
pytestmark = pytest.mark.slow


def warc_responses(directory) -> set[str]:
    uris = set()
    for path in sorted(directory.glob("*.warc.gz")):
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type == "response":
                    uris.add(record.rec_headers.get_header("WARC-Target-URI"))
    return uris


def stored_pages(graph, expected, port) -> set[str]:
    """The HTML pages the web answered 200 (the store keeps text/html and XHTML)."""
    out = set()
    for url in expected_fetched(graph, expected, port):
        host, _, path = url.split("://", 1)[1].partition("/")
        res = graph.resource(host.split(":")[0], "/" + path)  # the rewritten links' pages are not in the oracle's
        if res is not None and res.kind in ("html", "huge") and expected.statuses.get(url, res.status) == 200:
            out.add(url)
    return out


async def _crawl(graph, tmp_path, **overrides):
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        node = Node(node_config(tmp_path / "node", web, dns, **overrides))
        with trio.fail_after(120):
            await node.run()
        nursery.cancel_scope.cancel()
    return web, node


@pytest.mark.parametrize("where", [{}, {"page_threads": 2}, {"page_processes": 2}],
                         ids=["inline", "page-threads", "page-processes"])
async def test_examples_give_the_oracles_items(tmp_path, where):
    graph = SiteGraph.generate(seed=4, hosts=14, pages_per_host=6, structured=True)
    web, node = await _crawl(graph, tmp_path, plugins=example_plugins(), **where)
    expected = web.expected(max_body=node.cfg.max_body)
    fetched = urls_fetched(web, expected)
    assert fetched == expected_fetched(graph, expected, web.port)
    items = read_items(tmp_path / "node" / "items")
    check_items(graph, items, web.port)
    # an item's WARC location holds its page's response record
    item = next(i for i in items if i["type"] == "product")
    with open(tmp_path / "node" / "warc" / item["_warc"]["file"], "rb") as fh:
        fh.seek(item["_warc"]["offset"])
        head = gzip.GzipFile(fileobj=fh).read(2000)
    assert b"WARC-Type: response" in head and f"WARC-Target-URI: {item['_page']}".encode() in head
    status = node.final_status["plugins"]
    assert [p["use"] for p in status["chain"]] == ["peer.plugins:RuleExtractor", "peer.plugins:MainTextExtractor",
                                                   "examples.docs_filter:DocsFilter"]
    assert status["chain"][0]["items"] == len(graph.structured.products)
    assert status["items"]["spooled"] == 0 and status["items"]["exported"] == len(items)


async def test_a_plugin_raising_on_every_tenth_page_loses_no_page(tmp_path):
    graph = SiteGraph.generate(seed=4, hosts=14, pages_per_host=6, structured=True)
    raising = ("tests.support.plugin_cases:Raises", {"every": 10})
    web, node = await _crawl(graph, tmp_path, plugins=example_plugins(raising))
    expected = web.expected(max_body=node.cfg.max_body)
    assert urls_fetched(web, expected) == expected_fetched(graph, expected, web.port)
    items = read_items(tmp_path / "node" / "items")
    check_items(graph, [i for i in items if i.get("type") != "seen"], web.port)
    stored = node.final_status["stored"]
    raised = node.final_status["plugins"]["chain"][3]
    assert raised["errors"] > 0 and raised["state"] == "on"
    assert node.final_status["errors"]["plugin-error"] == raised["errors"]
    assert raised["errors"] + len([i for i in items if i.get("type") == "seen"]) == raised["pages"]
    # every page fetched whole with 200 is stored, the ones the plug-in raised on too
    warc = warc_responses(tmp_path / "node" / "warc")
    assert len(warc) == stored
    assert warc == stored_pages(graph, expected, web.port)
    assert json.dumps(raised["last_failure"]).count("raised on purpose") == 1


async def test_a_plugin_that_never_returns_in_a_page_worker_costs_no_page_and_is_switched_off(tmp_path):
    """In page processes a plug-in past its time is interrupted (each page waits its chain's limit, not the
    page worker's 60 s), the page is stored all the same, and after most pages failing the plug-in is off."""
    graph = SiteGraph.generate(seed=6, hosts=3, pages_per_host=12, features=False)
    hang = (("tests.support.plugin_cases:Sleeps", '{"seconds": 600.0}'),)
    web, node = await _crawl(graph, tmp_path, plugins=hang, plugin_timeout=0.2, page_processes=1)
    expected = web.expected(max_body=node.cfg.max_body)
    assert urls_fetched(web, expected) == set(expected.fetched)
    assert warc_responses(tmp_path / "node" / "warc") == {u for u in expected.fetched
                                                          if expected.statuses.get(u) == 200}
    [hung] = node.final_status["plugins"]["chain"]
    assert hung["timeouts"] >= MIN_PAGES and hung["errors"] == 0 and hung["items"] == 0
    assert hung["state"].startswith(f"switched off: failed on {MIN_PAGES} of {MIN_PAGES} pages (0 errors, "
                                    f"{MIN_PAGES} timeouts)")
    assert hung["pages"] < len(expected.fetched)  # not run once off
    assert node.final_status["page_workers"]["timeouts"] == 0  # no worker was killed for it
    errors = node.final_status["errors"]  # what the dashboard and the metrics show
    assert errors["plugin-timeout"] == hung["timeouts"] and errors["plugin-switched-off"] == 1
