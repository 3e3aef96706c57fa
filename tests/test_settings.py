"""Crawl settings (scope rules, budgets, paused): the record, its ranking, its checks, its file; the scope rules
they build; and a node crawling by them, judged from the local web's own request log."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from peer.config import ConfigError, load
from peer.control import auth_headers
from peer.crawl.settings import CrawlSettings, SettingsError, SettingsFile
from peer.crawl.urls import Scope
from peer.node import Node
from peerlab.localweb.graph import SiteGraph

from .support.crawl import node_config, start_local_web


# -- the record --------------------------------------------------------------------------------------------------


def test_a_change_outranks_what_it_changes_and_equal_versions_are_ordered_by_content():
    base = CrawlSettings(version=1, origin="a")
    changed = base.changed({"exclude": ["/private/"], "max_depth": 3}, version=2, origin="b")
    assert changed.rank() > base.rank()
    assert changed.exclude == ("/private/",) and changed.max_depth == 3 and changed.origin == "b"
    # two changes made at once on two nodes: every node orders them the same way, whatever the arrival order
    x = base.changed({"paused": True}, version=2, origin="a")
    y = base.changed({"max_pages_per_host": 10}, version=2, origin="b")
    assert x.rank() != y.rank()
    assert max([x, y], key=CrawlSettings.rank) == max([y, x], key=CrawlSettings.rank)


def test_a_record_survives_the_wire_and_the_file(tmp_path):
    s = CrawlSettings(version=1, origin="a").changed(
        {"include": [r"^https?://[^/]*\.example/"], "denied_hosts": ["bad.example"], "max_bytes_per_host": 5000,
         "max_query_params": 2, "paused": True}, version=7, origin="n1")
    again = CrawlSettings.from_record(s.version, s.origin, s.body())
    assert again == s
    f = SettingsFile(tmp_path / "settings.json")
    assert f.load() is None
    f.save(s)
    assert f.load() == s


@pytest.mark.parametrize("changes, words", [
    ({"exclude": ["("]}, "invalid exclude pattern"),
    ({"include": "/a/"}, "expected a list"),
    ({"max_depth": -2}, "max_depth"),
    ({"max_pages_per_host": "5"}, "max_pages_per_host"),
    ({"paused": "yes"}, "paused"),
    ({"denied_hosts": ["bad host!"]}, "invalid host pattern"),
    ({"max_url_length": 0}, "max_url_length"),
    ({"colour": "red"}, "unknown settings ['colour']"),
    ({"exclude": ["x" * 300]}, "at most 256"),
    ({"exclude": [f"/p{i:04d}/" + "y" * 240 for i in range(200)],
      "include": [f"/q{i:04d}/" + "z" * 240 for i in range(200)]}, "at most 60000"),
])
def test_a_bad_change_is_refused_with_its_field_named(changes, words):
    with pytest.raises(SettingsError) as info:
        CrawlSettings().changed(changes, version=2, origin="a")
    assert words in str(info.value)


def test_a_damaged_settings_file_is_one_clear_error(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("{not json")
    with pytest.raises(SettingsError, match="settings.json.*remove it"):
        SettingsFile(path).load()
    path.write_text(json.dumps({"version": 3, "origin": "a", "max_depth": "deep"}))
    with pytest.raises(SettingsError, match="max_depth"):
        SettingsFile(path).load()


# -- the scope rules --------------------------------------------------------------------------------------------


def test_include_exclude_and_query_parameter_rules():
    scope = Scope(include=[r"^http://[^/]+/docs/", r"/news/"], exclude=[r"\.pdf$", r"[?&]sessionid="],
                  max_query_params=2)
    host = "a.example"
    assert scope.check("http://a.example/docs/x.html", host, 0) is None
    assert scope.check("http://a.example/x/news/1", host, 0) is None
    assert scope.check("http://a.example/blog/", host, 0) == "not-included"
    assert scope.check("http://a.example/docs/a.pdf", host, 0) == "excluded"
    assert scope.check("http://a.example/docs/?a=1&sessionid=2", host, 0) == "excluded"
    assert scope.check("http://a.example/docs/?a=1&b=2", host, 0) is None
    assert scope.check("http://a.example/docs/?a=1&b=2&c=3", host, 0) == "too-many-params"
    assert scope.check("http://a.example/docs/?a=1&&b=2&", host, 0) is None  # empty pieces are not parameters
    # a sitemap lists pages, each judged by the include patterns; it is not refused by them itself
    assert scope.check("http://a.example/sitemap.xml.gz", host, 0) == "not-included"
    assert scope.check("http://a.example/sitemap.xml.gz", host, 0, sitemap=True) is None
    assert scope.check("http://a.example/s.xml?sessionid=1", host, 0, sitemap=True) == "excluded"
    with pytest.raises(ValueError, match="invalid include pattern"):
        Scope(include=["[unclosed"])


def test_flags_and_toml_give_the_same_settings(tmp_path):
    toml = tmp_path / "peerd.toml"
    toml.write_text('include = ["/docs/"]\nexclude = ["\\\\.pdf$"]\nmax_bytes_per_host = 100000\n'
                    'max_query_params = 3\nallowed_hosts = ["example.org"]\n')
    from_toml = load(toml=toml, env={})
    from_flags = load(env={}, flags={"include": ["/docs/"], "exclude": [r"\.pdf$"], "max_bytes_per_host": 100000,
                                    "max_query_params": 3, "allowed_hosts": ["example.org"]})
    a = CrawlSettings.from_config(from_toml, origin="n", joining=False)
    b = CrawlSettings.from_config(from_flags, origin="n", joining=False)
    assert a == b and a.version == 1 and a.exclude == (r"\.pdf$",)
    assert CrawlSettings.from_config(from_flags, origin="n", joining=True).version == 0
    with pytest.raises(ConfigError, match="exclude: invalid regular expression"):
        load(env={}, flags={"exclude": ["(oops"]})
    with pytest.raises(ConfigError, match="max_bytes_per_host"):
        load(env={}, flags={"max_bytes_per_host": -5})


# -- a node crawling by them ------------------------------------------------------------------------------------


def _pages_per_host(web) -> dict[str, list]:
    out: dict[str, list] = {}
    for record in web.log:
        if not record.path.endswith("robots.txt"):
            out.setdefault(record.host, []).append(record)
    return out


@pytest.mark.slow  # a whole crawl, a child process or real nodes: seconds
async def test_exclude_and_byte_budget_hold_and_a_narrowed_scope_drops_queued_urls(tmp_path):
    """One node: pages whose number ends in 3 are excluded, each host's byte budget stops it early; a few hosts
    into the crawl it is paused and the scope narrowed to the first host: every other host's queued URLs are dropped when
    popped, and nothing is fetched while paused."""
    graph = SiteGraph.generate(seed=23, hosts=6, pages_per_host=30, features=False)
    budget = 4 * graph.page_bytes
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        cfg = node_config(tmp_path / "node", web, dns, exclude=[r"/p/[0-9]*3\.html$"], max_bytes_per_host=budget,
                          exit_when_done=False, delay=0.2)
        node = Node(cfg)
        await nursery.start(node.run)
        control = f"127.0.0.1:{node.control_port}"
        async with httpx.AsyncClient(timeout=10, headers=auth_headers(tmp_path / "node")) as client:
            # let links to several hosts be queued, then pause while one host that will be kept has URLs queued and
            # at most one page fetched: its byte budget (four pages) leaves it pages to fetch after the resume, on a
            # machine of any speed
            queued = node.crawler.store.frontier.queued
            with trio.fail_after(30):
                while True:
                    fetched = _pages_per_host(web)
                    candidates = [h.name for h in graph.hosts
                                  if queued(h.name) > 0 and len(fetched.get(h.name, [])) <= 1]
                    if candidates and len([h for h, r in fetched.items() if r]) >= 3:
                        break
                    await trio.sleep(0.02)
            keep = candidates[0]
            paused = (await client.post(f"http://{control}/pause", json={})).json()
            assert paused["settings"]["paused"] is True and paused["settings"]["version"] == 2
            await trio.sleep(0.3)  # a fetch under way at the pause may still finish
            before = len(web.log)
            await trio.sleep(1.5)
            assert len(web.log) == before, "a paused node started fetches"
            reply = (await client.post(f"http://{control}/scope", json={"allowed_hosts": [keep]})).json()
            assert reply["settings"]["allowed_hosts"] == [keep] and reply["settings"]["version"] == 3
            assert (await client.post(f"http://{control}/resume", json={})).json()["settings"]["paused"] is False
            with trio.fail_after(60):
                while not node.crawler.is_done():
                    await trio.sleep(0.05)
            status = (await client.get(f"http://{control}/status")).json()
            bad = await client.post(f"http://{control}/scope", json={"exclude": ["("]})
            assert bad.status_code == 400 and "invalid exclude pattern" in bad.json()["error"]
        node.request_stop()
        with trio.fail_after(20):
            while node.final_status is None:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    per_host = _pages_per_host(web)
    fetched_after_pause = [r for r in web.log[before:] if not r.path.endswith("robots.txt")]
    assert fetched_after_pause and {r.host for r in fetched_after_pause} == {keep}
    assert status["skipped"].get("not-allowed-host-at-pop", 0) > 0
    assert not any(r.path.endswith("3.html") for records in per_host.values() for r in records)
    # the byte budget: a host is left alone once its pages reach the budget, so at most one page goes past it
    for host, records in per_host.items():
        sizes = [r.bytes_sent for r in records]
        assert sum(sizes[:-1]) < budget + len(sizes) * 512, (host, sizes)
    assert status["skipped"].get("max-bytes-per-host", 0) > 0
    assert (tmp_path / "node" / "settings.json").exists()
    assert json.loads((tmp_path / "node" / "settings.json").read_text())["allowed_hosts"] == [keep]
