"""The GPUWorkload queue's rule: the ledger's own (gpuledger.core.queues.queue_rule, reached through the
service), so GPUWorkloads and waiting pods are ordered by one rule: priority, then age, with a bounded
backfill window. Pure: `plan` takes time as an argument and whether each workload fits the ledger now.
"""

from __future__ import annotations

from gpuledger.core.queues.queue_rule import DEFAULT_BACKFILL_WINDOW_S, Entry, Plan, Verdict, order, plan

__all__ = ["DEFAULT_BACKFILL_WINDOW_S", "Entry", "Plan", "Verdict", "order", "plan"]
