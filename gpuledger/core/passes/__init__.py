"""Passes the ledger runs over what it holds, and what they keep between calls: the home of later passes.

Owns the preemptions the ledger holds (`held_plans`): a plan made by gpuledger.core.queues.preemption kept
until its preemptor runs, the nodes it keeps, its durable record.

May import: `gpuledger.core.queues` and everything below it (`placing`, `books`, `pods`, `plugins`,
`nodes`, the top-level `model`, `slots_init`, `steps`), `gpuledger.names` and the standard library; never
the ledger.
"""
