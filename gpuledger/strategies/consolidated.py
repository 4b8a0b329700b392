"""consolidated: pack, the leaf with the least free capacity first, then the fullest node in it.
The mirror of `distributed`; its walk must follow the same (leaf total, node free, name) order as its score.
"""

from __future__ import annotations

from gpuledger.core.plugins.plugin import Strategy
from gpuledger.strategies.walks import leaf_walk


class Consolidated(Strategy):
    """Pack: the leaf with the least free capacity first, then the fullest node in it."""

    name = "consolidated"

    def score(self, node, request, fit, ctx):
        leaf = ctx.index.leaves[node.leaf_key]
        if request.gpus > 0:
            return -float(leaf.total_whole * 1024 + node.whole_free)
        return -(leaf.free_milli * 10000.0 + node.free_milli)

    def candidates(self, request, ctx, leaves):
        if request.gpus > 0:
            return leaf_walk(ctx.index, leaves, request.gpus, leaf_descending=False, node_descending=False)
        return None
