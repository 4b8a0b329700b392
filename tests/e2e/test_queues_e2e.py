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

import json
import time
import uuid

import pytest
import yaml

from devcluster.cluster import CONTROLLERS, ControlPlane
from devcluster.kubelet_standin import KubeletStandIn
from devcluster.nodes import LEAF_LABEL, create_nodes, make_sample_cluster
from devcluster.scheduler import KubeScheduler
from devcluster.stack import Stack, e2e_webhook_config, placements_by_device
from gpuledger.names import (
    PREEMPTED_REASON,
    PREEMPTING_ANNOTATION,
    PREEMPTING_REASON,
    QUEUE_API_VERSION,
    SCHEDULING_GATE,
)
from tests.cli.conftest import run_cli
from tests.conftest import require_binaries
from tests.e2e.conftest import stable_snapshot

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


def held_gpus(stack: Stack) -> int:
    """GPUs the ledger holds for anyone (reservations, placed pods, plans' keeps)."""
    nodes = stack.call("snapshot")["nodes"]
    return sum(1 for n in nodes.values() for d in n["devices"] if d[3] is not None)


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


def cli_queues(apiserver, *names: str) -> dict[str, tuple]:
    """`gpuledger queues -o json` (read from API objects alone): queue -> (used, borrowed, pods waiting)."""
    rows = json.loads(run_cli("queues", "--kubeconfig", apiserver.kubeconfig, "-o", "json").out)["items"]
    return {r["name"]: (r["used"], r["borrowed"], len(r["waiting"])) for r in rows if r["name"] in names}


def events(apiserver, namespace: str, reason: str) -> list[dict]:
    return [e for e in apiserver.get_json("events", "-n", namespace)["items"] if e.get("reason") == reason]


def settle(seconds: float = 3.0) -> None:
    """Give the ledger's passes the chance to do what they must not (evict more, place twice): a check that
    nothing happens has no event to wait for."""
    time.sleep(seconds)


# ---------------------------------------------------------------------------------------------- scenarios
def test_a_team_takes_back_exactly_the_borrowed_gpus_it_needs_whole_gangs_only(
    apiserver, stack, kubelet, teams
):
    """Two teams with 64 GPUs of quota each on 128 GPUs: team-a submits 200 GPUs of work (gangs of 2 x 8
    GPUs and a single 8-GPU pod) while team-b is idle, and runs 128; team-b submits a gang of 8 x 8: exactly
    four of team-a's gangs (64 GPUs) are evicted, whole, through the Eviction API; then both run at their
    quota."""
    a = teams("team-a", {"quotas": [{"gpus": 64}]})
    b = teams("team-b", {"quotas": [{"gpus": 64}]})
    a.apply(stream(*(job(f"a-{i}", 2) for i in range(8))))
    first = a.wait_placed(16)
    a.apply(stream(*(job(f"a-{i}", 2) for i in range(8, 12)), job("a-solo", 1, gang=False)))
    a.wait_waiting(9)  # 4 gangs of 2 and the single pod: 72 GPUs wait (WAITING counts pods)
    settle(1.0)
    assert gpus_placed(stack, a) == GPUS
    wait_table(
        apiserver,
        {
            "team-a": {"QUOTA": "64", "USED": "128", "BORROWED": "64", "WAITING": "9"},
            "team-b": {"QUOTA": "64", "USED": "0", "BORROWED": "0", "WAITING": "0"},
        },
    )
    assert cli_queues(apiserver, "team-a", "team-b") == {"team-a": (128, 64, 9), "team-b": (0, 0, 0)}

    b.apply(stream(job("b-big", 8)))
    placed_b = b.wait_placed(8, "job=b-big", timeout=180)
    assert {len(stack.placement(p).devices) for p in placed_b} == {8}

    evicted = kubelet.evicted_in(a.namespace, b.namespace)
    running_before = {key(p): p["metadata"]["uid"] for p in first}
    assert set(evicted) <= set(running_before), evicted  # only running pods, and only team-a's
    assert len(evicted) == 8, sorted(evicted)  # 64 GPUs: exactly what team-b needs
    jobs_hit = {p["metadata"]["labels"]["job"] for p in first if key(p) in evicted}
    assert len(jobs_hit) == 4  # whole gangs: both pods of each of four Jobs
    # the Job controller made the evicted pods again; they wait, and nothing else is evicted
    settle()
    assert len(kubelet.evicted_in(a.namespace, b.namespace)) == 8
    assert gpus_placed(stack, a) == gpus_placed(stack, b) == 64
    assert not double_booked(stack, a, b)
    wait_table(
        apiserver,
        {
            "team-a": {"QUOTA": "64", "USED": "64", "BORROWED": "0", "WAITING": "17"},
            "team-b": {"QUOTA": "64", "USED": "64", "BORROWED": "0", "WAITING": "0"},
        },
    )
    assert cli_queues(apiserver, "team-a", "team-b") == {"team-a": (64, 0, 17), "team-b": (64, 0, 0)}
    # each victim's owner was told who took its GPUs and why
    told = apiserver.wait_for(
        lambda: (lambda got: got if {e["involvedObject"]["name"] for e in got} == jobs_hit else None)(
            events(apiserver, a.namespace, PREEMPTED_REASON)
        ),
        what="a Preempted Event on each evicted gang's Job",
    )
    assert all("b-big" in e["message"] and "reclaim" in e["message"] for e in told), told
    preempting = apiserver.wait_for(
        lambda: events(apiserver, b.namespace, PREEMPTING_REASON), what="the preemptor's Preempting Event"
    )
    assert len(preempting) == 1 and "evicting 8 pod(s) (64 GPUs)" in preempting[0]["message"], preempting


def fill_two_leaves(team: Team, bigs_first: bool) -> tuple[list[dict], list[dict]]:
    """leaf-0: eight low-priority 8-GPU pods (one a node, label size=8); leaf-1: sixteen low-priority 4-GPU
    pods (two a node, size=4); the cluster full. `bigs_first`: leaf-0's pods are the older."""
    bigs = [pod(f"big-{i}", 8, priority="low", leaf="leaf-0", labels={"size": "8"}) for i in range(8)]
    halves = [pod(f"half-{i}", 4, priority="low", leaf="leaf-1", labels={"size": "4"}) for i in range(16)]
    for group, selector, count in (
        [(bigs, "size=8", 8), (halves, "size=4", 16)]
        if bigs_first
        else [(halves, "size=4", 16), (bigs, "size=8", 8)]
    ):
        team.apply(stream(*group))
        team.wait_placed(count, selector)
        team.cp.wait_for(
            lambda selector=selector: all(p["status"].get("startTime") for p in team.pods(selector)),
            what=f"pods {selector} started",
        )
        time.sleep(1.1)  # status.startTime counts whole seconds: the second group starts strictly later
    placed_bigs, placed_halves = team.placed("size=8"), team.placed("size=4")
    assert {LEAF_OF[p["spec"]["nodeName"]] for p in placed_bigs} == {"leaf-0"}
    assert {LEAF_OF[p["spec"]["nodeName"]] for p in placed_halves} == {"leaf-1"}
    return placed_bigs, placed_halves


def budget(apiserver, team: Team, name: str, selector: dict, min_available: int) -> dict:
    """A PodDisruptionBudget by an integer minAvailable (pods with no controller, as these are, take no
    maxUnavailable); returned once the disruption controller counted its pods."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": team.namespace},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}},
    }
    apiserver.apply(body)

    def counted():
        status = apiserver.get_json("pdb", name, "-n", team.namespace).get("status") or {}
        return (
            status
            if status.get("desiredHealthy") == min_available and "disruptionsAllowed" in status
            else None
        )

    return apiserver.wait_for(counted, what=f"the disruption controller counted budget {name}")


def test_a_critical_gang_preempts_the_youngest_pods_that_open_one_leaf_window(
    apiserver, stack, kubelet, teams
):
    """A full cluster of low-priority pods, leaf-0's 8-GPU pods the youngest; a critical 16-GPU gang (2 x 8)
    needs two whole nodes of one leaf: two of leaf-0's pods are evicted, the gang takes their nodes, and
    nothing else is evicted."""
    team = teams("research", {"quotas": [{"gpus": GPUS}]})
    bigs, halves = fill_two_leaves(team, bigs_first=False)
    team.apply(stream(job("urgent", 2, priority="critical")))
    placed = team.wait_placed(2, "job=urgent", timeout=120)
    evicted = kubelet.evicted_in(team.namespace)
    assert len(evicted) == 2, sorted(evicted)
    assert set(evicted) <= {key(p) for p in bigs}
    assert {LEAF_OF[p["spec"]["nodeName"]] for p in placed} == {"leaf-0"}
    assert {p["spec"]["nodeName"] for p in placed} == {
        p["spec"]["nodeName"] for p in bigs if key(p) in evicted
    }
    settle()
    assert len(kubelet.evicted_in(team.namespace)) == 2
    assert len(team.placed("size=4")) == 16 and len(team.placed("size=8")) == 6
    assert not double_booked(stack, team)


def test_a_disruption_budget_blocks_a_victim_and_the_plan_picks_another(apiserver, stack, kubelet, teams):
    """The full cluster with leaf-0's 8-GPU pods the youngest (the victims of the plan above), under a
    PodDisruptionBudget that lets none go: the critical gang takes two nodes of leaf-1 instead (four 4-GPU
    pods), and no guarded pod is evicted."""
    team = teams("research", {"quotas": [{"gpus": GPUS}]})
    bigs, halves = fill_two_leaves(team, bigs_first=False)
    status = budget(apiserver, team, "guard-big", {"size": "8"}, min_available=8)
    assert status["disruptionsAllowed"] == 0 and status["currentHealthy"] == 8
    team.apply(stream(job("urgent", 2, priority="critical")))
    placed = team.wait_placed(2, "job=urgent", timeout=120)
    evicted = kubelet.evicted_in(team.namespace)
    assert len(evicted) == 4, sorted(evicted)
    assert set(evicted) <= {key(p) for p in halves}
    assert {LEAF_OF[p["spec"]["nodeName"]] for p in placed} == {"leaf-1"}
    settle()
    assert len(kubelet.evicted_in(team.namespace)) == 4
    assert len(team.placed("size=8")) == 8
    assert not double_booked(stack, team)


def test_a_disruption_budget_on_every_pod_makes_the_preemptor_wait(apiserver, stack, kubelet, teams):
    """Every pod of the full cluster under a PodDisruptionBudget that lets none go: the critical gang waits
    and nothing is evicted; once the budget lets two go, it takes two."""
    team = teams("research", {"quotas": [{"gpus": GPUS}]})
    team.apply(stream(*(pod(f"p-{i}", 8, priority="low", labels={"guard": "all"}) for i in range(16))))
    team.wait_placed(16)
    assert budget(apiserver, team, "guard-all", {"guard": "all"}, min_available=16)["disruptionsAllowed"] == 0
    team.apply(stream(job("urgent", 2, priority="critical")))
    team.wait_waiting(2, "job=urgent")
    settle(5.0)
    assert kubelet.evicted_in(team.namespace) == {}
    assert len(team.waiting("job=urgent")) == 2 and len(team.placed()) == 16
    assert budget(apiserver, team, "guard-all", {"guard": "all"}, min_available=14)["disruptionsAllowed"] == 2
    team.wait_placed(2, "job=urgent", timeout=120)
    assert len(kubelet.evicted_in(team.namespace)) == 2
    assert not double_booked(stack, team)


def test_preemption_policy_never_waits(apiserver, stack, kubelet, teams):
    """A pod whose PriorityClass says `preemptionPolicy: Never` waits in a full cluster of lower priority and
    evicts nothing; a pod of a higher class that may preempt takes one node's pod, and the first still
    waits."""
    team = teams("research", {"quotas": [{"gpus": GPUS}]})
    never = priority_class(apiserver, f"e2e-never-{team.namespace[-5:]}", 500, never=True)
    may = priority_class(apiserver, f"e2e-may-{team.namespace[-5:]}", 600)
    team.apply(stream(*(pod(f"p-{i}", 8, priority="low") for i in range(16))))
    team.wait_placed(16)
    team.apply(stream(pod("patient", 8, priority_class=never)))
    assert team.pod("patient")["spec"].get("preemptionPolicy") == "Never"
    team.wait_waiting(1)
    settle(5.0)
    assert gated(team.pod("patient")) and kubelet.evicted_in(team.namespace) == {}
    team.apply(stream(pod("pushy", 8, priority_class=may)))
    apiserver.wait_for(
        lambda: not gated(team.pod("pushy")) and team.pod("pushy")["spec"].get("nodeName"),
        timeout=120,
        what="pushy placed",
    )
    assert len(kubelet.evicted_in(team.namespace)) == 1
    assert gated(team.pod("patient"))
    assert not double_booked(stack, team)


def test_a_workload_younger_than_its_queues_minimum_run_time_is_no_victim(apiserver, stack, kubelet, teams):
    """team-a borrows the whole cluster under a queue whose minRunSeconds is an hour: team-b's pod, within its
    quota, waits and nothing is evicted; once team-a's queue allows preemption at once, one pod is taken
    back."""
    a = teams("team-a", {"quotas": [{"gpus": 64}], "preemption": {"minRunSeconds": 3600}})
    b = teams("team-b", {"quotas": [{"gpus": 64}]})
    a.apply(stream(*(pod(f"p-{i}", 8, priority="low") for i in range(16))))
    a.wait_placed(16)
    b.apply(stream(pod("mine", 8)))
    b.wait_waiting(1)
    settle(5.0)
    assert kubelet.evicted_in(a.namespace) == {} and gated(b.pod("mine"))
    apiserver.kubectl(
        "patch", "gpuqueue", "team-a", "--type=merge", "-p", '{"spec":{"preemption":{"minRunSeconds":0}}}'
    )
    b.wait_placed(1, timeout=120)
    assert len(kubelet.evicted_in(a.namespace)) == 1
    assert not double_booked(stack, a, b)


def test_critical_work_preempts_across_queues_only_where_its_queue_allows_it(
    apiserver, stack, kubelet, teams
):
    """team-a runs the whole cluster within its quota of 128; team-b (quota 0) submits a critical pod:
    nothing may be reclaimed (team-a borrows nothing), so it waits while its queue says nothing of critical
    work; once team-b's queue allows `criticalAcrossQueues`, one of team-a's pods is evicted by the critical
    rule."""
    a = teams("team-a", {"quotas": [{"gpus": GPUS}]})
    b = teams("team-b", {"quotas": [{"gpus": 0}]})
    a.apply(stream(*(pod(f"p-{i}", 8, priority="low") for i in range(16))))
    a.wait_placed(16)
    b.apply(stream(pod("critical", 8, priority="critical")))
    b.wait_waiting(1)
    settle(5.0)
    assert kubelet.evicted_in(a.namespace) == {} and gated(b.pod("critical"))
    apiserver.kubectl(
        "patch",
        "gpuqueue",
        "team-b",
        "--type=merge",
        "-p",
        '{"spec":{"preemption":{"criticalAcrossQueues":true}}}',
    )
    b.wait_placed(1, timeout=120)
    evicted = kubelet.evicted_in(a.namespace)
    assert len(evicted) == 1, evicted
    told = apiserver.wait_for(
        lambda: events(apiserver, a.namespace, PREEMPTED_REASON), what="the victim's Preempted Event"
    )
    assert "(rule critical)" in told[0]["message"], told
    settle()
    assert len(kubelet.evicted_in(a.namespace)) == 1
    assert not double_booked(stack, a, b)


def test_the_ledger_killed_mid_preemption_promises_no_gpu_twice(apiserver, stack, kubelet, teams):
    """team-b's gang of 2 x 8 takes back two of team-a's borrowed pods. The victims evicted but still
    Terminating (the kubelet stand-in paused), the preemptor carrying its `gpuledger.io/preempting` record,
    the ledger actor is killed: rebuilt from the API objects, it keeps the nodes for the same preemptor, which
    is placed once when the victims are gone, and no GPU is promised twice."""
    a = teams("team-a", {"quotas": [{"gpus": 64}]})
    b = teams("team-b", {"quotas": [{"gpus": 64}]})
    a.apply(stream(*(job(f"a-{i}", 1, gang=False) for i in range(16))))
    a.wait_placed(16)
    a.apply(stream(job("a-late", 2, gang=False)))  # team-a's own work waits behind, for the GPUs freed
    a.wait_waiting(2)
    kubelet.pause()
    try:
        b.apply(stream(job("b-gang", 2)))

        def recorded_and_terminating():
            preemptors = [
                p for p in b.pods("job=b-gang") if PREEMPTING_ANNOTATION in p["metadata"]["annotations"]
            ]
            terminating = [p for p in a.pods() if p["metadata"].get("deletionTimestamp")]
            return (preemptors, terminating) if preemptors and len(terminating) == 2 else None

        preemptors, terminating = apiserver.wait_for(
            recorded_and_terminating, timeout=120, what="the record written and two victims terminating"
        )
        assert all(gated(p) for p in b.pods("job=b-gang"))  # not placed while its victims hold the GPUs
        live = stable_snapshot(stack)["nodes"]  # the terminating victims still hold their GPUs
        incarnation = stack.kill_ledger()
        stack.wait_ledger_synced(after_incarnation=incarnation)
        assert stable_snapshot(stack)["nodes"] == live  # rebuilt from the API objects, the record included
        assert all(gated(p) for p in b.pods("job=b-gang"))
        assert not double_booked(stack, a, b)
    finally:
        kubelet.resume()
    placed = b.wait_placed(2, "job=b-gang", timeout=120)
    victims_nodes = {p["spec"]["nodeName"] for p in terminating}
    assert {p["spec"]["nodeName"] for p in placed} == victims_nodes
    settle()
    evicted = kubelet.evicted_in(a.namespace, b.namespace)
    assert set(evicted) == {key(p) for p in terminating}  # no more than the plan named, after the restart
    # placed once: the same pods (uids) as before the restart, one Placed Event each, and the ledger holds
    # their 16 GPUs under their own reservations and nothing more under the plan's keep
    assert {p["metadata"]["uid"] for p in placed} == {p["metadata"]["uid"] for p in b.pods("job=b-gang")}
    names = sorted(p["metadata"]["name"] for p in placed)
    apiserver.wait_for(
        lambda: (
            sorted(e["involvedObject"]["name"] for e in events(apiserver, b.namespace, "Placed")) == names
        ),
        what="one Placed Event for each preemptor pod",
    )
    owners = [d[3] for n in stack.call("snapshot")["nodes"].values() for d in n["devices"]]
    ids = {stack.placement(p).id for p in placed}
    assert sum(1 for o in owners if o in ids) == 16
    assert not [o for o in owners if isinstance(o, str) and o.startswith("keep:")]
    assert len({stack.placement(p).group for p in placed}) == 1
    # a-late's two and the two evicted pods the Job controller makes again (after its backoff for failed pods)
    # wait: none took the kept nodes
    assert len(a.wait_waiting(4)) == 4
    assert not double_booked(stack, a, b)
    assert gpus_placed(stack, a) == 112 and gpus_placed(stack, b) == 16


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
    # the webhook reserved GPUs for the pod the API server then refused (admission webhooks run before the
    # quota is checked): the reservation expires with no pod carrying it (the sync's expiry check, at a clock
    # past the reservation's time to live)
    assert held_gpus(stack) == 16
    stack.sync.expiry.check_expiry(time.time() + stack.config.reservation_ttl_s + 1)
    assert held_gpus(stack) == 8  # the first pod's, nothing for the second
    assert gpus_placed(stack, team) == 8
    assert not double_booked(stack, team)


def test_a_critical_gang_preempts_the_fewest_pods_that_open_one_leaf_window(apiserver, stack, kubelet, teams):
    """The same full cluster with leaf-1's 4-GPU pods the youngest: two of leaf-0's 8-GPU pods still open a
    leaf window with the fewest victims (four 4-GPU pods of leaf-1 would also do: more pods)."""
    team = teams("research", {"quotas": [{"gpus": GPUS}]})
    bigs, _halves = fill_two_leaves(team, bigs_first=True)
    team.apply(stream(job("urgent", 2, priority="critical")))
    placed = team.wait_placed(2, "job=urgent", timeout=120)
    evicted = kubelet.evicted_in(team.namespace)
    assert len(evicted) == 2, sorted(evicted)
    assert set(evicted) <= {key(p) for p in bigs}
    assert {LEAF_OF[p["spec"]["nodeName"]] for p in placed} == {"leaf-0"}
    assert not double_booked(stack, team)


def test_a_pod_that_may_preempt_is_not_held_back_by_a_never_pod_ahead_of_it(apiserver, stack, kubelet, teams):
    """As in Kubernetes, a `preemptionPolicy: Never` pod does not preempt, and does not stop a pod of the
    same priority behind it that may."""
    team = teams("research", {"quotas": [{"gpus": GPUS}]})
    never = priority_class(apiserver, f"e2e-never-{team.namespace[-5:]}", 500, never=True)
    may = priority_class(apiserver, f"e2e-may-{team.namespace[-5:]}", 500)
    team.apply(stream(*(pod(f"p-{i}", 8, priority="low") for i in range(16))))
    team.wait_placed(16)
    team.apply(stream(pod("patient", 8, priority_class=never)))
    team.wait_waiting(1)
    team.apply(stream(pod("pushy", 8, priority_class=may)))
    apiserver.wait_for(
        lambda: not gated(team.pod("pushy")) and team.pod("pushy")["spec"].get("nodeName"),
        timeout=120,
        what="pushy placed",
    )
    assert len(kubelet.evicted_in(team.namespace)) == 1
    assert not double_booked(stack, team)
