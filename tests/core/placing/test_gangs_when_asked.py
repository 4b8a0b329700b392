"""A group is a gang only when asked (gpu-count on the owner, topology.scheduler/gang, a placement
strategy); Kubeflow jobs are sized from their replica specs; a gang's pods may share a node (the leaf
rules count nodes)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, GroupSpec, Placement, Request
from gpuledger.core.pods.annotation_values import AnnotationError
from gpuledger.core.pods.request import request_from_pod
from tests.core.core_factory import leafy_cluster


def pod(annotations=None, gpus=1, owner=("Job", "work"), name=""):
    container = {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}
    meta = {"name": name, "namespace": "ml", "annotations": dict(annotations or {})}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {"metadata": meta, "spec": {"containers": [container]}}


def job(parallelism=20, annotations=None):
    return {
        "kind": "Job",
        "metadata": {"name": "work", "namespace": "ml", "annotations": annotations or {}},
        "spec": {"parallelism": parallelism, "completions": parallelism},
    }


def ledger(**cluster) -> Ledger:
    led = Ledger(LedgerConfig())
    for o in leafy_cluster(**cluster):
        led.apply_object(o, 0.0)
    return led


def test_a_plain_parallel_job_is_independent_placements():
    r = request_from_pod(pod(), job(), None, "r0")
    assert (r.gpus, r.group) == (1, None)
    led = ledger(spines=2, leaves=2, per_leaf=4)  # 16 nodes, 128 GPUs
    placed = [led.reserve(request_from_pod(pod(), job(), None, f"r{i}"), 0.0) for i in range(20)]
    assert all(isinstance(p, Placement) for p in placed), [p for p in placed if isinstance(p, Denial)][:1]
    assert led.stats().whole_free == 108


@pytest.mark.parametrize(
    "owner_ann, pod_ann",
    [
        ({"topology.scheduler/gpu-count": "40"}, {}),
        ({"topology.scheduler/gang": "true"}, {}),
        ({}, {"topology.scheduler/gang": "yes"}),
        ({"topology.scheduler/placement-strategy": "consolidated"}, {}),
        ({}, {"topology.scheduler/placement-strategy": "distributed"}),
    ],
)
def test_a_group_is_a_gang_when_asked(owner_ann, pod_ann):
    count = owner_ann == {"topology.scheduler/gpu-count": "40"}
    r = request_from_pod(pod(pod_ann, gpus=0 if count else 2), job(20, owner_ann), None, "r0")
    assert r.group == GroupSpec(key="job/ml/work", size=20) and r.gpus == 2


def test_gang_false_declines_and_a_bad_value_names_the_annotation():
    r = request_from_pod(
        pod(gpus=0),
        job(4, {"topology.scheduler/gpu-count": "8", "topology.scheduler/gang": "false"}),
        None,
        "r0",
    )
    assert (r.gpus, r.group) == (2, None)  # still the Job's total, split evenly
    with pytest.raises(AnnotationError, match=r"topology\.scheduler/gang='maybe'"):
        request_from_pod(pod({"topology.scheduler/gang": "maybe"}), job(), None, "r0")


def kubeflow(kind, field, replicas, annotations, launcher_gpus=True):
    def template(gpus):
        limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        return {"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}

    specs = {
        role: {"replicas": n, "template": template(2 if (launcher_gpus or role != "Launcher") else 0)}
        for role, n in replicas.items()
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": kind,
        "metadata": {"name": "train", "namespace": "ml", "annotations": annotations},
        "spec": {field: specs},
    }


def test_kubeflow_jobs_are_sized_from_their_replica_specs():
    owner = kubeflow(
        "PyTorchJob", "pytorchReplicaSpecs", {"Master": 1, "Worker": 3}, {"topology.scheduler/gpu-count": "8"}
    )
    r = request_from_pod(pod(gpus=2, owner=("PyTorchJob", "train")), owner, None, "r0")
    assert r.group == GroupSpec(key="pytorchjob/ml/train", size=4) and r.gpus == 2
    # an MPIJob's launcher asks for no GPU: only the workers make the gang
    mpi = kubeflow(
        "MPIJob",
        "mpiReplicaSpecs",
        {"Launcher": 1, "Worker": 2},
        {"topology.scheduler/gang": "true"},
        launcher_gpus=False,
    )
    r = request_from_pod(pod(gpus=2, owner=("MPIJob", "train")), mpi, None, "r0")
    assert r.group.size == 2
    tf = kubeflow("TFJob", "tfReplicaSpecs", {"PS": 1, "Worker": 2}, {"agentaflow.gpu/priority": "10"})
    r = request_from_pod(pod(gpus=2, owner=("TFJob", "train")), tf, None, "r0")
    assert (r.group, r.priority) == (None, 10)  # not asked: per pod, but the job's annotations still apply
    with pytest.raises(AnnotationError, match=r"PyTorchJob spec.pytorchReplicaSpecs.Worker.replicas='many'"):
        bad = kubeflow(
            "PyTorchJob", "pytorchReplicaSpecs", {"Worker": "many"}, {"topology.scheduler/gang": "1"}
        )
        request_from_pod(pod(owner=("PyTorchJob", "train")), bad, None, "r0")


def gang(rid, size, gpus, **kw):
    limits = {k: kw.pop(k) for k in list(kw) if k.startswith("max_")}
    return Request(id=rid, gpus=gpus, group=GroupSpec(key="job/ml/g", size=size, **limits), **kw)


def test_gang_pods_share_a_node_when_it_holds_them():
    led = ledger(leaves=2, per_leaf=4)
    p = led.reserve(gang("g0", 4, 4, strategy="consolidated"), 0.0)
    assert isinstance(p, Placement), p
    nodes = [s.node for s in p.group_plan]
    assert len(set(nodes)) == 2 and len({led.index.nodes[n].leaf_key for n in nodes}) == 1
    held = [(s.node, d) for s in p.group_plan for d in s.devices]
    assert len(held) == len(set(held)) == 16
    # distributed still spreads: one pod per leaf
    q = led.reserve(Request(id="h0", gpus=1, strategy="distributed", group=GroupSpec("job/ml/h", 2)), 0.0)
    assert len({led.index.nodes[s.node].leaf_key for s in q.group_plan}) == 2


def test_the_leaf_rules_count_nodes_not_pods():
    led = ledger(leaves=4, per_leaf=4)
    # one node per leaf, yet four 2-GPU pods fit on that one node: one leaf, one node
    p = led.reserve(gang("g0", 4, 2, max_nodes_per_leaf=1), 0.0)
    assert isinstance(p, Placement), p
    assert len({s.node for s in p.group_plan}) == 1
    # eight 8-GPU pods, at most two nodes per leaf: four leaves
    q = led.reserve(Request(id="h0", gpus=8, group=GroupSpec("job/ml/h", 8, max_nodes_per_leaf=2)), 0.0)
    assert isinstance(q, Placement), q
    per_leaf: dict = {}
    for s in q.group_plan:
        per_leaf.setdefault(led.index.nodes[s.node].leaf_key, set()).add(s.node)
    assert sorted(len(v) for v in per_leaf.values()) == [2, 2, 2, 2]


def test_a_gang_too_big_is_still_denied_all_or_nothing():
    led = ledger(leaves=1, per_leaf=2)
    before = led.snapshot()
    d = led.reserve(gang("g0", 5, 4), 0.0)
    assert isinstance(d, Denial) and "group job/ml/g" in d.message
    assert led.snapshot() == before


def test_a_late_pod_of_a_packed_gang_may_join_a_node_of_the_group():
    led = ledger(leaves=1, per_leaf=2)
    p = led.reserve(gang("g0", 2, 4), 0.0)
    assert len({s.node for s in p.group_plan}) == 1
    led.reserve(gang("g1", 2, 4), 0.0)
    led.confirm("g0", 1.0)
    led.confirm("g1", 100.0)  # past the group's deadline: a released slot is freed, not kept
    assert led.release("g1") and led.index.nodes[p.node].whole_free == 4
    # the group has one live pod; its lost slot is placed again on the group's node (it has room)
    late = led.reserve(gang("g2", 2, 4), 101.0)
    assert isinstance(late, Placement) and late.node == p.node


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["PyTorchJob", "MPIJob", "TFJob"]),
    specs=json_values,
    gang=json_values,
    roles=st.dictionaries(st.sampled_from(["Master", "Worker", "Launcher", "PS"]), json_values, max_size=3),
)
def test_kubeflow_owners_never_crash_the_parser(kind, specs, gang, roles):
    field = {"PyTorchJob": "pytorchReplicaSpecs", "MPIJob": "mpiReplicaSpecs", "TFJob": "tfReplicaSpecs"}[
        kind
    ]
    for replica_specs in (specs, {role: {"replicas": value} for role, value in roles.items()}):
        owner = {
            "kind": kind,
            "metadata": {"name": "train", "annotations": {"topology.scheduler/gang": gang}},
            "spec": {field: replica_specs},
        }
        try:
            r = request_from_pod(pod(owner=(kind, "train")), owner, None, "r0")
        except AnnotationError as err:
            assert err.annotation in (
                "topology.scheduler/gang",
                "metadata.annotations",
            ) or err.annotation.startswith(f"{kind} spec.{field}."), str(err)
            assert err.annotation in str(err)
        else:
            assert r is not None and (r.group is None or r.group.size >= 2)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_node_bandwidth_and_utilization_readers_never_raise(value):
    from gpuledger.core.pods.annotation_values import node_bandwidth_gbps
    from gpuledger.core.pods.objects import utilization_pct, utilization_timestamp

    assert node_bandwidth_gbps(value) is None or node_bandwidth_gbps(value) >= 0
    assert utilization_pct(value) is None or 0 <= utilization_pct(value) <= 100
    assert utilization_timestamp(value) is None or isinstance(utilization_timestamp(value), float)
