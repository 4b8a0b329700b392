"""FGD's fragmentation measure on hand-computed nodes (Weng et al., ATC'23, section 4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.model import Request
from gpuledger.strategies.fragmentation import (
    FragmentationMeter,
    PodShape,
    TargetWorkload,
    WorkloadTracker,
    node_fragmentation,
    product_matches,
    split_products,
)

SHARE = PodShape(cpu_milli=0, gpus=1, milli=500)
WHOLE = PodShape(cpu_milli=0, gpus=1, milli=1000)
HALF_HALF = TargetWorkload(((SHARE, 0.5), (WHOLE, 0.5)))


def test_shape_of_requests():
    assert PodShape.of(Request("a", gpus=2, cpu_milli=4000)) == PodShape(4000, 2, 1000, ())
    assert PodShape.of(Request("b", gpu_milli=460, product="V100M16|V100M32")) == PodShape(
        0, 1, 460, ("V100M16", "V100M32")
    )
    assert PodShape.of(Request("c", cpu_milli=8000)) == PodShape(8000, 0, 0, ())
    assert PodShape(0, 2, 1000).total_milli == 2000


def test_products():
    assert split_products(None) == () and split_products("A|B") == ("A", "B")
    assert product_matches("V100M16", ()) and product_matches("V100M16", ("v100m32", "V100M16"))
    assert not product_matches("V100M16", ("V100M32",))


def test_fragmentation_by_hand():
    # free [1000, 300]: the share fits on GPU 0 (300 is lost to it); the whole GPU fits on GPU 0 (300 lost)
    assert node_fragmentation(10_000, [1000, 300], "G2", HALF_HALF) == pytest.approx(300)
    # free [500, 300]: the share fits on GPU 0 (300 lost); no whole GPU left, all 800 lost to it
    assert node_fragmentation(10_000, [500, 300], "G2", HALF_HALF) == pytest.approx(0.5 * 300 + 0.5 * 800)
    # a node with nothing free has no fragments
    assert node_fragmentation(10_000, [0, 0], "G2", HALF_HALF) == 0


def test_cpu_starved_node_loses_everything():
    hungry = TargetWorkload(((PodShape(8000, 1, 500), 1.0),))
    assert node_fragmentation(4000, [1000, 1000], "G2", hungry) == 2000
    assert node_fragmentation(8000, [1000, 1000], "G2", hungry) == 0


def test_wrong_model_and_gpu_less_pods_lose_everything():
    v100 = TargetWorkload(((PodShape(0, 1, 500, ("V100M32",)), 0.5), (PodShape(1000, 0, 0), 0.5)))
    assert node_fragmentation(10_000, [1000, 600], "V100M16", v100) == 1600
    # on the right model the share fits both GPUs: only the CPU-only half counts everything
    assert node_fragmentation(10_000, [1000, 600], "V100M32", v100) == 800


def test_multi_gpu_pod_needs_enough_fitting_gpus():
    two = TargetWorkload(((PodShape(0, 2, 1000), 1.0),))
    assert node_fragmentation(0, [1000, 1000, 400], "T4", two) == 400
    assert node_fragmentation(0, [1000, 900, 400], "T4", two) == 2300


def test_meter_matches_the_plain_function_and_memoises():
    meter = FragmentationMeter(HALF_HALF)
    assert meter.fragmentation(10_000, (500, 300), "G2") == pytest.approx(550)
    assert meter.fragmentation(10_000, (300, 500), "G2") == pytest.approx(
        550
    )  # order of devices is irrelevant
    assert len(meter._memo) == 1


def test_best_choice_for_a_share_picks_the_device_that_fragments_least():
    meter = FragmentationMeter(HALF_HALF)
    # before: share fits both (0 lost), whole fits GPU 0 (600 lost) -> 300
    # on GPU 0 -> [500, 600]: share 0 lost, whole 1100 lost -> 550 (+250)
    # on GPU 1 -> [1000, 100]: share 100 lost, whole 100 lost -> 100 (-200)
    choice = meter.best_choice(10_000, [1000, 600], "G2", SHARE)
    assert choice.devices == (1,) and choice.increase == pytest.approx(-200)


def test_best_choice_whole_gpus_take_idle_devices_and_misfits_are_none():
    meter = FragmentationMeter(HALF_HALF)
    choice = meter.best_choice(10_000, [400, 1000, 1000], "G2", PodShape(0, 2, 1000))
    assert choice.devices == (1, 2)
    # before: share fits 0? no (400<500): fits 1,2 -> 400 lost; whole -> 400 lost => 400; after all lost: 400
    assert choice.increase == pytest.approx(0)
    assert meter.best_choice(10_000, [400, 1000], "G2", PodShape(0, 2, 1000)) is None
    assert meter.best_choice(10_000, [400, 300], "G2", SHARE) is None


def test_cpu_only_pod_changes_fragmentation_through_cpu():
    workload = TargetWorkload(((PodShape(8000, 1, 500), 1.0),))
    meter = FragmentationMeter(workload)
    choice = meter.best_choice(10_000, [1000], "G2", PodShape(4000, 0, 0))
    assert choice.devices == () and choice.increase == 1000  # the GPU becomes unusable: no CPU left for it


def test_target_workload_keeps_the_popular_shapes():
    a, b, c = PodShape(0, 1, 1000), PodShape(0, 1, 500), PodShape(0, 8, 1000)
    workload = TargetWorkload.from_shapes([a] * 90 + [b] * 6 + [c] * 4, popularity=0.95)
    assert [s for s, _ in workload.shapes] == [a, b]
    assert sum(p for _, p in workload.shapes) == pytest.approx(1)
    assert dict(workload.shapes)[a] == pytest.approx(90 / 96)
    assert len(TargetWorkload.from_shapes([a, b, c], popularity=1.0)) == 3
    assert len(TargetWorkload.from_shapes([])) == 0


def test_tracker_learns_from_requests_deterministically():
    tracker = WorkloadTracker(refresh_every=2)
    for i in range(3):
        tracker.observe(Request(f"r{i}", gpus=1))
    tracker.observe(Request("s", gpu_milli=250))
    meter = tracker.meter()
    assert dict(meter.workload.shapes) == {
        PodShape(0, 1, 1000): pytest.approx(0.75),
        PodShape(0, 1, 250): pytest.approx(0.25),
    }
    assert tracker.meter() is meter  # no new requests: same meter, same memo


free_lists = st.lists(st.integers(min_value=0, max_value=1000), min_size=0, max_size=8)
shapes = st.builds(PodShape, st.integers(0, 16000), st.integers(1, 4), st.sampled_from([100, 250, 500, 1000]))


@settings(max_examples=200, deadline=None)
@given(free=free_lists, cpu=st.integers(0, 32000), shape_list=st.lists(shapes, min_size=1, max_size=6))
def test_fragmentation_is_bounded_by_free_milli(free, cpu, shape_list):
    workload = TargetWorkload.from_shapes(shape_list, popularity=1.0)
    value = node_fragmentation(cpu, free, "G2", workload)
    assert -1e-6 <= value <= sum(free) + 1e-6
    assert FragmentationMeter(workload).fragmentation(cpu, tuple(free), "G2") == pytest.approx(value)
