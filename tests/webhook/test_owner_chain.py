"""The controller chain: a workload's GPU annotations reach its pods (Deployment, ReplicaSet, kubeflow.org
jobs), the nearest object wins, Jobs and StatefulSets stay gangs, and lookups are cached with a clock that is
an input."""

from __future__ import annotations

import asyncio

import pytest

from gpuledger.webhook.admission import chain
from gpuledger.webhook.admission.owners import CachedOwners, OwnerLookupError, StaticOwners
from tests.webhook.webhook_support import Clock, cluster, gpu_pod, handler, review

NS = "ml"


def run(coro):
    return asyncio.run(coro)


def ref(kind: str, name: str, api_version: str, controller: bool | None = True) -> dict:
    out = {"apiVersion": api_version, "kind": kind, "name": name, "uid": f"uid-{name}"}
    if controller is not None:
        out["controller"] = controller
    return out


def workload(
    kind: str,
    name: str,
    api_version: str,
    annotations: dict | None = None,
    owner: dict | None = None,
    spec: dict | None = None,
) -> dict:
    meta = {"name": name, "namespace": NS, "uid": f"uid-{name}", "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec or {}}


def deployment(annotations: dict, rs_annotations: dict | None = None) -> list[dict]:
    return [
        workload("Deployment", "web", "apps/v1", annotations, spec={"replicas": 3}),
        workload(
            "ReplicaSet",
            "web-7d9f",
            "apps/v1",
            rs_annotations,
            ref("Deployment", "web", "apps/v1"),
            spec={"replicas": 3},
        ),
    ]


def owned_pod(
    owner: dict, gpus: int | None = None, annotations: dict | None = None, limits: bool = False
) -> dict:
    pod = gpu_pod(gpus, name=None, annotations=annotations, limits=limits, namespace=NS)
    pod["metadata"].pop("name")
    pod["metadata"]["generateName"] = f"{owner['name']}-"
    pod["metadata"]["ownerReferences"] = [owner]
    return pod


class FakeReader:
    """A reader as KubeOwners' (async), over a dict of objects; counts its reads."""

    def __init__(self, objects: list[dict], fail: bool = False):
        self.objects = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}
        self.calls: list[tuple[str, str, str]] = []
        self.fail = fail

    async def __call__(self, kind: str, namespace: str, name: str) -> dict | None:
        self.calls.append((kind, namespace, name))
        await asyncio.sleep(0)  # a read yields to the loop, as a real one does
        if self.fail:
            raise OwnerLookupError(f"reading {kind} {namespace}/{name}: 503 Service Unavailable")
        return self.objects.get((kind, namespace, name))


def lookup(objects: list[dict], fail: bool = False) -> tuple[CachedOwners, FakeReader]:
    reader = FakeReader(objects, fail=fail)
    return CachedOwners(reader, ttl_s=5.0, clock=Clock()), reader


# ------------------------------------------------------------------ the walk
def test_walk_goes_pod_to_replicaset_to_deployment():
    owners, reader = lookup(deployment({}))
    found = run(chain.walk(owned_pod(ref("ReplicaSet", "web-7d9f", "apps/v1")), NS, owners))
    assert [o["kind"] for o in found.owners] == ["ReplicaSet", "Deployment"]
    assert found.top["metadata"]["name"] == "web" and found.group_owner is None
    assert reader.calls == [("ReplicaSet", NS, "web-7d9f"), ("Deployment", NS, "web")]


@pytest.mark.parametrize("kind", ["PyTorchJob", "MPIJob", "TFJob"])
def test_walk_reads_kubeflow_jobs(kind):
    owners, _ = lookup([workload(kind, "train", "kubeflow.org/v1")])
    found = run(chain.walk(owned_pod(ref(kind, "train", "kubeflow.org/v1")), NS, owners))
    assert [o["kind"] for o in found.owners] == [kind]


def test_walk_ignores_a_same_named_kind_of_another_api_group_and_non_controllers():
    owners, reader = lookup([workload("PyTorchJob", "train", "kubeflow.org/v1")])
    assert run(chain.walk(owned_pod(ref("PyTorchJob", "train", "example.com/v1")), NS, owners)).owners == ()
    assert (
        run(
            chain.walk(owned_pod(ref("PyTorchJob", "train", "kubeflow.org/v1", controller=False)), NS, owners)
        ).owners
        == ()
    )
    assert reader.calls == []


def test_walk_ignores_unknown_kinds_stops_at_missing_owners_and_cycles():
    a = workload("ReplicaSet", "a", "apps/v1", owner=ref("Deployment", "b", "apps/v1"))
    b = workload(
        "Deployment", "b", "apps/v1", owner=ref("ReplicaSet", "a", "apps/v1")
    )  # nonsense, but finite
    owners, _ = lookup([a, b])
    found = run(chain.walk(owned_pod(ref("ReplicaSet", "a", "apps/v1")), NS, owners))
    assert [o["metadata"]["name"] for o in found.owners] == ["a", "b"]
    assert run(chain.walk(owned_pod(ref("ReplicaSet", "gone", "apps/v1")), NS, owners)).owners == ()
    assert run(chain.walk(owned_pod(ref("DaemonSet", "a", "apps/v1")), NS, owners)).owners == ()


def test_gpu_annotations_are_the_earlier_tools_families_only():
    assert chain.is_gpu_annotation("topology.scheduler/gpu-count")
    assert chain.is_gpu_annotation("agentaflow.gpu/priority")
    assert chain.is_gpu_annotation("gpu-scheduling-map")
    for key in (
        "gpuledger.io/placement",
        "deployment.kubernetes.io/revision",
        "kubectl.kubernetes.io/restartedAt",
    ):
        assert not chain.is_gpu_annotation(key)


def test_inputs_nearest_wins_and_names_the_source():
    objs = deployment(
        {
            "topology.scheduler/placement-strategy": "distributed",
            "topology.scheduler/gpu-count": "2",
            "deployment.kubernetes.io/revision": "3",
        },
        rs_annotations={"topology.scheduler/placement-strategy": "consolidated"},
    )
    pod = owned_pod(ref("ReplicaSet", "web-7d9f", "apps/v1"), annotations={"agentaflow.gpu/priority": "5"})
    found = chain.OwnerChain((objs[1], objs[0]))
    inputs = found.inputs(pod)
    assert inputs.owner is None
    assert inputs.pod["metadata"]["annotations"] == {
        "agentaflow.gpu/priority": "5",  # the pod's own
        "topology.scheduler/placement-strategy": "consolidated",  # the ReplicaSet's beats the Deployment's
        "topology.scheduler/gpu-count": "2",
    }
    assert inputs.inherited == {
        "topology.scheduler/placement-strategy": "ReplicaSet ml/web-7d9f",
        "topology.scheduler/gpu-count": "Deployment ml/web",
    }
    assert (
        "annotations" in pod["metadata"]
        and "topology.scheduler/gpu-count" not in pod["metadata"]["annotations"]
    )


def test_inputs_give_a_group_owner_what_is_above_it():
    job = workload(
        "Job",
        "launcher",
        "batch/v1",
        {"topology.scheduler/placement-strategy": "consolidated"},
        ref("MPIJob", "train", "kubeflow.org/v1"),
        spec={"parallelism": 2},
    )
    mpi = workload(
        "MPIJob",
        "train",
        "kubeflow.org/v1",
        {"topology.scheduler/gpu-count": "4", "topology.scheduler/placement-strategy": "distributed"},
    )
    pod = owned_pod(ref("Job", "launcher", "batch/v1"))
    inputs = chain.OwnerChain((job, mpi)).inputs(pod)
    assert inputs.pod is pod
    assert inputs.owner["metadata"]["annotations"] == {
        "topology.scheduler/gpu-count": "4",
        "topology.scheduler/placement-strategy": "consolidated",
    }


# ------------------------------------------------------------------ through the handler
def test_deployment_annotations_place_its_pods_per_pod_not_as_a_gang():
    objs = deployment(
        {"topology.scheduler/gpu-count": "2", "agentaflow.gpu/scheduling-strategy": "least-loaded"}
    )
    owners, _ = lookup(objs)
    h, svc = handler(cluster(4, 8), owners=owners)
    decisions = [
        run(h.mutate(review(owned_pod(ref("ReplicaSet", "web-7d9f", "apps/v1")), namespace=NS)))
        for _ in range(3)
    ]
    for d in decisions:
        assert d.allowed and d.outcome == "placed" and len(d.devices) == 2, d.message
        assert d.strategy == "least_utilized"
    assert svc.stats().reservations_pending == 3  # three pods, three reservations: no gang of the Deployment


def test_pytorchjob_annotations_reach_its_pods():
    job = workload(
        "PyTorchJob",
        "train",
        "kubeflow.org/v1",
        {"agentaflow.gpu/scheduling-strategy": "priority", "agentaflow.gpu/priority": "10"},
    )
    owners, _ = lookup([job])
    h, _ = handler(cluster(2, 8), owners=owners)
    pod = owned_pod(ref("PyTorchJob", "train", "kubeflow.org/v1"), gpus=1, limits=True)
    d = run(h.mutate(review(pod, namespace=NS)))
    assert d.allowed and d.outcome == "placed" and d.strategy == "priority" and len(d.devices) == 1


def test_the_pods_own_annotation_beats_the_workloads():
    objs = deployment({"topology.scheduler/gpu-count": "4"})
    owners, _ = lookup(objs)
    h, _ = handler(cluster(2, 8), owners=owners)
    pod = owned_pod(ref("ReplicaSet", "web-7d9f", "apps/v1"), gpus=1)
    d = run(h.mutate(review(pod, namespace=NS)))
    assert len(d.devices) == 1


def test_job_pods_are_still_a_gang_with_the_jobs_total():
    job = workload("Job", "train", "batch/v1", {"topology.scheduler/gpu-count": "8"}, spec={"parallelism": 2})
    owners, _ = lookup([job])
    h, _ = handler(cluster(4, 8), owners=owners)
    d = run(h.mutate(review(owned_pod(ref("Job", "train", "batch/v1")), namespace=NS)))
    assert d.allowed and len(d.devices) == 4, d.message  # 8 over the Job's 2 pods


def test_a_bad_inherited_annotation_is_denied_naming_where_it_was_written():
    owners, _ = lookup(deployment({"topology.scheduler/gpu-count": "lots"}))
    h, _ = handler(cluster(1, 8), owners=owners)
    d = run(h.mutate(review(owned_pod(ref("ReplicaSet", "web-7d9f", "apps/v1")), namespace=NS)))
    assert not d.allowed and d.code == 422
    assert "topology.scheduler/gpu-count='lots' is not accepted" in d.message
    assert "(set on Deployment ml/web, inherited by its pods)" in d.message


def test_an_unreadable_owner_is_the_ledger_being_unavailable():
    owners, _ = lookup(deployment({}), fail=True)
    h, _ = handler(cluster(1, 8), owners=owners)
    d = run(h.mutate(review(owned_pod(ref("ReplicaSet", "web-7d9f", "apps/v1"), gpus=1), namespace=NS)))
    assert not d.allowed and d.code == 503 and "503 Service Unavailable" in d.message


def test_static_owners_serve_explain_the_same_chain():
    h, _ = handler(cluster(2, 8), owners=StaticOwners(deployment({"topology.scheduler/gpu-count": "3"})))
    d = run(h.mutate(review(owned_pod(ref("ReplicaSet", "web-7d9f", "apps/v1")), namespace=NS)))
    assert len(d.devices) == 3


# ------------------------------------------------------------------ the cache
def test_lookups_are_cached_for_the_ttl_misses_for_a_second():
    clock = Clock(100.0)
    reader = FakeReader(deployment({}))
    owners = CachedOwners(reader, ttl_s=5.0, clock=clock)
    rs = ("ReplicaSet", NS, "web-7d9f")

    async def burst():
        return await asyncio.gather(*(owners.get(*rs) for _ in range(10)))

    assert all(o["metadata"]["name"] == "web-7d9f" for o in run(burst()))
    assert reader.calls == [rs]  # a burst of pods, one read
    clock.now += 4.9
    run(owners.get(*rs))
    assert len(reader.calls) == 1
    clock.now += 0.2
    run(owners.get(*rs))
    assert len(reader.calls) == 2
    assert run(owners.get("Deployment", NS, "nope")) is None
    clock.now += 0.9
    run(owners.get("Deployment", NS, "nope"))
    assert reader.calls.count(("Deployment", NS, "nope")) == 1
    clock.now += 0.2
    run(owners.get("Deployment", NS, "nope"))
    assert reader.calls.count(("Deployment", NS, "nope")) == 2
    assert run(owners.get("DaemonSet", NS, "x")) is None and ("DaemonSet", NS, "x") not in reader.calls
