"""priority: best fit, with a share of the cluster's GPU capacity held back for requests of priority >= 1.
It only gates requests (`admit`); it must never reorder nodes differently from best fit.
"""

from __future__ import annotations

from gpuledger.core.model import MILLI_PER_GPU, Reason
from gpuledger.strategies.best_fit import BestFit


class Priority(BestFit):
    """Best fit, but a request below priority 1 may not take GPU capacity that would leave less than
    `priority_headroom` of the cluster's GPU capacity free; that headroom is for priority >= 1."""

    name = "priority"

    def admit(self, request, ctx):
        if request.priority >= 1:
            return None
        need = request.gpus * MILLI_PER_GPU if request.gpus else request.gpu_milli
        keep = ctx.priority_headroom * ctx.cluster_total_milli
        if ctx.cluster_free_milli - need < keep:
            return Reason.PRIORITY_HEADROOM
        return None
