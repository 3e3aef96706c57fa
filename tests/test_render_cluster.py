"""Three real peerd daemons crawl the local web with ``--render auto``, each with its own headless chromium:
every link only a script writes is found, the browsers' requests keep each host's politeness (the web's own
log: one connection at a time, the delay between requests), at most 10% of the pages are rendered, and each
rendered DOM sits as a conversion record beside its page's response in the WARC files of the node that owns it."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from peer.render import BrowserError, find_chromium
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import max_concurrent_connections_per_host
from tests.support.crawl import child_env, kill_pid, node_config, peerd_argv, start_local_web, urls_fetched
from tests.test_cluster_daemons import _paused, _post
from tests.test_render_crawl import spacing_violations

pytestmark = pytest.mark.slow  # real peerd daemons and browsers

try:
    find_chromium()
except BrowserError as exc:  # pragma: no cover - the suite's machine has Debian's chromium
    pytest.skip(str(exc), allow_module_level=True)

SECRET = "test-cluster-secret-0123456789"
DELAY = 0.1


def records(data_dir: Path) -> list[tuple[str, str]]:
    out = []
    for path in sorted((data_dir / "warc").glob("*.warc.gz")):
        with open(path, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type in ("response", "conversion"):
                    out.append((record.rec_type, record.rec_headers.get_header("WARC-Target-URI")))
    return out


async def test_three_rendering_nodes_find_every_scripted_link_politely(tmp_path: Path) -> None:
    graph = SiteGraph.generate(seed=5, hosts=16, pages_per_host=6)
    procs: dict[str, trio.Process] = {}
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        seed: str | None = None
        env = {**child_env(), "PEERCRAWL_CLUSTER_SECRET": SECRET}

        class Nodes:  # what the pause helpers read: the data dirs and the control addresses
            tmp = tmp_path

            @staticmethod
            def control(name: str) -> str:
                return (tmp_path / name / "control.addr").read_text().strip()

        try:
            # paused from A's start until B and C have joined: on a loaded machine A crawled the whole web and
            # exited (--exit-when-done) while C was still starting, and C found no one to join
            for name in ("A", "B", "C"):
                cfg = node_config(tmp_path / name, web, dns, node_id=name, delay=DELAY, concurrency=32)
                argv = peerd_argv(cfg) + ["--render", "auto", "--render-timeout", "15", "--suspicion-timeout", "2"]
                if seed:
                    argv += ["--join", seed]
                log = open(tmp_path / f"{name}.log", "ab")  # noqa: SIM115 - closed with the test's tmp dir
                procs[name] = await trio.lowlevel.open_process(argv, env=env, stderr=log)
                # a bound, not a wait: starting a daemon on a loaded 2-core machine has taken over 30 s
                with trio.fail_after(120):
                    while not (tmp_path / name / "peer.addr").exists():
                        assert procs[name].poll() is None, (tmp_path / f"{name}.log").read_text()[-2000:]
                        await trio.sleep(0.05)
                if seed is None:
                    seed = (tmp_path / name / "peer.addr").read_text().strip()
                    await _post(Nodes.control("A"), "/pause", tmp_path / "A")
            await _paused(Nodes, {"A", "B", "C"})
            await _post(Nodes.control("A"), "/resume", tmp_path / "A")
            with trio.fail_after(240):
                for name, proc in procs.items():
                    assert await proc.wait() == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
        finally:
            for proc in procs.values():
                kill_pid(proc.pid)
        nursery.cancel_scope.cancel()
    expected = web.expected(render=True)
    fetched = urls_fetched(web, expected)
    subresources = set(graph.feature("script_resource", port=web.port))
    assert expected.scripted and expected.scripted - fetched == set(), "links only a script writes were missed"
    assert expected.fetched - fetched == set()
    assert fetched - expected.fetched <= subresources
    assert max(max_concurrent_connections_per_host(web.log).values()) == 1
    assert spacing_violations(web.log, graph, DELAY) == []
    by_node = {name: records(tmp_path / name) for name in procs}
    conversions = [uri for recs in by_node.values() for kind, uri in recs if kind == "conversion"]
    pages = {uri for recs in by_node.values() for kind, uri in recs if kind == "response"} & expected.pages
    assert conversions and len(conversions) <= 0.10 * len(pages), (len(conversions), len(pages))
    for recs in by_node.values():  # a DOM beside its page's response, on the node that fetched the page
        responses = {uri for kind, uri in recs if kind == "response"}
        assert {uri for kind, uri in recs if kind == "conversion"} <= responses
