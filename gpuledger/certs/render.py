"""Kubernetes objects that carry the certificates: the TLS Secret and the caBundle patches.

The webhook names here must match the base manifests; tests/test_certs_cli.py renders the base and checks.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml

from gpuledger.names import MUTATING_CONFIG, MUTATING_WEBHOOK, VALIDATING_CONFIG, VALIDATING_WEBHOOK

TLS_SECRET = "gpuledger-tls"
PLACEMENT_KEY_SECRET = "gpuledger-placement-key"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def tls_secret(name: str, namespace: str, ca_bundle: bytes, cert_pem: bytes, key_pem: bytes) -> dict:
    """A kubernetes.io/tls Secret in the layout cert-manager also writes (tls.crt, tls.key, ca.crt)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": "gpuledger"}},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": _b64(cert_pem), "tls.key": _b64(key_pem), "ca.crt": _b64(ca_bundle)},
    }


def placement_key_secret(namespace: str, key: bytes) -> dict:
    """The HMAC key that signs placement annotations; shared by every replica, never rotated by `certs`."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": PLACEMENT_KEY_SECRET,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "gpuledger"},
        },
        "type": "Opaque",
        "data": {"key": _b64(key)},
    }


def cabundle_patches(ca_bundle: bytes) -> list[dict]:
    """Strategic-merge patches (webhooks merge by name) that fill caBundle in both configurations."""
    bundle = _b64(ca_bundle)
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": config},
            "webhooks": [{"name": webhook, "clientConfig": {"caBundle": bundle}}],
        }
        for kind, config, webhook in (
            ("MutatingWebhookConfiguration", MUTATING_CONFIG, MUTATING_WEBHOOK),
            ("ValidatingWebhookConfiguration", VALIDATING_CONFIG, VALIDATING_WEBHOOK),
        )
    ]


def kustomization(out_dir: Path, overlay: Path | None, resources: list[str], patch_file: str) -> dict:
    """A kustomization in the certificate directory: the chosen overlay plus this directory's Secrets and
    caBundle patch, so `kubectl apply -k DIR` installs everything with TLS wired."""
    base = [os.path.relpath(overlay, out_dir)] if overlay is not None else []
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": base + resources,
        "patches": [{"path": patch_file}],
    }


def dump_all(docs: list[dict]) -> bytes:
    return yaml.safe_dump_all(docs, sort_keys=False).encode()
