"""The ledger's books and the parts that keep them true to the cluster.

Owns the nodes' records of what is held (`books`: holdings, reservations, gangs, counted pods, written only
through `Books`' methods, what is held through `hold`/`unhold`), a gang's plan and claim tables
(`group_slots`), the leaf/spine topology the books hold (`topology`), reservations' life cycle (`leases`),
who holds a reservation id (`claims`), the node agents' word on device holders made the ledger's (`truth`),
and following the cluster: objects applied or deleted, placements adopted, the bulk load of a rebuild
(`adoption`). The books never decide a placement;
the parts above them hear of changes through interfaces given at construction (`BookEvents`,
`ClaimEvents`).

May import: `gpuledger.core.pods` (parsed objects), `gpuledger.core.plugins`, `gpuledger.core.nodes`, the
top-level `model`, `slots_init` and `steps`, `gpuledger.names` and the standard library; never the
placing, the queues, the passes or the ledger.
"""
