"""gpuledger allocator: the pure GPU-ledger core (model, kube parsing, ledger, strategies, topology, simulator) and its thin adapters (Ray actor, cluster sync)."""
