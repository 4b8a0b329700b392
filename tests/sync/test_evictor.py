"""The eviction adapter through the real API server (with the disruption controller running, so
PodDisruptionBudgets hold): the plan recorded on the preemptor before anything is evicted, each victim evicted
through the Eviction API with its budget and its termination grace honoured, the Events on the victim's owner
and on the preemptor posted once even when an order is carried out again after a restart, a refusal handed
back to the ledger by the forwarding thread, and a void order (its preemptor gone) changing nothing.

The last test runs the real ledger (a `LedgerService` in this process) behind the sync: its own plan,
carried out. The others drive the adapter with `OrdersTarget`, a small target that hands out the orders a
test gives it and records what it is told (`preemptions_due`, `eviction_refused`), to reach what a plan
rarely makes on purpose: a refusal, a void order, a restart mid-way. What the ledger plans is tested with
the ledger (tests/core/queues/test_preemption*.py, tests/core/passes/test_held_plans.py); the webhook's
whole path is tests/e2e's.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from devcluster.cluster import CONTROLLERS, ControlPlane
from gpuledger.names import PREEMPTED_REASON, PREEMPTING_ANNOTATION, PREEMPTING_REASON
from gpuledger.service.preemption_orders import Eviction, EvictionRefused, PreemptionOrder
from gpuledger.sync.evictor import Evictor, owner_of
from tests.conftest import require_binaries

pytestmark = pytest.mark.e2e

T = 1_700_000_000.0


@pytest.fixture(scope="module")
def apiserver():
    """A control plane of this module's own whose controllers include the disruption controller (it keeps
    each PodDisruptionBudget's status, which the Eviction API checks)."""
    require_binaries()
    with ControlPlane(controllers=(*CONTROLLERS, "disruption-controller")) as cp:
        yield cp


@pytest.fixture
def core(apiserver):
    from kubernetes import client

    return client.CoreV1Api(apiserver.api_client())


@pytest.fixture
def ns(apiserver):
    name = f"evict-{uuid.uuid4().hex[:6]}"
    apiserver.create_namespace(name, admission=False)
    yield name
    apiserver.force_delete("pods", namespace=name)
    apiserver.kubectl("delete", "namespace", name, "--wait=false", check=False)


class OrdersTarget:
    """The ledger's two preemption calls: hands out `orders`, records the refusals it is told of."""

    def __init__(self, orders: list[PreemptionOrder]):
        self.orders = orders
        self.refused: list[EvictionRefused] = []
        self.holders: list[str] = []
        self.lock = threading.Lock()

    def preemptions_due(self, holder: str) -> list[PreemptionOrder]:
        with self.lock:
            self.holders.append(holder)
            return list(self.orders)

    def eviction_refused(self, refusals: list[EvictionRefused], holder: str) -> None:
        with self.lock:
            self.refused.extend(refusals)


def pod(name: str, node: str | None = None, grace: int | None = None, labels: dict | None = None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def create(core, ns: str, body: dict) -> dict:
    return json.loads(core.create_namespaced_pod(ns, body, _preload_content=False).data)


def running_ready(core, ns: str, name: str) -> None:
    """What a kubelet would report: the pod Running and Ready (a budget counts only healthy pods)."""
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    core.patch_namespaced_pod_status(name, ns, {"status": status})


def victim(
    stored: dict, rule: str = "reclaim", why: str = "queue team-a borrows 8 GPUs team-b lent"
) -> Eviction:
    meta = stored["metadata"]
    return Eviction(meta["namespace"], meta["name"], meta["uid"], rule, why)


def order(preemptor: dict, victims: list[Eviction], oid: str = "rid-pre", recorded: bool = False):
    meta = preemptor["metadata"]
    record = json.dumps({"id": oid, "victims": [v.uid for v in victims], "nodes": ["n1"]})
    message = f"evicting {len(victims)} pods of queue team-a: queue team-b takes back what it lent"
    return PreemptionOrder(
        oid, meta["namespace"], meta["name"], meta["uid"], tuple(victims), ("n1",), record, recorded, message
    )


def events(apiserver, ns: str, reason: str) -> list[dict]:
    return [e for e in apiserver.get_json("events", "-n", ns)["items"] if e["reason"] == reason]


def gone(apiserver, ns: str, name: str, uid: str) -> bool:
    pods = apiserver.get_json("pods", "-n", ns)["items"]
    return not any(p["metadata"]["name"] == name and p["metadata"]["uid"] == uid for p in pods)


def job(name: str) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x"}]}},
        },
    }


def test_the_plan_is_recorded_then_each_victim_evicted_and_its_owner_and_the_preemptor_told(
    apiserver, core, ns
):
    apiserver.apply({**job("trainer"), "metadata": {"name": "trainer", "namespace": ns}})
    job_pod = apiserver.wait_for(
        lambda: next(iter(apiserver.pods(ns, "job-name=trainer")), None), what="the Job's pod"
    )
    job_uid = apiserver.get_json("job", "trainer", "-n", ns)["metadata"]["uid"]
    bare = create(core, ns, pod("bare"))
    preemptor = create(core, ns, pod("critical"))
    victims = [victim(job_pod), victim(bare, "priority", "priority 1000 over 10 in queue team-a")]
    plan = order(preemptor, victims)
    target = OrdersTarget([plan])
    evictor = Evictor(core, clock=lambda: T).start()
    try:
        assert evictor.after_apply(target, "sync-a") == 1
        assert evictor.drain()
        stored = apiserver.get_json("pod", "critical", "-n", ns)
        assert stored["metadata"]["annotations"][PREEMPTING_ANNOTATION] == plan.record
        for v in victims:  # unscheduled pods: deleted at once (no grace to wait for without a node)
            apiserver.wait_for(lambda v=v: gone(apiserver, ns, v.name, v.uid), what=f"{v.name} evicted")
        assert (evictor.stats.evicted, evictor.stats.refused, evictor.stats.gone) == (2, 0, 0)

        preempted = events(apiserver, ns, PREEMPTED_REASON)
        on = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]): e for e in preempted}
        assert set(on) == {("Job", "trainer"), ("Pod", "bare")}  # the owner, else the pod itself
        assert on[("Job", "trainer")]["involvedObject"]["uid"] == job_uid
        assert all(e["type"] == "Warning" for e in preempted)
        assert on[("Job", "trainer")]["message"] == (
            f"gpuledger: pod {job_pod['metadata']['name']} evicted for pod {ns}/critical (rule reclaim): "
            "queue team-a borrows 8 GPUs team-b lent"
        )
        assert "(rule priority): priority 1000 over 10 in queue team-a" in on[("Pod", "bare")]["message"]
        [told] = events(apiserver, ns, PREEMPTING_REASON)
        assert told["type"] == "Normal" and told["involvedObject"]["name"] == "critical"
        assert told["message"] == f"gpuledger: {plan.message}"

        # handed out again (its victims not yet seen gone by the ledger): carried out once per process
        assert evictor.after_apply(target, "sync-a") == 0
    finally:
        evictor.stop()

    # a restarted sync is handed the same order: carried out again, harmlessly, and told once
    again = Evictor(core, clock=lambda: T + 5).start()
    try:
        assert again.after_apply(target, "sync-b") == 1 and again.drain()
        assert (again.stats.evicted, again.stats.gone) == (0, 2)
    finally:
        again.stop()
    assert len(events(apiserver, ns, PREEMPTED_REASON)) == 2
    assert len(events(apiserver, ns, PREEMPTING_REASON)) == 1


def test_a_large_plan_is_evicted_a_bounded_number_at_a_time_after_its_record(apiserver, core, ns):
    """A reclaim of many pods is not one round trip after another: the victims are evicted `parallel` at a
    time, never more, each once and each owner told once, after the record is on the preemptor."""
    bodies = [create(core, ns, pod(f"v-{i}")) for i in range(24)]
    preemptor = create(core, ns, pod("big"))
    plan = order(preemptor, [victim(b) for b in bodies], oid="rid-many")
    evict = core.create_namespaced_pod_eviction
    lock, in_flight, most, recorded_first = threading.Lock(), [0], [0], []

    def counted(*args, **kwargs):  # the real call, counted: how many are in flight at once
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        stored = apiserver.get_json("pod", "big", "-n", ns)["metadata"].get("annotations") or {}
        recorded_first.append(PREEMPTING_ANNOTATION in stored)
        try:
            return evict(*args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    core.create_namespaced_pod_eviction = counted
    evictor = Evictor(core, clock=lambda: T, parallel=4).start()
    try:
        assert evictor.after_apply(OrdersTarget([plan]), "sync-a") == 1 and evictor.drain(timeout=60)
    finally:
        evictor.stop()
        core.create_namespaced_pod_eviction = evict
    assert evictor.stats.evicted == 24 and all(recorded_first) and len(recorded_first) == 24
    assert 1 < most[0] <= 4, most
    for b in bodies:
        apiserver.wait_for(lambda b=b: gone(apiserver, ns, b["metadata"]["name"], b["metadata"]["uid"]))
    assert len(events(apiserver, ns, PREEMPTED_REASON)) == 24
    assert len(events(apiserver, ns, PREEMPTING_REASON)) == 1


def test_a_victims_termination_grace_is_honoured_and_a_repeat_is_not_told_twice(apiserver, core, ns):
    apiserver.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{ns}"}})
    held = create(core, ns, pod("graceful", node=f"node-{ns}", grace=120))
    running_ready(core, ns, "graceful")
    preemptor = create(core, ns, pod("waiter"))
    plan = order(preemptor, [victim(held)], oid="rid-grace")
    for attempt in range(2):  # a second process (a restart) is handed the same order while it terminates
        evictor = Evictor(core, clock=lambda: T).start()
        try:
            assert evictor.after_apply(OrdersTarget([plan]), "sync") == 1 and evictor.drain()
            assert evictor.stats.evicted == 1, attempt  # a terminating pod's eviction is accepted again
        finally:
            evictor.stop()
    stored = apiserver.get_json("pod", "graceful", "-n", ns)  # the kubelet's to end: it waits for it
    assert stored["metadata"]["deletionTimestamp"] and stored["metadata"]["deletionGracePeriodSeconds"] == 120
    assert len(events(apiserver, ns, PREEMPTED_REASON)) == 1
    assert len(events(apiserver, ns, PREEMPTING_REASON)) == 1


def test_a_disruption_budget_refuses_and_the_refusal_goes_to_the_ledger(apiserver, core, ns):
    from kubernetes import client

    node = f"node-{ns}"
    apiserver.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    guarded = create(core, ns, pod("guarded", node=node, grace=0, labels={"app": "serving"}))
    free = create(core, ns, pod("free", node=node, grace=0, labels={"app": "batch"}))
    for name in ("guarded", "free"):
        running_ready(core, ns, name)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "serving"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "serving"}}},
    }
    client.PolicyV1Api(apiserver.api_client()).create_namespaced_pod_disruption_budget(ns, budget)
    apiserver.wait_for(
        lambda: apiserver.get_json("pdb", "serving", "-n", ns).get("status", {}).get("observedGeneration"),
        what="the disruption controller's status on the budget",
    )
    preemptor = create(core, ns, pod("critical"))
    plan = order(preemptor, [victim(free), victim(guarded)], oid="rid-pdb")
    target = OrdersTarget([plan])
    evictor = Evictor(core, clock=lambda: T).start()
    try:
        evictor.after_apply(target, "sync")
        assert evictor.drain()
        assert (evictor.stats.evicted, evictor.stats.refused) == (1, 1)
        assert target.refused == []  # handed over by the forwarding thread, at its next call
        target.orders = []  # the ledger dropped the plan
        assert evictor.after_apply(target, "sync") == 0
    finally:
        evictor.stop()
    [refusal] = target.refused
    assert (refusal.order_id, refusal.name, refusal.uid, refusal.status) == (
        "rid-pdb",
        "guarded",
        guarded["metadata"]["uid"],
        429,
    )
    assert "disruption budget" in refusal.message
    assert apiserver.get_json("pod", "guarded", "-n", ns)["metadata"].get("deletionTimestamp") is None
    apiserver.wait_for(lambda: gone(apiserver, ns, "free", free["metadata"]["uid"]), what="free evicted")
    assert events(apiserver, ns, PREEMPTING_REASON) == []  # the plan was not carried out whole


def test_an_order_whose_preemptor_is_gone_is_void_and_evicts_nothing(apiserver, core, ns):
    held = create(core, ns, pod("held"))
    preemptor = create(core, ns, pod("left"))
    plan = order(preemptor, [victim(held)], oid="rid-void")
    core.delete_namespaced_pod("left", ns, grace_period_seconds=0)
    apiserver.wait_for(lambda: gone(apiserver, ns, "left", preemptor["metadata"]["uid"]), what="deleted")
    create(core, ns, pod("left"))  # a new pod of the same name is not the preemptor
    evictor = Evictor(core, clock=lambda: T).start()
    try:
        evictor.after_apply(OrdersTarget([plan]), "sync")
        assert evictor.drain()
        # handed out again until the ledger sees its preemptor gone: not tried again meanwhile
        assert evictor.after_apply(OrdersTarget([plan]), "sync") == 0
    finally:
        evictor.stop()
    assert (evictor.stats.void, evictor.stats.evicted) == (1, 0)
    assert not gone(apiserver, ns, "held", held["metadata"]["uid"])
    annotations = apiserver.get_json("pod", "left", "-n", ns)["metadata"].get("annotations") or {}
    assert PREEMPTING_ANNOTATION not in annotations


def test_the_owner_is_the_controller_reference_else_the_pod():
    meta = {"name": "p", "namespace": "ns", "uid": "u"}
    assert owner_of({"metadata": meta}) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "u",
    }
    refs = [
        {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "x"},
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "y", "controller": True},
    ]
    assert owner_of({"metadata": {**meta, "ownerReferences": refs}})["kind"] == "Job"


def test_the_sync_asks_for_orders_after_each_batch_and_hands_refusals_back(apiserver, core, ns):
    """Wired in the cluster sync, as the product's identity (its RBAC): the forwarding thread asks the ledger
    (a real `LedgerService` in this process, the orders handed out by the test) right after a batch, and hands
    the refusals back at its next call."""
    from devcluster.cluster import WEBHOOK_USER
    from gpuledger.core.ledger import LedgerConfig
    from gpuledger.service.ledger_service import LedgerService
    from gpuledger.sync.cluster_sync import ClusterSync
    from gpuledger.sync.config import SyncConfig
    from gpuledger.sync.targets import LocalLedgerTarget

    class Target(LocalLedgerTarget):
        def __init__(self, service, orders: OrdersTarget):
            super().__init__(service)
            self.orders = orders

        def preemptions_due(self, holder):
            return self.orders.preemptions_due(holder)

        def eviction_refused(self, refusals, holder):
            self.orders.eviction_refused(refusals, holder)

    node = f"node-{ns}"
    apiserver.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    doomed = create(core, ns, pod("doomed"))
    guarded = create(core, ns, pod("guarded", node=node, grace=0, labels={"app": "serving"}))
    running_ready(core, ns, "guarded")
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "serving", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "serving"}}},
    }
    apiserver.apply(budget)
    apiserver.wait_for(
        lambda: apiserver.get_json("pdb", "serving", "-n", ns).get("status", {}).get("observedGeneration"),
        what="the disruption controller's status on the budget",
    )
    preemptor = create(core, ns, pod("critical"))
    orders = OrdersTarget([])
    service = LedgerService(LedgerConfig(default_strategy="best_fit"), None)
    config = SyncConfig(batch_linger_s=0.01, expiry_interval_s=3600, status_interval_s=0.2)
    sync = ClusterSync(apiserver.api_client(WEBHOOK_USER), Target(service, orders), config).start()
    try:
        assert sync.wait_synced(60), sync.stats
        orders.orders = [order(preemptor, [victim(doomed), victim(guarded)], oid="rid-sync")]
        create(core, ns, pod("nudge"))  # a batch: the forwarding thread asks right after it
        apiserver.wait_for(lambda: gone(apiserver, ns, "doomed", doomed["metadata"]["uid"]), what="evicted")
        orders.orders = []  # the ledger dropped the plan the budget refused
        create(core, ns, pod("nudge-2"))
        apiserver.wait_for(lambda: orders.refused, what="the refusal handed to the ledger")
    finally:
        sync.stop()
    # the order may be handed out again before the test drops it (victims are evicted in parallel, so the
    # refusal can come back before the doomed pod's deletion is seen): each time the same refusal
    assert {(r.name, r.status) for r in orders.refused} == {("guarded", 429)}
    assert set(orders.holders) == {sync.identity}
    assert sync.evictor.stats.evicted == 1 and sync.evictor.stats.refused >= len(orders.refused) >= 1
    stored = apiserver.get_json("pod", "critical", "-n", ns)
    assert PREEMPTING_ANNOTATION in stored["metadata"]["annotations"]
    assert len(events(apiserver, ns, PREEMPTED_REASON)) == 1  # posted as the product's identity


def test_the_counters_are_exported_with_the_syncs():
    from prometheus_client.parser import text_string_to_metric_families

    from gpuledger.sync.config import SyncStats
    from gpuledger.sync.evictor import EvictorStats
    from gpuledger.webhook.metrics import WebhookMetrics

    metrics = WebhookMetrics()
    stats = SyncStats(leading=True, evictions=EvictorStats(evicted=3, refused=1))
    metrics.watch_sync(stats)
    stats.evictions.gone = 2  # type: ignore[union-attr]  # read at each scrape
    [family] = [
        f
        for f in text_string_to_metric_families(metrics.exposition().decode())
        if f.name == "gpuledger_preemption_evictions"
    ]
    counts = {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert counts == {"evicted": 3, "refused": 1, "gone": 2, "void": 0, "failed": 0}


KEY = b"evictor-test-key"


def test_the_ledgers_own_plan_is_carried_out_and_the_preemptor_placed_on_the_node_it_frees(apiserver, core):
    """The whole adapter path with the real ledger (a `LedgerService` in this process behind the sync, as the
    product's identity): team-a borrows both nodes, team-b's pod waits, the ledger plans to take back one of
    team-a's pods; the sync records the plan on the preemptor, evicts the victim, and once the victim is gone
    the placer writes the preemptor's placement on the node it freed. The queues' status shows it."""
    from devcluster.cluster import WEBHOOK_USER
    from devcluster.nodes import create_nodes, make_node
    from gpuledger.core.ledger import LedgerConfig
    from gpuledger.core.model import Placement, Request
    from gpuledger.core.pods.placement_codec import Binding, decode_placement, encode_placement
    from gpuledger.core.pods.waiting_codec import WaitTicket, encode_waiting
    from gpuledger.core.queues.waiting import Waiting
    from gpuledger.names import (
        GPU_RESOURCE,
        PLACEMENT_ANNOTATION,
        QUEUE_API_VERSION,
        QUEUE_LABEL,
        RESERVATION_ID_KEY,
        SCHEDULING_GATE,
        WAITING_ANNOTATION,
    )
    from gpuledger.service.ledger_service import AdmitCall, LedgerService
    from gpuledger.sync.cluster_sync import ClusterSync
    from gpuledger.sync.config import SyncConfig
    from gpuledger.sync.targets import LocalLedgerTarget

    tag = uuid.uuid4().hex[:6]
    nodes = [make_node(f"q-{tag}-{i}", "s-q", f"leaf-q-{tag}") for i in range(2)]
    create_nodes(apiserver.api_client(), nodes)
    ns_a = apiserver.create_namespace(f"team-a-{tag}", admission=False)
    ns_b = apiserver.create_namespace(f"team-b-{tag}", admission=False)
    queues = {ns_a: f"team-a-{tag}", ns_b: f"team-b-{tag}"}
    for ns, queue_name in queues.items():
        apiserver.kubectl("label", "namespace", ns, f"{QUEUE_LABEL}={queue_name}")
        apiserver.apply(
            {
                "apiVersion": QUEUE_API_VERSION,
                "kind": "GPUQueue",
                "metadata": {"name": queue_name},
                "spec": {"quotas": [{"gpus": 8}]},
            }
        )
    service = LedgerService(LedgerConfig(placement_key=KEY, default_strategy="best_fit"), None)
    config = SyncConfig(batch_linger_s=0.01, expiry_interval_s=3600, queue_status_interval_s=3600)
    sync = ClusterSync(apiserver.api_client(WEBHOOK_USER), LocalLedgerTarget(service), config).start()
    try:
        assert sync.wait_synced(60), sync.stats
        apiserver.wait_for(lambda: service.ledger.queue_of(ns_b) == queues[ns_b], what="the queues followed")

        def admit(name: str, ns: str):
            req = Request(id=f"{ns}-{name}", gpus=8, namespace=ns, name=name)
            [answer] = service.admit([AdmitCall(req, may_wait=True)], time.time())
            return answer

        held = {}
        for name in ("a1", "a2"):  # team-a runs on both nodes: it borrows the 8 team-b does not use
            placement = admit(name, ns_a)
            assert isinstance(placement, Placement), placement
            body = pod(name, node=placement.node, grace=0)
            body["metadata"]["annotations"] = {
                PLACEMENT_ANNOTATION: encode_placement(placement, KEY, Binding(ns_a, name))
            }
            body["metadata"]["labels"] = {RESERVATION_ID_KEY: placement.id}
            body["spec"]["containers"][0]["resources"] = {"limits": {GPU_RESOURCE: "8"}}
            held[name] = create(core, ns_a, body)
        apiserver.wait_for(
            lambda: all(service.ledger.state_of(f"{ns_a}-{n}").name == "CONFIRMED" for n in held),
            what="team-a's pods confirmed",
        )
        answer = admit("b1", ns_b)
        assert isinstance(answer, Waiting), answer
        ticket = WaitTicket(answer.request, answer.arrival, Binding(ns_b, "b1"))
        gated = pod("b1")
        gated["metadata"]["annotations"] = {WAITING_ANNOTATION: encode_waiting(ticket, KEY)}
        gated["spec"]["schedulingGates"] = [{"name": SCHEDULING_GATE}]
        create(core, ns_b, gated)

        def placed():
            stored = apiserver.get_json("pod", "b1", "-n", ns_b)
            return stored if not stored["spec"].get("schedulingGates") else None

        stored = apiserver.wait_for(placed, timeout=60, what="the preemptor placed")
        evicted = [n for n, p in held.items() if gone(apiserver, ns_a, n, p["metadata"]["uid"])]
        assert len(evicted) == 1, evicted  # the plan is minimal: one 8-GPU pod
        victim_node = held[evicted[0]]["spec"]["nodeName"]
        annotations = stored["metadata"]["annotations"]
        assert decode_placement(annotations[PLACEMENT_ANNOTATION], KEY).node == victim_node
        assert evicted[0] in annotations[PREEMPTING_ANNOTATION]  # recorded before the eviction
        [preempted] = events(apiserver, ns_a, PREEMPTED_REASON)
        assert preempted["involvedObject"]["name"] == evicted[0]
        assert f"for pod {ns_b}/b1 (rule reclaim)" in preempted["message"]
        assert [e["involvedObject"]["name"] for e in events(apiserver, ns_b, PREEMPTING_REASON)] == ["b1"]
        assert sync.evictor.stats.evicted == 1

        assert sync.queue_status.tick() == 2
        a = apiserver.get_json("gpuqueues", queues[ns_a])["status"]
        assert (a["quota"], a["used"], a["borrowed"]) == (8, 8, 0)  # back within its quota
    finally:
        sync.stop()
        apiserver.kubectl("delete", "gpuqueues", *queues.values(), "--wait=false", check=False)
