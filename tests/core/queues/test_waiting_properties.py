"""Property tests of the line of waiting pods: random arrivals (placed, waiting or denied), deletions, passes,
patches left in flight, time passing the backfill window, and restarts.

Checked after every pass: nothing left waiting could start (the indexed pass agrees with the rule applied to
every waiting pod, gpuledger.core.queues.queue_rule.plan, with each pod's fit asked of the ledger afresh); the
ledger's invariants hold (no device held twice). At checkpoints and restarts: a ledger rebuilt from the
nodes and pods equals the live one, the line included, and the restarted ledger carries on from it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from gpuledger import strategies  # noqa: F401  (registers the built-in strategies)
from gpuledger.core.ledger import Ledger, LedgerConfig, Waiting
from gpuledger.core.model import Denial, GroupSpec, Placement, Request
from gpuledger.core.queues.queue_rule import Entry, Verdict, plan
from tests.core.core_factory import node, pod
from tests.core.test_properties import check_invariants
from tests.core.waiting_factory import gated_pod, placed_pod

KEY = b"prop-waiting"
WINDOW = 20.0

arrival = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["whole"] * 5 + ["share", "gang", "gang", "huge"]),
        "gpus": st.sampled_from([2, 4, 4, 8]),
        "priority": st.sampled_from([0, 0, 5]),
        "group": st.sampled_from(["g1", "g2"]),
        "strategy": st.sampled_from(["best_fit", "least_utilized", "consolidated"]),
        "refuse": st.sampled_from([False, False, False, True]),
    }
)
op = st.one_of(
    st.tuples(st.just("arrive"), arrival),
    st.tuples(st.just("arrive"), arrival),
    st.tuples(st.just("arrive"), arrival),
    st.tuples(st.just("delete"), st.integers(0, 40)),
    st.tuples(st.just("free"), st.integers(0, 40)),
    st.tuples(st.just("free"), st.integers(0, 40)),
    st.tuples(st.just("delete_waiting"), st.integers(0, 40)),
    st.tuples(st.just("pass"), st.booleans()),
    st.tuples(st.just("pass"), st.booleans()),
    st.tuples(st.just("patch"), st.just(0)),
    st.tuples(st.just("tick"), st.sampled_from([1.0, 5.0, 25.0])),
    st.tuples(st.just("restart"), st.just(0)),
)


def request(rid: str, spec: dict) -> Request:
    common = {"id": rid, "priority": spec["priority"], "strategy": spec["strategy"]}
    if spec["kind"] == "share":
        return Request(gpu_milli=500, **common)
    if spec["kind"] == "gang":
        gpus = min(spec["gpus"], 4)
        return Request(gpus=gpus, group=GroupSpec(f"job/default/{spec['group']}-{gpus}", 2), **common)
    if spec["kind"] == "huge":
        return Request(gpus=16, **common)
    return Request(gpus=spec["gpus"], **common)


def nothing_left_that_fits(led: Ledger, now: float) -> None:
    """The rule over every waiting pod, each asked afresh, starts nothing after a pass."""
    line = [e for e in led.waiting_line() if not e.placing]
    entries, verdicts = [], {}
    for e in line:
        w = e.waiter
        entries.append(Entry(w.id, w.request.priority, w.arrival))
        fits = isinstance(led.explain(w.request, with_scores=False).result, Placement)
        verdicts[w.id] = Verdict(fits)
    start = plan(entries, verdicts, now, WINDOW).start
    assert start is None, (start, [(e.waiter.id, e.waiter.request) for e in line])


def run(node_gpus: list[int], ops) -> None:
    nodes = [node(f"n{i}", g, leaf="a" if i % 2 else "b") for i, g in enumerate(node_gpus)]
    config = LedgerConfig(placement_key=KEY, reservation_ttl_s=1e9)
    led = Ledger(config)
    for n in nodes:
        led.apply_object(n, 0.0)
    now = 0.0
    stored: dict[str, dict] = {}  # pod name -> the pod as stored (placed or gated)
    in_flight: dict[str, Placement] = {}  # pod name -> placed by a pass, not patched yet

    def objects() -> list[dict]:
        return nodes + list(stored.values())

    def patch(name: str) -> None:
        placement = in_flight.pop(name)
        stored[name] = placed_pod(stored[name], placement, KEY)
        led.apply_object(stored[name], now)

    for step, (kind, arg) in enumerate(ops):
        if kind == "arrive":
            name = f"p{step}"
            req = request(f"r{step}", arg)
            answer = led.reserve_or_wait(req, now, may_wait=not arg["refuse"], backfill_window_s=WINDOW)
            event(f"{arg['kind']} {type(answer).__name__}")
            if isinstance(answer, Placement):
                stored[name] = pod(name, placement=answer, key=KEY)
                led.apply_object(stored[name], now)
            elif isinstance(answer, Waiting):
                assert not arg["refuse"] and arg["kind"] != "huge"
                assert answer.position >= 1 and answer.message.startswith("waiting for ")
                stored[name] = gated_pod(name, answer, KEY)
                led.apply_object(stored[name], now)
            else:
                assert isinstance(answer, Denial) and answer.message
                assert arg["kind"] == "huge" or arg["refuse"] or answer.by_reason
        elif kind in ("delete", "free", "delete_waiting"):
            waiting = kind == "delete_waiting"
            names = sorted(n for n, p in stored.items() if ("schedulingGates" in p["spec"]) == waiting)
            if names:
                name = names[arg % len(names)]
                in_flight.pop(name, None)
                led.delete_object(stored.pop(name))
        if kind in ("pass", "free"):
            passed = led.place_waiting(now, WINDOW)
            if passed:
                event("a pass placed " + ("a gang" if any(p.placement.group for p in passed) else "pods"))
            for placed in passed:
                name = placed.name
                assert name in stored and name not in in_flight
                in_flight[name] = placed.placement
                if kind == "free" or arg:  # the adapter writes it at once
                    patch(name)
            nothing_left_that_fits(led, now)
        elif kind == "patch":
            for name in sorted(in_flight):
                patch(name)
        elif kind == "tick":
            now += arg
        elif kind == "restart":
            for name in sorted(in_flight):
                patch(name)
            rebuilt = Ledger.rebuild(objects(), config, now=now)
            assert rebuilt.snapshot() == led.snapshot()
            if led.waiting_count():
                event("restarted with pods waiting")
            led = rebuilt
        check_invariants(led)
    for name in sorted(in_flight):
        patch(name)
    assert Ledger.rebuild(objects(), config, now=now).snapshot() == led.snapshot()


def _whole(gpus: int = 2) -> tuple:
    return (
        "arrive",
        {
            "kind": "whole",
            "gpus": gpus,
            "priority": 0,
            "group": "g1",
            "strategy": "best_fit",
            "refuse": False,
        },
    )


def _gang(gpus: int) -> tuple:
    return (
        "arrive",
        {"kind": "gang", "gpus": gpus, "priority": 0, "group": "g1", "strategy": "best_fit", "refuse": False},
    )


# a waiting pod of a gang already placed takes one of its slots: no bound on free GPUs may keep it waiting
SLOT_OF_A_PLACED_GANG = [
    *[_whole()] * 5,
    ("delete", 0),
    ("delete", 4),
    ("patch", 0),
    ("restart", 0),
    *[("delete", 0)] * 3,
    *[_whole()] * 4,
    ("delete", 0),
    _gang(8),
    _whole(),
    _whole(8),
    ("delete", 0),
    _whole(),
    ("delete", 0),
    *[_whole()] * 3,
    ("delete", 0),
    *[_whole()] * 3,
    _gang(4),
    ("free", 1),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(node_gpus=[4, 4, 8], ops=SLOT_OF_A_PLACED_GANG)
@given(st.lists(st.sampled_from([4, 8, 8]), min_size=1, max_size=4), st.lists(op, min_size=20, max_size=60))
def test_random_arrivals_deletions_passes_and_restarts(node_gpus, ops):
    run(node_gpus, ops)
