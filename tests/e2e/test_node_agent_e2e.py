"""The node agent against the real API server: its patch reaches the Node, the ledger reads device health
from it, and the DaemonSet's identity can do no more than read and patch nodes."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from allocator.core.ledger import Ledger, LedgerConfig
from allocator.core.model import Denial, Placement, Request, Taint, Toleration
from allocator.core.objects import node_from_object
from devcluster.nodes import create_nodes, make_node

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
AGENT_SA = "system:serviceaccount:gpuledger-node-agent:gpuledger-node-agent"
ISOLATION = Taint("gpuledger.test/isolated", "node-agent", "NoSchedule")  # keeps other tests' pods off it


@pytest.fixture
def agent_node(apiserver):
    name = f"agent-node-{uuid.uuid4().hex[:6]}"
    node = make_node(name, "spine-agent", "leaf-agent", gpus=4)
    node["spec"] = {"taints": [{"key": ISOLATION.key, "value": ISOLATION.value, "effect": ISOLATION.effect}]}
    create_nodes(apiserver.api_client(), [node])
    yield name
    apiserver.kubectl("delete", "node", name, "--ignore-not-found", check=False)


def test_agent_patch_marks_an_unhealthy_device_the_ledger_then_avoids(apiserver, agent_node):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "node-agent",
            "--node",
            agent_node,
            "--once",
            "--fake",
            "4xNVIDIA-H100-80GB-HBM3:81559,unhealthy=2",
            "--kubeconfig",
            apiserver.kubeconfig,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    node = apiserver.get_json("node", agent_node)
    assert node["metadata"]["labels"]["agentaflow.gpu/count"] == "4"
    assert node["metadata"]["annotations"]["agentaflow.gpu/status"] == "degraded"

    info = node_from_object(node)
    assert [d.healthy for d in info.devices] == [True, True, False, True]
    ledger = Ledger(LedgerConfig())
    ledger.upsert_node(info)
    tolerate = (Toleration(ISOLATION.key, "Equal", ISOLATION.value, ISOLATION.effect),)
    assert isinstance(ledger.reserve(Request(id="four", gpus=4, tolerations=tolerate), now=0.0), Denial)
    placed = ledger.reserve(Request(id="three", gpus=3, tolerations=tolerate), now=0.0)
    assert isinstance(placed, Placement) and placed.node == agent_node and 2 not in placed.devices


def test_node_agent_identity_can_only_read_and_patch_nodes(apiserver):
    out = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "kustomize" / "components" / "node-agent")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if out.returncode != 0:  # a Component renders only inside an overlay: take its objects from prod
        out = subprocess.run(
            ["kubectl", "kustomize", str(REPO / "kustomize" / "overlays" / "prod")],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    rbac = [
        d
        for d in docs
        if "node-agent" in d["metadata"]["name"]
        and d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    assert len(rbac) == 3
    agent_namespace = "gpuledger-node-agent"  # its own (Pod Security privileged: hostPID, PodResources)
    if apiserver.kubectl("get", "namespace", agent_namespace, check=False).returncode != 0:
        apiserver.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": agent_namespace}})
    apiserver.apply(rbac)

    def can(verb: str, resource: str, *extra: str) -> bool:
        answer = apiserver.kubectl("auth", "can-i", verb, resource, "--as", AGENT_SA, *extra, check=False)
        assert answer.stdout.strip() in ("yes", "no"), answer.stderr
        return answer.stdout.strip() == "yes"

    assert can("patch", "nodes") and can("get", "nodes")
    for verb, resource in [
        ("delete", "nodes"),
        ("create", "nodes"),
        ("update", "nodes/status"),
        ("get", "pods"),
        ("list", "secrets"),
        ("create", "pods"),
    ]:
        assert not can(verb, resource, "-A"), f"node agent may {verb} {resource}"
