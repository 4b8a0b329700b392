"""What queues and preemption read, through the cluster sync against the real kube-apiserver: Namespaces
(name and labels only), GPUQueues (their spec, not the status gpuledger writes) and PodDisruptionBudgets
(their selector and the disruptions they allow) reach the ledger as nodes and pods do, in the full list and
as watch events, a change to none of those fields not sent again; a cluster without the GPUQueue CRD has no
queues, and its queues are forwarded once the CRD is installed, without a crash or a full relist.

The target records the calls, as in tests/sync/test_sync.py.
"""

from __future__ import annotations

import uuid

import pytest

from devcluster.cluster import WEBHOOK_USER
from gpuledger.names import GPUQUEUE_PLURAL, QUEUE_API_VERSION, QUEUE_LABEL
from gpuledger.sync.cluster_sync import ClusterSync, slim
from gpuledger.sync.config import KINDS, SyncConfig
from tests.sync.test_sync import RecordingTarget

pytestmark = pytest.mark.e2e

CONFIG = SyncConfig(expiry_interval_s=3600, status_interval_s=0.2, retry_backoff_s=(0.05, 0.5))


def gpu_queue(name: str) -> dict:
    return {
        "apiVersion": QUEUE_API_VERSION,
        "kind": "GPUQueue",
        "metadata": {"name": name},
        "spec": {"quotas": [{"gpus": 64}], "namespaceSelector": {"matchLabels": {"team": "a"}}},
    }


def budget(name: str) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "serving"}}},
    }


def last(target: RecordingTarget, etype: str, kind: str, name: str) -> dict | None:
    with target.lock:
        for t, o in reversed(target.events):
            if t == etype and o.get("kind") == kind and o["metadata"].get("name") == name:
                return o
    return None


def test_slim_keeps_of_the_new_kinds_only_what_the_ledger_reads():
    ns = {"metadata": {"name": "a", "uid": "u", "labels": {QUEUE_LABEL: "q"}, "annotations": {"x": "y"}}}
    assert slim(ns, "Namespace") == {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": "a", "labels": {QUEUE_LABEL: "q"}},
    }
    pdb = {
        **budget("b"),
        "metadata": {"name": "b", "namespace": "a", "uid": "u", "managedFields": []},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "conditions": []},
    }
    assert slim(pdb) == {
        "kind": "PodDisruptionBudget",
        "apiVersion": "policy/v1",
        "metadata": {"name": "b", "namespace": "a", "uid": "u"},
        "spec": {"selector": {"matchLabels": {"app": "serving"}}},
        "status": {"disruptionsAllowed": 0},
    }
    queue = {**gpu_queue("q"), "status": {"used": 3}}
    queue["metadata"] = {"name": "q", "uid": "u", "annotations": {"kubectl.kubernetes.io/last-applied": "{}"}}
    assert slim(queue) == {
        "kind": "GPUQueue",
        "apiVersion": QUEUE_API_VERSION,
        "metadata": {"name": "q", "uid": "u"},
        "spec": gpu_queue("q")["spec"],
    }


def test_namespaces_queues_and_budgets_are_listed_and_watched(apiserver):
    from kubernetes import client

    tag = uuid.uuid4().hex[:6]
    ns = apiserver.create_namespace(f"queues-{tag}", admission=False)
    apiserver.apply({**budget("before"), "metadata": {"name": "before", "namespace": ns}})
    apiserver.apply(gpu_queue(f"before-{tag}"))
    target = RecordingTarget()
    sync = ClusterSync(apiserver.api_client(WEBHOOK_USER), target, CONFIG).start()  # the product's RBAC
    try:
        assert sync.wait_synced(30), sync.stats
        listed = {(o["kind"], o["metadata"]["name"]): o for o in target.resyncs[0]}
        assert set(listed[("Namespace", ns)]["metadata"]) <= {"name", "labels"}
        assert listed[("GPUQueue", f"before-{tag}")]["spec"]["quotas"][0]["gpus"] == 64
        assert listed[("PodDisruptionBudget", "before")]["spec"]["selector"] == {
            "matchLabels": {"app": "serving"}
        }
        kinds = [o["kind"] for o in target.resyncs[0]]
        assert kinds == sorted(kinds, key=KINDS.index)  # what a pod is judged by comes before the pods

        apiserver.kubectl("label", "namespace", ns, f"{QUEUE_LABEL}=team-a-{tag}")
        labelled = apiserver.wait_for(
            lambda: (lambda o: o if o and o["metadata"].get("labels", {}).get(QUEUE_LABEL) else None)(
                last(target, "MODIFIED", "Namespace", ns)
            ),
            what="the namespace's queue label forwarded",
        )
        assert set(labelled["metadata"]) == {"name", "labels"}
        assert labelled["metadata"]["labels"][QUEUE_LABEL] == f"team-a-{tag}"

        apiserver.apply(gpu_queue(f"team-a-{tag}"))
        added = apiserver.wait_for(
            lambda: last(target, "ADDED", "GPUQueue", f"team-a-{tag}"), what="the GPUQueue ADDED"
        )
        assert added["spec"]["quotas"][0]["gpus"] == 64 and "status" not in added
        client.PolicyV1Api(apiserver.api_client()).create_namespaced_pod_disruption_budget(ns, budget("b"))
        apiserver.wait_for(lambda: last(target, "ADDED", "PodDisruptionBudget", "b"), what="the budget ADDED")

        # the status gpuledger writes (and any field the ledger does not read) is not sent again; the spec is
        name = f"team-a-{tag}"
        status = ("--subresource=status", "--type=merge", "-p", '{"status": {"used": 3}}')
        apiserver.kubectl("patch", GPUQUEUE_PLURAL, name, *status)
        apiserver.kubectl("patch", GPUQUEUE_PLURAL, name, "--type=merge", "-p", '{"spec": {"weight": 2}}')
        apiserver.wait_for(lambda: last(target, "MODIFIED", "GPUQueue", name), what="the spec MODIFIED")
        with target.lock:
            modified = [o for t, o in target.events if t == "MODIFIED" and o["metadata"]["name"] == name]
        assert [o["spec"]["weight"] for o in modified] == [2]

        apiserver.kubectl("delete", GPUQUEUE_PLURAL, f"team-a-{tag}")
        apiserver.wait_for(
            lambda: last(target, "DELETED", "GPUQueue", f"team-a-{tag}"), what="the GPUQueue DELETED"
        )
        assert len(target.resyncs) == 1 and sync.stats.watch_errors == 0
    finally:
        sync.stop()
        apiserver.kubectl("delete", GPUQUEUE_PLURAL, f"before-{tag}", "--wait=false", check=False)
        apiserver.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_without_the_gpuqueue_crd_there_are_no_queues_until_it_is_installed():
    """Its own control plane (no controllers): the shared one's CRD must stay."""
    from devcluster.cluster import CRDS_DIR, ControlPlane
    from tests.conftest import require_binaries

    require_binaries(with_controllers=False)
    with ControlPlane(with_controllers=False) as cp:
        cp.kubectl("delete", "crd", "gpuqueues.gpuledger.io", "--wait=true")
        target = RecordingTarget()
        config = SyncConfig(
            expiry_interval_s=3600, status_interval_s=0.2, retry_backoff_s=(0.05, 0.5), absent_retry_s=0.2
        )
        with ClusterSync(cp.api_client(), target, config) as sync:
            assert sync.wait_synced(30), sync.stats
            assert not [o for o in target.resyncs[0] if o["kind"] == "GPUQueue"]
            cp.kubectl("apply", "-f", str(CRDS_DIR / "gpuqueues.gpuledger.io.yaml"))
            cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/gpuqueues.gpuledger.io")
            cp.wait_for(lambda: cp.apply(gpu_queue("late"), check=False).returncode == 0, what="served")
            cp.wait_for(lambda: last(target, "ADDED", "GPUQueue", "late"), timeout=30, what="the queue ADDED")
            cp.apply({**gpu_queue("later"), "spec": {"quotas": [{"gpus": 8}]}})
            cp.wait_for(lambda: last(target, "ADDED", "GPUQueue", "later"), timeout=30, what="watched")
            assert len(target.resyncs) == 1 and sync.stats.target_errors == 0, sync.stats
