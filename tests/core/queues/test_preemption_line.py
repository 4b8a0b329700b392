"""Whom the ledger plans preemptions for: the first pod of each line that may preempt. A
`preemptionPolicy: Never` pod, or one that found no plan, does not hold back a pod of its shape behind it that
may (as in Kubernetes)."""

from __future__ import annotations

from gpuledger import strategies  # noqa: F401  (registers the built-in strategies)
from tests.core.passes.test_held_plans import NOW, T0, World
from tests.core.queues.test_queue_book import gpu_queue


def one_queue_world() -> World:
    """Two 8-GPU nodes; ns-a's pods in queue team-a (quota: both nodes), ns-b's in team-b (no quota: it
    only borrows, and takes nothing back)."""
    return World(queues=(gpu_queue("team-a", 16), gpu_queue("team-b", 0)))


def test_a_pod_that_may_preempt_is_planned_for_behind_a_never_pod_of_its_shape():
    w = one_queue_world()
    w.run("low-0", "ns-a", priority=-100, started=T0)
    young = w.run("low-1", "ns-a", priority=-100, started=T0 + 60)
    w.wait("patient", "ns-a", priority=500, now=NOW, preemptionPolicy="Never")
    w.wait("pushy", "ns-a", priority=500, now=NOW + 1)
    w.ledger.place_waiting(NOW + 2)
    (plan,) = w.ledger.preemptions()
    assert plan.name == "pushy"
    assert [v.workload for v in plan.victims] == ["ns-a/low-1"]  # the youngest
    assert plan.victims[0].rule == "priority"
    # its victim gone, pushy takes the node kept for it, not patient ahead of it
    w.delete(young)
    w.ledger.release("ns-a-low-1")
    placed = w.ledger.place_waiting(NOW + 3)
    assert [p.name for p in placed] == ["pushy"]


def test_pods_that_may_preempt_are_planned_for_past_several_never_pods():
    w = one_queue_world()
    w.run("low-0", "ns-a", priority=-100, started=T0)
    w.run("low-1", "ns-a", priority=-100, started=T0 + 60)
    for i in range(3):
        w.wait(f"patient-{i}", "ns-a", priority=500, now=NOW + i, preemptionPolicy="Never")
    w.wait("pushy", "ns-a", priority=500, now=NOW + 5)
    w.ledger.place_waiting(NOW + 6)
    assert [p.name for p in w.ledger.preemptions()] == ["pushy"]


def test_no_second_plan_in_a_line_whose_first_pod_holds_one():
    w = one_queue_world()
    w.run("low-0", "ns-a", priority=-100, started=T0)
    w.run("low-1", "ns-a", priority=-100, started=T0 + 60)
    w.wait("first", "ns-a", priority=500, now=NOW)
    w.wait("second", "ns-a", priority=500, now=NOW + 1)
    w.ledger.place_waiting(NOW + 2)
    w.ledger.place_waiting(NOW + 3)
    assert [p.name for p in w.ledger.preemptions()] == ["first"]
