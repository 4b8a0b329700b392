"""Prometheus metrics, one registry per app so tests (and the benchmark) can run several apps in one process.

Names are the earlier tools' (AgentaFlow's, the topology scheduler's) so their dashboards keep working; the
ledger's own numbers arrive through `update_from_stats` (the service's stats, fetched on each scrape).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# a rebuild reads every node and pod: milliseconds for a small cluster, seconds for a large one
# a pod waits for GPUs as long as others hold them: from a second to hours
_WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
_RECOVERY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class _Metric:
    """One exported metric: the attribute that holds it, its kind, the name a dashboard queries, its help,
    its labels and (a histogram's) buckets."""

    attr: str
    kind: type
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


# every metric WebhookMetrics holds, in the order it registers them (the collectors _LedgerCalls and
# _SyncLease add gpuledger_ledger_calls and the sync lease's figures)
_METRICS: tuple[_Metric, ...] = (
    _Metric(
        "gpu_total",
        Gauge,
        "agentaflow_gpu_total",
        "GPUs known to the ledger",
    ),
    _Metric(
        "gpu_available",
        Gauge,
        "agentaflow_gpu_available",
        "GPUs with no allocation (whole, healthy)",
    ),
    _Metric(
        "gpu_utilization",
        Gauge,
        "agentaflow_gpu_utilization",
        "allocated share of all GPUs (milli-GPU allocated / total), 0..1",
    ),
    _Metric(
        "workloads_pending",
        Gauge,
        "agentaflow_workloads_pending",
        (
            "GPU pods not running yet: reservations made at admission whose pod is not yet seen stored, and "
            "pods waiting in line for GPUs (admitted gated)"
        ),
    ),
    _Metric(
        "pods_waiting",
        Gauge,
        "gpuledger_pods_waiting",
        "pods waiting in the ledger's line for GPUs (admitted gated, holding nothing), by priority",
        labels=("priority",),
    ),
    _Metric(
        "oldest_wait",
        Gauge,
        "gpuledger_pod_oldest_wait_seconds",
        "how long the first pod to arrive of those still waiting for GPUs has waited",
    ),
    _Metric(
        "pod_wait",
        Histogram,
        "gpuledger_pod_wait_seconds",
        (
            "seconds a pod waited in line before the ledger placed it (observed by the replica whose "
            "placement adapter wrote the placement)"
        ),
        buckets=_WAIT_BUCKETS,
    ),
    _Metric(
        "workloads_running",
        Gauge,
        "agentaflow_workloads_running",
        "confirmed placements (pods stored with a placement)",
    ),
    _Metric(
        "scheduling_duration",
        Histogram,
        "agentaflow_scheduling_duration",
        "seconds one admission waited for the ledger's answer (batching included)",
        buckets=_LATENCY_BUCKETS,
    ),
    # the validating side's one ledger round trip, on every placed pod's path
    # (docs/design/validation-asks-the-ledger.md): its own figure, so a slow claim is told from a slow
    # handler
    _Metric(
        "claim_duration",
        Histogram,
        "gpuledger_ledger_claim_duration_seconds",
        "seconds one validation waited for the ledger's claim of its placement (batching included)",
        buckets=_LATENCY_BUCKETS,
    ),
    # the ledger's own side of those round trips, as the actor counts it (ServiceStats.served): a slow
    # claim with a quick actor is the way there and back (the network, a busy core), not the ledger
    _Metric(
        "actor_calls",
        Counter,
        "gpuledger_ledger_actor_calls",
        (
            "calls the ledger actor served over the ledger channel, by method (the same figures on every "
            "replica: take the max over instances)"
        ),
        labels=("method",),
    ),
    _Metric(
        "actor_call_seconds",
        Counter,
        "gpuledger_ledger_actor_call_seconds",
        (
            "seconds the ledger actor spent on the calls it served over the ledger channel, by method, each "
            "from its frame read to its answer encoded (decoding, the ledger's work, encoding); its rate is "
            "the share of the actor's loop those calls keep busy (a cluster write waiting behind a rebuild "
            "counts its wait too)"
        ),
        labels=("method",),
    ),
    _Metric(
        "scheduler_latency",
        Histogram,
        "topology_scheduler_latency_seconds",
        "seconds from a decoded AdmissionReview to a placement decision (parsing, owner lookup, ledger)",
        labels=("strategy",),
        buckets=_LATENCY_BUCKETS,
    ),
    _Metric(
        "placement_duration",
        Histogram,
        "topology_scheduler_placement_duration_seconds",
        ("seconds to decide one GPU pod's placement, from a decoded AdmissionReview to placement or denial"),
        buckets=_LATENCY_BUCKETS,
    ),
    _Metric(
        "recovery_duration",
        Histogram,
        "topology_scheduler_recovery_duration_seconds",
        "seconds one ledger rebuild took (a resync, or the rebuild from its source after a restart)",
        buckets=_RECOVERY_BUCKETS,
    ),
    _Metric(
        "placement_decisions",
        Counter,
        "topology_placement_decisions",
        "placement decisions by strategy and result",
        labels=("strategy", "result"),
    ),
    _Metric(
        "domain_utilization",
        Gauge,
        "topology_domain_utilization_ratio",
        "allocated share of a leaf's or spine's GPUs",
        labels=("level", "domain"),
    ),
    _Metric(
        "domain_fragmentation",
        Gauge,
        "topology_domain_fragmentation_ratio",
        "share of a domain's free milli-GPU outside whole free GPUs (usable by GPU shares only)",
        labels=("level", "domain"),
    ),
    _Metric(
        "scheduler_domain_fragmentation",
        Gauge,
        "topology_scheduler_domain_fragmentation_ratio",
        "the topology scheduler's name for topology_domain_fragmentation_ratio (same values)",
        labels=("level", "domain"),
    ),
    _Metric(
        "gpu_allocation_ratio",
        Gauge,
        "topology_gpu_allocation_ratio",
        "allocated milli-GPU / total milli-GPU across the cluster",
    ),
    _Metric(
        "admission_duration",
        Histogram,
        "gpuledger_admission_duration_seconds",
        "seconds to answer one HTTP admission request",
        labels=("route", "outcome"),
        buckets=_LATENCY_BUCKETS,
    ),
    _Metric(
        "in_flight",
        Gauge,
        "gpuledger_admission_in_flight",
        "admission requests being handled",
    ),
    _Metric(
        "handler_failures",
        Counter,
        "gpuledger_handler_failures",
        "admission requests answered with an internal error (code 500)",
        labels=("route",),
    ),
    _Metric(
        "placement_conflicts",
        Gauge,
        "gpuledger_placement_conflicts",
        (
            "stored pods holding a placement they do not own (a copy, or a second holder of one reservation "
            "id), counted as foreign use on their node"
        ),
    ),
    _Metric(
        "device_disagreements",
        Gauge,
        "gpuledger_device_disagreements",
        (
            "what the nodes' agents (annotation agentaflow.gpu/device-holders) said against the ledger: "
            "kind=corrected: pods recorded on the devices their kubelet gave them, not their placement's; "
            "kind=conflict: pods whose devices the kubelet says another pod holds; kind=pending_moved: "
            "pending reservations moved off such devices since the ledger started"
        ),
        labels=("kind",),
    ),
    _Metric(
        "prefetch",
        Counter,
        "gpuledger_prefetch",
        (
            "placements admitted ahead for a pod shape (prefetch_depth): outcome=hit (a pod took one, no "
            "ledger round trip), miss (none was ready), released (not taken within prefetch_max_age_s, or "
            "given back after a denial), denied (the ledger had no room for one: that shape pauses)"
        ),
        labels=("outcome",),
    ),
    _Metric(
        "pod_shapes",
        Counter,
        "gpuledger_pod_shapes",
        (
            "mutating admissions by how their request was read: outcome=hit (a pod of the same shape was "
            "parsed before: its request reused), miss (parsed; kept for the shape's next pod unless denied "
            "or pinned by gpu-scheduling-map), apart (parsed, never kept: the pod carries gpuledger.io keys "
            "or its own placement, or does not encode as JSON)"
        ),
        labels=("outcome",),
    ),
    _Metric(
        "prefetch_held",
        Gauge,
        "gpuledger_prefetch_held",
        "placements admitted ahead and not taken yet",
    ),
)

# every metric this webhook exports, by the name a dashboard queries (counters with the `_total` they gain on
# the wire; histograms add `_bucket`/`_sum`/`_count`), gpuledger_ledger_calls (_LedgerCalls) included
METRIC_NAMES: tuple[str, ...] = (
    *(m.name + ("_total" if m.kind is Counter else "") for m in _METRICS),
    "gpuledger_ledger_calls",
)


class WebhookMetrics:
    """The webhook's metrics (`_METRICS`, made at construction) and what feeds them."""

    gpu_total: Gauge
    gpu_available: Gauge
    gpu_utilization: Gauge
    workloads_pending: Gauge
    pods_waiting: Gauge
    oldest_wait: Gauge
    pod_wait: Histogram
    workloads_running: Gauge
    scheduling_duration: Histogram
    claim_duration: Histogram
    actor_calls: Counter
    actor_call_seconds: Counter
    scheduler_latency: Histogram
    placement_duration: Histogram
    recovery_duration: Histogram
    placement_decisions: Counter
    domain_utilization: Gauge
    domain_fragmentation: Gauge
    scheduler_domain_fragmentation: Gauge
    gpu_allocation_ratio: Gauge
    admission_duration: Histogram
    in_flight: Gauge
    handler_failures: Counter
    placement_conflicts: Gauge
    device_disagreements: Gauge
    prefetch: Counter
    pod_shapes: Counter
    prefetch_held: Gauge

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        for m in _METRICS:
            extra: dict[str, Any] = {"buckets": m.buckets} if m.buckets is not None else {}
            setattr(self, m.attr, m.kind(m.name, m.help, list(m.labels), registry=r, **extra))
        self._waiting_priorities: set[str] = set()  # the priority labels exported so far
        self._served_seen: tuple[str, dict[str, tuple[int, float]]] | None = None  # (incarnation, totals)
        self._recoveries_seen: tuple[str, int] | None = None  # (ledger incarnation, rebuilds observed)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # (metric, labels) -> its child
        self.ledger_transport: dict[str, int] | None = None
        r.register(_LedgerCalls(self))
        self.sync_stats: Any = None  # this replica's cluster sync's counters (a sync_config.SyncStats)
        r.register(_SyncLease(self))

    def observe_decision(self, strategy: str, seconds: float) -> None:
        """One admission's time to a decision; `strategy` "none" means no GPU request was made (no placement
        to decide: a pod without GPUs, a bad annotation, the owner unreadable)."""
        self._child(self.scheduler_latency, (strategy,)).observe(seconds)
        if strategy != "none":
            self.placement_duration.observe(seconds)

    def decided(self, strategy: str, result: str) -> None:
        """topology_placement_decisions{strategy, result} + 1."""
        self._child(self.placement_decisions, (strategy, result)).inc()

    def prefetched(self, outcome: str, n: int) -> None:
        """gpuledger_prefetch_total{outcome} + n."""
        self._child(self.prefetch, (outcome,)).inc(n)

    def shaped(self, outcome: str) -> None:
        """gpuledger_pod_shapes_total{outcome} + 1."""
        self._child(self.pod_shapes, (outcome,)).inc()

    def _child(self, metric: Any, labels: tuple[str, ...]) -> Any:
        """`metric.labels(*labels)`, looked up once per label set: prometheus' labels() costs more than the
        increment itself, and an admission counts three of them (the label sets are few: outcomes and the
        registered strategies)."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe_recoveries(self, recoveries: Any) -> None:
        """Observe the ledger's rebuilds not observed yet (an gpuledger.service.ledger_service.Recoveries):
        all of a new
        incarnation's (at most the durations it keeps), then each new one."""
        if recoveries is None:
            return
        seen = self._recoveries_seen
        new = recoveries.count - seen[1] if seen and seen[0] == recoveries.incarnation else recoveries.count
        if new > 0:
            for seconds in recoveries.recent[-new:]:
                self.recovery_duration.observe(seconds)
        self._recoveries_seen = (recoveries.incarnation, recoveries.count)

    def observe_served(self, served: Any) -> None:
        """Count what the actor served since the last scrape (an
        gpuledger.service.ledger_service.ServedCalls: totals since
        the actor started; a new incarnation's count from zero)."""
        if served is None:
            return
        seen = self._served_seen
        before = seen[1] if seen and seen[0] == served.incarnation else {}
        totals = {}
        for method, calls in served.calls.items():
            seconds = served.seconds.get(method, 0.0)
            last_calls, last_seconds = before.get(method, (0, 0.0))
            if calls > last_calls:
                self._child(self.actor_calls, (method,)).inc(calls - last_calls)
            if seconds > last_seconds:
                self._child(self.actor_call_seconds, (method,)).inc(seconds - last_seconds)
            totals[method] = (calls, seconds)
        self._served_seen = (served.incarnation, totals)

    def update_from_stats(self, stats: Any) -> None:
        """Copy the ledger's totals (an gpuledger.service.ledger_service.ServiceStats, or a bare LedgerStats)
        into the
        gauges."""
        self.gpu_total.set(stats.gpus_total)
        self.gpu_available.set(stats.whole_free)
        ratio = stats.milli_allocated / stats.milli_total if stats.milli_total else 0.0
        self.gpu_utilization.set(ratio)
        self.gpu_allocation_ratio.set(ratio)
        waiting = getattr(stats, "waiting", 0)
        self.workloads_pending.set(stats.reservations_pending + waiting)
        by_priority = {str(p): n for p, n in (getattr(stats, "waiting_by_priority", {}) or {}).items()}
        for priority in self._waiting_priorities - set(by_priority):  # no longer waiting: 0, not stale
            self.pods_waiting.labels(priority).set(0)
        for priority, count in by_priority.items():
            self.pods_waiting.labels(priority).set(count)
        self._waiting_priorities |= set(by_priority)
        self.oldest_wait.set(getattr(stats, "waiting_oldest_s", 0.0))
        self.workloads_running.set(stats.reservations_confirmed)
        self.placement_conflicts.set(getattr(stats, "conflicts", 0))
        for kind, field in (
            ("corrected", "device_corrections"),
            ("conflict", "device_conflicts"),
            ("pending_moved", "devices_moved"),
        ):
            self.device_disagreements.labels(kind).set(getattr(stats, field, 0))
        for level, domains in (("leaf", stats.leaves), ("spine", stats.spines)):
            for d in domains:
                name = (d.leaf if level == "leaf" else d.spine) or "(none)"
                self.domain_utilization.labels(level, name).set(d.utilization)
                self.domain_fragmentation.labels(level, name).set(d.fragmentation)
                self.scheduler_domain_fragmentation.labels(level, name).set(d.fragmentation)
        self.observe_recoveries(getattr(stats, "recoveries", None))
        self.observe_served(getattr(stats, "served", None))

    def count_ledger_calls(self, by_transport: dict[str, int]) -> None:
        """Export the ledger client's own tally of calls by transport (a dict it keeps current)."""
        self.ledger_transport = by_transport

    def placed_after_waiting(self, placed: Any) -> None:
        """A waiting pod this replica's placement adapter placed (gpuledger.sync.placer's `on_placed`)."""
        self.pod_wait.observe(placed.waited_s)

    def watch_sync(self, stats: Any) -> None:
        """Export this replica's cluster sync's lease and event counts (its SyncStats, kept current)."""
        self.sync_stats = stats

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _LedgerCalls:
    """gpuledger_ledger_calls_total{transport}: ledger calls over the direct channel and over Ray (its
    fallback), read from the client's counters at each scrape (the client has no registry of its own)."""

    def __init__(self, metrics: WebhookMetrics):
        self.metrics = metrics

    def describe(self):
        return [CounterMetricFamily("gpuledger_ledger_calls", _LEDGER_CALLS_HELP, labels=["transport"])]

    def collect(self):
        family = CounterMetricFamily("gpuledger_ledger_calls", _LEDGER_CALLS_HELP, labels=["transport"])
        for transport, count in sorted((self.metrics.ledger_transport or {}).items()):
            family.add_metric([transport], count)
        yield family


class _SyncLease:
    """gpuledger_sync_lease_held (1 on the replica whose cluster sync writes the ledger, 0 on those standing
    by) and gpuledger_sync_events_total{outcome}: events sent to the ledger or dropped while standing by.
    Absent on a replica that runs no sync (`--no-sync`, a cluster file)."""

    def __init__(self, metrics: WebhookMetrics):
        self.metrics = metrics

    def describe(self):
        return list(self._families(None))

    def collect(self):
        stats = self.metrics.sync_stats
        if stats is not None:
            yield from self._families(stats)

    @staticmethod
    def _families(stats: Any):
        held = GaugeMetricFamily(
            "gpuledger_sync_lease_held",
            "1 when this replica's cluster sync holds the ledger's sync lease (it alone writes the ledger)",
        )
        events = CounterMetricFamily(
            "gpuledger_sync_events",
            "watch events this replica's cluster sync sent to the ledger (applied) or dropped standing by",
            labels=["outcome"],
        )
        evictions = CounterMetricFamily(
            "gpuledger_preemption_evictions",
            "victims of the ledger's preemption plans this replica's sync evicted, found gone, or the API "
            "server refused (a disruption budget); orders void (their preemptor gone), calls failed",
            labels=["outcome"],
        )
        if stats is not None:
            held.add_metric([], 1.0 if stats.leading else 0.0)
            events.add_metric(["applied"], stats.events_applied)
            events.add_metric(["dropped"], stats.events_dropped)
            evicted = getattr(stats, "evictions", None)  # gpuledger.sync.evictor's EvictorStats
            for outcome in ("evicted", "refused", "gone", "void", "failed") if evicted is not None else ():
                evictions.add_metric([outcome], getattr(evicted, outcome))
        yield held
        yield events
        yield evictions


_LEDGER_CALLS_HELP = (
    "ledger calls by transport: channel (the direct socket into the ledger actor) or ray (every other call, "
    "and the channel's fallback); each call may carry a batch of admissions"
)
