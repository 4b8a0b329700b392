"""gpuledger's allocator: the pure core (allocator.core), the strategies that plug into it, the batched
service, and the adapters around them (Ray actor, cluster sync, node agent, simulator). docs/architecture.md
has the map.
"""

# The built-in strategies register themselves with the core's registry on import. Importing them here means
# any use of the allocator sees them; the core itself never imports a strategy.
from allocator import strategies as _builtin_strategies  # noqa: F401  (imported for its registrations)
