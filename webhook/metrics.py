"""Prometheus metrics, one registry per app so tests (and the benchmark) can run several apps in one process."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# every metric this webhook exports, by the name a dashboard queries (counters gain `_total` on the wire as
# written here; histograms add `_bucket`/`_sum`/`_count`)
METRIC_NAMES: tuple[str, ...] = (
    "agentaflow_gpu_total",
    "agentaflow_gpu_available",
    "agentaflow_gpu_utilization",
    "agentaflow_workloads_pending",
    "agentaflow_workloads_running",
    "agentaflow_scheduling_duration",
    "topology_scheduler_latency_seconds",
    "topology_placement_decisions_total",
    "topology_domain_utilization_ratio",
    "topology_domain_fragmentation_ratio",
    "topology_gpu_allocation_ratio",
    "gpuledger_admission_duration_seconds",
    "gpuledger_admission_in_flight",
    "gpuledger_handler_failures_total",
)

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.gpu_total = Gauge("agentaflow_gpu_total", "GPUs known to the ledger", registry=r)
        self.gpu_available = Gauge("agentaflow_gpu_available", "GPUs with no allocation (whole, healthy)",
                                   registry=r)
        self.gpu_utilization = Gauge("agentaflow_gpu_utilization",
                                     "allocated share of all GPUs (milli-GPU allocated / total), 0..1", registry=r)
        self.workloads_pending = Gauge("agentaflow_workloads_pending",
                                       "reservations made at admission whose pod is not yet seen stored", registry=r)
        self.workloads_running = Gauge("agentaflow_workloads_running",
                                       "confirmed placements (pods stored with a placement)", registry=r)
        self.scheduling_duration = Histogram(
            "agentaflow_scheduling_duration", "seconds one admission waited for the ledger's answer (batching included)",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.scheduler_latency = Histogram(
            "topology_scheduler_latency_seconds",
            "seconds from a decoded AdmissionReview to a placement decision (parsing, owner lookup, ledger)",
            ["strategy"], buckets=_LATENCY_BUCKETS, registry=r)
        self.placement_decisions = Counter(
            "topology_placement_decisions", "placement decisions by strategy and result",
            ["strategy", "result"], registry=r)
        self.domain_utilization = Gauge("topology_domain_utilization_ratio",
                                        "allocated share of a leaf's or spine's GPUs", ["level", "domain"], registry=r)
        self.domain_fragmentation = Gauge(
            "topology_domain_fragmentation_ratio",
            "share of a domain's free GPU capacity that cannot serve a whole-GPU request of the domain's "
            "common size", ["level", "domain"], registry=r)
        self.gpu_allocation_ratio = Gauge("topology_gpu_allocation_ratio",
                                          "allocated milli-GPU / total milli-GPU across the cluster", registry=r)
        self.admission_duration = Histogram(
            "gpuledger_admission_duration_seconds", "seconds to answer one HTTP admission request",
            ["route", "outcome"], buckets=_LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("gpuledger_admission_in_flight", "admission requests being handled", registry=r)
        self.handler_failures = Counter("gpuledger_handler_failures",
                                        "admission requests answered with an internal error (code 500)",
                                        ["route"], registry=r)

    def update_from_stats(self, stats: Any) -> None:
        """Copy the ledger's totals (a LedgerStats or its dict form) into the gauges."""
        get = (lambda k, d=0: stats.get(k, d)) if isinstance(stats, dict) else (lambda k, d=0: getattr(stats, k, d))
        total = get("gpus_total")
        self.gpu_total.set(total)
        self.gpu_available.set(get("gpus_free", get("gpus_available", 0)))
        allocated_milli = get("gpu_milli_allocated", get("allocated_milli", 0))
        ratio = (allocated_milli / (total * 1000)) if total else 0.0
        ratio = get("allocation_ratio", ratio)
        self.gpu_utilization.set(ratio)
        self.gpu_allocation_ratio.set(ratio)
        self.workloads_pending.set(get("reservations_pending", get("pending", 0)))
        self.workloads_running.set(get("reservations_confirmed", get("confirmed", 0)))
        for level, attr in (("leaf", "leaf_utilization"), ("spine", "spine_utilization")):
            for domain, value in dict(get(attr, {}) or {}).items():
                self.domain_utilization.labels(level, str(domain)).set(value)
        for level, attr in (("leaf", "leaf_fragmentation"), ("spine", "spine_fragmentation")):
            for domain, value in dict(get(attr, {}) or {}).items():
                self.domain_fragmentation.labels(level, str(domain)).set(value)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
