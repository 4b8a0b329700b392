"""The queues' gate as of the books' latest change (gpuledger.core.queues.current_gate), on a real ledger's
books: none while no GPUQueue exists; the same gate while only its own placements changed the books; a new
one once a node, a namespace's queue or a reservation changed otherwise."""

from __future__ import annotations

from gpuledger.core.model import Placement
from gpuledger.core.queues.current_gate import CurrentGate
from gpuledger.names import QUEUE_LABEL
from tests.core.core_factory import node
from tests.core.queues.test_queue_book import gpu_queue, namespace
from tests.core.queues.test_queue_ledger import queued_ledger, req


def _gate_of(led) -> CurrentGate:
    return CurrentGate(led._books, led._queues, lambda r: led.explain(r, with_scores=False).result)


def test_no_gpu_queue_no_gate():
    led = queued_ledger(2)
    assert _gate_of(led).get() is None


def test_the_gate_lasts_while_it_counted_every_change_and_is_made_again_after_any_other():
    led = queued_ledger(2, gpu_queue("team-a", 8), gpu_queue("team-b", 8))
    current = _gate_of(led)
    gate = current.get()
    assert gate is not None and current.get() is gate  # nothing changed: the same gate

    request = req("a1", "ns-a", gpus=4)
    placed = led.reserve(request, 0.0)
    assert isinstance(placed, Placement)
    gate.placed(request, placed)
    current.kept(gate)  # the gate counted the placement: it stays good
    assert current.get() is gate

    led.reserve(req("b1", "ns-b", gpus=4), 0.0)  # a reservation the gate did not count
    fresh = current.get()
    assert fresh is not None and fresh is not gate
    assert current.get() is fresh

    led.apply_object(node("n9", 8), 0.0)  # a node added
    after_node = current.get()
    assert after_node is not fresh

    led.apply_object(namespace("ns-c", **{QUEUE_LABEL: "team-b"}), 0.0)  # a namespace's queue
    assert current.get() is not after_node


def test_a_gate_it_did_not_hand_out_keeps_nothing():
    led = queued_ledger(2, gpu_queue("team-a", 8))
    current, other = _gate_of(led), _gate_of(led)
    gate = current.get()
    foreign = other.get()
    led.reserve(req("a1", "ns-a", gpus=4), 0.0)
    current.kept(foreign)  # not its own gate: its stamp stays where it was
    assert current.get() is not gate
