"""One node crawling the benchmark web, beside Scrapy crawling the same web in the same run.

Run: ``python -m tests.bench.bench_crawl [--hosts 2000] [--pages-per-host 50] [--scrapy-pages 10000]
[--skip-scrapy] [--stores warc,none] [--py-spy] [--filler [--wide-web]]``

The web is ``peerlab.localweb.bench`` serving the real-markup web by default (``REAL_WEB``: 2,000 hosts x 50
pages built like real ones, python3-doc's documents on a fifth of the hosts when the package is installed;
docs/localweb.md "Pages that look like the web"). ``--filler`` serves the old filler web instead (``--hosts`` x
``--pages-per-host`` pages of a list of links and filler words, about 15 KB with about 30 links; with
``--wide-web`` the filler wide web); its figures are labelled FILLER in the output and say nothing about real
pages. The host names are served by ``peerlab.localweb.dns_server`` in its own process. Each
crawler runs as its own process and is measured from outside the same way: wall time from start to exit,
user+system CPU and peak RSS from ``os.wait4`` (the kernel's rusage of the exited child), pages from its
own final counters. Crawlers:

- peercrawl: ``python -m peer start --delay 0 --concurrency 256 --exit-when-done`` (one run per ``--stores``
  value; ``warc`` writes every page to WARC files, ``none`` only crawls). It resolves names through the DNS
  server over UDP with its own cache, as in production.
- Scrapy 2.x (the reference): a CrawlSpider with ``ROBOTSTXT_OBEY=True``, one ``LinkExtractor`` rule following
  every link inside the bench domain, ``CONCURRENT_REQUESTS=256``, ``CONCURRENT_REQUESTS_PER_DOMAIN=1``,
  ``DOWNLOAD_DELAY=0``, stopped by ``CLOSESPIDER_PAGECOUNT``. Scrapy cannot be pointed at a name server, so
  its ``DNS_RESOLVER`` is a small class answering from the bench zone in process (no lookup cost at all:
  that favours Scrapy slightly). It stores nothing, so compare it with the ``none`` run as well.

Printed: the web (real markup or FILLER), then pages, wall s, pages/s, CPU ms/page, peak RSS MiB for each, the
web's CPU per request, and the ratios against Scrapy measured in the same run: pages per CPU-second and CPU ms
per page (Scrapy's over ours), and pages/s. Targets (issue 3): >= 10x Scrapy's pages per CPU-second (<= 1.4 ms CPU per page) and
>= 700 pages/s for one node. Results go to ``--results-dir`` as JSON. ``--py-spy`` also records the node with
py-spy (``pip install py-spy``) into the results dir; its sampling costs CPU, so those runs are slower.

``--baseline SRC`` compares the code with another version of it in the same run: SRC is a source tree (say
``git archive main | tar -x -C SRC``) whose node, put first on PYTHONPATH, crawls the same web right after each
of ours (``--repeat N`` times for each store); the CPU per page of each pair is printed as a ratio, and their
median.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

from peerlab.localweb.bench import REAL_WEB, WIDE_WEB, BenchWeb, start_bench_web

BENCH_DOMAIN = "web.test"
TARGET_CPU_RATIO = 10.0
TARGET_RATE = 700.0


# --------------------------------------------------------------------------- processes


def _cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """User+system CPU of the given processes and their children so far (for the web's share)."""
    total = 0.0
    for proc in procs:
        try:
            p = psutil.Process(proc.pid)
            for q in [p, *p.children(recursive=True)]:
                t = q.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def _run_measured(cmd: list[str], *, cwd: Path, stderr: Path, time_limit: float, env: dict[str, str],
                  on_start=None) -> dict[str, Any]:
    """Run ``cmd`` to its exit (SIGTERM at ``time_limit``); wall s, CPU s and peak RSS from its rusage."""
    t0 = time.perf_counter()
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
    helpers = on_start(proc.pid) if on_start is not None else []
    deadline = t0 + time_limit
    terminated = False
    status, usage = 0, None
    while True:  # bounded: SIGTERM at the deadline, SIGKILL 30 s later
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        now = time.perf_counter()
        if now > deadline and not terminated:
            proc.send_signal(signal.SIGTERM)
            terminated = True
        elif now > deadline + 30:
            proc.kill()
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
    for helper in helpers:
        try:
            helper.wait(timeout=60)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()
    assert usage is not None
    return {
        "exit": proc.returncode,
        "timed_out": terminated,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
    }


def _start_dns(zone: dict[str, str], workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    zone_file = workdir / "zone.txt"
    zone_file.write_text("".join(f"{name} {ip}\n" for name, ip in zone.items()), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "peerlab.localweb.dns_server", "--zone-file", str(zone_file),
                             "--port", "0"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()  # the server prints one line once it listens
    if not line.startswith("listening "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"dns_server failed to start: {line or 'no output'}")
    return proc, int(line.rsplit(":", 1)[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- peercrawl


def _final_stats(log_file: Path) -> dict[str, Any]:
    """The counters of the node's "node stopped" log line (JSON lines on a non-terminal stderr)."""
    stats: dict[str, Any] = {}
    for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{") and '"node stopped"' in line:
            stats = json.loads(line)
    return stats


def run_node(web: BenchWeb, dns_port: int, store: str, args: argparse.Namespace, workdir: Path,
             results: Path, *, program: tuple[str, ...] = (sys.executable, "-m", "peer"),
             source: str = "", label: str = "peercrawl", extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Crawl the bench web with one node process (``program start ...``) and measure it. With ``source`` the
    node runs the code of that source tree (put first on PYTHONPATH): the baseline of ``--baseline``. ``extra``:
    more flags for the node (tests/bench/bench_plugins.py gives it a --config)."""
    data = workdir / f"node-{store}"
    shutil.rmtree(data, ignore_errors=True)
    seeds = workdir / "seeds.txt"
    seeds.write_text("\n".join(web.seeds) + "\n", encoding="utf-8")
    cmd = [*program, "start", "--node-id", f"bench-{store}", "--listen", "127.0.0.1:0",
           "--control", "127.0.0.1:0", "--seeds-file", str(seeds), "--allow-host", BENCH_DOMAIN,
           "--allow-private", "--nameserver", f"127.0.0.1:{dns_port}", "--delay", "0",
           "--ip-connections", "0",  # one nginx on 127.0.0.1 stands for as many servers as hosts
           "--concurrency", str(args.concurrency), "--exit-when-done", "--data-dir", str(data),
           "--store", store, "--log-format", "json", "--log-level", "info", "--page-threads", str(args.page_threads)]
    if args.page_processes:
        cmd += ["--page-processes", str(args.page_processes)]
    cmd += list(extra)
    if args.node_cpus:
        cmd = ["taskset", "-c", args.node_cpus, *cmd]
    on_start = None
    if args.py_spy:
        spy = shutil.which("py-spy")
        if spy is None:
            raise SystemExit("bench_crawl: --py-spy needs py-spy (pip install py-spy)")
        out = results / f"py-spy-node-{store}{'-baseline' if source else ''}.txt"

        def on_start(pid: int) -> list[subprocess.Popen[bytes]]:
            modes = [("", ["--idle"])]
            if args.py_spy_gil:  # the same run sampled twice: every running thread, and only the GIL's holder
                modes = [("-active", []), ("-gil", ["--gil"])]
            return [subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
                                      "--output", str(out.with_name(out.stem + suffix + ".txt")), "--nonblocking",
                                      *extra],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    for suffix, extra in modes]

    log_file = workdir / f"node-{store}.log"
    web_cpu0 = _cpu_seconds(web.processes)
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = os.pathsep.join([source, *filter(None, [env.get("PYTHONPATH")])])
    if args.cpu_profile:  # tests/bench/_cpuprof/sitecustomize.py samples the node on its own CPU time
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "_cpuprof"),
                                             *filter(None, [env.get("PYTHONPATH")])])
        env["BENCH_CPU_PROFILE"] = str(results / f"cpu-node-{store}{'-baseline' if source else ''}")
    r = _run_measured(cmd, cwd=workdir, stderr=log_file, time_limit=args.time_limit, env=env,
                      on_start=on_start)
    if args.py_spy and args.py_spy_gil:
        active, gil = (_samples(out.with_name(out.stem + suffix + ".txt")) for suffix in ("-active", "-gil"))
        r["gil_share"] = gil / active if active else 0.0
        print(f"  py-spy: {active} running samples, {gil} holding the GIL: {r['gil_share']:.2f} of the node's "
              f"running time needs the GIL", flush=True)
    r["web_cpu_s"] = _cpu_seconds(web.processes) - web_cpu0
    final = _final_stats(log_file)
    if r["exit"] != 0 or not final:
        tail = log_file.read_text(errors="replace").splitlines()[-5:]
        raise SystemExit(f"bench_crawl: the node exited with {r['exit']}; last log lines:\n" + "\n".join(tail))
    pages = int(final.get("pages", 0))
    robots = int(final.get("robots_fetches", 0))
    r.update(name=f"{label} --store {store}", store=store, baseline=bool(source), pages=pages, robots=robots, requests=pages + robots,
             stored=final.get("stored", 0), errors=final.get("errors", {}), status=final.get("status", {}),
             warc_mib=_dir_mib(data / "warc"))
    shutil.rmtree(data, ignore_errors=True)
    return r


def _samples(path: Path) -> int:
    """Samples in a py-spy raw (collapsed stacks) file: each line ends with its count."""
    if not path.exists():
        return 0
    return sum(int(line.rsplit(" ", 1)[1]) for line in path.read_text(errors="replace").splitlines()
               if line.strip() and line.rsplit(" ", 1)[-1].isdigit())


def _dir_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20 if path.exists() else 0.0


# --------------------------------------------------------------------------- Scrapy

SCRAPY_SCRIPT = textwrap.dedent(
    '''\
    """Scrapy reference crawl of the bench web (written and run by tests/bench/bench_crawl.py)."""
    import json, sys

    from scrapy.crawler import CrawlerProcess
    from scrapy.linkextractors import LinkExtractor
    from scrapy.spiders import CrawlSpider, Rule
    from twisted.internet import defer
    from twisted.internet.error import DNSLookupError
    from twisted.internet.interfaces import IResolverSimple
    from zope.interface import implementer

    CONFIG = json.load(open(sys.argv[1], encoding="utf-8"))
    ZONE = CONFIG["zone"]


    @implementer(IResolverSimple)
    class ZoneResolver:
        """DNS_RESOLVER answering from the bench zone (the names Scrapy would otherwise ask the system for)."""

        def __init__(self, reactor):
            self.reactor = reactor

        @classmethod
        def from_crawler(cls, crawler, reactor):
            return cls(reactor)

        def install_on_reactor(self):
            self.reactor.installResolver(self)

        def getHostByName(self, name, timeout=()):
            ip = ZONE.get(name.lower().rstrip("."))
            return defer.succeed(ip) if ip else defer.fail(DNSLookupError(name))


    class BenchSpider(CrawlSpider):
        name = "bench"
        allowed_domains = [CONFIG["domain"]]
        start_urls = CONFIG["seeds"]
        # allow_domains would compare the domain with host:port and drop every link of a web on a port,
        # so the rule is the same "inside the bench domain" test written as a URL pattern.
        domain = CONFIG["domain"].replace(".", r"\\.")
        rules = (Rule(LinkExtractor(allow=[rf"^https?://([^/:]+\\.)?{domain}(:\\d+)?(/|$)"]), follow=True),)


    process = CrawlerProcess(settings={
        "ROBOTSTXT_OBEY": True,
        "CONCURRENT_REQUESTS": CONFIG["concurrency"],
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        "DOWNLOAD_DELAY": 0,
        "CLOSESPIDER_PAGECOUNT": CONFIG["pages"],
        "LOG_LEVEL": "WARNING",
        "DNS_RESOLVER": "__main__.ZoneResolver",
        "USER_AGENT": "scrapy-bench (+http://127.0.0.1/)",
        "TELNETCONSOLE_ENABLED": False,
    })
    crawler = process.create_crawler(BenchSpider)
    process.crawl(crawler)
    process.start()
    json.dump(crawler.stats.get_stats(), open(CONFIG["stats_out"], "w", encoding="utf-8"), default=str)
    '''
)


def run_scrapy(web: BenchWeb, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    script = workdir / "scrapy_bench.py"
    script.write_text(SCRAPY_SCRIPT, encoding="utf-8")
    stats_out = workdir / "scrapy-stats.json"
    config = workdir / "scrapy-config.json"
    config.write_text(json.dumps({"zone": web.zone, "domain": BENCH_DOMAIN, "seeds": web.seeds,
                                  "concurrency": args.concurrency, "pages": args.scrapy_pages,
                                  "stats_out": str(stats_out)}), encoding="utf-8")
    log_file = workdir / "scrapy.log"
    web_cpu0 = _cpu_seconds(web.processes)
    r = _run_measured([sys.executable, str(script), str(config)], cwd=workdir, stderr=log_file,
                      time_limit=args.time_limit, env=dict(os.environ))
    r["web_cpu_s"] = _cpu_seconds(web.processes) - web_cpu0
    if r["exit"] != 0 or not stats_out.exists():
        tail = log_file.read_text(errors="replace").splitlines()[-5:]
        raise SystemExit(f"bench_crawl: Scrapy exited with {r['exit']}; last log lines:\n" + "\n".join(tail))
    st = json.loads(stats_out.read_text(encoding="utf-8"))
    robots = int(st.get("robotstxt/request_count", 0))
    responses = int(st.get("response_received_count", 0))
    pages = responses - int(st.get("robotstxt/response_count", 0))
    r.update(name="Scrapy " + _scrapy_version(), pages=pages, robots=robots, requests=responses,
             stored=0, errors={k: v for k, v in st.items() if k.startswith("downloader/exception_type_count")},
             status={k.rsplit("/", 1)[1]: v for k, v in st.items() if k.startswith("downloader/response_status")},
             finish_reason=st.get("finish_reason"))
    return r


def _scrapy_version() -> str:
    try:
        import scrapy
    except ImportError:
        return "(not installed)"
    return scrapy.__version__


# --------------------------------------------------------------------------- report


def _derive(r: dict[str, Any]) -> dict[str, Any]:
    pages = max(1, r["pages"])
    r["pages_per_s"] = r["pages"] / r["wall_s"]
    r["cpu_ms_per_page"] = r["cpu_s"] / pages * 1e3
    r["pages_per_cpu_s"] = r["pages"] / r["cpu_s"] if r["cpu_s"] > 0 else 0.0
    r["web_cpu_us_per_request"] = r["web_cpu_s"] / max(1, r["requests"]) * 1e6
    return r


def report(rows: list[dict[str, Any]], scrapy: dict[str, Any] | None, web_label: str = "") -> list[str]:
    out = [f"web: {web_label}"] if web_label else []
    out += [(f"{'crawler':24} {'pages':>7} {'+robots':>7} {'wall s':>7} {'pages/s':>8} {'CPU ms/page':>12} "
            f"{'CPU ms/req':>11} {'peak RSS MiB':>13} {'web CPU us/req':>15}")]
    for r in rows + ([scrapy] if scrapy else []):
        out.append(f"{r['name']:24} {r['pages']:7d} {r['robots']:7d} {r['wall_s']:7.1f} {r['pages_per_s']:8.0f} "
                   f"{r['cpu_ms_per_page']:12.2f} {r['cpu_s'] / max(1, r['requests']) * 1e3:11.2f} "
                   f"{r['peak_rss_mib']:13.0f} {r['web_cpu_us_per_request']:15.0f}")
    for r in rows:
        line = f"{r['name']}: {r['pages_per_s']:.0f} pages/s (target >= {TARGET_RATE:.0f}), " \
               f"{r['cpu_ms_per_page']:.2f} ms CPU/page (target <= 1.4)"
        if scrapy:
            ratio = r["pages_per_cpu_s"] / scrapy["pages_per_cpu_s"]
            r["cpu_ratio_vs_scrapy"] = ratio
            r["rate_ratio_vs_scrapy"] = r["pages_per_s"] / scrapy["pages_per_s"]
            line += (f"; {ratio:.1f}x Scrapy's pages per CPU-second (target >= {TARGET_CPU_RATIO:.0f}x; Scrapy "
                     f"spends {scrapy['cpu_ms_per_page']:.2f} ms CPU/page, {scrapy['cpu_ms_per_page'] / r['cpu_ms_per_page']:.1f}x "
                     f"ours), {r['rate_ratio_vs_scrapy']:.1f}x its pages/s")
        out.append(line)
    return out


def versus_baseline(rows: list[dict[str, Any]]) -> list[str]:
    """CPU per page of ours against the baseline run right after it, pair by pair (the machine's load drifts:
    a pair is close in time), and the median of the pairs' ratios per store."""
    out = []
    by_store: dict[str, list[float]] = {}
    for ours, base in zip(rows, rows[1:]):
        if not ours["baseline"] and base["baseline"] and ours["store"] == base["store"]:
            by_store.setdefault(ours["store"], []).append(ours["cpu_ms_per_page"] / base["cpu_ms_per_page"])
    for store, ratios in by_store.items():
        ratios.sort()
        median = ratios[len(ratios) // 2] if len(ratios) % 2 else sum(ratios[len(ratios) // 2 - 1:][:2]) / 2
        out.append(f"--store {store}: CPU per page vs the baseline, pair by pair: "
                   f"{', '.join(f'{r:.3f}' for r in ratios)}; median {median:.3f}")
    return out


def _web_label(web: BenchWeb) -> str:
    """What the crawlers crawl, as printed above every figure: the real-markup web (and whether python3-doc's
    documents are in it) or the FILLER web."""
    g = web.graph
    if g.markup != "real":
        return (f"FILLER web ({len(g.hosts)} hosts x {g.pages_per_host} pages of a link list and filler words: "
                "not like real pages)")
    docs = (f"{g.doc_hosts} hosts serving python3-doc's documents from {g.corpus.root}" if g.corpus is not None
            else "python3-doc not installed: generated pages only (apt-get install python3-doc)")
    return f"real-markup web ({len(g.hosts)} hosts x {g.pages_per_host} pages; {docs})"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.bench.bench_crawl", description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=None, help="default: REAL_WEB's 2,000 (1,000 with --filler)")
    p.add_argument("--pages-per-host", type=int, default=50)
    p.add_argument("--filler", action="store_true",
                   help="the filler web (a list of links and filler words per page) instead of the real-markup web; "
                        "its figures are labelled FILLER")
    p.add_argument("--doc-fraction", type=float, default=float(REAL_WEB["doc_fraction"]),
                   help="real-markup web: share of hosts serving python3-doc's documents")
    p.add_argument("--links-per-page", type=int, default=30)
    p.add_argument("--page-bytes", type=int, default=15_000)
    p.add_argument("--concurrency", type=int, default=256, help="fetches in flight, both crawlers")
    p.add_argument("--stores", default="warc,none", help="comma-separated peercrawl runs: warc, none")
    p.add_argument("--scrapy-pages", type=int, default=10000, help="Scrapy's CLOSESPIDER_PAGECOUNT")
    p.add_argument("--skip-scrapy", action="store_true")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds per crawl before SIGTERM")
    p.add_argument("--results-dir", default="bench-results")
    p.add_argument("--py-spy", action="store_true", help="record the node with py-spy (slows it down)")
    p.add_argument("--cpu-profile", action="store_true",
                   help="sample the node on its own CPU time (tests/bench/_cpuprof) into the results dir")
    p.add_argument("--py-spy-gil", action="store_true",
                   help="with --py-spy: sample the node twice, running threads and the GIL's holder only, and "
                        "print the share of the node's running samples that held the GIL")
    p.add_argument("--cross-host", type=float, default=None,
                   help="fraction of a page's links to other hosts (default 0.2 real markup, 0.3 filler)")
    p.add_argument("--node-cpus", default="", help="run the node under taskset -c CPUS (e.g. 0 for one core)")
    p.add_argument("--page-threads", type=int, default=0, help="the node's --page-threads")
    p.add_argument("--page-processes", type=int, default=0, help="the node's --page-processes")
    p.add_argument("--page-sigma", type=float, default=0.0, help="log-normal sigma of page sizes (0: all equal)")
    p.add_argument("--links-spread", type=int, default=0, help="links per page vary by +- this much")
    p.add_argument("--crawl-delay-fraction", type=float, default=None,
                   help="hosts asking for Crawl-delay 2 (default 0.05 real markup, 0 filler)")
    p.add_argument("--hosts-per-address", type=int, default=None,
                   help="hosts sharing one loopback address (0: all; default 31 real markup, 0 filler)")
    p.add_argument("--baseline", default="",
                   help="a source tree of the code to compare with (e.g. `git archive main`, unpacked): its node "
                        "crawls the same web after each of ours, and the ratio of CPU per page is printed")
    p.add_argument("--repeat", type=int, default=1, help="runs of each store (and of the baseline), in turn")
    p.add_argument("--wide-web", action="store_true",
                   help="with --filler: the filler wide web's shape (alone: the real-markup web, as wide already): 2,000 hosts x 50 pages, log-normal pages of median "
                        "14 KB (mean 16.8 KB), 24-36 links (80%% on the same host), 31 hosts per address, 5%% Crawl-delay 2")
    args = p.parse_args()
    real = not args.filler  # --wide-web alone: the real-markup web is already that wide (REAL_WEB)
    defaults = ({"hosts": REAL_WEB["hosts"], "cross_host": REAL_WEB["cross_host_fraction"],
                 "crawl_delay_fraction": REAL_WEB["crawl_delay_fraction"],
                 "hosts_per_address": REAL_WEB["hosts_per_address"]} if real else
                {"hosts": 1000, "cross_host": 0.3, "crawl_delay_fraction": 0.0, "hosts_per_address": 0})
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.wide_web and not real:
        w = WIDE_WEB
        args.hosts, args.pages_per_host, args.page_bytes, args.page_sigma = (
            w["hosts"], w["pages_per_host"], w["page_bytes"], w["page_bytes_sigma"])
        args.links_per_page, args.links_spread, args.cross_host = (
            w["links_per_page"], w["links_spread"], w["cross_host_fraction"])
        args.crawl_delay_fraction, args.hosts_per_address = w["crawl_delay_fraction"], w["hosts_per_address"]
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or any(s not in ("warc", "none") for s in stores):
        p.error(f"--stores takes warc and/or none, got {args.stores!r}")
    results = Path(args.results_dir).resolve()
    results.mkdir(parents=True, exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 16384), hard), hard))  # inherited by crawlers

    rows: list[dict[str, Any]] = []
    scrapy = None
    with tempfile.TemporaryDirectory(prefix="peercrawl-bench-crawl-") as tmp:
        workdir = Path(tmp)
        with start_bench_web(hosts=args.hosts, pages_per_host=args.pages_per_host,
                             links_per_page=args.links_per_page, page_bytes=args.page_bytes,
                             cross_host_fraction=args.cross_host, page_bytes_sigma=args.page_sigma,
                             links_spread=args.links_spread, crawl_delay_fraction=args.crawl_delay_fraction,
                             hosts_per_address=args.hosts_per_address, markup="real" if real else "filler",
                             doc_fraction=args.doc_fraction, odd_link_fraction=float(REAL_WEB["odd_link_fraction"]),
                             ) as web:
            web_label = _web_label(web)
            print(f"web: {web_label}", flush=True)
            dns, dns_port = _start_dns(web.zone, workdir)
            try:
                total = args.hosts * args.pages_per_host
                print(f"web: {web.kind} on port {web.port}, {args.hosts} hosts x {args.pages_per_host} pages "
                      f"({total} pages), {len(web.seeds)} seeds; DNS server on port {dns_port}", flush=True)
                baseline = str(Path(args.baseline).resolve()) if args.baseline else ""
                for _ in range(max(1, args.repeat)):
                    for store in stores:
                        for source in ([""] + ([baseline] if baseline else [])):
                            rows.append(_derive(run_node(web, dns_port, store, args, workdir, results, source=source,
                                                         label="baseline" if source else "peercrawl")))
                            print(f"  {rows[-1]['name']}: {rows[-1]['pages']} pages in {rows[-1]['wall_s']:.1f} s, "
                                  f"{rows[-1]['cpu_ms_per_page']:.3f} ms CPU/page", flush=True)
                if not args.skip_scrapy:
                    scrapy = _derive(run_scrapy(web, args, workdir))
                    print(f"  Scrapy: {scrapy['pages']} pages in {scrapy['wall_s']:.1f} s", flush=True)
            finally:
                _stop(dns)
    print(f"load average during the run (1/5 min): {os.getloadavg()[0]:.1f} / {os.getloadavg()[1]:.1f} "
          f"on {os.cpu_count()} cores")
    lines = report(rows, scrapy, web_label) + versus_baseline(rows)
    print("\n".join(lines))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    doc = {"bench": "bench_crawl", "time": stamp, "web": web_label, "args": vars(args), "cpu_count": os.cpu_count(),
           "loadavg": os.getloadavg(), "peercrawl": rows, "scrapy": scrapy, "summary": lines}
    for name in (f"bench_crawl-{stamp}.json", "bench_crawl.json"):
        (results / name).write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"results: {results / 'bench_crawl.json'}")


if __name__ == "__main__":
    main()
