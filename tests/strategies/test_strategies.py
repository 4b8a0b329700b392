"""Each strategy's rule, the registry, filters (taints, selectors, affinity, product), pinned maps, denials."""

from __future__ import annotations

import pytest

from allocator import strategies
from allocator.core import registry as core_registry
from allocator.core.ledger import Ledger, LedgerConfig
from allocator.core.model import (
    Denial,
    PinnedDevices,
    Placement,
    Reason,
    Request,
    SelectorRequirement,
    Taint,
    Toleration,
)
from tests.core.core_factory import node


def make(*nodes, **config) -> Ledger:
    led = Ledger(LedgerConfig(**config))
    for n in nodes:
        led.apply_object(n, 0.0)
    return led


def take(led: Ledger, node_name: str, gpus: int, rid: str) -> None:
    """Occupy GPUs on a node through an explicit map (so the set-up does not depend on a strategy)."""
    n = led.index.nodes[node_name]
    free = n.whole_free_devices()[:gpus]
    p = led.reserve(Request(id=rid, gpus=gpus, pinned=PinnedDevices(node_name, tuple(free))), 0.0)
    assert isinstance(p, Placement), p


# ------------------------------------------------------------------------------------------ registry


def test_registry_names_and_aliases():
    names = strategies.strategy_names()
    for name in (
        "best_fit",
        "least_utilized",
        "round_robin",
        "priority",
        "random",
        "cost_optimized",
        "consolidated",
        "distributed",
        "balanced",
        "explicit",
    ):
        assert name in names
    assert strategies.get_strategy("leastLoaded").name == "least_utilized"
    assert strategies.get_strategy("least_loaded").name == "least_utilized"
    assert strategies.get_strategy("Least-Utilized").name == "least_utilized"
    assert strategies.get_strategy("roundRobin").name == "round_robin"
    assert strategies.get_strategy("costOptimized").name == "cost_optimized"
    assert strategies.get_strategy("bestFit").name == "best_fit"


def test_unknown_strategy_raises_value_error_listing_names():
    with pytest.raises(ValueError) as err:
        strategies.get_strategy("teleport")
    message = str(err.value)
    assert "'teleport'" in message
    for name in ("best_fit", "least_utilized", "balanced", "consolidated"):
        assert name in message


def test_register_plugin_strategy():
    class LastByName(strategies.Strategy):
        name = "test_last_by_name"

        def score(self, node, request, fit, ctx):
            return float(int(node.name[1:]))

    strategies.register("test_last_by_name", LastByName, aliases=("testLastByName",))
    led = make(node("n1", 2), node("n3", 2), node("n2", 2))
    p = led.reserve(Request(id="x", gpus=1, strategy="testLastByName"), 0.0)
    assert p.node == "n3" and p.strategy == "test_last_by_name"


# ------------------------------------------------------------------------------------------ strategies


def test_best_fit_packs_and_least_utilized_spreads():
    led = make(node("a", 8), node("b", 8), node("c", 8))
    take(led, "b", 5, "pre")
    assert led.reserve(Request(id="1", gpus=2, strategy="best_fit"), 0.0).node == "b"
    assert led.reserve(Request(id="2", gpus=2, strategy="leastLoaded"), 0.0).node == "a"
    assert led.reserve(Request(id="3", gpus=2, strategy="least_utilized"), 0.0).node == "c"


def test_least_utilized_shares_go_to_emptiest_node():
    led = make(node("a", 2), node("b", 2))
    take(led, "a", 1, "pre")
    p = led.reserve(Request(id="s", gpu_milli=500, strategy="least_utilized"), 0.0)
    assert p.node == "b"


def test_round_robin_rotates_deterministically():
    led = make(node("a", 8), node("b", 8), node("c", 8))
    got = [led.reserve(Request(id=f"r{i}", gpus=1, strategy="round_robin"), 0.0).node for i in range(5)]
    assert got == ["a", "b", "c", "a", "b"]
    # a node that cannot fit is skipped, the rotation continues after the node used
    take(led, "c", 7, "fill-c")
    assert led.reserve(Request(id="r5", gpus=1, strategy="round_robin"), 0.0).node == "a"


def test_random_is_seeded_by_seed_and_id():
    nodes = [node(f"n{i}", 8) for i in range(20)]

    def pick(seed, rid):
        return make(*nodes).reserve(Request(id=rid, gpus=1, strategy="random", seed=seed), 0.0).node

    assert pick(1, "x") == pick(1, "x")
    picks = {pick(s, f"id{s}") for s in range(12)}
    assert len(picks) > 3


def test_cost_optimized_prefers_cheap_nodes():
    cheap = {"gpu-orchestrator/cheap-node": "true"}
    led = make(node("a", 8), node("b", 8, labels=cheap), node("c", 2))
    assert led.reserve(Request(id="1", gpus=2, strategy="cost_optimized"), 0.0).node == "b"
    take(led, "b", 6, "fill")
    assert led.reserve(Request(id="2", gpus=2, strategy="costOptimized"), 0.0).node == "c"


def test_consolidated_packs_the_fullest_leaf_and_distributed_spreads():
    led = make(
        node("a1", 8, leaf="A"),
        node("a2", 8, leaf="A"),
        node("b1", 8, leaf="B"),
        node("b2", 8, leaf="B"),
    )
    take(led, "a1", 4, "pre")
    c = led.reserve(Request(id="c", gpus=1, strategy="consolidated"), 0.0)
    assert c.node == "a1"  # leaf A has less free; a1 is the fullest node in it
    d = led.reserve(Request(id="d", gpus=1, strategy="distributed"), 0.0)
    assert d.node in ("b1", "b2") and d.node == "b1"  # emptiest leaf, emptiest node, ties by name


def test_priority_headroom_rule():
    led = make(node("a", 10), priority_headroom=0.2)
    for i in range(8):
        assert isinstance(led.reserve(Request(id=f"low{i}", gpus=1, strategy="priority"), 0.0), Placement)
    d = led.reserve(Request(id="low8", gpus=1, strategy="priority", priority=0), 0.0)
    assert isinstance(d, Denial) and d.by_reason[0][0] == Reason.PRIORITY_HEADROOM
    assert "20%" in d.message
    hi = led.reserve(Request(id="hi", gpus=2, strategy="priority", priority=100), 0.0)
    assert isinstance(hi, Placement)


def test_balanced_weights_are_configurable():
    led = make(node("a", 8, leaf="A"), node("b", 8, leaf="B"))
    take(led, "a", 4, "pre")
    # availability favours the empty node b
    assert led.reserve(Request(id="1", gpus=1, strategy="balanced"), 0.0).node == "b"
    only_history = {"resourceAvailability": 0, "topologyAlignment": 0, "domainUtilization": 0,
                    "historicalPerformance": 1}
    led2 = make(node("a", 8), node("b", 8), balanced_weights=only_history)
    led2.performance.update({"a": 0.9, "b": 0.2})
    assert led2.reserve(Request(id="1", gpus=1, strategy="balanced"), 0.0).node == "a"
    ex = led2.explain(Request(id="2", gpus=1, strategy="balanced"))
    assert [s.node for s in ex.scores] == ["a", "b"] and ex.scores[0].score == pytest.approx(0.9)


def test_whole_gpus_prefer_contiguous_devices():
    led = make(node("a", 8))
    take(led, "a", 1, "x")  # device 0
    led.reserve(Request(id="y", gpus=1, pinned=PinnedDevices("a", (3,))), 0.0)
    p = led.reserve(Request(id="z", gpus=3), 0.0)
    assert p.devices == (4, 5, 6)  # (1, 2) is too short; the run 4..7 holds three
    q = led.reserve(Request(id="w", gpus=2), 0.0)
    assert q.devices == (1, 2)


# ------------------------------------------------------------------------------------------ filters


def test_taints_and_gpu_taint_tolerated_on_pods_behalf():
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    other = {"key": "dedicated", "value": "infra", "effect": "NoExecute"}
    soft = {"key": "soft", "effect": "PreferNoSchedule"}
    led = make(node("gpu", 4, taints=[gpu_taint, soft]), node("infra", 8, taints=[other]))
    p = led.reserve(Request(id="1", gpus=1), 0.0)
    assert p.node == "gpu"
    assert p.tolerated_taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    tol = Toleration(key="dedicated", operator="Equal", value="infra", effect="NoExecute")
    q = led.reserve(Request(id="2", gpus=8, tolerations=(tol,)), 0.0)
    assert q.node == "infra" and q.tolerated_taints == ()
    d = led.reserve(Request(id="3", gpus=8), 0.0)
    assert isinstance(d, Denial) and dict(d.by_reason)[Reason.TAINT] == 1
    # a pod that tolerates the GPU taint itself needs nothing added
    r = led.reserve(Request(id="4", gpus=1, tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),)), 0.0)
    assert r.node == "gpu" and r.tolerated_taints == ()


def test_gpu_taint_keys_are_configurable():
    led = make(node("a", 2, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]), tolerated_gpu_taint_keys=())
    d = led.reserve(Request(id="1", gpus=1), 0.0)
    assert isinstance(d, Denial) and d.by_reason == ((Reason.TAINT, 1),)


def test_node_selector_and_affinity_operators():
    led = make(
        node("a", 2, labels={"zone": "z1", "gen": "3"}),
        node("b", 2, labels={"zone": "z2", "gen": "5"}),
        node("c", 2, labels={"gen": "9"}),
    )

    def where(**kw):
        r = led.explain(Request(id="e", gpus=1, **kw)).result
        return r.node if isinstance(r, Placement) else None

    assert where(node_selector=(("zone", "z2"),)) == "b"
    req = SelectorRequirement
    assert where(affinity_terms=((req("zone", "In", ("z1",)),),)) == "a"
    assert where(affinity_terms=((req("zone", "NotIn", ("z1", "z2")),),)) == "c"
    assert where(affinity_terms=((req("zone", "DoesNotExist"),),)) == "c"
    assert where(affinity_terms=((req("zone", "Exists"), req("gen", "Gt", ("4",))),)) == "b"
    assert where(affinity_terms=((req("gen", "Lt", ("4",)),),)) == "a"
    # terms are ORed
    assert where(affinity_terms=((req("zone", "In", ("nope",)),), (req("gen", "Gt", ("8",)),))) == "c"
    d = led.reserve(Request(id="x", gpus=1, node_selector=(("zone", "z9"),)), 0.0)
    assert isinstance(d, Denial) and d.by_reason == ((Reason.SELECTOR, 3),)


def test_product_and_gpu_memory_filters():
    led = make(node("t4", 4, product="Tesla-T4", gpu_memory=15360), node("a100", 4, product="NVIDIA-A100-SXM4-80GB",
                                                                          gpu_memory=81920))
    assert led.reserve(Request(id="1", gpus=1, product="a100"), 0.0).node == "a100"
    assert led.reserve(Request(id="2", gpus=1, product="T4"), 0.0).node == "t4"
    d = led.reserve(Request(id="3", gpus=1, product="H100"), 0.0)
    assert isinstance(d, Denial) and d.by_reason == ((Reason.PRODUCT_MISMATCH, 2),)
    assert "H100" in d.message
    assert led.reserve(Request(id="4", gpus=1, gpu_memory_mib=40000), 0.0).node == "a100"
    e = led.reserve(Request(id="5", gpus=1, gpu_memory_mib=100000), 0.0)
    assert isinstance(e, Denial) and e.by_reason == ((Reason.GPU_MEMORY_TOO_SMALL, 2),)


def test_accelerator_label_counts_as_product():
    led = make(node("x", 2, product="", labels={"accelerator": "nvidia-tesla-v100"}))
    assert led.reserve(Request(id="1", gpus=1, product="v100"), 0.0).node == "x"


def test_not_ready_cordoned_and_not_gpu_schedulable_nodes_are_out():
    led = make(
        node("down", 8, ready=False),
        node("cordoned", 8, unschedulable=True),
        node("off", 8, labels={"agentaflow.gpu/schedulable": "false"}),
    )
    d = led.reserve(Request(id="1", gpus=1), 0.0)
    assert isinstance(d, Denial)
    assert dict(d.by_reason) == {Reason.NOT_READY: 2, Reason.NOT_GPU_SCHEDULABLE: 1}


def test_cpu_and_memory_must_fit():
    led = make(node("small", 8, cpu="2", memory="4Gi"), node("big", 1))
    assert led.reserve(Request(id="1", gpus=1, cpu_milli=4000), 0.0).node == "big"
    d = led.reserve(Request(id="2", gpus=1, cpu_milli=4000, memory_mib=1024), 0.0)
    assert isinstance(d, Denial)
    assert dict(d.by_reason) == {Reason.NOT_ENOUGH_CPU: 1, Reason.NOT_ENOUGH_GPUS: 1}


def test_preferred_domain_is_soft():
    led = make(node("a", 8, leaf="L1", spine="S1"), node("b", 8, leaf="L2", spine="S2"))
    assert led.reserve(Request(id="1", gpus=1, preferred_domain="L2"), 0.0).node == "b"
    assert led.reserve(Request(id="2", gpus=1, preferred_domain="S1"), 0.0).node == "a"
    take(led, "b", 7, "fill-b")
    assert led.reserve(Request(id="3", gpus=2, preferred_domain="L2"), 0.0).node == "a"  # falls back


# ------------------------------------------------------------------------------------------ pinned map


def test_pinned_map_exact_devices_and_denials():
    devices = [{"index": i, "healthy": i != 3} for i in range(4)]
    led = make(node("a", 4, devices=devices), node("b", 4))
    p = led.reserve(Request(id="1", gpus=2, pinned=PinnedDevices("a", (2, 0))), 0.0)
    assert isinstance(p, Placement) and p.node == "a" and p.devices == (0, 2) and p.strategy == "explicit"
    for rid, pin, why in [
        ("2", PinnedDevices("a", (0,)), "taken"),
        ("3", PinnedDevices("a", (3,)), "unhealthy"),
        ("4", PinnedDevices("a", (7,)), "does not exist"),
        ("5", PinnedDevices("zz", (0,)), "unknown"),
    ]:
        d = led.reserve(Request(id=rid, gpus=1, pinned=pin), 0.0)
        assert isinstance(d, Denial) and d.by_reason == ((Reason.PINNED, 1),), d
        assert why in d.message and "gpu-scheduling-map" in d.message
    s = led.reserve(Request(id="6", gpu_milli=300, pinned=PinnedDevices("b", (1,))), 0.0)
    assert s.shares[0].device == 1 and s.node == "b"


# ------------------------------------------------------------------------------------------ denials


def test_denial_message_counts_reasons_and_names_best_near_miss():
    taint = {"key": "dedicated", "effect": "NoSchedule"}
    nodes = [node(f"full-{i:02d}", 4) for i in range(12)] + [node(f"t-{i}", 8, taints=[taint]) for i in range(4)]
    led = make(*nodes)
    for i in range(12):
        take(led, f"full-{i:02d}", 2 if i else 1, f"pre{i}")
    d = led.reserve(Request(id="big", gpus=4), 0.0)
    assert isinstance(d, Denial)
    assert d.message.startswith("no node fits 4 whole GPU(s) with strategy best_fit: ")
    assert "12 node(s) not enough GPUs (best: full-00 has 3 free)" in d.message
    assert "4 node(s) untolerated taint" in d.message
    assert dict(d.by_reason) == {Reason.NOT_ENOUGH_GPUS: 12, Reason.TAINT: 4}
    assert d.near_misses[0].node == "full-00" and d.near_misses[0].free_gpus == 3


def test_denial_for_share_and_unknown_gpu_identity():
    led = make(node("a", 1))
    led.apply_object(
        {
            "kind": "Pod",
            "metadata": {"name": "legacy", "namespace": "x"},
            "spec": {"nodeName": "a", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
            "status": {"phase": "Running"},
        },
        0.0,
    )
    d = led.reserve(Request(id="s", gpu_milli=100), 0.0)
    assert isinstance(d, Denial) and d.by_reason == ((Reason.NOT_ENOUGH_GPU_SHARE, 1),)
    assert "share of 100 milli-GPU" in d.message


def test_invalid_requests_are_denied_with_the_field_named():
    led = make(node("a", 1))
    d = led.reserve(Request(id="x", gpus=1, gpu_milli=200), 0.0)
    assert isinstance(d, Denial) and "gpu_milli=200" in d.message
    d2 = led.reserve(Request(id="y", gpu_milli=1500), 0.0)
    assert isinstance(d2, Denial) and "0..1000" in d2.message


def test_same_seed_same_result_across_ledgers():
    nodes = [node(f"n{i}", 8, leaf=f"L{i % 3}") for i in range(9)]
    reqs = [Request(id=f"r{i}", gpus=1 + i % 3, strategy=s, seed=7)
            for i, s in enumerate(["random", "balanced", "round_robin", "distributed"] * 5)]

    def run():
        led = make(*nodes)
        return [led.reserve(r, 0.0) for r in reqs]

    assert run() == run()


# ------------------------------------------------------------------------------------------ leaf walk (spread)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.booleans()), min_size=1, max_size=24),
    st.lists(st.tuples(st.integers(0, 23), st.integers(1, 4)), max_size=30),
    st.integers(1, 4),
)
def test_spread_leaf_walk_order_is_leaf_total_then_most_free_then_name(layout, takes, need):
    """`leaf_walk(descending)` (its first node from the index's per-total heads) yields exactly: placeable nodes
    with >= need whole-free GPUs in leaves with >= need, by leaf total desc, whole-free desc, name."""
    led = make(*(node(f"n{i:02d}", gpus, leaf=f"l{leaf}", unschedulable=cordoned)
                 for i, (leaf, gpus, cordoned) in enumerate(layout)))
    for j, (i, gpus) in enumerate(takes):
        name = f"n{i % len(layout):02d}"
        if led.index.nodes[name].whole_free >= gpus and led.index.nodes[name].placeable:
            take(led, name, gpus, f"t{j}")
        if j % 3 == 2:
            led.release(f"t{j - 1}")
        walked = [n.name for n in strategies.leaf_walk(led.index, None, need, True, True)]
        totals = {key: b.total_whole for key, b in led.index.leaves.items()}
        expected = sorted(
            (n for n in led.index.nodes.values()
             if n.placeable and n.whole_free >= need and totals[n.leaf_key] >= need),
            key=lambda n: (-totals[n.leaf_key], -n.whole_free, n.name),
        )
        assert walked == [n.name for n in expected]


def test_distributed_takes_the_next_node_when_the_first_of_a_tied_group_is_refused():
    led = make(
        node("a1", 4, leaf="la", taints=[{"key": "dedicated", "effect": "NoSchedule"}]),
        node("b1", 4, leaf="lb"),
        node("b2", 2, leaf="lb"),
        node("c1", 2, leaf="lc"),
        node("c2", 4, leaf="lc"),
    )
    # leaf totals: la 4, lb 6, lc 6 (tied); most free first: b1 (4), c2 (4) -> b1
    p = led.reserve(Request(id="r1", gpus=1, strategy="distributed"), 0.0)
    assert p.node == "b1"
    # now lc 6 leads alone: c2
    assert led.reserve(Request(id="r2", gpus=1, strategy="distributed"), 0.0).node == "c2"
    # totals lb 5, lc 5 tied: b1 3, c2 3 -> b1 by name; a request b1 cannot take (cpu) goes to c2 next
    led.apply_object(node("b1", 4, leaf="lb", cpu="1"), 0.0)
    p = led.reserve(Request(id="r3", gpus=1, cpu_milli=2000, strategy="distributed"), 0.0)
    assert p.node == "c2"


# ------------------------------------------------------------------------------------------ best fit walk


class _FullScan:
    """The same strategy with its candidate walk switched off: the ledger scores every node."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def candidates(self, request, ctx, leaves):
        return None


_CPU_SIZES = (4_000, 16_000, 64_000, 96_000, 128_000)


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_CPU_SIZES), st.integers(0, 8), st.integers(0, 2), st.integers(0, 3)),
        min_size=1,
        max_size=14,
    ),
    st.lists(
        st.tuples(
            st.sampled_from(["whole", "share", "cpu", "release", "foreign", "node"]),
            st.integers(0, 1000),
            st.integers(0, 40_000),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_best_fit_walk_picks_what_a_full_scan_picks(layout, ops):
    """Heterogeneous CPU and GPU counts, unhealthy devices, shares, CPU-only pods, releases, GPUs held by
    pods of unknown identity, nodes added later (maxima change) and soft domains: the best-fit walk places
    every request exactly where scoring every node with the same score does."""
    from allocator.core.inventory import Holding
    from allocator.core.model import Device, NodeInfo

    def info(i, cpu, gpus, unhealthy, leaf):
        devices = tuple(Device(index=d, memory_mib=40960, healthy=d >= unhealthy) for d in range(gpus))
        return NodeInfo(name=f"n{i:02d}", cpu_milli=cpu, memory_mib=65536, devices=devices,
                        spine="s", leaf=f"l{leaf}")

    fast, scan = Ledger(LedgerConfig()), Ledger(LedgerConfig())
    for led in (fast, scan):
        for i, (cpu, gpus, unhealthy, leaf) in enumerate(layout):
            led.upsert_node(info(i, cpu, gpus, unhealthy, leaf))
    original = strategies.get_strategy("best_fit")
    placed: list[str] = []
    for j, (kind, amount, cpu, in_domain) in enumerate(ops):
        if kind == "release":
            if placed:
                rid = placed.pop(amount % len(placed))
                assert fast.release(rid) == scan.release(rid)
            continue
        if kind == "node":
            for led in (fast, scan):
                led.upsert_node(info(50 + j, _CPU_SIZES[amount % 5], amount % 9, 0, amount % 4))
            continue
        if kind == "foreign":
            name = sorted(fast.index.nodes)[amount % len(fast.index.nodes)]
            for led in (fast, scan):
                state = led.index.nodes[name]
                led.index.change(state, lambda s=state: s.apply(Holding(f"u{j}", name, unknown_gpus=1)))
            continue
        shape = {"whole": {"gpus": 1 + amount % 4}, "share": {"gpu_milli": 100 + amount % 900}}.get(kind, {})
        req = Request(id=f"r{j}", cpu_milli=cpu, memory_mib=amount * 8, strategy="best_fit",
                      preferred_domain=f"l{amount % 3}" if in_domain else None, **shape)
        got = fast.reserve(req, 0.0)
        core_registry._INSTANCES["best_fit"] = _FullScan(original)  # type: ignore[assignment]
        try:
            want = scan.reserve(req, 0.0)
        finally:
            core_registry._INSTANCES["best_fit"] = original
        assert type(got) is type(want)
        if isinstance(want, Placement):
            assert (got.node, got.devices, got.shares) == (want.node, want.devices, want.shares)
            assert got.score == want.score
            placed.append(req.id)


def test_best_fit_counts_cpu_so_cpu_pods_leave_gpu_nodes_alone():
    """A CPU-only pod goes to the CPU node, not to the GPU node with less free CPU (stranding its GPUs);
    among GPU nodes, the one whose CPU and GPUs are both fullest after placement wins."""
    from allocator.core.model import Device, NodeInfo

    led = Ledger(LedgerConfig())
    gpus = tuple(Device(index=d) for d in range(8))
    led.upsert_node(NodeInfo(name="gpu-small-cpu", cpu_milli=16_000, memory_mib=65536, devices=gpus))
    led.upsert_node(NodeInfo(name="gpu-big-cpu", cpu_milli=96_000, memory_mib=65536, devices=gpus))
    led.upsert_node(NodeInfo(name="cpu-only", cpu_milli=64_000, memory_mib=65536, devices=()))
    # cost after (cpu/96 + gpu/8): gpu-small-cpu 12/96+8/8, gpu-big-cpu 92/96+8/8, cpu-only 60/96+0
    assert led.reserve(Request(id="c", cpu_milli=4000), 0.0).node == "cpu-only"
    # a GPU pod: gpu-small-cpu 12/96+7/8 beats gpu-big-cpu 92/96+7/8
    assert led.reserve(Request(id="g", gpus=1, cpu_milli=4000), 0.0).node == "gpu-small-cpu"
