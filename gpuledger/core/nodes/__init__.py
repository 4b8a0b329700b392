"""The nodes' free state and the cluster index over them.

Owns one node's mutable free counters and the holdings that use them (`node_state`), and the cluster index
(`inventory`: placeable nodes bucketed by whole-free GPUs, globally and per leaf, with its log of touched
nodes), kept in the sorted containers it is built on (`sorted_buckets`, `sorted_names`). The index never
changes a node's counters on its own: the books run every change through it. Beside them, the GPUs DRA
drivers publish in ResourceSlices, per node (`published_gpus`): known, explained, not placed on.

May import: `gpuledger.core.model`, `gpuledger.core.slots_init`, `gpuledger.core.steps`, `gpuledger.names`
and the standard library; nothing else of the core (it is what the strategy interface names).
"""
