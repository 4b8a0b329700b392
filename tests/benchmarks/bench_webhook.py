"""Webhook throughput and latency over TLS against a 1,000-node / 8,000-GPU ledger in a local Ray actor.

    .venv/bin/python tests/benchmarks/bench_webhook.py            # full run (about a minute)
    .venv/bin/python tests/benchmarks/bench_webhook.py --quick    # smaller, for a smoke test

The server (aiohttp + TLS + the batched Ray client) runs in this process; the load generator runs in a
second process (raw asyncio TLS connections, one request in flight per connection, pre-encoded bodies), so
the two share the machine's cores as they would share a node. Baselines measured in the same run:
- a no-op aiohttp handler over the same TLS (what HTTP + TLS alone cost here),
- the same transport answering a real mutate answer (same patch, same size) and doing none of the webhook's
  work (`answer_only_app`): what the webhook costs over it is its own work, not the answer's size,
- the raw Ray actor call rate (one admission per call, sequential: what an unbatched webhook could reach),
- the raw cost of one Ray actor call, local (Ray started in this process) and in-cluster (joining a
  `ray start --head` cluster by address), for docs/deployment.md.
The two ratio rows (throughput and p99 against the no-op) are the medians of `--pairs` alternated runs of the
webhook and the no-op, each as long as its phase: a single phase of each side moves with the host's minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.proc_cpu import actor_pid, cpu_seconds  # noqa: E402


def shipped_setting(key: str, default):
    """A setting as manifests/config/config.yaml ships it: the benchmarks measure the product as deployed."""
    import yaml

    return yaml.safe_load((ROOT / "manifests" / "config" / "config.yaml").read_text()).get(key, default)


# --------------------------------------------------------------------------------------------- load generator


def _pod_body(i: int, run: str) -> bytes:
    name = f"bench-{run}-{i}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "labels": {"app": "bench", "run": run},
            "annotations": {
                "topology.scheduler/gpu-count": "1",
                "agentaflow.gpu/scheduling-strategy": "best-fit",
                "kubectl.kubernetes.io/last-applied-configuration": json.dumps(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": name, "namespace": "bench"},
                        "spec": {
                            "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3"}]
                        },
                    }
                ),
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["python", "train.py"],
                    "env": [{"name": "EPOCHS", "value": "10"}],
                    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
                    "volumeMounts": [
                        {
                            "name": "kube-api-access",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "volumes": [
                {
                    "name": "kube-api-access",
                    "projected": {
                        "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]
                    },
                }
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": name,
            "namespace": "bench",
            "operation": "CREATE",
            "userInfo": {"username": "bench", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }
    return json.dumps(review, separators=(",", ":")).encode()


_CL = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


async def _generate(ports: list[int], ca_file: str, bodies: list[bytes], in_flight: int) -> dict:
    """`in_flight` connections, spread over `ports` in turn (one server, or several replicas), each sending
    the next body as soon as its answer is in."""
    ctx = ssl.create_default_context(cafile=ca_file)
    queue = iter(bodies)
    latencies: list[float] = []
    statuses: dict[str, int] = {}

    async def worker(port: int):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
        )
        try:
            for body in queue:
                request = (
                    b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body)
                ) + body
                started = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                data = await reader.readexactly(int(_CL.search(head).group(1)))
                latencies.append(time.perf_counter() - started)
                key = head[9:12].decode() + ("/allowed" if b'"allowed":true' in data else "/denied")
                statuses[key] = statuses.get(key, 0) + 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(ports[i % len(ports)]) for i in range(in_flight)))
    return {"elapsed": time.perf_counter() - started, "latencies": latencies, "statuses": statuses}


def _generator_process(conn, ports: list[int], ca_file: str, n: int, in_flight: int, run: str) -> None:
    bodies = [_pod_body(i, run) for i in range(n)]
    conn.send("ready")
    conn.recv()  # go
    conn.send(asyncio.run(_generate(ports, ca_file, bodies, in_flight)))


def load(port: int | list[int], ca_file: str, n: int, in_flight: int) -> dict:
    """Run the generator in another process; the server keeps serving in this one meanwhile."""
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(
        target=_generator_process,
        args=(child, port if isinstance(port, list) else [port], ca_file, n, in_flight, uuid.uuid4().hex[:6]),
    )
    proc.start()
    return {"proc": proc, "conn": parent}


async def run_load(
    port: int | list[int], ca_file: str, n: int, in_flight: int, servers: tuple[int, ...] = ()
) -> dict:
    """One load run; `servers`: the pids of server processes of their own (replicas) whose CPU the run's
    figures then count instead of this process's."""
    job = load(port, ca_file, n, in_flight)
    conn = job["conn"]
    await asyncio.to_thread(conn.recv)  # bodies encoded
    actor = actor_pid(os.getpid())  # this process's local Ray forked it
    actor_cpu = cpu_seconds(actor) if actor else 0.0
    loop_cpu = time.thread_time()  # this coroutine's thread: the event loop serving every admission here
    # the servers' CPU: this process's (the server(s) and Ray's driver threads, not the generator), or the
    # replica processes'
    cpu = sum(cpu_seconds(pid) for pid in servers) if servers else time.process_time()
    conn.send("go")
    result = await asyncio.to_thread(conn.recv)
    cpu = (sum(cpu_seconds(pid) for pid in servers) if servers else time.process_time()) - cpu
    loop_cpu = time.thread_time() - loop_cpu
    actor_cpu = (cpu_seconds(actor) - actor_cpu) if actor else 0.0
    job["proc"].join()
    lat = sorted(result["latencies"])
    result["server_cpu_us"] = cpu / max(len(lat), 1) * 1e6
    if not servers:  # (replicas have loops of their own)
        result["loop_cpu_us"] = loop_cpu / max(len(lat), 1) * 1e6
        result["loop_busy"] = loop_cpu / result["elapsed"]  # of one core
    result["actor_cpu_us"] = actor_cpu / max(len(lat), 1) * 1e6
    result["rate"] = len(lat) / result["elapsed"]
    result["p50_ms"] = lat[len(lat) // 2] * 1e3
    result["p99_ms"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3
    result["mean_ms"] = statistics.fmean(lat) * 1e3
    del result["latencies"]
    return result


# -------------------------------------------------------------------------------------------- the server side


def noop_app():
    from aiohttp import web

    answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}

    async def mutate(request):
        body = await request.json()
        return web.json_response(
            {**answer, "response": {"uid": body["request"]["uid"], "allowed": True}},
            dumps=lambda o: json.dumps(o, separators=(",", ":")),
        )

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    return app


def answer_only_app(answer: dict):
    """A handler that does none of the webhook's work but its transport: it decodes the body with the
    webhook's codec and answers a real mutate answer (the same patch, warnings and size, the request's uid).
    What the webhook costs over it is the admission's own work (request, placement, patch, signature, logs,
    metrics, the ledger calls), not HTTP, TLS, JSON or the answer's size."""
    from aiohttp import web

    from gpuledger.webhook.admission.review import dumps, loads

    async def mutate(request):
        body = loads(await request.read())
        response = dict(answer["response"], uid=body["request"]["uid"])
        return web.Response(body=dumps({**answer, "response": response}), content_type="application/json")

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    return app


def _replica_process(conn, kind: str, tls_dir: str, ray_address: str, actor: str, settings: dict) -> None:
    """One server in a process of its own, as a webhook Deployment's pod is: `kind` "webhook" (the shipped
    config, joined to the bench's Ray and its ledger actor, logging as `gpuledger serve` does) or "noop".
    Sends its port, serves until it is sent anything."""

    async def serve() -> None:
        from gpuledger.webhook.transport.server import start_server, tune_gc
        from gpuledger.webhook.transport.tls import ReloadingTLS

        tls = ReloadingTLS(f"{tls_dir}/tls.crt", f"{tls_dir}/tls.key", poll_interval_s=5)
        client = None
        if kind == "webhook":
            import ray

            from gpuledger.ray.actor import RAY_NAMESPACE
            from gpuledger.webhook.config import WebhookConfig
            from gpuledger.webhook.ledger.client import RayLedgerClient
            from gpuledger.webhook.logs import configure
            from gpuledger.webhook.transport.app import create_app

            ray.init(address=ray_address, namespace="gpuledger-bench", log_to_driver=False)
            client = RayLedgerClient(ray.get_actor(actor, namespace=RAY_NAMESPACE))
            config = WebhookConfig(
                hmac_key="bench-key", deadline_s=2.0, prefetch_depth=settings["prefetch_depth"]
            )
            app = create_app(config, client)
            if settings["log_level"]:
                configure("json", settings["log_level"], open(settings["log_file"], "a"))  # noqa: SIM115
        else:
            app = noop_app()
        server = await start_server(app, "127.0.0.1", 0, tls)
        tune_gc()
        conn.send(server.port)
        await asyncio.to_thread(conn.recv)
        if client is not None:
            await client.close()
        await server.stop()

    asyncio.run(serve())


def _port_of(proc, conn, timeout_s: float = 120.0) -> int:
    """The port a replica process serves on, once it listens; its failure to start is an error, not a hang."""
    if not conn.poll(timeout_s):
        raise RuntimeError(f"server process {proc.pid} did not start within {timeout_s:g}s")
    return conn.recv()


async def replicas_phase(args, tls_dir: Path, ca_file: str, actor: str, sweep) -> dict:
    """Throughput with 1 and with `args.replicas` server processes, webhook replicas against no-op servers,
    100 admissions in flight per process, one ledger actor: how admission grows with replicas on this
    machine's cores (docs/design/one-ledger-actor.md)."""
    import ray

    from gpuledger.webhook.config import WebhookConfig

    address = ray.get_runtime_context().gcs_address
    settings = {
        "prefetch_depth": args.prefetch_depth,
        "log_level": args.log_level,
        "log_file": str(tls_dir.parent / "replicas.log"),
    }
    out: dict = {}
    for kind in ("webhook", "noop"):
        for count in sorted({1, args.replicas}):
            procs = []
            for _ in range(count):
                parent, child = mp.Pipe()
                proc = mp.get_context("spawn").Process(
                    target=_replica_process, args=(child, kind, str(tls_dir), address, actor, settings)
                )
                proc.start()
                procs.append((proc, parent))
            try:
                ports = [await asyncio.to_thread(_port_of, proc, conn) for proc, conn in procs]
                pids = tuple(proc.pid for proc, _ in procs)
                await run_load(ports, ca_file, 400 * count, 20 * count, servers=pids)  # warm up
                await sweep()
                # what the replicas held ahead went with the sweep: let them age it out before measuring
                await asyncio.sleep(WebhookConfig().prefetch_max_age_s * 1.5)
                out[f"{kind}_{count}"] = await run_load(
                    ports, ca_file, args.requests, 100 * count, servers=pids
                )
                await sweep()
            finally:
                for _, conn in procs:
                    conn.send("stop")
                for proc, _ in procs:
                    proc.join(30)
    return out


async def sample_answer(config, cluster_file: str) -> dict:
    """One real mutate answer for a bench pod: the handler on an in-process ledger of the same cluster."""
    from gpuledger.service.ledger_service import LedgerService
    from gpuledger.webhook.admission.handler import AdmissionHandler
    from gpuledger.webhook.admission.review import encode_response, loads, parse_review
    from gpuledger.webhook.ledger.client import InProcessLedgerClient

    service = LedgerService(config.ledger_config(), {"kind": "file", "path": cluster_file}, time.time())
    review = parse_review(loads(_pod_body(0, "sample")))
    decision = await AdmissionHandler(config, InProcessLedgerClient(service, time.time)).mutate(review)
    assert decision.allowed and decision.patch, decision
    return encode_response(review.uid, decision, review.api_version)


def raw_call_cost(handle, n: int) -> dict:
    import ray

    ray.get(handle.ping.remote())
    started = time.perf_counter()
    for _ in range(n):
        ray.get(handle.ping.remote())
    sync_ms = (time.perf_counter() - started) / n * 1e3

    async def awaited():
        t = time.perf_counter()
        for _ in range(n):
            await handle.ping.remote()
        return (time.perf_counter() - t) / n * 1e3

    return {"sync_ms": sync_ms, "async_ms": asyncio.run(awaited())}


def in_cluster_call_cost(n: int) -> dict | None:
    """Join a separately started Ray (`ray start --head`) by address and time the same call."""
    ray_bin = Path(sys.executable).with_name("ray")
    if not ray_bin.exists():
        return None
    tmp = tempfile.mkdtemp(prefix="gpuledger-bench-ray-")
    port = 6390
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    out = subprocess.run(
        [
            str(ray_bin),
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            f"--temp-dir={tmp}",
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        print("ray start failed:", out.stderr[-500:], file=sys.stderr)
        return None
    try:
        code = (
            "import ray, time, json\n"
            f"ray.init(address='127.0.0.1:{port}', namespace='bench', log_to_driver=False)\n"
            "@ray.remote\nclass A:\n    async def ping(self): return 1\n"
            "a = A.options(num_cpus=0).remote(); ray.get(a.ping.remote())\n"
            f"t = time.perf_counter()\nfor _ in range({n}): ray.get(a.ping.remote())\n"
            f"print(json.dumps({{'sync_ms': (time.perf_counter() - t) / {n} * 1e3}}))\n"
        )
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        line = [x for x in res.stdout.splitlines() if x.startswith("{")]
        return json.loads(line[-1]) if line else None
    finally:
        # never `ray stop`: it stops every Ray on the machine, test suites' too
        stop_ray_under(tmp, gcs_port=port)
        shutil.rmtree(tmp, ignore_errors=True)


def stop_ray_under(temp_dir: str, grace_s: float = 5.0, gcs_port: int | None = None) -> None:
    """Stop the Ray processes started with `--temp-dir=temp_dir`, only those: the ones whose command line
    names it, the agents of their raylet (which retitle themselves, but carry its pid in RAY_RAYLET_PID), and
    the head's Ray client server (whose command line names only the GCS address, `gcs_port`)."""
    import contextlib
    import signal

    client_server = f":{gcs_port}\0".encode() if gcs_port else None
    raylets: set[bytes] = set()  # remembered: the agents outlive their raylet by a moment

    def mine() -> list[int]:
        pids, rest = [], []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if temp_dir.encode() in cmdline or (
                client_server and b"ray.util.client.server" in cmdline and client_server in cmdline
            ):
                pids.append(int(proc.name))
                if b"raylet" in cmdline.split(b"\0", 1)[0]:
                    raylets.add(proc.name.encode())
            else:
                rest.append(proc)
        for proc in rest:
            with contextlib.suppress(OSError):
                environ = (proc / "environ").read_bytes().split(b"\0")
                if any(b"RAY_RAYLET_PID=" + pid in environ for pid in raylets):
                    pids.append(int(proc.name))
        return pids

    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for pid in mine():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while mine() and time.monotonic() < deadline:
            time.sleep(0.1)


def raw_admission_rate(handle, n: int) -> float:
    """One admission per actor call, sequential: the rate of a webhook that did not batch."""
    import ray

    from gpuledger.core.pods.request import request_from_pod
    from gpuledger.service.ledger_service import AdmitCall

    pod = json.loads(_pod_body(0, "raw"))["request"]["object"]
    calls = [AdmitCall(request_from_pod(pod, None, None, f"raw-{i}", namespace="bench")) for i in range(n)]
    started = time.perf_counter()
    for call in calls:
        ray.get(handle.admit.remote([call]))
    rate = n / (time.perf_counter() - started)
    ray.get(handle.release.remote([c.request.id for c in calls]))
    return rate


async def serve_and_measure(args, handle, tls_dir: Path, ca_file: str) -> dict:
    import ray

    from gpuledger.webhook.config import WebhookConfig
    from gpuledger.webhook.ledger.client import RayLedgerClient
    from gpuledger.webhook.transport.app import HANDLER_KEY, METRICS_KEY, create_app
    from gpuledger.webhook.transport.server import start_server, tune_gc
    from gpuledger.webhook.transport.tls import ReloadingTLS

    def tls():
        return ReloadingTLS(str(tls_dir / "tls.crt"), str(tls_dir / "tls.key"), poll_interval_s=5)

    config = WebhookConfig(hmac_key="bench-key", deadline_s=2.0)
    # as shipped: the direct ledger channel (gpuledger.ray.channel) and the placements admitted ahead
    shipped = WebhookConfig(hmac_key="bench-key", deadline_s=2.0, prefetch_depth=args.prefetch_depth)
    client = RayLedgerClient(handle)
    webhook_app = create_app(shipped, client)
    webhook = await start_server(webhook_app, "127.0.0.1", 0, tls())

    async def sweep() -> None:
        """Empty the ledger between phases (nothing is ever stored); what the webhook held ahead went too."""
        await asyncio.to_thread(lambda: ray.get(handle.sweep.remote(time.time() + 1e6)))
        if webhook_app[HANDLER_KEY].prefetch is not None:
            webhook_app[HANDLER_KEY].prefetch.forget()

    def actor_seconds() -> float:
        """The ledger actor's own seconds on channel calls so far (ServiceStats.served)."""
        served = ray.get(handle.stats.remote()).served
        return sum(served.seconds.values()) if served is not None else 0.0

    def prefetched() -> tuple[float, float]:
        """The webhook's prefetch hits and misses so far (gpuledger_prefetch_total)."""
        registry = webhook_app[METRICS_KEY].registry
        hits, misses = (
            registry.get_sample_value("gpuledger_prefetch_total", {"outcome": outcome}) or 0.0
            for outcome in ("hit", "miss")
        )
        return hits, misses

    ray_only = await start_server(
        create_app(config, RayLedgerClient(handle, channel="off")), "127.0.0.1", 0, tls()
    )
    noop = await start_server(noop_app(), "127.0.0.1", 0, tls())
    answer_only = await start_server(
        answer_only_app(await sample_answer(config, args.cluster_file)), "127.0.0.1", 0, tls()
    )
    inproc = None
    if args.in_process:  # the same webhook on an in-process ledger: what Ray adds
        from gpuledger.service.ledger_service import LedgerService
        from gpuledger.webhook.ledger.client import InProcessLedgerClient

        service = LedgerService(
            config.ledger_config(), {"kind": "file", "path": args.cluster_file}, time.time()
        )
        inproc = await start_server(create_app(config, InProcessLedgerClient(service)), "127.0.0.1", 0, tls())
    tune_gc()  # as `gpuledger serve` does
    if args.log_level:  # as `gpuledger serve` logs: JSON lines (one per admission at INFO), here to a file
        from gpuledger.webhook.logs import configure

        configure("json", args.log_level, open(tls_dir.parent / "serve.log", "a"))  # noqa: SIM115
    results = {}
    try:
        await run_load(webhook.port, ca_file, 400, 20)  # warm up every path
        await run_load(ray_only.port, ca_file, 400, 20)
        await run_load(noop.port, ca_file, 400, 20)
        await run_load(answer_only.port, ca_file, 400, 20)
        await sweep()
        if args.profile:  # the webhook's own process, under the 100-in-flight load, by cProfile
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            await run_load(webhook.port, ca_file, args.requests // 2, 100)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(40)
            await sweep()
        for name, in_flight, n in (("throughput", 100, args.requests), ("latency", 20, args.requests // 2)):
            print(f"phase: webhook {name} ({n} admissions, {in_flight} in flight)", flush=True)
            calls_before, items_before = client.admissions.calls, client.admissions.items
            taken_before = prefetched()
            busy_before = await asyncio.to_thread(actor_seconds)
            results[f"webhook_{name}"] = await run_load(webhook.port, ca_file, n, in_flight)
            results[f"webhook_{name}"]["actor_busy_s"] = await asyncio.to_thread(actor_seconds) - busy_before
            hits, misses = (now - before for now, before in zip(prefetched(), taken_before, strict=True))
            results[f"webhook_{name}"]["prefetch_hit_share"] = hits / max(hits + misses, 1)
            calls = client.admissions.calls - calls_before
            results[f"webhook_{name}"]["mean_batch"] = (client.admissions.items - items_before) / max(
                calls, 1
            )
            # release everything (nothing is ever stored): each phase starts from an empty 8,000-GPU ledger
            await sweep()
            results[f"noop_{name}"] = await run_load(noop.port, ca_file, n, in_flight)
            results[f"answeronly_{name}"] = await run_load(answer_only.port, ca_file, n, in_flight)
            results[f"rayonly_{name}"] = await run_load(ray_only.port, ca_file, n, in_flight)
            await sweep()
            if inproc is not None:
                results[f"inproc_{name}"] = await run_load(inproc.port, ca_file, n, in_flight)
                service.sweep(time.time() + 1e6)
        # the rows' ratios again from alternated pairs of runs (the order flipped every pair): one long
        # phase of each reads whatever the host did in its minute, and one tail spike of either side moves a
        # p99 ratio by 2-4x (docs/benchmarks.md, "Admissions over TLS")
        for name, in_flight, n in (("throughput", 100, args.requests), ("latency", 20, args.requests // 2)):
            pairs = []
            for i in range(args.pairs):
                pair = {}
                for side in ("webhook", "noop") if i % 2 == 0 else ("noop", "webhook"):
                    port = webhook.port if side == "webhook" else noop.port
                    pair[side] = await run_load(port, ca_file, n, in_flight)
                    if side == "webhook":
                        await sweep()
                pairs.append(pair)
            results[f"pairs_{name}"] = pairs
        if args.replicas > 1:
            print(f"phase: 1 and {args.replicas} server processes, 100 in flight each", flush=True)
            results["replicas"] = await replicas_phase(args, tls_dir, ca_file, args.actor_name, sweep)
    finally:
        results["channel_calls"] = client.channel_calls
        await client.close()
        await webhook.stop()
        await ray_only.stop()
        await noop.stop()
        await answer_only.stop()
        if inproc is not None:
            await inproc.stop()
    return results


def pair_ratios(pairs: list[dict], key: str) -> list[float]:
    """webhook / no-op of `key` in each alternated pair."""
    return [pair["webhook"][key] / pair["noop"][key] for pair in pairs]


def _listed(ratios: list[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--requests", type=int, default=7000, help="requests in the 100-in-flight phase")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--in-process", action="store_true", help="also measure the webhook on an in-process ledger (no Ray)"
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--prefetch-depth",
        type=int,
        default=shipped_setting("prefetch_depth", 0),
        help="the webhook's prefetch_depth (default: what manifests/config/config.yaml ships; 0 = off)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the webhook's process under load first"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="alternated webhook / no-op pairs, each as long as a phase, for the ratio rows' medians",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="also measure this many webhook replicas (and no-op servers), each a process of its own "
        "sharing the one ledger actor, against one of each (default 1: not measured)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="the process's log level (default INFO, as `gpuledger serve` ships: one JSON line per "
        "admission, written to a file in the run's temporary directory; '' leaves logging unconfigured)",
    )
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs}: the ratio rows need at least 1 pair")
    if args.quick:
        args.nodes, args.requests = 100, 1500
    import ray
    import yaml

    from gpuledger.certs.pki import make_ca, make_serving_cert, write_bundle
    from gpuledger.ray.actor import get_or_create_ledger, wait_ready
    from gpuledger.webhook.config import WebhookConfig
    from tests.webhook.webhook_support import cluster

    workdir = Path(tempfile.mkdtemp(prefix="gpuledger-bench-"))
    try:
        ca = make_ca()
        tls_paths = write_bundle(workdir / "tls", ca, make_serving_cert(ca, ["localhost"], ["127.0.0.1"]))
        cluster_file = workdir / "cluster.yaml"
        cluster_file.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": cluster(
                        args.nodes,
                        args.gpus,
                        leaves=max(1, args.nodes // 32),
                        spines=max(1, args.nodes // 256),
                    ),
                }
            )
        )
        args.cluster_file = str(cluster_file)
        args.actor_name = f"bench-{uuid.uuid4().hex[:6]}"
        ray.init(
            address="local",
            namespace="gpuledger-bench",
            include_dashboard=False,
            num_cpus=1,
            log_to_driver=False,
        )
        config = WebhookConfig(hmac_key="bench-key")
        handle = get_or_create_ledger(
            config.ledger_config(),
            {"kind": "file", "path": str(cluster_file)},
            name=args.actor_name,
            sweep_interval_s=0,
        )
        status = wait_ready(handle, timeout_s=300)
        print(
            f"ledger: {status['nodes']} nodes, {args.nodes * args.gpus} GPUs; Ray {ray.__version__}; "
            f"{os.cpu_count()} CPUs",
            flush=True,
        )
        local = raw_call_cost(handle, 500)
        raw_rate = raw_admission_rate(handle, 500)
        results = asyncio.run(serve_and_measure(args, handle, workdir / "tls", str(tls_paths["ca.crt"])))
        ray.shutdown()
        in_cluster = in_cluster_call_cost(500)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    t, lt = results["webhook_throughput"], results["webhook_latency"]
    nt, nl = results["noop_throughput"], results["noop_latency"]
    print()
    print(
        f"raw Ray actor call (local, Ray started in-process): {local['sync_ms']:.3f} ms blocking, "
        f"{local['async_ms']:.3f} ms awaited"
    )
    if in_cluster:
        print(f"raw Ray actor call (in-cluster, joined by address): {in_cluster['sync_ms']:.3f} ms blocking")
    print(f"raw Ray admission rate (1 admission per call, sequential): {raw_rate:,.0f}/s")
    print()
    print(f"{'scenario':<34}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'CPU us':>8}  statuses")
    rows = [
        ("webhook, 100 in flight", t),
        ("no-op aiohttp, 100 in flight", nt),
        ("webhook, 20 in flight", lt),
        ("no-op aiohttp, 20 in flight", nl),
        ("real answer, no work, 100", results["answeronly_throughput"]),
        ("real answer, no work, 20", results["answeronly_latency"]),
        ("webhook Ray calls only, 100", results["rayonly_throughput"]),
        ("webhook Ray calls only, 20", results["rayonly_latency"]),
    ]
    if "inproc_throughput" in results:
        rows += [
            ("webhook no Ray, 100 in flight", results["inproc_throughput"]),
            ("webhook no Ray, 20 in flight", results["inproc_latency"]),
        ]
    for label, r in rows:
        print(
            f"{label:<34}{r['rate']:>9,.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{r['server_cpu_us']:>8.0f}"
            f"  {r['statuses']}"
        )
    for label, r in (("100 in flight", t), ("20 in flight", lt)):
        print(
            f"where the webhook's CPU went, {label}: its event loop's thread {r['loop_cpu_us']:.0f} us an "
            f"admission ({r['loop_cpu_us'] / r['server_cpu_us']:.0%} of the process's, the loop busy "
            f"{r['loop_busy']:.0%} of a core), the ledger actor's process {r['actor_cpu_us']:.0f} us"
        )
    for label, r in (("100 in flight", t), ("20 in flight", lt)):
        # the actor's own counters (gpuledger_ledger_actor_call_seconds_total): its loop's share, and the rate
        # at which it would be full
        share = r["actor_busy_s"] / r["elapsed"]
        own_us = r["actor_busy_s"] / (r["rate"] * r["elapsed"]) * 1e6
        full = r["rate"] / share if share else 0.0
        print(
            f"the ledger actor's loop on channel calls, {label}: busy {share:.0%} of the time at "
            f"{r['rate']:,.0f} admissions/s ({own_us:.0f} us an admission, batches of "
            f"{r['mean_batch']:.1f}): full at ~{full:,.0f}/s of these mutations"
        )
    print()
    rt, rl = results["rayonly_throughput"], results["rayonly_latency"]
    print(
        f"one long phase each: throughput at 100 in flight / no-op: {t['rate'] / nt['rate']:.2f}x (Ray calls "
        f"only: {rt['rate'] / nt['rate']:.2f}x); p99 at 20 in flight / no-op p99: "
        f"{lt['p99_ms'] / nl['p99_ms']:.2f}x (Ray calls only: {rl['p99_ms'] / nl['p99_ms']:.2f}x)"
    )
    if results.get("pairs_throughput"):
        rates = pair_ratios(results["pairs_throughput"], "rate")
        p99s = pair_ratios(results["pairs_latency"], "p99_ms")
        p50s = pair_ratios(results["pairs_latency"], "p50_ms")
        print(
            f"the ratio rows, medians of {len(rates)} alternated webhook / no-op pairs: throughput at 100 in "
            f"flight / no-op: {statistics.median(rates):.2f}x (goal >= 0.6; pairs {_listed(rates)}); "
            f"p99 at 20 in flight / no-op p99: {statistics.median(p99s):.2f}x (goal <= 2; pairs "
            f"{_listed(p99s)}; p50 "
            f"{statistics.median(p50s):.2f}x); ledger calls over the channel: {results['channel_calls']}; "
            f"prefetch_depth {args.prefetch_depth}; log level {args.log_level or 'unconfigured'}"
        )
        cpu = pair_ratios(results["pairs_throughput"], "server_cpu_us")
        print(
            f"the same pairs' CPU per admission at 100 in flight, webhook / no-op: "
            f"{statistics.median(cpu):.2f}x (pairs {_listed(cpu)})"
        )
    at, al = results["answeronly_throughput"], results["answeronly_latency"]
    print(
        f"the same transport answering a real patch and doing no work / no-op: throughput "
        f"{at['rate'] / nt['rate']:.2f}x, p99 {al['p99_ms'] / nl['p99_ms']:.2f}x; CPU per admission over it: "
        f"webhook {t['server_cpu_us'] - at['server_cpu_us']:.0f} us (its own work), no-op "
        f"{nt['server_cpu_us'] - at['server_cpu_us']:.0f} us"
    )
    print(
        f"webhook / no-op aiohttp throughput: {t['rate'] / nt['rate']:.2f}x; "
        f"webhook / raw Ray admission rate: {t['rate'] / raw_rate:.1f}x; "
        f"mean batch per actor call: {t['mean_batch']:.1f} (100 in flight), {lt['mean_batch']:.1f} (20); "
        f"placed from the prefetch (no ledger call on the pod's time): {t['prefetch_hit_share']:.0%} (100 in "
        f"flight), {lt['prefetch_hit_share']:.0%} (20)"
    )
    print(
        f"targets: >= 2,000 admissions/s at 100 in flight: {'met' if t['rate'] >= 2000 else 'NOT met'} "
        f"({t['rate']:,.0f}/s); p99 <= 25 ms at 20 in flight: {'met' if lt['p99_ms'] <= 25 else 'NOT met'} "
        f"({lt['p99_ms']:.1f} ms)"
    )
    if "replicas" in results:
        reps, n = results["replicas"], args.replicas
        w1, wn, n1, nn = reps["webhook_1"], reps[f"webhook_{n}"], reps["noop_1"], reps[f"noop_{n}"]
        print(
            f"replicas, each a process of its own (100 in flight each, one ledger actor, {os.cpu_count()} "
            f"CPUs): webhook 1: {w1['rate']:,.0f}/s, {n}: {wn['rate']:,.0f}/s "
            f"({wn['rate'] / w1['rate']:.2f}x; "
            f"CPU {w1['server_cpu_us']:.0f} / {wn['server_cpu_us']:.0f} us an admission, the actor "
            f"{w1['actor_cpu_us']:.0f} / {wn['actor_cpu_us']:.0f} us); no-op 1: {n1['rate']:,.0f}/s, {n}: "
            f"{nn['rate']:,.0f}/s ({nn['rate'] / n1['rate']:.2f}x); webhook / no-op at {n}: "
            f"{wn['rate'] / nn['rate']:.2f}x"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "results": results,
                    "raw_call": local,
                    "in_cluster_call": in_cluster,
                    "raw_admission_rate": raw_rate,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
