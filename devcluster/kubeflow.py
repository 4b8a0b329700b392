"""The Kubeflow training CRDs (PyTorchJob, MPIJob, TFJob in kubeflow.org/v1) for the test control plane.

The schema is left open (`x-kubernetes-preserve-unknown-fields`): only the objects' existence and metadata
matter here. No training operator runs, so a test creates the job and then its pods, as the operator would
(an ownerReference with controller: true and the job's uid).
"""

from __future__ import annotations

GROUP, VERSION = "kubeflow.org", "v1"
KINDS: dict[str, str] = {"PyTorchJob": "pytorchjobs", "MPIJob": "mpijobs", "TFJob": "tfjobs"}


def crd(kind: str, plural: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def crds() -> list[dict]:
    return [crd(kind, plural) for kind, plural in KINDS.items()]


def install(cp, timeout_s: int = 60) -> None:
    """Create the CRDs and wait until the API server serves them."""
    cp.apply(crds())
    cp.kubectl(
        "wait",
        "--for=condition=Established",
        f"--timeout={timeout_s}s",
        *(f"crd/{plural}.{GROUP}" for plural in KINDS.values()),
    )
