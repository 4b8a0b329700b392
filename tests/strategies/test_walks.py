"""The candidate walks against their definitions: leaf_walk's order, best_fit's walk against a full scan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger import strategies
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Placement, Request
from gpuledger.core.plugins import registry as core_registry
from tests.core.core_factory import node
from tests.strategies.support import FullScan, make, take


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.booleans()), min_size=1, max_size=24),
    st.lists(st.tuples(st.integers(0, 23), st.integers(1, 4)), max_size=30),
    st.integers(1, 4),
)
def test_spread_leaf_walk_order_is_leaf_total_then_most_free_then_name(layout, takes, need):
    """`leaf_walk(descending)` (its first node from the index's per-total heads) yields exactly: placeable
    nodes with >= need whole-free GPUs in leaves with >= need, by leaf total desc, whole-free desc, name."""
    led = make(
        *(
            node(f"n{i:02d}", gpus, leaf=f"l{leaf}", unschedulable=cordoned)
            for i, (leaf, gpus, cordoned) in enumerate(layout)
        )
    )
    for j, (i, gpus) in enumerate(takes):
        name = f"n{i % len(layout):02d}"
        if led.index.nodes[name].whole_free >= gpus and led.index.nodes[name].placeable:
            take(led, name, gpus, f"t{j}")
        if j % 3 == 2:
            led.release(f"t{j - 1}")
        walked = [n.name for n in strategies.leaf_walk(led.index, None, need, True, True)]
        totals = {key: b.total_whole for key, b in led.index.leaves.items()}
        expected = sorted(
            (
                n
                for n in led.index.nodes.values()
                if n.placeable and n.whole_free >= need and totals[n.leaf_key] >= need
            ),
            key=lambda n: (-totals[n.leaf_key], -n.whole_free, n.name),
        )
        assert walked == [n.name for n in expected]


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
    from gpuledger.core.model import Device, NodeInfo
    from gpuledger.core.nodes.node_state import Holding

    def info(i, cpu, gpus, unhealthy, leaf):
        devices = tuple(Device(index=d, memory_mib=40960, healthy=d >= unhealthy) for d in range(gpus))
        return NodeInfo(
            name=f"n{i:02d}", cpu_milli=cpu, memory_mib=65536, devices=devices, spine="s", leaf=f"l{leaf}"
        )

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
                led.index.change(state, state.apply, Holding(f"u{j}", name, unknown_gpus=1))
            continue
        shape = {"whole": {"gpus": 1 + amount % 4}, "share": {"gpu_milli": 100 + amount % 900}}.get(kind, {})
        req = Request(
            id=f"r{j}",
            cpu_milli=cpu,
            memory_mib=amount * 8,
            strategy="best_fit",
            preferred_domain=f"l{amount % 3}" if in_domain else None,
            **shape,
        )
        got = fast.reserve(req, 0.0)
        core_registry._INSTANCES["best_fit"] = FullScan(original)  # type: ignore[assignment]
        try:
            want = scan.reserve(req, 0.0)
        finally:
            core_registry._INSTANCES["best_fit"] = original
        assert type(got) is type(want)
        if isinstance(want, Placement):
            assert (got.node, got.devices, got.shares) == (want.node, want.devices, want.shares)
            assert got.score == want.score
            placed.append(req.id)
