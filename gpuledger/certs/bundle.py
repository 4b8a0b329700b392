"""A certificate directory and its life: generate once, rotate often, never break the caBundle.

Layout of DIR (every file written atomically):
  ca.crt, ca.key          the CA that signs the serving certificate
  tls.crt, tls.key        the serving certificate (SANs of the webhook Service)
  ca-bundle.crt           what clients trust: the CA, plus the next/previous CA while one is being rolled
  ca-next.crt/.key        a CA published in the bundle but not yet signing (only during a CA roll)
  ca-previous.crt         the CA that signed until the last roll, kept in the bundle until it expires
  secret.yaml             the kubernetes.io/tls Secret (tls.crt, tls.key, ca.crt = the bundle)
  placement-key.yaml      the HMAC placement key Secret (made once, never rotated here)
  webhook-cabundle.yaml   patches filling caBundle in both webhook configurations
  kustomization.yaml      overlay + the above, for `kubectl apply -k DIR`
  certs.json              what `rotate` needs to remember (service, namespace, lifetimes)

Serving rotation keeps the CA, so the published caBundle stays valid. A CA roll takes two steps so that no
client ever meets a certificate from a CA it has not been given: first the next CA joins the bundle while the
old one still signs; only once the bundle has had `ca_overlap` to propagate does the next CA start signing.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from gpuledger.certs import pki, render

STATE_FILE = "certs.json"
BUNDLE_FILE = "ca-bundle.crt"
NEXT_CA = ("ca-next.crt", "ca-next.key")
PREVIOUS_CA = "ca-previous.crt"
SECRET_FILE, PLACEMENT_KEY_FILE = "secret.yaml", "placement-key.yaml"
PATCH_FILE, KUSTOMIZATION_FILE = "webhook-cabundle.yaml", "kustomization.yaml"
DEFAULT_CA_OVERLAP = timedelta(days=1)


@dataclass(frozen=True)
class Settings:
    service: str
    namespace: str
    secret_name: str = render.TLS_SECRET
    days: int = 90
    ca_days: int = 365
    overlay: str | None = None  # path relative to DIR, or None for no kustomization.yaml
    placement_key: bool = True


@dataclass
class RotationResult:
    serving_not_after: datetime
    ca_not_after: datetime
    serving_rotated: bool = False
    ca_next_created: bool = False
    ca_promoted: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.serving_rotated or self.ca_next_created or self.ca_promoted


def _read_pair(directory: Path, cert_name: str, key_name: str) -> pki.KeyPair | None:
    cert, key = directory / cert_name, directory / key_name
    if not cert.exists():
        return None
    return pki.KeyPair(cert.read_bytes(), key.read_bytes())


def _load_settings(directory: Path) -> Settings:
    path = directory / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `gpuledger certs generate --out {directory}` first")
    return Settings(**json.loads(path.read_text()))


def _write_manifests(directory: Path, settings: Settings, bundle: bytes, serving: pki.KeyPair) -> None:
    secret = render.tls_secret(
        settings.secret_name, settings.namespace, bundle, serving.cert_pem, serving.key_pem
    )
    pki.atomic_write(directory / SECRET_FILE, render.dump_all([secret]), mode=0o600)
    pki.atomic_write(directory / PATCH_FILE, render.dump_all(render.cabundle_patches(bundle)))
    pki.atomic_write(directory / BUNDLE_FILE, bundle)


def generate(
    out_dir: str | os.PathLike,
    service: str,
    namespace: str,
    extra_dns: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    days: int = 90,
    ca_days: int = 365,
    now: datetime | None = None,
    overlay: str | os.PathLike | None = None,
    secret_name: str = render.TLS_SECRET,
    placement_key: bool = True,
) -> dict[str, Path]:
    """A fresh CA and serving certificate, the Secrets, the caBundle patches and a kustomization."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    overlay_rel = os.path.relpath(Path(overlay).resolve(), out) if overlay is not None else None
    settings = Settings(service, namespace, secret_name, days, ca_days, overlay_rel, placement_key)
    ca = pki.make_ca(days=ca_days, now=now)
    dns_names = pki.service_dns_names(service, namespace) + [d for d in extra_dns if d]
    serving = pki.make_serving_cert(ca, dns_names, ip_addresses, days=days, now=now)
    for stale in (*NEXT_CA, PREVIOUS_CA):
        (out / stale).unlink(missing_ok=True)
    paths = pki.write_bundle(out, ca, serving)
    pki.atomic_write(out / "ca.key", ca.key_pem, mode=0o600)
    _write_manifests(out, settings, ca.cert_pem, serving)
    resources = [SECRET_FILE]
    if placement_key:
        # made once: re-keying would orphan every placement annotation already signed in the cluster
        if not (out / PLACEMENT_KEY_FILE).exists():
            key_secret = render.placement_key_secret(namespace, secrets.token_hex(32).encode())
            pki.atomic_write(out / PLACEMENT_KEY_FILE, render.dump_all([key_secret]), mode=0o600)
        resources.append(PLACEMENT_KEY_FILE)
    if overlay_rel is not None:
        kustomization = render.kustomization(out, out / overlay_rel, resources, PATCH_FILE)
        pki.atomic_write(out / KUSTOMIZATION_FILE, render.dump_all([kustomization]))
    pki.atomic_write(out / STATE_FILE, json.dumps(settings.__dict__, indent=2).encode())
    names = ["ca.key", BUNDLE_FILE, SECRET_FILE, PATCH_FILE, STATE_FILE]
    names += [PLACEMENT_KEY_FILE] if placement_key else []
    names += [KUSTOMIZATION_FILE] if overlay_rel is not None else []
    return {**paths, **{n: out / n for n in names}}


def rotate(
    directory: str | os.PathLike,
    now: datetime | None = None,
    force: bool = False,
    fraction: float = 2 / 3,
    ca_overlap: timedelta = DEFAULT_CA_OVERLAP,
) -> RotationResult:
    """Renew what is due at `now`; idempotent, so it is safe to run from a timer as often as wanted."""
    out = Path(directory)
    now = pki._utc(now)
    settings = _load_settings(out)
    ca = _read_pair(out, "ca.crt", "ca.key")
    serving = _read_pair(out, "tls.crt", "tls.key")
    if ca is None or serving is None:
        raise FileNotFoundError(
            f"{out} lacks ca.crt/ca.key or tls.crt/tls.key: run `gpuledger certs generate`"
        )
    next_ca = _read_pair(out, *NEXT_CA)
    previous_pem = (out / PREVIOUS_CA).read_bytes() if (out / PREVIOUS_CA).exists() else None
    ca_next_created = ca_promoted = serving_rotated = False
    notes: list[str] = []

    ca_expired = now >= pki.not_after(ca.cert_pem)
    if next_ca is None and (pki.needs_rotation(ca.cert_pem, now, fraction) or ca_expired):
        next_ca = pki.make_ca(common_name=f"gpuledger-ca-{now:%Y%m%d%H%M%S}", days=settings.ca_days, now=now)
        pki.atomic_write(out / NEXT_CA[1], next_ca.key_pem, mode=0o600)
        pki.atomic_write(out / NEXT_CA[0], next_ca.cert_pem)
        ca_next_created = True
        notes.append("next CA added to the bundle: apply the caBundle now; it signs after the overlap")
    if next_ca is not None:
        published_at = pki.not_before(next_ca.cert_pem) + pki.CLOCK_SKEW
        if now >= published_at + ca_overlap or ca_expired:
            if ca_expired and now < published_at + ca_overlap:
                notes = [
                    "the CA expired before a successor was published: apply the new caBundle now;"
                    " until then the API server cannot verify the webhook"
                ]
            previous_pem, ca = ca.cert_pem, next_ca
            pki.atomic_write(out / PREVIOUS_CA, previous_pem)
            pki.atomic_write(out / "ca.key", ca.key_pem, mode=0o600)
            pki.atomic_write(out / "ca.crt", ca.cert_pem)
            for name in NEXT_CA:
                (out / name).unlink(missing_ok=True)
            next_ca = None
            ca_promoted = True

    issued_by_ca = serving.cert.issuer == ca.cert.subject
    if force or ca_promoted or not issued_by_ca or pki.needs_rotation(serving.cert_pem, now, fraction):
        serving = pki.make_serving_cert(
            ca, pki.dns_sans(serving.cert_pem), pki.ip_sans(serving.cert_pem), days=settings.days, now=now
        )
        serving_rotated = True

    trusted = [ca.cert_pem] + ([next_ca.cert_pem] if next_ca else [])
    if previous_pem is not None and now < pki.not_after(previous_pem):
        trusted.append(previous_pem)
    elif previous_pem is not None:
        (out / PREVIOUS_CA).unlink(missing_ok=True)
    bundle = b"".join(trusted)
    bundle_file = out / BUNDLE_FILE
    if (
        ca_next_created
        or ca_promoted
        or serving_rotated
        or not bundle_file.exists()
        or bundle_file.read_bytes() != bundle
    ):
        pki.write_bundle(out, ca, serving)
        _write_manifests(out, settings, bundle, serving)
    return RotationResult(
        serving_not_after=pki.not_after(serving.cert_pem),
        ca_not_after=pki.not_after(ca.cert_pem),
        serving_rotated=serving_rotated,
        ca_next_created=ca_next_created,
        ca_promoted=ca_promoted,
        notes=notes,
    )
