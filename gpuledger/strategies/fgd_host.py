"""fgd_host: FGD plus the GPUs a node's remaining CPU and memory could no longer feed, plus the demand that
pods pinned to a GPU model put on that model's capacity (this project's variant). Only the extra cost differs
from FGD; it must never change FGD's device choice, memo or walk.
"""

from __future__ import annotations

from gpuledger.core.model import MILLI_PER_GPU
from gpuledger.strategies.fgd import FragmentationGradientDescent
from gpuledger.strategies.fragmentation import TargetWorkload, product_matches


class HostAwareFGD(FragmentationGradientDescent):
    """FGD plus two costs FGD does not see (this project's variant).

    Host: FGD asks whether *one* more pod of each shape fits; it does not see a node whose CPU is being eaten
    by CPU-only pods until the last GPU pod no longer fits, and by then several idle GPUs are stranded. This
    adds `weight` x the increase of `stranded = max(0, free GPU milli - min(free CPU / c, free memory / m))`,
    where c and m are the workload's CPU and memory per milli-GPU: the free GPU milli the node's host
    resources cannot serve at the workload's usual ratio.

    Model demand: GPU milli taken on a model that pinned pods need is milli a pinned pod cannot find
    elsewhere. This adds `model_weight` x taken milli x `pressure[model]`, the model's share of the workload's
    GPU demand that is pinned to it over its share of the cluster's *free* GPU milli: it rises as a model
    fills faster than its pinned demand warrants, so pods with a choice keep every model's room in line with
    what only it can serve. It is 0 without pinned pods, and the same on every node of a model, so it only
    steers pods that have a choice; it moves with every placement, so it is added outside the evaluation memo
    (`model_offsets`).
    """

    name = "fgd_host"
    weight = 1.0
    model_weight = 2.0
    model_basis = "free"  # pressure against the free GPU milli per model ("capacity": the static variant)
    uses_memory = True
    uses_offsets = True

    def __init__(self) -> None:
        super().__init__()
        # (workload, classes, their capacity version, pinned demand share per model)
        self._demand: tuple | None = None

    def model_offsets(self, request, meter, classes):
        taken = request.gpus * MILLI_PER_GPU if request.gpus else request.gpu_milli
        if not taken or not self.model_weight:
            return {}
        basis = classes.free if self.model_basis == "free" else classes.capacity
        workload, version = meter.workload, classes.capacity_version
        held = self._demand
        if held is None or held[0] is not workload or held[1] is not classes or held[2] != version:
            demand = pinned_demand(workload, tuple(sorted(classes.capacity)))
            held = self._demand = (workload, classes, version, demand)
        if not held[3]:
            return {}
        scale = self.model_weight * taken
        return {model: scale * p for model, p in model_pressure(workload, basis, held[3]).items()}

    def extra_cost(self, meter, node, request, taken_milli):
        cost = 0.0
        workload = meter.workload
        if not workload.cpu_per_gpu_milli and not workload.memory_per_gpu_milli:
            return cost
        total = node.free_milli
        if total <= 0:
            return cost
        before = _stranded(total, node.cpu_free, node.mem_free, workload)
        after = _stranded(
            total - taken_milli,
            node.cpu_free - request.cpu_milli,
            node.mem_free - request.memory_mib,
            workload,
        )
        return cost + self.weight * (after - before)


def pinned_demand(workload: TargetWorkload, models) -> dict[str, float]:
    """Per GPU model: its share of the workload's GPU milli that is pinned to it (a pod allowed on several
    models counts evenly on each). Empty when nothing is pinned."""
    demand_total = sum(p * shape.total_milli for shape, p in workload.shapes)
    if not demand_total:
        return {}
    demand = dict.fromkeys(models, 0.0)
    pinned = False
    for shape, p in workload.shapes:
        if not shape.total_milli or not shape.products:
            continue
        matching = [m for m in models if product_matches(m, shape.products)]
        for model in matching:
            demand[model] += p * shape.total_milli / len(matching) / demand_total
            pinned = True
    return demand if pinned else {}


def model_pressure(
    workload: TargetWorkload, basis: dict[str, int], demand: dict[str, float] | None = None
) -> dict[str, float]:
    """Per GPU model: its share of the workload's GPU milli that is pinned to it (`pinned_demand`, given or
    computed) over its share of `basis` (GPU milli per model: free, or the whole capacity). Empty when
    nothing is pinned; a model with nothing in `basis` counts 1 milli (pods that fit there are few)."""
    if demand is None:
        demand = pinned_demand(workload, sorted(basis))
    total = sum(basis.values())
    if not demand or not total:
        return {}
    return {model: share * total / max(basis.get(model, 0), 1) for model, share in demand.items()}


def _stranded(free_milli: float, cpu_free: float, mem_free: float, workload: TargetWorkload) -> float:
    """Free GPU milli that the node's CPU and memory cannot feed at the workload's per-GPU ratios."""
    feedable = float("inf")
    if workload.cpu_per_gpu_milli:
        feedable = cpu_free / workload.cpu_per_gpu_milli
    if workload.memory_per_gpu_milli:
        feedable = min(feedable, mem_free / workload.memory_per_gpu_milli)
    return max(0.0, free_milli - feedable)
