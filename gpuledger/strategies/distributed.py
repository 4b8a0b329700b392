"""distributed: spread, the leaf with the most free capacity first, then the emptiest node in it.
The mirror of `consolidated`; its walk must follow the same (leaf total, node free, name) order as its score.
"""

from __future__ import annotations

from gpuledger.core.plugins.plugin import Strategy
from gpuledger.strategies.walks import leaf_walk


class Distributed(Strategy):
    """Spread: the leaf with the most free capacity first, then the emptiest node in it."""

    name = "distributed"

    def score(self, node, request, fit, ctx):
        leaf = ctx.index.leaves[node.leaf_key]
        if request.gpus > 0:
            return float(leaf.total_whole * 1024 + node.whole_free)
        return leaf.free_milli * 10000.0 + node.free_milli

    def candidates(self, request, ctx, leaves):
        if request.gpus > 0:
            return leaf_walk(ctx.index, leaves, request.gpus, leaf_descending=True, node_descending=True)
        return None
