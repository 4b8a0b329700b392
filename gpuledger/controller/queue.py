"""The GPUWorkload queue's rule: the ledger's own (gpuledger.core.queues.queue_rule, reached through the
service), so GPUWorkloads and waiting pods are ordered by one rule: priority, then age, with a bounded
backfill window. Pure: `plan` takes time as an argument and whether each workload fits the ledger now.
"""

from __future__ import annotations

from gpuledger.service.ledger_service import DEFAULT_BACKFILL_WINDOW_S
from gpuledger.service.ledger_service import QueueEntry as Entry
from gpuledger.service.ledger_service import QueuePlan as Plan
from gpuledger.service.ledger_service import QueueVerdict as Verdict
from gpuledger.service.ledger_service import queue_order as order
from gpuledger.service.ledger_service import queue_plan as plan

__all__ = ["DEFAULT_BACKFILL_WINDOW_S", "Entry", "Plan", "Verdict", "order", "plan"]
