"""The paper's protocol (sampling to 1.3x, seeded shuffle) and the allocation-curve arithmetic."""

from __future__ import annotations

from collections import Counter

import pytest

from gpuledger.core.model import Device, NodeInfo, Request
from gpuledger.sim.simulator import Run, StrategyResult, build_arrivals, gpu_capacity_milli, requested_milli

POOL = [Request("w", gpus=1), Request("s", gpu_milli=460), Request("c", cpu_milli=4000), Request("e", gpus=8)]


def test_requested_milli():
    assert [requested_milli(r) for r in POOL] == [1000, 460, 0, 8000]


def test_capacity_counts_healthy_devices():
    node = NodeInfo("n", 1000, 1000, (Device(0), Device(1, healthy=False), Device(2)))
    assert gpu_capacity_milli([node, NodeInfo("cpu", 1000, 1000, ())]) == 2000


def test_sampling_tops_up_to_the_ratio_and_keeps_every_trace_pod():
    capacity = 100_000
    arrivals = build_arrivals(POOL, capacity, ratio=1.3, seed=1)
    total = sum(requested_milli(r) for r in arrivals)
    assert 1.3 * capacity - 8000 < total <= 1.3 * capacity
    ids = [r.id for r in arrivals]
    assert len(ids) == len(set(ids))
    assert {"w", "s", "c", "e"} <= set(ids)
    copies = Counter(r.id.split("#")[0] for r in arrivals)
    assert set(copies) == {"w", "s", "c", "e"} and sum(copies.values()) == len(arrivals)
    # copies are the same asks under new ids
    copy = next(r for r in arrivals if r.id.startswith("s#"))
    assert copy.gpu_milli == 460 and copy.name == "" and copy.gpus == 0


def test_shuffle_is_deterministic_given_the_seed():
    a = build_arrivals(POOL, 50_000, seed=7)
    b = build_arrivals(POOL, 50_000, seed=7)
    c = build_arrivals(POOL, 50_000, seed=8)
    assert [r.id for r in a] == [r.id for r in b]
    assert [r.id for r in a] != [r.id for r in c]
    unshuffled = build_arrivals(POOL, 50_000, seed=7, shuffle=False)
    assert [r.id for r in unshuffled[:4]] == ["w", "s", "c", "e"]


def test_a_trace_above_the_target_is_thinned():
    pods = [Request(f"p{i}", gpus=1) for i in range(100)]
    arrivals = build_arrivals(pods, capacity_milli=10_000, ratio=1.3, seed=3)
    assert sum(requested_milli(r) for r in arrivals) == 13_000
    assert len({r.id for r in arrivals}) == 13


def test_gpu_less_pool_does_not_loop_forever():
    assert len(build_arrivals([Request("c", cpu_milli=1)], 1000, seed=0)) == 1


def test_curve_by_hand():
    # capacity 2000: arrivals of 1000, 500, 600, 1000 milli; the last two fail
    run = Run("x", 0, 2000, arrived=[1000, 1500, 2100, 3100], allocated=[1000, 1500, 1500, 1500])
    assert run.allocation_pct_at(0) == 0
    assert run.allocation_pct_at(50) == 50
    assert run.allocation_pct_at(75) == 75
    assert run.allocation_pct_at(100) == 75  # 2100 has not arrived yet at 100%
    assert run.unallocated_at_100 == 25
    assert run.allocation_pct_at(105) == 75
    assert run.max_arrived_pct == 155
    points, allocation = run.curve(step=50)
    assert points == [0, 50, 100, 150] and allocation == [0, 50, 75, 75]


def test_median_over_seeds():
    runs = [Run("x", s, 1000, arrived=[1000], allocated=[a]) for s, a in ((1, 900), (2, 950), (3, 990))]
    result = StrategyResult("x", runs)
    assert result.unallocated_at_100 == pytest.approx(5)
    doc = result.as_json()
    assert doc["unallocated_at_100"] == pytest.approx(5)
    assert doc["unallocated_at_100_by_seed"] == {"1": 10.0, "2": 5.0, "3": 1.0}
    assert doc["curve"]["arrived_pct"] == list(range(101))
    assert doc["curve"]["allocation_pct"][-1] == pytest.approx(95)


def test_artifact_order_shuffles_the_trace_then_appends_the_draws():
    pods = [Request(f"p{i}", gpus=1) for i in range(20)]
    arrivals = build_arrivals(pods, 10_000, ratio=3.0, seed=5, artifact_order=True)
    head, tail = arrivals[:20], arrivals[20:]
    assert sorted(r.id for r in head) == sorted(r.id for r in pods) and [r.id for r in head] != [
        r.id for r in pods
    ]
    assert len(tail) == 10 and all("#" in r.id for r in tail)
    assert [r.id for r in tail] == [f"{r.id.split('#')[0]}#{k}" for k, r in enumerate(tail)]  # drawn order


def test_the_artifacts_reading_of_100_percent_is_a_mean_around_it():
    # capacity 10000: the pods whose arrival lands in [99.5%, 100.5%) count: 9950 and 10000 arrived
    run = Run(
        "x", 0, 10_000, arrived=[9000, 9950, 10_000, 10_050, 10_100], allocated=[9000, 9900, 9950, 9950, 9950]
    )
    assert run.unallocated_at_100 == pytest.approx(0.5)
    assert run.unallocated_at_100_artifact == pytest.approx(100 - (9900 + 9950) / 2 / 100)
    assert StrategyResult("x", [run]).as_json()["unallocated_at_100_artifact"] == pytest.approx(
        run.unallocated_at_100_artifact, abs=1e-4
    )
