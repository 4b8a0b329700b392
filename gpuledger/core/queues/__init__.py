"""GPU queues and the line: who owns which share of the cluster, and who waits for what in which order.

Owns the GPUQueue objects validated as a whole (`gpu_queues`), quota accounting (`quotas`), the fair order
among queues (`fair_share`), the rule of every line (`queue_rule`), what the ledger knows of queues,
namespaces and PodDisruptionBudgets (`queue_book`), quotas at the ledger's door (`queue_gate`, kept as of
the books' latest change by `current_gate`), the ledger's line of waiting pods (`waiting`), the admission
rule that reserves or gives a place in it (`admission_rule`), what the queues read of the ledger
(`ledger_view`) and the preemption planner (`preemption`: plans, minimal and proven against the ledger,
which `queue_book` feeds with the running workloads).

May import: `gpuledger.core.placing`, `gpuledger.core.books`, `gpuledger.core.pods`,
`gpuledger.core.plugins`, `gpuledger.core.nodes`, the top-level `model`, `slots_init` and `steps`,
`gpuledger.names` and the standard library; never the passes or the ledger (`ledger_view` names the ledger
by its surface, not by import).
"""
