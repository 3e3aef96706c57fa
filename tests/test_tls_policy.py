"""TLS settings per host pattern against real TLS servers on loopback: version bounds, ciphers, verification
off, client certificates; failures are typed by kind (their labels are what /status and metrics count)."""

from __future__ import annotations

import functools
import socket
import ssl
import threading
from pathlib import Path

import pytest
import trio

from peer.fetch.errors import FetchError, TlsCertificateFailed, TlsFailed, TlsVersionFailed
from peer.fetch.http import Fetcher
from peer.fetch.policy import HostPolicies
from tests.support.testca import CertAuthority, make_ca
from tests.test_http import PAGE, LocalWeb

UA = "peercrawl-test/1 (+http://127.0.0.1/contact)"


class LoopbackResolver:
    async def resolve(self, host: str) -> str:
        await trio.lowlevel.checkpoint()
        return "127.0.0.1"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertAuthority:
    return make_ca(tmp_path_factory.mktemp("ca"), ["tls.test", "old.test", "mtls.test"])


async def serve(nursery: trio.Nursery, context: ssl.SSLContext) -> LocalWeb:
    web = LocalWeb()
    listeners = await nursery.start(functools.partial(trio.serve_ssl_over_tcp, web.handle, 0, context,
                                                      host="127.0.0.1"))
    web.port = listeners[0].transport_listener.socket.getsockname()[1]
    return web


def fetcher(ca: CertAuthority | None, rules: list[tuple[str, dict[str, object]]]) -> Fetcher:
    tls = {"tls_ca_file": str(ca.ca_file)} if ca is not None else {}
    return Fetcher(LoopbackResolver(), user_agent=UA,
                   policies=HostPolicies.build(http2=False, proxy=(), tls=tls, hosts=rules))


def _blocking_tls_server(context: ssl.SSLContext, connections: int) -> tuple[int, threading.Thread]:
    """A stdlib TLS server in a thread for ``connections`` connections: a blocking handshake sends its alert
    on failure, as real servers do (trio's server side drops it with the connection)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        with listener:
            for _ in range(connections):
                conn, _ = listener.accept()
                try:
                    with context.wrap_socket(conn, server_side=True) as tls:
                        tls.recv(65536)
                        tls.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                                    % len(PAGE) + PAGE)
                except (ssl.SSLError, OSError):
                    conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


async def test_version_bounds_per_host(ca: CertAuthority) -> None:
    server = ca.server_context()
    server.maximum_version = ssl.TLSVersion.TLSv1_2  # a server that stopped at TLS 1.2
    port, thread = _blocking_tls_server(server, 2)
    rules = [("tls.test", {"tls_min_version": "TLSv1.3"})]
    async with fetcher(ca, rules) as f:
        with pytest.raises(TlsVersionFailed) as refused:
            await f.fetch(f"https://tls.test:{port}/page")
        old = await f.fetch(f"https://old.test:{port}/page")  # the default allows TLS 1.2
    await trio.to_thread.run_sync(thread.join)
    assert refused.value.label == "tls-version" and old.body == PAGE


async def test_ciphers_per_host(nursery: trio.Nursery, ca: CertAuthority) -> None:
    server = ca.server_context()
    server.maximum_version = ssl.TLSVersion.TLSv1_2
    server.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    web = await serve(nursery, server)
    rules = [("tls.test", {"tls_ciphers": "ECDHE-ECDSA-CHACHA20-POLY1305", "tls_max_version": "TLSv1.2"}),
             ("old.test", {"tls_ciphers": "ECDHE-ECDSA-AES128-GCM-SHA256", "tls_max_version": "TLSv1.2"})]
    async with fetcher(ca, rules) as f:
        with pytest.raises(TlsFailed) as no_shared_cipher:
            await f.fetch(f"https://tls.test:{web.port}/page")
        assert (await f.fetch(f"https://old.test:{web.port}/page")).body == PAGE
    assert type(no_shared_cipher.value) is TlsFailed and no_shared_cipher.value.label == "tls"


async def test_verification_off_for_one_host_only(nursery: trio.Nursery, ca: CertAuthority) -> None:
    web = await serve(nursery, ca.server_context())
    async with fetcher(None, [("old.test", {"tls_verify": False})]) as f:  # the system CAs: ours is unknown
        assert (await f.fetch(f"https://old.test:{web.port}/page")).body == PAGE
        with pytest.raises(TlsCertificateFailed) as untrusted:
            await f.fetch(f"https://tls.test:{web.port}/page")
    assert untrusted.value.label == "tls-certificate"


async def test_client_certificate_per_host(nursery: trio.Nursery, ca: CertAuthority) -> None:
    server = ca.server_context(require_client_cert=True)
    server.maximum_version = ssl.TLSVersion.TLSv1_2  # the refusal comes in the handshake
    web = await serve(nursery, server)
    rules = [("mtls.test", {"tls_client_cert": str(ca.client_cert_file), "tls_client_key": str(ca.client_key_file)})]
    async with fetcher(ca, rules) as f:
        assert (await f.fetch(f"https://mtls.test:{web.port}/page")).body == PAGE
        with pytest.raises(FetchError) as without:
            await f.fetch(f"https://tls.test:{web.port}/page")
    assert isinstance(without.value, TlsFailed)


def test_settings_that_cannot_work_are_refused_at_start(tmp_path: Path, ca: CertAuthority) -> None:
    with pytest.raises(ValueError, match="tls_min_version TLSv1.3 is above"):
        HostPolicies.build(http2=True, proxy=(), tls={}, hosts=[
            ("a.test", {"tls_min_version": "TLSv1.3", "tls_max_version": "TLSv1.2"})])
    with pytest.raises(ValueError, match="do not load"):
        HostPolicies.build(http2=True, proxy=(), tls={}, hosts=[("a.test", {"tls_client_cert": str(tmp_path)})])
    with pytest.raises(ValueError, match="do not load"):
        HostPolicies.build(http2=True, proxy=(), tls={}, hosts=[("a.test", {"tls_ciphers": "NO-SUCH-CIPHER"})])
    built = HostPolicies.build(http2=True, proxy=(), tls={}, hosts=[
        ("a.test", {"http2": False}), ("*", {"tls_min_version": "TLSv1.3", "tls_legacy_renegotiation": True})])
    # `*` sets the default beneath every other pattern, wherever it stands
    assert built.default.tls.min_version == "TLSv1.3" and built.for_host("a.test").tls.min_version == "TLSv1.3"
    assert built.for_host("a.test").http2 is False
    assert built.for_host("a.test").ssl_context().options & 0x4  # SSL_OP_LEGACY_SERVER_CONNECT (not in 3.11's ssl)


def _ssl_mode(context: ssl.SSLContext) -> int:
    """OpenSSL's mode bits of `context`, read through libssl (CPython's SSLContext object holds its SSL_CTX
    pointer right after the object header)."""
    import ctypes
    import _ssl

    ctrl = ctypes.CDLL(_ssl.__file__).SSL_CTX_ctrl
    ctrl.restype = ctypes.c_long
    ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
    ssl_ctx = ctypes.c_void_p.from_address(id(context) + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    return ctrl(ssl_ctx, 33, 0, None)  # SSL_CTRL_MODE with no bits to add: the mode in force


def test_an_idle_tls_connection_gives_its_buffers_back(ca: CertAuthority) -> None:
    """SSL_MODE_RELEASE_BUFFERS on every context the fetcher makes: an idle connection holds no OpenSSL read
    or write buffer (docs/fetching.md, the memory of idle connections)."""
    policies = HostPolicies.build(http2=True, proxy=(), tls={"tls_ca_file": str(ca.ca_file)},
                                  hosts=[("legacy.test", {"tls_min_version": "TLSv1.2", "tls_verify": False})])
    for host in ("a.test", "legacy.test"):
        mode = _ssl_mode(policies.for_host(host).ssl_context())
        assert mode & 0x10, hex(mode)  # SSL_MODE_RELEASE_BUFFERS
        assert not mode & 0x1, hex(mode)  # SSL_MODE_ENABLE_PARTIAL_WRITE, never set: a mask is read
