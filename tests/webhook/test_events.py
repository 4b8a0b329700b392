"""Kubernetes Events: queued on the request path, posted in batches off it, rate-limited by a token bucket
whose clock is an input, dropped and counted when the queue is full; and which decision gets which Event."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from gpuledger.webhook.admission.review import decode_patch, make_review
from gpuledger.webhook.kube import events
from gpuledger.webhook.kube.events import DENIED, PLACED, EventPoster, EventSettings, ObjectRef, TokenBucket
from gpuledger.webhook.ledger.client import InProcessLedgerClient
from gpuledger.webhook.transport.app import EVENTS_KEY, create_app
from tests.webhook.test_owner_chain import NS, deployment, lookup, owned_pod, ref
from tests.webhook.webhook_support import (
    Clock,
    apply_patch,
    cluster,
    config,
    gpu_pod,
    handler,
    review,
    service,
)


def run(coro):
    return asyncio.run(coro)


class FakeWriter:
    """The API behind the EventWriter interface: stored pods by reservation id, and the Events created."""

    def __init__(self):
        self.stored: dict[tuple[str, str], ObjectRef] = {}
        self.created: list[tuple[str, dict]] = []
        self.lookups: list[tuple[str, list[str]]] = []
        self.fail_create = False
        self.block: asyncio.Event | None = None

    def store(self, namespace: str, reservation_id: str, name: str) -> None:
        self.stored[(namespace, reservation_id)] = ObjectRef("v1", "Pod", namespace, name, f"uid-{name}")

    async def find_pods(self, namespace, reservation_ids):
        self.lookups.append((namespace, list(reservation_ids)))
        return {
            rid: self.stored[(namespace, rid)] for rid in reservation_ids if (namespace, rid) in self.stored
        }

    async def create(self, namespace, body):
        if self.block is not None:
            await self.block.wait()
        if self.fail_create:
            raise RuntimeError("403 Forbidden")
        self.created.append((namespace, body))


class FakeSleep:
    """asyncio.sleep for the poster: moves the clock instead of waiting, and remembers each wait."""

    def __init__(self, clock: Clock):
        self.clock, self.waits = clock, []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(round(seconds, 6))
        self.clock.now += seconds


def poster(
    writer=None, clock=None, **settings
) -> tuple[EventPoster, FakeWriter, Clock, FakeSleep, CollectorRegistry]:
    clock = clock or Clock(100.0)
    writer = writer or FakeWriter()
    sleep = FakeSleep(clock)
    registry = CollectorRegistry()
    p = EventPoster(
        writer,
        EventSettings(**settings),
        registry=registry,
        clock=clock,
        wall=lambda: 1_700_000_000.0,
        sleep=sleep,
        instance="gpuledger-0",
    )
    return p, writer, clock, sleep, registry


def metric(registry: CollectorRegistry, name: str, **labels) -> float:
    return registry.get_sample_value(name, labels) or 0.0


POD = ObjectRef("v1", "Pod", "team", "bare")
JOB = ObjectRef("batch/v1", "Job", "team", "train", "uid-train")


# ------------------------------------------------------------------ the token bucket
def test_token_bucket_gives_a_burst_then_the_rate():
    clock = Clock(0.0)
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == 0.5  # the next token is half a second away; none taken
    clock.now += 0.5
    assert bucket.take() == 0.0
    clock.now += 100
    assert [bucket.take() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]  # refills up to the burst, no more


# ------------------------------------------------------------------ the queue
def test_emit_never_blocks_and_drops_counted_when_full():
    p, writer, _, _, registry = poster(queue_size=3)
    for i in range(5):
        p.emit(events.denied(POD, f"denied {i}"))
    assert p.pending == 3
    assert metric(registry, "gpuledger_events_dropped_total", why="queue_full") == 2
    assert run(p.flush()) == 3 and p.pending == 0
    assert [b["message"] for _, b in writer.created] == ["denied 0", "denied 1", "denied 2"]


def test_denial_event_body_is_what_the_api_server_accepts():
    p, writer, _, _, registry = poster()
    p.emit(events.denied(JOB, "gpuledger: no placement for pod team/train-<generated> (16 GPUs): ..."))
    run(p.flush())
    namespace, body = writer.created[0]
    assert namespace == body["metadata"]["namespace"] == body["involvedObject"]["namespace"] == "team"
    assert body["involvedObject"] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "namespace": "team",
        "name": "train",
        "uid": "uid-train",
    }
    assert body["reason"] == DENIED and body["type"] == "Warning" and body["count"] == 1
    assert body["metadata"]["name"].startswith("train.")
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2023-11-14T22:13:20Z"
    assert body["source"] == {"component": "gpuledger-webhook"}
    assert body["reportingComponent"] == "gpuledger.io/webhook" and body["reportingInstance"] == "gpuledger-0"
    assert metric(registry, "gpuledger_events_posted_total", reason=DENIED) == 1


def test_a_batch_merges_repeats_into_one_event_with_a_count():
    p, writer, _, _, registry = poster()
    for _ in range(4):  # a ReplicaSet retrying its pods: the same denial on the same object
        p.emit(events.denied(JOB, "no placement"))
    p.emit(events.denied(JOB, "another message"))
    assert run(p.flush()) == 2
    assert [(b["message"], b["count"]) for _, b in writer.created] == [
        ("no placement", 4),
        ("another message", 1),
    ]
    assert metric(registry, "gpuledger_events_posted_total", reason=DENIED) == 5
    assert len({b["metadata"]["name"] for _, b in writer.created}) == 2


def test_rate_limit_waits_on_the_injected_clock():
    p, writer, clock, sleep, _ = poster(rate_per_s=2.0, burst=2)
    for i in range(5):
        p.emit(events.denied(POD, f"m{i}"))
    started = clock.now
    assert run(p.flush()) == 5
    assert sleep.waits == [0.5, 0.5, 0.5]  # two from the burst, then one every half second
    assert clock.now - started == 1.5
    assert len(writer.created) == 5


def test_batch_size_bounds_a_round():
    p, writer, _, _, _ = poster(batch_size=2)
    for i in range(5):
        p.emit(events.denied(POD, f"m{i}"))
    assert [run(p.flush()) for _ in range(4)] == [2, 2, 1, 0]


def test_api_errors_are_counted_and_the_round_goes_on():
    p, writer, _, _, registry = poster()
    writer.fail_create = True
    p.emit(events.denied(POD, "a"))
    p.emit(events.denied(JOB, "b"))
    assert run(p.flush()) == 0
    assert metric(registry, "gpuledger_events_dropped_total", why="api_error") == 2


# ------------------------------------------------------------------ placed pods: found once stored
def test_placed_event_waits_for_the_stored_pod_then_names_it():
    p, writer, clock, _, registry = poster(look_after_s=0.25, pod_wait_s=30)
    p.emit(events.placed("team", "rid-1", "gpuledger placed the pod on node n1"))
    assert run(p.flush()) == 0 and writer.lookups == []  # too soon: the pod is not stored yet
    clock.now += 0.25
    assert run(p.flush()) == 0 and writer.lookups == [("team", ["rid-1"])]  # looked, not there yet
    clock.now += 0.1
    run(p.flush())
    assert len(writer.lookups) == 1  # looks are at most every look_after_s
    writer.store("team", "rid-1", "train-x7k2p")
    clock.now += 0.15
    assert run(p.flush()) == 1
    body = writer.created[0][1]
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team",
        "name": "train-x7k2p",
        "uid": "uid-train-x7k2p",
    }
    assert body["reason"] == PLACED and body["type"] == "Normal"
    assert metric(registry, "gpuledger_events_posted_total", reason=PLACED) == 1 and p.pending == 0


def test_one_lookup_per_namespace_per_round():
    p, writer, clock, _, _ = poster()
    for i in range(3):
        p.emit(events.placed("a", f"ra{i}", "m"))
        writer.store("a", f"ra{i}", f"pa{i}")
    p.emit(events.placed("b", "rb0", "m"))
    writer.store("b", "rb0", "pb0")
    run(p.flush())
    clock.now += 1
    assert run(p.flush()) == 4
    assert sorted(writer.lookups) == [("a", ["ra0", "ra1", "ra2"]), ("b", ["rb0"])]


def test_a_pod_never_stored_is_given_up_and_counted():
    p, writer, clock, _, registry = poster(look_after_s=0.25, pod_wait_s=2.0)
    p.emit(events.placed("team", "rid-lost", "m"))
    for _ in range(10):
        clock.now += 0.25
        run(p.flush())
    assert p.pending == 0 and writer.created == []
    assert metric(registry, "gpuledger_events_dropped_total", why="pod_not_stored") == 1


def test_next_delay_follows_the_waiting_pods():
    p, writer, clock, _, _ = poster(look_after_s=0.25)
    assert p._next_delay() is None  # idle
    p.emit(events.placed("team", "r", "m"))
    assert p._next_delay() == 0.0  # queued: take it now
    run(p.flush())
    assert p._next_delay() == 0.25  # then look when it is due
    clock.now += 0.25
    run(p.flush())
    assert p._next_delay() == 0.25  # not found: look again after look_after_s


# ------------------------------------------------------------------ placed pods reported by the sync's watch
def stored_pod(namespace: str, rid: str, name: str) -> dict:
    return {
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"gpuledger.io/reservation-id": rid},
        },
    }


def test_a_placed_pod_the_watch_reports_is_posted_without_a_lookup():
    p, writer, clock, _, registry = poster(look_after_s=0.25, watch_grace_s=2.0)
    p.watch_reports()
    p.emit(events.placed("team", "rid-1", "m"))
    assert run(p.flush()) == 0
    p.stored("team", "rid-1", ObjectRef("v1", "Pod", "team", "train-x7k2p", "uid-train-x7k2p"))
    assert p._next_delay() == 0.0  # posted at once, not when a look would be due
    assert run(p.flush()) == 1 and writer.lookups == []
    assert writer.created[0][1]["involvedObject"]["name"] == "train-x7k2p"
    assert metric(registry, "gpuledger_events_pods_found_total", by="watch") == 1
    assert p.pending == 0 and not p._awaited and not p._seen
    p.stored("team", "rid-1", ObjectRef("v1", "Pod", "team", "again"))  # posted already: nothing kept
    assert not p._seen


def test_the_watch_reporting_before_the_round_took_the_event_is_enough():
    p, writer, clock, _, _ = poster()
    p.watch_reports()
    p.emit(events.placed("team", "rid-1", "m"))
    p.stored("team", "rid-1", ObjectRef("v1", "Pod", "team", "p", "u"))  # still queued, not yet waiting
    assert run(p.flush()) == 1 and writer.lookups == []


def test_a_pod_the_watch_missed_is_looked_up_after_the_grace():
    p, writer, clock, _, registry = poster(look_after_s=0.25, watch_grace_s=2.0)
    p.watch_reports()
    p.emit(events.placed("team", "rid-1", "m"))
    writer.store("team", "rid-1", "p")
    run(p.flush())
    clock.now += 0.5
    assert run(p.flush()) == 0 and writer.lookups == []  # the watch has time to report it first
    assert p._next_delay() == pytest.approx(1.5)
    clock.now += 1.5
    assert run(p.flush()) == 1 and writer.lookups == [("team", ["rid-1"])]
    assert metric(registry, "gpuledger_events_pods_found_total", by="list") == 1


def test_the_watch_callback_hands_over_only_awaited_pods_from_its_thread():
    """The sync calls back on its own thread: only pods this poster waits for reach the loop."""
    import threading

    async def scenario():
        p, writer, clock, _, _ = poster(look_after_s=0.25, watch_grace_s=30.0)
        report = p.watch_reports()
        p.start()
        await asyncio.sleep(0)  # the task is running: it knows its loop
        p.emit(events.placed("team", "rid-1", "m"))
        for pod in (stored_pod("team", "rid-other", "other"), stored_pod("team", "rid-1", "mine"), {}):
            thread = threading.Thread(target=report, args=(pod,))
            thread.start()
            thread.join()
        for _ in range(100):
            if writer.created:
                break
            await asyncio.sleep(0.01)
        await p.stop()
        report(stored_pod("team", "rid-1", "late"))  # stopped: ignored, never raises
        return writer, p

    writer, p = run(scenario())
    assert [body["involvedObject"]["name"] for _, body in writer.created] == ["mine"]
    assert writer.lookups == [] and not p._seen


# ------------------------------------------------------------------ which decision reports what
class Sink:
    def __init__(self):
        self.events: list[events.AdmissionEvent] = []

    def emit(self, event):
        self.events.append(event)


def sink_handler(owners=None, **cfg):
    h, svc = handler(cluster(2, 8), config(**cfg), owners=owners)
    h.events = Sink()
    return h, h.events


def test_placed_pod_reports_node_devices_strategy_and_reservation():
    h, sink = sink_handler()
    pod = gpu_pod(2, annotations={"agentaflow.gpu/scheduling-strategy": "best-fit"}, namespace="team")
    d = run(h.mutate(review(pod)))
    [event] = sink.events
    assert event.reason == PLACED and event.namespace == "team" and event.reservation_id == d.reservation_id
    assert event.involved is None  # found by reservation id once stored
    assert f"node {d.node}" in event.message and "GPU devices [" in event.message
    assert "strategy best_fit" in event.message and d.reservation_id in event.message


def test_gang_slot_is_in_the_placed_message():
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": NS,
            "uid": "u",
            "annotations": {"topology.scheduler/gpu-count": "4"},
        },
        "spec": {"parallelism": 2},
    }
    owners, _ = lookup([job])
    h, sink = sink_handler(owners)
    run(h.mutate(review(owned_pod(ref("Job", "train", "batch/v1")), namespace=NS)))
    assert f"gang job/{NS}/train slot" in sink.events[0].message


def test_denial_is_reported_on_the_top_controller():
    owners, _ = lookup(deployment({"topology.scheduler/gpu-count": "64"}))
    h, sink = sink_handler(owners)
    d = run(h.mutate(review(owned_pod(ref("ReplicaSet", "web-7d9f", "apps/v1")), namespace=NS)))
    assert not d.allowed
    [event] = sink.events
    assert event.reason == DENIED and event.type == "Warning" and event.message == d.message
    assert event.involved == ObjectRef("apps/v1", "Deployment", NS, "web", "uid-web")


def test_bare_pod_denial_is_reported_on_the_pod_by_name_invalid_annotations_too():
    h, sink = sink_handler()
    run(h.mutate(review(gpu_pod(99, name="huge", namespace="team"))))
    run(
        h.mutate(
            review(
                gpu_pod(None, name="bad", namespace="team", annotations={"topology.scheduler/gpu-count": "x"})
            )
        )
    )
    assert [(e.involved.kind, e.involved.name, e.involved.uid) for e in sink.events] == [
        ("Pod", "huge", ""),
        ("Pod", "bad", ""),
    ]
    assert "gpu-count='x'" in sink.events[1].message


def test_no_event_for_dry_runs_reinvocations_no_gpu_or_other_schedulers():
    h, sink = sink_handler()
    run(h.mutate(review(gpu_pod(1), dry_run=True)))
    run(h.mutate(review(gpu_pod(None))))
    other = gpu_pod(1)
    other["spec"]["schedulerName"] = "volcano"
    run(h.mutate(review(other)))
    pod = gpu_pod(1)
    first = run(h.mutate(review(pod)))
    run(h.mutate(review(apply_patch(pod, first.patch))))
    assert [e.reason for e in sink.events] == [PLACED]


# ------------------------------------------------------------------ in the app: off the request path
@pytest.fixture
def ledger_client():
    return InProcessLedgerClient(service(cluster(4, 8)), Clock())


async def test_app_posts_events_in_the_background_and_never_waits_for_them(aiohttp_client, ledger_client):
    writer = FakeWriter()
    writer.block = asyncio.Event()  # the API hangs: admissions must not notice
    app = create_app(
        config(), ledger_client, event_writer=writer, event_settings=EventSettings(look_after_s=0.01)
    )
    client = await aiohttp_client(app)
    started = time.perf_counter()
    for i in range(5):
        resp = await client.post("/mutate", json=make_review(gpu_pod(99, name=f"big-{i}"), uid=f"u{i}"))
        assert not (await resp.json())["response"]["allowed"]
    assert time.perf_counter() - started < 5
    poster = app[EVENTS_KEY]
    assert writer.created == []
    writer.block.set()
    for _ in range(200):
        if len(writer.created) == 5:
            break
        await asyncio.sleep(0.01)
    assert sorted(b["involvedObject"]["name"] for _, b in writer.created) == [f"big-{i}" for i in range(5)]
    text = await (await client.get("/metrics")).text()
    assert 'gpuledger_events_posted_total{reason="GPUPlacementDenied"} 5.0' in text
    assert poster.pending == 0


async def test_app_finds_the_placed_pod_and_posts_gpu_placed(aiohttp_client, ledger_client):
    writer = FakeWriter()
    app = create_app(
        config(), ledger_client, event_writer=writer, event_settings=EventSettings(look_after_s=0.01)
    )
    client = await aiohttp_client(app)
    pod = gpu_pod(1, name="p")
    answer = await (await client.post("/mutate", json=make_review(pod, uid="u1"))).json()
    assert answer["response"]["allowed"]
    rid = apply_patch(pod, decode_patch(answer))["metadata"]["labels"]["gpuledger.io/reservation-id"]
    writer.store("default", rid, "p")  # the API server stored the pod
    for _ in range(200):
        if writer.created:
            break
        await asyncio.sleep(0.01)
    assert writer.created[0][1]["reason"] == PLACED and writer.created[0][1]["involvedObject"]["name"] == "p"
