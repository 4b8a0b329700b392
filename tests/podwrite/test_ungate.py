import jsonpatch

from gpuledger.core.model import Taint
from gpuledger.names import SCHEDULING_GATE
from gpuledger.podwrite.ungate import placement_ops


def _ops(pod: dict, **kw) -> list[dict]:
    args = {
        "uid": "u1",
        "node": "n1",
        "annotations": {"gpuledger.io/placement": "signed"},
        "labels": {"gpuledger.io/reservation-id": "r1"},
        "taints": (),
        "affinity_key": "kubernetes.io/hostname",
    }
    return placement_ops(pod, 1, **{**args, **kw})


def _gated(**spec) -> dict:
    gates = [{"name": "other.io/g"}, {"name": SCHEDULING_GATE}]
    return {"metadata": {"uid": "u1", "labels": {}}, "spec": {"schedulingGates": gates, **spec}}


def test_the_patch_tests_the_pod_writes_the_placement_and_removes_only_our_gate():
    pod = _gated()
    ops = _ops(pod)
    assert ops[:2] == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": SCHEDULING_GATE},
    ]
    out = jsonpatch.apply_patch(pod, ops)
    assert out["metadata"] == {
        "uid": "u1",
        "labels": {"gpuledger.io/reservation-id": "r1"},
        "annotations": {"gpuledger.io/placement": "signed"},
    }
    assert out["spec"]["schedulingGates"] == [{"name": "other.io/g"}]
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}
        ]
    }


def test_only_hard_taints_not_yet_tolerated_get_a_toleration():
    pod = _gated(tolerations=[{"key": "held", "operator": "Exists"}])
    taints = (Taint("held"), Taint("soft", "", "PreferNoSchedule"), Taint("gpu", "", "NoExecute"))
    added = [op for op in _ops(pod, taints=taints) if op["path"] == "/spec/tolerations"]
    assert added == [
        {
            "op": "add",
            "path": "/spec/tolerations",
            "value": [
                {"key": "held", "operator": "Exists"},
                {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
            ],
        }
    ]
    assert not [op for op in _ops(pod, taints=taints[:2]) if op["path"] == "/spec/tolerations"]
