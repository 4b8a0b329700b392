"""cost_optimized: nodes labelled gpu-orchestrator/cheap-node=true first, best fit among equals.
The cheap bonus breaks best fit's order, so it must never use best fit's candidate walk.
"""

from __future__ import annotations

from gpuledger.strategies.best_fit import BestFit


class CostOptimized(BestFit):
    """Nodes labelled gpu-orchestrator/cheap-node=true first, best fit among equals."""

    name = "cost_optimized"

    def score(self, node, request, fit, ctx):
        return (1e9 if node.info.cheap else 0.0) + super().score(node, request, fit, ctx)

    def candidates(self, request, ctx, leaves):
        return None
