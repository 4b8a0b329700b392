"""Kubernetes' own gangs at admission: a pod naming a gang PodGroup (spec.schedulingGroup.podGroupName)
is placed with its group, minCount pods all-or-nothing, with the GPU annotations of the PodGroup, its
Workload and the pod's Job; a basic PodGroup changes nothing; a missing one is a denial naming the field."""

from __future__ import annotations

from gpuledger.webhook.admission import chain
from tests.webhook.test_owner_chain import NS, lookup, owned_pod, ref, run, workload
from tests.webhook.webhook_support import cluster, gpu_pod, handler, review


def pod_group(
    name: str, min_count: int | None, annotations: dict | None = None, workload_name: str = ""
) -> dict:
    policy = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    spec: dict = {"schedulingPolicy": policy}
    if workload_name:
        spec["workloadRef"] = {"workloadName": workload_name, "templateName": "workers"}
    return workload("PodGroup", name, "scheduling.k8s.io/v1beta1", annotations, spec=spec)


def group_pod(group: str, gpus: int | None = 2, owner: dict | None = None) -> dict:
    pod = owned_pod(owner, gpus=gpus, limits=True) if owner else gpu_pod(gpus, namespace=NS, limits=True)
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def test_the_walk_puts_the_gang_pod_group_and_its_workload_before_the_pods_controllers():
    job = workload("Job", "train", "batch/v1", spec={"parallelism": 4})
    objs = [
        pod_group("train-pg", 4, workload_name="train-wl"),
        workload("Workload", "train-wl", "scheduling.k8s.io/v1beta1"),
        job,
    ]
    owners, _ = lookup(objs)
    found = run(chain.walk(group_pod("train-pg", owner=ref("Job", "train", "batch/v1")), NS, owners))
    assert [o["kind"] for o in found.owners] == ["PodGroup", "Workload", "Job"]
    assert found.group_owner["kind"] == "PodGroup"


def test_a_basic_pod_group_leaves_the_pod_as_it_was():
    owners, _ = lookup([pod_group("web", None)])
    found = run(chain.walk(group_pod("web"), NS, owners))
    assert found.owners == ()


def test_pod_group_pods_are_one_gang_of_min_count_with_the_workloads_topology():
    wl = workload(
        "Workload",
        "train-wl",
        "scheduling.k8s.io/v1beta1",
        {"topology.scheduler/placement-strategy": "consolidated"},
    )
    owners, _ = lookup([pod_group("train-pg", 4, workload_name="train-wl"), wl])
    h, svc = handler(cluster(4, 8), owners=owners)
    first = run(h.mutate(review(group_pod("train-pg"), namespace=NS)))
    assert first.allowed and first.outcome == "placed" and len(first.devices) == 2, first.message
    held = svc.stats()
    assert (
        held.groups == 1 and held.milli_allocated == 8000
    )  # the first pod holds the whole group: 4 x 2 GPUs
    rest = [run(h.mutate(review(group_pod("train-pg"), namespace=NS))) for _ in range(3)]
    assert all(d.allowed and len(d.devices) == 2 for d in rest), [d.message for d in rest]
    after = svc.stats()  # each later pod took its slot of the plan: nothing more held
    assert after.reservations_pending == 4 and after.milli_allocated == 8000 and after.groups == 1
    assert {d.node for d in [first, *rest]} == {first.node}  # consolidated: the Workload's strategy


def test_a_pod_group_that_cannot_fit_whole_places_none_of_it():
    owners, _ = lookup([pod_group("big", 5)])
    h, svc = handler(cluster(4, 8), owners=owners)  # 5 pods x 8 GPUs on 4 nodes of 8
    d = run(h.mutate(review(group_pod("big", gpus=8), namespace=NS)))
    assert d.outcome != "placed", d.message
    assert svc.stats().milli_allocated == 0  # nothing of the group held


def test_the_pod_groups_gpu_count_is_the_groups_total():
    owners, _ = lookup([pod_group("pg", 2, {"topology.scheduler/gpu-count": "8"})])
    h, _ = handler(cluster(4, 8), owners=owners)
    d = run(h.mutate(review(group_pod("pg", gpus=None), namespace=NS)))
    assert d.allowed and len(d.devices) == 4, d.message  # 8 over the group's minCount of 2


def test_a_missing_pod_group_is_denied_naming_the_field_and_what_to_do():
    owners, _ = lookup([])
    h, svc = handler(cluster(2, 8), owners=owners)
    d = run(h.mutate(review(group_pod("nope"), namespace=NS)))
    assert not d.allowed
    assert 'spec.schedulingGroup.podGroupName "nope"' in d.message
    assert "create the PodGroup before its pods" in d.message
    assert svc.stats().reservations_pending == 0


def test_a_bad_min_count_is_denied_naming_it():
    owners, _ = lookup([pod_group("pg", 0)])
    h, _ = handler(cluster(2, 8), owners=owners)
    d = run(h.mutate(review(group_pod("pg"), namespace=NS)))
    assert not d.allowed and "spec.schedulingPolicy.gang.minCount" in d.message, d.message
