"""`gpuledger certs generate|rotate`: files, manifests, and rotations that never strand a client.

Time is passed in (`--now` / `now=`); where a real TLS handshake checks validity, the times are chosen so
that every certificate involved is valid at the real current time.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import ssl
import stat
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpuledger.certs import bundle, cli, pki, render
from tests.certs.test_certs_pki import _handshake
from tests.deploy.test_manifests import OVERLAYS, one, validate, webhook_deployment

T0 = datetime(2025, 3, 1, tzinfo=UTC)
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not on PATH")


def generate(tmp_path: Path, *extra: str, now: datetime = T0) -> Path:
    out = tmp_path / "tls"
    assert cli.main(["generate", "--out", str(out), "--now", now.isoformat(), *extra]) == 0
    return out


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_ino) for p in directory.iterdir()}


def server_for(directory: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    return ctx


def client_trusting(bundle_pem: bytes) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=bundle_pem.decode())


def patched_cabundles(directory: Path) -> set[bytes]:
    """The caBundle values the patch file would write into the webhook configurations."""
    patches = list(yaml.safe_load_all((directory / bundle.PATCH_FILE).read_text()))
    return {base64.b64decode(w["clientConfig"]["caBundle"]) for p in patches for w in p["webhooks"]}


# ------------------------------------------------------------------------------------------- generate
def test_generate_writes_a_verifiable_bundle_and_private_modes(tmp_path, capsys):
    out = generate(
        tmp_path, "--service", "gl", "--namespace", "ns", "--dns", "gl.example", "--ip", "127.0.0.1"
    )
    assert "kubectl apply -k" in capsys.readouterr().out
    ca, serving = (out / "ca.crt").read_bytes(), (out / "tls.crt").read_bytes()
    assert pki.dns_sans(serving) == [*pki.service_dns_names("gl", "ns"), "gl.example"]
    assert pki.ip_sans(serving) == ["127.0.0.1"]
    x509.load_pem_x509_certificate(serving).verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    assert pki.not_after(serving) == T0 + timedelta(days=90)
    assert pki.not_after(ca) == T0 + timedelta(days=365)
    for private in ("tls.key", "ca.key", bundle.SECRET_FILE, bundle.PLACEMENT_KEY_FILE):
        assert stat.S_IMODE((out / private).stat().st_mode) == 0o600, private

    secret = yaml.safe_load((out / bundle.SECRET_FILE).read_text())
    assert (secret["type"], secret["metadata"]["name"], secret["metadata"]["namespace"]) == (
        "kubernetes.io/tls",
        render.TLS_SECRET,
        "ns",
    )
    files = {"tls.crt": serving, "tls.key": (out / "tls.key").read_bytes(), "ca.crt": ca}
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == files
    assert patched_cabundles(out) == {ca} == {(out / bundle.BUNDLE_FILE).read_bytes()}
    key_secret = yaml.safe_load((out / bundle.PLACEMENT_KEY_FILE).read_text())
    assert len(base64.b64decode(key_secret["data"]["key"])) == 64


def test_generate_keeps_the_placement_key_but_makes_a_new_ca(tmp_path):
    out = generate(tmp_path)
    key, ca = (out / bundle.PLACEMENT_KEY_FILE).read_bytes(), (out / "ca.crt").read_bytes()
    generate(tmp_path)
    assert (out / bundle.PLACEMENT_KEY_FILE).read_bytes() == key  # re-keying would orphan signed placements
    assert (out / "ca.crt").read_bytes() != ca


def test_generate_without_kustomization_or_placement_key(tmp_path):
    out = generate(tmp_path, "--no-kustomization", "--no-placement-key")
    assert not (out / bundle.KUSTOMIZATION_FILE).exists() and not (out / bundle.PLACEMENT_KEY_FILE).exists()
    assert (out / bundle.SECRET_FILE).exists()


def test_generate_rejects_a_bad_overlay_and_time(tmp_path, capsys):
    assert cli.main(["generate", "--out", str(tmp_path), "--overlay", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert cli.main(["generate", "--out", str(tmp_path), "--now", "yesterday"]) == 2
    err = capsys.readouterr().err
    assert "'yesterday'" in err and "ISO-8601" in err


@needs_kubectl
@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_output_directory_is_an_installable_kustomization(tmp_path, overlay):
    """`kubectl apply -k DIR` = the overlay + the Secrets + caBundle in both webhook configurations."""
    out = generate(tmp_path, "--overlay", str(OVERLAYS[overlay]))
    proc = subprocess.run(["kubectl", "kustomize", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert [e for d in docs for e in validate(d)] == []
    ca = (out / "ca.crt").read_bytes()
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (webhook,) = one(docs, kind)["webhooks"]
        assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca
        assert webhook["clientConfig"]["service"]["path"]  # the patch merged into, not replaced, the webhook
    tls_volume = next(
        v for v in webhook_deployment(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"
    )
    secret = one(docs, "Secret", tls_volume["secret"]["secretName"])
    service = one(docs, "Service", "gpuledger")
    served = base64.b64decode(secret["data"]["tls.crt"])
    assert pki.dns_sans(served) == pki.service_dns_names(
        service["metadata"]["name"], service["metadata"]["namespace"]
    )
    assert one(docs, "Secret", render.PLACEMENT_KEY_SECRET)


# --------------------------------------------------------------------------------------------- rotate
def test_rotate_before_two_thirds_changes_nothing(tmp_path, capsys):
    out = generate(tmp_path)
    before = snapshot(out)
    serving_start = pki.not_before((out / "tls.crt").read_bytes())
    almost = serving_start + (T0 + timedelta(days=90) - serving_start) * 2 / 3 - timedelta(minutes=1)
    assert cli.main(["rotate", "--dir", str(out), "--now", almost.isoformat()]) == 0
    assert "nothing due" in capsys.readouterr().out
    assert snapshot(out) == before  # not even rewritten with the same bytes


def test_rotate_at_two_thirds_renews_the_serving_cert_and_keeps_the_ca(tmp_path, capsys):
    out = generate(tmp_path, "--ip", "127.0.0.1")
    old = (out / "tls.crt").read_bytes()
    ca, patch = (out / "ca.crt").read_bytes(), (out / bundle.PATCH_FILE).read_bytes()
    when = T0 + timedelta(days=60)
    assert cli.main(["rotate", "--dir", str(out), "--now", when.isoformat()]) == 0
    assert "serving certificate renewed" in capsys.readouterr().out
    new = (out / "tls.crt").read_bytes()
    assert new != old and pki.dns_sans(new) == pki.dns_sans(old) and pki.ip_sans(new) == pki.ip_sans(old)
    assert pki.not_after(new) == when + timedelta(days=90)
    # the caBundle the API server holds stays valid: CA and patch untouched
    assert (out / "ca.crt").read_bytes() == ca and (out / bundle.PATCH_FILE).read_bytes() == patch
    x509.load_pem_x509_certificate(new).verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    secret = yaml.safe_load((out / bundle.SECRET_FILE).read_text())
    assert base64.b64decode(secret["data"]["tls.crt"]) == new
    # rotating again at the same time is a no-op
    assert not bundle.rotate(out, now=when).changed


def test_force_renews_even_when_not_due(tmp_path):
    out = generate(tmp_path)
    old = (out / "tls.crt").read_bytes()
    assert not bundle.rotate(out, now=T0 + timedelta(days=1)).changed
    result = bundle.rotate(out, now=T0 + timedelta(days=1), force=True)
    assert result.serving_rotated and not result.ca_next_created
    assert (out / "tls.crt").read_bytes() != old


def test_rotate_on_an_empty_directory_says_what_to_run(tmp_path, capsys):
    assert cli.main(["rotate", "--dir", str(tmp_path)]) == 2
    assert "gpuledger certs generate" in capsys.readouterr().err


def test_renewed_certificate_is_served_and_trusted_with_the_unchanged_cabundle(tmp_path):
    """A real handshake after a rotation, trusting only the caBundle published before it."""
    now = datetime.now(UTC)
    out = generate(tmp_path, "--ip", "127.0.0.1", "--days", "3", now=now - timedelta(days=2, hours=1))
    (published,) = patched_cabundles(out)
    assert bundle.rotate(out, now=now - timedelta(minutes=1)).serving_rotated
    for host in ("gpuledger.gpuledger-system.svc", "127.0.0.1"):
        assert _handshake(server_for(out), client_trusting(published), host) == b"ping"


def test_ca_roll_publishes_first_and_signs_later_so_no_client_is_stranded(tmp_path):
    """CA at two thirds: phase 1 adds the next CA to the bundle while the old one keeps signing; phase 2
    (after the overlap) signs with the next CA and keeps the old one trusted until it expires."""
    real_now = datetime.now(UTC)
    t0 = real_now - timedelta(days=22, hours=1)
    out = generate(tmp_path, "--days", "10", "--ca-days", "30", "--ip", "127.0.0.1", now=t0)
    old_ca = (out / "ca.crt").read_bytes()
    (bundle_0,) = patched_cabundles(out)

    phase1 = bundle.rotate(out, now=t0 + timedelta(days=21))
    assert phase1.ca_next_created and not phase1.ca_promoted and phase1.serving_rotated
    (bundle_1,) = patched_cabundles(out)
    next_ca = (out / "ca-next.crt").read_bytes()
    assert bundle_1 == old_ca + next_ca
    assert (out / "ca.crt").read_bytes() == old_ca  # still signing
    serving_1 = (out / "tls.crt").read_bytes()
    assert x509.load_pem_x509_certificate(serving_1).issuer == x509.load_pem_x509_certificate(old_ca).subject
    # a client that has not received bundle_1 yet still verifies what is served
    assert _handshake(server_for(out), client_trusting(bundle_0), "127.0.0.1") == b"ping"
    server_1 = server_for(out)

    assert not bundle.rotate(out, now=t0 + timedelta(days=21, hours=12)).changed  # inside the overlap

    phase2 = bundle.rotate(out, now=t0 + timedelta(days=22, minutes=10))
    assert phase2.ca_promoted and phase2.serving_rotated
    assert (out / "ca.crt").read_bytes() == next_ca and not (out / "ca-next.crt").exists()
    (bundle_2,) = patched_cabundles(out)
    assert bundle_2 == next_ca + old_ca
    # the certificate signed by the new CA verifies against the bundle published in phase 1 ...
    assert _handshake(server_for(out), client_trusting(bundle_1), "127.0.0.1") == b"ping"
    # ... and a replica still serving the phase-1 certificate verifies against the new bundle
    assert _handshake(server_1, client_trusting(bundle_2), "127.0.0.1") == b"ping"

    after_old_expiry = bundle.rotate(out, now=t0 + timedelta(days=31))
    assert not after_old_expiry.ca_promoted
    assert patched_cabundles(out) == {next_ca}
    assert not (out / bundle.PREVIOUS_CA).exists()


def test_an_expired_ca_is_replaced_at_once_with_a_note(tmp_path):
    out = generate(tmp_path, "--ca-days", "30", "--days", "10")
    result = bundle.rotate(out, now=T0 + timedelta(days=40))
    assert result.ca_next_created and result.ca_promoted and result.serving_rotated
    assert any("caBundle" in note for note in result.notes)
    assert patched_cabundles(out) == {(out / "ca.crt").read_bytes()}  # the expired CA is not kept


def test_a_polling_reloader_never_reads_a_torn_file_during_rotation(tmp_path):
    """What the webhook's reloader sees while rotate() runs: each poll either loads a complete, matching
    pair or (for the instant between the key's and the certificate's rename) a key/cert mismatch, which it
    answers by keeping the previous context. Never a truncated or half-written PEM."""
    out = generate(tmp_path, now=datetime.now(UTC))
    stop = threading.Event()
    loaded, mismatched, other_errors = set(), [0], []

    def poll() -> None:
        last = None
        while not stop.is_set():
            digest = hashlib.sha256((out / "tls.crt").read_bytes() + (out / "tls.key").read_bytes()).digest()
            if digest == last:
                continue
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                ctx.load_cert_chain(out / "tls.crt", out / "tls.key")
            except ssl.SSLError as exc:
                if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
                    mismatched[0] += 1
                    continue
                other_errors.append(repr(exc))
                continue
            last = digest
            loaded.add(digest)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        for _ in range(40):
            bundle.rotate(out, force=True)
    finally:
        stop.set()
        reader.join(10)
    assert other_errors == []
    assert len(loaded) >= 2
    final = hashlib.sha256((out / "tls.crt").read_bytes() + (out / "tls.key").read_bytes()).digest()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(out / "tls.crt", out / "tls.key")  # the end state is a consistent pair
    assert final and not any(p.name.endswith(".tmp") for p in out.iterdir())


def test_dispatcher_routes_certs(tmp_path):
    from gpuledger.cli.main import main

    assert main(["certs", "generate", "--out", str(tmp_path / "d"), "--no-kustomization"]) == 0
    assert main(["certs", "rotate", "--dir", str(tmp_path / "d")]) == 0
    assert os.path.exists(tmp_path / "d" / "tls.crt")


def _served_certificate(server_ctx: ssl.SSLContext, trusted: bytes, host: str) -> bytes:
    """DER of the certificate a real handshake presented, verified against `trusted`."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            client_trusting(trusted).wrap_socket(raw, server_hostname=host) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
            tls.sendall(b"x")
            return der
    finally:
        thread.join(5)
        listener.close()


def test_the_webhooks_reloader_serves_the_rotated_certificate(tmp_path):
    """rotate() with the webhook's own ReloadingTLS (gpuledger/webhook/tls.py): after one poll, new
    handshakes get the
    renewed certificate, still trusted by the caBundle published before the rotation."""
    tls_module = pytest.importorskip("gpuledger.webhook.transport.tls")
    now = datetime.now(UTC)
    out = generate(tmp_path, "--ip", "127.0.0.1", "--days", "3", now=now - timedelta(days=2, hours=1))
    (published,) = patched_cabundles(out)
    reloader = tls_module.ReloadingTLS(str(out / "tls.crt"), str(out / "tls.key"))
    before = _served_certificate(reloader.context, published, "127.0.0.1")
    assert bundle.rotate(out, now=now - timedelta(minutes=1)).serving_rotated
    assert reloader.check() is True
    after = _served_certificate(reloader.context, published, "127.0.0.1")
    renewed = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    assert before != after and after == renewed.public_bytes(serialization.Encoding.DER)
    assert reloader.check() is False  # nothing changed since
