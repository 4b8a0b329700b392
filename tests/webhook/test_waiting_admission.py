"""Admission of a GPU pod that does not fit now: admitted gated with its signed ticket and the device
variables its placement will fill (each visibility mode), or refused when it asks to be (or can never fit);
the validating webhook's checks of a waiting pod on CREATE, and of who may change its gate and placement."""

from __future__ import annotations

import asyncio
import copy

import pytest

from gpuledger.core.pods.waiting_codec import decode_waiting
from gpuledger.names import (
    PLACEMENT_ANNOTATION,
    RESERVATION_ID_KEY,
    SCHEDULING_GATE,
    WAITING_ANNOTATION,
    WHEN_FULL,
)
from gpuledger.webhook.admission.patch import DEVICE_INDICES_FROM, VISIBLE_DEVICES_FROM
from gpuledger.webhook.config import WebhookConfig
from tests.webhook.webhook_support import HMAC_KEY, apply_patch, cluster, config, gpu_pod, handler, review

PRIVILEGED = "system:serviceaccount:gpuledger-system:gpuledger"


def run(coro):
    return asyncio.run(coro)


def full(mode: str = "runtime-uuids", **kw):
    """A handler on one full 8-GPU node, waiting by default (the product's default)."""
    kw.setdefault("when_full", "wait")
    h, svc = handler(cluster(1, 8), config(visibility_mode=mode, **kw))
    first = run(h.mutate(review(gpu_pod(8, name="first"))))
    assert first.allowed and first.outcome == "placed"
    return h, svc


def env_of(pod: dict, index: int = 0) -> dict:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][index].get("env", [])
    }


def test_the_product_default_is_to_wait():
    assert WebhookConfig().when_full == "wait"
    with pytest.raises(ValueError, match="when_full='later'"):
        WebhookConfig(when_full="later")


def test_a_pod_that_does_not_fit_now_is_admitted_gated_with_its_ticket():
    h, svc = full()
    pod = gpu_pod(4, name="waiter", containers=2, limits=True)
    d = run(h.mutate(review(pod)))
    assert d.allowed and d.outcome == "waiting", d.message
    assert d.message.startswith("waiting for 4 GPUs on one node; 1st in line; nearest: node-0000 has 0 free")
    assert any("scheduling gate gpuledger.io/placement" in w for w in d.warnings)
    stored = apply_patch(pod, d.patch)
    assert stored["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    ticket = decode_waiting(stored["metadata"]["annotations"][WAITING_ANNOTATION], HMAC_KEY)
    assert ticket is not None and ticket.request.gpus == 4 and ticket.request.id == d.reservation_id
    assert ticket.binding.name == "waiter"
    assert PLACEMENT_ANNOTATION not in stored["metadata"]["annotations"]
    assert RESERVATION_ID_KEY not in (stored["metadata"].get("labels") or {})
    assert "nodeName" not in stored["spec"] and "affinity" not in stored["spec"]
    assert env_of(stored, 0) == {
        "NVIDIA_VISIBLE_DEVICES": VISIBLE_DEVICES_FROM,
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    assert env_of(stored, 1) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert d.reservation_id not in svc.ledger.reservations()  # holding nothing
    # the validating webhook accepts it as stored, and a reinvocation changes nothing
    assert run(h.validate(review(stored))).allowed
    again = run(h.mutate(review(stored)))
    assert again.allowed and again.patch == [] and again.outcome == "reused"


def test_host_indices_and_device_plugin_modes():
    h, _ = full("host-indices")
    pod = gpu_pod(2, name="hi")
    stored = apply_patch(pod, run(h.mutate(review(pod))).patch)
    assert env_of(stored) == {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": DEVICE_INDICES_FROM}
    assert run(h.validate(review(stored))).allowed
    h, _ = full("device-plugin")
    pod = gpu_pod(2, name="dp")
    stored = apply_patch(pod, run(h.mutate(review(pod))).patch)
    assert stored["spec"]["schedulingGates"] == [{"name": SCHEDULING_GATE}]
    assert stored["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(stored)


def test_refuse_when_full_by_annotation_and_a_pod_that_never_fits():
    h, _ = full()
    d = run(h.mutate(review(gpu_pod(4, annotations={WHEN_FULL: "refuse"}))))
    assert not d.allowed and d.code == 403 and "node-0000 has 0 free" in d.message
    d = run(h.mutate(review(gpu_pod(16))))
    assert not d.allowed and d.code == 403  # larger than any node: denied, waiting or not
    d = run(h.mutate(review(gpu_pod(4, annotations={WHEN_FULL: "someday"}))))
    assert not d.allowed and d.code == 422 and "topology.scheduler/when-full='someday'" in d.message
    h, _ = full(when_full="refuse")
    d = run(h.mutate(review(gpu_pod(4, annotations={WHEN_FULL: "wait"}))))
    assert d.allowed and d.outcome == "waiting"  # the pod's word wins over the webhook's


def test_a_user_cannot_bring_its_own_gate_or_ticket():
    h, _ = full()
    pod = gpu_pod(4, name="sly")
    stored = apply_patch(pod, run(h.mutate(review(pod))).patch)
    # the same ticket on another pod, a forged one, a gate with none, a ticket with no gate
    copy_pod = copy.deepcopy(stored)
    copy_pod["metadata"]["name"] = "other"
    d = run(h.validate(review(copy_pod)))
    assert not d.allowed and "issued for another pod" in d.message
    forged = copy.deepcopy(stored)
    forged["metadata"]["annotations"][WAITING_ANNOTATION] = forged["metadata"]["annotations"][
        WAITING_ANNOTATION
    ].replace('"gpus":4', '"gpus":1')
    assert not run(h.validate(review(forged))).allowed
    bare_gate = gpu_pod(1, name="gate-only")
    bare_gate["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
    d = run(h.validate(review(bare_gate)))
    assert not d.allowed and "without annotation gpuledger.io/waiting" in d.message
    ungated = copy.deepcopy(stored)
    del ungated["spec"]["schedulingGates"]
    d = run(h.validate(review(ungated)))
    assert not d.allowed and "must stay gated" in d.message
    # the mutating webhook strips a gate a user wrote (only gpuledger gates a pod)
    d = run(h.mutate(review(bare_gate)))
    assert d.allowed and any("scheduling gate gpuledger.io/placement" in w for w in d.warnings)


def test_only_gpuledger_removes_the_gate_or_changes_where_a_waiting_pod_goes():
    h, _ = full(privileged_usernames=(PRIVILEGED,))
    pod = gpu_pod(4, name="w")
    stored = apply_patch(pod, run(h.mutate(review(pod))).patch)
    ungated = copy.deepcopy(stored)
    ungated["spec"]["schedulingGates"] = []
    d = run(h.validate(review(ungated, operation="UPDATE", old=stored, username="alice")))
    assert not d.allowed and "scheduling gate gpuledger.io/placement" in d.message
    moved = copy.deepcopy(stored)
    moved["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-0001"}
    d = run(h.validate(review(moved, operation="UPDATE", old=stored, username="alice")))
    assert not d.allowed and "spec.nodeSelector of a pod waiting for GPUs" in d.message
    labelled = copy.deepcopy(stored)
    labelled["metadata"].setdefault("labels", {})["team"] = "a"
    assert run(h.validate(review(labelled, operation="UPDATE", old=stored, username="alice"))).allowed
    # the placement adapter (the webhook's own service account) writes the placement and removes the gate
    placed = copy.deepcopy(ungated)
    placed["metadata"]["annotations"][PLACEMENT_ANNOTATION] = "{}"
    placed["spec"]["affinity"] = {"nodeAffinity": {}}
    assert run(h.validate(review(placed, operation="UPDATE", old=stored, username=PRIVILEGED))).allowed


def test_a_user_cannot_set_the_device_variable_from_gpuledgers_annotation_itself():
    h, _ = full()
    pod = gpu_pod(4, name="reader")
    pod["spec"]["containers"][0]["env"] = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": VISIBLE_DEVICES_FROM}
    ]
    d = run(h.mutate(review(pod)))
    assert not d.allowed and "valueFrom" in d.message


def test_metrics_count_waiting_pods_by_priority_and_as_pending_workloads():
    from gpuledger.webhook.metrics import WebhookMetrics

    h, svc = full()
    for name, priority in (("a", "0"), ("b", "high"), ("c", "0")):
        pod = gpu_pod(4, name=name, annotations={"agentaflow.gpu/priority": priority})
        stored = apply_patch(pod, run(h.mutate(review(pod))).patch)
        svc.ledger.apply_object(stored, 1000.0)  # as the cluster sync applies the stored pod
    stats = svc.stats(now=1060.0)
    assert (stats.waiting, dict(stats.waiting_by_priority), stats.waiting_oldest_s) == (
        3,
        {0: 2, 100: 1},
        60.0,
    )
    metrics = WebhookMetrics()
    metrics.update_from_stats(stats)
    text = metrics.exposition().decode()
    assert 'gpuledger_pods_waiting{priority="0"} 2.0' in text
    assert 'gpuledger_pods_waiting{priority="100"} 1.0' in text
    assert "gpuledger_pod_oldest_wait_seconds 60.0" in text
    # the seed metric counts them with the reservations not stored yet (the first pod's)
    assert f"agentaflow_workloads_pending {stats.reservations_pending + 3:.1f}" in text
