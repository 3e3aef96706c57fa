"""Mutual TLS between peers over real loopback sockets: certificates from a CA the test makes."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from peer.cluster.net.transport import TcpTransport, TlsFiles, TransportError


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(key, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _ca(tmp: Path, label: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(label)).issuer_name(_name(label))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path = tmp / f"{label}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


def _node(tmp: Path, ca, node: str) -> TlsFiles:
    ca_key, ca_cert, ca_path = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(node)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(node)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (tmp / f"{node}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, tmp / f"{node}.key")
    return TlsFiles(cert=str(tmp / f"{node}.crt"), key=str(tmp / f"{node}.key"), ca=str(ca_path))


async def _echo(stream: trio.abc.Stream) -> None:
    async with stream:
        data = await stream.receive_some(1024)
        if data:
            await stream.send_all(b"echo:" + data)


@pytest.fixture
def pki(tmp_path):
    cluster = _ca(tmp_path, "cluster-ca")
    other = _ca(tmp_path, "other-ca")
    return {"a": _node(tmp_path, cluster, "a"), "b": _node(tmp_path, cluster, "b"),
            "stranger": _node(tmp_path, other, "stranger")}


async def test_peers_with_the_clusters_certificates_talk(pki):
    server = TcpTransport("127.0.0.1:0", tls=pki["a"])
    client = TcpTransport("127.0.0.1:0", tls=pki["b"])
    async with trio.open_nursery() as nursery:
        address = await nursery.start(server.serve, _echo)
        with trio.fail_after(10):
            stream = await client.connect(address)
            await stream.send_all(b"hello")
            assert await stream.receive_some(1024) == b"echo:hello"
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_certificate_from_another_ca_is_refused_both_ways(pki):
    server = TcpTransport("127.0.0.1:0", tls=pki["a"])
    stranger = TcpTransport("127.0.0.1:0", tls=pki["stranger"])
    async with trio.open_nursery() as nursery:
        address = await nursery.start(server.serve, _echo)
        with trio.fail_after(10):
            # the stranger does not trust our CA: its own check fails at once
            with pytest.raises(TransportError, match="TLS handshake with peer"):
                await stranger.connect(address)
        stranger_address = await nursery.start(stranger.serve, _echo)
        member = TcpTransport("127.0.0.1:0", tls=pki["b"])
        with trio.fail_after(10):
            with pytest.raises(TransportError, match="TLS handshake"):
                await member.connect(stranger_address)
        nursery.cancel_scope.cancel()


async def test_a_plain_tcp_peer_gets_nothing_from_a_tls_node(pki):
    server = TcpTransport("127.0.0.1:0", tls=pki["a"])
    plain = TcpTransport("127.0.0.1:0")
    async with trio.open_nursery() as nursery:
        address = await nursery.start(server.serve, _echo)
        with trio.fail_after(15):
            stream = await plain.connect(address)
            await stream.send_all(b"hello")
            try:
                answer = await stream.receive_some(1024)
            except trio.BrokenResourceError:
                answer = b""
            assert not answer.startswith(b"echo:")  # the TLS server never runs the handler for it
            await stream.aclose()
        nursery.cancel_scope.cancel()


def test_missing_tls_files_are_one_clear_error(tmp_path):
    with pytest.raises(TransportError, match="TLS files"):
        TcpTransport("127.0.0.1:0", tls=TlsFiles(cert=str(tmp_path / "no.crt"), key=str(tmp_path / "no.key"),
                                                   ca=str(tmp_path / "no.pem")))
