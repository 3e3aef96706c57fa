"""Per-address politeness: the lanes on their own, then a real crawl of a local web whose hosts share a few
loopback addresses, judged by the web server's own log (requests in service per address, gaps between them)."""

from __future__ import annotations

import math

import pytest
import trio

from peer.config import ConfigError, load
from peer.crawl.addressgate import AddressGate, Lane
from peer.node import Node
from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import address_gaps, max_in_service_per_address
from peerlab.localweb.server import serve_web

from .support.crawl import node_config, urls_fetched

ADDRESSES = ("127.0.1.1", "127.0.1.2", "127.0.1.3")


def test_lanes_cap_requests_in_service_and_rest_after_each() -> None:
    gate = AddressGate(2, 0.5)
    a = gate.try_acquire("10.0.0.1", 0.0)
    b = gate.try_acquire("10.0.0.1", 0.0)
    assert isinstance(a, Lane) and isinstance(b, Lane) and a.index != b.index
    assert gate.try_acquire("10.0.0.1", 0.1) == math.inf  # both in service: free only after one ends
    assert isinstance(gate.try_acquire("10.0.0.2", 0.1), Lane)  # another address has its own lanes
    assert gate.in_service("10.0.0.1") == 2
    gate.release(a, 1.0)
    assert gate.try_acquire("10.0.0.1", 1.2) == 1.5  # rests 0.5 s after the request ended
    c = gate.try_acquire("10.0.0.1", 1.5)
    assert isinstance(c, Lane) and c.index == a.index
    gate.release(c, 1.6, used=False)  # no request was made after all: the lane is as it was
    assert gate.try_acquire("10.0.0.1", 1.5) == c
    assert not AddressGate(0, 0.0).active and AddressGate(1, 0.0).active


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        AddressGate(-1, 0.0)
    with pytest.raises(ValueError):
        AddressGate(0, 1.0)
    with pytest.raises(ConfigError, match="ip_delay needs ip_connections"):
        load(env={}, flags={"ip_connections": 0, "ip_delay": 1.0})
    with pytest.raises(ConfigError, match="ip_connections must be >= 0"):
        load(env={}, flags={"ip_connections": -2})


@pytest.mark.slow  # a whole crawl, a child process or real nodes: seconds
@pytest.mark.parametrize(("connections", "delay"), [(1, 0.1), (2, 0.0)])
async def test_one_node_keeps_per_address_limits_on_a_shared_web(tmp_path, connections: int, delay: float) -> None:
    graph = SiteGraph.generate(seed=7, hosts=18, pages_per_host=6, features=False)
    async with trio.open_nursery() as nursery:
        # each answer takes 20 ms, so requests the crawler has in service together are in service together at
        # the server too (an answer with no wait is written in one step of the server's loop)
        web = await nursery.start(lambda task_status: serve_web(graph, addresses=ADDRESSES, answer_delay=0.02,
                                                                task_status=task_status))
        dns = await nursery.start(serve_dns, graph.zone(ADDRESSES))
        cfg = node_config(tmp_path / "node", web, dns, delay=0.0, ip_connections=connections, ip_delay=delay,
                          concurrency=32, store="none")
        node = Node(cfg)
        parked: list[int] = []  # hosts waiting for a lane of their address, as status reports them

        async def watch() -> None:
            while True:
                if node.crawler is not None:
                    parked.append(node.crawler.hosts_parked())
                await trio.sleep(0.005)

        nursery.start_soon(watch)
        with trio.fail_after(120):
            await node.run()
        nursery.cancel_scope.cancel()
    assert max(parked) > 0 and node.crawler is not None and node.crawler.hosts_parked() == 0
    expected = web.expected(max_body=cfg.max_body)
    assert expected.fetched - urls_fetched(web, expected) == set(), "full coverage"
    assert {r.address for r in web.log} == set(ADDRESSES)
    in_service = max_in_service_per_address(web.log)
    assert max(in_service.values()) == connections, in_service  # never more, and the cap was reached
    if delay:
        # The server stamps a request's end right after its last byte went to the kernel, before its task
        # yields, and its start once the head is read; a gap looks shorter than on the wire only by the time the
        # OS kept this process off the CPU between that write and the clock read: 30 ms of slack for that on a
        # loaded machine. Without the limit the gaps are under a millisecond.
        gaps = address_gaps(web.log)
        assert min(gaps.values()) >= delay - 0.03, gaps
    assert node.final_status["address_waits"] > 0
