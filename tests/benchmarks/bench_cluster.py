"""Cluster-scale figures in the peers' shapes: fill a cluster, place a 512-pod gang, say "never fits".

    .venv/bin/python tests/benchmarks/bench_cluster.py          # 500 nodes x 8 GPUs, every scenario
    .venv/bin/python tests/benchmarks/bench_cluster.py --nodes 50 --scenario fill,gang,never
    .venv/bin/python tests/benchmarks/bench_cluster.py --limits large --json /tmp/cluster.json

The real kube-apiserver and kube-controller-manager (devcluster.cluster.ControlPlane) with Node objects only:
no kubelet and no scheduler. The webhook is the product as deployed, `gpuledger serve` in its own process
with its Ray ledger and the cluster sync, on the shipped config (manifests/config/config.yaml) with
`binding_mode: nodeName`: a pod is placed and bound at admission, as the peers' simulated nodes bind theirs.
The nodes are devcluster.nodes' sample cluster cut to `--nodes`: 8 GPUs each, 8 nodes to a leaf, 8 leaves to
a spine (a spine is 512 GPUs). Scenarios, sizes for 500 nodes (smaller clusters get proportionally fewer):
- fill: 4,000 one-GPU Jobs created at once by concurrent clients; first create to every pod placed.
- gang: one Job of 512 one-GPU pods, a gang preferring spine-0 (topology.scheduler/gang,
  topology.scheduler/preferred-domain), in an empty cluster; its create to the last pod placed.
- never: a gang of 10 pods x 8 GPUs (80 GPUs) required on leaf-0, whose 8 nodes hold 64: its create to the
  Job controller's FailedCreate Event carrying the webhook's denial (what `kubectl describe job` shows).
- queues: Kueue's scheduler-performance shape (30 queues x 500 workloads: 350 small of 1, 100 medium of 5,
  50 large of 20, created every 100 / 500 / 1,200 ms, running 200 / 500 / 1,000 ms) through 30 opted-in
  namespaces, no GPUQueue and no quota: small and medium as bare pods, large as a 4 x 5-GPU Job gang;
  a workload "runs" from its placement for its run time, then its pods are marked Succeeded (as Kueue's
  runner marks its workloads finished). First create to the last workload finished.
- free: the cluster full of one-GPU pods, 1,000 more waiting (admitted gated, in the ledger's waiting line),
  100 placed pods deleted at once: the first delete to 100 waiting pods placed (their placement written and
  their gate removed by the cluster sync's placer; kube-scheduler would bind them next, and none runs here).
- reclaim-one, reclaim-large: two GPUQueues with half the GPUs each as quota; team-a fills the whole cluster
  with one-GPU pods, borrowing team-b's half; then team-b's work takes back what it needs, its victims
  evicted through the Eviction API by the ledger's sync (and ended at once, as a kubelet would when the
  containers stop): one high-priority one-GPU pod at a time, 5 times, the mean reported (KAI's 13.9 s is an
  average), or one Job of 250 pods x 8 GPUs (2,000 GPUs) placed whole. Team-b's create to its last pod placed.

A pod counts as placed when the API server announces it bound (spec.nodeName, set at admission) or, for one
that waited, with its placement written and no scheduling gate left. Every scenario runs with the
controller-manager's default client rate limits and with the values large clusters use (`--limits`), one
fresh control plane per limits profile (between scenarios their objects are deleted and the ledger drains),
and prints the time, the API server's request rate over it (its /metrics apiserver_request_total, before and
after) and where the time went: the admission webhook calls as the API server times them, the Job controller
(the controller-manager's /metrics: its client's rate-limiter waits, its workers' syncs and the Job work
queue) and the API server's own POSTs.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import os
import re
import socket
import ssl
import statistics
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_pod_create import metric_sum, read_answer  # noqa: E402

GPUS_PER_NODE = 8
NODES_PER_LEAF = 8
LEAVES_PER_SPINE = 8
FULL_NODES = 500  # the peers' cluster: the sizes below are for it, and scale with --nodes
FILL_JOBS = 4000
GANG_PODS = 512
NEVER_PODS, NEVER_GPUS, NEVER_LEAF = 10, 8, "leaf-0"
FREE_WAITING, FREE_DELETED = 1000, 100
RECLAIM_ONE_TIMES = 5  # reclaim-one: one pod at a time, this many times (KAI publishes an average)
RECLAIM_LARGE_GPUS, RECLAIM_LARGE_POD_GPUS = 2000, 8  # reclaim-large: one Job of 250 pods x 8 GPUs
BENCH_KEY = "bench.gpuledger/scenario"  # (gpuledger.io/* keys are the webhook's own)
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"

SCENARIOS = ("fill", "gang", "never", "free", "reclaim-one", "reclaim-large", "queues")
# small to large: what a scenario leaves behind is cheap to clear
RUN_ORDER = ("never", "gang", "free", "reclaim-one", "reclaim-large", "fill", "queues")
# the peers' published figures, each measured on the peer's own machine (docs/benchmarks.md says which)
PEERS: dict[str, tuple[str, float] | None] = {
    "fill": ("KAI-Scheduler", 398.0),  # 6 min 38 s: 4,000 one-GPU jobs on 500 simulated nodes
    "gang": ("KAI-Scheduler", 48.7),  # one 512-pod gang with a preferred topology
    "never": ("KAI-Scheduler", 249.5),  # an 80-GPU gang declared unschedulable
    "free": None,  # the issue names no peer figure for it
    "reclaim-one": ("KAI-Scheduler", 13.9),
    "reclaim-large": ("KAI-Scheduler", 102.0),
    "queues": ("Kueue", 351.0),  # 15,000 workloads through 30 ClusterQueues, wall time
}
# kube-controller-manager's client rate limits: its own defaults, and what large clusters run with
LIMITS = {
    "default": {"qps": 20, "burst": 30},
    "large": {"qps": 100, "burst": 200},
}
CONCURRENT_JOB_SYNCS = 5  # kube-controller-manager's default, in both (the devcluster's own is 10)

# Kueue's test/performance/scheduler configs/baseline/generator.yaml, per queue: (class, count, creation
# interval s, GPUs, run time s); 5 cohorts x 6 queues
KUEUE_QUEUES = 30
KUEUE_CLASSES = (("small", 350, 0.1, 1, 0.2), ("medium", 100, 0.5, 5, 0.5), ("large", 50, 1.2, 20, 1.0))
LARGE_PODS = 4  # a 20-GPU workload: a gang of 4 pods x 5 GPUs (no node holds 20)


def shipped_config() -> dict:
    """manifests/config/config.yaml as shipped, bound by spec.nodeName (no scheduler runs here); its
    privileged_usernames names the in-cluster account, the harness gives its own."""
    import yaml

    config = yaml.safe_load((ROOT / "manifests" / "config" / "config.yaml").read_text())
    config.pop("privileged_usernames", None)
    config["binding_mode"] = "nodeName"
    return config


def cluster_nodes(count: int) -> list[dict]:
    """devcluster.nodes' sample cluster (leaf/spine labels, products per spine, bandwidth per leaf), 8 nodes a
    leaf and 8 leaves a spine, cut to `count` nodes, no taints."""
    from devcluster.nodes import make_sample_cluster

    per_spine = NODES_PER_LEAF * LEAVES_PER_SPINE
    nodes = make_sample_cluster(
        spines=-(-count // per_spine),
        leaves_per_spine=LEAVES_PER_SPINE,
        nodes_per_leaf=NODES_PER_LEAF,
        gpus_per_node=GPUS_PER_NODE,
        tainted_per_leaf=0,
        agentaflow_per_leaf=0,
    )
    return nodes[:count]


def scaled(full: int, nodes: int) -> int:
    return max(1, round(full * nodes / FULL_NODES))


# ------------------------------------------------------------------------------------------- API objects


def pod_spec(gpus: int, node_selector: dict | None = None) -> dict:
    spec: dict = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": IMAGE,
                "command": ["python", "train.py"],
                "resources": {
                    "limits": {"nvidia.com/gpu": str(gpus)},
                    "requests": {"cpu": "1", "memory": "4Gi"},
                },
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return spec


def job(
    name: str,
    scenario: str,
    pods: int = 1,
    gpus: int = 1,
    annotations: dict | None = None,
    node_selector: dict | None = None,
) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {BENCH_KEY: scenario}, "annotations": annotations or {}},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {BENCH_KEY: scenario}},
                "spec": pod_spec(gpus, node_selector),
            },
        },
    }


def bare_pod(name: str, scenario: str, gpus: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {BENCH_KEY: scenario}},
        "spec": pod_spec(gpus),
    }


# ------------------------------------------------------------------------------------------------ metrics


def counter_sum(text: str, metric: str, *selectors: str) -> float:
    """A counter or gauge summed over its lines holding every one of `selectors`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((metric + "{", metric + " ")) and all(s in line for s in selectors):
            total += float(line.rsplit(" ", 1)[1])
    return total


def requests_by(text: str) -> Counter:
    """apiserver_request_total by (verb, resource[/subresource])."""
    out: Counter = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        what = labels.get("resource", "") + ("/" + labels["subresource"] if labels.get("subresource") else "")
        out[(labels.get("verb", ""), what)] += float(line.rsplit(" ", 1)[1])
    return out


@dataclass
class Snapshot:
    """What the API server, the controller-manager and the webhook have counted so far, and when."""

    at: float
    apiserver: str
    controllers: str
    webhook: str


class Scraper:
    def __init__(self, cp, webhook, controller_port: int):
        self.cp, self.webhook = cp, webhook
        self.controller_url = f"https://127.0.0.1:{controller_port}/metrics"
        # the controller-manager's serving certificate is its own self-signed one, on 127.0.0.1
        self._insecure = ssl.create_default_context()
        self._insecure.check_hostname = False
        self._insecure.verify_mode = ssl.CERT_NONE

    def controllers(self) -> str:
        try:
            with urllib.request.urlopen(self.controller_url, context=self._insecure, timeout=10) as r:
                return r.read().decode()
        except OSError:
            return ""

    def snapshot(self) -> Snapshot:
        at = time.monotonic()
        return Snapshot(
            at, self.cp.get_path("/metrics")[1], self.controllers(), self.webhook.get("/metrics")[1]
        )


def hist_delta(before: str, after: str, metric: str, *selectors: str) -> tuple[float, float]:
    """(seconds, count) a histogram gained between two scrapes."""
    s0, c0 = metric_sum(before, metric, *selectors)
    s1, c1 = metric_sum(after, metric, *selectors)
    return s1 - s0, c1 - c0


def where_time_went(before: Snapshot, after: Snapshot, seconds: float, qps: float) -> dict:
    """The figures a scenario's window adds up to, from the three /metrics pages."""
    a0, a1 = before.apiserver, after.apiserver
    requests = counter_sum(a1, "apiserver_request_total") - counter_sum(a0, "apiserver_request_total")
    by_what = requests_by(a1)
    by_what.subtract(requests_by(a0))
    post_s, post_n = hist_delta(
        a0,
        a1,
        "apiserver_request_duration_seconds",
        'resource="pods",scope="resource",subresource="",verb="POST"',
    )
    mut_s, mut_n = hist_delta(
        a0, a1, "apiserver_admission_webhook_admission_duration_seconds", 'type="admit"'
    )
    val_s, val_n = hist_delta(
        a0, a1, "apiserver_admission_webhook_admission_duration_seconds", 'type="validating"'
    )
    k0, k1 = before.controllers, after.controllers
    wait_s, wait_n = hist_delta(k0, k1, "rest_client_rate_limiter_duration_seconds")
    kcm_requests = counter_sum(k1, "rest_client_requests_total") - counter_sum(
        k0, "rest_client_requests_total"
    )
    sync_s, sync_n = hist_delta(k0, k1, "job_controller_job_sync_duration_seconds")
    queued_s, queued_n = hist_delta(k0, k1, "workqueue_queue_duration_seconds", 'name="job"')
    w0, w1 = before.webhook, after.webhook
    inside_s, inside_n = hist_delta(w0, w1, "gpuledger_admission_duration_seconds", 'route="mutate"')
    return {
        "apiserver_requests": requests,
        "apiserver_rate": requests / seconds if seconds else 0.0,
        "apiserver_top": [(f"{verb} {what}", n) for (verb, what), n in by_what.most_common(6) if n > 0],
        "post_pods": {"calls": post_n, "mean_ms": post_s / post_n * 1e3 if post_n else 0.0},
        "mutating": {"calls": mut_n, "seconds": mut_s, "mean_ms": mut_s / mut_n * 1e3 if mut_n else 0.0},
        "validating": {"calls": val_n, "seconds": val_s, "mean_ms": val_s / val_n * 1e3 if val_n else 0.0},
        "webhook_mutate_inside_ms": inside_s / inside_n * 1e3 if inside_n else 0.0,
        "controller_manager": {
            "scraped": bool(k0 and k1),
            "requests": kcm_requests,
            "rate": kcm_requests / seconds if seconds else 0.0,
            "qps_limit": qps,
            "rate_limiter_wait_s": wait_s,
            "rate_limiter_mean_ms": wait_s / wait_n * 1e3 if wait_n else 0.0,
            "job_syncs": sync_n,
            "job_sync_mean_ms": sync_s / sync_n * 1e3 if sync_n else 0.0,
            "job_queue_mean_s": queued_s / queued_n if queued_n else 0.0,
            # the share of the window the Job controller's workers spent in syncs (each waits on its POSTs)
            "job_workers_busy": sync_s / (seconds * CONCURRENT_JOB_SYNCS) if seconds else 0.0,
        },
    }


def print_breakdown(w: dict, seconds: float) -> None:
    top = ", ".join(f"{what} {n:,.0f}" for what, n in w["apiserver_top"])
    print(
        f"  API server: {w['apiserver_requests']:,.0f} requests in {seconds:.1f} s = "
        f"{w['apiserver_rate']:,.1f}/s ({top})"
    )
    post, mut, val = w["post_pods"], w["mutating"], w["validating"]
    if post["calls"]:
        print(
            f"  a pod POST at the API server: mean {post['mean_ms']:.1f} ms over {post['calls']:,.0f}, "
            "of which "
            f"the mutating webhook call {mut['mean_ms']:.1f} ms (gpuledger's handler inside: "
            f"{w['webhook_mutate_inside_ms']:.2f} ms) and the validating one {val['mean_ms']:.1f} ms"
        )
        print(
            f"  admission webhook calls: {mut['calls'] + val['calls']:,.0f}, "
            f"{mut['seconds'] + val['seconds']:.1f} s in all "
            f"({(mut['seconds'] + val['seconds']) / seconds:.2f} calls' worth in flight on average)"
        )
    kcm = w["controller_manager"]
    if kcm["scraped"]:
        print(
            f"  controller-manager: {kcm['requests']:,.0f} requests = {kcm['rate']:.1f}/s against its limit "
            f"{kcm['qps_limit']:g}/s; {kcm['rate_limiter_wait_s']:.1f} s waited in its client rate limiter "
            f"(mean {kcm['rate_limiter_mean_ms']:.0f} ms a request); {kcm['job_syncs']:,.0f} Job syncs, mean "
            f"{kcm['job_sync_mean_ms']:.1f} ms (its {CONCURRENT_JOB_SYNCS} workers busy "
            f"{kcm['job_workers_busy']:.0%}); a Job waited {kcm['job_queue_mean_s']:.2f} s in its work queue "
            "on average"
        )


SHARED_CORES = (
    f"{os.cpu_count()} cores shared with etcd, the controller-manager, the webhook, its ledger and this bench"
)


def limited_by(w: dict) -> str:
    """A line naming what set the figure, from the window's own counts."""
    kcm = w["controller_manager"]
    if kcm["scraped"] and kcm["requests"] and kcm["rate"] >= 0.8 * kcm["qps_limit"]:
        return (
            f"set by the controller-manager's client rate limit: its {kcm['requests']:,.0f} requests at "
            f"{kcm['qps_limit']:g}/s take {kcm['requests'] / kcm['qps_limit']:.0f} s at the least"
        )
    busy = w["mutating"]["seconds"] + w["validating"]["seconds"]
    if kcm["scraped"] and kcm["job_workers_busy"] >= 0.8:
        return (
            f"set by the Job controller's {CONCURRENT_JOB_SYNCS} workers (--concurrent-job-syncs), busy "
            f"{kcm['job_workers_busy']:.0%} of the time, each sync waiting on its pod POST (mean "
            f"{w['post_pods']['mean_ms']:.0f} ms at the API server, of which "
            f"{w['mutating']['mean_ms'] + w['validating']['mean_ms']:.0f} ms in the two webhook calls) on "
            f"{SHARED_CORES}"
        )
    return (
        f"not at the controller-manager's limit ({kcm['rate']:.0f} of {kcm['qps_limit']:g} requests/s): the "
        f"API server and admission ({busy:.1f} s of webhook calls, {w['apiserver_rate']:,.0f} requests/s) on "
        f"{SHARED_CORES}"
    )


# -------------------------------------------------------------------------------------------- pod watching


PLACEMENT_ANNOTATION = "gpuledger.io/placement"


def placed_on(pod: dict) -> str | None:
    """The node a pod is placed on: its spec.nodeName (bound at admission), or for a pod that waited, the
    node of the placement written on it once its scheduling gates are gone (kube-scheduler binds it then)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    placement = ((pod.get("metadata") or {}).get("annotations") or {}).get(PLACEMENT_ANNOTATION)
    if placement and not spec.get("schedulingGates"):
        return json.loads(placement).get("node")
    return None


class PodWatch:
    """Pods as the API server announces them: when each was first seen bound to a node (placed)."""

    def __init__(self, api_client, namespace: str | None, scenario: str):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.namespace, self.scenario = namespace, scenario
        self.placed: dict[str, float] = {}  # namespace/name -> time.monotonic() when first seen placed
        self.node_of: dict[str, str] = {}
        self.job_of: dict[str, str] = {}  # namespace/name -> namespace/job
        # called (key, job key or None, time) on each placement, in the watch thread
        self.listeners: list = []
        self.lock = threading.Lock()
        self._resp = None
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        selector = f"{BENCH_KEY}={self.scenario}"
        if self.namespace:
            listing = self.core.list_namespaced_pod(self.namespace, label_selector=selector, limit=1)
        else:
            listing = self.core.list_pod_for_all_namespaces(label_selector=selector, limit=1)
        self._version = listing.metadata.resource_version
        self.thread.start()
        return self

    def _open(self):
        kwargs = {
            "label_selector": f"{BENCH_KEY}={self.scenario}",
            "watch": True,
            "resource_version": self._version,
            "timeout_seconds": 3600,
            "_preload_content": False,
        }
        if self.namespace:
            return self.core.list_namespaced_pod(self.namespace, **kwargs)
        return self.core.list_pod_for_all_namespaces(**kwargs)

    def _run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        while not self._stop:
            self._resp = self._open()
            try:
                for line in iter_resp_lines(self._resp):
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"pod watch: {obj}")
                    meta = obj["metadata"]
                    self._version = meta.get("resourceVersion", self._version)
                    node = placed_on(obj)
                    key = f"{meta['namespace']}/{meta['name']}"
                    if event["type"] in ("ADDED", "MODIFIED") and node and key not in self.placed:
                        now = time.monotonic()
                        job_name = (meta.get("labels") or {}).get(JOB_NAME_LABEL)
                        job_key = f"{meta['namespace']}/{job_name}" if job_name else None
                        with self.lock:
                            self.placed[key], self.node_of[key] = now, node
                            if job_key:
                                self.job_of[key] = job_key
                        for listener in self.listeners:
                            listener(key, job_key, now)
            except Exception:  # the stream shut down by stop(), or broken: reopened unless stopping
                if self._stop:
                    return
                time.sleep(0.2)

    def count(self) -> int:
        return len(self.placed)

    def wait(self, count: int, timeout: float, what: str) -> float:
        """Until `count` pods are placed; the time the last of them was seen."""
        deadline = time.monotonic() + timeout
        while len(self.placed) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {len(self.placed)} of {count} pods placed after {timeout:.0f} s")
            time.sleep(0.05)
        with self.lock:
            return sorted(self.placed.values())[count - 1]

    def stop(self) -> None:
        """End the stream: its socket shut down under the reading thread (closing the response from here
        would wait for that thread's read)."""
        self._stop = True
        conn = getattr(self._resp, "connection", None) or getattr(self._resp, "_connection", None)
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(5)


# -------------------------------------------------------------------------------------------- the harness


class ClientPool:
    """One kubernetes client per thread: each keeps its own connections, as concurrent users do."""

    def __init__(self, cp, threads: int):
        self.cp, self.threads = cp, threads
        self.local = threading.local()

    def api(self):
        if not hasattr(self.local, "client"):
            self.local.client = self.cp.api_client()
        return self.local.client

    def batch(self):
        from kubernetes import client

        return client.BatchV1Api(self.api())

    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api())

    def run(self, items, call) -> list:
        with ThreadPoolExecutor(self.threads) as pool:
            return list(pool.map(call, items))


@dataclass
class Harness:
    cp: object
    webhook: object
    scraper: Scraper
    nodes: list[dict]
    limits: str
    clients: int
    timeout: float
    spine_of: dict[str, str] = field(default_factory=dict)
    leaf_of: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node in self.nodes:
            labels = node["metadata"]["labels"]
            self.spine_of[node["metadata"]["name"]] = labels["topology.scheduler/spine"]
            self.leaf_of[node["metadata"]["name"]] = labels["topology.scheduler/leaf"]
        self.pool = ClientPool(self.cp, self.clients)

    @property
    def qps(self) -> float:
        return LIMITS[self.limits]["qps"]

    def namespace(self, name: str) -> str:
        self.cp.create_namespace(name, admission=True, users=())  # type: ignore[attr-defined]
        return name

    def gpus_free(self) -> float:
        return self.webhook.metric("agentaflow_gpu_available") or 0.0  # type: ignore[attr-defined]

    def clear(self, namespaces: list[str], scenario: str) -> None:
        """Jobs, then their pods, gone, the ledger back to every GPU free and the controller-manager idle: the
        next scenario starts on an empty cluster. Bound pods need grace 0 (no kubelet confirms a stop) and
        their Job-tracking finalizer removed (the Job controller would do it at its client rate)."""
        from kubernetes.client.exceptions import ApiException

        batch, core = self.pool.batch(), self.pool.core()
        for ns in namespaces:
            batch.delete_collection_namespaced_job(ns, propagation_policy="Background")
        self.cp.wait_for(  # type: ignore[attr-defined]
            lambda: all(not batch.list_namespaced_job(ns, limit=1).items for ns in namespaces),
            timeout=120,
            what="Jobs deleted",
        )
        selector = f"{BENCH_KEY}={scenario}"
        pods = [
            (p.metadata.namespace, p.metadata.name, bool(p.metadata.finalizers))
            for ns in namespaces
            for p in core.list_namespaced_pod(ns, label_selector=selector).items
        ]

        def force(pod: tuple[str, str, bool]) -> None:
            ns, name, finalizers = pod
            core = self.pool.core()
            try:
                if finalizers:
                    read_answer(
                        core.patch_namespaced_pod(
                            name, ns, {"metadata": {"finalizers": None}}, _preload_content=False
                        )
                    )
                read_answer(
                    core.delete_namespaced_pod(name, ns, grace_period_seconds=0, _preload_content=False)
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise

        self.pool.run(pods, force)
        total = len(self.nodes) * GPUS_PER_NODE
        self.cp.wait_for(  # type: ignore[attr-defined]
            lambda: self.gpus_free() == total, timeout=120, interval=0.5, what="every GPU free again"
        )
        self.wait_controllers_idle()

    def wait_controllers_idle(self, timeout: float = 300) -> None:
        """Until the controller-manager's Job queue is empty and it sends nothing for a second."""
        deadline = time.monotonic() + timeout
        last = -1.0
        while time.monotonic() < deadline:
            text = self.scraper.controllers()
            if not text:
                return
            sent = counter_sum(text, "rest_client_requests_total")
            depth = counter_sum(text, "workqueue_depth", 'name="job"') + counter_sum(
                text, "workqueue_depth", 'name="orphan_pod"'
            )
            if depth == 0 and sent - last < 3:
                return
            last = sent
            time.sleep(1.0)


# ---------------------------------------------------------------------------------------------- scenarios


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else 0.0


def scenario_fill(h: Harness, nodes: int) -> dict:
    count = scaled(FILL_JOBS, nodes)
    ns = h.namespace("fill")
    watch = PodWatch(h.cp.api_client(), ns, "fill").start()  # type: ignore[attr-defined]
    created: dict[str, float] = {}
    before = h.scraper.snapshot()
    started = time.monotonic()

    def create(i: int) -> None:
        name = f"fill-{i}"
        read_answer(h.pool.batch().create_namespaced_job(ns, job(name, "fill"), _preload_content=False))
        created[f"{ns}/{name}"] = time.monotonic()

    h.pool.run(range(count), create)
    creates_done = time.monotonic()
    last = watch.wait(count, h.timeout, "fill")
    after = h.scraper.snapshot()
    watch.stop()
    seconds = last - started
    waits = [
        t - created[watch.job_of[key]] for key, t in watch.placed.items() if watch.job_of.get(key) in created
    ]
    w = where_time_went(before, after, seconds, h.qps)
    print(
        f"fill: {count:,} one-GPU Jobs created by {h.clients} clients in {creates_done - started:.1f} s; "
        f"every pod placed {seconds:.1f} s after the first create ({count / seconds:.1f} pods/s); a Job's "
        f"create to its pod placed: median {statistics.median(waits):.1f} s, "
        f"p99 {percentile(waits, 0.99):.1f} s"
    )
    print_breakdown(w, seconds)
    print(f"  {limited_by(w)}")
    return {"seconds": seconds, "pods": count, "jobs_created_s": creates_done - started, "breakdown": w}


def scenario_gang(h: Harness, nodes: int) -> dict:
    pods = scaled(GANG_PODS, nodes)
    ns = h.namespace("gang")
    watch = PodWatch(h.cp.api_client(), ns, "gang").start()  # type: ignore[attr-defined]
    annotations = {"topology.scheduler/gang": "true", "topology.scheduler/preferred-domain": "spine-0"}
    before = h.scraper.snapshot()
    started = time.monotonic()
    read_answer(
        h.pool.batch().create_namespaced_job(
            ns, job("gang", "gang", pods=pods, annotations=annotations), _preload_content=False
        )
    )
    last = watch.wait(pods, h.timeout, "gang")
    after = h.scraper.snapshot()
    watch.stop()
    seconds = last - started
    first = min(watch.placed.values()) - started
    used = list(watch.node_of.values())
    leaves = {h.leaf_of[n] for n in used}
    spines = Counter(h.spine_of[n] for n in used)
    w = where_time_went(before, after, seconds, h.qps)
    print(
        f"gang: one Job of {pods} one-GPU pods (gang, preferred spine-0) placed whole {seconds:.1f} s "
        f"after its create (first pod {first:.2f} s); on {len(set(used))} nodes, {len(leaves)} leaves, "
        "spines " + ", ".join(f"{s} ({n} pods)" for s, n in sorted(spines.items()))
    )
    print_breakdown(w, seconds)
    print(f"  {limited_by(w)}")
    return {"seconds": seconds, "pods": pods, "first_pod_s": first, "spines": dict(spines), "breakdown": w}


def scenario_never(h: Harness, nodes: int) -> dict:
    from kubernetes import client
    from kubernetes.watch.watch import iter_resp_lines

    ns = h.namespace("never")
    core = client.CoreV1Api(h.cp.api_client())  # type: ignore[attr-defined]
    version = core.list_namespaced_event(ns, limit=1).metadata.resource_version
    leaf_nodes = sum(1 for n in h.leaf_of.values() if n == NEVER_LEAF)
    before = h.scraper.snapshot()
    started = time.monotonic()
    read_answer(
        h.pool.batch().create_namespaced_job(
            ns,
            job(
                "never",
                "never",
                pods=NEVER_PODS,
                gpus=NEVER_GPUS,
                annotations={"topology.scheduler/gang": "true"},
                node_selector={"topology.scheduler/leaf": NEVER_LEAF},
            ),
            _preload_content=False,
        )
    )
    resp = core.list_namespaced_event(
        ns,
        field_selector="reason=FailedCreate,involvedObject.name=never",
        watch=True,
        resource_version=version,
        timeout_seconds=int(h.timeout),
        _preload_content=False,
    )
    answered, message = None, ""
    for line in iter_resp_lines(resp):
        event = json.loads(line)
        if event["type"] == "ADDED":
            answered, message = time.monotonic(), event["object"].get("message", "")
            break
    resp.close()
    if answered is None:
        raise TimeoutError(f"never: no FailedCreate Event on Job {ns}/never within {h.timeout:.0f} s")
    after = h.scraper.snapshot()
    seconds = answered - started
    w = where_time_went(before, after, seconds, h.qps)
    print(
        f"never: a gang of {NEVER_PODS} pods x {NEVER_GPUS} GPUs ({NEVER_PODS * NEVER_GPUS} GPUs) "
        f"required on {NEVER_LEAF} ({leaf_nodes} nodes, {leaf_nodes * GPUS_PER_NODE} GPUs): the Job's "
        f"FailedCreate Event {seconds:.2f} s after its create: {message[:400]}"
    )
    print(
        f"  the pod create's denial as the API server timed the webhook call: mean "
        f"{w['mutating']['mean_ms']:.1f} ms over {w['mutating']['calls']:.0f} call(s)"
    )
    print_breakdown(w, seconds)
    return {
        "seconds": seconds,
        "pods": NEVER_PODS,
        "gpus": NEVER_PODS * NEVER_GPUS,
        "message": message,
        "breakdown": w,
    }


def scenario_free(h: Harness, nodes: int) -> dict:
    """A full cluster, pods waiting, some placed pods deleted at once: the time until as many waiting pods are
    placed (the waiting line's placement written and its scheduling gate removed; kube-scheduler, absent here,
    binds such a pod after that)."""
    total = len(h.nodes) * GPUS_PER_NODE
    waiting, deleted = scaled(FREE_WAITING, nodes), scaled(FREE_DELETED, nodes)
    ns = h.namespace("free")
    watch = PodWatch(h.cp.api_client(), ns, "free").start()  # type: ignore[attr-defined]
    gated: list[str] = []

    def create(name: str) -> None:
        answer = json.loads(
            read_answer(
                h.pool.core().create_namespaced_pod(ns, bare_pod(name, "free", 1), _preload_content=False)
            )
        )
        if not answer["spec"].get("nodeName"):
            gated.append(name)

    filled = time.monotonic()
    h.pool.run([f"run-{i}" for i in range(total)], create)
    watch.wait(total, h.timeout, "free: the cluster filled")
    h.pool.run([f"wait-{i}" for i in range(waiting)], create)
    if len(gated) != waiting:
        raise RuntimeError(
            f"free: {len(gated)} of {waiting} pods created into a full cluster were set to wait"
        )
    print(
        f"free: {total:,} one-GPU pods fill the cluster and {waiting:,} more wait "
        f"({time.monotonic() - filled:.0f} s to set up)",
        flush=True,
    )
    waits_placed: list[float] = []
    watch.listeners.append(
        lambda key, job_key, now: key.startswith(f"{ns}/wait-") and waits_placed.append(now)
    )
    before = h.scraper.snapshot()
    started = time.monotonic()
    h.pool.run(
        [f"run-{i}" for i in range(deleted)],
        lambda name: read_answer(
            h.pool.core().delete_namespaced_pod(name, ns, grace_period_seconds=0, _preload_content=False)
        ),
    )
    deletes_done = time.monotonic()
    deadline = started + h.timeout
    while len(waits_placed) < deleted:
        if time.monotonic() > deadline:
            raise TimeoutError(f"free: {len(waits_placed)} of {deleted} waiting pods placed")
        time.sleep(0.05)
    last = sorted(waits_placed)[deleted - 1]
    after = h.scraper.snapshot()
    watch.stop()
    seconds = last - started
    w = where_time_went(before, after, seconds, h.qps)
    print(
        f"  {deleted} placed pods deleted at once ({deletes_done - started:.2f} s for the deletes); "
        f"{deleted} waiting pods placed {seconds:.2f} s after the first delete (the first "
        f"{min(waits_placed) - started:.2f} s)"
    )
    print_breakdown(w, seconds)
    return {
        "seconds": seconds,
        "pods": deleted,
        "waiting": waiting,
        "deletes_s": deletes_done - started,
        "breakdown": w,
    }


RECLAIM_NAMESPACES = {"team-a": "reclaim-a", "team-b": "reclaim-b"}


def gpu_queue(name: str, gpus: int) -> dict:
    """A GPUQueue with a quota of `gpus` of any product, lending all it does not use, borrowing without
    limit, reclaiming what it lent (docs/queues.md)."""
    return {
        "apiVersion": "gpuledger.io/v1alpha1",
        "kind": "GPUQueue",
        "metadata": {"name": name, "labels": {BENCH_KEY: "reclaim"}},
        "spec": {"quotas": [{"product": "any", "gpus": gpus}]},
    }


class Kubelet:
    """What a kubelet does for an evicted pod, here where no kubelet runs (as KAI's simulated nodes do): a
    pod of the watched namespaces given a deletionTimestamp is deleted at once (grace 0), as though its
    containers had stopped. Reads a watch per namespace, so the stand-in adds no polling delay to the figure.
    Counts the pods it ended."""

    def __init__(self, h: Harness, namespaces: list[str]):
        from kubernetes import client

        self.h, self.namespaces = h, namespaces
        self.core = client.CoreV1Api(h.cp.api_client())  # type: ignore[attr-defined]
        self.ended: set[str] = set()
        self._stop = False
        self._resps: list = []
        self.threads = [threading.Thread(target=self._run, args=(ns,), daemon=True) for ns in namespaces]

    def start(self) -> Kubelet:
        for t in self.threads:
            t.start()
        return self

    def _run(self, ns: str) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        core = client.CoreV1Api(self.h.cp.api_client())  # type: ignore[attr-defined]
        version = core.list_namespaced_pod(ns, limit=1).metadata.resource_version
        while not self._stop:
            resp = core.list_namespaced_pod(
                ns, watch=True, resource_version=version, timeout_seconds=3600, _preload_content=False
            )
            self._resps.append(resp)
            try:
                for line in iter_resp_lines(resp):
                    event = json.loads(line)
                    meta = event["object"]["metadata"]
                    version = meta.get("resourceVersion", version)
                    key = f"{ns}/{meta['name']}"
                    if event["type"] != "MODIFIED" or not meta.get("deletionTimestamp") or key in self.ended:
                        continue
                    try:
                        read_answer(
                            core.delete_namespaced_pod(
                                meta["name"], ns, grace_period_seconds=0, _preload_content=False
                            )
                        )
                    except ApiException as exc:
                        if exc.status != 404:
                            raise
                    self.ended.add(key)
            except Exception:  # the stream shut down by stop(), or broken: reopened unless stopping
                if self._stop:
                    return
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop = True
        for resp in self._resps:
            conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
            sock = getattr(conn, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for t in self.threads:
            t.join(5)


def scenario_reclaim(h: Harness, nodes: int, large: bool) -> dict:
    """Two GPUQueues with half the cluster each; team-a fills all of it with one-GPU pods (borrowing team-b's
    half); then team-b's work arrives and takes back what it needs: one high-priority one-GPU pod at a time
    (reclaim-one, several times, the mean reported as KAI reports it), or one Job of 8-GPU pods asking
    2,000 GPUs at 500 nodes (reclaim-large). Timed from team-b's create to its last pod placed; the victims
    are evicted through the Eviction API by the deployed ledger's sync, and ended at once by `Kubelet`."""
    from kubernetes import client

    total = len(h.nodes) * GPUS_PER_NODE
    custom = client.CustomObjectsApi(h.cp.api_client())  # type: ignore[attr-defined]
    scenario = "reclaim-large" if large else "reclaim-one"
    for queue in RECLAIM_NAMESPACES:
        custom.create_cluster_custom_object(
            "gpuledger.io", "v1alpha1", "gpuqueues", gpu_queue(queue, total // 2)
        )
    for queue, ns in RECLAIM_NAMESPACES.items():
        h.namespace(ns)
        h.cp.kubectl("label", "namespace", ns, f"gpuledger.io/queue={queue}", "--overwrite")  # type: ignore[attr-defined]
    ns_a, ns_b = RECLAIM_NAMESPACES["team-a"], RECLAIM_NAMESPACES["team-b"]
    kubelet = Kubelet(h, [ns_a, ns_b]).start()
    watch_a = PodWatch(h.cp.api_client(), ns_a, scenario).start()  # type: ignore[attr-defined]
    watch_b = PodWatch(h.cp.api_client(), ns_b, scenario).start()  # type: ignore[attr-defined]
    try:
        filled = time.monotonic()
        h.pool.run(
            [f"a-{i}" for i in range(total)],
            lambda name: read_answer(
                h.pool.core().create_namespaced_pod(ns_a, bare_pod(name, scenario, 1), _preload_content=False)
            ),
        )
        watch_a.wait(total, h.timeout, f"{scenario}: team-a filling the cluster")
        print(
            f"{scenario}: team-a (quota {total // 2} GPUs) fills all {total:,} GPUs with one-GPU pods, "
            f"borrowing {total - total // 2} of team-b's ({time.monotonic() - filled:.0f} s to set up)",
            flush=True,
        )
        before = h.scraper.snapshot()
        started = time.monotonic()
        if large:
            gpus = min(scaled(RECLAIM_LARGE_GPUS, nodes), total // 2)
            pods = gpus // RECLAIM_LARGE_POD_GPUS
            read_answer(
                h.pool.batch().create_namespaced_job(
                    ns_b,
                    job("large", scenario, pods=pods, gpus=RECLAIM_LARGE_POD_GPUS),
                    _preload_content=False,
                )
            )
            last = watch_b.wait(pods, h.timeout, f"{scenario}: team-b's Job")
            seconds, times = last - started, [last - started]
        else:
            gpus = pods = RECLAIM_ONE_TIMES
            times = []
            for i in range(RECLAIM_ONE_TIMES):
                t = time.monotonic()
                pod = bare_pod(f"b-{i}", scenario, 1)
                pod["metadata"]["annotations"] = {"agentaflow.gpu/priority": "high"}
                read_answer(h.pool.core().create_namespaced_pod(ns_b, pod, _preload_content=False))
                times.append(watch_b.wait(i + 1, h.timeout, f"{scenario}: team-b's pod {i + 1}") - t)
            seconds = statistics.mean(times)
        after = h.scraper.snapshot()
        evicted = len(kubelet.ended)
        w = where_time_went(before, after, time.monotonic() - started, h.qps)
        if large:
            print(
                f"  team-b's Job of {pods} pods x {RECLAIM_LARGE_POD_GPUS} GPUs ({gpus:,} GPUs) placed whole "
                f"{seconds:.1f} s after its create; {evicted} of team-a's pods evicted"
            )
        else:
            print(
                f"  a high-priority one-GPU pod of team-b placed by reclaim, {RECLAIM_ONE_TIMES} times one "
                f"after another: mean {seconds:.2f} s from its create (each: "
                + ", ".join(f"{t:.2f}" for t in times)
                + f" s); {evicted} of team-a's pods evicted"
            )
        print_breakdown(w, seconds)
        if evicted != gpus:
            raise RuntimeError(f"{scenario}: {evicted} pods evicted to free {gpus} GPUs: not the fewest")
        return {
            "seconds": seconds,
            "pods": pods,
            "gpus": gpus,
            "evicted": evicted,
            "each_s": times,
            "breakdown": w,
        }
    finally:
        watch_a.stop()
        watch_b.stop()
        kubelet.stop()
        for queue in RECLAIM_NAMESPACES:
            with contextlib.suppress(Exception):
                custom.delete_cluster_custom_object("gpuledger.io", "v1alpha1", "gpuqueues", queue)


@dataclass(order=True)
class _Due:
    at: float
    seq: int
    what: tuple = field(compare=False)


class _Finisher:
    """Marks pods Succeeded when their workload's run time is up: Kueue's runner finishing its workloads."""

    def __init__(self, h: Harness, threads: int):
        self.h = h
        self.heap: list[_Due] = []
        self.cv = threading.Condition()
        self.seq = 0
        self.finished: dict[str, float] = {}  # workload -> time its last pod was marked Succeeded
        self.stopping = False
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def add(self, at: float, workload: str, pods: list[tuple[str, str]]) -> None:
        with self.cv:
            self.seq += 1
            heapq.heappush(self.heap, _Due(at, self.seq, (workload, pods)))
            self.cv.notify()

    def _run(self) -> None:
        core = self.h.pool.core()
        while True:
            with self.cv:
                while not self.stopping and (not self.heap or self.heap[0].at > time.monotonic()):
                    self.cv.wait(max(0.0, self.heap[0].at - time.monotonic()) if self.heap else 0.5)
                if self.stopping:
                    return
                due = heapq.heappop(self.heap)
            workload, pods = due.what
            for ns, name in pods:
                read_answer(
                    core.patch_namespaced_pod_status(
                        name, ns, {"status": {"phase": "Succeeded"}}, _preload_content=False
                    )
                )
            self.finished[workload] = time.monotonic()

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify_all()


def scenario_queues(h: Harness, nodes: int) -> dict:
    from kubernetes.client.exceptions import ApiException

    namespaces = [h.namespace(f"queue-{q:02d}") for q in range(KUEUE_QUEUES)]
    plan = []  # (due s after start, namespace, class, index, gpus, run time s)
    for ns in namespaces:
        for cls, count, interval, gpus, run_s in KUEUE_CLASSES:
            # fewer workloads on a smaller cluster, over the same schedule: the same arrivals per GPU
            every = interval * FULL_NODES / nodes
            for i in range(scaled(count, nodes)):
                plan.append((i * every, ns, cls, i, gpus, run_s))
    plan.sort()
    watch = PodWatch(h.cp.api_client(), None, "queues")  # type: ignore[attr-defined]
    finisher = _Finisher(h, threads=max(4, h.clients // 2))
    created: dict[str, float] = {}
    placed: dict[str, float] = {}
    cls_of: dict[str, str] = {}
    run_of: dict[str, float] = {}
    job_pods: dict[str, list[str]] = {}  # workload -> its pods placed so far
    denials: Counter = Counter()
    waited: Counter = Counter()
    lock = threading.Lock()

    def on_placed(key: str, job_key: str | None, now: float) -> None:
        """A workload is placed with its last pod (a large one's 4); it then runs for its run time."""
        workload = job_key or key
        if workload not in cls_of:
            return
        with lock:
            names = job_pods.setdefault(workload, [])
            names.append(key)
            if len(names) < (LARGE_PODS if cls_of[workload] == "large" else 1) or workload in placed:
                return
            placed[workload] = now
        pods = [(k.split("/", 1)[0], k.split("/", 1)[1]) for k in names]
        finisher.add(now + run_of[workload], workload, pods)

    watch.listeners.append(on_placed)
    watch.start()
    items = iter(plan)
    items_lock = threading.Lock()
    before = h.scraper.snapshot()
    started = time.monotonic()

    def creator() -> None:
        batch, core = h.pool.batch(), h.pool.core()
        while True:
            with items_lock:
                item = next(items, None)
            if item is None:
                return
            due, ns, cls, i, gpus, run_s = item
            delay = started + due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            name = f"{cls}-{i}"
            key = f"{ns}/{name}"
            cls_of[key], run_of[key] = cls, run_s
            created[key] = time.monotonic()
            if cls == "large":
                annotations = {"topology.scheduler/gang": "true"}
                body = job(name, "queues", pods=LARGE_PODS, gpus=gpus // LARGE_PODS, annotations=annotations)
                read_answer(batch.create_namespaced_job(ns, body, _preload_content=False))
                continue
            while True:  # no queue: a bare pod that does not fit now is denied, and its user tries again
                try:
                    answer = json.loads(
                        read_answer(
                            core.create_namespaced_pod(
                                ns, bare_pod(name, "queues", gpus), _preload_content=False
                            )
                        )
                    )
                    break
                except ApiException as exc:
                    if exc.status != 403:
                        raise
                    denials[cls] += 1
                    time.sleep(1.0)
            if not answer["spec"].get("nodeName"):  # admitted to wait (gated): placed when GPUs free
                waited[cls] += 1

    threads = [threading.Thread(target=creator, daemon=True) for _ in range(h.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + h.timeout
    while len(finisher.finished) < len(plan):
        if time.monotonic() > deadline:
            raise TimeoutError(f"queues: {len(finisher.finished)} of {len(plan)} workloads finished")
        time.sleep(0.1)
    end = max(finisher.finished.values())
    after = h.scraper.snapshot()
    finisher.stop()
    watch.stop()
    seconds = end - started
    schedule = max(p[0] for p in plan)
    to_place: dict[str, list[float]] = {}
    for key, placed_at in placed.items():
        to_place.setdefault(cls_of[key], []).append(placed_at - created[key])
    w = where_time_went(before, after, seconds, h.qps)
    pods = sum(LARGE_PODS if cls_of[k] == "large" else 1 for k in cls_of)
    print(
        f"queues: Kueue's shape through {KUEUE_QUEUES} opted-in namespaces (no GPUQueue and no quota: one "
        f"namespace stands for each ClusterQueue): {len(plan):,} workloads ({pods:,} pods) over a "
        f"{schedule:.0f} s submission schedule, every one placed, run and finished {seconds:.1f} s after the "
        "first create"
    )
    print(
        "  create to placed, mean (max) by class: "
        + ", ".join(
            f"{cls} {statistics.fmean(v):.2f} s ({max(v):.2f} s)" for cls, v in sorted(to_place.items())
        )
        + (f"; bare pods denied and resubmitted: {dict(denials)}" if denials else "; none denied")
        + (f"; admitted to wait: {dict(waited)}" if waited else "")
    )
    print_breakdown(w, seconds)
    print(f"  {limited_by(w)}")
    return {
        "seconds": seconds,
        "pods": pods,
        "workloads": len(plan),
        "schedule_s": schedule,
        "to_placed_mean_s": {cls: statistics.fmean(v) for cls, v in to_place.items()},
        "denied": dict(denials),
        "waited": dict(waited),
        "queues_as": f"{KUEUE_QUEUES} opted-in namespaces, no GPUQueue and no quota",
        "breakdown": w,
    }


# the namespaces each scenario leaves things in
CLEARED = {
    "fill": ["fill"],
    "gang": ["gang"],
    "never": ["never"],
    "free": ["free"],
    "queues": [f"queue-{q:02d}" for q in range(KUEUE_QUEUES)],
    "reclaim-one": list(RECLAIM_NAMESPACES.values()),
    "reclaim-large": list(RECLAIM_NAMESPACES.values()),
}
RUNNERS = {
    "reclaim-one": lambda h, nodes: scenario_reclaim(h, nodes, large=False),
    "reclaim-large": lambda h, nodes: scenario_reclaim(h, nodes, large=True),
    "free": scenario_free,
    "fill": scenario_fill,
    "gang": scenario_gang,
    "never": scenario_never,
    "queues": scenario_queues,
}


# ------------------------------------------------------------------------------------------------- running


def controller_args(limits: str, metrics_port: int) -> tuple[str, ...]:
    """The controller-manager's flags for one limits profile, after the devcluster's own (the last wins), and
    its /metrics on 127.0.0.1 for anyone (no authentication; the bench's own control plane)."""
    values = LIMITS[limits]
    return (
        f"--kube-api-qps={values['qps']}",
        f"--kube-api-burst={values['burst']}",
        f"--concurrent-job-syncs={CONCURRENT_JOB_SYNCS}",
        f"--secure-port={metrics_port}",
        "--bind-address=127.0.0.1",
        "--authorization-always-allow-paths=/healthz,/metrics",
    )


def create_cluster_nodes(cp, nodes: list[dict], threads: int) -> None:
    from devcluster.nodes import create_nodes

    chunks = [nodes[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda chunk: create_nodes(cp.api_client(), chunk), chunks))


def run_profile(args, limits: str, scenarios: list[str]) -> dict[str, dict]:
    from devcluster.cluster import ControlPlane, free_port
    from devcluster.serve_process import GpuledgerServe

    metrics_port = free_port()
    settings = LIMITS[limits]
    print(
        f"\n== limits {limits}: kube-controller-manager --kube-api-qps={settings['qps']} "
        f"--kube-api-burst={settings['burst']} --concurrent-job-syncs={CONCURRENT_JOB_SYNCS}; "
        f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs; {os.cpu_count()} CPUs",
        flush=True,
    )
    results: dict[str, dict] = {}
    with ControlPlane(extra_controller_args=controller_args(limits, metrics_port)) as cp:
        nodes = cluster_nodes(args.nodes)
        t0 = time.monotonic()
        create_cluster_nodes(cp, nodes, min(8, args.clients))
        webhook = GpuledgerServe(cp, shipped_config(), "--log-level", args.log_level, "--log-format", "json")
        try:
            webhook.wait("/readyz", timeout=300)
            cp.wait_for(
                lambda: webhook.metric("agentaflow_gpu_total") == len(nodes) * GPUS_PER_NODE,
                timeout=120,
                interval=0.5,
                what="the ledger holding every node",
            )
            webhook.register("Fail", 10)
            print(f"cluster up in {time.monotonic() - t0:.0f} s", flush=True)
            h = Harness(
                cp, webhook, Scraper(cp, webhook, metrics_port), nodes, limits, args.clients, args.timeout
            )
            h.wait_controllers_idle()
            order = [s for s in RUN_ORDER if s in scenarios]
            for i, name in enumerate(order):
                results[name] = RUNNERS[name](h, args.nodes)
                if i + 1 < len(order):  # the last one's leftovers go with the control plane
                    cleared = time.monotonic()
                    h.clear(CLEARED[name], name)
                    print(f"  (cleared in {time.monotonic() - cleared:.0f} s)", flush=True)
        finally:
            stopping = time.monotonic()
            webhook.stop()
    print(f"(control plane and webhook stopped in {time.monotonic() - stopping:.0f} s)", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=FULL_NODES, help="Node objects, 8 GPUs each (default 500)")
    p.add_argument(
        "--scenario",
        default=",".join(SCENARIOS),
        help=f"comma-separated, of {', '.join(SCENARIOS)} (default: all)",
    )
    p.add_argument(
        "--limits",
        default="default,large",
        help="the controller-manager's client rate limits, comma-separated: default (qps 20, burst 30, its "
        "own defaults) and/or large (qps 100, burst 200, as large clusters set them)",
    )
    p.add_argument("--clients", type=int, default=16, help="concurrent API clients creating workloads")
    p.add_argument("--timeout", type=float, default=1800.0, help="longest wait for one scenario, seconds")
    p.add_argument(
        "--log-level",
        default="INFO",
        help="gpuledger serve's log level (INFO as shipped: a line per admission)",
    )
    p.add_argument("--json", help="write {scenario: {seconds, pods, peer: {name, seconds}, ...}} here")
    args = p.parse_args(argv)
    asked = [s.strip() for s in args.scenario.split(",") if s.strip()]
    unknown = [s for s in asked if s not in SCENARIOS]
    if unknown:
        p.error(f"--scenario {','.join(unknown)}: expected some of {', '.join(SCENARIOS)}")
    profiles = [s.strip() for s in args.limits.split(",") if s.strip()]
    if not profiles or any(s not in LIMITS for s in profiles):
        p.error(f"--limits {args.limits!r}: expected default and/or large")
    if args.nodes < NODES_PER_LEAF:
        p.error(f"--nodes {args.nodes}: at least {NODES_PER_LEAF} (one leaf)")
    runnable = [s for s in asked if s in RUNNERS]

    from devcluster.cluster import missing_binaries

    if runnable and missing_binaries(with_controllers=True):
        print("kube-apiserver or kube-controller-manager missing: run `make apiserver`", file=sys.stderr)
        return 2
    by_profile = {limits: run_profile(args, limits, runnable) for limits in profiles} if runnable else {}

    if not runnable:
        return 0
    print(f"\ncluster-scale figures, {args.nodes} nodes x {GPUS_PER_NODE} GPUs, {os.cpu_count()} CPUs:")
    print(
        f"{'scenario':<10}{'pods':>7}  " + "".join(f"{'s, limits ' + lim:>20}" for lim in profiles) + "  peer"
    )
    out: dict[str, dict] = {}
    for name in runnable:
        rows = {lim: by_profile[lim][name] for lim in profiles if name in by_profile[lim]}
        peer = PEERS[name]
        first = rows[profiles[0]]
        out[name] = {
            "seconds": first["seconds"],
            "pods": first["pods"],
            "peer": {"name": peer[0], "seconds": peer[1]} if peer else None,
            "limits": profiles[0],  # which profile "seconds" is; every one is under by_limits
            "nodes": args.nodes,
            "by_limits": rows,
        }
        peer_text = f"{peer[0]} {peer[1]:g} s (its own machine)" if peer else "-"
        print(
            f"{name:<10}{first['pods']:>7}  "
            + "".join(f"{rows[lim]['seconds']:>20.2f}" for lim in profiles)
            + f"  {peer_text}"
        )
    if args.json:
        out["settings"] = {
            "nodes": args.nodes,
            "gpus_per_node": GPUS_PER_NODE,
            "cpus": os.cpu_count(),
            "limits": {lim: LIMITS[lim] for lim in profiles},
            "concurrent_job_syncs": CONCURRENT_JOB_SYNCS,
            "clients": args.clients,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
