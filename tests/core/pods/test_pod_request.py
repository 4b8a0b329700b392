"""Pod (+ owner) -> Request: every annotation, the group rule, and errors that name
annotation, value and fix."""

from __future__ import annotations

import pytest

from gpuledger.core.model import GroupSpec, PinnedDevices
from gpuledger.core.pods.annotation_values import (
    AnnotationError,
    parse_quantity,
    parse_scheduling_map,
    pod_index,
)
from gpuledger.core.pods.request import request_from_pod


def pod(annotations=None, limits=None, name="p", labels=None, owner=None, **spec_extra):
    container = {"name": "main", "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}}
    if limits:
        container["resources"]["limits"] = limits
    meta = {
        "name": name,
        "namespace": "ml",
        "annotations": dict(annotations or {}),
        "labels": dict(labels or {}),
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {"metadata": meta, "spec": {"containers": [container], **spec_extra}}


def job(name="train", parallelism=4, annotations=None, completions=None):
    spec = {"parallelism": parallelism}
    if completions is not None:
        spec["completions"] = completions
    return {
        "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations or {}},
        "spec": spec,
    }


def req(p, owner=None, rid="r1"):
    return request_from_pod(p, owner, None, rid)


def test_no_gpu_pod_needs_no_request():
    assert req(pod()) is None
    assert req(pod({"topology.scheduler/gpu-count": "0"})) is None
    assert req(pod({"topology.scheduler/placement-strategy": "balanced"})) is None


def test_count_from_annotation_and_resources_from_containers():
    r = req(pod({"topology.scheduler/gpu-count": "2"}))
    assert (r.id, r.gpus, r.cpu_milli, r.memory_mib, r.namespace, r.name) == ("r1", 2, 1500, 2048, "ml", "p")
    assert r.group is None and r.strategy is None


def test_count_from_container_limits():
    r = req(pod(limits={"nvidia.com/gpu": "3"}))
    assert r.gpus == 3


def test_annotation_and_limits_must_agree():
    with pytest.raises(AnnotationError) as err:
        req(pod({"topology.scheduler/gpu-count": "2"}, limits={"nvidia.com/gpu": "3"}))
    assert (
        "topology.scheduler/gpu-count" in str(err.value) and "'2'" in str(err.value) and "3" in str(err.value)
    )


@pytest.mark.parametrize(
    "value,strategy",
    [("consolidated", "consolidated"), ("distributed", "distributed"), ("Balanced", "balanced")],
)
def test_topology_strategies(value, strategy):
    r = req(pod({"topology.scheduler/gpu-count": "1", "topology.scheduler/placement-strategy": value}))
    assert r.strategy == strategy


@pytest.mark.parametrize(
    "value,strategy",
    [
        ("least_utilized", "least_utilized"),
        ("least-loaded", "least_utilized"),
        ("best_fit", "best_fit"),
        ("best-fit", "best_fit"),
        ("priority", "priority"),
        ("round_robin", "round_robin"),
        ("random", "random"),
        ("cost-optimized", "cost_optimized"),
    ],
)
def test_agentaflow_strategies(value, strategy):
    r = req(pod({"topology.scheduler/gpu-count": "1", "agentaflow.gpu/scheduling-strategy": value}))
    assert r.strategy == strategy


def test_both_strategy_annotations_is_an_error():
    with pytest.raises(AnnotationError, match="set only one"):
        req(
            pod(
                {
                    "topology.scheduler/gpu-count": "1",
                    "agentaflow.gpu/scheduling-strategy": "random",
                    "topology.scheduler/placement-strategy": "balanced",
                }
            )
        )


def test_hints():
    r = req(
        pod(
            {
                "topology.scheduler/gpu-count": "1",
                "topology.scheduler/preferred-domain": "leaf-2",
                "topology.scheduler/latency-sensitive": "true",
                "topology.scheduler/network-bandwidth": "High",
                "agentaflow.gpu/priority": "7",
                "agentaflow.gpu/product": "A100",
            }
        )
    )
    assert (r.preferred_domain, r.latency_sensitive, r.network_bandwidth, r.priority, r.product) == (
        "leaf-2",
        True,
        "high",
        7,
        "A100",
    )


def test_priority_defaults_to_pod_spec_priority():
    assert req(pod({"topology.scheduler/gpu-count": "1"}, priority=1000)).priority == 1000


@pytest.mark.parametrize(
    "annotation,value,accepted",
    [
        ("topology.scheduler/gpu-count", "-1", "integer from 0"),
        ("topology.scheduler/gpu-count", "two", "integer from 0"),
        ("topology.scheduler/placement-strategy", "tight", "consolidated | distributed | balanced"),
        ("agentaflow.gpu/scheduling-strategy", "fastest", "least_utilized"),
        ("topology.scheduler/latency-sensitive", "maybe", '"true" or "false"'),
        ("topology.scheduler/network-bandwidth", "fast", "high | medium | low"),  # "10G" is a bandwidth now
        ("agentaflow.gpu/priority", "urgent", "integer"),
        ("topology.scheduler/preferred-domain", "leaf 2!", "leaf or spine name"),
        ("agentaflow.gpu/memory", "16GB", "MiB"),  # "16Gi" is a quantity now
        ("agentaflow.gpu/milli", "1500", "1 to 999"),
        ("gpu-scheduling-map", "node1:0", "INDEX=NODE:DEV"),
    ],
)
def test_bad_values_name_annotation_value_and_accepted(annotation, value, accepted):
    annotations = {"topology.scheduler/gpu-count": "1", annotation: value}
    if annotation == "agentaflow.gpu/milli":
        annotations["agentaflow.gpu/exclusive-access"] = "false"
    with pytest.raises(AnnotationError) as err:
        req(pod(annotations))
    text = str(err.value)
    assert annotation in text and repr(value) in text and accepted in text
    assert err.value.annotation == annotation and err.value.value == value


def test_sharing_by_milli_and_memory():
    r = req(
        pod(
            {
                "agentaflow.gpu/exclusive-access": "false",
                "agentaflow.gpu/milli": "250",
                "agentaflow.gpu/memory": "8192",
            }
        )
    )
    assert (r.gpus, r.gpu_milli, r.gpu_memory_mib, r.is_shared) == (0, 250, 8192, True)
    r = req(pod({"agentaflow.gpu/milli": "500"}))  # a share implies non-exclusive access
    assert (r.gpus, r.gpu_milli) == (0, 500)
    r = req(
        pod(
            {
                "agentaflow.gpu/exclusive-access": "false",
                "agentaflow.gpu/memory": "4096",
                "topology.scheduler/gpu-count": "1",
            }
        )
    )
    assert (r.gpus, r.gpu_milli, r.gpu_memory_mib, r.is_shared) == (0, 0, 4096, True)


def test_memory_on_whole_gpus_is_a_per_gpu_minimum():
    r = req(pod({"topology.scheduler/gpu-count": "2", "agentaflow.gpu/memory": "40000"}))
    assert (r.gpus, r.gpu_memory_mib, r.is_shared) == (2, 40000, False)


@pytest.mark.parametrize(
    "annotations,named",
    [
        (
            {"agentaflow.gpu/exclusive-access": "true", "agentaflow.gpu/milli": "100"},
            "agentaflow.gpu/exclusive-access",
        ),
        ({"agentaflow.gpu/exclusive-access": "false"}, "agentaflow.gpu/exclusive-access"),
        (
            {
                "agentaflow.gpu/exclusive-access": "false",
                "agentaflow.gpu/milli": "100",
                "topology.scheduler/gpu-count": "2",
            },
            "topology.scheduler/gpu-count",
        ),
        ({"agentaflow.gpu/memory": "1024"}, "agentaflow.gpu/memory"),
    ],
)
def test_sharing_conflicts(annotations, named):
    with pytest.raises(AnnotationError) as err:
        req(pod(annotations))
    assert err.value.annotation == named


def test_job_owner_total_is_split_over_the_group():
    owner = job(
        annotations={
            "topology.scheduler/gpu-count": "16",
            "topology.scheduler/placement-strategy": "consolidated",
        }
    )
    r = req(pod(owner=("Job", "train")), owner)
    assert r.gpus == 4
    assert r.group == GroupSpec(key="job/ml/train", size=4)
    assert r.strategy == "consolidated"


def test_pod_annotation_is_per_pod_and_beats_owner():
    owner = job(annotations={"topology.scheduler/gpu-count": "16"})
    r = req(pod({"topology.scheduler/gpu-count": "2"}, owner=("Job", "train")), owner)
    assert r.gpus == 2 and r.group.size == 4


def test_group_total_must_divide():
    owner = job(parallelism=3, annotations={"topology.scheduler/gpu-count": "16"})
    with pytest.raises(AnnotationError, match="multiple of the Job's 3 pods"):
        req(pod(owner=("Job", "train")), owner)


def test_completions_bound_the_group_and_single_pod_jobs_are_not_groups():
    owner = job(parallelism=4, completions=2, annotations={"topology.scheduler/gpu-count": "8"})
    r = req(pod(owner=("Job", "train")), owner)
    assert (r.gpus, r.group.size) == (4, 2)
    owner = job(parallelism=1, annotations={"topology.scheduler/gpu-count": "8"})
    r = req(pod(owner=("Job", "train")), owner)
    assert (r.gpus, r.group) == (8, None)


def test_statefulset_group():
    sts = {
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "ml", "annotations": {"topology.scheduler/gpu-count": "6"}},
        "spec": {"replicas": 3},
    }
    r = req(pod(name="db-2", owner=("StatefulSet", "db")), sts)
    assert r.gpus == 2 and r.group == GroupSpec("sts/ml/db", 3)


def test_scheduling_map_by_pod_index():
    text = "0=node1:0,1\n1=node2:2\n# comment\n\n2=node3:0,1,2"
    assert parse_scheduling_map("gpu-scheduling-map", text)[2] == PinnedDevices("node3", (0, 1, 2))
    annotations = {"gpu-scheduling-map": text}
    # StatefulSet ordinal from the name
    r = req(
        pod(annotations, name="w-1", owner=("StatefulSet", "w")),
        {"kind": "StatefulSet", "metadata": {"name": "w"}, "spec": {"replicas": 3}},
    )
    assert (r.pinned, r.gpus, r.group) == (PinnedDevices("node2", (2,)), 1, None)  # a map forms no gang
    # the pod-index label and the Job completion index
    assert req(pod(annotations, labels={"apps.kubernetes.io/pod-index": "2"})).pinned.node == "node3"
    p = pod(annotations)
    p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = "1"
    assert req(p).pinned.node == "node2"
    # no index: entry 0
    assert req(pod(annotations)).pinned == PinnedDevices("node1", (0, 1))


def test_scheduling_map_errors():
    with pytest.raises(AnnotationError, match="entries: 0"):
        req(pod({"gpu-scheduling-map": "0=n:0"}, labels={"apps.kubernetes.io/pod-index": "5"}))
    with pytest.raises(AnnotationError, match="2 devices"):
        req(pod({"gpu-scheduling-map": "0=n:0", "topology.scheduler/gpu-count": "2"}))
    with pytest.raises(AnnotationError, match="listed twice"):
        parse_scheduling_map("gpu-scheduling-map", "0=n:0\n0=m:1")


def test_pod_index_sources():
    assert pod_index({"metadata": {"name": "x-7"}}, "StatefulSet") == 7
    assert pod_index({"metadata": {"name": "x-7"}}) is None
    assert pod_index({"metadata": {"labels": {"batch.kubernetes.io/job-completion-index": "3"}}}) == 3


def test_selectors_affinity_tolerations_are_carried():
    p = pod(
        {"topology.scheduler/gpu-count": "1"},
        nodeSelector={"zone": "a"},
        tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
                    ]
                }
            }
        },
    )
    r = req(p)
    assert r.node_selector == (("zone", "a"),)
    assert r.affinity_terms[0][0].key == "gpu" and r.affinity_terms[0][0].values == ("a100",)
    assert r.tolerations[0].key == "k" and r.tolerations[0].operator == "Exists"


def test_seed_is_stable_per_id():
    a = req(pod({"topology.scheduler/gpu-count": "1"}), rid="x")
    b = req(pod({"topology.scheduler/gpu-count": "1"}), rid="x")
    assert a.seed == b.seed


def test_quantities():
    assert parse_quantity("f", "500m") * 1000 == 500
    assert parse_quantity("f", "2Gi") == 2 * 2**30
    assert parse_quantity("f", "1e3") == 1000
    with pytest.raises(AnnotationError):
        parse_quantity("f", "lots")


def test_bad_container_quantities_are_errors_not_crashes():
    p = pod(limits={"nvidia.com/gpu": "1.5"})
    with pytest.raises(AnnotationError, match="whole number"):
        req(p)
    p = pod({"topology.scheduler/gpu-count": "1"})
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "fast"
    with pytest.raises(AnnotationError, match=r"requests\.cpu"):
        req(p)


@pytest.mark.parametrize("name", ["fgd", "FGD", "leastLoaded", "binpack"])
def test_scheduling_strategy_accepts_every_registered_strategy(name):
    from gpuledger import strategies

    r = req(pod({"topology.scheduler/gpu-count": "1", "agentaflow.gpu/scheduling-strategy": name}))
    assert r.strategy == strategies.canonical_name(name)


def test_unknown_scheduling_strategy_lists_the_registered_ones():
    from gpuledger import strategies

    with pytest.raises(AnnotationError) as err:
        req(pod({"topology.scheduler/gpu-count": "1", "agentaflow.gpu/scheduling-strategy": "fastest"}))
    for name in strategies.strategy_names():
        assert name in str(err.value)


def test_cpu_and_memory_are_counted_as_the_ledger_counts_the_stored_pod():
    """Sidecars, init peaks and overhead: the reservation asks what a rebuild from the pod will hold."""
    from gpuledger.core.pods.objects import pod_requests

    p = pod({"topology.scheduler/gpu-count": "1"})
    p["spec"]["initContainers"] = [
        {
            "name": "proxy",
            "restartPolicy": "Always",
            "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}},
        },
        {"name": "fetch", "resources": {"limits": {"cpu": "4", "memory": "1Gi"}}},
    ]
    p["spec"]["overhead"] = {"cpu": "100m", "memory": "64Mi"}
    r = req(p)
    counted = pod_requests(p)
    assert (r.cpu_milli, r.memory_mib) == (counted.cpu_milli, counted.memory_mib) == (4350, 2240)


@pytest.mark.parametrize("field,value", [("containers", 7), ("initContainers", "x")])
def test_containers_that_are_not_a_list_are_named(field, value):
    p = pod({"topology.scheduler/gpu-count": "1"})
    p["spec"][field] = value
    with pytest.raises(AnnotationError) as err:
        req(p)
    assert f"spec.{field}" in str(err.value) and "a list of containers" in str(err.value)


def test_a_requests_shape_leaves_out_only_what_differs_pod_to_pod():
    from gpuledger.core.model import Request

    a = Request("a", gpus=1, cpu_milli=2000, memory_mib=8192, seed=1, name="pod-a", namespace="ns")
    b = Request("b", gpus=1, cpu_milli=2000, memory_mib=8192, seed=2, name="pod-b", namespace="ns")
    assert a.shape() == b.shape() and hash(a.shape()) == hash(b.shape())
    assert Request("c", gpus=1, cpu_milli=1000, memory_mib=8192, namespace="ns").shape() != a.shape()
    assert Request("d", gpus=1, cpu_milli=2000, memory_mib=8192, namespace="other").shape() != a.shape()
    assert Request("g", gpus=1, group=GroupSpec(key="job/ns/j", size=2)).shape() is None
    assert Request("p", gpus=1, pinned=PinnedDevices(node="n", devices=(0,))).shape() is None
