"""fgd_host: FGD plus the GPUs a node's remaining CPU and memory could no longer feed (this project's
variant). Only the extra cost differs from FGD; it must never change FGD's device choice, memo or walk.
"""

from __future__ import annotations

from allocator.strategies.fgd import FragmentationGradientDescent
from allocator.strategies.fragmentation import TargetWorkload


class HostAwareFGD(FragmentationGradientDescent):
    """FGD plus the GPUs a node's remaining CPU and memory could no longer feed (this project's variant).

    FGD asks whether *one* more pod of each shape fits; it does not see a node whose CPU is being eaten by
    CPU-only pods until the last GPU pod no longer fits, and by then several idle GPUs are stranded. This adds
    `weight` x the increase of `stranded = max(0, free GPU milli - min(free CPU / c, free memory / m))`, where
    c and m are the workload's CPU and memory per milli-GPU: the free GPU milli the node's host resources
    cannot serve at the workload's usual ratio.
    """

    name = "fgd_host"
    weight = 1.0
    uses_memory = True

    def extra_cost(self, meter, node, request, taken_milli):
        workload = meter.workload
        if not workload.cpu_per_gpu_milli and not workload.memory_per_gpu_milli:
            return 0.0
        total = node.free_milli
        if total <= 0:
            return 0.0
        before = _stranded(total, node.cpu_free, node.mem_free, workload)
        after = _stranded(total - taken_milli, node.cpu_free - request.cpu_milli,
                          node.mem_free - request.memory_mib, workload)
        return self.weight * (after - before)


def _stranded(free_milli: float, cpu_free: float, mem_free: float, workload: TargetWorkload) -> float:
    """Free GPU milli that the node's CPU and memory cannot feed at the workload's per-GPU ratios."""
    feedable = float("inf")
    if workload.cpu_per_gpu_milli:
        feedable = cpu_free / workload.cpu_per_gpu_milli
    if workload.memory_per_gpu_milli:
        feedable = min(feedable, mem_free / workload.memory_per_gpu_milli)
    return max(0.0, free_milli - feedable)
