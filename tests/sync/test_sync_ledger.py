"""The sync driving a real ledger (LedgerService, in-process: no Ray) from the real API server.

The ledger must end where a rebuild from a full list would: that is the whole promise of "the API server is
the durable truth".
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from devcluster.cluster import WEBHOOK_USER
from devcluster.nodes import create_nodes, make_node
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Placement, Request
from gpuledger.core.pods.placement_codec import encode_placement
from gpuledger.names import PLACEMENT_ANNOTATION, RESERVATION_ID_KEY
from gpuledger.service.ledger_service import AdmitCall, LedgerService
from gpuledger.sync.cluster_sync import ClusterSync
from gpuledger.sync.config import SyncConfig
from gpuledger.sync.targets import LocalLedgerTarget

pytestmark = pytest.mark.e2e

KEY = b"sync-ledger-test-key"


@pytest.fixture
def world(apiserver):
    """Three nodes in a leaf of their own and a namespace without admission."""
    tag = uuid.uuid4().hex[:5]
    nodes = [
        make_node(f"sl-{tag}-{i}", "spine-sl", f"leaf-sl-{tag}", gpus=4, agentaflow=True) for i in range(3)
    ]
    create_nodes(apiserver.api_client(), nodes)
    namespace = f"sl-{tag}"
    apiserver.create_namespace(namespace, admission=False)
    yield [n["metadata"]["name"] for n in nodes], namespace, f"leaf-sl-{tag}"
    apiserver.force_delete("pods", namespace=namespace)
    for n in nodes:
        apiserver.kubectl("delete", "node", n["metadata"]["name"], "--ignore-not-found")


def new_service() -> LedgerService:
    return LedgerService(LedgerConfig(placement_key=KEY, reservation_ttl_s=30), {"kind": "kubernetes"})


def pod(name: str, node: str | None = None, gpus: int = 1, placement: Placement | None = None) -> dict:
    meta: dict = {"name": name, "labels": {}, "annotations": {}}
    if placement is not None:
        meta["annotations"][PLACEMENT_ANNOTATION] = encode_placement(placement, KEY)
        meta["labels"][RESERVATION_ID_KEY] = placement.id
    spec: dict = {
        "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def full_list(apiserver) -> list[dict]:
    nodes = [dict(n, kind="Node", apiVersion="v1") for n in apiserver.get_json("nodes")["items"]]
    pods = [dict(p, kind="Pod", apiVersion="v1") for p in apiserver.get_json("pods", "-A")["items"]]
    return nodes + pods


def canonical(snapshot: dict) -> str:
    return json.dumps(snapshot, sort_keys=True, default=str)


def test_live_ledger_equals_a_rebuild_from_the_api(apiserver, world):
    from kubernetes import client

    nodes, namespace, leaf = world
    service = new_service()
    target = LocalLedgerTarget(service)
    core = client.CoreV1Api(apiserver.api_client())
    with ClusterSync(apiserver.api_client(WEBHOOK_USER), target, SyncConfig(expiry_interval_s=3600)) as sync:
        assert sync.wait_synced(30)
        # admitted pods (reserve, then store the pod carrying the placement) and pods that bypassed admission
        for i in range(3):
            request = Request(
                id=f"r{i}-{uuid.uuid4().hex[:6]}", gpus=2, node_selector=(("topology.scheduler/leaf", leaf),)
            )
            result = service.admit([AdmitCall(request)], time.time())[0]
            assert isinstance(result, Placement), result
            core.create_namespaced_pod(namespace, pod(f"admitted-{i}", placement=result))
        core.create_namespaced_pod(namespace, pod("bypass", node=nodes[2], gpus=3))
        core.create_namespaced_pod(namespace, pod("done", node=nodes[2], gpus=1))
        core.patch_namespaced_pod_status("done", namespace, {"status": {"phase": "Succeeded"}})
        core.delete_namespaced_pod("admitted-0", namespace, grace_period_seconds=0)

        def matches():
            with target._lock:
                live = service.snapshot()
            rebuilt = Ledger.rebuild(full_list(apiserver), service.config, time.time()).snapshot()
            return canonical(live) == canonical(rebuilt)

        apiserver.wait_for(matches, timeout=30, what="live ledger == rebuild from the API")
    snap = service.snapshot()
    assert snap["nodes"][nodes[2]]["unknown_gpus"] == 3  # the bypassing pod counts; the Succeeded one not
    assert all(state == "confirmed" for state, _ in snap["reservations"].values())
    assert len(snap["reservations"]) == 2  # admitted-0 was deleted: released


def test_expiry_asks_the_api_before_releasing(apiserver, world):
    from kubernetes import client

    nodes, namespace, _ = world
    service = new_service()
    target = LocalLedgerTarget(service)
    sync = ClusterSync(apiserver.api_client(WEBHOOK_USER), target)  # not started: no watch confirms for us
    sync.lease_answer(target.sync_lease(sync.identity, 30.0))  # what its lease thread would do first
    sync.resync("test")
    now = time.time()
    stored, lost = (
        service.admit(
            [
                AdmitCall(
                    Request(
                        id=f"{name}-{uuid.uuid4().hex[:6]}",
                        gpus=1,
                        node_selector=(("kubernetes.io/hostname", nodes[1]),),
                    )
                )
            ],
            now,
        )[0]
        for name in ("stored", "lost")
    )
    core = client.CoreV1Api(apiserver.api_client())
    core.create_namespaced_pod(namespace, pod("slow-to-be-seen", placement=stored))
    confirmed, released = sync.expiry.check_expiry(now + service.config.reservation_ttl_s + 1)
    assert confirmed == [stored.id] and released == [lost.id]
    assert service.lookup([stored.id])[0].confirmed
    assert service.lookup([lost.id]) == [None]
