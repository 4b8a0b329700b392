"""What the ledger asks the cluster sync to carry out for a preemption it planned: the wire format between the
ledger (gpuledger.core.queues.preemption decides; the service hands out orders) and the eviction adapter
(gpuledger.sync.evictor acts).

The order of acts is what keeps a crash harmless: the adapter first writes `record` on the preemptor pod as
the annotation `gpuledger.io/preempting` (so a ledger rebuilt from the API objects keeps the nodes for the
same preemptor), then evicts each victim through the Eviction API (which honours PodDisruptionBudgets and each
pod's termination grace), then posts the Events. Every step is idempotent: an order handed out again after a
restart is carried out again without harm (a victim already gone answers 404, an Event already posted 409).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Eviction:
    """One victim pod. A gang is a victim whole: each of its pods is one `Eviction` of the same order."""

    namespace: str
    name: str
    uid: str  # the pod evicted must still be this one (the Eviction's deleteOptions precondition)
    rule: str  # gpuledger.core.queues.preemption.Rule's value: "reclaim", "priority" or "critical"
    why: str  # the rule's sentence, for the Events, e.g. "queue team-a borrows 8 GPUs team-b lent"


@dataclass(frozen=True)
class PreemptionOrder:
    """A planned preemption the ledger holds: the preemptor's ticket id, its pod (a gang's: every pod that
    waits), the victims to evict, and the nodes kept for it until it is placed."""

    id: str  # the preemptor's ticket id (the reservation id it is placed under)
    namespace: str
    name: str  # the preemptor pod that carries `record` (a gang's first pod)
    uid: str
    victims: tuple[Eviction, ...]
    nodes: tuple[str, ...]
    record: str  # the value of `gpuledger.io/preempting` to write on the preemptor before evicting
    recorded: bool  # the ledger has seen `record` on the stored preemptor (the write can be skipped)
    message: str  # one line for the preemptor's Event, e.g. "evicting 2 pods (4 GPUs) of queue team-a: ..."


@dataclass(frozen=True)
class EvictionRefused:
    """A victim the API server would not evict (429: a PodDisruptionBudget; 403/422: not allowed): the ledger
    drops the plan, keeps the victim out of plans until `until`, and plans again."""

    order_id: str
    namespace: str
    name: str
    uid: str
    status: int
    message: str
