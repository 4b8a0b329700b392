"""The ledger with GPU queues: a pod whose queue would go above its quota and borrowing limit waits (or is
denied, naming the queue, its use and its quota); the line gives freed GPUs to the queue furthest below its
fair share first; with no GPUQueue the ledger decides as it always did."""

from __future__ import annotations

from gpuledger import strategies  # noqa: F401  (registers the built-in strategies)
from gpuledger.core.ledger import Ledger, LedgerConfig, Waiting
from gpuledger.core.model import Denial, Placement, Request
from gpuledger.names import QUEUE_LABEL
from tests.core.core_factory import node, pod
from tests.core.queues.test_queue_book import gpu_queue, namespace
from tests.core.waiting_factory import gated_pod, placed_pod

KEY = b"queue-key"


def queued_ledger(nodes: int = 2, *queues: dict) -> Ledger:
    led = Ledger(LedgerConfig(placement_key=KEY, default_strategy="best_fit"))
    for i in range(nodes):
        led.apply_object(node(f"n{i}", 8), 0.0)
    for q in queues:
        led.apply_object(q, 0.0)
    led.apply_object(namespace("ns-a", **{QUEUE_LABEL: "team-a"}), 0.0)
    led.apply_object(namespace("ns-b", **{QUEUE_LABEL: "team-b"}), 0.0)
    return led


def capped(name: str, gpus: int) -> dict:
    """A queue of `gpus` GPUs that may borrow none."""
    return gpu_queue(name, gpus, quotas=[{"product": "any", "gpus": gpus, "borrowingLimit": 0}])


def req(name: str, namespace: str, gpus: int = 8, priority: int = 0) -> Request:
    return Request(id=f"{namespace}-{name}", gpus=gpus, namespace=namespace, name=name, priority=priority)


def run(led: Ledger, name: str, namespace: str, gpus: int = 8, now: float = 0.0) -> dict:
    """Admit and store a running pod."""
    placed = led.reserve_or_wait(req(name, namespace, gpus), now)
    assert isinstance(placed, Placement), placed
    stored = pod(name, namespace=namespace, placement=placed, key=KEY)
    led.apply_object(stored, now)
    return stored


def wait(led: Ledger, name: str, namespace: str, gpus: int = 8, now: float = 0.0) -> tuple[Waiting, dict]:
    answer = led.reserve_or_wait(req(name, namespace, gpus), now)
    assert isinstance(answer, Waiting), answer
    gated = gated_pod(name, answer, KEY, namespace=namespace)
    led.apply_object(gated, now)
    return answer, gated


def test_a_queue_at_its_limit_waits_and_the_message_names_its_quota_and_use():
    led = queued_ledger(2, capped("team-a", 8))
    run(led, "a1", "ns-a")
    answer = led.reserve_or_wait(req("a2", "ns-a"), 1.0)
    assert isinstance(answer, Waiting), answer
    assert "queue team-a is at its limit: 8 of 8 GPUs used (quota 8, may borrow 0)" in answer.message
    denied = led.reserve_or_wait(req("a3", "ns-a"), 1.0, may_wait=False)
    assert isinstance(denied, Denial)
    assert "queue team-a is at its limit: 8 of 8 GPUs used (quota 8, may borrow 0)" in denied.message
    assert led.get("ns-a-a2") is None and led.get("ns-a-a3") is None  # nothing reserved


def test_a_waiting_pod_over_its_quota_holds_back_only_its_queue_even_past_the_backfill_window():
    led = queued_ledger(
        3,
        capped("team-a", 8),
        gpu_queue("team-b", 2),
    )
    run(led, "a1", "ns-a")
    run(led, "b0", "ns-b")
    filler = run(led, "b-fill", "ns-b")  # team-b borrows 14: team-a is first in the fair order
    wait(led, "a2", "ns-a", now=1.0)
    wait(led, "b1", "ns-b", now=2.0)
    led.delete_object(filler)
    led.release("ns-b-b-fill")
    placed = led.place_waiting(10_000.0)  # a2 waited past the window, but its queue holds it back
    assert [p.name for p in placed] == ["b1"]
    assert [e.waiter.name for e in led.waiting_line() if not e.placing] == ["a2"]


def test_freed_gpus_go_to_the_queue_furthest_below_its_fair_share():
    queues = (gpu_queue("team-a", 8), gpu_queue("team-b", 8))
    led = queued_ledger(2, *queues)
    run(led, "a1", "ns-a")
    filler = run(led, "a0", "ns-a")  # team-a borrows 8
    wait(led, "a2", "ns-a", now=1.0)  # arrived first
    wait(led, "b1", "ns-b", now=2.0)
    led.delete_object(filler)
    led.release("ns-a-a0")
    assert [p.name for p in led.place_waiting(3.0)] == ["b1"]


def test_without_gpu_queues_the_line_is_first_come_first_served_and_no_quota_applies():
    led = queued_ledger(2)
    run(led, "a1", "ns-a")
    filler = run(led, "a0", "ns-a")
    wait(led, "a2", "ns-a", now=1.0)
    wait(led, "b1", "ns-b", now=2.0)
    led.delete_object(filler)
    led.release("ns-a-a0")
    assert [p.name for p in led.place_waiting(3.0)] == ["a2"]


def test_a_placed_waiting_pod_counts_in_its_queue_once_stored():
    led = queued_ledger(1, capped("team-a", 4))
    run(led, "a1", "ns-a", gpus=4)
    answer, gated = wait(led, "a2", "ns-a", gpus=4, now=1.0)
    assert "is at its limit" in answer.message
    assert led.place_waiting(2.0) == []
    led.delete_object(pod("a1", namespace="ns-a"))
    led.release("ns-a-a1")
    (placed,) = led.place_waiting(3.0)
    led.apply_object(placed_pod(gated, placed.placement, KEY), 3.0)
    again = led.reserve_or_wait(req("a3", "ns-a", 4), 4.0)
    assert isinstance(again, Waiting) and "4 of 4 GPUs used" in again.message
