"""The topology scheduler's documented multi-node training Job (`network-bandwidth: "200Gb"`) on a cluster
where no node states its bandwidth: admitted, placed as its tool intended, and kubectl prints the ledger's
warning naming the label.

A control plane of this module's own: the sample cluster (devcluster.nodes) labels every node's bandwidth,
and the shared one's tests pin it, so this one holds the same sixteen nodes without
`topology.scheduler/network-bandwidth-gbps` (and no node agent publishes its own reading). The product runs
against it as in the rest of tests/e2e (`Stack`: Ray ledger, ledger channel, cluster sync, TLS webhook).
"""

from __future__ import annotations

import uuid

import pytest

from devcluster.cluster import ALICE, ControlPlane
from devcluster.nodes import create_nodes, make_sample_cluster
from devcluster.stack import Stack, e2e_webhook_config
from gpuledger.names import AGENT_NETWORK_BANDWIDTH_LABEL, NETWORK_BANDWIDTH_LABEL
from tests.conftest import require_binaries

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

CUDA_IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
WARNING = (
    "Warning: topology.scheduler/network-bandwidth 200Gb not checked: no node has the label "
    f"{NETWORK_BANDWIDTH_LABEL} (or the node agent's {AGENT_NETWORK_BANDWIDTH_LABEL}); label the nodes to "
    "enforce it"
)
ANNOTATIONS = """\
    topology.scheduler/gpu-count: "16"
    topology.scheduler/preferred-domain: "spine-1"
    topology.scheduler/network-bandwidth: "200Gb"
    topology.scheduler/placement-strategy: "consolidated"
"""


def unlabelled_nodes() -> list[dict]:
    nodes = make_sample_cluster()
    for node in nodes:
        del node["metadata"]["labels"][NETWORK_BANDWIDTH_LABEL]
    return nodes


NODES = unlabelled_nodes()
LEAF = {n["metadata"]["name"]: n["metadata"]["labels"]["topology.scheduler/leaf"] for n in NODES}
SPINE = {n["metadata"]["name"]: n["metadata"]["labels"]["topology.scheduler/spine"] for n in NODES}


@pytest.fixture(scope="module")
def unlabelled():
    require_binaries()
    with ControlPlane() as cp:
        create_nodes(cp.api_client(), NODES)
        with Stack(cp, config=e2e_webhook_config(when_full="refuse")) as stack:
            yield cp, stack


def test_the_multi_node_job_is_admitted_and_kubectl_prints_the_warning(unlabelled):
    cp, stack = unlabelled
    ns = cp.create_namespace(f"bw-{uuid.uuid4().hex[:6]}")
    cp.kubectl(
        "apply",
        "-n",
        ns,
        "-f",
        "-",
        as_user=ALICE,
        input=f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: multi-node-training
  annotations:
{ANNOTATIONS}spec:
  parallelism: 4
  completions: 4
  template:
    metadata: {{labels: {{app: multi-node-training}}}}
    spec:
      restartPolicy: Never
      containers:
      - name: trainer
        image: {CUDA_IMAGE}
""",
    )
    pods = cp.wait_for(
        lambda: (lambda found: found if len(found) >= 4 else None)(cp.pods(ns, "app=multi-node-training")),
        timeout=90,
        what="the Job's 4 pods",
    )
    placements = [stack.placement(p) for p in pods]
    assert all(p is not None for p in placements)
    assert [len(p.devices) for p in placements] == [4, 4, 4, 4]
    assert len({p.group for p in placements}) == 1 and sorted(p.slot for p in placements) == [0, 1, 2, 3]
    nodes = {p.node for p in placements}
    assert {SPINE[n] for n in nodes} == {"spine-1"} and len({LEAF[n] for n in nodes}) == 1 and len(nodes) == 2
    # the Job controller creates the pods, so its warnings go to the controller: a user creating such a pod
    # with kubectl sees the same warning printed
    proc = cp.kubectl(
        "create",
        "-n",
        ns,
        "-f",
        "-",
        as_user=ALICE,
        input=f"""
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  annotations:
{ANNOTATIONS.replace('"16"', '"4"')}spec:
  containers:
  - name: trainer
    image: {CUDA_IMAGE}
""",
    )
    assert WARNING in proc.stderr, proc.stderr
    placed = stack.placement(cp.get_json("pod", "trainer", "-n", ns))
    assert placed is not None and len(placed.devices) == 4 and SPINE[placed.node] == "spine-1"
