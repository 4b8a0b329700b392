"""Passes the ledger runs over what it holds, and what they keep between calls: the home of later passes.

Owns the preemption pass (`preemption_pass`: which heads of the line get a plan from
gpuledger.core.queues.preemption, and who found none since what change) and the preemptions the ledger
holds (`held_plans`): a plan kept until its preemptor runs, the nodes it keeps, its durable record.

May import: `gpuledger.core.queues` and everything below it (`placing`, `books`, `pods`, `plugins`,
`nodes`, the top-level `model`, `slots_init`, `steps`), `gpuledger.names` and the standard library; never
the ledger.
"""
