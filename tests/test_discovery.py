"""``srv_seeds`` against a real DNS server serving SRV records on loopback (the local web's, peerlab/localweb)."""

from __future__ import annotations

import pytest
import trio

from peer.cluster.net.discovery import DiscoveryError, srv_seeds
from peerlab.localweb.dns_server import DnsServer, Srv, serve_dns

NAME = "_peer._tcp.peerd.crawl.svc.cluster.local"


async def start(nursery: trio.Nursery, records: dict, **kwargs) -> DnsServer:
    return await nursery.start(lambda task_status: serve_dns({}, srv=records, task_status=task_status, **kwargs))


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


async def test_records_ordered_by_priority_then_weight(nursery: trio.Nursery) -> None:
    records = [
        Srv(priority=20, weight=100, port=7400, target="d.peerd.test"),
        Srv(priority=10, weight=5, port=7400, target="c.peerd.test"),
        Srv(priority=10, weight=50, port=7401, target="b.peerd.test"),
        Srv(priority=10, weight=50, port=7400, target="A.peerd.test"),
    ]
    server = await start(nursery, {NAME: records})
    seeds = await srv_seeds(NAME, nameservers=[server.nameserver])
    assert seeds == ["a.peerd.test:7400", "b.peerd.test:7401", "c.peerd.test:7400", "d.peerd.test:7400"]
    assert server.queries == [(NAME, "SRV")]
    # The order depends on the records only, not on the order the server lists them in.
    server.srv[NAME] = list(reversed(records))
    assert await srv_seeds(NAME, nameservers=[server.nameserver]) == seeds


async def test_our_own_address_is_left_out(nursery: trio.Nursery) -> None:
    server = await start(nursery, {NAME: [
        Srv(priority=0, weight=10, port=7400, target="peerd-0.peerd.crawl.svc.cluster.local"),
        Srv(priority=0, weight=10, port=7400, target="peerd-1.peerd.crawl.svc.cluster.local"),
    ]})
    seeds = await srv_seeds(
        NAME + ".", nameservers=[server.nameserver], exclude=["PEERD-1.peerd.crawl.svc.cluster.local.:7400"]
    )
    assert seeds == ["peerd-0.peerd.crawl.svc.cluster.local:7400"]
    # Same host on another port is another node: it stays.
    seeds = await srv_seeds(NAME, nameservers=[server.nameserver],
                            exclude=["peerd-1.peerd.crawl.svc.cluster.local:7999"])
    assert len(seeds) == 2


async def test_only_ourselves_means_a_new_cluster(nursery: trio.Nursery) -> None:
    server = await start(nursery, {NAME: [Srv(priority=0, weight=1, port=7400, target="self.test")]})
    assert await srv_seeds(NAME, nameservers=[server.nameserver], exclude=["self.test:7400"]) == []


async def test_zone_changes_are_seen_at_once(nursery: trio.Nursery) -> None:
    server = await start(nursery, {NAME: [Srv(priority=0, weight=1, port=7400, target="a.test")]})
    assert await srv_seeds(NAME, nameservers=[server.nameserver]) == ["a.test:7400"]
    server.srv[NAME].append(Srv(priority=0, weight=2, port=7400, target="b.test"))
    assert await srv_seeds(NAME, nameservers=[server.nameserver]) == ["b.test:7400", "a.test:7400"]
    assert len(server.queries) == 2


async def test_nxdomain(nursery: trio.Nursery) -> None:
    server = await start(nursery, {NAME: []})
    with pytest.raises(DiscoveryError) as info:
        await srv_seeds("_peer._tcp.nothere.test", nameservers=[server.nameserver])
    assert one_line(info.value) == "SRV _peer._tcp.nothere.test: no such name (NXDOMAIN)"


async def test_name_without_srv_record(nursery: trio.Nursery) -> None:
    server = await start(nursery, {NAME: []})  # the name exists, with no SRV record
    with pytest.raises(DiscoveryError) as info:
        await srv_seeds(NAME, nameservers=[server.nameserver])
    assert one_line(info.value) == f"SRV {NAME}: the name exists but has no SRV record"
    assert server.queries == [(NAME, "SRV")]


async def test_timeout_names_the_servers(nursery: trio.Nursery) -> None:
    server = await start(nursery, {NAME: [Srv(priority=0, weight=1, port=7400, target="a.test")]}, silent=True)
    with pytest.raises(DiscoveryError) as info:
        await srv_seeds(NAME, nameservers=[server.nameserver], timeout=0.6)
    text = one_line(info.value)
    assert text.startswith(f"SRV {NAME}: no answer from ") and text.endswith("within 0.6 s")
    assert str(server.address[1]) in text
    assert server.queries and all(q == (NAME, "dropped") for q in server.queries)


async def test_a_silent_server_is_passed_over_for_the_next(nursery: trio.Nursery) -> None:
    records = {NAME: [Srv(priority=0, weight=1, port=7400, target="a.test")]}
    silent = await start(nursery, records, silent=True)
    good = await start(nursery, records)
    seeds = await srv_seeds(NAME, nameservers=[silent.nameserver, good.nameserver], timeout=2.0)
    assert seeds == ["a.test:7400"]
    assert silent.queries == [(NAME, "dropped")] and good.queries == [(NAME, "SRV")]


async def test_servfail(nursery: trio.Nursery) -> None:
    server = await start(nursery, {}, servfail=[NAME])
    with pytest.raises(DiscoveryError) as info:
        await srv_seeds(NAME, nameservers=[server.nameserver])
    text = one_line(info.value)
    assert text.startswith(f"SRV {NAME}: every name server failed") and "SERVFAIL" in text


async def test_dot_target_means_not_available(nursery: trio.Nursery) -> None:
    server = await start(nursery, {NAME: [Srv(priority=0, weight=0, port=0, target=".")]})
    with pytest.raises(DiscoveryError) as info:
        await srv_seeds(NAME, nameservers=[server.nameserver])
    assert "not available" in one_line(info.value)


@pytest.mark.parametrize(("name", "servers", "message"), [
    ("", ["127.0.0.1:53"], "SRV name is empty"),
    ("bad..name", ["127.0.0.1:53"], "SRV bad..name: not a valid DNS name"),
    (NAME, ["ns.example:53"], f"SRV {NAME}: name server 'ns.example:53' is not ADDR[:PORT] with an IP address"),
])
async def test_bad_arguments(name: str, servers: list[str], message: str) -> None:
    with pytest.raises(DiscoveryError) as info:
        await srv_seeds(name, nameservers=servers)
    assert one_line(info.value).startswith(message)


async def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout must be positive"):
        await srv_seeds(NAME, nameservers=["127.0.0.1:53"], timeout=0)
