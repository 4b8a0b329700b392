"""The artifact-fidelity variants of fgd (simulation only): the integer score, the three tie-breaks, the first
device pick, and that with every switch off the variant decides exactly as fgd."""

from __future__ import annotations

import random

import pytest

from gpuledger.core.model import Placement, Request
from gpuledger.strategies import register
from gpuledger.strategies.fgd_artifact import VARIANTS, ArtifactFGD, artifact_score, register_variants
from gpuledger.strategies.fragmentation import PodShape, TargetWorkload
from tests.strategies.support import ledger, node_info
from tests.strategies.test_fgd_classes import decisions, make_nodes, make_request

register("fgd_artifact_all_off", lambda: ArtifactFGD(quantize=False, ties="name", first_device=False))
register_variants()


def test_the_integer_score_is_the_artifacts():
    # int64(sigmoid((before - after) / 1000) * 100): no change 50, any small increase 49, a small decrease 50
    assert artifact_score(0.0) == 50
    assert artifact_score(1.0) == 49 and artifact_score(40.0) == 49 and artifact_score(41.0) == 48
    assert artifact_score(-1.0) == 50 and artifact_score(-1000.0) == 73 and artifact_score(1000.0) == 26


def test_variants_are_registered_only_on_request_and_reject_unknown_ties():
    assert set(VARIANTS) >= {"fgd_artifact", "fgd_quantized", "fgd_node_order", "fgd_first_device"}
    with pytest.raises(ValueError, match="ties='fresh' is not accepted: expected name, order or random"):
        ArtifactFGD(ties="fresh")


@pytest.mark.parametrize("seed", range(4))
def test_with_every_switch_off_it_decides_as_fgd(seed):
    rng = random.Random(seed)
    nodes = make_nodes(rng, 12)
    requests = [make_request(rng, i) for i in range(60)]
    workload = TargetWorkload.from_requests(requests)
    assert decisions("fgd_artifact_all_off", nodes, requests, seed, workload) == decisions(
        "fgd", nodes, requests, seed, workload
    )


def place(strategy: str, nodes, requests, workload, seed: int = 42) -> list[str]:
    led = ledger(strategy, nodes, workload)
    out = []
    for r in requests:
        p = led.reserve(Request(r.id, cpu_milli=r.cpu_milli, gpus=r.gpus, seed=seed, strategy=strategy), 0.0)
        assert isinstance(p, Placement), p
        out.append(p.node)
    return out


def test_tied_nodes_go_by_name_by_a_fixed_seeded_order_or_at_random():
    nodes = [node_info(f"n{i:02d}", 8, cpu=96_000) for i in range(20)]
    workload = TargetWorkload.from_shapes([PodShape(8000, 1, 1000)])
    pods = [Request(f"c{i}", cpu_milli=1000) for i in range(5)]  # CPU-only: no node's fragmentation moves
    assert set(place("fgd", nodes, pods, workload)) == {"n00"}  # ours: the lowest name, every time
    order = place("fgd_node_order", nodes, pods, workload)
    assert len(set(order)) == 1 and order[0] != "n00"  # one node, the first of the seeded order
    assert place("fgd_node_order", nodes, pods, workload) == order  # fixed for a seed
    assert place("fgd_node_order", nodes, pods, workload, seed=7) != order
    fresh = place("fgd_random_ties", nodes, pods, workload)
    assert len(set(fresh)) > 1 and place("fgd_random_ties", nodes, pods, workload) == fresh  # seeded


def test_quantized_scores_tie_where_exact_ones_differ():
    # a 1-GPU pod asking 2 cores: on the 41-core node the rare 40-core shape stops fitting (+26 milli of
    # expected fragment), on the 96-core node the rarer 95-core shape does (+14): fgd takes the smaller
    # increase; the artifact's integer score is 49 for both, and the tie goes by name
    small, large = node_info("a", 8, cpu=41_000), node_info("b", 8, cpu=96_000)
    shapes = (
        [PodShape(40_000, 1, 1000)] * 4 + [PodShape(95_000, 1, 1000)] * 2 + [PodShape(1000, 1, 1000)] * 994
    )
    workload = TargetWorkload.from_shapes(shapes, popularity=1.0)
    pod = [Request("p", cpu_milli=2000, gpus=1)]
    assert place("fgd", [small, large], pod, workload) == ["b"]
    assert place("fgd_quantized", [small, large], pod, workload) == ["a"]
