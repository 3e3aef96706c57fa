"""A single node crawls the local web over real loopback sockets, through the test DNS server.

The referees are independent of the crawler: the oracle (computed by the web's generator from its own
structured rules) says which URLs must be fetched and which must never be; the web server's request log says
what really happened, including how many connections each host saw at once and the spacing of requests.
"""

from __future__ import annotations

import json

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import crawl_delay_violations, max_concurrent_connections_per_host, requested_urls
from peer.control import auth_headers
from peer.node import Node

from .support.crawl import node_config, start_local_web, urls_fetched


async def _crawl(graph, tmp_path, **overrides):
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        node = Node(node_config(tmp_path / "node", web, dns, **overrides))
        with trio.fail_after(120):
            await node.run()
        nursery.cancel_scope.cancel()
    return web, node


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 5], ids=["default-window", "window-of-5-hosts"])
async def test_crawl_fetches_exactly_the_reachable_and_allowed_set(tmp_path, window):
    graph = SiteGraph.generate(seed=3, hosts=24, pages_per_host=12)
    # a window of 5 hosts in memory: the other hosts wait on disk and come in as hosts empty or rotate out
    web, node = await _crawl(graph, tmp_path, **({} if window is None else {"max_active_hosts": window,
                                                                              "host_window_turns": 3}))
    expected = web.expected(max_body=node.cfg.max_body)
    fetched = urls_fetched(web, expected)
    assert expected.fetched, "the oracle must expect something"
    assert expected.fetched - fetched == set(), "pages a correct crawler fetches were missed"
    assert fetched - expected.fetched == set(), "pages outside the reachable-and-allowed set were requested"
    assert fetched & expected.disallowed == set()
    assert fetched & expected.never_requested == set()
    # politeness, judged by the web's own log
    conc = max_concurrent_connections_per_host(web.log)
    assert max(conc.values()) == 1, {h: n for h, n in conc.items() if n > 1}
    assert crawl_delay_violations(web.log, graph) == []
    # nothing fetched twice except URLs the web answered 429/503 first
    counts = requested_urls(web.log, port=web.port)
    twice = {u for u, n in counts.items() if n > 1 and u not in expected.robots}
    assert twice <= set(expected.retried)
    # one robots.txt request per host that was visited
    robots = [u for u, n in counts.items() if u.endswith("/robots.txt")]
    assert all(counts[u] <= 1 + 2 * node.cfg.max_retries for u in robots)
    # gzip-encoded pages are stored decoded, with headers that say so
    gz = set(graph.feature("gzip", port=web.port))
    stored = {}
    for path in sorted((tmp_path / "node" / "warc").glob("*.warc.gz")):
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                uri = record.rec_headers.get_header("WARC-Target-URI")
                if record.rec_type == "response" and uri in gz:
                    stored[uri] = (record.http_headers.get_header("Content-Encoding"),
                                   record.content_stream().read())
    assert set(stored) == gz & expected.fetched and stored
    assert all(enc is None and b"<html" in body.lower() for enc, body in stored.values())
    st = node.final_status
    assert st["done"] is True and st["queue"]["urls"] == 0 and st["queue"]["in_flight"] == 0
    assert st["pages"] >= len(expected.fetched)
    # the crawl log tells a URL robots.txt forbids (-9998) from one whose host's robots.txt stayed unreachable (-61)
    log = [json.loads(line) for line in (tmp_path / "node" / "crawl-log" / "crawl.jsonl").read_text().splitlines()]
    unreachable = graph.role("robots-500").name
    codes = {(r["status"], r["annotations"]) for r in log if r["url"].split("/")[2].split(":")[0] == unreachable}
    assert codes == {(-61, "robots-unavailable")}, codes
    forbidden = {r["url"] for r in log if r["status"] == -9998}
    assert forbidden and all(r["annotations"] == "robots" for r in log if r["status"] == -9998)
    assert forbidden <= expected.disallowed and not forbidden & fetched
    if window is not None:
        assert node.crawler.sched.spills > 0 and st["queue"]["hosts_known"] <= window, "the window was used"


@pytest.mark.parametrize("where", [{}, {"page_threads": 3},
                                   pytest.param({"page_processes": 2}, marks=pytest.mark.slow)],  # processes
                         ids=["inline", "page-threads", "page-processes"])
async def test_pages_land_in_warc_readable_by_warcio(tmp_path, where):
    graph = SiteGraph.generate(seed=5, hosts=6, pages_per_host=8, features=False)
    web, node = await _crawl(graph, tmp_path, **where)
    warcs = sorted((tmp_path / "node" / "warc").glob("*.warc.gz"))
    assert warcs
    responses, requests = {}, 0
    for path in warcs:
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type == "response":
                    responses[record.rec_headers.get_header("WARC-Target-URI")] = record.content_stream().read()
                elif record.rec_type == "request":
                    requests += 1
    expected = web.expected(max_body=node.cfg.max_body)
    html = {u for u in expected.fetched if expected.statuses.get(u) == 200}
    assert set(responses) == html
    assert requests == len(responses)
    some = sorted(html)[0]
    assert b"<html" in responses[some].lower()
    assert node.final_status["stored"] == len(responses)  # counted once each, whichever thread stored it


async def test_depth_limit_and_store_none(tmp_path):
    graph = SiteGraph.generate(seed=9, hosts=8, pages_per_host=10, features=False)
    web, node = await _crawl(graph, tmp_path, max_depth=1, store="none")
    expected = web.expected(max_body=node.cfg.max_body, max_depth=1)
    assert urls_fetched(web, expected) == set(expected.fetched)
    assert not list((tmp_path / "node" / "warc").glob("*.warc.gz"))


async def test_max_pages_per_host_and_metrics_while_running(tmp_path):
    import httpx

    graph = SiteGraph.generate(seed=13, hosts=5, pages_per_host=12, features=False)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        node = Node(node_config(tmp_path / "node", web, dns, max_pages_per_host=3, exit_when_done=False))
        await nursery.start(node.run)
        with trio.fail_after(60):
            while not node.crawler.is_done():
                await trio.sleep(0.05)
        async with httpx.AsyncClient(headers=auth_headers(tmp_path / "node")) as client:
            metrics = (await client.get(f"http://127.0.0.1:{node.control_port}/metrics")).text
            status = (await client.get(f"http://127.0.0.1:{node.control_port}/status")).json()
        node.request_stop()
        with trio.fail_after(20):
            while node.final_status is None:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    per_host = {}
    for record in web.log:
        if not record.path.endswith("robots.txt"):
            per_host[record.host] = per_host.get(record.host, 0) + 1
    assert per_host and max(per_host.values()) == 3
    assert status["done"] is True and status["skipped"]["max-pages-per-host"] > 0
    pages = sum(per_host.values())
    assert f"peercrawl_pages_total {float(pages)}" in metrics
    assert 'peercrawl_skipped_total{reason="max-pages-per-host"}' in metrics
    assert "peercrawl_queued_urls 0.0" in metrics


@pytest.mark.parametrize("kind", ["memory-urls", "memory-md5", "md5-tree", "bloom"])
async def test_other_dedup_kinds_crawl_the_same_set(tmp_path, kind):
    graph = SiteGraph.generate(seed=17, hosts=8, pages_per_host=10, features=False)
    web, node = await _crawl(graph, tmp_path, dedup=kind, dedup_expected=10_000, dedup_fp_rate=1e-6)
    expected = web.expected(max_body=node.cfg.max_body)
    assert urls_fetched(web, expected) == set(expected.fetched)
    assert node.final_status["seen_urls"] >= len(expected.fetched)


@pytest.mark.parametrize("resident_mib", [0, 1], ids=["never-released", "released-every-interval"])
async def test_store_pages_handed_back_while_crawling_lose_nothing(tmp_path, resident_mib):
    """With a bound below what the process maps anyway (its libraries), the store's pages are handed back at
    every sync interval while the node crawls; the crawl is the same, and with 0 nothing is ever released."""
    graph = SiteGraph.generate(seed=5, hosts=6, pages_per_host=8, features=False)
    web, node = await _crawl(graph, tmp_path, store_resident_mib=resident_mib, sync_interval=0.05)
    expected = web.expected(max_body=node.cfg.max_body)
    assert expected.fetched and urls_fetched(web, expected) == expected.fetched
    released = node.final_status["store_resident"]["released"]
    assert (released > 0) if resident_mib else (released == 0)
    assert node.final_status["store_resident"]["limit"] == resident_mib << 20
