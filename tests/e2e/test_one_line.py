"""GPUWorkloads and bare pods wait in one line, the ledger's, through the real path: `gpuledger controller` as
its own process creates each workload's Job at once (when_full wait, the default); the real Job controller
makes its pods; the webhook admits them gated with a ticket, as it does any pod; the ledger places them in
priority then arrival order, whoever created them, and kube-scheduler binds them. A workload shows its pods'
place in that line. Killing the controller with SIGKILL changes neither the line nor what is placed.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from gpuledger.names import WORKLOAD_UID_LABEL
from tests.cli.conftest import run_cli
from tests.e2e import test_gpuworkloads, test_waiting_pods
from tests.e2e.test_waiting_pods import bare_pods, fill, gated, ledger_line, no_device_twice, waiting_rows

# the fixtures this module shares: the controller as its own process, the webhook waiting when full
controllers = test_gpuworkloads.controllers
line = test_waiting_pods.line
waiting_stack = test_waiting_pods.waiting_stack
apiserver = test_waiting_pods.apiserver
gpu_nodes = test_waiting_pods.gpu_nodes
stack = test_waiting_pods.stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"


def submit(apiserver, namespace: str, name: str, priority: int, gpus: int = 8) -> str:
    """A GPUWorkload of one pod, anywhere in the cluster; returns its uid."""
    obj = {
        "apiVersion": "agentaflow.io/v1",
        "kind": "GPUWorkload",
        "metadata": {"name": name},
        "spec": {
            "priority": priority,
            "gpuRequirements": {"gpuCount": gpus},
            "podTemplate": {"spec": {"containers": [{"name": "main", "image": IMAGE}]}},
        },
    }
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    got = apiserver.wait_for(
        lambda: apiserver.get_json("gpuworkloads.agentaflow.io", name, "-n", namespace),
        what=f"GPUWorkload {name}",
    )
    return got["metadata"]["uid"]


def workload_pods(line, uid: str) -> list[dict]:
    return line.pods(f"{WORKLOAD_UID_LABEL}={uid}")


def wait_gated(apiserver, line, uid: str) -> str:
    """Until the workload's one pod waits gated in the line; its name."""

    def waiting():
        pods = workload_pods(line, uid)
        return pods[0]["metadata"]["name"] if len(pods) == 1 and gated(pods[0]) else None

    return apiserver.wait_for(waiting, timeout=60, what=f"the pod of workload {uid} gated")


def statuses(apiserver, namespace: str) -> dict[str, dict]:
    items = apiserver.get_json("gpuworkloads.agentaflow.io", "-n", namespace)["items"]
    return {o["metadata"]["name"]: o.get("status") or {} for o in items}


def wait_positions(apiserver, namespace: str, expected: dict[str, int]) -> dict[str, dict]:
    def shown():
        got = statuses(apiserver, namespace)
        seen = {
            n: (
                got.get(n, {}).get("phase"),
                got.get(n, {}).get("reason"),
                got.get(n, {}).get("queuePosition"),
            )
            for n in expected
        }
        return got if seen == {n: ("Queued", "WaitingInLine", p) for n, p in expected.items()} else None

    try:
        return apiserver.wait_for(shown, timeout=60, interval=0.3, what=f"workloads in line at {expected}")
    except TimeoutError as err:
        raise TimeoutError(f"{err}\n{json.dumps(statuses(apiserver, namespace), indent=1)}") from None


def my_line(stack, namespace: str) -> list[str]:
    """The pods of this namespace in the ledger's line, first first."""
    return [r["pod"].split("/", 1)[1] for r in waiting_rows(stack) if r["pod"].startswith(f"{namespace}/")]


def cli_positions(apiserver, namespace: str) -> dict[str, int | None]:
    shown = json.loads(
        run_cli("workloads", "--kubeconfig", apiserver.kubeconfig, "-n", namespace, "-o", "json").out
    )
    return {r["name"]: r["queuePosition"] for r in shown["items"] if r["phase"] in ("Queued", "Waiting")}


def test_gpuworkloads_and_bare_pods_are_placed_in_one_order(apiserver, line, waiting_stack, controllers):
    ns = line.namespace
    fills = fill(line)
    ctl = controllers("one-line", "--when-full", "wait")
    apiserver.wait_for(ctl.is_leader, timeout=90, what="the controller to lead")
    # interleaved arrivals on a full cluster, each one in line before the next comes
    pod_of: dict[str, str] = {}
    pod_of["wl-a"] = wait_gated(apiserver, line, submit(apiserver, ns, "wl-a", 0))
    line.apply(bare_pods(["pod-b"]))
    pod_of["pod-b"] = "pod-b"
    line.apply(bare_pods(["pod-c"], annotations={"agentaflow.gpu/priority": "high"}))
    pod_of["pod-c"] = "pod-c"
    pod_of["wl-d"] = wait_gated(apiserver, line, submit(apiserver, ns, "wl-d", 100))
    pod_of["wl-e"] = wait_gated(apiserver, line, submit(apiserver, ns, "wl-e", 0))
    apiserver.wait_for(lambda: gated(line.pod("pod-b")) and gated(line.pod("pod-c")), what="bare pods wait")
    # priority, then arrival, whoever created them
    order = ["pod-c", "wl-d", "wl-a", "pod-b", "wl-e"]
    assert [r["pod"].split("/", 1)[1] for r in ledger_line(apiserver, waiting_stack, ns, 5)] == [
        pod_of[k] for k in order
    ]
    wait_positions(apiserver, ns, {"wl-d": 2, "wl-a": 3, "wl-e": 5})
    assert cli_positions(apiserver, ns) == {
        "wl-a": 3,
        "wl-d": 2,
        "wl-e": 5,
        **{pod_of[k]: i + 1 for i, k in enumerate(order)},
    }
    # GPUs free one node at a time: the next in that one order takes it, the rest wait
    for n, key in enumerate(order):
        apiserver.force_delete("pod", fills[n], namespace=ns)
        apiserver.wait_for(
            lambda key=key: not gated(line.pod(pod_of[key])), timeout=30, what=f"{key} released"
        )
        time.sleep(0.5)
        assert all(gated(line.pod(pod_of[k])) for k in order[n + 1 :]), (key, my_line(waiting_stack, ns))
    apiserver.wait_for(
        lambda: all(statuses(apiserver, ns)[n].get("phase") == "Running" for n in ("wl-a", "wl-d", "wl-e")),
        timeout=30,
        what="every workload Running",
    )
    no_device_twice(waiting_stack, line.pods())


def test_the_line_survives_the_controller_killed(apiserver, line, waiting_stack, controllers):
    ns = line.namespace
    fills = fill(line)
    first = controllers("c1", "--when-full", "wait")
    apiserver.wait_for(first.is_leader, timeout=90, what="the first controller to lead")
    uids = {name: submit(apiserver, ns, name, prio) for name, prio in (("w0", 0), ("w1", 0), ("w2", 100))}
    pod_of = {name: wait_gated(apiserver, line, uid) for name, uid in uids.items()}
    line.apply(bare_pods(["bare"]))
    apiserver.wait_for(lambda: gated(line.pod("bare")), what="the bare pod waits")
    order = ["w2", "w0", "w1"]
    before = [r["pod"].split("/", 1)[1] for r in ledger_line(apiserver, waiting_stack, ns, 4)]
    assert before[:3] == [pod_of[k] for k in order] and before[3] == "bare"
    wait_positions(apiserver, ns, {"w2": 1, "w0": 2, "w1": 3})
    shown = cli_positions(apiserver, ns)
    # GPUs free while the controller is dead: the ledger places the first in line, without it
    first.kill()
    apiserver.force_delete("pod", fills[0], namespace=ns)
    apiserver.wait_for(lambda: not gated(line.pod(pod_of["w2"])), timeout=30, what="w2 released")
    second = controllers("c2", "--when-full", "wait")
    apiserver.wait_for(second.is_leader, timeout=90, what="the second controller to take the Lease")
    # the same order after the restart: w2 placed (Running), the rest one place up
    got = wait_positions(apiserver, ns, {"w0": 1, "w1": 2})
    apiserver.wait_for(
        lambda: statuses(apiserver, ns)["w2"].get("phase") == "Running", timeout=30, what="w2 Running"
    )
    assert my_line(waiting_stack, ns) == before[1:]
    assert cli_positions(apiserver, ns) == {
        k: v - 1 for k, v in shown.items() if k not in ("w2", pod_of["w2"])
    }
    # nothing started twice, nothing lost
    for name, uid in uids.items():
        assert got[name].get("attempts") == 1 or name == "w2", got[name]
        assert len(apiserver.get_json("jobs", "-n", ns, "-l", f"{WORKLOAD_UID_LABEL}={uid}")["items"]) == 1
        assert len(workload_pods(line, uid)) == 1
    apiserver.force_delete("pod", fills[1], namespace=ns)
    apiserver.wait_for(lambda: not gated(line.pod(pod_of["w0"])), timeout=30, what="w0 released")
    time.sleep(1.0)
    assert gated(line.pod(pod_of["w1"])) and gated(line.pod("bare"))  # one node freed: one pod, once
    assert statuses(apiserver, ns)["w2"]["attempts"] == 1
    no_device_twice(waiting_stack, line.pods())
