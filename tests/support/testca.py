"""A throwaway certificate authority for TLS tests: one CA, a server certificate naming the given hosts, and a
client certificate; written as PEM files under a directory so servers (nginx) and policies can load them."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["CertAuthority", "make_ca"]


@dataclass(frozen=True)
class CertAuthority:
    ca_file: Path
    cert_file: Path  # the server's, naming every host given
    key_file: Path
    client_cert_file: Path
    client_key_file: Path

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca_file)
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


def _name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_ca(directory: Path, hosts: list[str]) -> CertAuthority:
    now = datetime.datetime.now(datetime.UTC)
    validity = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=1))
    pem = serialization.Encoding.PEM

    def certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool, names: list[str]):  # type: ignore[no-untyped-def]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(validity[0])
            .not_valid_after(validity[1])
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName([_name(n) for n in names]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    def write(name: str, cert, key) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
        cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(pem))
        key_path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path

    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = certificate("peercrawl test CA", ca_key, "peercrawl test CA", ca_key, ca=True, names=[])
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = certificate(hosts[0], leaf_key, "peercrawl test CA", ca_key, ca=False, names=hosts)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = certificate("peercrawl client", client_key, "peercrawl test CA", ca_key, ca=False, names=[])
    ca_file, _ = write("ca", ca_cert, ca_key)
    cert_file, key_file = write("server", leaf, leaf_key)
    client_cert, client_key_file = write("client", client, client_key)
    return CertAuthority(ca_file, cert_file, key_file, client_cert, client_key_file)
