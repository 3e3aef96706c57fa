"""Identical payloads across URLs: the disk a crawl of a web with mirrored documents takes, with payload
revisits on (the default) against the same crawl with ``--no-payload-revisits``, in the same run.

Run: ``python -m tests.bench.bench_payload_revisits [--hosts 40] [--pages-per-host 5] [--mirrored 4]``

The local web has real markup (python3-doc pages, when installed) and, on every host, ``--mirrored`` mirrored
documents: the same python3-doc page under each host, as sites that mirror a manual. One node crawls it to the
end twice in this process, each time into a fresh data dir; the figures are the WARC bytes of each crawl, the
ratio, the revisit records written, and the share of the mirrored copies' bytes that was saved.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

from peer.config import load
from peer.node import Node
from peerlab.localweb.dns_server import serve_dns
from peerlab.localweb.graph import SiteGraph, mirror_path
from peerlab.localweb.server import serve_web


async def run(args: argparse.Namespace) -> dict:
    graph = SiteGraph.generate(seed=11, hosts=args.hosts, pages_per_host=args.pages_per_host, features=False,
                               markup="real", mirrored=args.mirrored)
    mirrors = sum(len(graph.resource(spec.name, mirror_path(k)).body) for spec in graph.hosts
                  for k in range(args.mirrored))
    tmp = Path(tempfile.mkdtemp(prefix="bench-payload-revisits-"))
    out: dict = {"hosts": args.hosts, "pages": len(graph.expected().pages), "mirrored_urls":
                 args.hosts * args.mirrored, "mirrored_bytes": mirrors}
    async with trio.open_nursery() as nursery:
        web = await nursery.start(lambda task_status: serve_web(graph, keep_log=False, on_record=None,
                                                                task_status=task_status))
        dns = await nursery.start(serve_dns, graph.zone())
        for name, on in (("on", True), ("off", False)):
            cfg = load(env={}, flags={
                "node_id": f"bench-{name}", "data_dir": str(tmp / name), "control": "127.0.0.1:0",
                "listen": "127.0.0.1:0", "seeds": web.seeds(), "nameservers": [f"127.0.0.1:{dns.address[1]}"],
                "allow_private": True, "delay": 0.0, "exit_when_done": True, "concurrency": 64,
                "payload_revisits": on})
            started = time.perf_counter()
            node = Node(cfg)
            await node.run()
            took = time.perf_counter() - started
            status = node.final_status
            warc = sum(p.stat().st_size for p in (tmp / name / "warc").glob("*.warc.gz"))
            out[name] = {"warc_bytes": warc, "seconds": round(took, 2), "pages": status["pages"],
                         "revisit_records": status["payload_revisits"]["records"],
                         "revisit_record_bytes": status["payload_revisits"]["record_bytes"]}
        nursery.cancel_scope.cancel()
    out["saved_bytes"] = out["off"]["warc_bytes"] - out["on"]["warc_bytes"]
    out["on_over_off"] = round(out["on"]["warc_bytes"] / out["off"]["warc_bytes"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=40)
    parser.add_argument("--pages-per-host", type=int, default=5)
    parser.add_argument("--mirrored", type=int, default=4)
    args = parser.parse_args()
    r = trio.run(run, args)
    print(f"web: {r['hosts']} hosts, {r['pages']} pages, {r['mirrored_urls']} mirrored URLs "
          f"({r['mirrored_bytes']} payload bytes)")
    for name in ("on", "off"):
        x = r[name]
        print(f"payload revisits {name:3}: WARC {x['warc_bytes']:>10} B, {x['pages']} pages in {x['seconds']} s, "
              f"{x['revisit_records']} revisit records ({x['revisit_record_bytes']} B)")
    print(f"saved {r['saved_bytes']} B: the crawl takes {r['on_over_off']} of the disk it takes without them")


if __name__ == "__main__":
    main()
