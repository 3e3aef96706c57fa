"""Two real peerd daemons crawl a local web of mirrored documents (the same bytes on every host): each payload
is stored in full about once in the whole cluster, whichever node fetched it, because the digest's owner on the
ring says where it was stored first. Read back from both nodes' WARC files with warcio: every revisit record
names an original full record that exists in the collection (by URL, date, payload digest and record id),
some written by the other node."""

from __future__ import annotations

import pytest
import trio

from peerlab.localweb.graph import SiteGraph, mirror_path
from tests.support.crawl import node_warc_records, start_local_web
from tests.test_steering_daemons import Daemons

pytestmark = pytest.mark.slow  # real peerd processes

PROFILE = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"


def _records(tmp_path, names) -> list[dict]:
    return [{"node": name, "type": kind, "id": h.get_header("WARC-Record-ID"),
             "uri": h.get_header("WARC-Target-URI"), "date": h.get_header("WARC-Date"),
             "digest": h.get_header("WARC-Payload-Digest"), "profile": h.get_header("WARC-Profile"),
             "refers_to": h.get_header("WARC-Refers-To"), "refers_uri": h.get_header("WARC-Refers-To-Target-URI"),
             "refers_date": h.get_header("WARC-Refers-To-Date")}
            for name, kind, h in node_warc_records(tmp_path, names)]


async def test_two_nodes_store_each_mirrored_payload_about_once(tmp_path):
    mirrored = 4
    graph = SiteGraph.generate(seed=47, hosts=10, pages_per_host=3, features=False, mirrored=mirrored)
    async with trio.open_nursery() as nursery:
        web, dns = await start_local_web(nursery, graph)
        nodes = Daemons(tmp_path, web, dns, seeds=[], exit_when_done=False, delay=0.05, concurrency=32)
        try:
            await nodes.start("A")
            # B is seeded after it joined: the seeds go to their owners, and each node crawls the hosts it owns
            nodes.overrides["seeds"] = web.seeds()
            await nodes.start("B")
            expected = len(web.expected().pages)
            with trio.fail_after(60):  # every page written (the cluster's end is not waited for)
                while True:
                    status = {n: await nodes.get(n, "/status") for n in ("A", "B")}
                    if sum(s["stored"] + s["payload_revisits"]["records"] for s in status.values()) >= expected:
                        break
                    await trio.sleep(0.1)
            await nodes.stop_all()
        finally:
            nodes.kill_all()
        nursery.cancel_scope.cancel()
    records = _records(tmp_path, ("A", "B"))
    mirror_urls = {web.url(spec.name, mirror_path(k)) for spec in graph.hosts for k in range(mirrored)}
    mirrors = [r for r in records if r["uri"] in mirror_urls]
    assert {r["uri"] for r in mirrors} == mirror_urls and len(mirrors) == len(mirror_urls)  # each fetched once
    full = {(r["uri"], r["date"]): r for r in records if r["type"] == "response"}
    revisits = [r for r in records if r["type"] == "revisit"]
    for r in revisits:
        original = full[(r["refers_uri"], r["refers_date"])]
        assert r["profile"] == PROFILE and original["digest"] == r["digest"] and original["id"] == r["refers_to"]
    # two nodes may both store a payload before either has told its owner: at most one copy per node
    copies = [sum(1 for r in mirrors if r["type"] == "response" and r["uri"].endswith(mirror_path(k)))
              for k in range(mirrored)]
    assert all(1 <= c <= 2 for c in copies), copies
    across = [r for r in revisits if full[(r["refers_uri"], r["refers_date"])]["node"] != r["node"]]
    assert across, "no revisit refers to a copy the other node stored: the digest's owner was never asked"
    # each node asked the other of the digests it owns, and the other knew some
    asked = {n: s["cluster"]["digests"] for n, s in status.items()}
    assert all(a["asked"] > 0 for a in asked.values()) and sum(a["found"] for a in asked.values()) > 0, asked
    assert sum(a["notes_received"] for a in asked.values()) > 0, asked
    found = sum(s["payload_revisits"]["records"] for s in status.values())
    assert found == len(revisits) and found >= len(mirror_urls) - 2 * mirrored
    print(f"mirrored URLs {len(mirror_urls)}, full copies {sum(copies)}, revisit records {len(revisits)} "
          f"({len(across)} referring to the other node's copy)")
