"""Generated openb variants: each kind reaches its target mix, is seeded, and `--workload` takes its name."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from gpuledger.core.model import Device, NodeInfo
from gpuledger.sim import simulator
from gpuledger.sim.traces import TraceError, TracePod
from gpuledger.sim.variants import (
    VARIANT_EXAMPLES,
    cpu_scale_variant,
    cpu_variant,
    describe,
    gpu_spec_variant,
    load_variant,
    make_variant,
    multigpu_variant,
    parse_variant,
    share_variant,
)

# the trace beside the repository, or where OPENB_TRACE points (a worktree kept elsewhere)
SHARED = Path(
    os.environ.get("OPENB_TRACE") or Path(__file__).resolve().parents[2].parent / "shared/traces/openb"
)
needs_trace = pytest.mark.skipif(not SHARED.is_dir(), reason="shared openb traces not present")


def node(name: str, model: str, gpus: int, cpu: int = 96_000) -> NodeInfo:
    return NodeInfo(name, cpu, 512_000, tuple(Device(i, product=model) for i in range(gpus)), product=model)


NODES = [node("g2-a", "G2", 8), node("g2-b", "G2", 8), node("t4", "T4", 2, cpu=104_000)]


def pods() -> list[TracePod]:
    out = []
    for i in range(40):
        out.append(TracePod(f"w{i}", 8000, 16384, 1, 1000))  # whole GPU
        out.append(TracePod(f"s{i}", 4000, 8192, 1, 500))  # a share
        out.append(TracePod(f"c{i}", 20000, 65536))  # CPU only
    out += [TracePod("m0", 32000, 65536, 4, 1000), TracePod("m1", 64000, 65536, 8, 1000)]
    return out


def test_names_parse_and_bad_ones_are_clear():
    assert parse_variant("gpuspec33") == ("gpuspec", 33, False)
    assert parse_variant("gpuspec33-cap") == ("gpuspec", 33, True)
    assert parse_variant("cpu250") == ("cpu", 250, False)
    assert parse_variant("default") is None and parse_variant("gpushare40") == ("gpushare", 40, False)
    with pytest.raises(TraceError, match="applies to gpuspecN only"):
        parse_variant("cpu50-cap")
    for name in VARIANT_EXAMPLES:
        assert parse_variant(name) is not None
    with pytest.raises(TraceError, match=r"percentage must be 1\.\.100"):
        parse_variant("share0")
    with pytest.raises(TraceError, match="not a generated variant"):
        make_variant("weird7", pods(), NODES)


@pytest.mark.parametrize("by_capacity", [False, True])
def test_gpu_spec_pins_that_share_of_gpu_pods_to_a_model_that_can_hold_them(by_capacity):
    out = gpu_spec_variant(pods(), NODES, 50, seed=3, by_capacity=by_capacity)
    gpu = [p for p in out if p.num_gpu]
    pinned = [p for p in gpu if p.gpu_spec]
    assert len(pinned) == round(len(gpu) * 0.5)
    assert all(len(p.gpu_spec) == 1 and p.gpu_spec[0] in ("G2", "T4") for p in pinned)
    assert all(p.gpu_spec == ("G2",) for p in pinned if p.num_gpu > 2)  # the T4 node has only 2 GPUs
    assert not any(p.gpu_spec for p in out if not p.num_gpu)
    # only gpu_spec changes; the same seed gives the same pods, another seed others
    assert [(p.name, p.cpu_milli, p.num_gpu, p.gpu_milli) for p in out] == [
        (p.name, p.cpu_milli, p.num_gpu, p.gpu_milli) for p in pods()
    ]
    assert gpu_spec_variant(pods(), NODES, 50, seed=3, by_capacity=by_capacity) == out
    assert gpu_spec_variant(pods(), NODES, 50, seed=4, by_capacity=by_capacity) != out


def test_gpu_spec_models_uniform_or_by_capacity():
    many = [TracePod(f"w{i}", 1000, 1024, 1, 1000) for i in range(3000)]
    uniform = Counter(p.gpu_spec for p in gpu_spec_variant(many, NODES, 100))
    by_capacity = Counter(p.gpu_spec for p in gpu_spec_variant(many, NODES, 100, by_capacity=True))
    assert 0.4 < uniform[("T4",)] / 3000 < 0.6  # two models, either with equal chance
    assert 0.05 < by_capacity[("T4",)] / 3000 < 0.2  # 2 T4 GPUs of 18


def test_cpu_variant_draws_cpu_only_pods_until_their_share_of_the_pods():
    base = pods()  # 82 GPU pods, 40 CPU-only (32.8%)
    out = cpu_variant(base, NODES, 250, seed=5)
    gpu = [p for p in out if p.num_gpu]
    drawn = [p for p in out if not p.num_gpu]
    assert len(drawn) == round(0.25 / 0.75 * 82) == 27 and out[: len(drawn)] == drawn  # before the GPU pods
    unnamed = [replace(p, name="") for p in base if p.num_gpu]
    assert [replace(p, name="") for p in gpu] == unnamed  # the GPU pods as they were
    assert {(p.cpu_milli, p.memory_mib) for p in drawn} == {(20000, 65536)}  # copies, CPU unchanged
    assert describe(out)["cpu_only_pods_pct"] == pytest.approx(25, abs=0.5)
    assert len({p.name for p in out}) == len(out)
    assert cpu_variant(base, NODES, 250, seed=5) == out  # seeded
    assert len([p for p in cpu_variant(base, NODES, 50) if not p.num_gpu]) == 4  # fewer than the trace's own


def test_cpu_scale_variant_raises_cpu_only_pods_and_caps_at_the_largest_node():
    out = cpu_scale_variant(pods(), NODES, 250)
    by_name = {p.name: p for p in out}
    assert by_name["c0"].cpu_milli == 70_000 and by_name["w0"].cpu_milli == 8000
    capped = cpu_scale_variant([TracePod("big", 64_000, 1)], NODES, 100)
    assert capped[0].cpu_milli == 104_000


@pytest.mark.parametrize("percent", [20, 60, 100])
def test_share_variant_reaches_its_fraction_and_keeps_the_pod_count(percent):
    base = pods()
    out = share_variant(base, NODES, percent, seed=5)
    assert len(out) == len(base) and [p.name for p in out] == [p.name for p in base]
    share = describe(out)["share_milli_pct"]
    if percent == 100:
        assert share == 100
    elif percent > describe(base)["share_milli_pct"]:
        assert percent <= share < percent + 10  # one replacement past the target at most
    else:
        assert percent - 10 < share <= percent
    assert [p for p in out if not p.num_gpu] == [p for p in base if not p.num_gpu]


def test_multigpu_variant_appends_copies_until_its_fraction():
    base = pods()
    out = multigpu_variant(base, NODES, 60, seed=5)
    assert out[: len(base)] == base and len(out) > len(base)
    assert describe(out)["multigpu_milli_pct"] >= 60
    assert all(p.num_gpu > 1 for p in out[len(base) :])
    assert len({p.name for p in out}) == len(out)


@needs_trace
def test_openb_variants_match_their_names():
    nodes, default = load_variant(SHARED, "default")
    for name, key, want in (
        ("gpuspec33", "pinned_gpu_pods_pct", 33),
        ("share60", "share_milli_pct", 60),
        ("multigpu30", "multigpu_milli_pct", 30),
    ):
        _, out = load_variant(SHARED, name)
        assert abs(describe(out)[key] - want) < 0.5, (name, describe(out))
    # the artifact's cpu050/cpu100/cpu200/cpu250 hold 7,439 / 7,853 / 8,832 / 9,420 pods: the default's
    # 7,064 GPU pods and 5 / 10 / 20 / 25% CPU-only pods drawn from its own
    for name, artifact_pods in (("cpu50", 7439), ("cpu100", 7853), ("cpu200", 8832), ("cpu250", 9420)):
        _, cpu = load_variant(SHARED, name)
        assert abs(len(cpu) - artifact_pods) <= 5, (name, len(cpu))
        assert sum(1 for p in cpu if p.num_gpu) == sum(1 for p in default if p.num_gpu) == 7064
    _, scaled = load_variant(SHARED, "cpuscale100")
    assert describe(scaled)["cpu_only_cpu_milli"] == pytest.approx(
        2 * describe(default)["cpu_only_cpu_milli"], rel=0.01
    )
    # a variant with its own file in the trace is read, not generated
    _, shipped = load_variant(SHARED, "gpushare40")
    assert shipped[0].num_gpu == 0 and len(shipped) == 8152


@needs_trace
def test_cli_replays_a_generated_variant(capsys):
    code = simulator.main(
        ["--trace", str(SHARED), "--workload", "gpuspec33", "--limit-nodes", "25", "--seeds", "1",
         "-s", "best_fit", "-o", "json", "-q"]
    )  # fmt: skip
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["workload"].startswith("openb gpuspec33")
    assert 0 <= document["strategies"]["best_fit"]["unallocated_at_100"] < 100
