"""A second HTTP/2 implementation: nghttp2's server (`nghttpd`, Debian's nghttp2-server), which speaks HTTP/2
only. The fetcher fetches from it by ALPN, and a fetcher told not to offer HTTP/2 gets a typed failure
instead of a page."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import trio

from peer.fetch.errors import FetchError
from peer.fetch.http import Fetcher
from peer.fetch.policy import HostPolicies
from tests.support.testca import make_ca

pytestmark = pytest.mark.slow

UA = "peercrawl-test/1 (+http://127.0.0.1/contact)"
PAGE = b"<html><body>" + b"<p>nghttpd serves this page over HTTP/2.</p>\n" * 400 + b"</body></html>"


class LoopbackResolver:
    async def resolve(self, host: str) -> str:
        await trio.lowlevel.checkpoint()
        return "127.0.0.1"


async def test_fetch_from_nghttpd(tmp_path: Path) -> None:
    nghttpd = shutil.which("nghttpd") or ("/usr/sbin/nghttpd" if Path("/usr/sbin/nghttpd").exists() else None)
    if nghttpd is None:
        pytest.skip("nghttpd is not installed (apt-get install nghttp2-server)")
    ca = make_ca(tmp_path / "ca", ["only-h2.test"])
    docroot = tmp_path / "htdocs"
    docroot.mkdir()
    (docroot / "page.html").write_bytes(PAGE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([nghttpd, "-a", "127.0.0.1", "-d", str(docroot), str(port), str(ca.key_file),
                               str(ca.cert_file)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None and time.monotonic() < deadline, server.stderr.read().decode()[-2000:]
            await trio.sleep(0.05)
        tls = {"tls_ca_file": str(ca.ca_file)}
        url = f"https://only-h2.test:{port}/page.html"
        async with Fetcher(LoopbackResolver(), user_agent=UA,
                           policies=HostPolicies.build(http2=True, proxy=(), tls=tls, hosts=[])) as fetcher:
            plain = await fetcher.fetch(url, headers=[("accept-encoding", "identity")])
            again = await fetcher.fetch(url)
            missing = await fetcher.fetch(f"https://only-h2.test:{port}/none.html")
        async with Fetcher(LoopbackResolver(), user_agent=UA,
                           policies=HostPolicies.build(http2=False, proxy=(), tls=tls, hosts=[])) as fetcher:
            with pytest.raises(FetchError) as refused:
                await fetcher.fetch(url)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert plain.protocol == again.protocol == "h2" and plain.body == again.body == PAGE
    assert missing.status == 404
    assert refused.value.label in ("tls", "protocol")
