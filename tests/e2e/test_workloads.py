"""Workloads through `kubectl apply` as the user alice: the webhook places them, the ledger remembers them.

No scheduler or kubelet runs, so pods stay Pending carrying what admission wrote (placement annotation,
reservation label, node affinity, tolerations, device environment); that is what these tests read.
kube-controller-manager runs the Job, StatefulSet, Deployment and ReplicaSet controllers, so workload pods are
created exactly as in a cluster (generateName, ownerReferences, pod-index labels).
"""

from __future__ import annotations

import json

import pytest

from devcluster.nodes import GPU_TAINT, LEAF_LABEL, SPINE_LABEL
from tests.e2e import test_waiting_pods
from tests.e2e.conftest import SAMPLE_NODES, gpu_pod_yaml, wait_nodes_free

pytestmark = pytest.mark.e2e

# A control plane, sample cluster and stack of this module's own: its gang and freeing tests count on a
# cluster whose leaves no earlier module's pods still hold
apiserver = test_waiting_pods.apiserver
gpu_nodes = test_waiting_pods.gpu_nodes
stack = test_waiting_pods.stack

LEAF_OF = {n["metadata"]["name"]: n["metadata"]["labels"][LEAF_LABEL] for n in SAMPLE_NODES}
SPINE_OF = {n["metadata"]["name"]: n["metadata"]["labels"][SPINE_LABEL] for n in SAMPLE_NODES}


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


def affinity_nodes(pod: dict) -> list[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [v for t in terms["nodeSelectorTerms"] for e in t.get("matchExpressions", []) for v in e["values"]]


def test_single_pod_is_placed_with_affinity_devices_and_a_confirmed_reservation(workloads):
    workloads.apply(gpu_pod_yaml("train", gpus=2))
    pod = workloads.pod("train")
    placement = workloads.placement(pod)
    assert placement is not None and len(placement.devices) == 2
    assert affinity_nodes(pod) == [placement.node]
    assert pod["metadata"]["labels"]["gpuledger.io/reservation-id"] == placement.id
    # runtime-uuids visibility (the default): the container sees exactly its devices by UUID
    assert env_of(pod)["NVIDIA_VISIBLE_DEVICES"] == ",".join(placement.uuids)
    workloads.wait_confirmed([pod])


def test_statefulset_gpu_scheduling_map_pins_each_pod(workloads):
    # the seed's StatefulSet, with Parallel pod management: no kubelet makes pod 0 Ready, which OrderedReady
    # would wait for before creating pod 1
    workloads.apply(
        """
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: trainer
  annotations:
    gpu-scheduling-map: |
      0=leaf-0-node-1:0,1
      1=leaf-1-node-2:2
spec:
  serviceName: trainer
  replicas: 2
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: trainer}}
  template:
    metadata: {labels: {app: trainer}}
    spec:
      containers:
        - name: cuda
          image: nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04
"""
    )
    pods = {p["metadata"]["name"]: p for p in workloads.wait_pods(2, "app=trainer")}
    first, second = workloads.placement(pods["trainer-0"]), workloads.placement(pods["trainer-1"])
    assert (first.node, first.devices) == ("leaf-0-node-1", (0, 1))
    assert (second.node, second.devices) == ("leaf-1-node-2", (2,))
    assert pods["trainer-0"]["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "0"


def test_job_gang_of_four_lands_in_one_leaf(workloads):
    workloads.apply(
        """
apiVersion: batch/v1
kind: Job
metadata:
  name: allreduce
  annotations:
    topology.scheduler/gpu-count: "16"
spec:
  parallelism: 4
  completions: 4
  completionMode: Indexed
  template:
    metadata: {labels: {app: allreduce}}
    spec:
      restartPolicy: Never
      containers:
        - name: worker
          image: nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04
"""
    )
    pods = workloads.wait_pods(4, "app=allreduce")
    placements = [workloads.placement(p) for p in pods]
    assert all(p is not None for p in placements), [p["metadata"]["name"] for p in pods]
    assert all(len(p.devices) == 4 for p in placements)  # 16 over 4 pods
    assert len({LEAF_OF[p.node] for p in placements}) == 1, [(p.node, p.devices) for p in placements]
    assert len({p.group for p in placements}) == 1 and sorted(p.slot for p in placements) == [0, 1, 2, 3]
    held = [(p.node, d) for p in placements for d in p.devices]
    assert len(held) == len(set(held)) == 16


@pytest.mark.parametrize(
    "strategy,ledger_name",
    [
        ("least_utilized", "least_utilized"),
        ("best_fit", "best_fit"),
        ("priority", "priority"),
        ("round_robin", "round_robin"),
        ("random", "random"),
        ("cost-optimized", "cost_optimized"),
        ("least-loaded", "least_utilized"),
        ("best-fit", "best_fit"),
    ],
)
def test_each_scheduling_strategy_places_a_pod(workloads, strategy, ledger_name):
    workloads.apply(gpu_pod_yaml("p", annotations={"agentaflow.gpu/scheduling-strategy": strategy}))
    placement = workloads.placement("p")
    assert placement is not None and len(placement.devices) == 1
    assert placement.strategy == ledger_name


def test_tainted_gpu_node_gets_the_toleration(workloads):
    workloads.apply(
        gpu_pod_yaml("tainted", gpus=1, spec={"nodeSelector": {"kubernetes.io/hostname": "leaf-1-node-3"}})
    )
    pod = workloads.pod("tainted")
    assert workloads.placement(pod).node == "leaf-1-node-3"
    tolerations = pod["spec"]["tolerations"]
    assert any(
        t.get("key") == GPU_TAINT["key"]
        and t.get("effect") == "NoSchedule"
        and t.get("value", "") in ("true", "")
        for t in tolerations
    ), tolerations


def test_deployment_pods_with_generated_names_are_placed(workloads):
    workloads.apply(
        """
apiVersion: apps/v1
kind: Deployment
metadata: {name: inference}
spec:
  replicas: 3
  selector: {matchLabels: {app: inference}}
  template:
    metadata: {labels: {app: inference}}
    spec:
      containers:
        - name: server
          image: nvcr.io/nvidia/tritonserver:24.05-py3
          resources: {limits: {nvidia.com/gpu: "1"}}
"""
    )
    pods = workloads.wait_pods(3, "app=inference")
    placements = [workloads.placement(p) for p in pods]
    assert all(p is not None for p in placements)
    assert len({p.id for p in placements}) == 3
    assert all(p["metadata"]["generateName"].startswith("inference-") for p in pods)
    workloads.wait_confirmed(pods)


def test_server_dry_run_reserves_nothing(workloads, stack):
    proc = workloads.cp.kubectl(
        "create",
        "-n",
        workloads.namespace,
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        input=gpu_pod_yaml("dry", gpus=1),
        as_user="alice",
    )
    answered = json.loads(proc.stdout)
    placement = stack.placement(answered)
    assert placement is not None  # the webhook computed a placement for the dry run...
    assert stack.call("lookup", [placement.id]) == [None]  # ...and reserved nothing
    assert workloads.pods() == []


def test_unlabelled_namespace_and_kube_system_are_not_touched(apiserver, stack, gpu_nodes):
    apiserver.create_namespace("no-admission", admission=False)
    for namespace in ("no-admission", "kube-system"):
        apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=gpu_pod_yaml("plain", gpus=1))
        pod = apiserver.get_json("pod", "plain", "-n", namespace)
        assert "gpuledger.io/placement" not in (pod["metadata"].get("annotations") or {})
        assert "affinity" not in pod["spec"]
        apiserver.force_delete("pod", "plain", namespace=namespace)


def test_pods_that_bypass_the_webhook_are_counted_and_deleting_frees_devices(apiserver, stack, workloads):
    node = "leaf-2-node-1"
    wait_nodes_free(apiserver, stack, [node])
    # another scheduler's pod, bound directly to the node in a namespace without admission
    apiserver.create_namespace("bypass", admission=False)
    apiserver.kubectl(
        "apply",
        "-n",
        "bypass",
        "-f",
        "-",
        input=gpu_pod_yaml("other-scheduler", gpus=6, spec={"nodeName": node}),
    )
    pinned = {"nodeSelector": {"kubernetes.io/hostname": node}}
    apiserver.wait_for(
        lambda: stack.call("snapshot")["nodes"][node]["unknown_gpus"] == 6, what="the bypassing pod counted"
    )
    denied = workloads.apply(gpu_pod_yaml("big", gpus=4, spec=pinned), check=False)
    assert denied.returncode != 0 and "no placement" in denied.stderr, denied.stderr
    workloads.apply(gpu_pod_yaml("fits", gpus=2, spec=pinned))
    assert workloads.placement("fits").node == node

    apiserver.force_delete("pod", "other-scheduler", namespace="bypass")
    apiserver.wait_for(
        lambda: workloads.apply(gpu_pod_yaml("big", gpus=4, spec=pinned), check=False).returncode == 0,
        timeout=30,
        interval=0.5,
        what="devices freed after the bypassing pod was deleted",
    )
    workloads.cp.kubectl("delete", "pod", "fits", "-n", workloads.namespace, as_user="alice")
    apiserver.wait_for(
        lambda: workloads.apply(gpu_pod_yaml("after", gpus=4, spec=pinned), check=False).returncode == 0,
        timeout=30,
        interval=0.5,
        what="devices freed after alice deleted her pod",
    )
    big, after = workloads.placement("big"), workloads.placement("after")
    assert not set(big.devices) & set(after.devices)
    devices = stack.call("snapshot")["nodes"][node]
    assert devices["unknown_gpus"] == 0 and all(d[3] is not None for d in devices["devices"])
