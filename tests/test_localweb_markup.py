"""The real-markup web: generated pages built like real ones and python3-doc's documents with their links made
the web's own. Deterministic, sized and linked as docs/localweb.md states, and what a real HTML parser finds
in the served bytes is exactly what the oracle says the page links to."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import lxml.html
import pytest

from peerlab.localweb import SiteGraph, page_path
from peerlab.localweb.corpus import cut, find_root, load_corpus
from peerlab.localweb.graph import NX_LABELS
from peerlab.localweb.markup import INLINE_LINKS_SIGMA, MEDIAN_INLINE_LINKS, MEDIAN_PAGE_BYTES, PAGE_BYTES_SIGMA
from peerlab.localweb.model import make_url, norm_path
from peerlab.localweb.render import render

PORT = 8080
HAVE_DOCS = find_root() is not None
needs_docs = pytest.mark.skipif(not HAVE_DOCS, reason="python3-doc is not installed (apt-get install python3-doc)")


def _real(**kw) -> SiteGraph:
    args = {"seed": 11, "hosts": 40, "pages_per_host": 30, "features": False, "seed_hosts": 3, "markup": "real",
            "cross_host_fraction": 0.2, "doc_fraction": 0.25}
    args.update(kw)
    return SiteGraph.generate(**args)


def _targets(body: bytes, url: str) -> set[str]:
    """The links of a served page as a browser resolves them: lxml's HTML parser, <a>/<area> hrefs against the
    page's URL, fragments dropped, paths in normal percent-encoding."""
    root = lxml.html.fromstring(body)
    out = set()
    for el in root.iter("a", "area"):
        href = el.get("href")
        if href is None:
            continue
        absolute = urldefrag(urljoin(url, href.strip()))[0]
        scheme, rest = absolute.split("://", 1)
        host, _, path = rest.partition("/")
        out.add(f"{scheme}://{host.lower()}{norm_path('/' + path)}")
    return out


def _page_urls(graph: SiteGraph, host: str, j: int) -> tuple[str, bytes, set[str]]:
    res = graph.resource(host, page_path(j))
    assert res is not None
    url = make_url(host, res.path, PORT)
    want = {make_url(link.host, link.path, PORT) for link in res.links}
    return url, render(graph, res, PORT).body, want


@pytest.mark.slow  # two interpreters build the web
def test_real_markup_web_is_deterministic_across_processes() -> None:
    graph = _real()
    host = graph.hosts[5].name
    body = _page_urls(graph, host, 7)[1]
    code = ("import sys; from peerlab.localweb import SiteGraph; from peerlab.localweb.render import render; "
            "g = SiteGraph.generate(seed=11, hosts=40, pages_per_host=30, features=False, seed_hosts=3, "
            "markup='real', cross_host_fraction=0.2, doc_fraction=0.25); "
            f"sys.stdout.buffer.write(render(g, g.resource({host!r}, '/p/7.html'), {PORT}).body)")
    env = dict(os.environ, PYTHONHASHSEED="123")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, env=env).stdout
    assert other == body
    assert _page_urls(_real(seed=12), host, 7)[1] != body


@pytest.mark.slow  # 2.5-5.3 s: builds and measures thousands of pages
def test_generated_pages_follow_the_stated_distributions() -> None:
    graph = _real(hosts=60, pages_per_host=50, doc_fraction=0.0)
    sizes, inline, depths, elements = [], [], [], []
    for spec in graph.hosts:
        for j in range(graph.pages_per_host):
            res = graph.resource(spec.name, page_path(j))
            assert res is not None and res.markup == "gen"
            body = render(graph, res, PORT).body
            sizes.append(len(body))
            inline.append(len(res.links) - res.nav - res.footer)
            if j < 3:
                root = lxml.html.fromstring(body)
                els = list(root.iter(lxml.etree.Element))
                elements.append(len(els))
                depths.append(max(sum(1 for _ in el.iterancestors()) + 1 for el in els))
    # log-normal sizes: the log of the size has the stated median and sigma (pages overshoot a little when their
    # links need the room, never undershoot by more than one block)
    logs = [math.log(s) for s in sizes]
    assert abs(math.exp(statistics.median(logs)) / MEDIAN_PAGE_BYTES - 1) < 0.1
    assert abs(statistics.stdev(logs) - PAGE_BYTES_SIGMA) < 0.1
    assert abs(statistics.median(inline) / MEDIAN_INLINE_LINKS - 1) < 0.15
    assert abs(statistics.stdev(math.log(max(1, n)) for n in inline) - INLINE_LINKS_SIGMA) < 0.15
    assert 9 <= statistics.median(depths) <= 16
    assert 200 <= statistics.median(elements) <= 2000


def test_generated_pages_carry_real_structure() -> None:
    graph = _real(doc_fraction=0.0)
    body = _page_urls(graph, graph.hosts[2].name, 4)[1]
    text = body.decode("utf-8")
    root = lxml.html.fromstring(body)
    assert root.find(".//nav//a") is not None and root.find(".//footer//a") is not None
    assert root.findall(".//p/a"), "links inside paragraphs"
    assert root.findall(".//script") and root.find(".//style") is not None
    assert root.findall(".//link[@rel='stylesheet']")
    assert "&amp;" in text or "&nbsp;" in text or "&copy;" in text
    assert not text.isascii()
    # on the whole host: tables and code blocks appear
    bodies = b"".join(_page_urls(graph, graph.hosts[2].name, j)[1] for j in range(graph.pages_per_host))
    assert b"<table" in bodies and b"<pre><code" in bodies


@pytest.mark.parametrize("kind", ["gen", pytest.param("doc", marks=needs_docs)])
def test_lxml_finds_exactly_the_links_the_oracle_uses(kind: str) -> None:
    graph = _real(doc_fraction=1.0 if kind == "doc" else 0.0)
    checked = 0
    for spec in graph.hosts[:10]:
        for j in (0, 1, 17):
            url, body, want = _page_urls(graph, spec.name, j)
            assert graph.resource(spec.name, page_path(j)).markup == kind
            got = _targets(body, url)
            # a document's own fragment links (href="#x") name the page itself
            assert got - {url} == want - {url}, (url, sorted(got ^ want)[:5])
            checked += 1
    assert checked == 30


@needs_docs
def test_python3_doc_links_are_rewritten_to_the_web() -> None:
    corpus = load_corpus()
    assert corpus is not None and len(corpus.documents) > 100
    graph = _real(doc_fraction=1.0)
    host = graph.hosts[3].name
    res = graph.resource(host, "/p/2.html")
    assert res is not None and res.markup == "doc"
    document = corpus.documents[res.doc]
    original = Path(corpus.root, document.name).read_text(encoding="utf-8")
    body = render(graph, res, PORT).body.decode("utf-8")
    # the markup is the document's own: same size give or take the rewritten hrefs, same text
    assert abs(len(body) - len(original)) < 0.5 * len(original)
    assert lxml.html.fromstring(body).text_content().split()[-20:] == \
        lxml.html.fromstring(original).text_content().split()[-20:]
    # no link leaves the web: every <a href> is a path, a relative page, a fragment or one of the web's hosts
    root = lxml.html.fromstring(body)
    names = {h.name for h in graph.hosts} | {f"{label}.{graph.domain}" for label in NX_LABELS}
    for el in root.iter("a"):
        href = el.get("href")
        if href is None or href.startswith("#"):
            continue
        absolute = urljoin(make_url(host, "/p/2.html", PORT), href)
        assert absolute.split("/")[2].split(":")[0] in names, href
    canonical = root.find(".//link[@rel='canonical']")
    assert canonical is None or canonical.get("href") == make_url(host, "/p/2.html", PORT)
    # the original fragment of a link is kept after the new target
    kept = [s for s in document.slots if s]
    assert not kept or any(f'{frag}"' in body for frag in kept)


def test_cut_keeps_fragments_and_skips_self_links() -> None:
    doc = cut("x.html", '<link rel="canonical" href="file:///x.html" /><a href="#top">top</a> '
                        "<a class='r' href='os.html#os.path'>os</a> <area href=\"https://e.org/\">")
    assert doc.self_links == 1 and doc.slots == (None, "#os.path", "")
    assert doc.link_slots == 2
    out = doc.render(["/p/1.html", "http://h0001.web.test:8080/"], "http://h0000.web.test:8080/p/3.html")
    assert out == ('<link rel="canonical" href="http://h0000.web.test:8080/p/3.html" /><a href="#top">top</a> '
                   "<a class='r' href='/p/1.html#os.path'>os</a> <area href=\"http://h0001.web.test:8080/\">")
    with pytest.raises(ValueError):
        doc.render(["/p/1.html"], "http://h0000.web.test/")


def test_oracle_on_the_real_markup_web_sees_404s_redirects_and_unresolvable_hosts() -> None:
    graph = _real(hosts=40, pages_per_host=30, odd_link_fraction=0.05)
    exp = graph.expected(port=PORT)
    assert exp.redirects and all(urlparts.endswith(".html") for urlparts in exp.redirects.values())
    assert any(status == 404 for status in exp.statuses.values())
    assert {u.split("/")[2].split(":")[0].split(".")[0] for u in exp.unresolvable} <= set(NX_LABELS)
    assert exp.unresolvable
    # every page of the web that some link reaches is fetched, once per URL
    assert len(exp.pages) > 0.9 * 40 * 30
    # the filler web of the same seed keeps its own, different pages
    filler = SiteGraph.generate(seed=11, hosts=40, pages_per_host=30, features=False, seed_hosts=3)
    assert filler.markup == "filler" and filler.resource(filler.hosts[0].name, "/").markup == ""


def test_without_python3_doc_the_web_falls_back_to_generated_pages(tmp_path: Path) -> None:
    graph = _real(corpus_root=str(tmp_path / "no-such-package"), doc_fraction=1.0)
    assert graph.corpus is None and graph.doc_hosts == 0
    assert {graph.resource(h.name, "/").markup for h in graph.hosts} == {"gen"}


@pytest.mark.skipif(not HAVE_DOCS, reason="python3-doc is not installed")
def test_the_feature_web_keeps_working_with_real_markup() -> None:
    graph = SiteGraph.generate(seed=7, hosts=30, pages_per_host=10, markup="real")
    exp = graph.expected(port=PORT)
    assert set(graph.feature("trap", port=PORT)) & exp.fetched
    assert exp.disallowed and exp.crawl_delays
    hub = graph.resource(graph.hosts[0].name, "/")
    assert hub is not None and hub.markup in ("gen", "doc")
    # the hub still links to every feature host's root
    roots = {make_url(h.name, "/", PORT) for h in graph.hosts[1:12]}
    assert roots <= {make_url(link.host, link.path, PORT) for link in hub.links}


@pytest.mark.slow
async def test_a_node_crawls_exactly_the_oracles_set_on_the_real_markup_web(tmp_path: Path) -> None:
    # the feature web (robots groups, Crawl-delays, redirects, 404s, unresolvable names, the trap) with real
    # markup on its ordinary pages, python3-doc's documents on half its hosts when installed
    import trio

    from peer.node import Node
    from peerlab.localweb.referee import crawl_delay_violations

    from .support.crawl import node_config, start_local_web, urls_fetched

    graph = SiteGraph.generate(seed=21, hosts=20, pages_per_host=8, markup="real", doc_fraction=0.5,
                               odd_link_fraction=0.05)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        node = Node(node_config(tmp_path / "node", web, dns))
        with trio.fail_after(240):
            await node.run()
        nursery.cancel_scope.cancel()
    expected = web.expected(max_body=node.cfg.max_body)
    fetched = urls_fetched(web, expected)
    assert expected.unresolvable and expected.redirects and 404 in expected.statuses.values()
    assert expected.fetched - fetched == set(), "pages a correct crawler fetches were missed"
    assert fetched - expected.fetched == set(), "pages outside the reachable-and-allowed set were requested"
    assert crawl_delay_violations(web.log, graph) == []


def test_real_pages_hands_out_pages_with_the_links_a_parser_must_find() -> None:
    from peerlab.localweb.bench import real_pages

    pages = list(real_pages(40, sample_seed=3))
    assert [p.url for p in pages] == [p.url for p in real_pages(40, sample_seed=3)]
    assert {p.markup for p in pages} <= {"gen", "doc"} and "gen" in {p.markup for p in pages}
    for page in pages:
        assert _targets(page.body, page.url) - {page.url} == page.links


@pytest.mark.slow
@pytest.mark.parametrize("server", ["nginx", "python"])
def test_bench_web_serves_real_markup_moved_and_missing_pages(tmp_path: Path, server: str) -> None:
    import httpx

    from peerlab.localweb.bench import nginx_binary, start_bench_web

    if server == "nginx" and nginx_binary() is None:
        pytest.skip("nginx is not installed")
    with start_bench_web(seed=3, hosts=6, pages_per_host=6, server=server, workers=1, directory=tmp_path / "site",
                         odd_link_fraction=0.2) as web:
        graph = web.graph
        assert graph.markup == "real"
        exp = graph.expected(port=web.port)
        moved = next(iter(exp.redirects.items()))
        missing = next(u for u, status in exp.statuses.items() if status == 404)
        with httpx.Client() as client:
            def get(url: str) -> httpx.Response:
                scheme, rest = url.split("://", 1)
                host, _, path = rest.partition("/")
                return client.get(f"http://127.0.0.1:{web.port}/{path}", headers={"Host": host.split(":")[0]})

            page = next(u for u in sorted(exp.pages) if u.endswith("/p/2.html"))
            r = get(page)
            host = page.split("/")[2].split(":")[0]
            assert r.status_code == 200 and r.content == render(graph, graph.resource(host, "/p/2.html"), web.port).body
            r = get(moved[0])
            assert r.status_code == 301
            assert urljoin(moved[0], r.headers["location"]) == moved[1]
            assert get(missing).status_code == 404
