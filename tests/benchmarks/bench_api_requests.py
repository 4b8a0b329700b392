"""The webhook's own requests to the API server, an Event POST and an owner GET, over its kept-alive
connections (gpuledger.webhook.kube.api) against the ways it made them before, in the same run.

    .venv/bin/python tests/benchmarks/bench_api_requests.py            # ~40 s
    .venv/bin/python tests/benchmarks/bench_api_requests.py --loops 4  # a quick look

One control plane (etcd + kube-apiserver). Each way runs `--requests` requests in a loop, one at a time, the
ways alternated `--loops` times so drift hits all of them; printed: the median of the loops, per request, of
the wall time and of this process's CPU (`time.process_time`: the calling thread and the threads it hands work
to), and each way's ratio to the webhook's.
- Event POST: `ApiEventWriter.create` (gpuledger.webhook.kube.event_writer) | an aiohttp session | the
  `kubernetes` client's `create_namespaced_event` on a thread.
- Owner GET (a Deployment): `KubeObjectReader` (gpuledger.webhook.admission.owners) | the `kubernetes`
  client's `get_namespaced_custom_object` on a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_pod_create import read_answer  # noqa: E402

NS = "bench-api"


def event_body(poster, name: str) -> dict:
    from gpuledger.webhook.kube.events import AdmissionEvent, ObjectRef

    ref = ObjectRef("v1", "Pod", NS, name, "uid-1")
    return poster.body(AdmissionEvent("GPUPlaced", "Normal", "placed on node-1 devices 0", NS, involved=ref))


async def measure(cp, requests: int, loops: int) -> dict[str, dict[str, float]]:
    import aiohttp
    from kubernetes import client

    from gpuledger.webhook.admission.owners import KubeObjectReader
    from gpuledger.webhook.kube.event_writer import ApiEventWriter
    from gpuledger.webhook.kube.events import EventPoster

    api = cp.api_client()
    writer = ApiEventWriter(api)
    poster = EventPoster(writer)

    def body() -> dict:  # a fresh Event name each time, as the poster makes one per Event
        return event_body(poster, "pod-x")

    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    reader = KubeObjectReader(api)
    tls = writer.api._tls()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls if tls is not None else False))
    base = writer.api.base

    async def aiohttp_post() -> None:
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            **writer.api._auth_headers(),
        }
        data = json.dumps(body(), separators=(",", ":"))
        async with session.post(f"{base}/api/v1/namespaces/{NS}/events", data=data, headers=headers) as resp:
            await resp.read()
            assert resp.status < 300, resp.status

    async def kube_post() -> None:
        def post() -> None:  # the answer read, so its connection is kept alive (bench_pod_create.read_answer)
            read_answer(core.create_namespaced_event(NS, body(), _preload_content=False))

        await asyncio.to_thread(post)

    async def kube_get() -> None:
        def read() -> dict:
            resp = custom.get_namespaced_custom_object(
                "apps", "v1", NS, "deployments", "web", _preload_content=False
            )
            return json.loads(resp.data)  # type: ignore[attr-defined]

        assert (await asyncio.to_thread(read))["metadata"]["name"] == "web"

    async def ours_get() -> None:
        assert (await reader("Deployment", NS, "web"))["metadata"]["name"] == "web"  # type: ignore[index]

    ways = {
        "Event POST, webhook (kube_api)": lambda: writer.create(NS, body()),
        "Event POST, aiohttp session": aiohttp_post,
        "Event POST, kubernetes client": kube_post,
        "owner GET, webhook (kube_api)": ours_get,
        "owner GET, kubernetes client": kube_get,
    }
    walls: dict[str, list[float]] = {k: [] for k in ways}
    cpus: dict[str, list[float]] = {k: [] for k in ways}
    try:
        for way in ways.values():  # warm every path (connections, TLS sessions, imports)
            for _ in range(5):
                await way()
        for loop in range(loops):
            order = list(ways) if loop % 2 == 0 else list(reversed(ways))
            for name in order:
                way = ways[name]
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(requests):
                    await way()
                walls[name].append((time.perf_counter() - t0) / requests * 1e3)
                cpus[name].append((time.process_time() - c0) / requests * 1e6)
    finally:
        await session.close()
        await writer.close()
        await reader.close()
    return {k: {"wall_ms": statistics.median(walls[k]), "cpu_us": statistics.median(cpus[k])} for k in ways}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=200, help="requests per loop and way")
    p.add_argument("--loops", type=int, default=8)
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)

    from devcluster.cluster import ControlPlane, missing_binaries

    if missing_binaries(with_controllers=False):
        print("kube-apiserver missing: run `make apiserver`", file=sys.stderr)
        return 2
    with ControlPlane(with_controllers=False) as cp:
        cp.create_namespace(NS, admission=False, users=())
        template = {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        cp.apply(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "namespace": NS},
                "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template},
            }
        )
        figures = asyncio.run(measure(cp, args.requests, args.loops))
    print(
        f"the webhook's own API requests, {args.loops} alternated loops x {args.requests} requests, medians"
    )
    print(f"{'way':34s} {'wall ms':>8s} {'CPU us':>8s}  {'CPU / webhook':>13s}")
    for name, f in figures.items():
        ours = figures[name.split(",")[0] + ", webhook (kube_api)"]
        print(f"{name:34s} {f['wall_ms']:8.2f} {f['cpu_us']:8.0f}  {f['cpu_us'] / ours['cpu_us']:12.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
