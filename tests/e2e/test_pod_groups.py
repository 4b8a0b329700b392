"""Kubernetes' own gangs through the real path: a PodGroup with a gang policy (scheduling.k8s.io/v1beta1,
GenericWorkload) and a Job whose pods name it in `spec.schedulingGroup`, applied with kubectl. The webhook
places the group whole, with the PodGroup's minCount and its topology annotation, and the real kube-scheduler,
whose gang plugin waits for minCount pods, binds each pod to the node the ledger chose: neither gate waits on
the other. The harness serves the Workload API on 1.37 and later (devcluster.binaries.workload_api_args)."""

from __future__ import annotations

import pytest
import yaml

from devcluster.binaries import K8S_VERSION, version_of
from devcluster.scheduler import KubeScheduler

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
PODS, GPUS = 4, 8


def pod_group(name: str, min_count: int, annotations: dict) -> dict:
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }


def group_job(name: str, group: str, pods: int, gpus: int) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"labels": {"job": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "schedulingGroup": {"podGroupName": group},
                    "containers": [
                        {
                            "name": "main",
                            "image": IMAGE,
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


@pytest.mark.skipif(
    version_of(K8S_VERSION) < (1, 37),
    reason=f"scheduling.k8s.io/v1beta1 PodGroups exist from 1.37 ({K8S_VERSION})",
)
def test_a_jobs_pod_group_is_placed_whole_on_one_leaf_and_bound_by_kube_scheduler(
    apiserver, stack, workloads, namespace
):
    # the PodGroup by the admin: the users' edit role holds no scheduling.k8s.io objects
    apiserver.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(
            pod_group("train-pg", PODS, {"topology.scheduler/placement-strategy": "consolidated"})
        ),
    )
    with KubeScheduler(apiserver):
        workloads.apply(yaml.safe_dump(group_job("train", "train-pg", PODS, GPUS)))
        pods = workloads.wait_pods(PODS, "job=train")
        placements = [workloads.placement(p) for p in pods]
        assert all(p is not None for p in placements), [p["metadata"]["name"] for p in pods]
        assert {p.group for p in placements} == {f"podgroup/{namespace}/train-pg"}
        nodes = {p.node for p in placements}
        assert len(nodes) == PODS  # 8 GPUs each: one node per pod
        leaves = {
            apiserver.get_json("node", n)["metadata"]["labels"]["topology.scheduler/leaf"] for n in nodes
        }
        assert len(leaves) == 1, leaves  # 4 nodes -> a whole leaf

        def bound():
            now = workloads.pods("job=train")
            return now if all(p["spec"].get("nodeName") for p in now) and len(now) == PODS else None

        bound_pods = apiserver.wait_for(bound, timeout=90, what="kube-scheduler binding the PodGroup's pods")
        by_name = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in bound_pods}
        chosen = {p["metadata"]["name"]: workloads.placement(p).node for p in bound_pods}
        assert by_name == chosen  # kube-scheduler bound each pod where the ledger placed it


@pytest.mark.skipif(
    version_of(K8S_VERSION) < (1, 37),
    reason=f"scheduling.k8s.io/v1beta1 PodGroups exist from 1.37 ({K8S_VERSION})",
)
def test_a_jobs_pods_beyond_min_count_are_placed_near_the_gang_and_bound(
    apiserver, stack, workloads, namespace
):
    """A Job of 3 whose PodGroup's minCount is 2: the gang of 2 is placed whole, the third pod takes a slot
    near it, and kube-scheduler binds all three where the ledger placed them (none waits for a slot)."""
    group = pod_group("extra-pg", 2, {"topology.scheduler/placement-strategy": "consolidated"})
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(group))
    with KubeScheduler(apiserver):
        workloads.apply(yaml.safe_dump(group_job("extra", "extra-pg", 3, 4)))
        pods = workloads.wait_pods(3, "job=extra")
        placements = [workloads.placement(p) for p in pods]
        assert all(p is not None for p in placements), [p["metadata"]["name"] for p in pods]
        assert {p.group for p in placements} == {f"podgroup/{namespace}/extra-pg"}
        assert sorted(p.slot for p in placements) == [0, 1, 2]
        held = [(p.node, d) for p in placements for d in p.devices]
        assert len(held) == len(set(held)) == 12

        def bound():
            now = workloads.pods("job=extra")
            return now if len(now) == 3 and all(p["spec"].get("nodeName") for p in now) else None

        bound_pods = apiserver.wait_for(bound, timeout=90, what="kube-scheduler binding all three pods")
        assert {p["metadata"]["name"]: p["spec"]["nodeName"] for p in bound_pods} == {
            p["metadata"]["name"]: workloads.placement(p).node for p in bound_pods
        }
