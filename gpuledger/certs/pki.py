"""A tiny PKI for the webhook: one CA, short-lived ECDSA serving certificates, atomic on-disk bundles.

Time is an input (`now`), so expiry and rotation are tested without sleeping. Keys are ECDSA P-256: small,
fast to sign with, and accepted by the kube-apiserver and Python's ssl module alike.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# certificates start a little in the past so a peer whose clock lags ours still accepts them
CLOCK_SKEW = timedelta(minutes=5)

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
CA_KEY_FILE = "ca.key"


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"expected an ECDSA private key, got {type(key).__name__}")
        return key


def _utc(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    return now if now.tzinfo else now.replace(tzinfo=UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(common_name: str = "gpuledger-ca", days: int = 365, now: datetime | None = None) -> KeyPair:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    start = _utc(now)
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - CLOCK_SKEW)
        .not_valid_after(start + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(_cert_pem(cert), _key_pem(key))


def _leaf(
    ca: KeyPair,
    common_name: str,
    usage: x509.ObjectIdentifier,
    san: x509.SubjectAlternativeName | None,
    days: int,
    now: datetime | None,
) -> KeyPair:
    start = _utc(now)
    ca_cert, ca_key = ca.cert, ca.key
    # a leaf never outlives its CA: clients would reject the chain on the CA's expiry anyway
    end = min(start + timedelta(days=days), ca_cert.not_valid_after_utc)
    if end <= start:
        raise ValueError(
            f"CA {ca_cert.subject.rfc4514_string()} expired at {ca_cert.not_valid_after_utc.isoformat()}; "
            "make a new CA (and a new caBundle) before issuing certificates"
        )
    key = _new_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(max(start - CLOCK_SKEW, ca_cert.not_valid_before_utc))
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    return KeyPair(_cert_pem(builder.sign(ca_key, hashes.SHA256())), _key_pem(key))


def make_serving_cert(
    ca: KeyPair,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    days: int = 90,
    now: datetime | None = None,
) -> KeyPair:
    """A server-auth certificate whose identity is in its SANs; the CN is informational only."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address SAN")
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    common_name = dns_names[0] if dns_names else str(ip_addresses[0])
    return _leaf(
        ca, common_name, ExtendedKeyUsageOID.SERVER_AUTH, x509.SubjectAlternativeName(names), days, now
    )


def make_client_cert(ca: KeyPair, common_name: str, days: int = 90, now: datetime | None = None) -> KeyPair:
    """A client-auth certificate, e.g. for the kube-apiserver's admission client or a test client."""
    return _leaf(ca, common_name, ExtendedKeyUsageOID.CLIENT_AUTH, None, days, now)


def service_dns_names(service: str, namespace: str) -> list[str]:
    """Every name the API server may use to reach a Service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write a temporary file in the same directory and rename it over `path`: readers see old or new."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bundle(out_dir: str | os.PathLike, ca: KeyPair, serving: KeyPair) -> dict[str, Path]:
    """Write ca.crt, tls.crt and tls.key (0600), each atomically.

    The key goes first, then the certificate: a reloader that polls both files may for one poll see the new
    key with the old certificate, which `ssl.SSLContext.load_cert_chain` rejects as a mismatch, so it keeps
    the previous context and picks up the consistent pair on the next poll.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"ca.crt": out / CA_FILE, "tls.crt": out / CERT_FILE, "tls.key": out / KEY_FILE}
    atomic_write(paths["ca.crt"], ca.cert_pem)
    atomic_write(paths["tls.key"], serving.key_pem, mode=0o600)
    atomic_write(paths["tls.crt"], serving.cert_pem)
    return paths


def not_before(cert_pem: bytes) -> datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_before_utc


def not_after(cert_pem: bytes) -> datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def needs_rotation(cert_pem: bytes, now: datetime, fraction: float = 2 / 3) -> bool:
    """True once `fraction` of the certificate's lifetime has passed (or it has expired)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return _utc(now) >= start + (end - start) * fraction


def dns_sans(cert_pem: bytes) -> list[str]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.DNSName)


def ip_sans(cert_pem: bytes) -> list[str]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
