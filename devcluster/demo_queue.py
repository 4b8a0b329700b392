"""The demo's queue section: GPUWorkloads that need more GPUs than one node has wait in priority order, and
run as the running ones are deleted. Runs the controller as a subprocess on the demo's Ray ledger; every wait
is bounded and fails naming what it waited for; it never outlives the demo (the controller is stopped)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from devcluster.binaries import REPO, ControlPlaneError, free_port
from devcluster.kubeclient import KubeClient
from devcluster.processes import stop_process
from gpuledger.names import AGENTAFLOW_API_VERSION, AGENTAFLOW_GROUP, GPUWORKLOAD_PLURAL

IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
RESOURCE = f"{GPUWORKLOAD_PLURAL}.{AGENTAFLOW_GROUP}"
GPUS_EACH = 4  # an 8-GPU node runs two at once
# (name, priority), submitted in this order: the lowest priority first, so the queue's order is not age's
WORKLOADS = (("nightly", 0), ("sweep", 1), ("finetune", 5), ("urgent", 10))
WAIT_S = 60.0


class Controller:
    """`python -m gpuledger controller` against this process's Ray and the stack's ledger actor."""

    def __init__(self, kube: KubeClient, stack, namespace: str):
        import ray

        self.log_path = Path(tempfile.mkdtemp(prefix="gpuledger-demo-controller-")) / "controller.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - held open for the process's life
        argv = [
            sys.executable,
            "-m",
            "gpuledger",
            "controller",
            "--kubeconfig",
            str(kube.kubeconfig),
            "--ray-address",
            ray.get_runtime_context().gcs_address,
            "--ray-namespace",
            stack.ray_namespace,
            "--actor-name",
            stack.actor_name,
            "--lease-namespace",
            namespace,
            "--lease-duration",
            "4",
            "--renew-deadline",
            "3",
            "--retry-period",
            "0.5",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(free_port()),
            # the controller's own priority queue (a dry run before each start) is what this section shows;
            # with wait, their pods would wait in the ledger's line in arrival order within a priority
            "--when-full",
            "refuse",
        ]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)

    def log_tail(self, chars: int = 2000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        stop_process(self.proc, grace_s=20)
        self._log.close()


def _workload(name: str, priority: int, node: str) -> dict:
    return {
        "apiVersion": AGENTAFLOW_API_VERSION,
        "kind": "GPUWorkload",
        "metadata": {"name": name},
        "spec": {
            "priority": priority,
            "gpuRequirements": {"gpuCount": GPUS_EACH},
            "podTemplate": {
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "main", "image": IMAGE}],
                }
            },
        },
    }


def _statuses(kube: KubeClient, namespace: str) -> dict[str, dict]:
    return {
        o["metadata"]["name"]: {"priority": o["spec"].get("priority", 0), **(o.get("status") or {})}
        for o in kube.get_json(RESOURCE, "-n", namespace)["items"]
    }


def print_queue(statuses: dict[str, dict], out=sys.stdout) -> None:
    rows = [("WORKLOAD", "PRIORITY", "GPUS", "PHASE", "QUEUE", "REASON")]
    for name, s in sorted(statuses.items(), key=lambda kv: -kv[1]["priority"]):
        position = s.get("queuePosition")
        rows.append(
            (
                name,
                str(s["priority"]),
                str(GPUS_EACH),
                s.get("phase") or "-",
                str(position or "-"),
                s.get("reason") or "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print(
            "  " + "  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1], file=out
        )


def _wait_phases(kube: KubeClient, namespace: str, expected: dict[str, str], ctl: Controller) -> dict:
    """Until every named workload is in its phase (and Queued ones have their position and a settled reason:
    "Next" is a pass's verdict from before the workload ahead of it was placed); pods of deleted workloads are
    confirmed deleted meanwhile, as a kubelet would once their containers stopped."""

    def reached():
        terminating = [
            p["metadata"]["name"] for p in kube.pods(namespace) if p["metadata"].get("deletionTimestamp")
        ]
        if terminating:
            kube.force_delete("pods", *terminating, namespace=namespace)
        got = _statuses(kube, namespace)
        ok = all(
            got.get(n, {}).get("phase") == phase
            and (phase != "Queued" or (got[n].get("queuePosition") and got[n].get("reason") != "Next"))
            for n, phase in expected.items()
        )
        return got if ok and set(got) == set(expected) else None

    try:
        return kube.wait_for(reached, timeout=WAIT_S, interval=0.3, what=f"GPUWorkload phases {expected}")
    except TimeoutError as err:
        raise ControlPlaneError(
            f"{err}\nstatuses: {_statuses(kube, namespace)}\ncontroller log (tail):\n{ctl.log_tail()}"
        ) from None


def run_queue(kube: KubeClient, stack, namespace: str, node: str) -> None:
    """Submit WORKLOADS pinned to `node` (8 GPUs free), show the queue, delete the top one, show it again."""
    print(
        f"\nGPUWorkload queue: {len(WORKLOADS)} workloads of {GPUS_EACH} GPUs pinned to {node} (8 GPUs), "
        f"submitted lowest priority first; then the controller starts ...\n",
        flush=True,
    )
    for name, priority in WORKLOADS:
        kube.kubectl(
            "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_workload(name, priority, node))
        )
    ctl = Controller(kube, stack, namespace)
    try:
        by_priority = [name for name, _ in sorted(WORKLOADS, key=lambda w: -w[1])]
        expected = {n: ("Running" if i < 2 else "Queued") for i, n in enumerate(by_priority)}
        print_queue(_wait_phases(kube, namespace, expected, ctl))
        top = by_priority[0]
        print(f"\ndeleting {top} ...\n", flush=True)
        kube.kubectl("delete", RESOURCE, top, "-n", namespace, "--wait=false")
        expected = {n: ("Running" if i < 2 else "Queued") for i, n in enumerate(by_priority[1:])}
        print_queue(_wait_phases(kube, namespace, expected, ctl))
    finally:
        ctl.stop()
