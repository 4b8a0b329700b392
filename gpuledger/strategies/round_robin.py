"""round_robin: the next node by name after the one the previous round-robin placement took, wrapping.
The cursor is an input (`ctx.rr_cursor`, kept by the ledger); the strategy must never keep one itself.
"""

from __future__ import annotations

from bisect import bisect_right

from gpuledger.core.plugins.plugin import Strategy


class RoundRobin(Strategy):
    """The next node by name after the one the previous round-robin placement took (wrapping)."""

    name = "round_robin"

    def _ring(self, ctx):
        names = ctx.index.sorted_names()
        return names, bisect_right(names, ctx.rr_cursor) if ctx.rr_cursor else 0

    def score(self, node, request, fit, ctx):
        names, start = self._ring(ctx)
        rank = bisect_right(names, node.name) - 1
        return -float((rank - start) % max(1, len(names)))

    def candidates(self, request, ctx, leaves):
        names, start = self._ring(ctx)
        wanted = None if leaves is None else set(leaves)
        nodes = ctx.index.nodes

        def walk():  # the ring from `start`, by index: no copy of a cluster-long list per placement
            count = len(names)
            for i in range(start, start + count):
                node = nodes[names[i - count if i >= count else i]]
                if wanted is None or node.leaf_key in wanted:
                    yield node

        return walk()
