"""The topology scheduler's metrics the webhook now exports: placement duration per decision, the ledger's
recovery (rebuild) time, and the domain fragmentation under both its names; read from a real /metrics."""

from __future__ import annotations

import base64
import json
from itertools import count

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.service.ledger_service import LedgerService, Recoveries, ServedCalls
from gpuledger.sync.config import SyncStats
from gpuledger.webhook.admission.review import make_review
from gpuledger.webhook.ledger.client import InProcessLedgerClient, LedgerUnavailable
from gpuledger.webhook.metrics import METRIC_NAMES, WebhookMetrics
from gpuledger.webhook.transport.app import create_app
from tests.webhook.webhook_support import apply_patch, cluster, config, gpu_pod, service

NOW = 1000.0


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def test_the_new_names_are_exported():
    for name in (
        "topology_scheduler_placement_duration_seconds",
        "topology_scheduler_recovery_duration_seconds",
        "topology_scheduler_domain_fragmentation_ratio",
        "topology_domain_fragmentation_ratio",
    ):
        assert name in METRIC_NAMES
        assert f"# TYPE {name}" in WebhookMetrics().exposition().decode()


def test_the_sync_lease_and_its_events_are_exported_only_where_a_sync_runs():
    metrics = WebhookMetrics()
    assert "gpuledger_sync_lease_held" not in metrics.exposition().decode()  # --no-sync: no sync, no lie
    stats = SyncStats(events_applied=7, events_dropped=0, leading=True)
    metrics.watch_sync(stats)
    text = metrics.exposition().decode()
    assert value(text, "gpuledger_sync_lease_held") == 1.0
    assert value(text, "gpuledger_sync_events_total", outcome="applied") == 7.0
    stats.leading, stats.events_dropped = False, 3  # the sync keeps its stats current: read at each scrape
    text = metrics.exposition().decode()
    assert value(text, "gpuledger_sync_lease_held") == 0.0
    assert value(text, "gpuledger_sync_events_total", outcome="dropped") == 3.0


def test_the_actors_served_calls_are_counted_once_each_and_a_new_incarnation_anew():
    metrics = WebhookMetrics()
    metrics.observe_served(ServedCalls("a", {"claim": 3, "admit": 1}, {"claim": 0.003, "admit": 0.002}))
    metrics.observe_served(ServedCalls("a", {"claim": 5, "admit": 1}, {"claim": 0.004, "admit": 0.002}))
    text = metrics.exposition().decode()
    assert value(text, "gpuledger_ledger_actor_calls_total", method="claim") == 5.0
    assert value(text, "gpuledger_ledger_actor_calls_total", method="admit") == 1.0
    assert abs(value(text, "gpuledger_ledger_actor_call_seconds_total", method="claim") - 0.004) < 1e-9
    metrics.observe_served(ServedCalls("b", {"claim": 2}, {"claim": 0.001}))  # a restarted actor: from zero
    metrics.observe_served(None)  # an in-process ledger: nothing served over a channel
    text = metrics.exposition().decode()
    assert value(text, "gpuledger_ledger_actor_calls_total", method="claim") == 7.0
    assert abs(value(text, "gpuledger_ledger_actor_call_seconds_total", method="claim") - 0.005) < 1e-9


def test_placement_duration_counts_gpu_decisions_only():
    m = WebhookMetrics()
    m.observe_decision("none", 0.001)  # no GPU asked: no placement to decide
    m.observe_decision("default", 0.002)
    m.observe_decision("balanced", 0.2)
    text = m.exposition().decode()
    assert value(text, "topology_scheduler_placement_duration_seconds_count") == 2
    assert abs(value(text, "topology_scheduler_placement_duration_seconds_sum") - 0.202) < 1e-9
    assert value(text, "topology_scheduler_placement_duration_seconds_bucket", le="0.005") == 1
    assert (
        value(text, "topology_scheduler_latency_seconds_count", strategy="none") == 1
    )  # the old metric: all


def test_recoveries_are_observed_once_each_and_a_new_incarnation_anew():
    m = WebhookMetrics()

    def count_() -> float:
        return value(m.exposition().decode(), "topology_scheduler_recovery_duration_seconds_count")

    m.observe_recoveries(Recoveries("inc-1", 2, (0.02, 3.0)))
    assert count_() == 2
    m.observe_recoveries(Recoveries("inc-1", 2, (0.02, 3.0)))  # the next scrape, nothing new
    assert count_() == 2
    m.observe_recoveries(Recoveries("inc-1", 3, (0.02, 3.0, 0.5)))
    text = m.exposition().decode()
    assert (
        count_() == 3 and abs(value(text, "topology_scheduler_recovery_duration_seconds_sum") - 3.52) < 1e-9
    )
    assert value(text, "topology_scheduler_recovery_duration_seconds_bucket", le="1.0") == 2
    m.observe_recoveries(Recoveries("inc-2", 1, (0.1,)))  # the ledger restarted: its count starts again
    assert count_() == 4
    m.observe_recoveries(None)  # a bare LedgerStats carries none
    assert count_() == 4


async def test_metrics_endpoint_serves_the_new_names(aiohttp_client):
    ticks = count(0.0, 0.125)  # each rebuild takes one tick: 0.125 s
    service = LedgerService(
        config().ledger_config(),
        {"kind": "objects", "objects": cluster(4, 8)},
        now=NOW,
        timer=lambda: next(ticks),
        incarnation="inc-1",
    )
    client = await aiohttp_client(create_app(config(), InProcessLedgerClient(service, lambda: NOW)))
    await client.post("/mutate", json=make_review(gpu_pod(3), uid="gpu"))
    await client.post(
        "/mutate", json=make_review(gpu_pod(None, annotations={"agentaflow.gpu/milli": "250"}), uid="share")
    )
    await client.post("/mutate", json=make_review(gpu_pod(None), uid="no-gpu"))
    text = await (await client.get("/metrics")).text()
    assert value(text, "topology_scheduler_placement_duration_seconds_count") == 2
    assert value(text, "topology_scheduler_recovery_duration_seconds_count") == 1  # the rebuild at start
    assert value(text, "topology_scheduler_recovery_duration_seconds_sum") == 0.125
    for level, domain in (("leaf", "leaf-0"), ("leaf", "leaf-1"), ("spine", "spine-0")):
        old = value(text, "topology_domain_fragmentation_ratio", level=level, domain=domain)
        assert value(text, "topology_scheduler_domain_fragmentation_ratio", level=level, domain=domain) == old
    assert (
        value(text, "topology_domain_fragmentation_ratio", level="spine", domain="spine-0") > 0
    )  # the share left 750m of one GPU that no whole-GPU pod can use
    service.resync(cluster(4, 8), NOW + 1)
    text = await (await client.get("/metrics")).text()
    assert value(text, "topology_scheduler_recovery_duration_seconds_count") == 2


class LedgerDownAtClaims(InProcessLedgerClient):
    """The in-process ledger whose claims fail as a restarting actor's do, once `down`."""

    down = False

    async def claim(self, reservation_id: str, claimer: str = ""):
        if self.down:
            raise LedgerUnavailable("actor restarting")
        return await super().claim(reservation_id, claimer)


async def test_each_claim_is_timed_apart_from_the_admission(aiohttp_client):
    """A placed pod's validation observes its claim once; a pod without a placement and a dry run claim
    nothing and observe nothing; a claim the ledger cannot answer is timed too (its wait is what hurt)."""
    ledger = LedgerDownAtClaims(service(cluster(1, 8)), lambda: NOW)
    client = await aiohttp_client(create_app(config(), ledger))

    async def answer(route: str, pod: dict, uid: str, **kw) -> dict:
        return (await (await client.post(route, json=make_review(pod, uid=uid, **kw))).json())["response"]

    async def placed(name: str) -> dict:
        """The pod as the API server stores it after the mutating call."""
        pod = gpu_pod(1, name=name)
        patch = json.loads(base64.b64decode((await answer("/mutate", pod, f"m-{name}"))["patch"]))
        return apply_patch(pod, patch)

    async def claims() -> float:
        text = await (await client.get("/metrics")).text()
        return samples(text)[("gpuledger_ledger_claim_duration_seconds_count", ())]

    first, second = await placed("a"), await placed("b")
    assert (await answer("/validate", first, "va"))["allowed"]
    assert (await answer("/validate", gpu_pod(None, name="plain"), "vp"))["allowed"]  # no placement
    assert (await answer("/validate", second, "vd", dry_run=True))["allowed"]  # a dry run: the signature only
    assert await claims() == 1
    ledger.down = True
    assert not (await answer("/validate", second, "vb"))["allowed"]  # fail closed (the default)
    assert await claims() == 2
