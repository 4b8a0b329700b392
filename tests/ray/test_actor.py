"""The ledger in a real local Ray, behind the real TLS server: races, shared replicas, dryRun, restarts.

One Ray for the module (starting Ray costs seconds on two cores); each test uses its own actor name.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import aiohttp
import jsonpatch
import pytest
import ray

from gpuledger.certs.pki import make_ca, make_serving_cert, write_bundle
from gpuledger.core.model import Request
from gpuledger.core.pods.placement_codec import decode_placement
from gpuledger.names import PLACEMENT_ANNOTATION
from gpuledger.ray.actor import get_or_create_ledger, wait_ready
from gpuledger.service.ledger_service import AdmitCall
from gpuledger.webhook.admission.review import decode_patch, make_review
from gpuledger.webhook.config import WebhookConfig
from gpuledger.webhook.config_watch import ConfigWatcher, ray_push
from gpuledger.webhook.ledger.client import RayLedgerClient
from gpuledger.webhook.transport.app import create_app
from gpuledger.webhook.transport.server import start_server
from gpuledger.webhook.transport.tls import ReloadingTLS
from tests.webhook.webhook_support import HMAC_KEY, cluster, config, gpu_pod

pytestmark = [pytest.mark.ray, pytest.mark.slow]
KEY = HMAC_KEY.encode()


@pytest.fixture(scope="module")
def ray_local():
    ray.init(
        address="local",
        namespace="gpuledger-test-actor",
        include_dashboard=False,
        num_cpus=1,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


@pytest.fixture
def tls_files(tmp_path):
    ca = make_ca()
    paths = write_bundle(tmp_path / "tls", ca, make_serving_cert(ca, ["localhost"], ["127.0.0.1"]))
    return ca, paths


def write_objects(path: Path, objects: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(["---\n" + json.dumps(o) for o in objects]))  # JSON documents are YAML
    tmp.replace(path)


def new_actor(objects: list[dict], tmp_path: Path, cfg=None, **kwargs):
    cfg = cfg or config()
    source = tmp_path / f"cluster-{uuid.uuid4().hex[:6]}.yaml"
    write_objects(source, objects)
    name = f"ledger-{uuid.uuid4().hex[:8]}"
    handle = get_or_create_ledger(
        cfg.ledger_config(),
        {"kind": "file", "path": str(source)},
        name=name,
        namespace="gpuledger-test",
        **kwargs,
    )
    wait_ready(handle)
    return handle, name, source


async def start(handle, paths, cfg=None):
    cfg = cfg or config()
    client = RayLedgerClient(handle)
    tls = ReloadingTLS(paths["tls.crt"], paths["tls.key"], poll_interval_s=5)
    server = await start_server(create_app(cfg, client), "127.0.0.1", 0, tls)
    return server, client


async def post_all(
    url: str, ca_pem: bytes, bodies: list[dict], connections: int, route: str = "/mutate"
) -> list[dict]:
    import ssl

    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=connections)) as session:

        async def one(body):
            async with session.post(f"{url}{route}", json=body) as resp:
                assert resp.status == 200
                return await resp.json()

        return await asyncio.gather(*(one(b) for b in bodies))


async def test_500_concurrent_creates_race_for_64_gpus(ray_local, tls_files, tmp_path):
    ca, paths = tls_files
    handle, _, _ = new_actor(cluster(8, 8), tmp_path)
    server, client = await start(handle, paths, config(deadline_s=30))
    try:
        pods = [gpu_pod(1) for _ in range(500)]
        bodies = [make_review(p, uid=f"race-{i}") for i, p in enumerate(pods)]
        answers = await post_all(server.url, ca.cert_pem, bodies, connections=250)
    finally:
        await server.stop()
    assert [a["response"]["uid"] for a in answers] == [b["request"]["uid"] for b in bodies]
    allowed = [(p, a) for p, a in zip(pods, answers, strict=True) if a["response"]["allowed"]]
    denied = [a for a in answers if not a["response"]["allowed"]]
    assert len(allowed) == 64 and len(denied) == 436
    assert all(
        a["response"]["status"]["code"] == 403 and "not enough GPUs" in a["response"]["status"]["message"]
        for a in denied
    )
    seen = set()
    for pod, answer in allowed:
        out = jsonpatch.apply_patch(pod, decode_patch(answer))
        p = decode_placement(out["metadata"]["annotations"][PLACEMENT_ANNOTATION], KEY)
        for d in p.devices:
            assert (p.node, d) not in seen
            seen.add((p.node, d))
    assert len(seen) == 64
    assert client.admissions.calls < 250  # concurrent admissions travelled together
    stats = ray.get(handle.stats.remote())
    assert stats.milli_allocated == 64_000 and stats.reservations_pending == 64


def test_replicas_get_or_create_one_shared_actor(ray_local, tmp_path):
    cfg = config()
    source = tmp_path / "c.yaml"
    write_objects(source, cluster(2, 8))
    name = f"shared-{uuid.uuid4().hex[:8]}"
    handles, errors = [], []

    def replica():
        try:
            handles.append(
                get_or_create_ledger(
                    cfg.ledger_config(),
                    {"kind": "file", "path": str(source)},
                    name=name,
                    namespace="gpuledger-test",
                )
            )
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=replica) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({h._actor_id for h in handles}) == 1
    incarnations = {ray.get(h.ping.remote()) for h in handles}
    assert len(incarnations) == 1


async def test_dry_run_reinvocation_and_sweep_through_ray(ray_local, tls_files, tmp_path):
    ca, paths = tls_files
    handle, _, source = new_actor(cluster(1, 8), tmp_path)
    server, _ = await start(handle, paths)
    try:
        before = ray.get(handle.snapshot.remote())
        pod = gpu_pod(8)
        [dry] = await post_all(server.url, ca.cert_pem, [make_review(pod, uid="d", dry_run=True)], 1)
        assert dry["response"]["allowed"] and decode_patch(dry)
        assert ray.get(handle.snapshot.remote()) == before

        [real] = await post_all(server.url, ca.cert_pem, [make_review(pod, uid="r1")], 1)
        mutated = jsonpatch.apply_patch(pod, decode_patch(real))
        [again] = await post_all(server.url, ca.cert_pem, [make_review(mutated, uid="r2")], 1)
        assert again["response"]["allowed"] and decode_patch(again) == []
        assert ray.get(handle.stats.remote()).reservations_pending == 1
        [ok] = await post_all(server.url, ca.cert_pem, [make_review(mutated, uid="v1")], 1, "/validate")
        assert ok["response"]["allowed"]
        [copy] = await post_all(server.url, ca.cert_pem, [make_review(mutated, uid="v2")], 1, "/validate")
        assert not copy["response"]["allowed"] and "already admitted" in copy["response"]["status"]["message"]

        # the pod was never stored (not in the source): past the TTL the sweep releases it; `now` is an input
        status = ray.get(handle.status.remote())
        expired = ray.get(handle.sweep.remote(status["started_at"] + 3600))
        assert len(expired) == 1
        assert ray.get(handle.stats.remote()).milli_allocated == 0
    finally:
        await server.stop()


async def test_actor_killed_mid_run_is_rebuilt_from_its_source(ray_local, tls_files, tmp_path):
    ca, paths = tls_files
    nodes = cluster(8, 8)
    handle, _, source = new_actor(nodes, tmp_path)
    server, client = await start(handle, paths, config(deadline_s=60))
    stored: list[dict] = []  # the "API server": every admitted pod is stored, i.e. written to the source

    def store(pod: dict, answer: dict) -> None:
        out = jsonpatch.apply_patch(pod, decode_patch(answer))
        p = decode_placement(out["metadata"]["annotations"][PLACEMENT_ANNOTATION], KEY)
        out["spec"]["nodeName"] = p.node
        out["status"] = {"phase": "Running"}
        stored.append(out)
        write_objects(source, nodes + stored)

    import ssl

    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    first = ray.get(handle.ping.remote())
    killed = asyncio.Event()
    answers = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=8)) as session:

            async def worker(w: int):
                for i in range(6):
                    pod = gpu_pod(1 + (i % 2))
                    async with session.post(
                        f"{server.url}/mutate", json=make_review(pod, uid=f"k{w}-{i}")
                    ) as resp:
                        answer = await resp.json()
                    answers.append(answer)
                    if answer["response"]["allowed"]:
                        store(pod, answer)
                    if w == 0 and i == 2:
                        ray.kill(handle, no_restart=False)  # mid-run: other workers have requests in flight
                        killed.set()

            await asyncio.gather(*(worker(w) for w in range(4)))
    finally:
        await server.stop()
    assert killed.is_set()
    assert len(answers) == 24 and all(a["response"]["allowed"] for a in answers), [
        a["response"].get("status") for a in answers if not a["response"]["allowed"]
    ]
    assert ray.get(handle.ping.remote()) != first  # a new incarnation answered

    # nothing lost: every stored pod is held by the rebuilt ledger on its own devices, none twice
    seen = set()
    for pod in stored:
        p = decode_placement(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION], KEY)
        [held] = ray.get(handle.lookup.remote([p.id]))
        assert held is not None and (held.placement.node, held.placement.devices) == (p.node, p.devices)
        for d in p.devices:
            assert (p.node, d) not in seen
            seen.add((p.node, d))
    assert ray.get(handle.stats.remote()).milli_allocated == 1000 * len(seen)
    assert client.admissions.calls <= 24


async def test_settings_reach_the_live_actor_from_the_api_and_the_config_file(ray_local, tmp_path):
    """`set_default_strategy` and a changed config file reach the running actor; a restarted actor gets the
    config's settings back from the next re-push. The watcher's time is the test's."""
    handle, _, _ = new_actor(cluster(2, 8), tmp_path)
    settings = ray.get(handle.set_default_strategy.remote("priority", "alice", 5000.0))
    assert (settings["default_strategy"], settings["changed_by"], settings["changed_at"]) == (
        "priority",
        "alice",
        5000.0,
    )
    [p] = ray.get(handle.admit.remote([AdmitCall(Request(id="a", gpus=1))]))
    assert p.strategy == "priority"
    with pytest.raises(
        ValueError, match=r"strategy='fastest' is not accepted: expected one of balanced, best_fit"
    ):
        ray.get(handle.set_default_strategy.remote("fastest", "alice"))
    assert ray.get(handle.get_settings.remote())["default_strategy"] == "priority"

    path = tmp_path / "config.yaml"
    path.write_text("default_strategy: fgd_host\n")  # the config the actor was created with
    watcher = ConfigWatcher(
        path,
        lambda: WebhookConfig.from_file(path),
        ray_push(handle),
        source="replica-a",
        repush_interval_s=30.0,
    )
    assert await watcher.check(0.0) is False  # unchanged config: the runtime change stays
    assert ray.get(handle.get_settings.remote())["default_strategy"] == "priority"
    path.write_text("default_strategy: round_robin\ntopologyConstraints: {maxGPUsPerLeaf: 16}\n")
    assert await watcher.check(1.0) is True
    live = ray.get(handle.get_settings.remote())
    assert (live["default_strategy"], live["max_gpus_per_leaf"]) == ("round_robin", 16)
    assert live["changed_by"].startswith(f"config file {path}") and live["changed_by"].endswith(
        "via replica-a"
    )
    stats = ray.get(handle.stats.remote())
    assert stats.settings["default_strategy"] == "round_robin" and stats.recoveries.count == 1

    first = ray.get(handle.ping.remote())
    ray.kill(handle, no_restart=False)  # Ray restarts it with its creator's arguments
    for _ in range(600):
        try:
            if ray.get(handle.ping.remote(), timeout=5) != first:
                break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass  # still restarting (a loaded machine can take longer than one ping's timeout)
        await asyncio.sleep(0.05)
    assert ray.get(handle.get_settings.remote())["default_strategy"] == "fgd_host"
    assert await watcher.check(20.0) is False  # the re-push is not due yet
    assert await watcher.check(31.0) is True
    assert ray.get(handle.get_settings.remote())["default_strategy"] == "round_robin"


def test_calls_are_answered_through_ray_while_a_resync_builds(ray_local, tmp_path):
    """A resync through Ray builds in steps: the actor's status, an admission and a lease renewal are answered
    while it builds (status says `resyncing`), and the admission's reservation is held afterwards."""
    handle, _, _ = new_actor(cluster(2, 8), tmp_path, resync_step=5)
    before = ray.get(handle.status.remote())["rebuilds"]
    # ~1.5 s of build, in which dozens of status calls are answered: 5,000 nodes built in ~0.35 s, where a
    # call through Ray was answered 1-10 times (once none: a flake in a full run)
    resync = handle.resync.remote(cluster(20000, 8))
    during = None
    deadline = time.monotonic() + 60
    while during is None and time.monotonic() < deadline:
        status = ray.get(handle.status.remote())
        if status["resyncing"]:
            during = status
        else:
            assert status["rebuilds"] == before, "the resync ended before any call was answered during it"
    assert during is not None and during["nodes"] == 2  # answered by the ledger being replaced
    [placed] = ray.get(handle.admit.remote([AdmitCall(Request(id="mid-resync", gpus=1))]))
    assert ray.get(handle.sync_lease.remote("sync-x", 30.0))["held"]
    report = ray.get(resync, timeout=120)
    status = ray.get(handle.status.remote())
    assert status["nodes"] == 20000 and not status["resyncing"] and status["rebuilds"] == before + 1
    [held] = ray.get(handle.lookup.remote(["mid-resync"]))
    assert held is not None and held.placement.devices == placed.devices and report["lost"] == 0
