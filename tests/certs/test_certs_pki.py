"""gpuledger.certs.pki: certificates that real TLS accepts, rotation decided by the time passed in, atomic
files."""

from __future__ import annotations

import socket
import ssl
import stat
import threading
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from gpuledger.certs import pki

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def _handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, server_hostname: str) -> bytes:
    """One real TLS handshake over loopback; returns what the server echoed."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(tls.recv(64))
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls,
        ):
            tls.sendall(b"ping")
            return tls.recv(64)
    finally:
        thread.join(5)
        listener.close()


def _server_ctx(tmp_path, ca: pki.KeyPair, serving: pki.KeyPair) -> ssl.SSLContext:
    paths = pki.write_bundle(tmp_path, ca, serving)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(paths["tls.crt"], paths["tls.key"])
    return ctx


def _client_ctx(ca: pki.KeyPair, client: pki.KeyPair | None = None, tmp_path=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    if client is not None:
        (tmp_path / "client.crt").write_bytes(client.cert_pem)
        (tmp_path / "client.key").write_bytes(client.key_pem)
        ctx.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    return ctx


def test_service_dns_names_cover_every_in_cluster_form():
    assert pki.service_dns_names("gpuledger", "gpuledger-system") == [
        "gpuledger",
        "gpuledger.gpuledger-system",
        "gpuledger.gpuledger-system.svc",
        "gpuledger.gpuledger-system.svc.cluster.local",
    ]


def test_serving_cert_passes_real_tls_hostname_verification_by_san(tmp_path):
    ca = pki.make_ca()
    names = pki.service_dns_names("gpuledger", "gpuledger-system")
    serving = pki.make_serving_cert(ca, names, ip_addresses=["127.0.0.1"])
    server = _server_ctx(tmp_path, ca, serving)
    for host in [*names, "127.0.0.1"]:
        assert _handshake(server, _client_ctx(ca), host) == b"ping"


def test_hostname_outside_the_sans_is_rejected(tmp_path):
    ca = pki.make_ca()
    serving = pki.make_serving_cert(ca, ["gpuledger.gpuledger-system.svc"])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(_server_ctx(tmp_path, ca, serving), _client_ctx(ca), "other.gpuledger-system.svc")


def test_identity_is_in_sans_not_cn(tmp_path):
    """Modern TLS clients (Go's included) ignore the CN: a host named only in the CN must fail."""
    ca = pki.make_ca()
    serving = pki.make_serving_cert(ca, ["a.example", "b.example"])
    cn = serving.cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value
    assert cn == "a.example" and pki.dns_sans(serving.cert_pem) == ["a.example", "b.example"]
    cn_only = pki._leaf(
        ca,
        "a.example",
        ExtendedKeyUsageOID.SERVER_AUTH,
        x509.SubjectAlternativeName([x509.DNSName("b.example")]),
        90,
        None,
    )
    server = _server_ctx(tmp_path, ca, cn_only)
    assert _handshake(server, _client_ctx(ca), "b.example") == b"ping"
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, _client_ctx(ca), "a.example")


def test_certificate_profiles():
    ca = pki.make_ca(now=NOW)
    serving = pki.make_serving_cert(ca, ["s"], now=NOW)
    client = pki.make_client_cert(ca, "system:apiserver", now=NOW)
    ca_cert = ca.cert
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    for leaf, usage in (
        (serving, ExtendedKeyUsageOID.SERVER_AUTH),
        (client, ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        cert = leaf.cert
        assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
        assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [usage]
        assert cert.issuer == ca_cert.subject
        assert leaf.key.curve.name == "secp256r1"
        cert.verify_directly_issued_by(ca_cert)
    assert pki.not_after(serving.cert_pem) == NOW + timedelta(days=90)
    assert pki.not_after(ca.cert_pem) == NOW + timedelta(days=365)


def test_client_cert_authenticates_to_a_server_requiring_one(tmp_path):
    ca = pki.make_ca()
    server = _server_ctx(tmp_path, ca, pki.make_serving_cert(ca, ["localhost"]))
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_verify_locations(cadata=ca.cert_pem.decode())
    client = pki.make_client_cert(ca, "kube-apiserver")
    assert _handshake(server, _client_ctx(ca, client, tmp_path), "localhost") == b"ping"


def test_leaf_never_outlives_its_ca_and_expired_ca_is_refused():
    ca = pki.make_ca(days=30, now=NOW)
    leaf = pki.make_serving_cert(ca, ["s"], days=90, now=NOW)
    assert pki.not_after(leaf.cert_pem) == pki.not_after(ca.cert_pem)
    with pytest.raises(ValueError, match="expired"):
        pki.make_serving_cert(ca, ["s"], now=NOW + timedelta(days=31))


def test_needs_rotation_at_two_thirds_of_the_lifetime():
    ca = pki.make_ca(now=NOW)
    leaf = pki.make_serving_cert(ca, ["s"], days=90, now=NOW)
    start = leaf.cert.not_valid_before_utc
    lifetime = pki.not_after(leaf.cert_pem) - start
    assert not pki.needs_rotation(leaf.cert_pem, NOW)
    assert not pki.needs_rotation(leaf.cert_pem, start + lifetime * 2 / 3 - timedelta(seconds=1))
    assert pki.needs_rotation(leaf.cert_pem, start + lifetime * 2 / 3)
    assert pki.needs_rotation(leaf.cert_pem, NOW + timedelta(days=400))
    assert pki.needs_rotation(leaf.cert_pem, NOW + timedelta(days=10), fraction=0.1)
    # a naive datetime is read as UTC
    assert pki.needs_rotation(leaf.cert_pem, (NOW + timedelta(days=80)).replace(tzinfo=None))


def test_write_bundle_modes_and_no_temporary_files_left(tmp_path):
    ca = pki.make_ca()
    paths = pki.write_bundle(tmp_path / "tls", ca, pki.make_serving_cert(ca, ["s"]))
    assert sorted(p.name for p in (tmp_path / "tls").iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert stat.S_IMODE(paths["tls.key"].stat().st_mode) == 0o600
    assert paths["ca.crt"].read_bytes() == ca.cert_pem


def test_atomic_write_replaces_the_inode_so_open_readers_keep_the_old_content(tmp_path):
    """A reader holding the old file (e.g. mid-read during reload) sees complete old bytes, never a mix."""
    target = tmp_path / "tls.crt"
    pki.atomic_write(target, b"old" * 10000)
    with open(target, "rb") as reader:
        before = target.stat().st_ino
        pki.atomic_write(target, b"new" * 10000)
        assert reader.read() == b"old" * 10000
    assert target.stat().st_ino != before
    assert target.read_bytes() == b"new" * 10000


def test_concurrent_reader_never_sees_a_partial_file(tmp_path):
    ca = pki.make_ca()
    pairs = [pki.make_serving_cert(ca, [f"s{i}"]) for i in range(3)]
    valid = {p.cert_pem for p in pairs}
    pki.write_bundle(tmp_path, ca, pairs[0])
    stop = threading.Event()
    seen: list[bytes] = []

    def read_loop() -> None:
        while not stop.is_set():
            seen.append((tmp_path / "tls.crt").read_bytes())

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        for i in range(200):
            pki.write_bundle(tmp_path, ca, pairs[i % 3])
    finally:
        stop.set()
        reader.join()
    assert seen and set(seen) <= valid


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "tls.key"
    pki.atomic_write(target, b"old", mode=0o600)

    def boom(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(pki.os, "replace", boom)
    with pytest.raises(OSError):
        pki.atomic_write(target, b"new", mode=0o600)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["tls.key"]


def test_serving_cert_needs_a_name():
    with pytest.raises(ValueError, match="DNS name or IP"):
        pki.make_serving_cert(pki.make_ca(), [])
