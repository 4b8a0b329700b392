"""Admission registrations for a webhook running as a local process: `url` client config, our own caBundle.

The manifests' registrations (manifests/webhooks.yaml) reach a Service; here the API server calls
https://127.0.0.1:PORT directly. Everything else (rules, opt-in selector, exclusions, sideEffects) is the
same, and a test checks that it stays the same.
"""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from gpuledger.names import (
    ADMISSION_ENABLED,
    ADMISSION_LABEL,
    MUTATING_CONFIG,
    MUTATING_WEBHOOK,
    SYSTEM_NAMESPACE,
    VALIDATING_CONFIG,
    VALIDATING_WEBHOOK,
)

EXCLUDED_NAMESPACES = ("kube-system", SYSTEM_NAMESPACE)
MANIFEST = Path(__file__).resolve().parents[1] / "manifests" / "webhooks.yaml"


def _selector() -> dict:
    return {
        "matchLabels": {ADMISSION_LABEL: ADMISSION_ENABLED},
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(EXCLUDED_NAMESPACES)}
        ],
    }


def webhook_configurations(
    base_url: str, ca_pem: bytes, failure_policy: str = "Fail", timeout_s: int = 5
) -> list[dict]:
    """Mutating (CREATE pods) and validating (CREATE, UPDATE pods) registrations pointing at `base_url`."""
    ca_bundle = base64.b64encode(ca_pem).decode()

    def hook(name: str, path: str, operations: list[str], resources=("pods",), **extra) -> dict:
        return {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"{base_url}{path}", "caBundle": ca_bundle},
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": operations,
                    "resources": list(resources),
                    "scope": "Namespaced",
                }
            ],
            "failurePolicy": failure_policy,
            "matchPolicy": "Equivalent",
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": timeout_s,
            "namespaceSelector": _selector(),
            **extra,
        }

    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": MUTATING_CONFIG},
            "webhooks": [hook(MUTATING_WEBHOOK, "/mutate", ["CREATE"], reinvocationPolicy="IfNeeded")],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": VALIDATING_CONFIG},
            "webhooks": [
                hook(
                    VALIDATING_WEBHOOK,
                    "/validate",
                    ["CREATE", "UPDATE"],
                    resources=("pods", "pods/ephemeralcontainers"),  # `kubectl debug`: env_guard checks it
                )
            ],
        },
    ]


def manifest_configurations() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def register(cp, base_url: str, ca_pem: bytes, failure_policy: str = "Fail", timeout_s: int = 5) -> None:
    cp.apply(webhook_configurations(base_url, ca_pem, failure_policy, timeout_s))


def unregister(cp) -> None:
    cp.kubectl("delete", "mutatingwebhookconfiguration", MUTATING_CONFIG, "--ignore-not-found", check=False)
    cp.kubectl(
        "delete", "validatingwebhookconfiguration", VALIDATING_CONFIG, "--ignore-not-found", check=False
    )
