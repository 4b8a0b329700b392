"""`gpuledger queues` and the queues section of `gpuledger status` against the real kube-apiserver: two
GPUQueues served by the installed CRD, GPU Jobs placed by the real webhook in their namespaces, and a pod
waiting for GPUs in one of them.

The waiting pod stands in a namespace of the queue that is not opted in to admission, written as the ledger
writes a waiting pod (the scheduling gate and the ticket the service encodes): the shared cluster is not
filled here to make a real one wait (tests/e2e/test_waiting_pods.py does, and checks `gpuledger workloads`
reads that line); what is under test is the CLI's read of it, through the API, into its queue.
"""

from __future__ import annotations

import uuid

import pytest

from gpuledger import client
from gpuledger.core.model import Request
from gpuledger.core.pods.placement_codec import Binding
from gpuledger.core.pods.waiting_codec import WaitTicket, encode_waiting
from gpuledger.names import SCHEDULING_GATE, WAITING_ANNOTATION
from tests.cli.test_cli_e2e import placed_pods

pytestmark = pytest.mark.e2e

QUEUE_API_VERSION = "gpuledger.io/v1alpha1"


def gpu_queue(name: str, key: str, value: str, spec: dict) -> dict:
    return {
        "apiVersion": QUEUE_API_VERSION,
        "kind": "GPUQueue",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": {"matchLabels": {key: value}}, **spec},
    }


@pytest.fixture
def teams(apiserver, gpu_crds, stack, namespace):
    """Two GPUQueues selecting namespaces by a label only this test uses: team a (the test's namespace, 1
    GPU of quota), team b (a second opted-in namespace and one that is not, 4 GPUs lending at most 2)."""
    tag = uuid.uuid4().hex[:6]
    key = f"e2e-queue-{tag}"
    a, b = f"e2e-a-{tag}", f"e2e-b-{tag}"
    b_placed, b_waiting = f"{namespace[:40]}-b", f"{namespace[:40]}-bw"
    apiserver.create_namespace(b_placed)
    apiserver.create_namespace(b_waiting, admission=False)
    for ns, value in ((namespace, "a"), (b_placed, "b"), (b_waiting, "b")):
        apiserver.kubectl("label", "namespace", ns, f"{key}={value}")
    apiserver.apply(
        [
            gpu_queue(a, key, "a", {"quotas": [{"gpus": 1}], "weight": 2}),
            gpu_queue(b, key, "b", {"quotas": [{"gpus": 4, "lendingLimit": 2}]}),
        ]
    )
    yield {"a": (a, [namespace]), "b": (b, [b_placed, b_waiting])}
    apiserver.kubectl("delete", "gpuqueues", a, b, "--ignore-not-found", check=False)
    for ns in (b_placed, b_waiting):
        apiserver.force_delete("pods", namespace=ns)
        apiserver.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def waiting_pod(namespace: str, name: str, gpus: int) -> dict:
    req = Request(id=f"{namespace}-{name}", gpus=gpus, priority=100, namespace=namespace, name=name)
    ticket = encode_waiting(WaitTicket(req, 1.0, Binding(namespace, name)), b"a-key-the-cli-never-holds")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": {WAITING_ANNOTATION: ticket}},
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE}],
            "containers": [{"name": "main", "image": "busybox"}],
        },
    }


def test_queues_shows_each_queues_quota_use_borrowing_and_waiting_pods(apiserver, teams, cli):
    (a, a_namespaces), (b, b_namespaces) = teams["a"], teams["b"]
    kube = apiserver.api_client()
    client.create_gpu_job("a-two", "busybox", 2, namespace=a_namespaces[0], kube=kube)
    client.create_gpu_job("b-one", "busybox", 1, namespace=b_namespaces[0], kube=kube)
    placed_pods(apiserver, a_namespaces[0], 1)
    placed_pods(apiserver, b_namespaces[0], 1)
    apiserver.apply(waiting_pod(b_namespaces[1], "b-waits", 2))

    result = cli("queues", "-o", "json")
    assert result.code == 0, result.err
    rows = {q["name"]: q for q in result.json()["items"]}
    qa, qb = rows[a], rows[b]
    # team a holds 2 GPUs on a quota of 1: it borrows 1 and has nothing to lend
    assert (qa["quota"], qa["used"], qa["borrowed"], qa["lendable"]) == (1, 2, 1, 0)
    assert qa["weight"] == 2 and qa["parent"] is None and qa["namespaces"] == a_namespaces
    assert qa["quotas"] == [
        {
            "product": "any",
            "gpus": 1,
            "borrowingLimit": None,
            "lendingLimit": None,
            "used": 2,
            "borrowed": 1,
            "lendable": 0,
        }
    ]
    assert qa["share"] > 0 and qa["waiting"] == []
    # team b holds 1 of its 4: 3 unused, at most 2 of them lent; its waiting pod is in its line
    assert (qb["quota"], qb["used"], qb["borrowed"], qb["lendable"]) == (4, 1, 0, 2)
    assert qb["share"] == 0 and sorted(qb["namespaces"]) == sorted(b_namespaces)
    assert [(w["namespace"], w["name"], w["gpus"]) for w in qb["waiting"]] == [
        (b_namespaces[1], "b-waits", "2")
    ]
    assert qb["waiting"][0]["waitingFor"] == "2 GPUs on one node" and qb["waiting"][0]["position"] >= 1
    # within quota, team b is served before team a, which borrows
    assert qb["fairOrder"] < qa["fairOrder"]

    # one queue, as a table: the same figures
    table = cli("queues", a)
    assert table.code == 0, table.err
    (row,) = table.table()
    assert (row["NAME"], row["QUOTA"], row["USED"], row["BORROWED"], row["LENDABLE"]) == (
        a,
        "1",
        "2",
        "1",
        "0",
    )
    assert row["WEIGHT"] == "2" and row["NAMESPACES"] == a_namespaces[0]
    text = cli("queues", b).out
    assert "PODS WAITING FOR GPUS 1" in text and "b-waits" in text

    missing = cli("queues", "no-such-queue")
    assert missing.code == 4 and "no-such-queue" in missing.err

    # `gpuledger status` carries the same figures in its queues section
    status = cli("status", "--source", "nodes", "-o", "json")
    assert status.code == 0, status.err
    summary = {q["name"]: q for q in status.json()["queues"]}
    assert (summary[a]["quota"], summary[a]["used"], summary[a]["borrowed"]) == (1, 2, 1)
    assert (summary[b]["quota"], summary[b]["used"], summary[b]["waiting"]) == (4, 1, 1)
    assert "GPU QUEUES" in cli("status", "--source", "nodes").out
