"""A TLS local web served by Debian's nginx (with HTTP/2), under a CA of its own: the generated site
(peerlab.localweb) written as static files with https links, some hosts HTTP/2 only (an HTTP/1.x request gets
505) and some reachable only through a proxy (a request from any address but the proxy's outgoing one gets
403). The access log records, per request, its time, host, protocol, status, path and client address.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from peerlab.localweb.bench import _free_port, _stop, _wait_listening, nginx_binary
from peerlab.localweb.graph import SiteGraph
from peerlab.localweb.static import write_site
from tests.support.testca import CertAuthority, make_ca

__all__ = ["PROXY_SOURCE", "LoggedRequest", "TlsWeb", "start_tls_web"]

#: The address the tests' proxies connect from (dante's `external`); proxy-only hosts accept only it.
PROXY_SOURCE = "127.0.0.5"


@dataclass(frozen=True)
class LoggedRequest:
    time: float
    host: str
    protocol: str
    status: int
    path: str
    client: str


@dataclass(frozen=True)
class TlsWeb:
    graph: SiteGraph
    port: int
    ca: CertAuthority
    h2_only: frozenset[str]
    proxy_only: frozenset[str]
    access_log: Path

    def seeds(self) -> list[str]:
        return [u.replace("http://", "https://", 1) for u in self.graph.seeds(port=self.port)]

    def requests(self) -> list[LoggedRequest]:
        out = []
        for line in self.access_log.read_text().splitlines():
            msec, host, protocol, status, path, client = line.split(" ")
            out.append(LoggedRequest(float(msec), host, protocol, int(status), path, client))
        return out


def _config(prefix: Path, site: Path, port: int, ca: CertAuthority, h2_only: Sequence[str],
            proxy_only: Sequence[str], workers: int, max_connections: int) -> str:
    user = f"user {pwd.getpwuid(os.getuid()).pw_name};" if os.geteuid() == 0 else ""
    h2_map = "\n".join(f"        {h} 1;" for h in h2_only)
    proxy_map = "\n".join(f"        {h} 1;" for h in proxy_only)
    temp = prefix / "tmp"
    return f"""
{user}
worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
worker_rlimit_nofile {max_connections + 64};
events {{ worker_connections {max_connections}; }}
http {{
    log_format crawl '$msec $host $server_protocol $status $request_uri $remote_addr';
    access_log {prefix}/access.log crawl;
    keepalive_requests 1000000;
    keepalive_timeout 300;
    http2_idle_timeout 300s;
    http2_max_requests 1000000;
    types {{ text/html html; text/plain txt; }}
    default_type application/octet-stream;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    map $host $h2_only {{
        default 0;
{h2_map}
    }}
    map $host $proxy_only {{
        default 0;
{proxy_map}
    }}
    map $remote_addr $from_proxy {{ default 0; {PROXY_SOURCE} 1; }}
    map "$h2_only:$server_protocol" $wrong_protocol {{ default 0; "1:HTTP/1.1" 1; "1:HTTP/1.0" 1; }}
    map "$proxy_only:$from_proxy" $wrong_source {{ default 0; "1:0" 1; }}
    server {{
        listen 127.0.0.1:{port} ssl http2 backlog=4096;
        server_name _;
        ssl_certificate {ca.cert_file};
        ssl_certificate_key {ca.key_file};
        root {site}/$host;
        index index.html;
        if ($wrong_protocol) {{ return 505; }}
        if ($wrong_source) {{ return 403; }}
    }}
}}
"""


@contextlib.contextmanager
def start_tls_web(directory: Path, *, seed: int = 1, hosts: int = 8, pages_per_host: int = 6,
                  links_per_page: int = 8, page_bytes: int = 15_000, h2_only_fraction: float = 0.5,
                  proxy_only_fraction: float = 0.25, workers: int = 1, extra_names: Sequence[str] = (),
                  max_connections: int = 4096) -> Iterator[TlsWeb]:
    """Serve the site; ``extra_names`` are more names the certificate covers (a host there that is not in the
    site answers 404: enough to open and hold a connection), ``max_connections`` nginx's connection bound."""
    nginx = nginx_binary()
    if nginx is None:
        pytest.skip("nginx is not installed")
    graph = SiteGraph.generate(seed=seed, hosts=hosts, pages_per_host=pages_per_host, links_per_page=links_per_page,
                               page_bytes=page_bytes, features=False, cross_host_fraction=0.5)
    names = [spec.name for spec in graph.hosts]
    h2_only = names[: int(len(names) * h2_only_fraction)]
    # proxy-only hosts: taken from both halves, so some are HTTP/2 only and some not
    proxy_only = names[:: max(1, round(1 / proxy_only_fraction))] if proxy_only_fraction else []
    port = _free_port()
    site = write_site(graph, directory / "site", port=port)
    for path in site.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".txt"):
            path.write_bytes(path.read_bytes().replace(b"http://", b"https://"))
    ca = make_ca(directory / "ca", [*names, *extra_names])
    prefix = directory / "nginx"
    for sub in ("tmp",):
        (prefix / sub).mkdir(parents=True, exist_ok=True)
    for dirpath, _dirs, _files in os.walk(directory):
        os.chmod(dirpath, 0o755)
    os.chmod(ca.key_file, 0o644)
    conf = prefix / "nginx.conf"
    conf.write_text(_config(prefix, site, port, ca, h2_only, proxy_only, workers, max_connections))
    proc = subprocess.Popen([nginx, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(port, proc, "nginx")
        yield TlsWeb(graph, port, ca, frozenset(h2_only), frozenset(proxy_only), prefix / "access.log")
    finally:
        _stop(proc)
