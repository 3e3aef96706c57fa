"""Four real peerd daemons crawl a local web whose 30 hosts share three loopback addresses, with
--ip-connections 1 and --ip-delay: from the web server's own log, never more than one request in service on an
address across the whole fleet, no gap shorter than the delay, and every page fetched. One daemon joins during
the crawl and one is killed, so addresses change owners while lanes are lent."""

from __future__ import annotations

import json
import signal

import httpx
import pytest
import trio

from peer.control import auth_headers
from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.referee import address_gaps, max_in_service_per_address
from peerlab.localweb.server import serve_web
from tests.support.crawl import child_env, kill_pid, node_config, peerd_argv, urls_fetched
from tests.test_cluster_daemons import _paused, _post

SECRET = "test-cluster-secret-0123456789"
ADDRESSES = ("127.0.2.1", "127.0.2.2", "127.0.2.3")
IP_DELAY = 0.2


@pytest.mark.slow
async def test_four_daemons_keep_one_request_per_address(tmp_path) -> None:
    graph = SiteGraph.generate(seed=21, hosts=30, pages_per_host=5, links_per_page=6, seed_hosts=4, features=False)
    env = child_env()
    env["PEERCRAWL_CLUSTER_SECRET"] = SECRET
    env["PEERCRAWL_TOTAL_TIMEOUT"] = "3"  # bounds a request's time in service, so a lost lane is back in 5 s
    procs: dict[str, trio.Process] = {}
    async with trio.open_nursery() as nursery:
        web = await nursery.start(lambda task_status: serve_web(graph, addresses=ADDRESSES, task_status=task_status))
        dns = await nursery.start(serve_dns, graph.zone(ADDRESSES))
        expected = web.expected()
        seed_addr = None

        async def start(name: str) -> None:
            nonlocal seed_addr
            cfg = node_config(tmp_path / name, web, dns, node_id=name, delay=0.0, concurrency=16)
            argv = peerd_argv(cfg) + ["--ip-connections", "1", "--ip-delay", str(IP_DELAY),
                                      "--suspicion-timeout", "2", "--contact", f"https://nodes.test/{name}"]
            if seed_addr:
                argv += ["--join", seed_addr]
            log = open(tmp_path / f"{name}.log", "ab")  # noqa: SIM115 - closed with the test's tmp dir
            procs[name] = await trio.lowlevel.open_process(argv, env=env, stderr=log)
            # a bound, not a wait: starting a daemon on a loaded 2-core machine has taken over 30 s
            with trio.fail_after(120):
                while not (tmp_path / name / "peer.addr").exists():
                    assert procs[name].poll() is None, (tmp_path / f"{name}.log").read_text()[-2000:]
                    await trio.sleep(0.05)
            seed_addr = seed_addr or (tmp_path / name / "peer.addr").read_text().strip()

        class Nodes:  # what the pause helpers read: the data dirs and the control addresses
            tmp = tmp_path

            @staticmethod
            def control(name: str) -> str:
                return (tmp_path / name / "control.addr").read_text().strip()

        async def while_paused(via: str, starting: str, names: set[str]) -> None:
            """Start `starting` with the crawl paused: a start has taken 20-40 s on a loaded machine, in which
            the others would finish the crawl."""
            await _post(Nodes.control(via), "/pause", tmp_path / via)
            await start(starting)
            await _paused(Nodes, names)
            await _post(Nodes.control(via), "/resume", tmp_path / via)

        try:
            await start("A")
            await while_paused("A", "B", {"A", "B"})
            await while_paused("A", "C", {"A", "B", "C"})
            with trio.fail_after(120):
                while len(urls_fetched(web, expected)) < 0.3 * len(expected.fetched):
                    await trio.sleep(0.05)
            await while_paused("A", "D", {"A", "B", "C", "D"})  # joins mid-crawl: addresses move to it
            with trio.fail_after(120):
                while len(urls_fetched(web, expected)) < 0.6 * len(expected.fetched):
                    await trio.sleep(0.05)
            kill_pid(procs["B"].pid, signal.SIGKILL)  # dies holding lanes: they come back by lease expiry
            await procs["B"].wait()
            # A declares B dead (suspicion 2 s): its addresses and hosts move to the others
            control = (tmp_path / "A" / "control.addr").read_text().strip()
            async with httpx.AsyncClient(timeout=30.0) as client:
                with trio.fail_after(90):
                    while True:
                        view = (await client.get(f"http://{control}/cluster",
                                                 headers=auth_headers(tmp_path / "A"))).json()
                        if {n["node_id"]: n["state"] for n in view["nodes"]}.get("B") == "dead":
                            break
                        await trio.sleep(0.1)
            # back from its data dir, with the queue it had (restarted as a supervisor would)
            for name in ("peer.addr", "control.addr"):
                (tmp_path / "B" / name).unlink(missing_ok=True)
            await while_paused("A", "B", {"A", "B", "C", "D"})
            with trio.fail_after(240):
                for name in ("A", "B", "C", "D"):
                    assert await procs[name].wait() == 0, (tmp_path / f"{name}.log").read_text()[-2000:]
        finally:
            for proc in procs.values():
                kill_pid(proc.pid)
        nursery.cancel_scope.cancel()

    (tmp_path / "web.log").write_text("".join(r.to_json() + "\n" for r in web.log))
    fetched = urls_fetched(web, expected)
    assert set(expected.fetched) - fetched == set()
    assert {r.address for r in web.log} == set(ADDRESSES)
    in_service = max_in_service_per_address(web.log)
    assert in_service == dict.fromkeys(ADDRESSES, 1), in_service
    # the server stamps a request's end right after its last byte went to the kernel, before its task yields,
    # and its start once the head is read, in one thread: an overlap in the log is an overlap on the wire. A
    # gap can only look shorter by the time the OS kept the server's process off the CPU between that write
    # and reading the clock (two statements); 20 ms of slack covers that on a loaded machine, a tenth of the
    # delay, so a lane reused without its delay still fails
    gaps = address_gaps(web.log)
    assert min(gaps.values()) >= IP_DELAY - 0.02, gaps
    fetchers = {r.user_agent.rsplit("/", 1)[-1].rstrip(")") for r in web.log}
    assert {"A", "C", "D"} <= fetchers  # the fleet shared the addresses
    lanes = {}
    for name in ("A", "B", "C", "D"):
        for line in (tmp_path / f"{name}.log").read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("msg") == "node stopped":
                lanes[name] = json.loads(line)
    print({n: {k: v for k, v in s.items() if k in ("pages", "address_waits")} for n, s in lanes.items()})
