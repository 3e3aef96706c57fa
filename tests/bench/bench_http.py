"""Fetch throughput and client CPU per request: our Fetcher, httpx over HttpxTransport, and stock httpx.

Run: python -m tests.bench.bench_http [--requests 5000] [--seconds 30] [--hosts 1000] [--concurrency 256]

A local web on 127.0.0.1 (two forked asyncio worker processes sharing one listening socket, answering every
request with the same ~15 KB page over keep-alive) serves 1,000 host names, all resolved to 127.0.0.1 by the
local DNS server (``peerlab.localweb.dns_server``, a separate process). The client runs 256 requests in flight,
host after host, and each mode stops after ``--requests`` requests or ``--seconds`` seconds. Modes:

- fetcher: ``peer.fetch.http.Fetcher`` called directly (what the crawl engine uses);
- httpx+transport: ``httpx.AsyncClient(transport=HttpxTransport(fetcher))``;
- httpx stock (the reference): ``httpx.AsyncClient`` with its own pool (limits raised to 256 connections),
  names resolved by the same caching resolver through an httpcore network backend, so only the pool and the
  client layer differ.

Figures are requests/s and client CPU µs per request (process time of this process; the servers run in other
processes), each beside the stock httpx figure as a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable

import httpcore
import httpx
import trio

from peer.fetch.dns import CachingResolver
from peer.fetch.http import Fetcher, FetchError, HttpxTransport

UA = "peercrawl-bench/1 (+http://127.0.0.1/)"


def make_page(size: int = 15_000, links: int = 30) -> bytes:
    parts = [b"<!DOCTYPE html><html><head><meta charset='utf-8'><title>bench</title></head><body>\n"]
    for i in range(links):
        parts.append(b"<p>item %d <a href='/p/%d.html'>link %d</a></p>\n" % (i, i, i))
    body = b"".join(parts)
    filler = b"<p>" + b"lorem ipsum dolor sit amet " * 20 + b"</p>\n"
    while len(body) + len(filler) < size - 20:
        body += filler
    return body + b"</body></html>\n"


def _serve_worker(sock: socket.socket, response: bytes) -> None:
    """One server process: asyncio protocol answering each request head with the prebuilt response."""

    class Page(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            buf = self.buf + data
            count = buf.count(b"\r\n\r\n")
            if count:
                self.transport.write(response * count)  # type: ignore[attr-defined]
                buf = buf[buf.rfind(b"\r\n\r\n") + 4 :]
            self.buf = buf

    loop = asyncio.new_event_loop()
    loop.run_until_complete(loop.create_server(Page, sock=sock, backlog=1024))
    loop.run_forever()


def start_web(workers: int = 2) -> tuple[int, list[multiprocessing.Process]]:
    page = make_page()
    response = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n" % len(page) + page
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_serve_worker, args=(sock, response), daemon=True) for _ in range(workers)]
    for proc in procs:
        proc.start()
    port = sock.getsockname()[1]
    sock.close()
    return port, procs


def start_dns(hosts: Iterable[str]) -> tuple[str, subprocess.Popen[str], str]:
    fd, zone_path = tempfile.mkstemp(suffix=".zone")
    with os.fdopen(fd, "w") as f:
        for host in hosts:
            f.write(f"{host} 127.0.0.1\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "peerlab.localweb.dns_server", "--zone-file", zone_path, "--ttl", "3600"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("listening "):
        proc.kill()
        raise SystemExit(f"bench_http: the DNS server did not start (said {line!r})")
    return line.removeprefix("listening "), proc, zone_path


class ResolvingBackend(httpcore.AsyncNetworkBackend):
    """httpcore's own backend, with names resolved by our caching resolver (as our fetcher does)."""

    def __init__(self, resolver: CachingResolver) -> None:
        from httpcore._backends.auto import AutoBackend

        self._inner = AutoBackend()
        self._resolver = resolver

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # type: ignore[no-untyped-def]
        ip = await self._resolver.resolve(host)
        return await self._inner.connect_tcp(ip, port, timeout, local_address, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


async def drive(
    get: Callable[[str], Awaitable[int]], urls: list[str], concurrency: int, seconds: float
) -> tuple[int, int, float, float]:
    """Run ``get`` over ``urls`` with ``concurrency`` in flight; (done, errors, wall s, cpu s)."""
    it = iter(urls)
    done = errors = 0
    deadline = trio.current_time() + seconds

    async def worker() -> None:
        nonlocal done, errors
        for url in it:
            if trio.current_time() > deadline:
                return
            try:
                status = await get(url)
                if status != 200:
                    errors += 1
            except (FetchError, httpx.HTTPError, OSError):
                errors += 1
            done += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return done, errors, time.perf_counter() - wall0, time.process_time() - cpu0


async def measure(
    name: str, get: Callable[[str], Awaitable[int]], args: argparse.Namespace, urls: list[str], results: dict
) -> None:
    """A cold pass (new connections to every host) then a warm one (keep-alive), each recorded."""
    cold, warm = urls[: args.requests], urls[args.requests :]
    results[f"{name} cold"] = await drive(get, cold, args.concurrency, args.seconds)
    results[f"{name} warm"] = await drive(get, warm, args.concurrency, args.seconds)


async def run(args: argparse.Namespace) -> None:
    hosts = [f"h{i}.bench.test" for i in range(args.hosts)]
    port, web_procs = start_web()
    nameserver, dns_proc, zone_path = start_dns(hosts)
    urls = [f"http://{hosts[i % len(hosts)]}:{port}/p/{i // len(hosts)}.html" for i in range(2 * args.requests)]
    results: dict[str, tuple[int, int, float, float]] = {}
    modes = set(args.modes.split(","))
    try:
        resolver = CachingResolver([nameserver], allow_private=True)
        for host in hosts:  # every mode starts with the names cached: DNS is not what is measured here
            await resolver.resolve(host)
        if "fetcher" in modes:
            async with Fetcher(resolver, user_agent=UA, max_idle_total=2 * args.hosts) as fetcher:

                async def get_fetcher(url: str) -> int:
                    return (await fetcher.fetch(url)).status

                await measure("fetcher", get_fetcher, args, urls, results)

        if "transport" in modes:
            async with (
                Fetcher(resolver, user_agent=UA, max_idle_total=2 * args.hosts) as fetcher,
                httpx.AsyncClient(transport=HttpxTransport(fetcher)) as client,
            ):

                async def get_transport(url: str) -> int:
                    return (await client.get(url)).status_code

                await measure("httpx+transport", get_transport, args, urls, results)

        if "stock" in modes:
            limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
            stock_transport = httpx.AsyncHTTPTransport(limits=limits)
            stock_transport._pool = httpcore.AsyncConnectionPool(  # the stock pool, with our resolver plugged in
                max_connections=args.concurrency,
                max_keepalive_connections=args.concurrency,
                keepalive_expiry=5.0,
                network_backend=ResolvingBackend(resolver),
            )
            async with httpx.AsyncClient(transport=stock_transport, headers={"User-Agent": UA}) as client:

                async def get_stock(url: str) -> int:
                    return (await client.get(url)).status_code

                await measure("httpx stock", get_stock, args, urls, results)
    finally:
        for proc in web_procs:
            proc.terminate()
        dns_proc.send_signal(signal.SIGTERM)
        dns_proc.wait(timeout=10)
        os.unlink(zone_path)
        for proc in web_procs:
            proc.join(timeout=10)

    report(args, results)


def report(args: argparse.Namespace, results: dict[str, tuple[int, int, float, float]]) -> None:
    print(
        f"HTTP fetch over {args.hosts} hosts on 127.0.0.1, ~15 KB pages, {args.concurrency} in flight "
        f"(per pass at most {args.requests} requests or {args.seconds:g} s; cold: new connections, warm: keep-alive)"
    )
    print(f"{'mode':<22}{'requests':>9}{'errors':>8}{'req/s':>10}{'CPU µs/req':>12}{'req/s vs ref':>14}{'CPU vs ref':>12}")
    for name, (done, errors, wall, cpu) in results.items():
        rate, cpu_us = done / wall, cpu / done * 1e6
        line = f"{name:<22}{done:>9}{errors:>8}{rate:>10.0f}{cpu_us:>12.0f}"
        ref = results.get("httpx stock " + name.rsplit(" ", 1)[1])
        if ref is not None:
            ref_rate, ref_cpu_us = ref[0] / ref[2], ref[3] / ref[0] * 1e6
            line += f"{rate / ref_rate:>13.2f}x{cpu_us / ref_cpu_us:>11.2f}x"
        print(line)
    print("reference: httpx stock, same pass (req/s ratio > 1 and CPU ratio < 1 favour the mode)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--modes", default="fetcher,transport,stock", help="comma-separated subset to run")
    trio.run(run, parser.parse_args())


if __name__ == "__main__":
    main()
