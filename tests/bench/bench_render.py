"""What rendering costs, and how often ``--render auto`` renders, on the local web.

Run: ``python -m tests.bench.bench_render [--renders 10000] [--seconds S] [--tabs 2] [--max-pages 200]
[--crawl-hosts 40]``

1. Renders: the render pool (peer/render) renders the local web's script-built page (``/app/home.html``: an
   empty ``<div id="app">``, a script, the JSON it reads: three requests served from memory by the bench, so
   the figure is the browser's and the pool's cost, not the network's) ``--renders`` times, ``--tabs`` at a
   time, the browser restarted every ``--max-pages`` renders. Printed: renders per second, CPU seconds per render
   (the browser's processes, read from /proc before they go, plus this process), renders per CPU-second (per
   core), the browser's memory (proportional set size of its processes) after the first render and every 1,000,
   its peak against the pool's bound, and the renders whose DOM lacked the links the script writes. Reference in the same run: parsing the page
   the render made (``peer.crawl.links.extract``) as many times, so the render's cost reads as a ratio.
2. Share: one node crawls a generated web of real markup (``markup="real"``: pages with scripts in their head
   and an article's text, as real pages are) with its feature hosts (the script-built pages among them) with
   ``--render auto``; printed: pages fetched, pages rendered and their share, the patterns learned, and whether
   every link only a script writes was found.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import trio

from peer.crawl.links import extract
from peer.render import BrowserRequest, PoolLimits, RenderPool, Served, pids_of_group
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.render import render as render_resource

_TICKS = os.sysconf("SC_CLK_TCK")


class GroupCpu:
    """CPU seconds of a process group's processes, summed over every process seen (read before each dies)."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}

    def sample(self, pgid: int | None) -> None:
        if pgid is None:
            return
        for pid in pids_of_group(pgid):
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    stat = fh.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2:].split()
            self.last[pid] = (int(fields[11]) + int(fields[12])) / _TICKS

    @property
    def total(self) -> float:
        return sum(self.last.values())


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def bench_renders(renders: int, tabs: int, max_pages: int, seconds: float) -> None:
    graph = SiteGraph.generate(seed=1, hosts=16, pages_per_host=4)
    host = graph.role("content").name

    async def serve(request: BrowserRequest) -> Served | str:
        path = "/" + request.url.split("/", 3)[3].split("?", 1)[0]
        res = graph.resource(host, path)
        if res is None:
            return "missing"
        answer = render_resource(graph, res, 80)
        return Served(status=answer.status, headers=[(k.decode(), v.decode()) for k, v in answer.headers],
                      body=answer.body)

    limits = PoolLimits(tabs=tabs, max_pages=max_pages, time_limit=20.0)
    pool = RenderPool(limits)
    cpu = GroupCpu()
    at_thousands: list[tuple[int, int, float]] = []  # (renders, browser PSS, seconds)
    first_rss = 0
    done = 0
    failed = 0
    missed = 0
    dom = ""
    start, self_start = time.perf_counter(), _self_cpu()
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.serve_pool)

        async def worker(k: int) -> None:
            nonlocal done, failed, dom, first_rss, missed
            while done + failed < renders and time.perf_counter() - start < seconds:
                try:
                    rendered = await pool.render(f"http://{host}/app/home.html?{k}-{done}", serve)
                    dom = rendered.html
                    missed += "made-1.html" not in dom
                    done += 1
                except Exception:
                    failed += 1
                cpu.sample(pool.pgid)
                first_rss = first_rss or pool.last_rss
                if (done + failed) % 1000 == 0:
                    at_thousands.append((done + failed, pool.last_rss, time.perf_counter() - start))
                    print(f"  {done + failed} renders, browser {pool.last_rss / 2**20:.0f} MiB (peak "
                          f"{pool.peak_rss / 2**20:.0f}), {time.perf_counter() - start:.0f} s, restarts "
                          f"{dict(pool.restarts)}", flush=True)

        async with trio.open_nursery() as workers:
            for k in range(tabs):
                workers.start_soon(worker, k)
        nursery.cancel_scope.cancel()
    wall = time.perf_counter() - start
    node_cpu = _self_cpu() - self_start
    total_cpu = cpu.total + node_cpu
    parse_start = _self_cpu()
    body = dom.encode()
    for _ in range(done):
        extract(body, f"http://{host}/app/home.html", "text/html")
    parse_cpu = max(_self_cpu() - parse_start, 1e-9)
    print(f"renders: {done} done in {wall:.0f} s, {failed} failed, {missed} without the script's links, {tabs} "
          f"tabs, browser restarted every {max_pages}: {dict(pool.restarts)}")
    print(f"  {done / wall:.2f} renders/s; CPU {total_cpu / max(done, 1) * 1000:.0f} ms a render "
          f"(browser {cpu.total / max(done, 1) * 1000:.0f} ms, node {node_cpu / max(done, 1) * 1000:.0f} ms): "
          f"{done / total_cpu:.2f} renders per CPU-second")
    print(f"  reference: parsing the rendered page costs {parse_cpu / max(done, 1) * 1e6:.0f} µs: a render is "
          f"{total_cpu / parse_cpu:.0f}x a parse")
    thousands = ", ".join(f"{n}: {rss / 2**20:.0f}" for n, rss, _ in at_thousands)
    print(f"  browser memory (PSS, MiB): after the first render {first_rss / 2**20:.0f}; after each 1,000 "
          f"renders {thousands or '-'}; peak {pool.peak_rss / 2**20:.0f} against the bound of "
          f"{limits.max_rss / 2**20:.0f}; this process's peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


async def bench_share(hosts: int) -> None:
    from peer.node import Node
    from tests.support.crawl import node_config, start_local_web, urls_fetched

    graph = SiteGraph.generate(seed=4, hosts=hosts, pages_per_host=20, markup="real")
    with tempfile.TemporaryDirectory() as tmp:
        async with trio.open_nursery() as nursery:
            web, dns = await start_local_web(nursery, graph)
            node = Node(node_config(Path(tmp) / "node", web, dns, render="auto", delay=0.02, store="none"))
            await node.run()
            nursery.cancel_scope.cancel()
    expected = web.expected(render=True)
    fetched = urls_fetched(web, expected)
    counts, decider = node.stats.render, node.crawler.render_decider.counts
    pages = node.stats.status["2xx"]
    print(f"share: {pages} pages (2xx) on {hosts} hosts of real markup, {counts['rendered']} rendered "
          f"({counts['rendered'] / pages:.1%}); HTML pages considered {decider['considered']}, "
          f"learned-skipped {decider['learned']}, renders that found something {decider['fruitful']}, "
          f"nothing {decider['fruitless']}; links only a script writes found: "
          f"{len(expected.scripted & fetched)}/{len(expected.scripted)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--renders", type=int, default=10_000)
    parser.add_argument("--tabs", type=int, default=2)
    parser.add_argument("--max-pages", type=int, default=200)
    parser.add_argument("--crawl-hosts", type=int, default=40, help="hosts of the share's crawl (0: no crawl)")
    parser.add_argument("--seconds", type=float, default=float("inf"),
                        help="stop the renders after this long (the count done is printed)")
    args = parser.parse_args()
    print(f"bench_render: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    if args.crawl_hosts:
        trio.run(bench_share, args.crawl_hosts)
    trio.run(bench_renders, args.renders, args.tabs, args.max_pages, args.seconds)


if __name__ == "__main__":
    main()
