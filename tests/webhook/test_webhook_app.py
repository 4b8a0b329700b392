"""The HTTP surface (aiohttp test client, plain HTTP): transport errors, uid echo, probes, metrics."""

from __future__ import annotations

import json

import pytest

from gpuledger.service.ledger_service import LedgerService
from gpuledger.webhook.admission.review import decode_patch, make_review
from gpuledger.webhook.ledger.client import InProcessLedgerClient
from gpuledger.webhook.metrics import METRIC_NAMES
from gpuledger.webhook.transport.app import create_app
from tests.webhook.webhook_support import Clock, cluster, config, gpu_pod, service


class ExplodingLedger:
    def __getattr__(self, name):
        raise AssertionError(f"the ledger must not be called ({name})")


class BuggyLedger:
    async def admit(self, call):
        raise RuntimeError("kaboom")

    async def status(self):
        raise RuntimeError("down")

    async def stats(self):
        raise RuntimeError("down")


@pytest.fixture
def ledger_client():
    return InProcessLedgerClient(service(cluster(4, 8)), Clock())


async def test_mutate_roundtrip_echoes_uid(aiohttp_client, ledger_client):
    client = await aiohttp_client(create_app(config(), ledger_client))
    body = make_review(gpu_pod(2), uid="uid-123")
    resp = await client.post("/mutate", json=body)
    assert resp.status == 200
    answer = await resp.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "uid-123" and answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"
    assert any(op["path"] == "/metadata/annotations/gpuledger.io~1placement" for op in decode_patch(answer))


async def test_v1beta1_is_accepted(aiohttp_client, ledger_client):
    client = await aiohttp_client(create_app(config(), ledger_client))
    body = make_review(gpu_pod(1), uid="b1", api_version="admission.k8s.io/v1beta1")
    answer = await (await client.post("/mutate", json=body)).json()
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1" and answer["response"]["uid"] == "b1"


@pytest.mark.parametrize(
    "data,headers,status",
    [
        (b"", {"Content-Type": "application/json"}, 400),
        (b"{}", {"Content-Type": "text/plain"}, 400),
        (b"{not json", {"Content-Type": "application/json"}, 400),
        (b"[1, 2]", {"Content-Type": "application/json"}, 400),
        (b"\xff\xfe", {"Content-Type": "application/json"}, 400),
    ],
)
async def test_transport_errors_never_reach_the_ledger(aiohttp_client, data, headers, status):
    client = await aiohttp_client(create_app(config(), ExplodingLedger()))
    for route in ("/mutate", "/validate"):
        resp = await client.post(route, data=data, headers=headers)
        assert resp.status == status
        assert "error" in await resp.json()


async def test_body_over_the_cap_is_413(aiohttp_client):
    client = await aiohttp_client(create_app(config(max_body_bytes=1000), ExplodingLedger()))
    big = json.dumps(make_review(gpu_pod(1, annotations={"x": "y" * 5000}), uid="u")).encode()
    resp = await client.post("/mutate", data=big, headers={"Content-Type": "application/json"})
    assert resp.status == 413

    async def chunks():  # no Content-Length: the cap still holds
        for i in range(0, len(big), 256):
            yield big[i : i + 256]

    resp = await client.post("/mutate", data=chunks(), headers={"Content-Type": "application/json"})
    assert resp.status == 413


async def test_a_body_arriving_in_pieces_is_read_whole(aiohttp_client, ledger_client):
    """Regression: the body was read with one StreamReader.read(n), which returns what has arrived so far; a
    review split across TLS records by the API server was parsed half-read and answered 400."""
    import asyncio

    client = await aiohttp_client(create_app(config(), ledger_client))
    whole = json.dumps(make_review(gpu_pod(1, annotations={"note": "z" * 3000}), uid="split")).encode()

    async def pieces():
        for i in range(0, len(whole), 700):
            yield whole[i : i + 700]
            await asyncio.sleep(0.005)  # let the server see a partial body

    for headers in (
        {"Content-Type": "application/json"},
        {"Content-Type": "application/json", "Content-Length": str(len(whole))},
    ):
        resp = await client.post("/mutate", data=pieces(), headers=headers)
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
        assert answer["response"]["uid"] == "split" and answer["response"]["allowed"] is True


async def test_not_an_admission_review_but_uid_known_is_a_denial_with_uid(aiohttp_client):
    client = await aiohttp_client(create_app(config(), ExplodingLedger()))
    body = {"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {"uid": "u-9"}}
    answer = await (await client.post("/mutate", json=body)).json()
    assert answer["response"]["uid"] == "u-9" and answer["response"]["allowed"] is False
    assert (
        answer["response"]["status"]["code"] == 400
        and "apiVersion" in answer["response"]["status"]["message"]
    )


async def test_handler_exception_is_a_500_denial_with_uid(aiohttp_client):
    app = create_app(config(), BuggyLedger())
    client = await aiohttp_client(app)
    answer = await (await client.post("/mutate", json=make_review(gpu_pod(1), uid="u-500"))).json()
    r = answer["response"]
    assert r["uid"] == "u-500" and r["allowed"] is False and r["status"]["code"] == 500
    assert "kaboom" in r["status"]["message"]


async def test_probes(aiohttp_client, ledger_client):
    client = await aiohttp_client(create_app(config(), ledger_client))
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    unsynced = InProcessLedgerClient(LedgerService(config().ledger_config(), {"kind": "kubernetes"}))
    client2 = await aiohttp_client(create_app(config(), unsynced))
    resp = await client2.get("/readyz")
    assert resp.status == 503 and "not synced" in await resp.text()
    client3 = await aiohttp_client(create_app(config(), BuggyLedger()))
    assert (await client3.get("/readyz")).status == 503
    assert (await client3.get("/healthz")).status == 200


async def test_metrics_exports_every_name_per_app(aiohttp_client, ledger_client):
    app = create_app(config(), ledger_client)
    other = create_app(config(), ledger_client)  # a second app in the same process: its own registry
    client = await aiohttp_client(app)
    await client.post("/mutate", json=make_review(gpu_pod(2), uid="m1"))
    await client.post("/mutate", json=make_review(gpu_pod(99), uid="m2"))
    text = await (await client.get("/metrics")).text()
    for name in METRIC_NAMES:
        assert name in text, name
    assert "agentaflow_gpu_total 32.0" in text
    assert 'topology_placement_decisions_total{result="placed",strategy="default"} 1.0' in text
    assert 'topology_placement_decisions_total{result="denied",strategy="default"} 1.0' in text
    assert "topology_domain_utilization_ratio{" in text
    assert 'gpuledger_ledger_calls_total{transport="in-process"} 2.0' in text
    assert other is not app


def test_the_admission_counters_count_through_their_remembered_children():
    """decided / prefetched / observe_decision look each label set's child up once; what they count is what
    labels() would have counted, per label set."""
    from prometheus_client import generate_latest

    from gpuledger.webhook.metrics import WebhookMetrics

    m = WebhookMetrics()
    for strategy, result in [("best_fit", "placed"), ("best_fit", "placed"), ("none", "invalid")]:
        m.decided(strategy, result)
    m.prefetched("hit", 1)
    m.prefetched("hit", 2)
    m.prefetched("released", 5)
    m.observe_decision("best_fit", 0.002)
    m.observe_decision("none", 0.001)
    text = generate_latest(m.registry).decode()
    assert 'topology_placement_decisions_total{result="placed",strategy="best_fit"} 2.0' in text
    assert 'topology_placement_decisions_total{result="invalid",strategy="none"} 1.0' in text
    assert 'gpuledger_prefetch_total{outcome="hit"} 3.0' in text
    assert 'gpuledger_prefetch_total{outcome="released"} 5.0' in text
    assert 'topology_scheduler_latency_seconds_count{strategy="best_fit"} 1.0' in text
    assert 'topology_scheduler_latency_seconds_count{strategy="none"} 1.0' in text
    assert "topology_scheduler_placement_duration_seconds_count 1.0" in text  # "none" decided no placement
    assert m.placement_decisions.labels("best_fit", "placed") is m._child(
        m.placement_decisions, ("best_fit", "placed")
    )
