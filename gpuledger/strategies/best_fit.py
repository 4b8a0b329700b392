"""best_fit: the node whose free CPU and GPU are tightest after placement (Weng et al. ATC'23's BestFit).
Its candidate walk must order nodes exactly as `score` does; a subclass that changes `score` gets no walk.
"""

from __future__ import annotations

from gpuledger.core.plugins.plugin import Strategy
from gpuledger.strategies.walks import best_fit_cost, best_fit_walk


class BestFit(Strategy):
    """The tightest node counting CPU and GPU (Weng et al. ATC'23's BestFit): lowest free CPU after / the
    cluster's largest node CPU + free milli-GPU after / its largest node GPU capacity, ties by name; on the
    node, the shortest free run of whole GPUs, or the fullest device that holds a share."""

    name = "best_fit"

    def score(self, node, request, fit, ctx):
        index = ctx.index
        return -best_fit_cost(node, request, index) / (2.0 * index.max_cpu_milli * index.max_gpu_milli)

    def candidates(self, request, ctx, leaves):
        if type(self).score is not BestFit.score:
            return None
        return best_fit_walk(ctx.index, leaves, request)
