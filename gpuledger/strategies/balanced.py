"""balanced: a weighted sum of resource availability, topology alignment, leaf utilization and history.
The weights and the history are inputs (`ctx.balanced_weights`, `ctx.performance`); it must never own them.
"""

from __future__ import annotations

from gpuledger.core.model import MILLI_PER_GPU
from gpuledger.core.plugins.plugin import Strategy


class Balanced(Strategy):
    """Weighted sum of resource availability, topology alignment, leaf (domain) utilization and history."""

    name = "balanced"

    def score(self, node, request, fit, ctx):
        w = ctx.balanced_weights
        taken = request.gpus * MILLI_PER_GPU + sum(s.milli for s in fit.shares)
        availability = (node.free_milli - taken) / node.total_milli if node.total_milli else 0.0
        domain = request.preferred_domain
        if domain and domain not in ("leaf", "spine"):
            alignment = 1.0 if node.info.leaf == domain else 0.75 if node.info.spine == domain else 0.0
        else:
            devs = sorted(fit.devices)
            alignment = 1.0 if not devs or devs[-1] - devs[0] == len(devs) - 1 else 0.5
        domain_free = 1.0 - ctx.leaf_utilization(node.leaf_key)
        history = min(1.0, max(0.0, float(ctx.performance.get(node.name, 1.0))))
        return (
            w.get("resourceAvailability", 0.0) * availability
            + w.get("topologyAlignment", 0.0) * alignment
            + w.get("domainUtilization", 0.0) * domain_free
            + w.get("historicalPerformance", 0.0) * history
        )
