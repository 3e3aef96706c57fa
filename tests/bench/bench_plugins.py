"""What plug-ins cost per page: one node crawling the benchmark web with no plug-in, with five no-op plug-ins,
with one no-op URL filter, and with the rule extractor, in turn, in the same run.

Run: ``python -m tests.bench.bench_plugins [--hosts 200] [--pages-per-host 25] [--repeat 2]``

The web is ``peerlab.localweb.bench`` (nginx, pages of about 15 KB with about 30 links each, as bench_crawl's);
each crawl is one node process measured from outside (user+system CPU from ``os.wait4``, pages from its final
counters), with ``--store warc``. The chains:

- ``none``: no plug-in (the reference);
- ``noop5``: three extractors and two page filters that do nothing (no tree asked for): the chain's own cost;
- ``urlfilter``: one URL filter that keeps every link: a URL filter sees each link's context (anchor text, tag,
  rel), so the page's tree is built for it;
- ``rules``: the built-in rule extractor with one rule for every page (title, the h3 headings as a list, the
  lead paragraphs' texts, the number of links by XPath): a tree and four selectors a page.

Printed: CPU ms per page of each run and its ratio to the ``none`` run next to it (runs alternate, ``--repeat``
rounds; the median ratio is the figure). Target (issue 33): five no-op plug-ins cost at most 5% more CPU a page.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
from pathlib import Path

from peerlab.localweb.bench import start_bench_web
from tests.bench.bench_crawl import _derive, _start_dns, _stop, run_node

CASES = "tests.support.plugin_cases"
CHAINS = {
    "none": "",
    "noop5": "".join(f'[[plugins]]\nuse = "{CASES}:{name}"\n' for name in
                     ("NoOp", "NoOpPageFilter", "NoOp", "NoOpPageFilter", "NoOp")),
    "urlfilter": f'[[plugins]]\nuse = "{CASES}:NoOpFilter"\n',
    "rules": """[[plugins]]
use = "peer.plugins:RuleExtractor"
[[plugins.rules]]
url = ""
[plugins.rules.fields]
title = { css = "title" }
headings = { css = "h3", type = "list" }
leads = { css = "p.lead", type = "list" }
links = { xpath = "count(//a)", type = "number" }
""",
}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_plugins", description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=200)
    p.add_argument("--pages-per-host", type=int, default=25)
    p.add_argument("--repeat", type=int, default=2, help="rounds of all the chains, in turn")
    p.add_argument("--chains", default=",".join(CHAINS), help=f"comma-separated, of {', '.join(CHAINS)}")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--time-limit", type=float, default=600.0)
    args = p.parse_args()
    chains = [c.strip() for c in args.chains.split(",") if c.strip()]
    if "none" not in chains or any(c not in CHAINS for c in chains):
        p.error(f"--chains must include none and name only {', '.join(CHAINS)}")
    # what bench_crawl.run_node reads of its arguments
    node_args = argparse.Namespace(concurrency=args.concurrency, page_threads=0, page_processes=0, node_cpus="",
                                   py_spy=False, py_spy_gil=False, cpu_profile=False, time_limit=args.time_limit)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 16384), hard), hard))
    runs: dict[str, list[float]] = {c: [] for c in chains}
    with tempfile.TemporaryDirectory(prefix="peercrawl-bench-plugins-") as tmp:
        workdir = Path(tmp)
        with start_bench_web(hosts=args.hosts, pages_per_host=args.pages_per_host) as web:
            dns, dns_port = _start_dns(web.zone, workdir)
            try:
                print(f"web: {web.kind}, {args.hosts} hosts x {args.pages_per_host} pages", flush=True)
                for round_ in range(max(1, args.repeat)):
                    for chain in chains:
                        extra: tuple[str, ...] = ()
                        if CHAINS[chain]:
                            config = workdir / f"{chain}.toml"
                            config.write_text(CHAINS[chain])
                            extra = ("--config", str(config))
                        r = _derive(run_node(web, dns_port, "warc", node_args, workdir, workdir, label=chain,
                                             extra=extra))
                        runs[chain].append(r["cpu_ms_per_page"])
                        print(f"  round {round_ + 1} {chain}: {r['pages']} pages, {r['cpu_ms_per_page']:.3f} ms "
                              f"CPU/page", flush=True)
            finally:
                _stop(dns)
    print("\nchain       CPU ms/page (median)   ratio to none (median of the rounds' ratios)")
    for chain in chains:
        ratios = [a / b for a, b in zip(runs[chain], runs["none"])]
        print(f"{chain:<11} {statistics.median(runs[chain]):>10.3f}            {statistics.median(ratios):.3f}  "
              f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
