"""A crawl of a TLS web served by nginx with HTTP/2, where half the hosts speak only HTTP/2 and a quarter are
reachable only through a SOCKS5 proxy (dante): every page the oracle expects is fetched, politely, each over
the protocol its host allows, and the WARC records say which."""

from __future__ import annotations

import functools
from collections import defaultdict
from pathlib import Path

import pytest
import trio
from warcio.archiveiterator import ArchiveIterator

from peer.config import load
from peer.node import Node
from peerlab.localweb.dns_server import serve_dns
from tests.support.realproxies import dante
from tests.support.tlsweb import PROXY_SOURCE, start_tls_web

pytestmark = pytest.mark.slow

DELAY = 0.2


async def test_crawl_of_a_tls_web_half_http2_only_a_quarter_behind_a_proxy(tmp_path: Path) -> None:
    with start_tls_web(tmp_path / "web") as web, dante(tmp_path, external=PROXY_SOURCE) as socks:
        h1_host = sorted(set(web.graph.zone()) - web.h2_only - web.proxy_only)[0]  # one host told: no HTTP/2
        lines = [f'[hosts."*"]\ntls_ca_file = "{web.ca.ca_file}"\n',
                 f'[hosts."{h1_host}"]\nhttp2 = false\n']
        lines += [f'[hosts."{host}"]\nproxy = "socks5://127.0.0.1:{socks.port}"\n' for host in sorted(web.proxy_only)]
        toml = tmp_path / "node.toml"
        toml.write_text("".join(lines))
        async with trio.open_nursery() as nursery:
            dns = await nursery.start(functools.partial(serve_dns, web.graph.zone()))
            cfg = load(toml=toml, env={}, flags={
                "node_id": "tls-node", "data_dir": str(tmp_path / "node"), "control": "127.0.0.1:0",
                "listen": "127.0.0.1:0", "seeds": web.seeds(), "nameservers": [f"127.0.0.1:{dns.address[1]}"],
                "allow_private": True, "delay": DELAY, "exit_when_done": True, "concurrency": 32})
            node = Node(cfg)
            with trio.fail_after(180):
                await node.run()
            nursery.cancel_scope.cancel()
        assert node.fetch_policies is not None  # what GET /status shows under "proxies"
        proxies = [p for pool in node.fetch_policies.proxy_pools() for p in pool.status(0.0)]
        errors = dict(node.stats.errors)
        requests = web.requests()
    expected = {u.replace("http://", "https://", 1) for u in web.graph.expected(port=web.port).fetched}
    assert expected
    fetched = {f"https://{r.host}:{web.port}{r.path}" for r in requests if r.status == 200}
    assert expected - fetched == set(), "pages a correct crawler fetches were missed"
    # never HTTP/1.1 to an HTTP/2-only host, never direct to a proxy-only host
    assert [r for r in requests if r.status in (403, 505)] == []
    assert {r.client for r in requests if r.host in web.proxy_only} == {PROXY_SOURCE}
    assert {r.protocol for r in requests if r.host == h1_host} == {"HTTP/1.1"}
    assert {r.protocol for r in requests if r.host != h1_host} == {"HTTP/2.0"}
    # politeness: one request at a time per host, DELAY apart (nginx logs when a response is done)
    by_host: dict[str, list[float]] = defaultdict(list)
    for r in requests:
        by_host[r.host].append(r.time)
    gaps = [b - a for times in by_host.values() for a, b in zip(sorted(times), sorted(times)[1:])]
    assert gaps and min(gaps) >= DELAY - 0.005  # the log's times are to the millisecond
    # the records: HTTP/2 exchanges say so, the HTTP/1.1 host's do not
    protocols: dict[str, set[str | None]] = defaultdict(set)
    for path in sorted((tmp_path / "node" / "warc").glob("*.warc.gz")):
        with open(path, "rb") as f:
            for record in ArchiveIterator(f):
                if record.rec_type == "response":
                    uri = record.rec_headers.get_header("WARC-Target-URI")
                    protocols[uri.split("/")[2].split(":")[0]].add(record.rec_headers.get_header("WARC-Protocol"))
    assert protocols[h1_host] == {None}
    assert all(p == {"h2"} for host, p in protocols.items() if host != h1_host)
    assert web.h2_only & set(protocols) and web.proxy_only & set(protocols)
    # /status lists the proxy: healthy, used for each proxy-only host's connection, never failed
    (proxy,) = proxies
    assert proxy["proxy"] == f"socks5://127.0.0.1:{socks.port}" and proxy["healthy"] and proxy["failures"] == 0
    assert proxy["uses"] >= len(web.proxy_only)
    assert not any(kind.startswith("tls") or kind == "proxy" for kind in errors), errors
