"""The dashboard in a real headless browser (Debian's chromium through selenium), against real peerd daemons
crawling the local web the test serves (HTTP + DNS on loopback).

Three nodes A=150, B=80, C=200 form a cluster; A's dashboard must show three nodes on the ring with the key
shares `peerctl ring` prints; then C leaves (`peerctl leave`) and the ring must be redrawn without it within a
few seconds, with the shares `peerctl ring` then prints. Screenshots of both go to the test's directory, and to
$DASHBOARD_SCREENSHOTS when set (docs/dashboard-*.png were taken so). Without chromium and chromedriver the
tests skip, saying what to install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from peer.control import dashboard_address, read_token
from peerlab.localweb.graph import SiteGraph
from tests.support.browser import browser, need_browser
from tests.support.crawl import child_env, start_local_web
from tests.test_cluster_daemons import Cluster

pytestmark = pytest.mark.slow  # real daemons and a real browser

#: The page must show a leave within this long (the node polls its peers once a second; the page polls it once
#: a second; the leave's gossip takes a moment): a bound on the wait, not a figure measured.
REDRAW_BOUND = 10.0


def _peerctl(*args: str) -> str:
    out = subprocess.run([sys.executable, "-c", "import sys; from peer.cli import peerctl_main; sys.exit(peerctl_main())",
                          *args], capture_output=True, text=True, timeout=120, env=child_env())
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _ring_rows(data_dir: Path) -> dict[str, dict[str, str]]:
    """`peerctl ring --data-dir` as printed: node -> its columns."""
    lines = _peerctl("ring", "--data-dir", str(data_dir)).splitlines()
    head = lines[1].split()  # node state weight weight share key share error urls received
    assert head[:3] == ["node", "state", "weight"], lines
    rows = {}
    for line in lines[2:]:
        cells = line.split()
        rows[cells[0]] = {"state": cells[1], "weight": cells[2], "weight_share": cells[3], "key_share": cells[4],
                          "error": cells[5]}
    return rows


def _page_rows(driver) -> dict[str, dict[str, str]]:
    return driver.execute_script("""
        const out = {};
        for (const tr of document.querySelectorAll('#ring-table tbody tr')) {
          const row = {};
          for (const td of tr.querySelectorAll('td[data-field]')) row[td.dataset.field] = td.textContent;
          out[tr.dataset.node] = row;
        }
        return out;""")


def _key_arcs(driver) -> dict[str, float]:
    return driver.execute_script("""
        const out = {};
        for (const p of document.querySelectorAll('#ring path.keyarc')) out[p.dataset.node] = Number(p.dataset.share);
        return out;""")


def _save(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    assert driver.save_screenshot(str(path)), f"no screenshot {name}"
    assert path.stat().st_size > 10_000  # a drawn page, not a blank one
    keep = os.environ.get("DASHBOARD_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / name)
    return path


async def _until(predicate, timeout: float, what: str):
    """Poll `predicate` (run in a thread: selenium blocks) until it returns a true value; fail after `timeout`."""
    last = None
    with trio.move_on_after(timeout):
        while True:
            last = await trio.to_thread.run_sync(predicate)
            if last:
                return last
            await trio.sleep(0.2)
    raise AssertionError(f"{what} not seen within {timeout:g} s (last: {last!r})")


async def test_dashboard_draws_the_ring_and_redraws_it_when_a_node_leaves(tmp_path):
    need_browser()
    # 30 hosts of 30 pages at one page a second per host: the crawl is still under way when C leaves.
    graph = SiteGraph.generate(seed=18, hosts=30, pages_per_host=30, links_per_page=6, seed_hosts=4)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        cluster = Cluster(tmp_path, web, dns, delay=1.0, concurrency=16, exit_when_done=False)
        try:
            await cluster.start("A", 150, join=False)
            await cluster.start("B", 80)
            await cluster.start("C", 200)
            addresses = {name: cluster.control(name) for name in "ABC"}

            def three_alive() -> bool:
                rows = _ring_rows(tmp_path / "A")
                return set(rows) == {"A", "B", "C"} and all(r["state"] == "alive" for r in rows.values())

            await _until(three_alive, 30, "three alive members in `peerctl ring`")
            address = dashboard_address(addresses["A"], read_token(tmp_path / "A"))
            assert _peerctl("dashboard", "--data-dir", str(tmp_path / "A")).strip() == address

            with browser(height=1700) as driver:
                # Without the token the page says how to get one, and shows no data.
                await trio.to_thread.run_sync(driver.get, address.split("#")[0])
                banner = await _until(lambda: driver.find_element("id", "banner").text, 10, "the no-token banner")
                assert "peerctl dashboard" in banner and not _page_rows(driver)
                await trio.to_thread.run_sync(driver.get, address + "x")  # a wrong token: refused, said so
                banner = await _until(lambda: "401" in driver.find_element("id", "banner").text and
                                      driver.find_element("id", "banner").text, 10, "the refused-token banner")
                assert not _page_rows(driver)

                await trio.to_thread.run_sync(driver.get, "about:blank")
                await trio.to_thread.run_sync(driver.get, address)
                expected = _ring_rows(tmp_path / "A")

                def ring_matches():
                    rows = _page_rows(driver)
                    if set(rows) != {"A", "B", "C"}:
                        return None
                    fresh = _ring_rows(tmp_path / "A")
                    return all(rows[n][k] == fresh[n][k] for n in fresh for k in fresh[n]) and rows

                rows = await _until(ring_matches, 15, "the ring of A, B and C as `peerctl ring` prints it")
                arcs = _key_arcs(driver)
                assert set(arcs) == {"A", "B", "C"}
                assert abs(sum(arcs.values()) - 1.0) < 1e-6
                cluster_json = json.loads(_peerctl("ring", "--data-dir", str(tmp_path / "A"), "--json"))
                for node in cluster_json["nodes"]:
                    assert abs(arcs[node["node_id"]] - node["key_share"]) < 1e-9
                print("ring on the page:", {n: rows[n]["key_share"] for n in sorted(rows)},
                      "peerctl ring:", {n: expected[n]["key_share"] for n in sorted(expected)})

                # Every node reports its detail to A: cards with pages, flows from each sender.
                def details_in() -> bool:
                    return driver.execute_script("""
                        const m = window.peercrawlDashboard.last;
                        return m && m.nodes.length === 3 && m.nodes.every(n => n.detail && n.detail.history.length > 2)
                               && m.nodes.some(n => Object.keys(n.detail.sent).length > 0);""")

                await _until(details_in, 20, "every node's detailed status, and URLs sent between nodes")
                cards = driver.execute_script(
                    "return [...document.querySelectorAll('#nodes .card')].map(c => c.dataset.node)")
                assert sorted(cards) == ["A", "B", "C"]
                flow_rows = driver.execute_script(
                    "return [...document.querySelectorAll('#flow-table tbody tr')].map(r => r.dataset.from)")
                assert sorted(flow_rows) == ["A", "B", "C"]
                _save(driver, tmp_path, "dashboard-three-nodes.png")

                # C leaves: the page must redraw the ring without it within a few seconds.
                _peerctl("leave", "--data-dir", str(tmp_path / "C"), "--no-wait")
                left_at = time.monotonic()

                def c_gone():
                    arcs = _key_arcs(driver)
                    rows = _page_rows(driver)
                    return set(arcs) == {"A", "B"} and rows.get("C", {}).get("state") != "alive" and rows

                rows = await _until(c_gone, REDRAW_BOUND, "the ring redrawn without C")
                redrawn = time.monotonic() - left_at
                print(f"ring redrawn without C {redrawn:.1f} s after `peerctl leave`")
                _save(driver, tmp_path, "dashboard-after-leave.png")
                with trio.fail_after(60):
                    await cluster.procs["C"].wait()

                def two_match():
                    fresh = _ring_rows(tmp_path / "A")
                    rows = _page_rows(driver)
                    owning = {n for n, r in fresh.items() if r["state"] == "alive"}
                    return owning == {"A", "B"} and all(
                        rows[n]["key_share"] == fresh[n]["key_share"] for n in fresh if n in rows)

                await _until(two_match, 10, "the two-node ring's shares as `peerctl ring` prints them")
                arcs = _key_arcs(driver)
                assert abs(sum(arcs.values()) - 1.0) < 1e-6
        finally:
            cluster.kill_all()
        nursery.cancel_scope.cancel()


async def test_a_standalone_node_serves_its_own_dashboard(tmp_path):
    """Without a cluster secret there is no /cluster: the page shows the one node from /status."""
    need_browser()
    from peer.node import Node
    from tests.support.crawl import node_config

    graph = SiteGraph.generate(seed=5, hosts=4, pages_per_host=10, features=False)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        node = Node(node_config(tmp_path / "node", web, dns, exit_when_done=False))
        await nursery.start(node.run)
        with trio.fail_after(60):
            while not node.crawler.is_done():
                await trio.sleep(0.05)
        address = dashboard_address(f"127.0.0.1:{node.control_port}", read_token(tmp_path / "node"))

        def look():
            with browser() as driver:
                driver.get(address)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    rows = _page_rows(driver)
                    pages = driver.execute_script(
                        "const e = document.querySelector('[data-field=pages]'); return e && e.textContent")
                    if rows and pages:
                        return rows, _key_arcs(driver), pages, driver.find_element("id", "title").text
                    time.sleep(0.2)
                raise AssertionError("the standalone dashboard drew nothing within 15 s")

        rows, arcs, pages, title = await trio.to_thread.run_sync(look)
        assert list(rows) == ["test-node"] and rows["test-node"]["key_share"] == "100.00%"
        assert arcs == {"test-node": 1.0}
        assert pages.replace(",", "") == str(node.stats.pages) and node.stats.pages > 0
        assert "standalone" in title and "FINISHED" in title
        node.request_stop()
        with trio.fail_after(30):
            while node.final_status is None:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()


async def test_a_stalled_crawl_is_called_so_and_its_slowest_hosts_listed(tmp_path):
    """A node whose hosts all wait out a 60 s delay has URLs queued and receives no page: the page says it has
    stalled (after `stall` seconds, 2 here) and lists the hosts it waits for."""
    need_browser()
    from peer.node import Node
    from tests.support.crawl import node_config

    graph = SiteGraph.generate(seed=7, hosts=3, pages_per_host=5, features=False)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        node = Node(node_config(tmp_path / "node", web, dns, exit_when_done=False, delay=60.0))
        await nursery.start(node.run)
        address = dashboard_address(f"127.0.0.1:{node.control_port}", read_token(tmp_path / "node")) + "&stall=2"

        def look():
            with browser() as driver:
                driver.get(address)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    stall = driver.find_element("id", "stall").text
                    hosts = driver.execute_script(
                        "return [...document.querySelectorAll('#slow-table tbody tr')].map(r => r.cells[0].textContent"
                        " + ' ' + (r.cells[2] ? r.cells[2].textContent : ''))")
                    if stall:
                        return stall, hosts
                    time.sleep(0.2)
                raise AssertionError("no stall shown within 20 s")

        stall, hosts = await trio.to_thread.run_sync(look)
        waiting = len(node.crawler.frontier) + node.crawler.frontier.in_flight()
        assert waiting > 0 and node.stats.pages <= len(graph.zone())  # at most one page per host so far
        assert stall.startswith("Stalled: test-node has had no page for") and "URLs are queued" in stall
        assert hosts and all(h.endswith(" 60.0") for h in hosts), hosts
        node.request_stop()
        with trio.fail_after(30):
            while node.final_status is None:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()


async def test_a_failing_upload_and_webhook_are_shown_on_the_nodes_card(tmp_path):
    """--upload to an S3 endpoint where nothing listens: the crawl goes on and the node's card says the upload
    fails, and why; the webhook (to a dead address) has nothing to announce while nothing is uploaded; the crawl
    log's local files have every finished URL."""
    need_browser()
    from peer.node import Node
    from tests.support.crawl import node_config

    graph = SiteGraph.generate(seed=6, hosts=4, pages_per_host=10, features=False)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        cfg = node_config(tmp_path / "node", web, dns, exit_when_done=False, warc_max_bytes=20_000,
                          upload="s3://crawls/run", upload_endpoint="http://127.0.0.1:9",
                          upload_access_key="key", upload_secret_key="secret",
                          webhook="http://127.0.0.1:9/hook", webhook_secret="a-secret-of-16-bytes-at-least")
        node = Node(cfg)
        await nursery.start(node.run)
        with trio.fail_after(60):
            while not (node.crawler.is_done() and node.uploader.failures):
                await trio.sleep(0.05)
        address = dashboard_address(f"127.0.0.1:{node.control_port}", read_token(tmp_path / "node"))

        def look():
            with browser() as driver:
                driver.get(address)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    fields = driver.execute_script(
                        "const f = (n) => { const e = document.querySelector('[data-field=\"' + n + '\"]');"
                        " return e && e.textContent; }; return [f('upload'), f('webhook'), f('crawl log')]")
                    if all(fields):
                        return fields
                    time.sleep(0.2)
                raise AssertionError("the card showed no upload, webhook or crawl log row within 15 s")

        upload, webhook, crawl_log = await trio.to_thread.run_sync(look)
        assert upload.startswith("FAILING for ") and "cannot reach http://127.0.0.1:9" in upload, upload
        assert "uploaded" in upload and node.uploader.queued_files > 0
        assert webhook == "ok; 0 waiting, 0 sent" and node.webhook.failures == 0
        # the crawl log's local files: every finished URL handed on
        assert crawl_log.startswith("ok; 0 records waiting, oldest 0"), crawl_log
        assert f"; {node.crawl_log.readers[0].handed_on} handed on" in crawl_log
        assert node.stats.pages == len(web.expected().fetched)  # the crawl went on
        node.request_stop()
        with trio.fail_after(60):
            while node.final_status is None:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()


async def test_a_plugin_switched_off_is_shown_on_the_nodes_card(tmp_path):
    """A plug-in that raises on every page is switched off after MIN_PAGES pages: the node's card says so,
    with the plug-in's name and why, as /status does."""
    need_browser()
    from peer.node import Node
    from tests.support.crawl import node_config

    graph = SiteGraph.generate(seed=6, hosts=4, pages_per_host=10, features=False)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        cfg = node_config(tmp_path / "node", web, dns, exit_when_done=False,
                          plugins=(("tests.support.plugin_cases:Raises", json.dumps({"every": 1})),))
        node = Node(cfg)
        await nursery.start(node.run)
        with trio.fail_after(60):
            while not (node.plugins is not None and node.plugins.switched_off()):
                await trio.sleep(0.05)
        address = dashboard_address(f"127.0.0.1:{node.control_port}", read_token(tmp_path / "node"))

        def look():
            with browser() as driver:
                driver.get(address)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    shown = driver.execute_script(
                        "const e = document.querySelector('[data-field=\"plug-ins\"]'); return e && e.textContent;")
                    if shown:
                        return shown
                    time.sleep(0.2)
                raise AssertionError("the card showed no plug-ins row within 15 s")

        shown = await trio.to_thread.run_sync(look)
        status = node.control.status()["plugins"]["chain"][0]
        assert status["state"].startswith("switched off: failed on ")
        assert shown == f"OFF tests.support.plugin_cases:Raises: {status['state']}", shown
        assert "raised on purpose" in shown
        node.request_stop()
        with trio.fail_after(60):
            while node.final_status is None:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
