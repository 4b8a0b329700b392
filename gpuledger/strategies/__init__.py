"""The built-in placement strategies, one module each, registered with the core's registry under their names
and aliases. Importing this package registers them (`import gpuledger` does); it holds no strategy itself.

The ledger filters nodes (readiness, taints, selectors, product, resources), asks the strategy to choose
devices on each feasible node, and keeps the node with the highest `score`, ties broken by the lowest node
name. A strategy whose order follows the index also provides `candidates` (see `walks`), so the ledger stops
at the first node that fits instead of scanning every node. See docs/allocator.md for each strategy's rule.
"""

from __future__ import annotations

from gpuledger.core.plugins.plugin import (  # noqa: F401  (re-exported: the interface a plug-in strategy implements)
    DEFAULT_BALANCED_WEIGHTS,
    Fit,
    ScoreContext,
    Strategy,
    choose_share_device,
    choose_whole_devices,
    default_choose_devices,
    device_ok,
    product_matches,
)
from gpuledger.core.plugins.registry import (  # noqa: F401  (re-exported)
    accepted_names,
    canonical_name,
    get_strategy,
    register,
    strategy_names,
)
from gpuledger.strategies.balanced import Balanced
from gpuledger.strategies.best_fit import BestFit
from gpuledger.strategies.consolidated import Consolidated
from gpuledger.strategies.cost_optimized import CostOptimized
from gpuledger.strategies.distributed import Distributed
from gpuledger.strategies.explicit import Explicit
from gpuledger.strategies.fgd import FragmentationGradientDescent
from gpuledger.strategies.fgd_host import HostAwareFGD
from gpuledger.strategies.least_utilized import LeastUtilized
from gpuledger.strategies.priority import Priority
from gpuledger.strategies.random_choice import RandomChoice
from gpuledger.strategies.round_robin import RoundRobin
from gpuledger.strategies.walks import best_fit_cost, best_fit_walk, bucket_walk, leaf_walk  # noqa: F401

register("best_fit", BestFit, aliases=("bestfit", "binpack", "bin-pack"))
register("least_utilized", LeastUtilized, aliases=("leastLoaded", "least_loaded", "leastUtilized"))
register("round_robin", RoundRobin, aliases=("roundRobin",))
register("priority", Priority, aliases=("priority_based", "priorityBased"))
register("random", RandomChoice)
register("cost_optimized", CostOptimized, aliases=("costOptimized", "cost"))
register("consolidated", Consolidated, aliases=("pack", "packed", "consolidate"))
register("distributed", Distributed, aliases=("spread", "distribute"))
register("balanced", Balanced)
register("explicit", Explicit, aliases=("explicit_map", "gpu-scheduling-map", "map"))
register("fgd", FragmentationGradientDescent, aliases=("fragmentation", "fgd_score"))
register("fgd_host", HostAwareFGD, aliases=("fgdHost", "fgd-host"))
