"""GPUWorkloads end to end: the real apiserver (CRDs, Jobs, garbage collector), the real webhook, the real Ray
ledger, and `gpuledger controller` as its own process (killed with SIGKILL, run as two replicas).

No kubelet runs: the test plays its part. It confirms a pod's end by patching the pod's status (Succeeded or
Failed) and confirms a deletion by force-deleting the pod, as a kubelet would once the container stopped.
Each test pins its workloads to one node (8 GPUs) with a nodeSelector, so "more than fit" is a few workloads.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from devcluster.cluster import REPO, free_port
from devcluster.processes import stop_process
from devcluster.stack import placements_by_device
from gpuledger.names import WORKLOAD_UID_LABEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


class ControllerProcess:
    """`python -m gpuledger controller` on the stack's Ray and ledger actor, with short Lease times."""

    def __init__(self, cp, stack, lease_namespace: str, identity: str, lease_name: str, *extra: str):
        import ray

        self.identity = identity
        self.metrics_port = free_port()
        self.log_path = Path(tempfile.mkdtemp(prefix="gpucontroller-")) / f"{identity}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - held open for the process's life
        argv = [
            sys.executable,
            "-m",
            "gpuledger",
            "controller",
            "--kubeconfig",
            cp.kubeconfig,
            "--ray-address",
            ray.get_runtime_context().gcs_address,
            "--ray-namespace",
            stack.ray_namespace,
            "--actor-name",
            stack.actor_name,
            "--lease-namespace",
            lease_namespace,
            "--lease-name",
            lease_name,
            "--identity",
            identity,
            "--lease-duration",
            "8",
            "--renew-deadline",
            "5",
            "--retry-period",
            "0.5",
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--gpunode-interval",
            "1",
            "--log-level",
            "DEBUG",
            # the suite's webhook refuses when full (tests/e2e/conftest.py): the controller keeps its own
            # queue, as the webhook's when_full says; tests/e2e/test_one_line.py runs both at wait
            "--when-full",
            "refuse",
            *extra,
        ]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def is_leader(self) -> bool:
        return f"{self.identity}: leader" in self.log()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        stop_process(self.proc, grace_s=20)
        self._log.close()


@pytest.fixture
def controllers(apiserver, stack, namespace):
    """Start controllers on demand (same Lease); every one is stopped at the end."""
    started: list[ControllerProcess] = []
    lease = f"ctl-{uuid.uuid4().hex[:6]}"

    def start(identity: str, *extra: str) -> ControllerProcess:
        proc = ControllerProcess(apiserver, stack, namespace, identity, lease, *extra)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
        print(
            f"--- controller {proc.identity} log (tail) ---\n"
            f"{proc.log_path.read_text(errors='replace')[-4000:]}"
        )


class Queue:
    """GPUWorkloads in one namespace, pinned to one node; reading their status; playing the kubelet."""

    def __init__(self, cp, namespace: str, node: str, stack=None):
        self.cp, self.namespace, self.node, self.stack = cp, namespace, node, stack

    def submit(self, name: str, gpus: int, priority: int = 0, group: str = "agentaflow", **spec) -> None:
        if group == "agentaflow":
            body = {
                "priority": priority,
                "gpuRequirements": {"gpuCount": gpus},
                "podTemplate": {
                    "spec": {
                        "nodeSelector": {"kubernetes.io/hostname": self.node},
                        "containers": [{"name": "main", "image": IMAGE}],
                    }
                },
                **spec,
            }
            obj = {
                "apiVersion": "agentaflow.io/v1",
                "kind": "GPUWorkload",
                "metadata": {"name": name},
                "spec": body,
            }
        else:
            body = {
                "modelName": name,
                "gpuCount": gpus,
                "priority": priority,
                "jobTemplate": {
                    "spec": {
                        "template": {
                            "spec": {
                                "nodeSelector": {"kubernetes.io/hostname": self.node},
                                "containers": [{"name": "main", "image": IMAGE}],
                            }
                        }
                    }
                },
                **spec,
            }
            obj = {
                "apiVersion": "gpu.warp.dev/v1alpha1",
                "kind": "GPUWorkload",
                "metadata": {"name": name},
                "spec": body,
            }
        self.cp.kubectl("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump(obj))

    def all(self) -> dict[str, dict]:
        out = {}
        for resource in ("gpuworkloads.agentaflow.io", "gpuworkloads.gpu.warp.dev"):
            for obj in self.cp.get_json(resource, "-n", self.namespace)["items"]:
                out[obj["metadata"]["name"]] = obj
        return out

    def phases(self) -> dict[str, str | None]:
        return {name: (obj.get("status") or {}).get("phase") for name, obj in self.all().items()}

    def wait_phases(self, expected: dict[str, str], timeout: float = 60) -> dict[str, dict]:
        def ok():
            objs = self.all()
            got = {n: (objs.get(n, {}).get("status") or {}).get("phase") for n in expected}
            return objs if got == expected else None

        try:
            return self.cp.wait_for(ok, timeout=timeout, interval=0.3, what=f"phases {expected}")
        except TimeoutError as err:
            statuses = {
                n: {k: o.get("status", {}).get(k) for k in ("phase", "reason", "message", "queuePosition")}
                for n, o in self.all().items()
            }
            pods = [
                (p["metadata"]["name"], p["status"].get("phase"), p["metadata"].get("deletionTimestamp"))
                for p in self.cp.pods(self.namespace)
            ]
            snap = self.stack.call("snapshot") if self.stack else {}
            node = snap.get("nodes", {}).get(self.node)
            raise TimeoutError(
                f"{err}\nstatuses: {json.dumps(statuses, indent=1)}\npods: {pods}\n"
                f"ledger node: {node}\nreservations: {snap.get('reservations')}"
            ) from None

    def pods(self, name: str) -> list[dict]:
        uid = self.all()[name]["metadata"]["uid"]
        return self.cp.pods(self.namespace, f"{WORKLOAD_UID_LABEL}={uid}")

    def jobs(self, name: str) -> list[dict]:
        uid = self.all()[name]["metadata"]["uid"]
        return self.cp.get_json("jobs", "-n", self.namespace, "-l", f"{WORKLOAD_UID_LABEL}={uid}")["items"]

    def delete(self, name: str, resource: str = "gpuworkloads.agentaflow.io") -> None:
        """Delete the workload and, as the kubelet would once its containers stopped, its pods."""
        self.confirm_deleted(self.request_delete(name, resource), name)

    def request_delete(self, name: str, resource: str = "gpuworkloads.agentaflow.io") -> str:
        uid = self.all()[name]["metadata"]["uid"]
        self.cp.kubectl("delete", resource, name, "-n", self.namespace, "--wait=false")
        return uid

    def confirm_deleted(self, uid: str, name: str) -> None:
        selector = f"{WORKLOAD_UID_LABEL}={uid}"

        def gone():
            # the garbage collector deletes the Job, then its pods (gracefully); a kubelet would confirm each
            # pod's deletion once its containers stopped: only then, and only those, are force-deleted here
            pods = self.cp.pods(self.namespace, selector)
            terminating = [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")]
            if terminating:
                self.cp.force_delete("pods", *terminating, namespace=self.namespace)
            return not self.cp.get_json("jobs", "-n", self.namespace, "-l", selector)["items"] and not pods

        self.cp.wait_for(gone, timeout=30, interval=0.3, what=f"{name}'s Job and pods gone")

    def finish_pods(self, name: str, phase: str) -> None:
        for pod in self.pods(name):
            self.cp.kubectl(
                "patch",
                "pod",
                pod["metadata"]["name"],
                "-n",
                self.namespace,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": {"phase": phase}}),
            )


def _no_double_booking(stack, apiserver):
    held = placements_by_device(stack, apiserver.pods())
    doubles = {k: v for k, v in held.items() if len(v) > 1}
    assert not doubles, doubles


def test_more_than_fit_run_in_priority_order_as_earlier_ones_are_deleted(
    apiserver, stack, namespace, controllers
):
    q = Queue(apiserver, namespace, "leaf-2-node-2", stack)
    # 8 GPUs on the node, 4 per workload: two fit at once. Submitted before the controller starts, so its
    # first pass sees them all: order is priority, then age
    q.submit("low-a", 4, priority=1)
    time.sleep(1.1)  # creationTimestamp has whole seconds: make the ages differ
    q.submit("low-b", 4, priority=1)
    q.submit("mid", 4, priority=5)
    q.submit("top", 4, priority=10, group="warp")
    q.submit("least", 4, priority=-100, group="warp")
    ctl = controllers("c1", "--requeue-interval", "0")  # freed GPUs must wake the queue by their events alone
    objs = q.wait_phases(
        {"top": "Running", "mid": "Running", "low-a": "Queued", "low-b": "Queued", "least": "Queued"},
        timeout=90,
    )

    def positions():
        objs = q.all()
        got = {n: objs[n]["status"].get("queuePosition") for n in ("low-a", "low-b", "least")}
        return objs if got == {"low-a": 1, "low-b": 2, "least": 3} else None

    objs = apiserver.wait_for(positions, timeout=30, what="queue positions low-a 1, low-b 2, least 3")
    assert objs["low-a"]["status"]["reason"] == "NotEnoughGpus", objs["low-a"]["status"]
    assert "leaf-2-node-2" in objs["top"]["status"]["assignedNodes"]
    assert len(objs["top"]["status"]["devices"][0]["indices"]) == 4
    _no_double_booking(stack, apiserver)

    q.delete("top", "gpuworkloads.gpu.warp.dev")
    q.wait_phases({"mid": "Running", "low-a": "Running", "low-b": "Queued", "least": "Queued"})
    q.delete("mid")
    q.wait_phases({"low-a": "Running", "low-b": "Running", "least": "Queued"})
    assert q.all()["least"]["status"]["queuePosition"] == 1
    # a finished workload frees its GPUs too (the kubelet reports the pod Succeeded)
    q.finish_pods("low-a", "Succeeded")
    objs = q.wait_phases({"low-a": "Succeeded", "low-b": "Running", "least": "Running"})
    assert objs["low-a"]["status"]["attempts"] == 1
    _no_double_booking(stack, apiserver)

    # the owner reference: deleting a workload deletes its Job (Queue.delete waits for it)
    q.delete("low-b")
    metrics = _scrape(ctl)
    assert 'warp_gpuworkload_scheduled_total{strategy="default"}' in metrics
    assert "warp_gpuworkload_reconcile_duration_seconds_count" in metrics
    assert 'gpuledger_gpuworkload_queue_wait_seconds_count{priority="medium"}' in metrics


def test_failed_pod_is_retried_after_backoff(apiserver, stack, namespace, controllers):
    q = Queue(apiserver, namespace, "leaf-2-node-0")
    controllers("c1")
    # a backoff long enough that the Retrying phase outlasts a poll of a loaded machine (2 s was missed once)
    q.submit("flaky", 2, group="warp", retryPolicy={"maxRetries": 1, "backoffSeconds": 8})
    q.wait_phases({"flaky": "Running"})
    q.finish_pods("flaky", "Failed")
    objs = q.wait_phases({"flaky": "Retrying"})
    status = objs["flaky"]["status"]
    assert status["reason"] == "PodFailed" and status["attempts"] == 1
    objs = q.wait_phases({"flaky": "Running"}, timeout=60)
    assert objs["flaky"]["status"]["attempts"] == 2
    q.finish_pods("flaky", "Failed")
    objs = q.wait_phases({"flaky": "Failed"})
    assert "no retries left" in objs["flaky"]["status"]["message"]


def test_killed_controller_loses_no_workload_and_starts_none_twice(apiserver, stack, namespace, controllers):
    q = Queue(apiserver, namespace, "leaf-3-node-0")
    names = [f"w{i}" for i in range(5)]
    for i, name in enumerate(names):
        q.submit(name, 4, priority=10 - i)  # w0 first
    first = controllers("c1")
    q.wait_phases(
        {"w0": "Running", "w1": "Running", "w2": "Queued", "w3": "Queued", "w4": "Queued"}, timeout=90
    )
    # free GPUs and kill the controller mid-queue: it may be anywhere in starting w2 when it dies
    uid = q.request_delete("w0")
    first.kill()
    q.confirm_deleted(uid, "w0")
    second = controllers("c2")
    apiserver.wait_for(second.is_leader, timeout=90, what="the second controller to take the Lease")
    q.wait_phases({"w1": "Running", "w2": "Running", "w3": "Queued", "w4": "Queued"}, timeout=90)
    q.delete("w1")
    q.delete("w2")
    objs = q.wait_phases({"w3": "Running", "w4": "Running"}, timeout=60)
    for name in ("w3", "w4"):
        assert objs[name]["status"]["attempts"] == 1, objs[name]["status"]
        assert len(q.jobs(name)) == 1
        assert len(q.pods(name)) == 1
    _no_double_booking(stack, apiserver)


def test_two_replicas_exactly_one_acts(apiserver, stack, namespace, controllers):
    q = Queue(apiserver, namespace, "leaf-1-node-0")
    a, b = controllers("ra"), controllers("rb")
    apiserver.wait_for(lambda: a.is_leader() or b.is_leader(), timeout=60, what="a leader")
    time.sleep(2)
    leaders = [p for p in (a, b) if p.is_leader()]
    assert len(leaders) == 1, (a.log()[-2000:], b.log()[-2000:])
    lead, standby = leaders[0], (b if leaders[0] is a else a)
    q.submit("one", 2)
    q.submit("two", 2, group="warp")
    q.wait_phases({"one": "Running", "two": "Running"})
    assert "Job" in lead.log() and "created Job" not in standby.log()
    lease = apiserver.get_json("leases", "-n", namespace)["items"]
    assert [item["spec"]["holderIdentity"] for item in lease] == [lead.identity]
    assert _metric(lead, "gpuledger_controller_leader") == 1.0
    assert _metric(standby, "gpuledger_controller_leader") in (None, 0.0)
    # the leader goes away: the standby takes over and acts
    lead.kill()
    apiserver.wait_for(standby.is_leader, timeout=30, what="the standby to take over")
    q.submit("three", 2)
    q.wait_phases({"three": "Running"})
    assert "created Job" in standby.log()
    for name in ("one", "two", "three"):
        assert len(q.jobs(name)) == 1


def test_gpunodes_show_the_ledger(apiserver, stack, namespace, controllers):
    q = Queue(apiserver, namespace, "leaf-0-node-2")
    controllers("c1")
    q.submit("shown", 3)
    q.wait_phases({"shown": "Running"})
    pod = q.pods("shown")[0]["metadata"]["name"]

    def held():
        node = apiserver.get_json("gpunode", "leaf-0-node-2")
        holders = [h.get("pod") for d in node["status"]["devices"] for h in d.get("holders", [])]
        return node if holders.count(f"{namespace}/{pod}") == 3 else None

    node = apiserver.wait_for(held, timeout=30, what="GPUNode leaf-0-node-2 to show the pod's 3 GPUs")
    status = node["status"]
    assert status["leaf"] == "leaf-0" and status["allocation"]["totalGPUs"] == 8
    assert status["allocation"]["allocatedGPUs"] >= 3
    table = apiserver.kubectl("get", "gpunodes", "leaf-0-node-2").stdout
    assert "LEAF" in table and "leaf-0" in table
    # read-only for users: alice may not write GPUNodes
    denied = apiserver.kubectl("delete", "gpunode", "leaf-0-node-2", as_user="alice", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()


def test_gang_workload_is_placed_whole_on_distinct_nodes(apiserver, stack, namespace, controllers):
    """parallelism 2: one Job, two pods, one gang the webhook places all-or-nothing, one pod per node."""
    q = Queue(apiserver, namespace, "unused", stack)
    controllers("c1")
    obj = {
        "apiVersion": "gpu.warp.dev/v1alpha1",
        "kind": "GPUWorkload",
        "metadata": {"name": "gang"},
        "spec": {
            "gpuCount": 2,
            "parallelism": 2,
            "priority": "high",
            "topology": {"placementStrategy": "distributed"},
            "jobTemplate": {
                "spec": {
                    "template": {
                        "spec": {
                            "nodeSelector": {"topology.scheduler/leaf": "leaf-3"},
                            "containers": [{"name": "main", "image": IMAGE}],
                        }
                    }
                }
            },
        },
    }
    apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj))
    objs = q.wait_phases({"gang": "Running"}, timeout=90)
    status = objs["gang"]["status"]
    assert len(status["assignedNodes"]) == 2 and all(n.startswith("leaf-3-") for n in status["assignedNodes"])
    assert [len(d["indices"]) for d in status["devices"]] == [2, 2]
    job = q.jobs("gang")[0]
    assert (job["spec"]["parallelism"], job["spec"]["completionMode"]) == (2, "Indexed")
    _no_double_booking(stack, apiserver)


BAD = [
    (
        "agentaflow.io/v1",
        {"gpuRequirements": {"gpuCount": -1}, "podTemplate": {"spec": {}}},
        "spec.gpuRequirements.gpuCount",
    ),
    (
        "agentaflow.io/v1",
        {"schedulingStrategy": "fastest", "podTemplate": {"spec": {}}},
        "spec.schedulingStrategy",
    ),
    ("agentaflow.io/v1", {"modelName": "llama", "podTemplate": {"spec": {}}}, "spec.modelName"),
    ("gpu.warp.dev/v1alpha1", {"gpuCount": -2, "image": "x"}, "spec.gpuCount"),
    (
        "gpu.warp.dev/v1alpha1",
        {"gpuCount": 1, "image": "x", "schedulingStrategy": "quickest"},
        "spec.schedulingStrategy",
    ),
    (
        "gpu.warp.dev/v1alpha1",
        {"gpuCount": 1, "image": "x", "gpuRequirements": {"gpuCount": 1}},
        "spec.gpuRequirements",
    ),
    ("gpu.warp.dev/v1alpha1", {"gpuCount": 1, "image": "x", "priority": "urgent"}, "spec.priority"),
    (
        "gpu.warp.dev/v1alpha1",
        {"gpuCount": 1, "image": "x", "retryPolicy": {"maxRetries": -1}},
        "spec.retryPolicy.maxRetries",
    ),
]


@pytest.mark.parametrize("api_version,spec,field", BAD, ids=[f"{b[0].split('/')[0]}-{b[2]}" for b in BAD])
def test_bad_gpuworkloads_are_rejected_naming_the_field(apiserver, namespace, api_version, spec, field):
    obj = {"apiVersion": api_version, "kind": "GPUWorkload", "metadata": {"name": "bad"}, "spec": spec}
    out = apiserver.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(obj), check=False)
    assert out.returncode != 0, out.stdout
    assert field in out.stderr, out.stderr


def _scrape(ctl: ControllerProcess) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{ctl.metrics_port}/metrics", timeout=5) as r:
        return r.read().decode()


def _metric(ctl: ControllerProcess, name: str) -> float | None:
    try:
        text = _scrape(ctl)
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None
