"""Who may use the test cluster: its static-token users, the webhook's ServiceAccount identity as
manifests/rbac.yaml binds it, their RBAC objects, and the keys that sign service-account tokens.

It defines identities and what they may do; it never starts the API server or talks to it.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from devcluster import kubeflow
from devcluster.binaries import REPO

ADMIN = "admin"
ALICE = "alice"
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"  # how kube-apiserver authenticates to a real kubelet
RBAC_MANIFEST = REPO / "manifests" / "rbac.yaml"


def _webhook_service_account() -> tuple[str, str]:
    """The webhook's ServiceAccount as the project's own RBAC manifest binds it (so the tests use that
    RBAC)."""
    for doc in yaml.safe_load_all(RBAC_MANIFEST.read_text()):
        if doc and doc.get("kind") == "ClusterRoleBinding":
            for subject in doc.get("subjects") or []:
                if subject.get("kind") == "ServiceAccount":
                    return subject["namespace"], subject["name"]
    raise ValueError(f"{RBAC_MANIFEST}: no ClusterRoleBinding to a ServiceAccount")


WEBHOOK_NAMESPACE, WEBHOOK_SERVICE_ACCOUNT = _webhook_service_account()
WEBHOOK_USER = f"system:serviceaccount:{WEBHOOK_NAMESPACE}:{WEBHOOK_SERVICE_ACCOUNT}"

# user -> groups; tokens are generated per control plane
USERS: dict[str, tuple[str, ...]] = {
    ADMIN: ("system:masters",),
    WEBHOOK_USER: ("system:serviceaccounts", f"system:serviceaccounts:{WEBHOOK_NAMESPACE}"),
    ALICE: (),
}


def write_sa_keys(directory: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = directory / "sa.key", directory / "sa.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def rbac_objects() -> list[dict]:
    """The webhook's namespace and the project's RBAC (manifests/rbac.yaml), a limited role for alice, and the
    `nvidia` RuntimeClass a GPU cluster has.

    The API server has no ServiceAccount token controller here: the webhook authenticates with a static token
    whose user name is the ServiceAccount's, which RBAC subjects of kind ServiceAccount match.
    """
    # the project's rules under names of our own, so tests that install and remove the manifest's RBAC
    # (tests/test_manifests_e2e.py) leave the harness's webhook identity alone
    project = []
    for doc in yaml.safe_load_all(RBAC_MANIFEST.read_text()):
        if doc and doc.get("kind") in ("ClusterRole", "ClusterRoleBinding"):
            doc = dict(doc, metadata={"name": "gpuledger-e2e-harness"})
            if doc["kind"] == "ClusterRoleBinding":
                doc["roleRef"] = dict(doc["roleRef"], name="gpuledger-e2e-harness")
            project.append(doc)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WEBHOOK_NAMESPACE}}
    user_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "gpuledger-e2e-user"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": ["get", "list", "watch", "create", "delete", "update", "patch"],
            },
            {
                "apiGroups": ["apps", "batch"],
                "resources": ["statefulsets", "deployments", "jobs"],
                "verbs": ["get", "list", "watch", "create", "delete", "update", "patch"],
            },
            {
                "apiGroups": [kubeflow.GROUP],
                "resources": list(kubeflow.KINDS.values()),
                "verbs": ["get", "list", "watch", "create", "delete", "update", "patch"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
        ],
    }
    # GPU nodes run containers through the NVIDIA runtime; the GPU operator registers this RuntimeClass
    runtime_class = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "nvidia"},
        "handler": "nvidia",
    }
    return [namespace, *project, user_role, runtime_class]
