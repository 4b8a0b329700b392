"""GPU queues, quotas and preemption through the real path: kubectl as a user -> the real kube-apiserver ->
the webhook (TLS) -> the Ray ledger actor, which reads GPUQueues, Namespaces and PodDisruptionBudgets from
the cluster sync; the ledger plans each preemption, the sync's eviction adapter records it on the preemptor
and evicts the victims through the Eviction API, and the placement adapter places the preemptor once they
are gone; kube-scheduler binds what the ledger placed. The disruption controller keeps PodDisruptionBudgets'
status, as in a cluster.

The cluster: one spine, two leaves of 8 nodes x 8 GPUs of one product (128 GPUs), so a gang of 8 whole nodes
may take one leaf and a 16-GPU gang needs two nodes of one leaf.

No kubelet runs: a pod the Eviction API deletes with a grace period stays Terminating until the kubelet of its
node says its containers stopped, which here never comes. `KubeletStandIn` does the kubelet's part: it
finishes the deletion of every terminating pod bound to a node (a delete with grace 0, as the kubelet's final
delete is), and records each pod the Eviction API evicted (the DisruptionTarget condition the API server
writes before deleting). A victim is "gone" when its pod is deleted. Each scenario counts what was evicted,
what was placed, and the GPUs promised twice (none).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import yaml

from devcluster.cluster import CONTROLLERS, ControlPlane
from devcluster.nodes import LEAF_LABEL, create_nodes, make_sample_cluster
from devcluster.scheduler import KubeScheduler
from devcluster.stack import Stack, e2e_webhook_config, placements_by_device
from gpuledger.names import (
    QUEUE_API_VERSION,
    SCHEDULING_GATE,
)
from tests.conftest import require_binaries

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

IMAGE = "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04"
GPUS = 128
NODES = make_sample_cluster(spines=1, leaves_per_spine=2, nodes_per_leaf=8, tainted_per_leaf=0)
LEAF_OF = {n["metadata"]["name"]: n["metadata"]["labels"][LEAF_LABEL] for n in NODES}
TEAM_LABEL = "gpuledger-e2e/team"  # the namespaces' label each test's queues select, unique per test
GRACE_S = 5  # victims' termination grace; the kubelet stand-in ends it at once (no container to stop)


# ---------------------------------------------------------------------------------------------- fixtures
# A control plane of this module's own: the line and the queues are the whole cluster's, so pods and queues
# other modules leave behind would take the GPUs these tests count.
@pytest.fixture(scope="module")
def apiserver():
    require_binaries()
    # the disruption controller writes PodDisruptionBudgets' status (disruptionsAllowed), which the ledger and
    # the Eviction API read; the resource quota controller a ResourceQuota's (the API server admits nothing
    # against a quota whose use it has not counted)
    with ControlPlane(controllers=(*CONTROLLERS, "disruption-controller", "resourcequota-controller")) as cp:
        yield cp


@pytest.fixture(scope="module")
def gpu_nodes(apiserver):
    create_nodes(apiserver.api_client(), NODES)
    return NODES


class KubeletStandIn:
    """The kubelet's part in a deletion, for a cluster without one; and a record of the Eviction API's acts.

    A watch on every pod: a pod carrying the DisruptionTarget condition the Eviction API writes
    (reason EvictionByEvictionAPI) is recorded as evicted; a terminating pod bound to a node is deleted with
    grace 0 (what its kubelet does once the containers stopped), unless paused (the victims stay
    Terminating: not gone yet)."""

    def __init__(self, cp):
        self.cp = cp
        self.evicted: dict[str, str] = {}  # "namespace/name" -> uid, every pod the Eviction API evicted
        self.finished: list[str] = []  # terminating pods whose deletion this finished
        self._running = threading.Event()  # set: finish deletions; clear: leave them Terminating
        self._running.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="kubelet-stand-in", daemon=True)

    def start(self) -> KubeletStandIn:
        from kubernetes import client

        self.core = client.CoreV1Api(self.cp.api_client())
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=40)

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()
        for pod in self.core.list_pod_for_all_namespaces().to_dict()["items"]:
            self._seen(pod)

    def evicted_in(self, *namespaces: str) -> dict[str, str]:
        with self._lock:
            return {k: v for k, v in self.evicted.items() if k.split("/", 1)[0] in namespaces}

    def _loop(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                listed = self.core.list_pod_for_all_namespaces()
                for pod in listed.to_dict()["items"]:
                    self._seen(pod)
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=5,
                )
                for event in stream:
                    self._seen(event["object"].to_dict())
                    if self._stop.is_set():
                        return
            except Exception:  # a dropped watch (410, connection): list and watch again
                time.sleep(0.2)

    def _seen(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(
            c.get("type") == "DisruptionTarget" and c.get("reason") == "EvictionByEvictionAPI"
            for c in conditions
        ):
            with self._lock:
                self.evicted[key] = meta["uid"]
        if meta.get("deletion_timestamp") and spec.get("node_name") and self._running.is_set():
            from kubernetes.client.exceptions import ApiException

            try:
                self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0)
                self.finished.append(key)
            except ApiException as err:
                if err.status != 404:
                    raise


@pytest.fixture(scope="module")
def stack(apiserver, gpu_nodes):
    """The product with its defaults (a pod that does not fit now waits); kube-scheduler binds what the ledger
    placed."""
    with Stack(apiserver, config=e2e_webhook_config(when_full="wait")) as running, KubeScheduler(apiserver):
        yield running


@pytest.fixture(scope="module")
def kubelet(apiserver):
    standin = KubeletStandIn(apiserver).start()
    yield standin
    standin.stop()


class Team:
    """A namespace of one test, opted in to admission, that the user alice may use, in one GPUQueue."""

    def __init__(self, cp, stack: Stack, namespace: str, queue: str):
        self.cp, self.stack, self.namespace, self.queue = cp, stack, namespace, queue

    def apply(self, text: str, check: bool = True):
        return self.cp.kubectl(
            "apply", "-n", self.namespace, "-f", "-", input=text, as_user="alice", check=check
        )

    def pods(self, selector: str | None = None) -> list[dict]:
        return self.cp.pods(self.namespace, selector)

    def pod(self, name: str) -> dict:
        return self.cp.get_json("pod", name, "-n", self.namespace)

    def placed(self, selector: str | None = None) -> list[dict]:
        return [p for p in self.pods(selector) if not gated(p) and self.stack.placement(p) is not None]

    def waiting(self, selector: str | None = None) -> list[dict]:
        return [p for p in self.pods(selector) if gated(p)]

    def wait_placed(self, count: int, selector: str | None = None, timeout: float = 90) -> list[dict]:
        """Until `count` pods (of `selector`) are placed and bound to their node, and the ledger confirmed
        each."""

        def bound():
            pods = [p for p in self.placed(selector) if p["spec"].get("nodeName")]
            return pods if len(pods) >= count else None

        pods = self.cp.wait_for(bound, timeout=timeout, what=f"{count} pods ({selector or 'all'}) placed")
        ids = [self.stack.placement(p).id for p in pods]
        self.cp.wait_for(
            lambda: all(h is not None and h.confirmed for h in self.stack.call("lookup", ids)),
            timeout=timeout,
            what=f"{len(ids)} reservations confirmed",
        )
        return pods

    def wait_waiting(self, count: int, selector: str | None = None, timeout: float = 60) -> list[dict]:
        return self.cp.wait_for(
            lambda: (lambda pods: pods if len(pods) >= count else None)(self.waiting(selector)),
            timeout=timeout,
            what=f"{count} pods ({selector or 'all'}) waiting gated",
        )


@pytest.fixture
def teams(apiserver, stack):
    """make(queue, spec) -> a Team in a fresh namespace its GPUQueue selects. The cluster's GPUs are all free
    when the test starts; its namespaces, queues and PriorityClasses are gone after it."""

    def all_free() -> bool:
        nodes = stack.call("snapshot")["nodes"]
        return sum(1 for n in nodes.values() for d in n["devices"] if d[3] is None and not d[4]) >= GPUS

    apiserver.wait_for(all_free, timeout=120, what="the cluster's GPUs all free")
    suffix = uuid.uuid4().hex[:5]
    made: list[Team] = []

    def make(queue: str, spec: dict | None = None) -> Team:
        namespace = apiserver.create_namespace(f"q-{queue}-{suffix}")
        apiserver.kubectl("label", "namespace", namespace, f"{TEAM_LABEL}={queue}-{suffix}")
        if spec is not None:
            apiserver.apply(
                {
                    "apiVersion": QUEUE_API_VERSION,
                    "kind": "GPUQueue",
                    "metadata": {"name": queue},
                    "spec": {"namespaceSelector": {"matchLabels": {TEAM_LABEL: f"{queue}-{suffix}"}}, **spec},
                }
            )
        team = Team(apiserver, stack, namespace, queue)
        made.append(team)
        return team

    yield make
    for team in made:  # Jobs first, or their controller makes their pods again
        apiserver.kubectl("delete", "jobs", "--all", "-n", team.namespace, "--wait=false", check=False)
        apiserver.force_delete("pods", namespace=team.namespace)
    for team in made:
        apiserver.kubectl("delete", "gpuqueue", team.queue, "--ignore-not-found", check=False)
        apiserver.kubectl(
            "delete", "namespace", team.namespace, "--wait=false", "--ignore-not-found", check=False
        )
    apiserver.kubectl(
        "delete", "priorityclass", "-l", "gpuledger-e2e=queues", "--ignore-not-found", check=False
    )


# ---------------------------------------------------------------------------------------------- manifests
def job(
    name: str,
    pods: int,
    gpus: int = 8,
    *,
    gang: bool = True,
    priority: str | None = None,
    priority_class: str | None = None,
    leaf: str | None = None,
) -> dict:
    """An Indexed Job of `pods` pods of `gpus` GPUs; a gang (gpu-count on the Job: all-or-nothing) unless
    `gang=False`. Its pods carry the label job=<name>."""
    annotations: dict[str, str] = {}
    template_annotations: dict[str, str] = {}
    if gang:
        annotations["topology.scheduler/gpu-count"] = str(pods * gpus)
    else:
        template_annotations["topology.scheduler/gpu-count"] = str(gpus)
    if priority:
        annotations["agentaflow.gpu/priority"] = priority
    spec: dict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_S,
        "containers": [{"name": "main", "image": IMAGE}],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if leaf:
        spec["nodeSelector"] = {LEAF_LABEL: leaf}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": 100,  # evicted pods count as failures; the Job makes them again and they wait
            "template": {
                "metadata": {"labels": {"job": name}, "annotations": template_annotations},
                "spec": spec,
            },
        },
    }


def pod(
    name: str,
    gpus: int,
    *,
    priority: str | None = None,
    priority_class: str | None = None,
    leaf: str | None = None,
    labels: dict | None = None,
) -> dict:
    """A bare pod asking `gpus` GPUs through its container's limits (so a ResourceQuota counts them)."""
    spec: dict = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_S,
        "containers": [
            {
                "name": "main",
                "image": IMAGE,
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "100m"}},
            }
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if leaf:
        spec["nodeSelector"] = {LEAF_LABEL: leaf}
    annotations = {"agentaflow.gpu/priority": priority} if priority else {}
    metadata = {"name": name, "labels": dict(labels or {}), "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def stream(*objects: dict) -> str:
    return yaml.safe_dump_all(list(objects))


def priority_class(apiserver, name: str, value: int, never: bool = False) -> str:
    body: dict = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {"gpuledger-e2e": "queues"}},
        "value": value,
    }
    if never:
        body["preemptionPolicy"] = "Never"
    apiserver.apply(body)
    return name


# ---------------------------------------------------------------------------------------------- reading
def gated(pod: dict) -> bool:
    return any(g.get("name") == SCHEDULING_GATE for g in pod["spec"].get("schedulingGates") or [])


def key(pod: dict) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def double_booked(stack: Stack, *teams: Team) -> dict:
    """(node, device) -> the stored pods whose placements hold it, where more than one does."""
    pods = [p for t in teams for p in t.pods()]
    return {k: v for k, v in placements_by_device(stack, pods).items() if len(v) > 1}


def gpus_placed(stack: Stack, team: Team) -> int:
    return sum(len(stack.placement(p).devices) for p in team.placed())


def queue_table(apiserver, *names: str) -> dict[str, dict[str, str]]:
    """`kubectl get gpuqueues` as its columns show them: queue -> column -> text."""
    out = apiserver.kubectl("get", "gpuqueues", *names).stdout.splitlines()
    header = out[0]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    columns = [header[a:b].strip() for a, b in bounds]
    rows = {}
    for line in out[1:]:
        cells = dict(zip(columns, (line[a:b].strip() for a, b in bounds), strict=True))
        rows[cells["NAME"]] = cells
    return rows


def wait_table(apiserver, expected: dict[str, dict[str, str]], timeout: float = 60) -> dict:
    """Until `kubectl get gpuqueues` shows `expected` (queue -> column -> text) in those columns."""

    def shown():
        rows = queue_table(apiserver, *expected)
        seen = {q: {c: rows.get(q, {}).get(c) for c in cols} for q, cols in expected.items()}
        return rows if seen == expected else None

    try:
        return apiserver.wait_for(
            shown, timeout=timeout, interval=0.5, what=f"kubectl get gpuqueues {expected}"
        )
    except TimeoutError as err:
        raise TimeoutError(f"{err}\n{apiserver.kubectl('get', 'gpuqueues', '-o', 'wide').stdout}") from None


def events(apiserver, namespace: str, reason: str) -> list[dict]:
    return [e for e in apiserver.get_json("events", "-n", namespace)["items"] if e.get("reason") == reason]


def settle(seconds: float = 3.0) -> None:
    """Give the ledger's passes the chance to do what they must not (evict more, place twice): a check that
    nothing happens has no event to wait for."""
    time.sleep(seconds)


# ---------------------------------------------------------------------------------------------- scenarios
def test_a_resource_quota_on_gpus_is_still_respected(apiserver, stack, kubelet, teams):
    """A ResourceQuota of 8 GPUs in a queue's namespace: the second 8-GPU pod is refused by the API server
    (after the webhook placed it), and the ledger ends up holding nothing for it."""
    team = teams("team-a", {"quotas": [{"gpus": 64}]})
    apiserver.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": team.namespace},
            "spec": {"hard": {"requests.nvidia.com/gpu": "8"}},
        }
    )
    apiserver.wait_for(
        lambda: (apiserver.get_json("resourcequota", "gpus", "-n", team.namespace).get("status") or {}).get(
            "hard"
        ),
        what="the quota controller's status",
    )
    team.apply(stream(pod("first", 8)))
    team.wait_placed(1)
    out = team.apply(stream(pod("second", 8)), check=False)
    assert out.returncode != 0 and "exceeded quota" in out.stderr, out.stderr
    assert [p["metadata"]["name"] for p in team.pods()] == ["first"]
    # the webhook reserved GPUs for the pod the API server then refused: the reservation expires with no pod
    # carrying it (the sync's expiry check, at a clock past the reservation's time to live)
    ttl = stack.config.reservation_ttl_s
    stack.sync.check_expiry(time.time() + ttl + 1)
    snapshot = stack.call("snapshot")["nodes"]
    held = sum(1 for n in snapshot.values() for d in n["devices"] if d[3] is not None)
    assert held == 8  # the first pod's, nothing for the second
    assert gpus_placed(stack, team) == 8
    assert not double_booked(stack, team)
