"""least_utilized: spread load; the node with the most free whole GPUs (for a share, the most free milli-GPU).
It must never look beyond the node's own free capacity (no leaf or cluster terms).
"""

from __future__ import annotations

from allocator.core.plugin import Strategy
from allocator.strategies.walks import bucket_walk


class LeastUtilized(Strategy):
    """Most free whole GPUs (for shares: most free milli-GPU on the node) — spreads load."""

    name = "least_utilized"

    def score(self, node, request, fit, ctx):
        if request.gpus > 0:
            return float(node.whole_free)
        return float(node.free_milli)

    def candidates(self, request, ctx, leaves):
        if request.gpus > 0:
            return bucket_walk(ctx.index, leaves, request.gpus, descending=True)
        return None
