"""GPU pods that do not fit now wait, in order, and are placed the moment GPUs free, through the real path:
kubectl as a user -> the real kube-apiserver -> the webhook (TLS) -> the Ray ledger actor; the cluster sync
and its placement adapter write the placement and remove the gate; the real kube-scheduler binds the pod to
the one node the ledger chose. The sample cluster: 16 nodes x 8 GPUs (128 GPUs).
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from devcluster.cluster import ControlPlane
from devcluster.nodes import create_nodes
from devcluster.scheduler import KubeScheduler
from devcluster.stack import Stack, e2e_webhook_config, placements_by_device
from gpuledger.names import SCHEDULING_GATE, WAITING_ANNOTATION
from tests.cli.conftest import run_cli
from tests.conftest import require_binaries
from tests.e2e.conftest import SAMPLE_NODES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GPUS = 128
IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"


# A control plane, sample cluster and stack of this module's own (tests/e2e/test_one_line.py shares the
# fixtures): the line is the whole cluster's, so pods that earlier modules leave in a shared cluster, placed
# or waiting, would stand in it and take the GPUs these tests count on.
@pytest.fixture(scope="module")
def apiserver():
    require_binaries()
    with ControlPlane() as cp:
        yield cp


@pytest.fixture(scope="module")
def gpu_nodes(apiserver):
    create_nodes(apiserver.api_client(), SAMPLE_NODES)
    return SAMPLE_NODES


@pytest.fixture(scope="module")
def stack(apiserver, gpu_nodes):
    with Stack(apiserver, config=e2e_webhook_config(when_full="refuse")) as running:
        yield running


@pytest.fixture(scope="module")
def waiting_stack(apiserver, stack, gpu_nodes):
    """The shared stack with its webhook at the product's default (a pod that does not fit waits), and
    kube-scheduler running: it binds the pods the placement adapter releases."""
    stack.reconfigure(when_full="wait")
    with KubeScheduler(apiserver):
        yield stack
    stack.reconfigure(when_full="refuse")


@pytest.fixture
def line(apiserver, waiting_stack, workloads):
    """The test's namespace, once the shared cluster's 128 GPUs are all free (earlier tests drained)."""

    def free() -> bool:
        nodes = waiting_stack.call("snapshot")["nodes"]
        return sum(1 for n in nodes.values() for d in n["devices"] if d[3] is None and not d[4]) >= GPUS

    apiserver.wait_for(free, timeout=90, what="the sample cluster's GPUs all free")
    return workloads


def bare_pods(names: list[str], gpus: int = 8, annotations: dict | None = None) -> str:
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "annotations": {"topology.scheduler/gpu-count": str(gpus), **(annotations or {})},
            },
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": IMAGE}]},
        }
        for name in names
    ]
    return yaml.safe_dump_all(pods)


def job(name: str, pods: int, gpus: int = 8, annotations: dict | None = None, gang: bool = False) -> str:
    meta: dict = {"name": name, "annotations": dict(annotations or {})}
    template_annotations = {}
    if gang:
        meta["annotations"]["topology.scheduler/gpu-count"] = str(pods * gpus)  # the gang's total
    else:
        template_annotations["topology.scheduler/gpu-count"] = str(gpus)
    return yaml.safe_dump(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "template": {
                    "metadata": {"labels": {"job": name}, "annotations": template_annotations},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": IMAGE}]},
                },
            },
        }
    )


def gated(pod: dict) -> bool:
    return any(g.get("name") == SCHEDULING_GATE for g in pod["spec"].get("schedulingGates") or [])


def waiting_of(line, selector: str) -> int:
    return sum(1 for p in line.pods(selector) if gated(p))


def waiting_rows(stack) -> list[dict]:
    return [r for r in stack.call("waiting_line", 200) if not r["placing"]]


def ledger_line(apiserver, stack, namespace: str, count: int, timeout: float = 30) -> list[dict]:
    """The ledger's line of `namespace` once it holds `count` pods: the ledger learns of a gated pod from the
    sync's watch, a moment after the API server stores it (a loaded machine widens that moment)."""

    def held():
        rows = [r for r in waiting_rows(stack) if r["pod"].startswith(f"{namespace}/")]
        return rows if len(rows) == count else None

    return apiserver.wait_for(held, timeout=timeout, what=f"the ledger's line holding {count} of {namespace}")


def fill(line, count: int = 16) -> list[str]:
    names = [f"fill-{i}" for i in range(count)]
    line.apply(bare_pods(names))
    pods = line.wait_pods(count)
    line.wait_confirmed([p for p in pods if p["metadata"]["name"] in names])
    return names


def no_device_twice(stack, pods: list[dict]) -> None:
    twice = {k: v for k, v in placements_by_device(stack, pods).items() if len(v) > 1}
    assert not twice, twice


def test_a_job_larger_than_the_cluster_runs_16_and_the_rest_wait_in_order(apiserver, line, waiting_stack):
    line.apply(job("big", 20))
    pods = line.wait_pods(20, "job=big")
    placed = [p for p in pods if line.placement(p) is not None]
    waiting = [p for p in pods if gated(p)]
    assert (len(placed), len(waiting)) == (16, 4), [p["metadata"]["name"] for p in pods]
    assert all(WAITING_ANNOTATION in p["metadata"]["annotations"] for p in waiting)
    mine = ledger_line(apiserver, waiting_stack, line.namespace, 4)
    assert [r["position"] for r in mine] == [1, 2, 3, 4]
    first = mine[0]["pod"].split("/", 1)[1]
    # the operator's CLI shows the same line, from the pods alone
    shown = json.loads(
        run_cli("workloads", "--kubeconfig", apiserver.kubeconfig, "-n", line.namespace, "-o", "json").out
    )
    in_line = sorted((r for r in shown["items"] if r["phase"] == "Waiting"), key=lambda r: r["queuePosition"])
    assert [(f"{line.namespace}/{r['name']}", r["queuePosition"]) for r in in_line] == [
        (r["pod"], r["position"]) for r in mine
    ]
    status = json.loads(run_cli("status", "--kubeconfig", apiserver.kubeconfig, "-o", "json").out)
    assert [r["name"] for r in status["waiting"] if r["namespace"] == line.namespace] == [
        r["pod"].split("/", 1)[1] for r in mine
    ]
    events = apiserver.get_json("events", "-n", line.namespace)["items"]
    said = [e["message"] for e in events if e.get("reason") == "GPUWaiting"]
    assert any("waiting for 8 GPUs on one node" in m and "in line" in m for m in said), said
    # a running pod goes: the first in line takes its GPUs, the gate removed, kube-scheduler binds it there
    victim = placed[0]["metadata"]["name"]
    freed = line.placement(placed[0]).node
    started = time.monotonic()
    apiserver.force_delete("pod", victim, namespace=line.namespace)

    def released():
        pod = line.pod(first)
        return pod if not gated(pod) and line.placement(pod) is not None else None

    pod = apiserver.wait_for(released, timeout=30, interval=0.05, what=f"{first} released")
    took = time.monotonic() - started
    print(f"first waiting pod released {took:.2f}s after a running pod was deleted")
    assert took < 5.0
    assert line.placement(pod).node == freed
    bound = apiserver.wait_for(
        lambda: line.pod(first)["spec"].get("nodeName"), timeout=30, what=f"{first} bound by kube-scheduler"
    )
    assert bound == freed
    no_device_twice(waiting_stack, line.pods())
    # the Job replaced the deleted pod: the replacement waits at the end of the line
    apiserver.wait_for(lambda: len(line.pods("job=big")) >= 20, what="the Job's replacement pod")
    apiserver.wait_for(lambda: waiting_of(line, "job=big") == 4, what="the replacement gated")
    rows = ledger_line(apiserver, waiting_stack, line.namespace, 4)
    assert [r["position"] for r in rows] == [1, 2, 3, 4] and rows[0]["pod"] == mine[1]["pod"]


def test_a_gang_waits_whole_and_starts_whole(apiserver, line, waiting_stack):
    fills = fill(line)
    line.apply(job("gang", 4, gang=True))
    pods = line.wait_pods(4, "job=gang")
    apiserver.wait_for(lambda: all(gated(p) for p in line.pods("job=gang")), what="the gang gated")
    for name in fills[:3]:  # three nodes free: not enough for a gang of four whole nodes
        apiserver.force_delete("pod", name, namespace=line.namespace)
    time.sleep(1.0)  # (a pass runs on each deletion: give it the chance to place a part, which it must not)
    assert all(gated(p) for p in line.pods("job=gang"))
    apiserver.force_delete("pod", fills[3], namespace=line.namespace)

    def whole():
        now = line.pods("job=gang")
        return now if all(not gated(p) and line.placement(p) is not None for p in now) else None

    pods = apiserver.wait_for(whole, timeout=30, what="the whole gang released")
    assert len({line.placement(p).node for p in pods}) == 4
    assert {line.placement(p).group for p in pods} == {f"job/{line.namespace}/gang"}
    no_device_twice(waiting_stack, line.pods())


def test_a_later_higher_priority_job_goes_first(apiserver, line, waiting_stack):
    fills = fill(line)
    line.apply(job("early", 2))
    apiserver.wait_for(lambda: waiting_of(line, "job=early") == 2, what="early waits")
    line.apply(job("urgent", 2, annotations={"agentaflow.gpu/priority": "high"}))
    apiserver.wait_for(lambda: waiting_of(line, "job=urgent") == 2, what="urgent waits")
    rows = ledger_line(apiserver, waiting_stack, line.namespace, 4)
    assert [r["priority"] for r in rows] == [100, 100, 0, 0]
    for name in fills[:2]:
        apiserver.force_delete("pod", name, namespace=line.namespace)
    apiserver.wait_for(
        lambda: all(not gated(p) for p in line.pods("job=urgent")), timeout=30, what="urgent released"
    )
    assert all(gated(p) for p in line.pods("job=early"))
    no_device_twice(waiting_stack, line.pods())


def test_a_bare_pod_waits_and_starts_by_itself(apiserver, line, waiting_stack):
    fills = fill(line)
    out = line.apply(bare_pods(["alone"], gpus=4))
    assert "waiting for 4 GPUs on one node" in out.stderr  # kubectl shows the webhook's warning
    assert gated(line.pod("alone"))
    apiserver.force_delete("pod", fills[5], namespace=line.namespace)
    node = apiserver.wait_for(
        lambda: line.pod("alone")["spec"].get("nodeName"), timeout=30, what="the bare pod bound"
    )
    assert line.placement("alone").node == node


def test_the_line_survives_the_ledger_actor_killed(apiserver, line, waiting_stack):
    fills = fill(line)
    line.apply(bare_pods(["w-0", "w-1", "w-2"], gpus=8))
    apiserver.wait_for(lambda: sum(gated(p) for p in line.pods()) == 3, what="three waiting")
    before = [r["pod"] for r in ledger_line(apiserver, waiting_stack, line.namespace, 3)]
    assert before == [f"{line.namespace}/w-{i}" for i in range(3)]
    incarnation = waiting_stack.kill_ledger()
    waiting_stack.wait_ledger_synced(after_incarnation=incarnation)
    after = [r["pod"] for r in waiting_rows(waiting_stack) if r["pod"].startswith(f"{line.namespace}/")]
    assert after == before  # the line rebuilt from the gated pods, in the same order
    apiserver.force_delete("pod", fills[0], namespace=line.namespace)
    apiserver.wait_for(lambda: not gated(line.pod("w-0")), timeout=60, what="the first released")
    time.sleep(1.0)
    assert gated(line.pod("w-1")) and gated(line.pod("w-2"))  # one node freed: one pod, once
    no_device_twice(waiting_stack, line.pods())
