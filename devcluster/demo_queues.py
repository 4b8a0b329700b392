"""The demo's third part: two teams' GPUQueues of 64 GPUs each on the 128. Team A, alone, borrows all of
team B's quota; when team B asks for 64 GPUs, `gpuledger explain` shows the reclaim the ledger would plan
before it happens; then it happens (whole gangs evicted through the Eviction API, Events naming the rule)
and `kubectl get gpuqueues` shows both teams at their quota."""

from __future__ import annotations

import yaml

from devcluster.binaries import ControlPlaneError
from devcluster.demo_shell import DemoShell, wait
from devcluster.kubeclient import KubeClient
from devcluster.kubelet_standin import KubeletStandIn
from devcluster.stack import placements_by_device
from devcluster.users import ALICE
from gpuledger.names import PREEMPTED_REASON, PREEMPTING_REASON, QUEUE_API_VERSION

IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
TEAM_LABEL = "gpuledger-demo/team"
QUOTA = 64
A_JOBS, A_PODS = 8, 2  # eight gangs of 2 pods x 8 GPUs: all 128 GPUs
B_PODS = 8  # one gang of 8 pods x 8 GPUs: team B's whole quota


def queue(team: str) -> dict:
    return {
        "apiVersion": QUEUE_API_VERSION,
        "kind": "GPUQueue",
        "metadata": {"name": f"team-{team}"},
        "spec": {
            "namespaceSelector": {"matchLabels": {TEAM_LABEL: team}},
            "quotas": [{"gpus": QUOTA}],
        },
    }


def gang(name: str, pods: int) -> dict:
    """An Indexed Job of `pods` pods of 8 GPUs, all-or-nothing (gpu-count on the Job)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": {"topology.scheduler/gpu-count": str(pods * 8)}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": 100,  # evicted pods count as failures: the Job makes them again and they wait
            "template": {
                "metadata": {"labels": {"job": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "main", "image": IMAGE}],
                },
            },
        },
    }


def _queues(kube: KubeClient) -> dict[str, dict]:
    return {q["metadata"]["name"]: q.get("status") or {} for q in kube.get_json("gpuqueues")["items"]}


def _at(kube: KubeClient, expected: dict[str, tuple[int, int]]):
    """The GPUQueues' status when each shows (used, borrowed) as expected."""
    got = _queues(kube)
    seen = {n: (got.get(n, {}).get("used"), got.get(n, {}).get("borrowed")) for n in expected}
    return (
        got
        if all(
            _num(u) == e[0] and _num(b) == e[1]
            for (u, b), e in zip(seen.values(), expected.values(), strict=True)
        )
        else None
    )


def _num(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _running(kube: KubeClient, namespace: str, selector: str | None = None) -> list[dict]:
    return [
        p
        for p in kube.pods(namespace, selector)
        if p["spec"].get("nodeName")
        and (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]


def run_queues(kube: KubeClient, stack, shell: DemoShell, kubelet: KubeletStandIn) -> None:
    shell.heading(
        3,
        "Two teams' GPU queues: a reclaim planned, shown, then carried out",
        f"GPUQueues team-a and team-b hold {QUOTA} GPUs of quota each. Team A, alone, runs 128 GPUs: it "
        f"borrows team B's {QUOTA}.\nThen team B asks for its {QUOTA}: the ledger takes back exactly what "
        "was borrowed, whole gangs only.",
    )
    spaces = {}
    for team in ("a", "b"):
        spaces[team] = kube.create_namespace(f"team-{team}", users=(ALICE,))
        kube.kubectl("label", "namespace", spaces[team], f"{TEAM_LABEL}={team}", "--overwrite")
    shell.kubectl(
        "apply",
        "-f",
        str(shell.write("queues.yaml", [queue("a"), queue("b")])),
        shown="kubectl apply -f queues.yaml   # team-a, team-b: 64 GPUs each",
    )
    team_a = [gang(f"train-{i}", A_PODS) for i in range(A_JOBS)]
    shell.kubectl(
        "apply",
        "-n",
        spaces["a"],
        "-f",
        str(shell.write("team-a.yaml", team_a)),
        as_user=ALICE,
        shown=f"kubectl apply -n team-a -f team-a.yaml   # {A_JOBS} Jobs, each a gang of {A_PODS} x 8 GPUs",
    )
    total = A_JOBS * A_PODS
    wait(
        kube,
        lambda: len(_running(kube, spaces["a"])) == total,
        f"team A's {total} pods bound and running",
        pods=lambda: len(_running(kube, spaces["a"])),
    )
    wait(
        kube,
        lambda: _at(kube, {"team-a": (128, QUOTA), "team-b": (0, 0)}),
        "GPUQueue status: team-a at 128",
        queues=lambda: _queues(kube),
    )
    shell.kubectl("get", "gpuqueues")

    shell.say(
        "Before team B submits, `gpuledger explain` runs the admission path offline against a copy of the "
        "cluster\nand shows the reclaim the ledger would plan:\n"
    )
    team_b = [gang("finetune", B_PODS)]
    b_file = shell.write(
        "team-b.yaml", [{**team_b[0], "metadata": {**team_b[0]["metadata"], "namespace": spaces["b"]}}]
    )
    cluster = kube.kubectl("get", "nodes,namespaces,gpuqueues,pods", "-A", "-o", "yaml").stdout
    (shell.workdir / "cluster.yaml").write_text(cluster)
    shell.say("$ kubectl get nodes,namespaces,gpuqueues,pods -A -o yaml > cluster.yaml\n")
    key_file = shell.workdir / "placement-key"
    key_file.write_bytes(stack.config.placement_key())
    out = shell.gpuledger(
        "explain",
        "--cluster",
        "cluster.yaml",
        "--hmac-key-file",
        "placement-key",
        "team-b.yaml",
        "-o",
        "json",
        shown="gpuledger explain --cluster cluster.yaml --hmac-key-file placement-key team-b.yaml",
        echo=False,
    )
    plans = [r["preemption"] for r in yaml.safe_load(out) if r.get("preemption")]
    if not plans or not plans[0]["victims"]:
        raise ControlPlaneError(f"gpuledger explain should show a reclaim for team B's gang:\n{out}")
    plan = plans[0]
    shell.say(f"  {plan['preemptor']} would wait; the ledger would preempt:")
    for victim in plan["victims"]:
        shell.say(f"    {victim['workload']} ({victim['gpus']} GPUs): rule {victim['rule']}: {victim['why']}")
    shell.say("")

    shell.kubectl(
        "apply",
        "-n",
        spaces["b"],
        "-f",
        str(b_file),
        as_user=ALICE,
        shown=f"kubectl apply -n team-b -f team-b.yaml   # a gang of {B_PODS} x 8 GPUs",
    )
    wait(
        kube,
        lambda: len(_running(kube, spaces["b"])) == B_PODS,
        f"team B's {B_PODS} pods placed, bound and running",
        timeout=180,
        team_b=lambda: [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in kube.pods(spaces["b"])],
        evicted=lambda: sorted(kubelet.evicted_in(spaces["a"])),
    )
    evicted = kubelet.evicted_in(spaces["a"], spaces["b"])
    if len(evicted) != QUOTA // 8 or any(not k.startswith(spaces["a"] + "/") for k in evicted):
        raise ControlPlaneError(f"exactly {QUOTA // 8} of team A's pods should be evicted: {sorted(evicted)}")
    doubled = {k: v for k, v in placements_by_device(stack, kube.pods()).items() if len(v) > 1}
    if doubled:
        raise ControlPlaneError(f"GPUs promised twice: {doubled}")
    wait(
        kube,
        lambda: _at(kube, {"team-a": (QUOTA, 0), "team-b": (QUOTA, 0)}),
        "both GPUQueues at quota",
        queues=lambda: _queues(kube),
    )
    wait(
        kube,
        lambda: (
            len(_events(kube, spaces["a"], PREEMPTED_REASON)) == QUOTA // 8
            and _events(kube, spaces["b"], PREEMPTING_REASON)
        ),
        "a Preempted Event for each evicted pod and the preemptor's Preempting Event",
        team_a=lambda: _events(kube, spaces["a"], PREEMPTED_REASON),
    )
    columns = "custom-columns=OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message"
    shell.kubectl(
        "get", "events", "-n", spaces["b"], "--field-selector", f"reason={PREEMPTING_REASON}", "-o", columns
    )
    shell.kubectl(
        "get", "events", "-n", spaces["a"], "--field-selector", f"reason={PREEMPTED_REASON}", "-o", columns
    )
    requeued = A_PODS * (QUOTA // 16)
    wait(
        kube,
        lambda: _num(_queues(kube).get("team-a", {}).get("waiting")) == requeued,
        f"team A's {requeued} evicted pods made again by their Jobs and waiting",
        timeout=120,
        queues=lambda: _queues(kube),
    )
    shell.say("Team A's evicted pods were made again by their Jobs; they wait for GPUs, in team A's queue:\n")
    shell.kubectl("get", "gpuqueues")


def _events(kube: KubeClient, namespace: str, reason: str) -> list[dict]:
    return [e for e in kube.get_json("events", "-n", namespace)["items"] if e.get("reason") == reason]
