"""The ledger's line of waiting pods: who waits and who is denied, the order, gangs whole, the backfill
window, the index by shape, and a deleted waiting pod leaving no trace. Time is an argument."""

from __future__ import annotations

from gpuledger import strategies  # noqa: F401  (registers the built-in strategies)
from gpuledger.core.ledger import Ledger, LedgerConfig, Waiting
from gpuledger.core.model import (
    Denial,
    GroupSpec,
    PinnedDevices,
    Placement,
    Request,
    ReservationState,
    SelectorRequirement,
    Toleration,
)
from gpuledger.core.pods.placement_codec import Binding
from gpuledger.core.pods.waiting_codec import WaitTicket, decode_waiting, encode_waiting, ticket_for
from tests.core.core_factory import node, pod
from tests.core.waiting_factory import gated_pod, placed_pod

KEY = b"waiting-key"
WINDOW = 300.0


def ledger(*nodes: dict) -> Ledger:
    led = Ledger(LedgerConfig(placement_key=KEY, default_strategy="best_fit"))
    for n in nodes:
        led.apply_object(n, 0.0)
    return led


def fill(led: Ledger, name: str, gpus: int, now: float = 0.0) -> dict:
    """A stored pod holding `gpus` GPUs of node `name` (placed by the ledger, confirmed)."""
    on_node = (("kubernetes.io/hostname", name),)
    result = led.reserve(Request(id=f"fill-{name}-{now}", gpus=gpus, node_selector=on_node), now)
    assert isinstance(result, Placement) and result.node == name, result
    stored = pod(f"fill-{name}-{int(now)}", placement=result, key=KEY)
    led.apply_object(stored, now)
    return stored


def wait(led: Ledger, name: str, req: Request, now: float, **kw) -> tuple[Waiting, dict]:
    """Admit `req` (it must wait) and store its gated pod."""
    answer = led.reserve_or_wait(req, now, **kw)
    assert isinstance(answer, Waiting), answer
    gated = gated_pod(name, answer, KEY)
    led.apply_object(gated, now)
    return answer, gated


# ------------------------------------------------------------------------------------------------ the ticket


def test_the_ticket_round_trips_every_field_signed_and_bound():
    req = Request(
        id="w1",
        gpus=2,
        gpu_memory_mib=40000,
        cpu_milli=1500,
        memory_mib=2048,
        product="A100",
        node_selector=(("zone", "a"),),
        affinity_terms=((SelectorRequirement("rack", "In", ("r1", "r2")),),),
        tolerations=(Toleration("dedicated", "Exists", "", "NoSchedule"),),
        preferred_domain="leaf-1",
        strategy="best_fit",
        priority=7,
        pinned=PinnedDevices("n1", (0, 1)),
        group=GroupSpec("job/ml/train", 4, 2, 8),
        latency_sensitive=True,
        network_bandwidth="high",
        seed=42,
        namespace="ml",
        name="train-0",
        network_bandwidth_gbps=100.0,
    )
    ticket = WaitTicket(req, 12.5, Binding("ml", generate_name="train-", owner_uid="u1"))
    text = encode_waiting(ticket, KEY)
    assert decode_waiting(text, KEY) == ticket
    assert decode_waiting(text, b"other") is None
    assert decode_waiting(text.replace('"priority":7', '"priority":9'), KEY) is None
    assert decode_waiting("{not json", KEY) is None
    owner = [{"controller": True, "uid": "u1"}]
    mine = {"metadata": {"namespace": "ml", "name": "train-x", "ownerReferences": owner}}
    copy = {"metadata": {"namespace": "ml", "name": "other-x", "ownerReferences": owner}}
    assert ticket_for(text, KEY, mine) == ticket
    assert ticket_for(text, KEY, copy) is None


# ------------------------------------------------------------------------------------------ wait or deny


def test_a_pod_that_does_not_fit_now_waits_with_its_place_and_the_nearest_node():
    led = ledger(node("n0", 8), node("n1", 8))
    fill(led, "n0", 8)
    fill(led, "n1", 3)
    answer = led.reserve_or_wait(Request(id="big", gpus=8), 1.0)
    assert isinstance(answer, Waiting)
    assert answer.position == 1 and answer.arrival == 1.0
    assert answer.message == "waiting for 8 GPUs on one node; 1st in line; nearest: n1 has 5 free"
    assert "big" not in led.reservations()  # holding nothing


def test_a_pod_that_could_never_fit_is_denied_as_today():
    led = ledger(node("n0", 8, product="A100"), node("n1", 8, product="A100"))
    for req in (
        Request(id="too-big", gpus=16),
        Request(id="no-such-product", gpus=1, product="H100"),
        Request(id="gang-too-big", gpus=8, group=GroupSpec("job/ns/g", 3)),
        Request(id="leaf-window", gpus=4, group=GroupSpec("job/ns/h", 2, max_gpus_per_leaf=4)),
        Request(id="bad-strategy", gpus=1, strategy="no-such"),
    ):
        answer = led.reserve_or_wait(req, 1.0)
        assert isinstance(answer, Denial), (req.id, answer)
        assert answer == led.reserve(req, 1.0)  # today's message, unchanged


def test_a_cordoned_or_unhealthy_node_still_counts_for_could_fit():
    led = ledger(
        node("n0", 8, unschedulable=True),
        node("n1", 4, devices=[{"index": i, "healthy": i != 0} for i in range(4)]),
    )
    assert isinstance(led.reserve_or_wait(Request(id="a", gpus=8), 1.0), Waiting)
    assert isinstance(led.reserve_or_wait(Request(id="b", gpus=4), 1.0), Waiting)


def test_refuse_when_full_is_todays_denial():
    led = ledger(node("n0", 8))
    fill(led, "n0", 8)
    answer = led.reserve_or_wait(Request(id="x", gpus=1), 1.0, may_wait=False)
    assert isinstance(answer, Denial) and "n0 has 0 free" in answer.message


# ------------------------------------------------------------------------------------------ placed in order


def test_freed_gpus_go_to_the_first_in_line_and_are_reserved_at_once():
    led = ledger(node("n0", 8))
    stored = fill(led, "n0", 8)
    first, _ = wait(led, "first", Request(id="w-first", gpus=4), 1.0)
    second, _ = wait(led, "second", Request(id="w-second", gpus=4), 2.0)
    high, _ = wait(led, "high", Request(id="w-high", gpus=8, priority=5), 3.0)
    assert [e.waiter.key for e in led.waiting_line()] == ["default/high", "default/first", "default/second"]
    assert led.place_waiting(4.0) == []  # nothing freed
    led.delete_object(stored)
    placed = led.place_waiting(5.0)
    assert [p.key for p in placed] == ["default/high"]  # priority first, though it came last
    assert led.reservations()["w-high"].state == ReservationState.RESERVED
    assert led.place_waiting(6.0) == []  # placing: not placed twice


def test_backfill_inside_the_window_and_a_barrier_past_it():
    led = ledger(node("n0", 8))
    stored = fill(led, "n0", 6)
    wait(led, "large", Request(id="w-large", gpus=8), 0.0)
    answer = led.reserve_or_wait(Request(id="small", gpus=2), 10.0)
    assert isinstance(answer, Placement)  # a smaller one passes the large one inside the window
    led.delete_object(stored)
    answer = led.reserve_or_wait(Request(id="small2", gpus=2), 400.0)
    assert isinstance(answer, Waiting)  # past the window the large one is a barrier: nothing passes it
    assert "backfill window" in answer.message
    urgent = led.reserve_or_wait(Request(id="urgent", gpus=2, priority=9), 400.0)
    assert isinstance(urgent, Placement)  # a higher priority goes ahead of a barrier


def test_a_newcomer_of_a_waiting_shape_goes_behind_it_even_when_gpus_just_freed():
    led = ledger(node("n0", 8))
    stored = fill(led, "n0", 8)
    wait(led, "old", Request(id="w-old", gpus=4), 1.0)
    led.delete_object(stored)  # freed, the pass has not run yet
    late = led.reserve_or_wait(Request(id="w-late", gpus=4), 2.0)
    assert isinstance(late, Waiting) and late.position == 2
    placed = led.place_waiting(3.0)
    assert [p.key for p in placed] == ["default/old"]


def test_a_gang_waits_whole_and_is_placed_whole():
    led = ledger(node("n0", 8, leaf="a"), node("n1", 8, leaf="a"))
    stored = [fill(led, "n0", 8), fill(led, "n1", 4)]
    gang = GroupSpec("job/default/g", 2)
    pods = []
    for i in range(2):
        answer, gated = wait(led, f"g-{i}", Request(id=f"w-g{i}", gpus=8, group=gang), float(i))
        pods.append((answer, gated))
    assert len(led.waiting_line()) == 2
    assert led.place_waiting(5.0) == []
    led.delete_object(stored[1])
    assert led.place_waiting(6.0) == []  # one node free: half a gang is no gang
    led.delete_object(stored[0])
    placed = led.place_waiting(7.0)
    assert sorted(p.key for p in placed) == ["default/g-0", "default/g-1"]
    assert {p.placement.node for p in placed} == {"n0", "n1"}


def test_the_index_asks_a_blocked_shape_only_when_a_node_it_could_use_changes():
    led = ledger(node("n0", 8), node("n1", 2))
    stored = fill(led, "n0", 8)
    fill(led, "n1", 2)
    wait(led, "big", Request(id="w-big", gpus=4), 1.0)
    asked = []
    real = led._waiting.reserve
    led._waiting.reserve = lambda req, now: asked.append(req.id) or real(req, now)
    led.place_waiting(2.0)
    assert asked == []  # admission found it did not fit, and nothing changed since
    led.reserve(Request(id="tiny", gpus=0, gpu_milli=100), 3.0)  # a change that cannot help a 4-GPU pod
    led.place_waiting(4.0)
    assert asked == []
    led.delete_object(stored)
    placed = led.place_waiting(5.0)
    assert asked == ["w-big"] and [p.key for p in placed] == ["default/big"]


def test_a_waiting_pod_deleted_leaves_no_trace():
    led = ledger(node("n0", 8))
    stored = fill(led, "n0", 8)
    _, gated = wait(led, "w", Request(id="w-1", gpus=8), 1.0)
    led.delete_object(stored)
    assert [p.key for p in led.place_waiting(2.0)] == ["default/w"]
    led.delete_object(gated)  # deleted between the decision and the gate's removal
    assert "w-1" not in led.reservations()
    assert led.waiting_line() == []
    assert led.snapshot() == Ledger.rebuild([node("n0", 8)], led.config).snapshot()


def test_placed_pod_confirms_and_leaves_the_line_and_rebuild_equals_live():
    led = ledger(node("n0", 8), node("n1", 8))
    stored = fill(led, "n0", 8)
    fill_n1 = fill(led, "n1", 8)
    a, gated_a = wait(led, "a", Request(id="w-a", gpus=8), 1.0)
    b, gated_b = wait(led, "b", Request(id="w-b", gpus=8), 2.0)
    objects = [node("n0", 8), node("n1", 8), stored, fill_n1, gated_a, gated_b]
    assert Ledger.rebuild(objects, led.config).snapshot() == led.snapshot()  # the line, rebuilt
    led.delete_object(stored)
    [placed] = led.place_waiting(3.0)
    done = placed_pod(gated_a, placed.placement, KEY)
    led.apply_object(done, 3.0)
    assert led.reservations()["w-a"].state == ReservationState.CONFIRMED
    assert [e.waiter.key for e in led.waiting_line()] == ["default/b"]
    objects = [node("n0", 8), node("n1", 8), fill_n1, done, gated_b]
    assert Ledger.rebuild(objects, led.config).snapshot() == led.snapshot()
