"""fgd_host: FGD plus the GPUs a node's remaining CPU and memory could no longer feed, plus the demand that
pods pinned to a GPU model put on that model's capacity (this project's variant). Only the extra cost differs
from FGD; it must never change FGD's device choice, memo or walk.
"""

from __future__ import annotations

from allocator.strategies.fgd import FragmentationGradientDescent
from allocator.strategies.fragmentation import FragmentationMeter, TargetWorkload, product_matches


class HostAwareFGD(FragmentationGradientDescent):
    """FGD plus two costs FGD does not see (this project's variant).

    Host: FGD asks whether *one* more pod of each shape fits; it does not see a node whose CPU is being eaten
    by CPU-only pods until the last GPU pod no longer fits, and by then several idle GPUs are stranded. This
    adds `weight` x the increase of `stranded = max(0, free GPU milli - min(free CPU / c, free memory / m))`,
    where c and m are the workload's CPU and memory per milli-GPU: the free GPU milli the node's host
    resources cannot serve at the workload's usual ratio.

    Model demand: when the workload pins pods to GPU models out of proportion to the cluster's capacity of
    each model, GPU milli taken on a model in demand is milli a pinned pod cannot find elsewhere. This adds
    `model_weight` x taken milli x `pressure[model]`, the model's share of the workload's pinned GPU demand
    over its share of the cluster's GPU capacity (`model_pressure`). It is 0 without pinned pods, and the same
    on every node a pod pinned to one model may use, so it only steers pods that have a choice.
    """

    name = "fgd_host"
    weight = 1.0
    model_weight = 1.0
    uses_memory = True
    uses_capacity = True

    def pressure_of(self, meter: FragmentationMeter, capacity: dict[str, int]) -> dict[str, float]:
        return model_pressure(meter.workload, capacity)

    def extra_cost(self, meter, node, request, taken_milli):
        cost = 0.0
        if taken_milli and self._pressure:
            cost = self.model_weight * taken_milli * self._pressure.get(node.info.product, 0.0)
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


def model_pressure(workload: TargetWorkload, capacity: dict[str, int]) -> dict[str, float]:
    """Per GPU model: its share of the workload's GPU milli that is pinned (a pod allowed on several models
    counts evenly on each), over its share of the cluster's GPU capacity. Models no pinned shape names get
    0; an empty dict when nothing is pinned."""
    total_capacity = sum(capacity.values())
    demand_total = sum(p * shape.total_milli for shape, p in workload.shapes)
    if not total_capacity or not demand_total:
        return {}
    demand = dict.fromkeys(capacity, 0.0)
    pinned = False
    for shape, p in workload.shapes:
        if not shape.total_milli or not shape.products:
            continue
        models = [m for m in capacity if product_matches(m, shape.products)]
        for model in models:
            demand[model] += p * shape.total_milli / len(models)
            pinned = True
    if not pinned:
        return {}
    return {
        model: (demand[model] / demand_total) / (capacity[model] / total_capacity)
        for model in capacity
        if capacity[model]
    }


def _stranded(free_milli: float, cpu_free: float, mem_free: float, workload: TargetWorkload) -> float:
    """Free GPU milli that the node's CPU and memory cannot feed at the workload's per-GPU ratios."""
    feedable = float("inf")
    if workload.cpu_per_gpu_milli:
        feedable = cpu_free / workload.cpu_per_gpu_milli
    if workload.memory_per_gpu_milli:
        feedable = min(feedable, mem_free / workload.memory_per_gpu_milli)
    return max(0.0, free_milli - feedable)
