"""The test cluster's certificates: one CA, serving and client certificates signed by it.

Made once per cluster directory with ``cryptography`` (no openssl subprocess). The CA signs the
API server's serving certificate, every client certificate (admin, the controllers, the kubelet
client) and the webhook servers' certificate; it is also the ``caBundle`` of every webhook
configuration.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=365)


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


class CA:
    """A certificate authority kept in ``<dir>/ca.crt`` + ``ca.key``."""

    def __init__(self, pki: Path):
        self.dir = pki
        self.crt = pki / "ca.crt"
        self.key_path = pki / "ca.key"
        if not self.crt.exists():
            pki.mkdir(parents=True, exist_ok=True)
            key = ec.generate_private_key(ec.SECP256R1())
            now = datetime.datetime.now(datetime.UTC)
            cert = (
                x509.CertificateBuilder()
                .subject_name(_name("tfk8s-devcluster-ca"))
                .issuer_name(_name("tfk8s-devcluster-ca"))
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + 10 * VALID)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(
                    x509.KeyUsage(
                        digital_signature=True,
                        key_cert_sign=True,
                        crl_sign=True,
                        content_commitment=False,
                        key_encipherment=False,
                        data_encipherment=False,
                        key_agreement=False,
                        encipher_only=False,
                        decipher_only=False,
                    ),
                    critical=True,
                )
                .sign(key, hashes.SHA256())
            )
            _write_key(self.key_path, key)
            self.crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._key = serialization.load_pem_private_key(self.key_path.read_bytes(), None)
        self._cert = x509.load_pem_x509_certificate(self.crt.read_bytes())

    def issue(
        self,
        stem: str,
        cn: str,
        *,
        org: str | None = None,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> tuple[Path, Path]:
        """Write ``<stem>.crt``/``<stem>.key`` (once) and return their paths."""
        crt, keyp = self.dir / f"{stem}.crt", self.dir / f"{stem}.key"
        if crt.exists() and keyp.exists():
            return crt, keyp
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        )
        b = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = b.sign(self._key, hashes.SHA256())
        _write_key(keyp, key)
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return crt, keyp


def service_account_keys(pki: Path) -> tuple[Path, Path]:
    """The ServiceAccount token signing key pair (``sa.key``, ``sa.pub``)."""
    key_path, pub_path = pki / "sa.key", pki / "sa.pub"
    if not key_path.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(key_path, key)
        pub_path.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return key_path, pub_path
