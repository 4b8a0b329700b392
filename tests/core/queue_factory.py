"""A real ledger with running workloads, as the queue tests build it: nodes by leaf and product, workloads
(single pods or gangs) reserved through `Ledger.reserve`, and the `Running` each becomes for the planner."""

from __future__ import annotations

from dataclasses import dataclass, field

import gpuledger.strategies  # noqa: F401 - registers the built-in strategies
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Device, GroupSpec, NodeInfo, Placement, Request
from gpuledger.core.queues.ledger_view import LedgerView
from gpuledger.core.queues.preemption import Running


def gpu_node(
    name: str, gpus: int = 8, *, leaf: str = "l1", spine: str = "s1", product: str = "H100"
) -> NodeInfo:
    return NodeInfo(
        name=name,
        cpu_milli=128_000,
        memory_mib=1_048_576,
        devices=tuple(Device(index=d, product=product, memory_mib=81920) for d in range(gpus)),
        spine=spine,
        leaf=leaf,
        product=product,
    )


def workload_request(
    key: str, gpus: int, pods: int = 1, *, priority: int = 0, product: str | None = None, **kw
):
    """The first pod's request of a workload: a gang (GroupSpec) when it has more than one pod."""
    group = GroupSpec(key=key, size=pods, **kw) if pods > 1 else None
    return Request(id=f"{key}#0", gpus=gpus, group=group, priority=priority, product=product)


@dataclass
class Cluster:
    """A ledger and what runs on it."""

    ledger: Ledger
    running: list[Running] = field(default_factory=list)

    @property
    def view(self) -> LedgerView:
        return LedgerView(self.ledger)

    @classmethod
    def of(cls, nodes: list[NodeInfo], strategy: str = "best_fit") -> Cluster:
        ledger = Ledger(LedgerConfig(default_strategy=strategy))
        for n in nodes:
            ledger.upsert_node(n)
        return cls(ledger)

    def start(
        self,
        key: str,
        queue: str,
        gpus: int,
        pods: int = 1,
        *,
        priority: int = 0,
        started: float = 0.0,
        budgets: tuple[tuple[str, int], ...] = (),
        product: str | None = None,
    ) -> Running | None:
        """Reserve a workload; its Running, or None when the ledger denies it."""
        req = workload_request(key, gpus, pods, priority=priority, product=product)
        placed = self.ledger.reserve(req, started)
        if not isinstance(placed, Placement):
            return None
        run = Running(
            key=key,
            queue=queue,
            priority=priority,
            started=started,
            holders=(req.id,),
            use=self.view.use_of([req.id]),
            pods=pods,
            budgets=budgets,
        )
        self.running.append(run)
        return run

    def evict(self, key: str) -> None:
        run = next(r for r in self.running if r.key == key)
        self.running.remove(run)
        for rid in run.holders:
            self.ledger.release(rid)

    def free_gpus(self) -> int:
        return sum(n.whole_free for n in self.ledger.index.nodes.values())


def nodes(
    count: int, gpus: int = 8, per_leaf: int = 8, product: str = "H100", prefix: str = "n"
) -> list[NodeInfo]:
    return [
        gpu_node(f"{prefix}{i:03d}", gpus, leaf=f"{prefix}l{i // per_leaf}", product=product)
        for i in range(count)
    ]
