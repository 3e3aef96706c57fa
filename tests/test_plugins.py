"""The plug-in chain on its own: loading (errors named), kinds, order, containment of errors and timeouts,
switch-off, the fingerprint, the built-ins, the item spool and sink."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from peer.config import ConfigError, load
from peer.plugins import (
    ContentFilter, Decision, FetchedPage, JsonLinesSink, MainTextExtractor, PluginError, Plugins, PluginSpec,
    RuleExtractor, describe_difference, load_chain,
)
from peer.plugins._running import MIN_PAGES
from peer.plugins._sink import ItemExporter, read_items
from storage import NodeStore

CASES = "tests.support.plugin_cases"
HTML = "text/html; charset=utf-8"


def page(url="http://a.test/x.html", body=b"<html><body><p>hi</p></body></html>", ctype=HTML, headers=()):
    return FetchedPage(url=url, status=200, headers=list(headers), body=body, content_type=ctype, fetched_at=1.0)


def spec(use, **settings):
    return PluginSpec(use, settings)


def test_load_errors_name_the_plugin():
    with pytest.raises(PluginError, match="nosuch.module:X: cannot import nosuch"):
        load_chain([spec("nosuch.module:X")])
    with pytest.raises(PluginError, match=f"{CASES}:Missing: .* has no class Missing"):
        load_chain([spec(f"{CASES}:Missing")])
    with pytest.raises(PluginError, match=f"{CASES}:Raises: bad settings: every must be >= 1"):
        load_chain([spec(f"{CASES}:Raises", every=0)])
    with pytest.raises(PluginError, match="bad settings: .*unexpected keyword"):
        load_chain([spec(f"{CASES}:Raises", evry=3)])
    with pytest.raises(PluginError, match="defines filter"):
        load_chain([spec("peer.plugins:PluginSpec")])  # a class with none of the four methods
    with pytest.raises(PluginError, match=r"rules\[0\].fields.price: bad selector"):
        load_chain([spec("peer.plugins:RuleExtractor", rules=[{"url": "", "fields": {"price": {"css": "..x["}}}])])


def test_config_reads_plugins_tables_in_order(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[plugins]]\nuse = "a.b:C"\nx = 1\n[[plugins]]\nuse = "d:E"\n')
    cfg = load(toml=path, env={})
    assert cfg.plugins == (("a.b:C", '{"x": 1}'), ("d:E", "{}"))
    path.write_text('[[plugins]]\nx = 1\n')
    with pytest.raises(ConfigError, match=r"plugins\[0\].*use = \"module:Class\" is required"):
        load(toml=path, env={})
    with pytest.raises(ConfigError, match="plugin_timeout must be > 0"):
        load(env={}, flags={"plugin_timeout": 0})


def test_kinds_come_from_methods_and_order_is_first_match():
    chain = load_chain([spec(f"{CASES}:NoOpPageFilter"), spec(f"{CASES}:DropAll"), spec(f"{CASES}:NoOpFilter"),
                        spec(f"{CASES}:Raises", every=1_000_000_007)])
    assert [sorted(chain.kinds(i)) for i in range(4)] == [["page_filter"], ["page_filter"], ["url_filter"],
                                                          ["extractor"]]
    out = chain.run(page(), ["http://a.test/y.html"], None)
    # the first page filter has no opinion, the second decides; a page not followed gets no URL filtering
    assert (out.store, out.follow, out.links) == (False, False, None)
    assert [item for _i, item in out.items] == [{"type": "seen", "length": 35}]


def test_url_filters_are_a_pipeline_with_link_context():
    seen = []

    class Record:
        def filter(self, source_url, url, link):
            seen.append((source_url, url, link and (link.text, link.tag, tuple(sorted(link.rel)))))
            return None if "drop" in url else url.replace("old", "new")

    chain = load_chain([])
    chain._filters = [(0, Record())]
    body = b'<html><body><a href="/old.html" rel="Next">Old  page</a><area href="/drop.html"></body></html>'
    out = chain.run(page(body=body), ["http://a.test/old.html", "http://a.test/drop.html"], "http://a.test/")
    assert out.links == ("http://a.test/new.html",)
    assert seen == [("http://a.test/x.html", "http://a.test/old.html", ("Old page", "a", ("next",))),
                    ("http://a.test/x.html", "http://a.test/drop.html", ("", "area", ()))]


def test_url_filters_see_seeds_redirects_and_sitemap_urls_with_their_context():
    seen = []

    class Record:
        def filter(self, source_url, url, link):
            seen.append((source_url, url, link and (link.href, link.text, link.tag, link.rel)))
            if "boom" in url:
                raise RuntimeError("boom")
            return None if "drop" in url else url.replace("old", "new")

    plugins = Plugins([PluginSpec("tests.support.plugin_cases:NoOpFilter", {})])
    plugins.chain._filters = [(0, Record())]
    assert plugins.filters_urls
    answers, off = plugins.filter_urls("", ["http://a.test/old", "http://a.test/drop"], None)
    assert answers == ["http://a.test/new", None] and off == 0
    answers, _ = plugins.filter_urls("http://a.test/moved", ["http://b.test/x"], "redirect")
    assert answers == ["http://b.test/x"]
    answers, _ = plugins.filter_urls("http://a.test/sitemap.xml", ["http://a.test/p", "http://a.test/boom"], "sitemap")
    assert answers == ["http://a.test/p", "http://a.test/boom"]  # a failing filter has no opinion on the batch
    assert seen[:3] == [("", "http://a.test/old", None), ("", "http://a.test/drop", None),
                        ("http://a.test/moved", "http://b.test/x", ("http://b.test/x", "", "redirect", frozenset()))]
    assert seen[3][2][2] == "sitemap"
    assert plugins.failures() == (1, 0) and plugins.counts[0].pages == 3
    assert "boom" in plugins.counts[0].last


def test_no_tree_is_built_unless_a_plugin_asks():
    p = page()
    load_chain([spec(f"{CASES}:NoOpPageFilter"), spec(f"{CASES}:NoOp")]).run(p, None, None)
    assert not p.tree_built
    p = page()
    out = load_chain([spec(f"{CASES}:TreeUser")]).run(p, None, None)
    assert p.tree_built and out.tree


def test_an_error_is_contained_counted_and_most_failures_switch_off():
    plugins = Plugins([spec(f"{CASES}:Raises", every=1)])
    for k in range(MIN_PAGES):
        url = f"http://a.test/{k}.html"
        out = plugins.run(page(url=url), None, None)
        assert out.store and out.follow and out.items == ()
        assert out.failures == ((0, "error", "RuntimeError: raised on purpose"),)
        plugins.record(out, url)
    status = plugins.status()["chain"][0]
    assert status["errors"] == MIN_PAGES and status["pages"] == MIN_PAGES
    assert status["state"].startswith(f"switched off: failed on {MIN_PAGES} of {MIN_PAGES} pages")
    out = plugins.run(page(), None, None)
    assert out.ran == () and out.failures == ()  # off: not run
    plugins.reload([spec(f"{CASES}:Raises", every=1)])
    assert plugins.status()["chain"][0]["state"] == "on" and plugins.generation == 2


@pytest.mark.slow  # waits out the plug-in's time limit
def test_a_plugin_past_its_time_is_interrupted():
    """In a process of its own: this one's SIGALRM is the test runner's timeout (where the chain measures)."""
    code = ("from peer.plugins import FetchedPage, PluginSpec, load_chain\n"
            f"chain = load_chain([PluginSpec('{CASES}:Sleeps', {{'seconds': 60.0}})], timeout=0.2)\n"
            "p = FetchedPage(url='http://a.test/', status=200, headers=[], body=b'', content_type=None, fetched_at=0)\n"
            "out = chain.run(p, None, None)\n"
            "print(out.failures, out.items)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == "((0, 'timeout', 'over 0.2 s'),) ()"


def test_a_plugin_past_its_time_in_a_thread_is_measured():
    chain = load_chain([spec(f"{CASES}:Sleeps", seconds=0.3)], timeout=0.1)
    box = []
    thread = threading.Thread(target=lambda: box.append(chain.run(page(), None, None)))
    thread.start()
    thread.join()
    assert box[0].failures == ((0, "timeout", "over 0.1 s"),) and box[0].items == ()


def test_fingerprint_follows_classes_versions_and_settings():
    a = load_chain([spec(f"{CASES}:Raises", every=3)])
    b = load_chain([spec(f"{CASES}:Raises", every=4)])
    c = load_chain([spec(f"{CASES}:Raises", every=3), spec(f"{CASES}:NoOp")])
    assert a.fingerprint == load_chain([spec(f"{CASES}:Raises", every=3)]).fingerprint
    assert len({a.fingerprint, b.fingerprint, c.fingerprint}) == 3
    assert load_chain([]).fingerprint == ""
    assert describe_difference(a.description, b.description).startswith(
        f"settings #1 differs: this node runs {CASES}:Raises version 1 settings")
    assert describe_difference(c.description, a.description) == (
        f"plug-in #2 differs: this node runs {CASES}:NoOp version 1 settings "
        f"{c.description[1]['settings']}, the cluster runs nothing")


RULES = [{"url": "/p/", "type": "product", "required": ["name"],
          "fields": {"name": "h1", "price": {"css": ".price", "type": "number"},
                     "img": {"css": "img", "type": "attribute", "attr": "src"},
                     "tags": {"xpath": "//li/text()", "type": "list"}, "count": {"xpath": "count(//li)"}}},
         {"url": "", "fields": {"title": "title"}}]


def test_rule_extractor_types_and_first_matching_rule():
    rx = RuleExtractor(RULES)
    body = (b"<html><head><title>T</title></head><body><h1> Lamp\n one </h1><span class=price>EUR 1,299.50</span>"
            b"<img src=/a.png><ul><li>x</li><li>y</li></ul></body></html>")
    assert rx.extract(page(url="http://a.test/p/1", body=body)) == [
        {"type": "product", "name": "Lamp one", "price": 1299.5, "img": "/a.png", "tags": ["x", "y"], "count": "2.0"}]
    assert rx.extract(page(url="http://a.test/p/2", body=b"<html><body>none</body></html>")) == []  # required
    assert rx.extract(page(url="http://a.test/q", body=body)) == [{"title": "T"}]  # the next rule
    with pytest.raises(ValueError, match="type must be one of"):
        RuleExtractor([{"fields": {"a": {"css": "a", "type": "float"}}}])
    with pytest.raises(ValueError, match="needs attr"):
        RuleExtractor([{"fields": {"a": {"css": "a", "type": "attribute"}}}])


def test_content_filter_by_type_and_language():
    f = ContentFilter(types=["text/html"], languages=["en"])
    assert f.decide(page(ctype="application/pdf")) == Decision(store=False, follow=True)
    assert f.decide(page(body=b'<html lang="fr"><body>x</body></html>')) == Decision(store=False, follow=True)
    assert f.decide(page(body=b'<html lang="en-GB"><body>x</body></html>')) is None
    assert f.decide(page(headers=[("Content-Language", "en-US")])) is None
    german = ("<html><body><p>" + "Dies ist ein deutscher Satz mit genug Wörtern, um die Sprache zu erkennen. " * 3
              + "</p></body></html>").encode()
    assert f.decide(page(body=german)) == Decision(store=False, follow=True)
    assert ContentFilter(languages=["de"], follow_others=False).decide(page(body=b'<html lang="en">')) == \
        Decision(store=False, follow=False)


def test_main_text_leaves_menus_and_footers_out():
    body = ("<html lang=en><head><title>River</title></head><body><nav><a href=/>Home</a><a href=/b>Blog</a></nav>"
            "<article><h1>River</h1><p>" + "A river carries sand and gravel downstream. " * 8 + "</p></article>"
            "<footer>Copyright. Terms. Privacy.</footer></body></html>").encode()
    [item] = MainTextExtractor(min_chars=100).extract(page(body=body))
    assert item["type"] == "article" and item["title"] == "River" and item["language"] == "en"
    assert "A river carries sand" in item["text"] and "Copyright" not in item["text"] and "Blog" not in item["text"]
    assert MainTextExtractor(min_chars=10_000).extract(page(body=body)) == []


def test_items_spool_export_and_sink_repeat_nothing(tmp_path):
    store = NodeStore.open(tmp_path / "state")
    store.items.put([{"a": 1}, {"a": 2}])
    sink = JsonLinesSink(tmp_path / "items")
    exporter = ItemExporter(store.items, [sink])
    assert exporter.export_once() == 2 and len(store.items) == 0
    store.items.put([{"a": 3}])
    # a crash between the sink's write and the spool's delete: the next exporter writes it again, the sink skips
    batch = store.items.first(10)
    sink.write([json.loads(raw) for _s, raw in batch])
    with open(sink.path, "a") as fh:
        fh.write('{"a": 4, "_se')  # and a torn line
    again = ItemExporter(store.items, [JsonLinesSink(tmp_path / "items")])
    assert again.export_once() == 1
    assert [(i["a"], i["_seq"]) for i in read_items(tmp_path / "items")] == [(1, 0), (2, 1), (3, 2)]
    store.close()
    store = NodeStore.open(tmp_path / "state")  # numbers never repeat, even with the spool empty
    store.items.put([{"a": 5}])
    assert store.items.first(5)[0][0] == 3
    store.close()


def test_a_page_worker_builds_the_chain_of_the_generation_its_job_names():
    plugins = Plugins([spec(f"{CASES}:Raises", every=1_000_000_007)])
    part = plugins.job_part()
    runner = part[0]
    args = ("http://a.test/", 200, [], b"<html></html>", HTML, 1.0, None, None)
    assert [i for _n, i in runner(part, *args).items] == [{"type": "seen", "length": 13}]
    plugins.reload([spec(f"{CASES}:DropAll")])
    newer = plugins.job_part()
    assert newer[1] == part[1] + 1
    out = runner(newer, *args)
    assert (out.store, out.follow, out.items) == (False, False, ())
    plugins.record(runner(part, *args), "http://a.test/", generation=part[1])  # of the old chain: not counted
    assert plugins.status()["chain"][0]["pages"] == 0
