"""Who a real node is to the API server: a client certificate for system:node:<name> signed by the cluster
CA, the RBAC kubeadm would bind for nodes and the apiserver's kubelet client, and the kubelet's kubeconfig.

It only issues credentials and writes files into the folder it is given; it never starts the kubelet.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devcluster.cluster import ControlPlane
from devcluster.users import KUBELET_CLIENT_USER


def node_credentials(cp: ControlPlane, node: str) -> tuple[bytes, bytes]:
    """A client certificate for user system:node:<node> in group system:nodes, signed by the cluster CA."""
    if cp.ca is None:
        raise RuntimeError("the control plane is not started: it has no CA yet")
    ca_cert, ca_key = cp.ca.cert, cp.ca.key
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(ca_cert.not_valid_after_utc)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def node_rbac() -> list[dict]:
    """What kubeadm binds: nodes get system:node (RBAC stands in for the Node authorizer), and the apiserver's
    kubelet client may read logs and exec (the kubelet authorizes it through SubjectAccessReview)."""

    def binding(name: str, role: str, kind: str, subject: str) -> dict:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
        }

    return [
        binding("gpuledger-e2e-nodes", "system:node", "Group", "system:nodes"),
        binding("gpuledger-e2e-kubelet-api", "system:kubelet-api-admin", "User", KUBELET_CLIENT_USER),
    ]


def write_node_kubeconfig(cp: ControlPlane, name: str, folder: Path) -> None:
    """The node's certificate and key under `folder`/pki, and `folder`/kubeconfig naming them."""
    (folder / "pki").mkdir(parents=True, exist_ok=True)
    cert, key = node_credentials(cp, name)
    (folder / "pki" / "node.crt").write_bytes(cert)
    (folder / "pki" / "node.key").write_bytes(key)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": cp.url, "certificate-authority": cp.ca_file}}],
        "users": [
            {
                "name": name,
                "user": {
                    "client-certificate": str(folder / "pki" / "node.crt"),
                    "client-key": str(folder / "pki" / "node.key"),
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": "e2e", "user": name}}],
        "current-context": name,
    }
    (folder / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
