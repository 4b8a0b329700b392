"""Every API version the install and the product use is served by the Kubernetes it runs on: the objects of
the base, each overlay and the chart (default and every optional part on), and the APIs the product's code
calls, checked against the running API server's discovery. `make test-versions` runs it against each
supported release, so a removal in a new release fails here first.

Kinds that a third party's CRDs provide (the Prometheus operator's ServiceMonitor, KubeRay's RayCluster,
cert-manager's Issuer and Certificate) are not Kubernetes' to serve; they are listed, not checked."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from devcluster.binaries import REPO
from tests.deploy.test_helm import helm_binary

pytestmark = pytest.mark.e2e

THIRD_PARTY_GROUPS = ("monitoring.coreos.com", "ray.io", "cert-manager.io")
# what the product's code calls (the kubernetes client's APIs, raw paths, kopf's watches), by group/version
CODE_USES = {
    ("v1", "Pod"),
    ("v1", "Node"),
    ("v1", "Namespace"),
    ("v1", "Event"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("batch/v1", "Job"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "StatefulSet"),
    ("policy/v1", "PodDisruptionBudget"),
    ("coordination.k8s.io/v1", "Lease"),
    ("events.k8s.io/v1", "Event"),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("scheduling.k8s.io/v1", "PriorityClass"),
    ("agentaflow.io/v1", "GPUWorkload"),
    ("agentaflow.io/v1", "GPUNode"),
    ("gpu.warp.dev/v1alpha1", "GPUWorkload"),
    ("gpuledger.io/v1alpha1", "GPUQueue"),
}


def served(apiserver) -> set[tuple[str, str]]:
    """(apiVersion, kind) of every resource the API server's discovery lists."""
    out = apiserver.kubectl("api-resources", "--no-headers", "-o", "wide").stdout
    pairs = set()
    for line in out.splitlines():
        cols = line.split()
        # NAME [SHORTNAMES] APIVERSION NAMESPACED KIND VERBS [CATEGORIES]
        at = next(i for i, c in enumerate(cols) if c in ("true", "false"))
        pairs.add((cols[at - 1], cols[at + 1]))
    return pairs


def kinds_in(text: str) -> set[tuple[str, str]]:
    return {
        (d["apiVersion"], d["kind"])
        for d in yaml.safe_load_all(text)
        if isinstance(d, dict) and d.get("kind")
    }


def rendered() -> dict[str, set[tuple[str, str]]]:
    """Each way of installing, rendered as it would be applied."""
    sources = {}
    for path in (
        "manifests",
        "kustomize/overlays/dev",
        "kustomize/overlays/prod",
        "kustomize/overlays/cert-manager",
    ):
        proc = subprocess.run(
            ["kubectl", "kustomize", str(REPO / path)], capture_output=True, text=True, check=True
        )
        sources[path] = kinds_in(proc.stdout)
    helm = helm_binary()
    assert helm, "helm not built: run `make helm`"
    chart = str(REPO / "charts" / "gpuledger")
    for name, values in (
        ("chart (defaults)", []),
        ("chart (tls.mode=cert-manager)", ["--set", "tls.mode=cert-manager"]),
        ("chart (tls.mode=generate)", ["--set", "tls.mode=generate"]),
    ):
        proc = subprocess.run(
            [helm, "template", "gpuledger", chart, *values], capture_output=True, text=True, check=True
        )
        sources[name] = kinds_in(proc.stdout)
    return sources


def test_every_api_version_the_install_and_the_code_use_is_served(apiserver):
    have = served(apiserver)
    version = apiserver.kubectl("version", "-o", "json").stdout
    missing = {}
    third_party = set()
    for source, pairs in {**rendered(), "the product's code": CODE_USES}.items():
        for api_version, kind in sorted(pairs):
            if api_version.split("/")[0] in THIRD_PARTY_GROUPS:
                third_party.add((api_version, kind))
            elif (api_version, kind) not in have:
                missing.setdefault(source, []).append(f"{api_version} {kind}")
    assert not missing, f"not served by this API server ({version}): {missing}"
    print(f"\nprovided by third-party CRDs, not checked: {sorted(third_party)}")
