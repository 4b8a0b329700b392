"""The demo's second part: a full cluster. Pods that do not fit are admitted and wait `SchedulingGated` in
the ledger's one line (priority, then arrival); when GPUs free, the first in line is placed, its gate removed,
and kube-scheduler binds it to the node the ledger chose."""

from __future__ import annotations

from devcluster.binaries import ControlPlaneError
from devcluster.demo_shell import DemoShell, empty_namespace, wait
from devcluster.kubeclient import KubeClient
from devcluster.users import ALICE
from gpuledger.names import SCHEDULING_GATE

IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
NODES = 16
# submitted in this order; `urgent` comes last but is first in line (priority, then arrival)
WAITERS = (("wait-a", None), ("wait-b", None), ("urgent", "high"))
LINE = ("urgent", "wait-a", "wait-b")


def _pod(name: str, role: str, priority: str | None = None) -> dict:
    annotations = {"agentaflow.gpu/priority": priority} if priority else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"role": role}, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "main", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "8"}}}
            ],
        },
    }


def gated(pod: dict) -> bool:
    return any(g.get("name") == SCHEDULING_GATE for g in pod["spec"].get("schedulingGates") or [])


def running_on_node(pod: dict) -> bool:
    return bool(pod["spec"].get("nodeName")) and (pod.get("status") or {}).get("phase") == "Running"


def run_line(kube: KubeClient, stack, shell: DemoShell, namespace: str) -> None:
    shell.heading(
        2,
        "A full cluster: pods wait in one line and start in order",
        f"{NODES} pods of 8 GPUs fill the {NODES} nodes. Three more are admitted and wait, gated, in the "
        "ledger's line:\npriority first, then arrival. When GPUs free, the first in line is placed and "
        "kube-scheduler binds it.",
    )
    busy = [_pod(f"busy-{i}", "busy") for i in range(NODES)]
    shell.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        str(shell.write("busy.yaml", busy)),
        as_user=ALICE,
        shown=f"kubectl apply -n {namespace} -f busy.yaml   # {NODES} pods x 8 GPUs",
    )
    wait(
        kube,
        lambda: sum(running_on_node(p) for p in kube.pods(namespace, "role=busy")) == NODES,
        f"{NODES} busy pods bound and running",
        pods=lambda: [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in kube.pods(namespace)],
    )
    waiters = [_pod(name, "waiting", priority) for name, priority in WAITERS]
    shell.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        str(shell.write("waiting.yaml", waiters)),
        as_user=ALICE,
        shown=f"kubectl apply -n {namespace} -f waiting.yaml   # wait-a, wait-b, then urgent (priority high)",
    )
    wait(
        kube,
        lambda: sum(gated(p) for p in kube.pods(namespace, "role=waiting")) == len(WAITERS),
        f"{len(WAITERS)} pods admitted and gated",
        pods=lambda: [(p["metadata"]["name"], gated(p)) for p in kube.pods(namespace, "role=waiting")],
    )
    shell.kubectl("get", "pods", "-n", namespace, "-l", "role=waiting")
    out = shell.gpuledger("queues")
    line = [
        row.split()[3] for row in out.split("PODS WAITING FOR GPUS", 1)[-1].splitlines()[2:] if row.split()
    ]
    if tuple(line) != LINE:
        raise ControlPlaneError(f"the line should be {LINE}, `gpuledger queues` shows {line}:\n{out}")

    shell.say("Two running pods end; their two nodes free, and the first two in line start there:\n")
    freed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in kube.pods(namespace, "role=busy")}
    shell.kubectl("delete", "pod", "-n", namespace, "busy-0", "busy-1", "--wait=false", as_user=ALICE)

    def started():
        pods = {p["metadata"]["name"]: p for p in kube.pods(namespace, "role=waiting")}
        return pods if all(running_on_node(pods[n]) for n in LINE[:2]) else None

    pods = wait(
        kube,
        started,
        f"{LINE[0]} and {LINE[1]} bound and running",
        pods=lambda: [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in kube.pods(namespace)],
    )
    if not gated(pods[LINE[2]]):
        raise ControlPlaneError(f"{LINE[2]} should still wait: {pods[LINE[2]]['spec']}")
    on = {pods[n]["spec"]["nodeName"] for n in LINE[:2]}
    if on != {freed["busy-0"], freed["busy-1"]}:
        raise ControlPlaneError(f"{LINE[:2]} should run on the freed nodes {sorted(freed.values())}: {on}")
    shell.kubectl(
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        "role=waiting",
        "-o",
        "custom-columns=NAME:.metadata.name,STATUS:.status.phase,NODE:.spec.nodeName",
    )
    shell.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={LINE[0]},reason=Scheduled",
        "-o",
        "custom-columns=FROM:.reportingComponent,MESSAGE:.message",
    )
    empty_namespace(kube, stack, namespace)
