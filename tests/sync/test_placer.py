"""The placement adapter through the real API server: a gated waiting pod is placed the moment GPUs free,
its placement written through what a gated pod may still change, its gate removed, and the real
kube-scheduler binds it to the one node the ledger chose; a waiting pod deleted leaves no trace.

The ledger here is a `LedgerService` in this process (`LocalLedgerTarget`) behind a real `ClusterSync`; the
pods are made as admission makes them (gpuledger.service's `Waiting` answer, its ticket signed), in a
namespace not opted in, so no webhook is involved: the webhook's part is tests/e2e/test_waiting_pods.py.
"""

from __future__ import annotations

import json
import uuid

import pytest

from devcluster.nodes import create_nodes, make_node
from devcluster.scheduler import KubeScheduler
from gpuledger.core.ledger import LedgerConfig
from gpuledger.core.model import Placement, Request
from gpuledger.core.pods.placement_codec import Binding, decode_placement
from gpuledger.core.pods.waiting_codec import WaitTicket, encode_waiting
from gpuledger.core.queues.waiting import Waiting
from gpuledger.names import (
    DEVICE_INDICES_ANNOTATION,
    GPU_RESOURCE,
    PLACEMENT_ANNOTATION,
    RESERVATION_ID_KEY,
    SCHEDULING_GATE,
    VISIBLE_DEVICES_ANNOTATION,
    WAITING_ANNOTATION,
)
from gpuledger.service.ledger_service import AdmitCall, LedgerService, ReservationState
from gpuledger.sync.cluster_sync import ClusterSync
from gpuledger.sync.config import SyncConfig
from gpuledger.sync.placer import placement_patch, required_node
from gpuledger.sync.targets import LocalLedgerTarget

pytestmark = pytest.mark.e2e

KEY = b"placer-test-key"


def test_required_node_ands_the_node_into_every_term_and_keeps_what_was_there():
    theirs = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [theirs, {}]}}
    affinity = {"podAntiAffinity": {"x": 1}, "nodeAffinity": required}
    out = required_node(affinity, "n1")
    terms = out["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    mine = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
    assert terms == [{"matchExpressions": [*theirs["matchExpressions"], mine]}, {"matchExpressions": [mine]}]
    assert out["podAntiAffinity"] == {"x": 1} and affinity["nodeAffinity"] is not out["nodeAffinity"]
    fields = required_node(None, "n1", "metadata.name")["nodeAffinity"]
    assert fields["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]


@pytest.fixture(scope="module")
def scheduler(apiserver):
    with KubeScheduler(apiserver) as running:
        yield running


@pytest.fixture
def pool(apiserver):
    """Two 8-GPU nodes of a pool of their own (the requests select it), and the namespace its pods use."""
    tag = uuid.uuid4().hex[:6]
    nodes = [make_node(f"pool-{tag}-{i}", "s-pool", f"leaf-pool-{tag}") for i in range(2)]
    for n in nodes:
        n["metadata"]["labels"]["pool"] = tag
    create_nodes(apiserver.api_client(), nodes)
    namespace = apiserver.create_namespace(f"placer-{tag}", admission=False)
    yield tag, [n["metadata"]["name"] for n in nodes], namespace
    apiserver.force_delete("pods", namespace=namespace)
    apiserver.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    for n in nodes:
        apiserver.kubectl("delete", "node", n["metadata"]["name"], "--wait=false", check=False)


@pytest.fixture
def ledger(apiserver, pool):
    service = LedgerService(LedgerConfig(placement_key=KEY, default_strategy="best_fit"), None)
    target = LocalLedgerTarget(service)
    sync = ClusterSync(apiserver.api_client(), target, SyncConfig(batch_linger_s=0.01)).start()
    assert sync.wait_synced(60)
    yield service, sync
    sync.stop()


def filler(node: str, name: str) -> dict:
    """A pod bound to `node` holding all of its 8 GPUs (as a device-plugin pod would: counted by request)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "x", "resources": {"limits": {GPU_RESOURCE: "8"}}}],
        },
    }


def gated(name: str, namespace: str, answer: Waiting) -> dict:
    ticket = WaitTicket(answer.request, answer.arrival, Binding(namespace, name))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {WAITING_ANNOTATION: encode_waiting(ticket, KEY)}},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "containers": [{"name": "main", "image": "x"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "Exists"}]}]
                    }
                }
            },
        },
    }


def admit_waiting(service: LedgerService, tag: str, rid: str, gpus: int = 8) -> Waiting:
    req = Request(id=rid, gpus=gpus, node_selector=(("pool", tag),))
    [answer] = service.admit([AdmitCall(req, may_wait=True)], 1000.0)  # (the sync is idle: pool full)
    assert isinstance(answer, Waiting), answer
    return answer


def test_a_waiting_pod_is_placed_when_gpus_free_and_the_scheduler_binds_it(
    apiserver, scheduler, pool, ledger
):
    tag, nodes, namespace = pool
    service, sync = ledger
    for i, node in enumerate(nodes):
        apiserver.apply(
            {**filler(node, f"fill-{i}"), "metadata": {"name": f"fill-{i}", "namespace": namespace}}
        )
    apiserver.wait_for(lambda: service.ledger.index.nodes[nodes[1]].whole_free == 0, what="the pool full")
    answer = admit_waiting(service, tag, "wait-1")
    assert answer.message.startswith("waiting for 8 GPUs on one node; 1st in line")
    pod = gated("waiter", namespace, answer)
    pod["metadata"]["namespace"] = namespace
    apiserver.apply(pod)
    apiserver.wait_for(lambda: service.ledger.waiting_count() == 1, what="the pod in line")
    assert sync.target.place_waiting(sync.identity) == []  # nothing freed yet

    apiserver.force_delete("pods", "fill-1", namespace=namespace)

    def placed():
        p = apiserver.get_json("pod", "waiter", "-n", namespace)
        return p if p["spec"].get("nodeName") else None

    stored = apiserver.wait_for(placed, timeout=30, what="the waiting pod bound by kube-scheduler")
    assert stored["spec"]["nodeName"] == nodes[1]
    assert not stored["spec"].get("schedulingGates")
    annotations = stored["metadata"]["annotations"]
    placement = decode_placement(annotations[PLACEMENT_ANNOTATION], KEY)
    assert isinstance(placement, Placement) and placement.node == nodes[1] and placement.id == "wait-1"
    assert stored["metadata"]["labels"][RESERVATION_ID_KEY] == "wait-1"
    assert annotations[DEVICE_INDICES_ANNOTATION] == ",".join(map(str, placement.devices))
    assert annotations[VISIBLE_DEVICES_ANNOTATION]
    apiserver.wait_for(
        lambda: service.ledger.state_of("wait-1") == ReservationState.CONFIRMED,
        what="the reservation confirmed by the stored pod",
    )
    assert service.ledger.waiting_count() == 0
    assert sync.placer.stats.placed == 1


def test_a_waiting_pod_deleted_leaves_no_trace(apiserver, pool, ledger):
    tag, nodes, namespace = pool
    service, _ = ledger
    for i, node in enumerate(nodes):
        apiserver.apply(
            {**filler(node, f"fill-{i}"), "metadata": {"name": f"fill-{i}", "namespace": namespace}}
        )
    apiserver.wait_for(lambda: service.ledger.index.nodes[nodes[1]].whole_free == 0, what="the pool full")
    answer = admit_waiting(service, tag, "wait-gone")
    pod = gated("gone", namespace, answer)
    pod["metadata"]["namespace"] = namespace
    apiserver.apply(pod)
    apiserver.wait_for(lambda: service.ledger.waiting_count() == 1, what="the pod in line")
    apiserver.kubectl("delete", "pod", "gone", "-n", namespace, "--wait=true")
    apiserver.wait_for(lambda: service.ledger.waiting_count() == 0, what="the pod out of line")
    assert "wait-gone" not in service.ledger.reservations()
    assert service.status()["waiting"] == 0


def test_the_patch_tests_the_pod_and_the_gate_before_it_changes_anything():
    from gpuledger.service.ledger_service import PlacedPod

    pod = {
        "metadata": {"uid": "u1", "annotations": {"a": "b"}},
        "spec": {"schedulingGates": [{"name": "x"}, {"name": SCHEDULING_GATE}]},
    }
    placed = PlacedPod(
        "ns", "p", "u1", "r1", "n1", {PLACEMENT_ANNOTATION: "{}"}, {RESERVATION_ID_KEY: "r1"}, 3.0
    )
    ops = placement_patch(pod, placed)
    assert ops[:2] == [
        {"op": "test", "path": "/metadata/uid", "value": "u1"},
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": SCHEDULING_GATE},
    ]
    assert ops[-1] == {"op": "remove", "path": "/spec/schedulingGates/1"}
    assert {"op": "add", "path": "/metadata/labels", "value": {RESERVATION_ID_KEY: "r1"}} in ops
    assert json.dumps(ops)  # plain JSON
    with pytest.raises(ValueError, match=SCHEDULING_GATE):
        placement_patch({"metadata": {}, "spec": {}}, placed)
