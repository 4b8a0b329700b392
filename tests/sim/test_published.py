"""The published figures a workload is compared with (gpuledger/sim/published.py)."""

from __future__ import annotations

from gpuledger.sim.published import ALL_KINDS, PUBLISHED, QUICK_KINDS, published_for
from gpuledger.sim.variants import parse_variant


def test_each_workload_maps_to_its_kind_in_the_artifact():
    assert published_for("default").fgd == 4.77
    # our generated variants compare with the artifact's trace of the same kind and share
    assert published_for("gpuspec33") is published_for("gpuspec33-cap") is PUBLISHED["gpuspec33"]
    assert published_for("share80") is published_for("gpushare80") is PUBLISHED["gpushare80"]
    assert published_for("cpu250").trace == "openb_pod_list_cpu250"
    assert published_for("cpu50").trace == "openb_pod_list_cpu050"  # 5% of the pods CPU-only
    assert published_for("cpu150") is None  # the artifact has no cpu150
    assert published_for("cpuscale250") is None  # "N% more CPU" read literally: nothing published
    assert published_for("mystery") is None


def test_every_benchmarked_kind_is_a_workload_with_figures():
    for workload in set(QUICK_KINDS) | set(ALL_KINDS):
        assert workload in PUBLISHED or parse_variant(workload) is not None
        assert published_for(workload) is not None, workload
    for figures in PUBLISHED.values():
        assert 0 < figures.fgd < 100 and figures.source in ("paper", "artifact")
        assert figures.best_fit is None or figures.best_fit > figures.fgd
