"""The ResourceSlices in which DRA drivers publish GPUs, through the cluster sync against the real
kube-apiserver (resource.k8s.io/v1) with the product's RBAC, into a real ledger (LedgerService, in-process):
a slice listed at the start and one added later mark their nodes, a GPU pod only such a node could take is
denied with the words that say so, a change to the slice's devices reaches the ledger, a deleted slice
unmarks its node, and the live ledger equals a rebuild from the API objects.

The slices are written as NVIDIA's GPU DRA driver writes them (tests/core/nodes/test_resource_slices.py);
no driver runs: there is no GPU here.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from devcluster.cluster import WEBHOOK_USER
from devcluster.nodes import create_nodes, make_node
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, Placement, Request
from gpuledger.names import RESOURCE_SLICE_PLURAL
from gpuledger.service.ledger_service import AdmitCall, LedgerService
from gpuledger.sync.cluster_sync import ClusterSync, slim
from gpuledger.sync.config import SyncConfig
from gpuledger.sync.targets import LocalLedgerTarget
from tests.core.nodes.test_resource_slices import gpu_slice

pytestmark = pytest.mark.e2e

KEY = b"sync-slices-test-key"


def dra_only_node(name: str, leaf: str) -> dict:
    """A node as a cluster with NVIDIA's DRA driver and no device plugin has it: no nvidia.com/gpu."""
    obj = make_node(name, "spine-dra", leaf, gpus=0)
    for where in ("capacity", "allocatable"):
        obj["status"][where].pop("nvidia.com/gpu", None)
    return obj


def test_slim_keeps_of_a_slice_its_name_and_spec():
    obj = gpu_slice("n-gpus", node_name="n", gpus=1)
    obj["metadata"].update({"uid": "u", "managedFields": [{}], "ownerReferences": [{"kind": "Node"}]})
    assert slim(obj) == {
        "kind": "ResourceSlice",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {"name": "n-gpus", "uid": "u"},
        "spec": obj["spec"],
    }


def test_slices_mark_their_nodes_are_explained_and_rebuild_equal(apiserver):
    tag = uuid.uuid4().hex[:5]
    leaf = f"leaf-dra-{tag}"
    first, second = f"dra-{tag}-a", f"dra-{tag}-b"
    create_nodes(apiserver.api_client(), [dra_only_node(first, leaf), dra_only_node(second, leaf)])
    slices = [f"{first}-gpus", f"{second}-gpus"]
    apiserver.apply(gpu_slice(slices[0], node_name=first, gpus=8))
    service = LedgerService(LedgerConfig(placement_key=KEY, reservation_ttl_s=30), {"kind": "kubernetes"})
    target = LocalLedgerTarget(service)
    sync = ClusterSync(apiserver.api_client(WEBHOOK_USER), target, SyncConfig(expiry_interval_s=3600)).start()

    def marked() -> dict[str, int]:
        with target._lock:
            return {g.node: g.gpus for g in service.ledger.dra_nodes() if g.node in (first, second)}

    try:
        assert sync.wait_synced(30), sync.stats
        assert marked() == {first: 8}  # from the full list

        request = Request(id=f"big-{tag}", gpus=8, node_selector=(("topology.scheduler/leaf", leaf),))
        (answer,) = service.admit([AdmitCall(request)], time.time())
        assert isinstance(answer, Denial), answer
        assert f"{first}: 8x NVIDIA H100 80GB HBM3 (driver gpu.nvidia.com)" in answer.message
        assert "ask for the GPUs with a ResourceClaim" in answer.message

        apiserver.apply(gpu_slice(slices[1], node_name=second, gpus=4))  # a watch event
        apiserver.wait_for(lambda: marked() == {first: 8, second: 4}, what="the added slice marks its node")
        apiserver.apply(gpu_slice(slices[1], node_name=second, gpus=2, generation=2))
        apiserver.wait_for(lambda: marked() == {first: 8, second: 2}, what="the changed slice's devices")

        def rebuilt_equals_live():
            objects = [dict(n, kind="Node", apiVersion="v1") for n in apiserver.get_json("nodes")["items"]]
            objects += [
                dict(s, kind="ResourceSlice", apiVersion="resource.k8s.io/v1")
                for s in apiserver.get_json(RESOURCE_SLICE_PLURAL)["items"]
            ]
            rebuilt = Ledger.rebuild(objects, service.config, time.time())
            with target._lock:
                live = (service.snapshot().get("resource_slices"), service.ledger.dra_nodes())
            return json.dumps(live, default=repr) == json.dumps(
                (rebuilt.snapshot().get("resource_slices"), rebuilt.dra_nodes()), default=repr
            )

        apiserver.wait_for(rebuilt_equals_live, timeout=30, what="live ledger == rebuild from the API")

        apiserver.kubectl("delete", RESOURCE_SLICE_PLURAL, slices[0])
        apiserver.wait_for(lambda: marked() == {second: 2}, what="the deleted slice unmarks its node")
        assert sync.stats.resyncs == 1 and sync.stats.watch_errors == 0
        # a GPU pod that fits nowhere in the leaf now names only the node still published through DRA
        again = Request(id=f"again-{tag}", gpus=8, node_selector=request.node_selector)
        (answer,) = service.admit([AdmitCall(again)], time.time())
        assert isinstance(answer, Denial) and not isinstance(answer, Placement)
        assert f"{second}: 2x" in answer.message and f"{first}:" not in answer.message
    finally:
        sync.stop()
        for name in slices:
            apiserver.kubectl("delete", RESOURCE_SLICE_PLURAL, name, "--ignore-not-found", check=False)
        apiserver.kubectl("delete", "node", first, second, "--ignore-not-found", check=False)
