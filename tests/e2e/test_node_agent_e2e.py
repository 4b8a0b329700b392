"""The node agent against the real API server: its patch reaches the Node, the ledger reads device health
from it, a critical XID's record lives on the Node, and the DaemonSet's identity can do no more than read and
patch nodes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from unittest.mock import ANY

import pytest
import yaml

from devcluster.nodes import create_nodes, make_node
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, Placement, Request, Taint, Toleration
from gpuledger.core.pods.objects import node_from_object
from gpuledger.names import XIDS_ANNOTATION as XIDS
from gpuledger.node_agent.agent import NodeAgent
from gpuledger.node_agent.pod_resources import PodResourcesClient
from gpuledger.node_agent.probes import FakeProbe

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
            "gpuledger",
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


def run_agent_once(apiserver, node: str, spec: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuledger", "node-agent", "--node", node, "--once", "--fake", spec,
         "--kubeconfig", apiserver.kubeconfig],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def health(apiserver, node: str) -> tuple[list[bool], dict]:
    annotations = apiserver.get_json("node", node)["metadata"]["annotations"]
    devices = json.loads(annotations["agentaflow.gpu/devices"])
    return [d["healthy"] for d in devices], annotations


def test_a_critical_xid_outlives_the_agent_on_the_node_until_an_operator_clears_it(apiserver, agent_node):
    """The driver reports an XID once: the agent keeps it on the Node, a new agent process publishes the same
    health, `kubectl annotate ...-` after the GPU's reset brings the GPU back, and another boot's record is
    void."""
    gpus = "4xNVIDIA-H100-80GB-HBM3:81559"
    run_agent_once(apiserver, agent_node, json.dumps({"gpus": gpus, "xids": [[2, 79], [1, 31]]}))
    healthy, annotations = health(apiserver, agent_node)
    assert healthy == [True, True, False, True]  # 31: the application's fault, not the GPU's
    record = json.loads(annotations[XIDS])
    assert list(record["devices"]) == ["GPU-fake-nvidia-h100-80gb-hbm3-0002"]
    assert record["bootId"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert annotations["agentaflow.gpu/status"] == "degraded"

    run_agent_once(apiserver, agent_node, gpus)  # restarted: NVML reports nothing now
    assert health(apiserver, agent_node) == (healthy, {**annotations, "agentaflow.gpu/last-update": ANY})

    info = node_from_object(apiserver.get_json("node", agent_node))
    ledger = Ledger(LedgerConfig())
    ledger.upsert_node(info)
    tolerate = (Toleration(ISOLATION.key, "Equal", ISOLATION.value, ISOLATION.effect),)
    placed = ledger.reserve(Request(id="three", gpus=3, tolerations=tolerate), now=0.0)
    assert isinstance(placed, Placement) and 2 not in placed.devices

    apiserver.kubectl("annotate", "node", agent_node, f"{XIDS}-")  # the GPU was reset
    run_agent_once(apiserver, agent_node, gpus)
    healthy, annotations = health(apiserver, agent_node)
    assert healthy == [True] * 4 and XIDS not in annotations

    other_boot = json.dumps({**record, "bootId": "00000000-0000-4000-8000-000000000000"})
    apiserver.kubectl("annotate", "node", agent_node, f"{XIDS}={other_boot}")  # recorded before a reboot
    run_agent_once(apiserver, agent_node, gpus)
    healthy, annotations = health(apiserver, agent_node)
    assert healthy == [True] * 4 and XIDS not in annotations


def test_a_clear_after_the_agents_read_is_kept_by_the_real_api_servers_409(apiserver, agent_node):
    """The agent's patch carries the resourceVersion of the Node as it last saw it: a `kubectl annotate ...-`
    landing after that makes the real API server answer 409, and the agent reads again instead of writing the
    old record back. It reads only then (and at start): no GET before each patch."""
    from kubernetes import client

    api = client.CoreV1Api(apiserver.api_client())
    gpus = "4xNVIDIA-H100-80GB-HBM3:81559"
    no_kubelet = PodResourcesClient(REPO / "no-kubelet.sock", 0.1)
    first = NodeAgent(agent_node, FakeProbe.from_spec(json.dumps({"gpus": gpus, "xids": [[0, 79]]})), api,
                      pod_resources=no_kubelet)  # fmt: skip
    first.publish_once()
    assert health(apiserver, agent_node)[0] == [False, True, True, True]

    class ClearedAfterTheRead:
        reads = 0

        def __getattr__(self, name):
            return getattr(api, name)

        def read_node(self, name):
            node = api.read_node(name)
            ClearedAfterTheRead.reads += 1
            if ClearedAfterTheRead.reads == 1:
                apiserver.kubectl("annotate", "node", name, f"{XIDS}-")  # the operator, after a GPU reset
            return node

    probe = FakeProbe.from_spec(gpus)
    restarted = NodeAgent(agent_node, probe, ClearedAfterTheRead(), pod_resources=no_kubelet)
    restarted.publish_once()
    assert ClearedAfterTheRead.reads == 2  # the first patch was refused (409), the second read saw the clear
    healthy, annotations = health(apiserver, agent_node)
    assert healthy == [True] * 4 and XIDS not in annotations

    probe.report_xid(1, 79)
    restarted.publish_once()
    assert ClearedAfterTheRead.reads == 2  # patched on the Node its last patch answered with
    assert health(apiserver, agent_node)[0] == [True, False, True, True]
    apiserver.kubectl("annotate", "node", agent_node, f"{XIDS}-")
    restarted.publish_once()
    assert ClearedAfterTheRead.reads == 3  # refused (409) on the older version, read again
    healthy, annotations = health(apiserver, agent_node)
    assert healthy == [True] * 4 and XIDS not in annotations


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
