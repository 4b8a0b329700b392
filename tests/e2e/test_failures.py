"""Parts failing under load-free conditions: the webhook down (per failurePolicy), the ledger actor killed."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import gpu_pod_yaml, stable_snapshot

pytestmark = pytest.mark.e2e


@pytest.fixture
def webhook_down(stack):
    stack.stop_webhook()
    try:
        yield stack
    finally:
        stack.start_webhook()
        stack.register("Fail")


def test_webhook_down_fail_policy_denies_opted_in_pods_only(apiserver, workloads, webhook_down):
    denied = workloads.apply(gpu_pod_yaml("while-down", gpus=1), check=False)
    assert denied.returncode != 0 and "failed calling webhook" in denied.stderr, denied.stderr
    # kube-system and namespaces without the label never call the webhook
    apiserver.kubectl("apply", "-n", "kube-system", "-f", "-", input=gpu_pod_yaml("system-critical", gpus=0))
    apiserver.force_delete("pod", "system-critical", namespace="kube-system")


def test_webhook_down_ignore_policy_admits_unplaced(apiserver, workloads, webhook_down):
    webhook_down.register("Ignore")
    workloads.apply(gpu_pod_yaml("unplaced", gpus=1))
    pod = workloads.pod("unplaced")
    assert "gpuledger.io/placement" not in (pod["metadata"].get("annotations") or {})
    assert "affinity" not in pod["spec"]


def test_webhook_back_places_again(workloads, stack):
    workloads.apply(gpu_pod_yaml("after-outage", gpus=1))
    assert workloads.placement("after-outage") is not None


def test_killed_ledger_is_rebuilt_from_pods_with_nothing_lost(apiserver, workloads, stack):
    workloads.apply(
        """
apiVersion: batch/v1
kind: Job
metadata: {name: gang, annotations: {topology.scheduler/gpu-count: "8"}}
spec:
  parallelism: 2
  completions: 2
  completionMode: Indexed
  template:
    metadata: {labels: {app: gang}}
    spec:
      restartPolicy: Never
      containers: [{name: w, image: nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04}]
"""
    )
    for i in range(3):
        workloads.apply(gpu_pod_yaml(f"single-{i}", gpus=i + 1))
    pods = workloads.wait_pods(5)
    workloads.wait_confirmed(pods)
    own = {workloads.placement(p).id for p in pods}
    before = own_view(stable_snapshot(stack), own)
    incarnation = stack.kill_ledger()
    status = stack.wait_ledger_synced(after_incarnation=incarnation)
    assert status["incarnation"] != incarnation
    after = own_view(stable_snapshot(stack), own)
    assert len(after["reservations"]) == 5
    assert after == before
    # and the rebuilt ledger keeps placing without handing out a held device
    workloads.apply(gpu_pod_yaml("after-restart", gpus=2))
    new = workloads.placement("after-restart")
    held = {
        (p.node, d)
        for p in (workloads.placement(x) for x in workloads.pods())
        if p.id != new.id
        for d in p.devices
    }
    assert not {(new.node, d) for d in new.devices} & held


def own_view(snapshot: dict, ids: set[str]) -> dict:
    """The part of a ledger snapshot that this test's reservations make: its reservations, holdings, gang
    slots and the devices they hold. The session's cluster is shared, and an earlier test's namespace may
    still be draining while the ledger is rebuilt; its pods are not this test's to compare."""
    devices = {
        (node, d[0]): d
        for node, n in snapshot["nodes"].items()
        for d in n["devices"]
        if d[3] in ids or any(share[0] in ids for share in d[4])
    }
    return {
        "reservations": {k: v for k, v in snapshot["reservations"].items() if k in ids},
        "holdings": {k: v for k, v in snapshot["holdings"].items() if k in ids},
        "groups": {
            k: g for k, g in snapshot["groups"].items() if any(s[3] in ids for s in g["slots"].values())
        },
        "devices": sorted(devices.items()),
        "conflicts": [c for c in snapshot["conflicts"] if c[1] in ids],
    }
