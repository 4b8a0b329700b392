"""Property tests of the ledger with GPU queues: random arrivals in two queues (placed, waiting, or held back
by a quota), passes that plan preemptions, the sync's acts (the record written on the preemptor, victims
evicted, evictions refused), pods ending, and restarts in the middle of any of it.

Checked after every step: no device held twice (the ledger's invariants); no pod is placed twice; no pod
but a plan's preemptor is placed on a node the plan keeps. At restarts: a ledger rebuilt from the API
objects (the preemptors carrying their records) equals the live one, its plans included, and carries on.
"""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from gpuledger import strategies  # noqa: F401  (registers the built-in strategies)
from gpuledger.core.ledger import Ledger, LedgerConfig, Waiting
from gpuledger.core.model import Placement, Request
from gpuledger.names import PREEMPTING_ANNOTATION, QUEUE_LABEL
from tests.core.core_factory import node, pod
from tests.core.queues.test_queue_book import gpu_queue, namespace
from tests.core.test_properties import check_invariants
from tests.core.waiting_factory import gated_pod, placed_pod

KEY = b"prop-queues"
NAMESPACES = ("ns-a", "ns-b")

arrival = st.fixed_dictionaries(
    {
        "ns": st.sampled_from(NAMESPACES),
        "gpus": st.sampled_from([4, 8, 8]),
        "priority": st.sampled_from([0, 5]),
    }
)
op = st.one_of(
    st.tuples(st.just("arrive"), arrival),
    st.tuples(st.just("arrive"), arrival),
    st.tuples(st.just("arrive"), arrival),
    st.tuples(st.just("pass"), st.just(0)),
    st.tuples(st.just("pass"), st.just(0)),
    st.tuples(st.just("evict"), st.integers(0, 20)),
    st.tuples(st.just("evict"), st.integers(0, 20)),
    st.tuples(st.just("refuse"), st.integers(0, 20)),
    st.tuples(st.just("end"), st.integers(0, 40)),
    st.tuples(st.just("restart"), st.just(0)),
)


# no shrinking: a failing run is shown as found (shrinking one took minutes of the shared CPUs)
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(st.lists(op, min_size=10, max_size=50))
def test_queues_and_preemption_keep_the_ledger_whole_across_restarts(ops):
    config = LedgerConfig(placement_key=KEY, reservation_ttl_s=1e9, default_strategy="best_fit")
    base = [node(f"n{i}", 8) for i in range(3)]
    base += [gpu_queue("team-a", 12), gpu_queue("team-b", 12, preemption={"minRunSeconds": 5})]
    base += [namespace("ns-a", **{QUEUE_LABEL: "team-a"}), namespace("ns-b", **{QUEUE_LABEL: "team-b"})]
    led = Ledger(config)
    for obj in base:
        led.apply_object(obj, 0.0)
    now = 1000.0
    stored: dict[str, dict] = {}  # "ns/name" -> the pod as stored
    placed_once: set[str] = set()
    refused = False  # a refused plan is dropped live; its record, still on its pod, is adopted by a rebuild

    def apply(key: str, obj: dict) -> None:
        stored[key] = obj
        led.apply_object(obj, now)

    def objects() -> list[dict]:
        return base + list(stored.values())

    for step, (kind, arg) in enumerate(ops):
        now += 1.0
        if kind == "arrive":
            ns, name = arg["ns"], f"p{step}"
            req = Request(id=f"r{step}", gpus=arg["gpus"], priority=arg["priority"], namespace=ns, name=name)
            answer = led.reserve_or_wait(req, now)
            event(f"arrive {type(answer).__name__}")
            if isinstance(answer, Placement):
                stored_pod = pod(name, namespace=ns, placement=answer, key=KEY)
                stored_pod["metadata"]["uid"] = f"uid-{name}"
                apply(f"{ns}/{name}", stored_pod)
            elif isinstance(answer, Waiting):
                apply(f"{ns}/{name}", gated_pod(name, answer, KEY, namespace=ns))
        elif kind == "pass":
            kept = {n: p.id for p in led.preemptions() for n in p.nodes}
            passed = led.place_waiting(now)
            done = {placed.placement.id for placed in passed}
            for placed in passed:
                key = placed.key
                assert key not in placed_once, f"{key} placed twice"
                placed_once.add(key)
                owner = kept.get(placed.placement.node)
                # a node stays kept until its preemptor is placed (in this pass, first)
                assert owner in (None, placed.placement.id) or owner in done, f"{key} on {owner}'s node"
                apply(key, placed_pod(stored[key], placed.placement, KEY))
            # the sync: the record first, on every preemptor not carrying it yet
            for plan in led.preemptions():
                event("a plan is held")
                if not plan.recorded:
                    recorded = copy.deepcopy(stored[plan.preemptor])
                    recorded["metadata"]["annotations"][PREEMPTING_ANNOTATION] = plan.record
                    apply(plan.preemptor, recorded)
                assert led.preemptions()[led.preemptions().index(plan)].recorded
        elif kind in ("evict", "refuse"):
            victims = [(p, v) for p in led.preemptions() for v in led.preemption_victims(p)]
            if victims:
                plan, (ns, name, _, _, _) = victims[arg % len(victims)]
                if kind == "evict":
                    event("a victim evicted")
                    led.delete_object(stored.pop(f"{ns}/{name}"))
                else:
                    event("an eviction refused")
                    led.eviction_refused(plan.id, ns, name, now)
                    refused = True
        elif kind == "end":
            running = sorted(k for k, p in stored.items() if "schedulingGates" not in p["spec"])
            if running:
                led.delete_object(stored.pop(running[arg % len(running)]))
        elif kind == "restart":
            rebuilt = Ledger.rebuild(objects(), config, now=now)
            rebuilt.refused_victim_s = led.refused_victim_s
            if led.preemptions():
                event("restarted mid-preemption")
            if not refused:
                assert_same(rebuilt.snapshot(), led.snapshot())
            led, refused = rebuilt, False
        check_invariants(led)
        book = led._queues
        counted = (book.usage().by_queue, book.capacity())
        book._totals_at = None  # what the queues use, counted afresh, is what was kept up to date
        assert (book.usage().by_queue, book.capacity()) == counted


def assert_same(a: object, b: object, path: str = "") -> None:
    """Equal, or the first path where not (a snapshot's difference is hard to read whole)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert sorted(a) == sorted(b), (path, sorted(set(a) ^ set(b)))
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
        return
    assert a == b, (path, a, b)
