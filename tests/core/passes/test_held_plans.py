"""Preemptions held in the ledger: a waiting pod that does not fit gets a plan on the place pass, its nodes
are kept for it (no other pod takes them, whatever its rank), it is placed the moment its victims are gone,
a rebuild from API objects where the preemptor carries the record holds the same plan, a refused eviction
drops the plan and leaves the victim out for a while, `preemptionPolicy: Never` and minimum run times are
honoured."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from gpuledger import strategies  # noqa: F401  (registers the built-in strategies)
from gpuledger.core.ledger import Ledger, LedgerConfig, Waiting
from gpuledger.core.model import GroupSpec, Placement, Request
from gpuledger.names import PREEMPTING_ANNOTATION, QUEUE_LABEL
from tests.core.core_factory import node, pod
from tests.core.queues.test_queue_book import budget, gpu_queue, namespace
from tests.core.waiting_factory import gated_pod, placed_pod

KEY = b"plan-key"
T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()  # the pods started then
NOW = T0 + 3600.0


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class World:
    """A ledger and the API objects it followed (to rebuild from)."""

    def __init__(self, nodes: int = 2, queues: tuple[dict, ...] = (), key: bytes = KEY):
        self.key = key
        self.ledger = Ledger(LedgerConfig(placement_key=key, default_strategy="best_fit"))
        self.objects: dict[str, dict] = {}
        for i in range(nodes):
            self.apply(node(f"n{i}", 8))
        for q in queues or (gpu_queue("team-a", 8), gpu_queue("team-b", 8)):
            self.apply(q)
        self.apply(namespace("ns-a", **{QUEUE_LABEL: "team-a"}))
        self.apply(namespace("ns-b", **{QUEUE_LABEL: "team-b"}))

    def apply(self, obj: dict, now: float = NOW) -> None:
        meta = obj["metadata"]
        self.objects[f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}"] = obj
        self.ledger.apply_object(obj, now)

    def delete(self, obj: dict) -> None:
        meta = obj["metadata"]
        del self.objects[f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}"]
        self.ledger.delete_object(obj)

    def run(
        self, name: str, ns: str, gpus: int = 8, priority: int = 0, started: float = T0, **labels
    ) -> dict:
        placed = self.ledger.reserve_or_wait(
            Request(id=f"{ns}-{name}", gpus=gpus, namespace=ns, name=name, priority=priority), started
        )
        assert isinstance(placed, Placement), placed
        stored = pod(name, namespace=ns, placement=placed, key=self.key)
        stored["metadata"]["uid"] = f"uid-{ns}-{name}"
        stored["metadata"]["labels"] = labels
        stored["spec"]["priority"] = priority
        stored["status"]["startTime"] = stamp(started)
        self.apply(stored)
        return stored

    def wait(self, name: str, ns: str, gpus: int = 8, priority: int = 0, now: float = NOW, **spec) -> dict:
        answer = self.ledger.reserve_or_wait(
            Request(id=f"{ns}-{name}", gpus=gpus, namespace=ns, name=name, priority=priority), now
        )
        assert isinstance(answer, Waiting), answer
        gated = gated_pod(name, answer, self.key, namespace=ns)
        gated["spec"].update(spec)
        self.apply(gated, now)
        return gated

    def record(self, gated: dict) -> dict:
        """What the sync writes on the preemptor before evicting: the plan's record."""
        (plan,) = [p for p in self.ledger.preemptions() if p.name == gated["metadata"]["name"]]
        stored = copy.deepcopy(gated)
        stored["metadata"]["annotations"][PREEMPTING_ANNOTATION] = plan.record
        self.apply(stored)
        return stored

    def rebuilt(self) -> Ledger:
        return Ledger.rebuild(list(self.objects.values()), self.ledger.config, NOW)


def test_a_plan_is_held_its_nodes_kept_and_the_preemptor_placed_once_the_victims_are_gone():
    w = World()
    w.run("a1", "ns-a", started=T0)
    young = w.run("a2", "ns-a", started=T0 + 60)  # team-a borrows 8: the youngest is taken back
    gated = w.wait("b1", "ns-b")
    assert w.ledger.place_waiting(NOW) == []
    (plan,) = w.ledger.preemptions()
    assert plan.id == "ns-b-b1" and [v.workload for v in plan.victims] == ["ns-a/a2"]
    assert plan.victims[0].rule == "reclaim" and plan.nodes == (w.ledger.get("ns-a-a2").node,)
    assert w.ledger.preemption_victims(plan) == [
        ("ns-a", "a2", "uid-ns-a-a2", "reclaim", plan.victims[0].why)
    ]
    # another pass plans nothing new: the victim is never planned twice
    assert w.ledger.place_waiting(NOW + 1) == [] and len(w.ledger.preemptions()) == 1
    kept = plan.nodes[0]
    # a pod that ranks ahead (higher priority) arrives and waits: it never takes the kept node
    other = w.wait("a3", "ns-a", priority=100, now=NOW + 2)
    w.delete(young)  # the victim is evicted
    w.ledger.release("ns-a-a2")
    placed = w.ledger.place_waiting(NOW + 3)
    assert [(p.name, p.placement.node) for p in placed] == [("b1", kept)]
    # b1's plan is done; a3 now plans its own, within its queue, by priority, on another node
    (mine,) = w.ledger.preemptions()
    assert mine.id == "ns-a-a3" and mine.victims[0].rule == "priority" and mine.nodes != (kept,)
    w.apply(placed_pod(gated, placed[0].placement, KEY))
    assert other["metadata"]["name"] in [e.waiter.name for e in w.ledger.waiting_line()]


def test_a_newcomer_is_not_admitted_onto_kept_gpus():
    w = World()
    w.run("a1", "ns-a")
    w.run("a2", "ns-a", gpus=4, started=T0 + 60)  # team-a borrows 4 on one node, 4 of it free
    w.wait("b1", "ns-b")  # 8 GPUs: a2's node makes room
    w.ledger.place_waiting(NOW)
    (plan,) = w.ledger.preemptions()
    assert [v.workload for v in plan.victims] == ["ns-a/a2"]
    newcomer = w.ledger.reserve_or_wait(Request(id="ns-b-small", gpus=1, namespace="ns-b", name="s"), NOW)
    assert isinstance(newcomer, Waiting)  # the node's 4 free GPUs are kept for b1


def test_rebuild_equals_live_mid_preemption_when_the_preemptor_carries_the_record():
    w = World()
    w.run("a1", "ns-a")
    young = w.run("a2", "ns-a", started=T0 + 60)
    gated = w.wait("b1", "ns-b")
    w.ledger.place_waiting(NOW)
    w.record(gated)
    (plan,) = w.ledger.preemptions()
    assert plan.recorded
    rebuilt = w.rebuilt()
    assert rebuilt.snapshot() == w.ledger.snapshot()
    assert [(p.id, p.nodes) for p in rebuilt.preemptions()] == [(plan.id, plan.nodes)]
    # the victim goes: both the same, then both place the preemptor on the kept node, once
    w.delete(young)
    w.ledger.release("ns-a-a2")
    rebuilt = w.rebuilt()
    assert rebuilt.snapshot() == w.ledger.snapshot()
    live = w.ledger.place_waiting(NOW + 1)
    again = rebuilt.place_waiting(NOW + 1)
    assert [(p.name, p.placement.node) for p in live] == [(p.name, p.placement.node) for p in again]
    assert [p.name for p in live] == ["b1"]


def test_a_record_without_the_placement_keys_signature_is_not_adopted():
    w = World()
    w.run("a1", "ns-a")
    w.run("a2", "ns-a", started=T0 + 60)
    gated = w.wait("b1", "ns-b")
    w.ledger.place_waiting(NOW)
    stored = w.record(gated)
    stored["metadata"]["annotations"][PREEMPTING_ANNOTATION] = stored["metadata"]["annotations"][
        PREEMPTING_ANNOTATION
    ].replace("a2", "a1")
    w.apply(stored)
    assert w.rebuilt().preemptions() == []


def test_a_refused_eviction_drops_the_plan_and_the_victim_is_left_out_for_a_while():
    w = World(nodes=3, queues=(gpu_queue("team-a", 8), gpu_queue("team-b", 8)))
    w.run("a1", "ns-a", started=T0)
    w.run("a2", "ns-a", started=T0 + 60)
    w.run("a3", "ns-a", started=T0 + 120)
    w.wait("b1", "ns-b")
    w.ledger.place_waiting(NOW)
    (plan,) = w.ledger.preemptions()
    assert [v.workload for v in plan.victims] == ["ns-a/a3"]
    w.ledger.eviction_refused(plan.id, "ns-a", "a3", NOW)
    assert w.ledger.snapshot().get("preemptions") is None  # its node is free of the keep
    w.ledger.place_waiting(NOW + 1)
    (again,) = w.ledger.preemptions()
    assert [v.workload for v in again.victims] == ["ns-a/a2"]  # a3 left out for now
    w.ledger.eviction_refused(again.id, "ns-a", "a2", NOW + 1)
    w.ledger.place_waiting(NOW + 2 + w.ledger.refused_victim_s)
    (third,) = w.ledger.preemptions()
    assert [v.workload for v in third.victims] == ["ns-a/a3"]  # its time out is over


def test_preemption_policy_never_waits_without_a_plan_and_explain_says_why():
    w = World()
    w.run("a1", "ns-a")
    w.run("a2", "ns-a", started=T0 + 60)
    w.wait("b1", "ns-b", preemptionPolicy="Never")
    w.ledger.place_waiting(NOW)
    assert w.ledger.preemptions() == []
    req = Request(id="ns-b-b1", gpus=8, namespace="ns-b", name="b1")
    words = w.ledger.explain(req, with_scores=False, now=NOW).preemption
    assert "preemptionPolicy is Never" in words


def test_a_workload_younger_than_its_queues_minimum_run_time_is_no_victim():
    queues = (gpu_queue("team-a", 8, preemption={"minRunSeconds": 600}), gpu_queue("team-b", 8))
    w = World(queues=queues)
    w.run("a1", "ns-a", started=T0)
    w.run("a2", "ns-a", started=NOW - 60)  # the youngest, but it ran only a minute
    w.wait("b1", "ns-b")
    w.ledger.place_waiting(NOW)
    (plan,) = w.ledger.preemptions()
    assert [v.workload for v in plan.victims] == ["ns-a/a1"]


def test_a_pod_disruption_budget_blocks_a_victim_and_the_plan_takes_another():
    w = World(nodes=3)
    w.apply(budget("ns-a", "keep-a3", 0, app="a3"))
    w.run("a1", "ns-a", started=T0)
    w.run("a2", "ns-a", started=T0 + 60)
    w.run("a3", "ns-a", started=T0 + 120, app="a3")
    w.wait("b1", "ns-b")
    w.ledger.place_waiting(NOW)
    (plan,) = w.ledger.preemptions()
    assert [v.workload for v in plan.victims] == ["ns-a/a2"]


def test_explain_shows_the_plan_for_a_pod_that_would_wait():
    w = World()
    w.run("a1", "ns-a")
    w.run("a2", "ns-a", started=T0 + 60)
    req = Request(id="ns-b-new", gpus=8, namespace="ns-b", name="new")
    words = w.ledger.explain(req, now=NOW).preemption
    assert "preempts 1 workload(s): ns-a/a2" in words and "reclaim" in words
    assert w.ledger.explain(req).preemption == ""  # without `now`: the decision alone


def test_with_no_gpu_queue_nothing_is_planned():
    w = World(queues=(gpu_queue("team-a", 8),))
    w.delete(w.objects["GPUQueue//team-a"])
    w.run("a1", "ns-a")
    w.run("a2", "ns-a")
    w.wait("b1", "ns-b", priority=1000)
    w.ledger.place_waiting(NOW)
    assert w.ledger.preemptions() == []
    assert "preemptions" not in w.ledger.snapshot()


def test_the_issue_scenario_two_teams_reclaim_exactly_the_borrowed_gangs_then_both_run_at_quota():
    """Two teams with 64 GPUs of quota each on 128 GPUs: team-a runs 8 gangs of 2 x 8 GPUs (it borrows all
    of team-b's quota); team-b submits a gang of 8 x 8 GPUs: one plan takes back exactly four whole gangs,
    their nodes are kept, and once they are gone the gang runs there and both teams use their quota."""
    w = World(nodes=16, queues=(gpu_queue("team-a", 64), gpu_queue("team-b", 64)))
    gangs: dict[str, list[dict]] = {}
    for g in range(8):
        spec = GroupSpec(f"job/ns-a/train-{g}", 2)
        for m in range(2):
            name = f"train-{g}-{m}"
            req = Request(id=f"ns-a-{name}", gpus=8, namespace="ns-a", name=name, group=spec)
            placed = w.ledger.reserve_or_wait(req, T0 + g)
            assert isinstance(placed, Placement), placed
            stored = pod(name, namespace="ns-a", placement=placed, key=w.key)
            stored["metadata"]["uid"] = f"uid-{name}"
            stored["status"]["startTime"] = stamp(T0 + g)
            w.apply(stored)
            gangs.setdefault(spec.key, []).append(stored)
    spec = GroupSpec("job/ns-b/big", 8)
    gated = {}
    for m in range(8):
        name = f"big-{m}"
        req = Request(id=f"ns-b-{name}", gpus=8, namespace="ns-b", name=name, group=spec)
        answer = w.ledger.reserve_or_wait(req, NOW + m)
        assert isinstance(answer, Waiting), answer
        gated[name] = gated_pod(name, answer, w.key, namespace="ns-b")
        w.apply(gated[name], NOW + m)
    assert w.ledger.place_waiting(NOW + 10) == []
    (plan,) = w.ledger.preemptions()
    assert sorted(v.workload for v in plan.victims) == [f"job/ns-a/train-{g}" for g in (4, 5, 6, 7)]
    assert all(v.rule == "reclaim" and len(v.pods) == 2 for v in plan.victims)  # whole gangs, the youngest
    assert len(plan.nodes) == 8
    w.record(gated["big-0"])
    assert w.rebuilt().snapshot() == w.ledger.snapshot()
    for v in plan.victims:
        for stored in gangs[v.workload]:
            w.delete(stored)
    placed = w.ledger.place_waiting(NOW + 20)
    assert sorted(p.name for p in placed) == [f"big-{m}" for m in range(8)]
    assert {p.placement.node for p in placed} == set(plan.nodes)
    for p in placed:
        w.apply(placed_pod(gated[p.name], p.placement, w.key))
    accounts = w.ledger.queue_accounts()
    assert accounts is not None
    assert accounts.usage.total("team-a") == accounts.usage.total("team-b") == 64 * 1000
