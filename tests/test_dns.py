"""The node's resolver against a real DNS server on loopback, and that server itself."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import dns.message
import dns.query
import dns.rcode
import pytest
import trio
import trio.testing

from peer.fetch.dns import CachingResolver, parse_nameserver, system_nameservers
from peer.fetch.errors import DnsError, DnsTimeout, NoAddress, NxDomain, RefusedAddress, ServFail
from peerlab.localweb.dns_server import DnsServer, read_zone_file, serve_dns


@pytest.fixture
def clock() -> trio.testing.MockClock:
    # Jump virtual time only after 20 ms of real idleness, so answers over real loopback sockets come first.
    return trio.testing.MockClock(autojump_threshold=0.02)


def ns(server: DnsServer) -> str:
    return f"{server.address[0]}:{server.address[1]}"


async def start(nursery: trio.Nursery, zone: dict, **kwargs) -> DnsServer:
    return await nursery.start(lambda task_status: serve_dns(zone, task_status=task_status, **kwargs))


async def test_a_record_resolved_then_cached(nursery: trio.Nursery) -> None:
    server = await start(nursery, {"a.test": "127.0.0.1"})
    resolver = CachingResolver([ns(server)], allow_private=True)
    assert await resolver.resolve("a.test") == "127.0.0.1"
    assert await resolver.resolve("A.Test.") == "127.0.0.1"
    assert server.queries == [("a.test", "A")]
    assert (resolver.stats.hits, resolver.stats.misses, resolver.stats.queries) == (1, 1, 1)


async def test_nxdomain_is_cached_negatively(nursery: trio.Nursery, clock: trio.testing.MockClock) -> None:
    server = await start(nursery, {"a.test": "127.0.0.1"}, nxdomain=["gone.test"])
    resolver = CachingResolver([ns(server)], negative_ttl=300.0)
    for name in ("missing.test", "missing.test", "gone.test", "gone.test"):
        with pytest.raises(DnsError) as info:
            await resolver.resolve(name)
        assert type(info.value) is NxDomain and info.value.label == "nxdomain"
        assert "\n" not in str(info.value) and name in str(info.value)
    assert server.queries == [("missing.test", "A"), ("gone.test", "A")]
    assert resolver.stats.failures == {"nxdomain": 4}
    await trio.sleep(300.0)
    with pytest.raises(DnsError):
        await resolver.resolve("missing.test")
    assert server.queries[-1] == ("missing.test", "A") and len(server.queries) == 3


@pytest.mark.parametrize(("ttl", "expected"), [(5, 60.0), (100, 100.0), (86400, 1800.0)])
async def test_ttl_clamped_and_expiry_exact(
    nursery: trio.Nursery, clock: trio.testing.MockClock, ttl: int, expected: float
) -> None:
    server = await start(nursery, {"a.test": "127.0.0.1"}, ttl=ttl)
    resolver = CachingResolver([ns(server)], allow_private=True, min_ttl=60.0, max_ttl=1800.0)
    t0 = trio.current_time()
    await resolver.resolve("a.test")
    assert trio.current_time() == t0
    await trio.sleep(expected - 0.001)
    await resolver.resolve("a.test")
    assert len(server.queries) == 1
    await trio.sleep(0.001)
    assert trio.current_time() == t0 + expected
    await resolver.resolve("a.test")
    assert len(server.queries) == 2


async def test_concurrent_lookups_of_one_name_send_one_query(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    server = await start(nursery, {"a.test": "127.0.0.1"}, delay=0.5)
    resolver = CachingResolver([ns(server)], allow_private=True)
    results: list[str] = []

    async def one() -> None:
        results.append(await resolver.resolve("a.test"))

    async with trio.open_nursery() as inner:
        for _ in range(10):
            inner.start_soon(one)
    assert results == ["127.0.0.1"] * 10
    assert server.queries == [("a.test", "A")]
    assert resolver.stats.queries == 1 and resolver.stats.misses == 10
    assert trio.current_time() == 0.5


async def test_waiters_retry_when_the_querying_task_is_cancelled(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    server = await start(nursery, {"a.test": "127.0.0.1"}, delay=1.0)
    resolver = CachingResolver([ns(server)], allow_private=True)
    got: list[str] = []

    async def waiter() -> None:
        got.append(await resolver.resolve("a.test"))

    async with trio.open_nursery() as inner:
        with trio.CancelScope() as leader:
            inner.start_soon(waiter)  # starts after the leader below has sent its query

            async def cancel_soon() -> None:
                await trio.sleep(0.25)
                leader.cancel()

            inner.start_soon(cancel_soon)
            await resolver.resolve("a.test")
    assert leader.cancelled_caught
    assert got == ["127.0.0.1"]
    assert len(server.queries) == 2  # the waiter asked again
    assert trio.current_time() == 1.25


async def test_private_addresses_refused_unless_allowed(nursery: trio.Nursery) -> None:
    server = await start(nursery, {"lan.test": "10.0.0.5", "mixed.test": ["192.168.1.2", "93.184.216.34"]})
    strict = CachingResolver([ns(server)])
    for host in ("lan.test", "192.168.1.1", "[::1]", "169.254.1.1", "localhost", "0.0.0.0", "224.0.0.1"):
        with pytest.raises(DnsError) as info:
            await strict.resolve(host)
        assert type(info.value) is RefusedAddress and info.value.label == "refused-address", host
    assert await strict.resolve("mixed.test") == "93.184.216.34"
    assert await strict.resolve("8.8.8.8") == "8.8.8.8"
    assert server.queries == [("lan.test", "A"), ("mixed.test", "A")]  # literals and localhost ask no one
    relaxed = CachingResolver([ns(server)], allow_private=True)
    assert await relaxed.resolve("lan.test") == "10.0.0.5"
    assert await relaxed.resolve("localhost") == "127.0.0.1"
    assert await relaxed.resolve("[::1]") == "::1"


async def test_timeout_against_a_server_that_never_answers(clock: trio.testing.MockClock) -> None:
    sink = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await sink.bind(("127.0.0.1", 0))
    received: list[float] = []

    async def drop_all() -> None:
        while True:
            await sink.recvfrom(65535)
            received.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drop_all)
        resolver = CachingResolver([f"127.0.0.1:{sink.getsockname()[1]}"], timeout=5.0, min_ttl=60.0)
        with pytest.raises(DnsError) as info:
            await resolver.resolve("slow.test")
        assert type(info.value) is DnsTimeout and info.value.label == "timeout"
        assert trio.current_time() == 5.0
        assert received == [0.0, 1.0, 3.0]  # retransmissions after 1 s, then 2 s
        with pytest.raises(DnsError) as again:
            await resolver.resolve("slow.test")  # cached failure: no new datagram
        assert type(again.value) is DnsTimeout and again.value.label == "timeout" and len(received) == 3
        assert resolver.stats.failures == {"timeout": 2}
        # a time-out is kept for a second only, not for min_ttl: a retry after its back-off asks again
        await trio.sleep(1.0)
        with pytest.raises(DnsError):
            await resolver.resolve("slow.test")
        assert len(received) == 6 and resolver.stats.failures == {"timeout": 3}
        nursery.cancel_scope.cancel()
    sink.close()


async def test_second_name_server_used_when_first_is_silent(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    server = await start(nursery, {"a.test": "127.0.0.1"})
    silent = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await silent.bind(("127.0.0.1", 0))
    with silent:
        resolver = CachingResolver([f"127.0.0.1:{silent.getsockname()[1]}", ns(server)], allow_private=True)
        assert await resolver.resolve("a.test") == "127.0.0.1"
        assert trio.current_time() == 1.0


async def test_servfail_and_no_address(nursery: trio.Nursery) -> None:
    server = await start(nursery, {"empty.test": []}, servfail=["broken.test"])
    resolver = CachingResolver([ns(server)], allow_private=True)
    with pytest.raises(DnsError) as info:
        await resolver.resolve("broken.test")
    assert type(info.value) is ServFail and info.value.label == "servfail" and "SERVFAIL" in str(info.value)
    with pytest.raises(DnsError) as info:
        await resolver.resolve("empty.test")
    assert type(info.value) is NoAddress and info.value.label == "no-address"
    assert server.queries == [("broken.test", "A"), ("empty.test", "A"), ("empty.test", "AAAA")]


async def test_ipv6_only_name_and_truncated_answer_over_tcp(nursery: trio.Nursery) -> None:
    many = [f"93.184.{i // 200}.{i % 200 + 1}" for i in range(120)]
    server = await start(nursery, {"v6.test": "2606:4700::1", "many.test": many})
    resolver = CachingResolver([ns(server)])
    assert await resolver.resolve("v6.test") == "2606:4700::1"
    assert await resolver.resolve("many.test") in many
    # many.test: UDP answer truncated (TC), asked again over TCP.
    assert server.queries == [("v6.test", "A"), ("v6.test", "AAAA"), ("many.test", "A"), ("many.test", "A")]


async def test_cache_is_bounded_lru(nursery: trio.Nursery) -> None:
    server = await start(nursery, {"*.test": "127.0.0.1"})
    resolver = CachingResolver([ns(server)], allow_private=True, cache_size=2)
    for name in ("a.test", "b.test", "a.test", "c.test", "a.test", "b.test"):
        await resolver.resolve(name)
    # b.test was the least recently used when c.test arrived, so only it was asked twice.
    assert [q[0] for q in server.queries] == ["a.test", "b.test", "c.test", "b.test"]


async def test_zone_changes_while_serving(nursery: trio.Nursery) -> None:
    server = await start(nursery, {})
    resolver = CachingResolver([ns(server)], allow_private=True, negative_ttl=0.0, min_ttl=0.0)
    with pytest.raises(DnsError):
        await resolver.resolve("late.test")
    server.zone["late.test"] = "127.0.0.7"
    with trio.fail_after(1):
        while True:  # the failure is cached for 0 s; bounded by fail_after
            try:
                assert await resolver.resolve("late.test") == "127.0.0.7"
                break
            except DnsError:
                await trio.sleep(0.01)


def test_parse_nameserver() -> None:
    assert parse_nameserver("1.2.3.4") == ("1.2.3.4", 53)
    assert parse_nameserver("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_nameserver("[::1]:5300") == ("::1", 5300)
    assert parse_nameserver("::1") == ("::1", 53)
    for bad in ("example.com", "1.2.3.4:0", "1.2.3.4:x", "[::1]:99999", ""):
        with pytest.raises(ValueError):
            parse_nameserver(bad)


def test_system_nameservers(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text("# comment\nsearch example\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\nnameserver junk\n")
    assert system_nameservers(str(conf)) == [("10.0.0.2", 53), ("fe80::1", 53)]
    assert system_nameservers(str(tmp_path / "absent")) == [("127.0.0.1", 53)]


def test_resolver_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        CachingResolver(["127.0.0.1"], min_ttl=100, max_ttl=10)
    with pytest.raises(ValueError):
        CachingResolver(["not an address"])


async def test_server_answers_aaaa_empty_and_wildcards(nursery: trio.Nursery) -> None:
    server = await start(nursery, {"a.test": "127.0.0.1", "*.web.test": ["127.0.0.2", "::2"]}, ttl=42)
    host, port = server.address

    def ask(name: str, rdtype: str, tcp: bool = False) -> dns.message.Message:
        query = dns.message.make_query(name, rdtype)
        send = dns.query.tcp if tcp else dns.query.udp
        return send(query, host, port=port, timeout=5)

    response = await trio.to_thread.run_sync(ask, "a.test", "AAAA")
    assert response.rcode() == dns.rcode.NOERROR and response.answer == []
    response = await trio.to_thread.run_sync(ask, "x.y.web.test", "A", True)
    assert [r.to_text() for r in response.answer] == ["x.y.web.test. 42 IN A 127.0.0.2"]
    response = await trio.to_thread.run_sync(ask, "web.test", "A")
    assert response.rcode() == dns.rcode.NXDOMAIN
    assert server.queries == [("a.test", "AAAA"), ("x.y.web.test", "A"), ("web.test", "A")]


def test_zone_file_parsing(tmp_path: Path) -> None:
    good = tmp_path / "zone.txt"
    good.write_text("# hosts\nA.test 127.0.0.1\na.test ::1  # two lines, one name\n\n*.w.test 127.0.0.2 127.0.0.3\n")
    assert read_zone_file(str(good)) == {"a.test": ["127.0.0.1", "::1"], "*.w.test": ["127.0.0.2", "127.0.0.3"]}
    bad = tmp_path / "bad.txt"
    bad.write_text("a.test 127.0.0.1\nb.test not-an-ip\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        read_zone_file(str(bad))


@pytest.mark.slow
def test_server_runs_as_a_process(tmp_path: Path) -> None:
    zone = tmp_path / "zone.txt"
    zone.write_text("demo.test 127.0.0.1\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "peerlab.localweb.dns_server", "--zone-file", str(zone), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("listening 127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        response = dns.query.udp(dns.message.make_query("demo.test", "A"), "127.0.0.1", port=port, timeout=5)
        assert [r.to_text() for r in response.answer] == ["demo.test. 300 IN A 127.0.0.1"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


@pytest.mark.slow  # a server process
def test_server_process_reports_a_bad_zone_file(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "peerlab.localweb.dns_server", "--zone-file", str(tmp_path / "absent.txt")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "cannot read zone file" in result.stderr


async def test_cache_size_zero_asks_every_time(nursery):
    from peer.fetch.dns import CachingResolver
    from peerlab.localweb.dns_server import serve_dns

    server = await nursery.start(serve_dns, {"a.example": "192.0.2.7"})
    resolver = CachingResolver([f"127.0.0.1:{server.address[1]}"], cache_size=0, allow_private=True)
    assert resolver.cache is None
    for _ in range(3):
        assert await resolver.resolve("a.example") == "192.0.2.7"
    asked = [q for q in server.queries if str(q[0]).rstrip(".").lower() == "a.example"]
    assert resolver.stats.hits == 0 and resolver.stats.misses == 3
    assert [t for _, t in asked].count("A") == 3
