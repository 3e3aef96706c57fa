"""The benchmark web: 1,000 hosts x 50 pages served by nginx (or, failing that, several Python servers).

A crawler doing 1,000-2,000 pages/s on a 2-core machine must not wait on its web; nginx serves static
files with sendfile at a few tens of microseconds of CPU per request, the pure-Python server costs about
ten times more. ``start_bench_web`` picks nginx when it is installed and falls back to ``workers``
processes of ``python -m peerlab.localweb.server --reuse-port`` sharing one port.
"""

from __future__ import annotations

import contextlib
import math
import os
import pwd
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .graph import SiteGraph, loopback_address
from .static import read_stamp, write_site

__all__ = ["REAL_WEB", "WIDE_WEB", "BenchWeb", "RealPage", "nginx_binary", "nginx_config", "real_pages",
           "start_bench_web"]

_READY_TIMEOUT = 20.0

#: The wide web (issue 19's shape, docs/localweb.md "The benchmark web"): 2,000 hosts x 50 pages, log-normal
#: pages of median 14 KB and mean 16.8 KB (mean / median = exp(sigma^2 / 2)), 24-36 links with 20% to other
#: hosts, 31 hosts per loopback address, 5% of the hosts asking for Crawl-delay 2. `start_bench_web(**WIDE_WEB)`.
WIDE_WEB: dict[str, int | float | str] = {
    "hosts": 2000, "pages_per_host": 50, "page_bytes": 14_000, "page_bytes_sigma": 0.604,
    "links_per_page": 30, "links_spread": 6, "cross_host_fraction": 0.2,
    "crawl_delay_fraction": 0.05, "hosts_per_address": 31, "markup": "filler",
}

#: The real-markup web (docs/localweb.md "Pages that look like the web"), the benchmarks' default: 2,000 hosts x
#: 50 pages, a fifth of the hosts serving python3-doc's documents (when installed) and the rest generated pages
#: built like real ones (log-normal sizes of median 24 KB, navigation, links inside the text, scripts, styles,
#: tables, code); 20% of the links to other hosts, 2% to missing pages, moved pages (301) and names that do not
#: resolve; 31 hosts per address, 5% of the hosts asking for Crawl-delay 2. `start_bench_web(**REAL_WEB)`.
REAL_WEB: dict[str, int | float | str] = {
    "hosts": 2000, "pages_per_host": 50, "markup": "real", "doc_fraction": 0.2, "odd_link_fraction": 0.02,
    "cross_host_fraction": 0.2, "crawl_delay_fraction": 0.05, "hosts_per_address": 31,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RealPage:
    """A page of the real-markup web as served: its URL, body, and the normalized URLs of the links the oracle
    follows from it (what a correct link extractor finds, leaving out the page's own URL)."""

    url: str
    body: bytes
    links: frozenset[str]
    markup: str


def real_pages(count: int, *, seed: int = 1, port: int = 8080, sample_seed: int = 0) -> Iterator[RealPage]:
    """``count`` pages of REAL_WEB (``seed``), drawn at random (``sample_seed``) over its hosts and pages, for
    benchmarks of the page path (parse, link extraction, URL resolution, WARC) on real markup."""
    import random

    from .graph import page_path
    from .model import make_url
    from .render import render

    shape = {k: v for k, v in REAL_WEB.items() if k != "hosts_per_address"}
    graph = SiteGraph.generate(seed=seed, features=False, seed_hosts=10, **shape)  # type: ignore[arg-type]
    rng = random.Random(sample_seed)
    for _ in range(count):
        spec = graph.hosts[rng.randrange(len(graph.hosts))]
        res = graph.resource(spec.name, page_path(rng.randrange(graph.pages_per_host)))
        assert res is not None
        url = make_url(res.host, res.path, port)
        links = frozenset(make_url(link.host, link.path, port) for link in res.links) - {url}
        yield RealPage(url=url, body=render(graph, res, port).body, links=links, markup=res.markup)


@dataclass(slots=True, kw_only=True)
class BenchWeb:
    """A running benchmark web. ``process`` is the nginx master (or the first Python server)."""

    graph: SiteGraph
    kind: str
    port: int
    base_urls: list[str]
    seeds: list[str]
    zone: dict[str, str]
    process: subprocess.Popen[bytes]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    directory: Path | None = None


def nginx_binary() -> str | None:
    """The nginx executable, or None when nginx is not installed."""
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                          if os.access(p, os.X_OK)), None)


def nginx_config(*, prefix: Path, site: Path, port: int, workers: int, addresses: tuple[str, ...] = ("127.0.0.1",)) -> str:
    """An nginx.conf serving ``site/<host>/`` by the Host header on each of ``addresses`` at ``port``."""
    temp = prefix / "tmp"
    # Run the workers as the user that wrote the site (nginx started by root would otherwise drop to
    # "nobody", who cannot read a private temp directory).
    user = f"user {pwd.getpwuid(os.getuid()).pw_name};" if os.geteuid() == 0 else ""
    listen = "\n".join(f"        listen {address}:{port} backlog=4096;" for address in addresses)
    # /r/N is a moved page of the real-markup web: 301 to /p/N.html, as SiteGraph.resource says.
    return f"""
{user}
worker_processes {workers};
worker_rlimit_nofile 16384;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 8192; multi_accept on; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 65;
    keepalive_requests 1000000;
    open_file_cache max=4096 inactive=60s;
    types {{ text/html html; text/plain txt; }}
    default_type application/octet-stream;
    charset utf-8;
    charset_types text/plain;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    server {{
{listen}
        server_name _;
        root {site}/$host;
        index index.html;
        absolute_redirect off;
        location ~ "^/r/([1-9][0-9]*)$" {{ return 301 /p/$1.html; }}
    }}
}}
"""


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before listening on port {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within {_READY_TIMEOUT:g} s")


def _wait_line(proc: subprocess.Popen[bytes], prefix: str, what: str) -> str:
    """The first line ``proc`` prints, which must start with ``prefix``, read within the ready timeout."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=_READY_TIMEOUT):
            raise RuntimeError(f"{what} printed nothing within {_READY_TIMEOUT:g} s")
    line = proc.stdout.readline().decode("utf-8", "replace").strip()
    if not line.startswith(prefix):
        raise RuntimeError(f"{what} failed to start (status {proc.poll()}): {line or 'no output'}")
    return line


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def start_bench_web(
    *,
    seed: int = 1,
    hosts: int = 1000,
    pages_per_host: int = 50,
    links_per_page: int = 30,
    page_bytes: int = 15_000,
    server: str = "auto",
    workers: int = 2,
    directory: str | Path | None = None,
    cross_host_fraction: float = 0.3,
    page_bytes_sigma: float = 0.0,
    links_spread: int = 0,
    crawl_delay_fraction: float = 0.0,
    hosts_per_address: int = 0,
    markup: str = "real",
    doc_fraction: float = 0.2,
    odd_link_fraction: float = 0.02,
) -> Iterator[BenchWeb]:
    """Start the benchmark web; stop it (by PID) on exit.

    The web's shape: ``links_per_page`` +- ``links_spread`` links per page, ``cross_host_fraction`` of them
    to other hosts; pages log-normal around the median ``page_bytes`` when ``page_bytes_sigma`` > 0; a
    ``crawl_delay_fraction`` of the hosts ask for Crawl-delay 2; with nginx and ``hosts_per_address`` > 0 the
    hosts share loopback addresses in groups of that size (the Python servers listen on 127.0.0.1 only).
    ``markup`` is ``"real"`` (pages built like the web's, python3-doc's documents on ``doc_fraction`` of the
    hosts, ``odd_link_fraction`` of the links to 404s, 301s and names that do not resolve; ``page_bytes``,
    ``page_bytes_sigma``, ``links_per_page`` and ``links_spread`` do not apply) or ``"filler"`` (a list of
    links and filler text: the old benchmark web, kept to compare with).

    ``server`` is ``"nginx"``, ``"python"`` or ``"auto"`` (nginx when installed). The static site is cached
    in ``directory`` (default: a folder under the temp dir named by the parameters) and reused when the
    port it was written for is still free; when it is not (another benchmark serving the same site), the default
    folder is left alone and this web writes its own, removed on exit.
    """
    if server not in ("auto", "nginx", "python"):
        raise ValueError(f"server must be 'auto', 'nginx' or 'python', got {server!r}")
    nginx = nginx_binary()
    if server == "nginx" and nginx is None:
        raise RuntimeError("nginx is not installed (apt-get install -y nginx-light), or use server='python'")
    kind = "nginx" if nginx is not None and server != "python" else "python"
    graph = SiteGraph.generate(seed=seed, hosts=hosts, pages_per_host=pages_per_host, links_per_page=links_per_page,
                               page_bytes=page_bytes, features=False, seed_hosts=min(hosts, 10),
                               cross_host_fraction=cross_host_fraction, page_bytes_sigma=page_bytes_sigma,
                               links_spread=links_spread, crawl_delay_fraction=crawl_delay_fraction,
                               markup=markup, doc_fraction=doc_fraction, odd_link_fraction=odd_link_fraction)
    spread = kind == "nginx" and hosts_per_address > 0
    zone = graph.zone(tuple(loopback_address(k) for k in range(math.ceil(hosts / hosts_per_address))) if spread
                      else ("127.0.0.1",))
    processes: list[subprocess.Popen[bytes]] = []
    site = None
    with contextlib.ExitStack() as stack:
        if kind == "nginx":
            assert nginx is not None
            site = Path(directory) if directory is not None else Path(tempfile.gettempdir()) / (
                f"peercrawl-benchweb-{seed}-{hosts}x{pages_per_host}-{links_per_page}-{page_bytes}"
                + (f"-{cross_host_fraction:g}-{page_bytes_sigma:g}-{links_spread}-{crawl_delay_fraction:g}"
                   if (cross_host_fraction, page_bytes_sigma, links_spread, crawl_delay_fraction) != (0.3, 0, 0, 0)
                   else "")
                + (f"-real-{doc_fraction:g}-{odd_link_fraction:g}-{graph.doc_hosts}" if markup == "real" else ""))
            stamp = read_stamp(site)
            old_port = stamp.get("port") if stamp else None
            if isinstance(old_port, int) and _port_free(old_port):
                port = old_port
            else:
                port = _free_port()
                if old_port is not None and directory is None:
                    # Another benchmark may be serving this site now: rewriting its links for our port would send
                    # that crawl to our server (and ours to nothing once it stops). A site of our own, removed after.
                    site = site.with_name(f"{site.name}-port{port}")
                    stack.callback(shutil.rmtree, site, ignore_errors=True)
            write_site(graph, site, port=port)
            prefix = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="peercrawl-nginx-")))
            os.chmod(prefix, 0o755)
            (prefix / "tmp").mkdir()
            conf = prefix / "nginx.conf"
            addresses = tuple(sorted(set(zone.values()))) if spread else ("127.0.0.1",)
            conf.write_text(nginx_config(prefix=prefix, site=site, port=port, workers=workers, addresses=addresses),
                            encoding="utf-8")
            proc = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log"),
                                     "-g", "daemon off;"], stdin=subprocess.DEVNULL)
            processes.append(proc)
            stack.callback(_stop, proc)
            _wait_listening(port, proc, "nginx")
        else:
            port = _free_port()
            cmd = [sys.executable, "-m", "peerlab.localweb.server", "--seed", str(seed), "--hosts", str(hosts),
                   "--pages-per-host", str(pages_per_host), "--links-per-page", str(links_per_page),
                   "--page-bytes", str(page_bytes), "--no-features", "--seed-hosts", str(min(hosts, 10)),
                   "--cross-host-fraction", str(cross_host_fraction), "--markup", markup,
                   "--doc-fraction", str(doc_fraction), "--odd-link-fraction", str(odd_link_fraction),
                   "--port", str(port), "--reuse-port"]
            for _ in range(max(1, workers)):
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
                processes.append(proc)
                stack.callback(_stop, proc)
            for proc in processes:
                _wait_line(proc, "listening ", "python -m peerlab.localweb.server")
        yield BenchWeb(
            graph=graph, kind=kind, port=port, base_urls=[f"http://{h.name}:{port}" for h in graph.hosts],
            seeds=graph.seeds(port=port), zone=zone, process=processes[0], processes=processes,
            directory=site,
        )
