"""Workload variants of an openb trace, generated from the default trace the way the paper's artifact built
its own (a share of pods pinned to a GPU model, CPU-heavy, share-heavy and multi-GPU-heavy mixes).

A variant is a pure, seeded function of (pods, nodes, name): the same inputs and seed give the same pods.
Generators never read files; `load_variant` reads the trace and prefers a variant's own file where one exists.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from gpuledger.core.model import MILLI_PER_GPU, NodeInfo
from gpuledger.sim.traces import TraceError, TracePod, load_openb

VARIANT_SEED = 1  # one generated trace per variant, as the artifact ships one file per variant
# the names the docs use; any integer percentage in these patterns is accepted
VARIANT_EXAMPLES = (
    "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33", "gpuspec33-cap",
    "cpu50", "cpu100", "cpu150", "cpu200", "cpu250", "cpuscale250",
    "share40", "share60", "share80", "share100",
    "multigpu20", "multigpu30", "multigpu40", "multigpu50",
)  # fmt: skip
_PATTERN = re.compile(r"^(gpuspec|cpuscale|cpu|share|gpushare|multigpu)(\d{1,3})(-cap)?$")


def _is_share(pod: TracePod) -> bool:
    return pod.is_shared


def _is_multi(pod: TracePod) -> bool:
    return pod.num_gpu > 1


def _fraction(pods: Sequence[TracePod], kind: Callable[[TracePod], bool]) -> float:
    """The share of the GPU milli requested by pods of `kind`."""
    total = sum(p.total_gpu_milli for p in pods)
    return sum(p.total_gpu_milli for p in pods if kind(p)) / total if total else 0.0


def gpu_spec_variant(
    pods: Sequence[TracePod],
    nodes: Sequence[NodeInfo],
    percent: int,
    seed: int = VARIANT_SEED,
    by_capacity: bool = False,
) -> list[TracePod]:
    """`percent`% of the GPU pods (by count, drawn at random) pinned to one GPU model.

    The model is drawn among the models with a node that could hold the pod on its own (enough GPUs, CPU and
    memory): uniformly (`gpuspecN`: demand out of proportion to supply, scarce models over-asked), or in
    proportion to the cluster's GPUs of each model (`gpuspecN-cap`: pinned demand follows supply).
    """
    rng = random.Random(seed)
    out = list(pods)
    gpu_positions = [i for i, p in enumerate(out) if p.num_gpu > 0]
    pinned = rng.sample(gpu_positions, round(len(gpu_positions) * percent / 100))
    supply = Counter(n.product for n in nodes if n.product for _ in n.devices)
    for i in sorted(pinned):
        pod = out[i]
        models = sorted(
            {
                n.product
                for n in nodes
                if n.product
                and len(n.devices) >= pod.num_gpu
                and n.cpu_milli >= pod.cpu_milli
                and n.memory_mib >= pod.memory_mib
            }
        )
        if not models:
            continue
        if by_capacity:
            model = rng.choices(models, weights=[supply[m] for m in models])[0]
        else:
            model = rng.choice(models)
        out[i] = replace(pod, gpu_spec=(model,))
    return out


def cpu_variant(
    pods: Sequence[TracePod], nodes: Sequence[NodeInfo], permille: int, seed: int = VARIANT_SEED
) -> list[TracePod]:
    """CPU-only pods drawn (with replacement) from the trace's own until they are `permille`/10 % of the pods,
    then every GPU pod as it was: the artifact's `cpuNNN` files.

    Read off those files (alibaba/clusterdata, cluster-trace-gpu-v2023): each keeps the default's 7,064 GPU
    pods in order and puts before them 375, 789, 1,768 and 2,356 CPU-only pods copied from the default's 1,088
    (their CPU unchanged) in `cpu050`, `cpu100`, `cpu200`, `cpu250`: 5.0, 10.0, 20.0 and 25.0% of the pods.
    So `cpu250` is "a quarter of the pods need no GPU" (the default has 13.3%), not 250% more CPU a pod
    (that reading is `cpuscaleN`).
    """
    rng = random.Random(seed)
    gpu = [p for p in pods if p.num_gpu > 0]
    donors = [p for p in pods if p.num_gpu == 0]
    if not donors:
        raise TraceError("--workload cpuN: the trace has no CPU-only pod to draw from")
    share = permille / 1000
    count = round(share / (1 - share) * len(gpu))
    drawn = [rng.choice(donors) for _ in range(count)]
    return [replace(p, name=_name(i)) for i, p in enumerate([*drawn, *gpu])]


def cpu_scale_variant(
    pods: Sequence[TracePod], nodes: Sequence[NodeInfo], percent: int, seed: int = VARIANT_SEED
) -> list[TracePod]:
    """Every pod that asks for no GPU asks for `percent`% more CPU (capped at the largest node's CPU, so that
    each pod still fits somewhere): "50-250% more CPU per pod" read literally. The artifact built
    its `cpuNNN` differently (`cpu_variant`), so these have no published figure to compare with."""
    largest = max((n.cpu_milli for n in nodes), default=0)
    factor = 1 + percent / 100
    return [
        replace(p, cpu_milli=min(largest, round(p.cpu_milli * factor))) if p.num_gpu == 0 else p for p in pods
    ]


def share_variant(
    pods: Sequence[TracePod], nodes: Sequence[NodeInfo], percent: int, seed: int = VARIANT_SEED
) -> list[TracePod]:
    """GPU pods resampled until pods asking for part of a GPU hold `percent`% of the GPU milli requested.

    As the artifact's gpushare40: the number of pods is kept; GPU pods of the other kind, drawn at random, are
    replaced by copies of pods of the wanted kind (shares when raising the share, whole-GPU pods when
    lowering it) until the fraction reaches `percent`%. CPU-only pods are untouched.
    """
    return _resample(pods, percent, _is_share, seed)


def multigpu_variant(
    pods: Sequence[TracePod], nodes: Sequence[NodeInfo], percent: int, seed: int = VARIANT_SEED
) -> list[TracePod]:
    """Copies of multi-GPU pods, drawn at random, appended until multi-GPU pods hold `percent`% of the GPU
    milli requested (as the artifact's multigpu50: the default pods, then the added ones)."""
    rng = random.Random(seed)
    out = list(pods)
    donors = [p for p in pods if _is_multi(p)]
    if not donors:
        raise TraceError("--workload multigpuN: the trace has no multi-GPU pod to draw from")
    target = percent / 100
    total = sum(p.total_gpu_milli for p in out)
    multi = sum(p.total_gpu_milli for p in out if _is_multi(p))
    if target >= 1:  # only multi-GPU pods (and the CPU-only ones) remain
        return [p for p in out if p.num_gpu == 0 or _is_multi(p)]
    while total and multi / total < target:
        pod = rng.choice(donors)
        out.append(replace(pod, name=_name(len(out))))
        total += pod.total_gpu_milli
        multi += pod.total_gpu_milli
    return out


def _resample(
    pods: Sequence[TracePod], percent: int, kind: Callable[[TracePod], bool], seed: int
) -> list[TracePod]:
    rng = random.Random(seed)
    out = list(pods)
    target = percent / 100
    wanted = [p for p in pods if p.num_gpu and kind(p)]
    others = [p for p in pods if p.num_gpu and not kind(p)]
    if not wanted or not others:
        raise TraceError("the trace lacks the GPU pods this variant draws from")
    total = sum(p.total_gpu_milli for p in out)
    held = sum(p.total_gpu_milli for p in out if kind(p))
    raising = held < target * total
    donors = wanted if raising else others
    positions = [i for i, p in enumerate(out) if p.num_gpu and kind(p) != raising]
    rng.shuffle(positions)
    for i in positions:
        if (held >= target * total) if raising else (held <= target * total):
            break
        pod = replace(rng.choice(donors), name=out[i].name)
        total += pod.total_gpu_milli - out[i].total_gpu_milli
        held += pod.total_gpu_milli if raising else -out[i].total_gpu_milli
        out[i] = pod
    return out


def _name(i: int) -> str:
    return f"openb-pod-{i:04d}"


GENERATORS: dict[str, Callable[..., list[TracePod]]] = {
    "gpuspec": gpu_spec_variant,
    "cpu": cpu_variant,
    "cpuscale": cpu_scale_variant,
    "share": share_variant,
    "gpushare": share_variant,
    "multigpu": multigpu_variant,
}


def parse_variant(name: str) -> tuple[str, int, bool] | None:
    """`gpuspec33` -> ("gpuspec", 33, False); `gpuspec33-cap` -> (..., True); None for another name."""
    match = _PATTERN.match(name)
    if match is None:
        return None
    kind, percent, cap = match.group(1), int(match.group(2)), bool(match.group(3))
    limit = {"cpu": 999, "cpuscale": 1000}.get(kind, 100)  # cpuN: N per mille of the pods are CPU-only
    if not 0 < percent <= limit:
        raise TraceError(
            f"--workload {name!r}: the percentage must be 1..{limit}; e.g. {kind}{min(limit, 50)}"
        )
    if cap and kind != "gpuspec":
        raise TraceError(f"--workload {name!r}: '-cap' applies to gpuspecN only (e.g. gpuspec33-cap)")
    return kind, percent, cap


def make_variant(
    name: str, pods: Sequence[TracePod], nodes: Sequence[NodeInfo], seed: int = VARIANT_SEED
) -> list[TracePod]:
    """The variant `name` of `pods` (the default trace), generated with `seed`."""
    parsed = parse_variant(name)
    if parsed is None:
        raise TraceError(
            f"--workload {name!r} is not a generated variant; accepted: gpuspecN[-cap], cpuN, cpuscaleN, "
            f"shareN, multigpuN "
            f"(e.g. {', '.join(VARIANT_EXAMPLES[::4])})"
        )
    kind, percent, cap = parsed
    if kind == "gpuspec":
        return gpu_spec_variant(pods, nodes, percent, seed, by_capacity=cap)
    return GENERATORS[kind](pods, nodes, percent, seed)


def load_variant(
    trace_dir, workload: str, node_list: str = "gpu", seed: int = VARIANT_SEED
) -> tuple[list[NodeInfo], list[TracePod]]:
    """An openb workload: its own file when the trace has one (`gpushare40`, `multigpu50`), else generated
    from the default trace (`gpuspec33`, `cpu100`, ...)."""
    from pathlib import Path

    if (Path(trace_dir) / f"openb_pod_list_{workload}.csv").is_file() or parse_variant(workload) is None:
        return load_openb(trace_dir, workload, node_list)
    nodes, pods = load_openb(trace_dir, "default", node_list)
    return nodes, make_variant(workload, pods, nodes, seed)


def describe(pods: Sequence[TracePod]) -> dict[str, float]:
    """What distinguishes the variants: GPU milli of shares and multi-GPU pods, pinned GPU pods, CPU."""
    gpu = [p for p in pods if p.num_gpu]
    return {
        "pods": len(pods),
        "share_milli_pct": 100 * _fraction(pods, _is_share),
        "multigpu_milli_pct": 100 * _fraction(pods, _is_multi),
        "pinned_gpu_pods_pct": 100 * sum(1 for p in gpu if p.gpu_spec) / len(gpu) if gpu else 0.0,
        "cpu_only_cpu_milli": sum(p.cpu_milli for p in pods if not p.num_gpu),
        "cpu_only_pods_pct": 100 * sum(1 for p in pods if not p.num_gpu) / len(pods) if pods else 0.0,
        "gpu_milli": sum(p.total_gpu_milli for p in pods) / MILLI_PER_GPU,
    }
