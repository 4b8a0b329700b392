"""Denials answered from the per-request-shape diagnosis equal the full walk over every node, whatever
happened to the nodes in between (placements, releases, foreign pods, node updates, cordons, removals,
returns)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpuledger.core.nodes.sorted_names as sorted_names
import gpuledger.core.placing.node_classes as node_classes
from gpuledger import strategies as registry
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, GroupSpec, Placement, Reason, Request, Toleration
from tests.core.core_factory import node, pod
from tests.core.test_properties import node_objects, node_spec

# a few fixed shapes, asked again and again, so the cached diagnosis is reused across changes
PROBES = [
    Request(id="probe-1gpu", gpus=1, cpu_milli=2000, memory_mib=1024),
    Request(id="probe-3gpu", gpus=3, gpu_memory_mib=12000),
    Request(id="probe-share", gpu_milli=600, gpu_memory_mib=4000, cpu_milli=500),
    Request(id="probe-tol", gpus=2, tolerations=(Toleration(key="dedicated", operator="Exists"),)),
    Request(id="probe-prod", gpus=1, product="H100"),
    Request(id="probe-cpu", cpu_milli=20000),
    # a request that reads labels: diagnosed node by node (the others by node class)
    Request(id="probe-sel", gpus=1, node_selector=(("gpu-orchestrator/cheap-node", "true"),)),
]

change = st.one_of(
    st.tuples(
        st.just("place"), st.integers(1, 4), st.sampled_from(["best_fit", "distributed", "least_utilized"])
    ),
    st.tuples(st.just("share"), st.integers(1, 19), st.just("")),
    st.tuples(st.just("release"), st.integers(0, 99), st.just("")),
    st.tuples(st.just("foreign"), st.integers(0, 99), st.sampled_from(["0", "1", "4"])),
    st.tuples(st.just("node_update"), st.integers(0, 99), st.sampled_from(["cordon", "sick", "plain"])),
    st.tuples(st.just("remove"), st.integers(0, 99), st.just("")),
    st.tuples(st.just("return"), st.integers(0, 99), st.just("")),
)


def full_walk(led: Ledger, req: Request, exclude=frozenset()):
    strategy = registry.get_strategy(req.strategy or led.config.default_strategy)
    return led._diagnoser.diagnose_full(req, strategy, led._filters.context(req), exclude)


def cached(led: Ledger, req: Request, exclude=frozenset()):
    strategy = registry.get_strategy(req.strategy or led.config.default_strategy)
    return led._diagnoser.diagnose(req, strategy, led._filters.context(req), exclude)


def uncached_answer(led: Ledger, req: Request):
    led._diagnoser.diagnose = led._diagnoser.diagnose_full  # type: ignore[method-assign]
    try:
        return led.explain(req, with_scores=False).result
    finally:
        del led._diagnoser.diagnose


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(node_spec, min_size=1, max_size=7), st.lists(change, min_size=1, max_size=40), st.integers(0, 5)
)
def test_cached_diagnosis_equals_full_walk_across_changes(specs, changes, exclude_mod):
    objs = node_objects(specs)
    led = Ledger(LedgerConfig(placement_key=b"k"))
    for o in objs:
        led.apply_object(o, 0.0)
    placed: list[str] = []
    removed: set[int] = set()
    for step, (kind, a, b) in enumerate(changes):
        i = a % len(objs)
        if kind == "place":
            r = led.reserve(Request(id=f"p{step}", gpus=a, cpu_milli=1000, strategy=b), 0.0)
            if isinstance(r, Placement):
                placed.append(r.id)
        elif kind == "share":
            r = led.reserve(Request(id=f"s{step}", gpu_milli=a * 50, cpu_milli=100), 0.0)
            if isinstance(r, Placement):
                placed.append(r.id)
        elif kind == "release" and placed:
            led.release(placed.pop(a % len(placed)))
        elif kind == "foreign":
            led.apply_object(pod(f"f{step}", namespace="other", node_name=f"n{i}", gpus=int(b), cpu="1"), 0.0)
        elif kind == "node_update":
            updated = node_objects([dict(specs[i], unhealthy={0} if b == "sick" else set())])[0]
            updated["metadata"]["name"] = f"n{i}"
            if b == "cordon":
                updated["spec"]["unschedulable"] = True
            objs[i] = updated
            if i not in removed:
                led.apply_object(updated, 0.0)
        elif kind == "remove":
            led.delete_object(objs[i])
            removed.add(i)
        elif kind == "return" and i in removed:
            removed.discard(i)
            led.apply_object(objs[i], 0.0)
        exclude = {f"n{j}" for j in range(len(objs)) if exclude_mod and j % exclude_mod == 0} | {"gone"}
        for req in PROBES:
            assert cached(led, req) == full_walk(led, req), (step, req)
            assert cached(led, req, exclude) == full_walk(led, req, exclude), (step, req, exclude)
            assert led.explain(req, with_scores=False).result == uncached_answer(led, req)


def test_flood_of_denials_is_answered_from_the_diagnosis_and_follows_changes():
    led = Ledger()
    for i in range(4):
        led.apply_object(
            node(
                f"n{i}", 2, cpu="8", taints=[{"key": "dedicated", "effect": "NoSchedule"}] if i == 3 else []
            ),
            0.0,
        )
    for i in range(6):
        assert isinstance(led.reserve(Request(id=f"w{i}", gpus=1), 0.0), Placement)
    first = led.reserve(Request(id="d0", gpus=2, cpu_milli=1000), 0.0)
    assert isinstance(first, Denial)
    assert dict(first.by_reason) == {Reason.NOT_ENOUGH_GPUS: 3, Reason.TAINT: 1}
    assert "strategy best_fit" in first.message and "2 whole GPU(s)" in first.message
    assert len(led._diagnoser.diagnoses) == 1
    # the same shape again: nothing re-walked, the same answer (its own id)
    again = led.reserve(Request(id="d1", gpus=2, cpu_milli=1000), 0.0)
    assert again == Denial(**{**first.__dict__, "id": "d1"})
    # a node frees up: the next identical request is placed, not answered from a stale diagnosis
    led.release("w0")
    led.release("w1")
    assert isinstance(led.reserve(Request(id="d2", gpus=2, cpu_milli=1000), 0.0), Placement)
    # a node update (more cpu) changes a near miss's detail; the cached answer follows it
    led.apply_object(node("n2", 2, cpu="16"), 0.0)
    after = led.reserve(Request(id="d3", gpus=2, cpu_milli=1000), 0.0)
    assert after == uncached_answer(led, Request(id="d3", gpus=2, cpu_milli=1000))
    assert any("16000m cpu" in m.detail for m in after.near_misses)


def test_group_and_claim_denials_match_the_full_walk():
    led = Ledger()
    for i in range(3):
        led.apply_object(node(f"n{i}", 2, leaf=f"l{i}"), 0.0)
    gang = Request(id="g0", gpus=2, group=GroupSpec(key="job/x", size=4))
    denied = led.reserve(gang, 0.0)
    assert isinstance(denied, Denial) and dict(denied.by_reason) == {Reason.LEAF_CONSTRAINT: 3}
    assert denied == uncached_answer(led, gang)
    small = Request(id="g1", gpus=2, group=GroupSpec(key="job/y", size=2))
    assert isinstance(led.reserve(small, 0.0), Placement)
    assert isinstance(
        led.reserve(Request(id="g2", gpus=2, group=GroupSpec(key="job/y", size=2)), 0.0), Placement
    )
    led.apply_object(node("n2", 2, leaf="l2", taints=[{"key": "dedicated", "effect": "NoSchedule"}]), 0.0)
    third = Request(id="g3", gpus=2, group=GroupSpec(key="job/y", size=3))  # a pod beyond the plan: new slot
    claim = led.reserve(third, 0.0)
    assert isinstance(claim, Denial)
    assert claim == uncached_answer(led, third)


def test_a_diagnosis_behind_a_trimmed_change_log_is_rebuilt():
    led = Ledger()
    led.apply_object(node("n0", 1), 0.0)
    led.apply_object(node("n1", 1), 0.0)
    for rid in ("w0", "w1"):
        assert isinstance(led.reserve(Request(id=rid, gpus=1), 0.0), Placement)
    req = Request(id="d", gpus=1)
    assert isinstance(led.reserve(req, 0.0), Denial)
    led.apply_object(node("n1", 1, cpu="3"), 0.0)  # a change the log forgets below
    holder = led.get("w0").node
    for i in range(1100):  # more changes than the log keeps, all on the other node: the log is trimmed
        led.release("w0")
        assert led.reserve(Request(id="w0", gpus=1, cpu_milli=i % 2), 0.0).node == holder
    assert led.index.touched_base > 0
    answer = led.reserve(req, 0.0)
    assert answer == uncached_answer(led, req)
    assert any("3000m cpu" in m.detail for m in answer.near_misses)


shape = st.fixed_dictionaries(
    {
        "gpus": st.integers(0, 8),
        "milli": st.sampled_from([0, 0, 250, 600, 1000]),
        "gpu_mem": st.sampled_from([0, 0, 12000, 50000]),
        "cpu": st.sampled_from([0, 1000, 20000]),
        "product": st.sampled_from(["", "", "H100", "A100"]),
        "latency": st.booleans(),
        "tolerate": st.booleans(),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(node_spec, min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(1, 8), st.integers(0, 19)), max_size=30),
    st.lists(shape, min_size=1, max_size=6),
)
def test_first_denial_of_a_new_shape_counted_by_class_equals_the_full_walk(specs, load, shapes):
    """Each shape asked for the first time on a random cluster (repeated node specs make classes of more
    than one node): the class count gives the full walk's counts, names, near misses and denial text."""
    led = Ledger(LedgerConfig(placement_key=b"k"))
    for o in node_objects(specs + specs[: len(specs) // 2]):
        led.apply_object(o, 0.0)
    for i, (gpus, milli) in enumerate(load):
        if milli % 2:
            req = Request(id=f"l{i}", gpus=gpus, cpu_milli=500)
        else:
            req = Request(id=f"l{i}", gpu_milli=max(50, milli * 50))
        led.reserve(req, 0.0)
    for j, s in enumerate(shapes):
        req = Request(
            id=f"q{j}",
            gpus=s["gpus"],
            gpu_milli=0 if s["gpus"] else s["milli"],
            gpu_memory_mib=s["gpu_mem"],
            cpu_milli=s["cpu"],
            product=s["product"] or None,
            latency_sensitive=s["latency"],
            tolerations=(Toleration(key="dedicated", operator="Exists"),) if s["tolerate"] else (),
        )
        counts, near, fitting = cached(led, req)
        full = full_walk(led, req)
        assert (counts, near, fitting) == full
        assert counts.names == full[0].names
        assert led.explain(req, with_scores=False).result == uncached_answer(led, req)


def test_a_reason_that_covers_few_nodes_names_them():
    led = Ledger()
    for i in range(5):
        led.apply_object(node(f"n{i}", 2), 0.0)
    led.apply_object(node("n3", 2, ready=False), 0.0)
    for i in range(8):
        assert isinstance(led.reserve(Request(id=f"w{i}", gpus=1), 0.0), Placement)
    d = led.reserve(Request(id="d", gpus=1), 0.0)
    assert isinstance(d, Denial)
    assert "4 node(s) not enough GPUs (best: n0 has 0 free)" in d.message
    assert "1 node(s) node not ready or cordoned (n3)" in d.message
    assert d == uncached_answer(led, Request(id="d", gpus=1))


node_change = st.one_of(
    st.tuples(st.just("place"), st.integers(1, 4)),
    st.tuples(st.just("share"), st.integers(1, 19)),
    st.tuples(st.just("release"), st.integers(0, 99)),
    st.tuples(st.just("add"), st.integers(0, 99)),
    st.tuples(st.just("remove"), st.integers(0, 99)),
    st.tuples(st.just("relabel"), st.integers(0, 99)),
    st.tuples(st.just("cordon"), st.integers(0, 99)),
    st.tuples(st.just("foreign"), st.integers(0, 99)),
)


def class_partition(led: Ledger) -> set[frozenset[str]]:
    """The node classes as they should be: nodes grouped by their key, computed now from scratch."""
    classes = led._diagnoser.classes
    groups: dict[tuple, set[str]] = {}
    for name, state in led.index.nodes.items():
        groups.setdefault(classes.key(state), set()).add(name)
    return {frozenset(g) for g in groups.values()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(node_spec, min_size=1, max_size=8),
    st.lists(node_change, min_size=1, max_size=30),
    shape,
    st.sampled_from([1, 3, 256]),
    st.sampled_from([1, 2, 512]),
)
def test_first_denials_by_class_follow_node_adds_removes_and_relabels(specs, changes, s, dirty_limit, chunk):
    """The node classes are kept as the index changes (placements, releases, nodes added, removed,
    relabelled, cordoned, foreign pods), never more than `dirty_limit` nodes behind and never rebuilt by a
    denial; a shape asked for the first time after each change is answered as the node-by-node walk.
    (`chunk`: classes above it keep their members in a SortedNames of such chunks, below in a list.)"""
    saved = node_classes.CHUNK, sorted_names.CHUNK
    node_classes.CHUNK = sorted_names.CHUNK = chunk
    try:
        _first_denials_follow_node_changes(specs, changes, s, dirty_limit)
    finally:
        node_classes.CHUNK, sorted_names.CHUNK = saved


def _first_denials_follow_node_changes(specs, changes, s, dirty_limit):
    led = Ledger(LedgerConfig(placement_key=b"k"))
    led.index.dirty_limit = dirty_limit
    classes = led._diagnoser.classes
    objs = {o["metadata"]["name"]: o for o in node_objects(specs + specs[: len(specs) // 2])}
    for o in objs.values():
        led.apply_object(o, 0.0)
    generation = classes.generation
    placed: list[str] = []
    for step, (kind, a) in enumerate(changes):
        names = sorted(objs)
        name = names[a % len(names)] if names else "none"
        if kind == "place":
            r = led.reserve(Request(id=f"p{step}", gpus=a, cpu_milli=500 * (a % 3)), 0.0)
            if isinstance(r, Placement):
                placed.append(r.id)
        elif kind == "share":
            r = led.reserve(Request(id=f"s{step}", gpu_milli=a * 50), 0.0)
            if isinstance(r, Placement):
                placed.append(r.id)
        elif kind == "release" and placed:
            led.release(placed.pop(a % len(placed)))
        elif kind == "add":
            new = node_objects([specs[a % len(specs)]])[0]
            new["metadata"]["name"] = f"x{step}"
            objs[f"x{step}"] = new
            led.apply_object(new, 0.0)
        elif kind == "remove" and name in objs:
            led.delete_object(objs.pop(name))
        elif kind in ("relabel", "cordon") and name in objs:
            o = objs[name]
            labels = o["metadata"]["labels"]
            if kind == "relabel":  # a label no class reads, and the accelerator label one does
                labels["team"] = f"t{step}"
                labels["accelerator"] = "nvidia-h100" if a % 2 else "nvidia-a100"
            else:
                o["spec"]["unschedulable"] = not o["spec"].get("unschedulable", False)
            led.apply_object(o, 0.0)
        elif kind == "foreign" and name in objs:
            led.apply_object(pod(f"f{step}", namespace="other", node_name=name, gpus=a % 3, cpu="1"), 0.0)
        assert len(led.index.dirty) < dirty_limit  # the classes are never further behind
        req = Request(  # a shape not asked before (its cpu differs at every step)
            id=f"q{step}",
            gpus=s["gpus"],
            gpu_milli=0 if s["gpus"] else s["milli"],
            gpu_memory_mib=s["gpu_mem"],
            cpu_milli=s["cpu"] + step,
            product=s["product"] or None,
            tolerations=(Toleration(key="dedicated", operator="Exists"),) if s["tolerate"] else (),
        )
        counts, near, fitting = cached(led, req)
        full = full_walk(led, req)
        assert (counts, near, fitting) == full, (step, kind)
        assert counts.names == full[0].names
        assert led.explain(req, with_scores=False).result == uncached_answer(led, req)
        for probe in PROBES[:3]:  # shapes asked again and again follow the same changes
            assert cached(led, probe) == full_walk(led, probe), (step, kind, probe.id)
        assert classes.generation == generation  # no denial rebuilt the classes
        assert {frozenset(m) for m in classes.members.values()} == class_partition(led)
        assert all(classes.class_of[n] == cid for cid, m in classes.members.items() for n in m)
        assert set(classes.class_of) == set(led.index.nodes)
