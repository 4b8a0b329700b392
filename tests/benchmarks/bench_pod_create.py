"""Pod-create latency through the real kube-apiserver, with the gpuledger webhooks in the path and without.

    .venv/bin/python tests/benchmarks/bench_pod_create.py                 # full run (about 40 s)
    .venv/bin/python tests/benchmarks/bench_pod_create.py --rounds 2      # a quick look

One control plane (etcd + kube-apiserver), the sample 16-node / 128-GPU cluster, and the product as it is
deployed: `gpuledger serve` in its own process (local Ray ledger actor, cluster sync, TLS webhook), with the
mutating and validating registrations. The same 1-GPU pod is created in a namespace opted in to admission
(both webhooks called) and in one that is not (the baseline: the same API server, the same registrations, only
the namespaceSelector differs), alternating in rounds so drift hits both. A third mode registers a pair of
no-op webhooks (allow everything, same TLS, own process): the floor any two admission webhooks cost here.
Each sample is one `create` call from a client holding a keep-alive connection, one request in flight
(`--clients` > 1 adds parallel clients). Between rounds the pods are deleted and the ledger drains. Besides
the client's times it prints the API server's own (its /metrics around each mode's rounds): the POST, and each
webhook call, which is where the webhooks' share of a create shows.

`--delete-to-free N` then measures the delete-to-free delay (docs/webhook.md, "Placement integrity"): N
1-GPU pods admitted through the webhook and confirmed, then each deleted in turn, timed from the delete call
until the ledger counts one more free GPU (its stats, fetched from the ledger on each /metrics scrape).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_webhook import shipped_setting  # noqa: E402
from tests.benchmarks.proc_cpu import actor_pid, cpu_seconds  # noqa: E402


def read_answer(resp) -> bytes:
    """The whole answer of a `_preload_content=False` call, read as a client reads it: only then does urllib3
    put the connection back in its pool, so the next call reuses it (unread, every call opened a new TLS
    connection, and its handshake was most of a baseline create)."""
    return resp.data


def pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["python", "train.py"],
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1"},
                        "requests": {"cpu": "1", "memory": "4Gi"},
                    },
                }
            ]
        },
    }


def noop_app():
    """A webhook that allows everything: the cost of any admission webhook here (TLS, HTTP, JSON, Python)."""
    from aiohttp import web

    async def allow(request: web.Request) -> web.Response:
        review = await request.json()
        return web.json_response(
            {
                "apiVersion": review["apiVersion"],
                "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True},
            }
        )

    app = web.Application()
    app.router.add_post("/mutate", allow)
    app.router.add_post("/validate", allow)
    return app


def serve_noop(port: int, cert: str, key: str) -> None:
    import asyncio
    import ssl

    from aiohttp import web

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    async def run() -> None:
        runner = web.AppRunner(noop_app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
        print("listening", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


def register_noop(cp, url: str, ca_pem: bytes) -> None:
    """The same two registrations as gpuledger's, renamed and selecting only the `noop` namespace."""
    from devcluster.webhooks import webhook_configurations

    configs = webhook_configurations(url, ca_pem, "Fail", 10)
    for config in configs:
        config["metadata"]["name"] += "-noop"
        for hook in config["webhooks"]:
            hook["name"] = "noop-" + hook["name"]
            hook["namespaceSelector"] = {"matchLabels": {"bench/noop": "enabled"}}
    cp.apply(configs)


def metric_sum(text: str, metric: str, *selectors: str) -> tuple[float, float]:
    """A histogram's (sum, count) over its lines holding every one of `selectors` (label text)."""
    sums = counts = 0.0
    for line in text.splitlines():
        if not all(selector in line for selector in selectors):
            continue
        if line.startswith(metric + "_sum"):
            sums += float(line.rsplit(" ", 1)[1])
        elif line.startswith(metric + "_count"):
            counts += float(line.rsplit(" ", 1)[1])
    return sums, counts


def metric_median_bound(text: str, metric: str, *selectors: str) -> float:
    """The histogram bucket bound (ms) at or below which half the observations lie (summed over the lines
    holding every one of `selectors`)."""
    by_bound: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(metric + "_bucket") or not all(selector in line for selector in selectors):
            continue
        bound = line.split('le="', 1)[1].split('"', 1)[0]
        le = float("inf") if bound == "+Inf" else float(bound)
        by_bound[le] = by_bound.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    total = by_bound.get(float("inf"), 0.0)
    for le in sorted(by_bound):
        if total and by_bound[le] >= total / 2:
            return le * 1e3
    return float("nan")


def server_breakdown(webhook) -> dict[str, float]:
    """Milliseconds inside the webhook per route, and per ledger answer, from its own /metrics: the mean
    (warm-up and probes included, so outliers weigh) and the histogram bucket holding the median."""
    text = webhook.get("/metrics")[1]
    out = {}
    for name, metric, *selectors in (
        ("mutate", "gpuledger_admission_duration_seconds", 'route="mutate"'),
        ("validate", "gpuledger_admission_duration_seconds", 'route="validate"'),
        ("ledger_admit", "agentaflow_scheduling_duration"),
        ("ledger_claim", "gpuledger_ledger_claim_duration_seconds"),
    ):
        s, c = metric_sum(text, metric, *selectors)
        out[name] = s / c * 1e3 if c else float("nan")
        out[f"{name} p50<="] = metric_median_bound(text, metric, *selectors)
    return out


def actor_per_call(webhook) -> dict[str, tuple[float, float]]:
    """(calls, mean ms) of each method the ledger actor served over the channel, by its own count (exported
    by the webhook from the actor's stats): the ledger's side of each round trip."""
    calls = labelled_counts(webhook, "gpuledger_ledger_actor_calls_total", "method")
    seconds = labelled_counts(webhook, "gpuledger_ledger_actor_call_seconds_total", "method")
    return {m: (n, seconds.get(m, 0.0) / n * 1e3) for m, n in sorted(calls.items()) if n}


def labelled_counts(webhook, metric: str, label: str) -> dict[str, float]:
    """A counter's samples by one label's value, from the webhook's /metrics."""
    import re

    text = webhook.get("/metrics")[1]
    pattern = rf'^{metric}\{{{label}="(\w+)"\}} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


def prefetch_counts(webhook) -> dict[str, float]:
    """gpuledger_prefetch_total by outcome."""
    return labelled_counts(webhook, "gpuledger_prefetch_total", "outcome")


def allocation_ratio(webhook) -> float | None:
    return webhook.metric("topology_gpu_allocation_ratio")


# what the API server itself times, per pod create: the whole POST, and each webhook call (the HTTP exchange,
# the answer's decoding and, for a mutating one, its patch applied)
API_TIMINGS = {
    "POST pods": (
        "apiserver_request_duration_seconds",
        'resource="pods",scope="resource",subresource="",verb="POST"',
    ),
    "mutating call": (
        "apiserver_admission_webhook_admission_duration_seconds",
        'operation="CREATE"',
        'type="admit"',
    ),
    "validating call": (
        "apiserver_admission_webhook_admission_duration_seconds",
        'operation="CREATE"',
        'type="validating"',
    ),
}


def api_timings(cp) -> dict[str, tuple[float, float]]:
    """(seconds, count) so far of each of API_TIMINGS, from the API server's /metrics."""
    text = cp.get_path("/metrics")[1]
    return {what: metric_sum(text, metric, *selectors) for what, (metric, *selectors) in API_TIMINGS.items()}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _try_create(cp, namespace: str, name: str) -> bool:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CoreV1Api(cp.api_client())
    try:
        read_answer(api.create_namespaced_pod(namespace, pod(name), _preload_content=False))
        return True
    except ApiException:
        return False


def create_round(cp, namespace: str, count: int, clients: int, tag: str) -> list[float]:
    from kubernetes import client

    apis = [client.CoreV1Api(cp.api_client()) for _ in range(clients)]
    for api in apis:  # open each keep-alive connection before timing
        api.list_namespaced_pod(namespace, limit=1)
    samples: list[float] = []
    lock = threading.Lock()

    def run(k: int) -> None:
        mine = []
        for i in range(k, count, clients):
            started = time.perf_counter()
            read_answer(apis[k].create_namespaced_pod(namespace, pod(f"{tag}-{i}"), _preload_content=False))
            mine.append(time.perf_counter() - started)
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples


def drain(cp, webhook, namespaces: list[str]) -> None:
    from kubernetes import client

    core = client.CoreV1Api(cp.api_client())
    for ns in namespaces:  # unbound pods (affinity binding, no kubelet) go at once
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    cp.wait_for(lambda: all(not cp.pods(ns) for ns in namespaces), timeout=60, what="pods deleted")
    cp.wait_for(lambda: allocation_ratio(webhook) == 0.0, timeout=60, interval=0.2, what="ledger drained")


def delete_to_free(cp, webhook, namespace: str, count: int, timeout: float) -> tuple[list[float], int]:
    """Seconds from each pod's delete call until the ledger shows its GPU free, and how many waits ran past
    `timeout` (left out of the samples)."""
    from kubernetes import client

    core = client.CoreV1Api(cp.api_client())
    names = [f"free-{i}" for i in range(count)]
    for name in names:
        read_answer(core.create_namespaced_pod(namespace, pod(name), _preload_content=False))
    cp.wait_for(
        lambda: (
            webhook.metric("agentaflow_workloads_running") == count
            and webhook.metric("agentaflow_workloads_pending") == 0
        ),
        timeout=60,
        interval=0.1,
        what=f"{count} reservations confirmed",
    )
    samples: list[float] = []
    late = 0
    for name in names:
        free_before = webhook.metric("agentaflow_gpu_available")
        started = time.perf_counter()
        read_answer(
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0, _preload_content=False)
        )
        while webhook.metric("agentaflow_gpu_available") <= free_before:
            if time.perf_counter() - started > timeout:
                late += 1
                break
        else:
            samples.append(time.perf_counter() - started)
    return samples, late


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument(
        "--pods", type=int, default=100, help="pods per round and mode (at most 128: one GPU each)"
    )
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--json", help="write the figures here too")
    p.add_argument(
        "--delete-to-free",
        type=int,
        nargs="?",
        const=20,
        default=0,
        metavar="N",
        help="after the rounds, time delete-to-free for N webhook-admitted pods, one at a time (N: 20)",
    )
    p.add_argument(
        "--ledger-channel",
        default="auto",
        choices=("auto", "off", "loopback", "node-ip"),
        help="the webhook's ledger_channel (off: every ledger call through Ray)",
    )
    p.add_argument(
        "--no-events", action="store_true", help="serve with --no-events (no GPUPlaced Events posted)"
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        help="gpuledger serve's log level (default INFO, as shipped: one JSON line per admission, to the "
        "process's log file)",
    )
    p.add_argument(
        "--prefetch-depth",
        type=int,
        default=shipped_setting("prefetch_depth", 0),
        help="the webhook's prefetch_depth: placements admitted ahead per pod shape (default: what "
        "manifests/config/config.yaml ships; 0 = off)",
    )
    p.add_argument("--free-timeout", type=float, default=10.0, help="longest wait for one freed GPU, seconds")
    p.add_argument("--serve-noop", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tls-cert", help=argparse.SUPPRESS)
    p.add_argument("--tls-key", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.serve_noop:
        serve_noop(args.port, args.tls_cert, args.tls_key)
        return 0

    from devcluster.cluster import ControlPlane, free_port, missing_binaries
    from devcluster.nodes import create_nodes, make_sample_cluster
    from devcluster.serve_process import GpuledgerServe, ServedProcess

    if missing_binaries(with_controllers=False):
        print("kube-apiserver missing: run `make apiserver`", file=sys.stderr)
        return 2
    served: list = []
    with ControlPlane(with_controllers=False) as cp:
        try:
            create_nodes(cp.api_client(), make_sample_cluster())
            settings = {"ledger_channel": args.ledger_channel, "prefetch_depth": args.prefetch_depth}
            webhook = GpuledgerServe(
                cp,
                settings,
                *(["--no-events"] if args.no_events else []),
                "--log-level",  # the last one counts: GpuledgerServe's own WARNING is for the tests
                args.log_level,
                "--log-format",
                "json",
            )
            served.append(webhook)
            tls, noop_port = webhook.tls, free_port()
            noop = ServedProcess(
                [
                    sys.executable,
                    __file__,
                    "--serve-noop",
                    "--port",
                    str(noop_port),
                    "--tls-cert",
                    str(tls["tls.crt"]),
                    "--tls-key",
                    str(tls["tls.key"]),
                ],
                f"https://127.0.0.1:{noop_port}",
                str(tls["ca.crt"]),
                webhook.workdir / "noop.log",
            )
            served.append(noop)
            webhook.wait("/readyz")
            webhook.register("Fail", 10)
            register_noop(cp, noop.url, webhook.ca.cert_pem)
            cp.create_namespace("bench-webhook", admission=True, users=())
            cp.create_namespace("bench-plain", admission=False, users=())
            cp.apply(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": "bench-noop", "labels": {"bench/noop": "enabled"}},
                }
            )
            modes = {"webhook": "bench-webhook", "baseline": "bench-plain", "noop": "bench-noop"}
            for mode, ns in modes.items():  # warm every path (connections, TLS sessions, caches)
                cp.wait_for(
                    lambda ns=ns, mode=mode: _try_create(cp, ns, f"probe-{mode}"),
                    timeout=30,
                    what=f"{mode} path up",
                )
                create_round(cp, ns, args.warmup, 1, f"warm-{mode}")
            drain(cp, webhook, list(modes.values()))
            samples: dict[str, list[float]] = {m: [] for m in modes}
            # CPU of the processes that answer admissions, per mode's rounds: the gpuledger webhook process
            # (handler, channel client, cluster sync), its ledger actor, the no-op webhook process
            watched = {
                "webhook": webhook.proc.pid,
                "actor": actor_pid(webhook.proc.pid),
                "noop": noop.proc.pid,
            }
            cpu: dict[str, dict[str, float]] = {m: dict.fromkeys(watched, 0.0) for m in modes}
            api: dict[str, dict[str, tuple[float, float]]] = {
                m: dict.fromkeys(API_TIMINGS, (0.0, 0.0)) for m in modes
            }
            for r in range(args.rounds):
                order = list(modes) if r % 2 == 0 else list(reversed(modes))
                for mode in order:
                    before = {k: cpu_seconds(pid) if pid else 0.0 for k, pid in watched.items()}
                    api_before = api_timings(cp)
                    samples[mode] += create_round(cp, modes[mode], args.pods, args.clients, f"r{r}-{mode}")
                    for what, (seconds, count) in api_timings(cp).items():
                        spent, calls = api[mode][what]
                        api[mode][what] = (
                            spent + seconds - api_before[what][0],
                            calls + count - api_before[what][1],
                        )
                    time.sleep(0.1)  # the sync's linger: the round's last events reach the actor
                    for k, pid in watched.items():
                        cpu[mode][k] += (cpu_seconds(pid) if pid else 0.0) - before[k]
                drain(cp, webhook, list(modes.values()))
            inside = server_breakdown(webhook)
            actor_calls = actor_per_call(webhook)
            ahead = prefetch_counts(webhook)
            found = labelled_counts(webhook, "gpuledger_events_pods_found_total", "by")
            freed, late = (
                delete_to_free(cp, webhook, modes["webhook"], args.delete_to_free, args.free_timeout)
                if args.delete_to_free
                else ([], 0)
            )
        finally:
            for server in reversed(served):
                server.stop()
    figures = {
        mode: {
            "n": len(v),
            "median_ms": statistics.median(v) * 1e3,
            "p99_ms": percentile(v, 0.99) * 1e3,
            "mean_ms": statistics.fmean(v) * 1e3,
        }
        for mode, v in samples.items()
    }
    ratio_median = figures["webhook"]["median_ms"] / figures["baseline"]["median_ms"]
    ratio_p99 = figures["webhook"]["p99_ms"] / figures["baseline"]["p99_ms"]
    print(
        f"pod create through kube-apiserver, {args.rounds} rounds x {args.pods} pods per mode, "
        f"{args.clients} client(s)"
    )
    print(f"{'mode':<10} {'n':>5} {'median ms':>10} {'p99 ms':>8} {'mean ms':>8}")
    for mode, f in figures.items():
        print(f"{mode:<10} {f['n']:>5} {f['median_ms']:>10.2f} {f['p99_ms']:>8.2f} {f['mean_ms']:>8.2f}")
    print(
        f"webhook / baseline: median x{ratio_median:.2f} (+{(ratio_median - 1) * 100:.0f}%), "
        f"p99 x{ratio_p99:.2f}; goal: median within +15%"
    )
    noop_ratio = figures["noop"]["median_ms"] / figures["baseline"]["median_ms"]
    print(
        f"no-op webhooks / baseline: median x{noop_ratio:.2f} (the floor for any pair of admission webhooks)"
    )
    noop_pair = figures["webhook"]["median_ms"] / figures["noop"]["median_ms"]
    print(
        f"gpuledger webhooks / a pair of no-op webhooks: median x{noop_pair:.2f} "
        "(goal <= 1.2), "
        f"p99 x{figures['webhook']['p99_ms'] / figures['noop']['p99_ms']:.2f}; "
        f"ledger_channel {args.ledger_channel}, prefetch_depth {args.prefetch_depth}, "
        f"log level {args.log_level}"
        f"{', no Events' if args.no_events else ''}"
    )
    print(
        "inside the gpuledger webhook (means; p50<= the histogram bucket holding the median): "
        + ", ".join(f"{k.removesuffix('_ms')} {v:.2f} ms" for k, v in inside.items())
    )
    if actor_calls:
        print(
            "the ledger actor's own time per channel call (means, warm-up included; frame read to answer "
            "encoded): " + ", ".join(f"{m} {ms:.3f} ms ({n:.0f})" for m, (n, ms) in actor_calls.items())
        )
    if ahead:
        print(
            "placements admitted ahead (warm-up included): "
            + ", ".join(f"{k} {v:.0f}" for k, v in sorted(ahead.items()))
        )
    if found:
        print(
            "placed pods found for their Events (warm-up included): "
            + ", ".join(f"by {k} {v:.0f}" for k, v in sorted(found.items()))
        )
    cpu_us = {m: {k: v / len(samples[m]) * 1e6 for k, v in c.items()} for m, c in cpu.items()}
    print(
        "CPU per pod created (us), by the mode's rounds: gpuledger webhook process "
        f"{cpu_us['webhook']['webhook']:.0f} + its ledger actor {cpu_us['webhook']['actor']:.0f} "
        f"(in the baseline's rounds, the sync alone: {cpu_us['baseline']['webhook']:.0f} + "
        f"{cpu_us['baseline']['actor']:.0f}); no-op webhook process {cpu_us['noop']['noop']:.0f}"
        + ("" if watched["actor"] else " (the actor's process was not found: 0)")
    )
    if cpu_us["noop"]["noop"]:  # the no-op does fixed work per pod: this run's yardstick of the host
        print(
            "  per the no-op webhook process's CPU (host-independent): gpuledger webhook process "
            f"{cpu_us['webhook']['webhook'] / cpu_us['noop']['noop']:.2f}x, with its actor "
            f"{(cpu_us['webhook']['webhook'] + cpu_us['webhook']['actor']) / cpu_us['noop']['noop']:.2f}x"
        )
    api_ms = {
        m: {what: spent / calls * 1e3 if calls else float("nan") for what, (spent, calls) in t.items()}
        for m, t in api.items()
    }
    print(
        "as the API server times them (means, ms): POST pods: "
        + ", ".join(f"{m} {api_ms[m]['POST pods']:.2f}" for m in modes)
        + "".join(
            f"; {call}: gpuledger {api_ms['webhook'][call]:.2f}, no-op {api_ms['noop'][call]:.2f}"
            for call in ("mutating call", "validating call")
        )
    )
    free_figures = None
    if freed:
        median_create = figures["webhook"]["median_ms"]
        free_figures = {
            "n": len(freed),
            "late": late,
            "median_ms": statistics.median(freed) * 1e3,
            "p90_ms": percentile(freed, 0.9) * 1e3,
            "max_ms": max(freed) * 1e3,
        }
        print(
            f"delete to free, {len(freed)} pods one at a time ({late} past {args.free_timeout:g} s): "
            + ", ".join(
                f"{k.removesuffix('_ms')} {free_figures[k]:.0f} ms (x{free_figures[k] / median_create:.1f})"
                for k in ("median_ms", "p90_ms", "max_ms")
            )
            + f"; x = over this run's median webhook pod create ({median_create:.2f} ms)"
        )
    elif args.delete_to_free:
        print(f"delete to free: all {late} waits ran past {args.free_timeout:g} s")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "figures": figures,
                    "ratio_median": ratio_median,
                    "ratio_p99": ratio_p99,
                    "noop_ratio": noop_ratio,
                    "inside_webhook": inside,
                    "actor_per_call": {m: {"calls": n, "mean_ms": ms} for m, (n, ms) in actor_calls.items()},
                    "cpu_us_per_pod": cpu_us,
                    "api_server_ms": api_ms,
                    "delete_to_free": free_figures,
                    "args": vars(args),
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
