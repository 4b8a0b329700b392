"""The controller's Prometheus metrics, on a registry of its own (several controllers may share a process).

Names: GPU_Orchestrator's (`warp_gpuworkload_*`, so its dashboards keep working) plus the queue's length and
wait time per priority. Counting only: nothing here decides anything.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

METRIC_NAMES: tuple[str, ...] = (
    "warp_gpuworkload_scheduled_total",
    "warp_gpuworkload_failed_total",
    "warp_gpuworkload_retries_total",
    "warp_gpuworkload_reconcile_duration_seconds",
    "gpuledger_gpuworkload_queue_length",
    "gpuledger_gpuworkload_queue_wait_seconds",
    "gpuledger_controller_leader",
)

_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)


def priority_band(priority: int) -> str:
    """Priorities as a bounded label: the GPU_Orchestrator words, and the integers between them."""
    if priority >= 1000:
        return "critical"
    if priority >= 100:
        return "high"
    if priority > -100:
        return "medium"
    return "low"


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry or CollectorRegistry()
        self.scheduled = Counter(
            "warp_gpuworkload_scheduled", "GPUWorkloads placed whole and Running", ["strategy"], registry=r
        )
        self.failed = Counter(
            "warp_gpuworkload_failed", "GPUWorkload attempts that failed, by reason", ["reason"], registry=r
        )
        self.retries = Counter(
            "warp_gpuworkload_retries", "GPUWorkload retries scheduled (backoff started)", registry=r
        )
        self.reconcile = Histogram(
            "warp_gpuworkload_reconcile_duration_seconds",
            "one reconcile pass over every GPUWorkload and the queue",
            registry=r,
        )
        self.queue_length = Gauge(
            "gpuledger_gpuworkload_queue_length",
            "GPUWorkloads Queued, by priority band",
            ["priority"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "gpuledger_gpuworkload_queue_wait_seconds",
            "time from entering the queue to being admitted, by priority band",
            ["priority"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.leader = Gauge(
            "gpuledger_controller_leader", "1 while this replica holds the leader Lease", registry=r
        )

    def count(self, events: Iterable[str]) -> None:
        for event in events:
            kind, _, label = event.partition(":")
            if kind == "scheduled":
                self.scheduled.labels(strategy=label or "default").inc()
            elif kind == "failed":
                self.failed.labels(reason=label or "Unknown").inc()
            elif kind == "retried":
                self.retries.inc()

    def set_queue(self, priorities: Iterable[int]) -> None:
        counts = dict.fromkeys(("low", "medium", "high", "critical"), 0)
        for p in priorities:
            counts[priority_band(p)] += 1
        for band, n in counts.items():
            self.queue_length.labels(priority=band).set(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
