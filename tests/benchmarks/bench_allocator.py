"""Allocator core benchmark: placements/s against a naive scan measured in the same run, denials/s against
the full walk, gang latency, rebuild time and resident memory.

    .venv/bin/python tests/benchmarks/bench_allocator.py [--nodes 10000] [--gpus 8] [--leaves-per-spine 16]
    .venv/bin/python tests/benchmarks/bench_allocator.py --denials-only --denial-nodes 1000 10000
    .venv/bin/python tests/benchmarks/bench_allocator.py --scale  # 65,000 nodes, 500,000 pods, vs targets
    .venv/bin/python tests/benchmarks/bench_allocator.py --placements-only --strategies best_fit,fgd_host
    .venv/bin/python tests/benchmarks/bench_allocator.py --classes-cost  # placements with/without classes

The naive baseline is the same ledger with its strategies' candidate walks switched off, so every
placement filters and scores every node (what a scheduler without an index does). The denial baseline is
the same ledger answering each denial with `Diagnoser.diagnose_full` (every node classified, as before the
per-shape diagnosis). Placement rates are given in wall-clock time and in this process's CPU time (what the
rate would be on an otherwise idle core; the 2-core machine is often shared).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from gpuledger.core.ledger import Ledger, LedgerConfig  # noqa: E402
from gpuledger.core.model import Denial, Device, GroupSpec, NodeInfo, Placement, Request  # noqa: E402
from gpuledger.core.pods import objects as kube  # noqa: E402
from gpuledger.core.pods import placement_codec  # noqa: E402
from gpuledger.service.ledger_service import AdmitCall  # noqa: E402
from gpuledger.strategies import Strategy  # noqa: E402

KEY = b"bench-key"


def cluster(nodes: int, gpus: int, leaves_per_spine: int) -> list[NodeInfo]:
    """`nodes` nodes over spines of `leaves_per_spine` leaves, ~nodes/(16*spines) per leaf."""
    per_leaf = max(1, round(nodes / (leaves_per_spine * max(1, round(nodes / (leaves_per_spine * 25))))))
    out = []
    for i in range(nodes):
        leaf_no = i // per_leaf
        spine_no = leaf_no // leaves_per_spine
        out.append(
            NodeInfo(
                name=f"node-{i:05d}",
                cpu_milli=128_000,
                memory_mib=1_048_576,
                devices=tuple(Device(index=d, product="A100", memory_mib=81920) for d in range(gpus)),
                spine=f"spine-{spine_no}",
                leaf=f"leaf-{spine_no}-{leaf_no % leaves_per_spine}",
                product="A100",
            )
        )
    return out


def fresh(nodes: list[NodeInfo], strategy: str = "best_fit") -> Ledger:
    led = Ledger(LedgerConfig(default_strategy=strategy, placement_key=KEY))
    for n in nodes:
        led.upsert_node(n)
    return led


def rate(led: Ledger, count: int, strategy: str, prefix: str) -> float:
    return rates(led, count, strategy, prefix)[0]


def rates(led: Ledger, count: int, strategy: str, prefix: str) -> tuple[float, float]:
    """(placements per wall-clock second, per second of this process's CPU time)."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(count):
        r = led.reserve(
            Request(id=f"{prefix}{i}", gpus=1, cpu_milli=1000, memory_mib=4096, strategy=strategy), 0.0
        )
        assert isinstance(r, Placement), r
    return count / (time.perf_counter() - t0), count / max(1e-9, time.process_time() - c0)


class _NoIndex:
    """Wraps a strategy so the ledger scans every node (the naive baseline)."""

    def __init__(self, inner: Strategy):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def candidates(self, request, ctx, leaves):
        return None


def naive_rate(nodes, count, strategy) -> float:
    return naive_rates(nodes, count, strategy)[0]


def naive_rates(nodes, count, strategy) -> tuple[float, float]:
    import gpuledger.core.plugins.registry as registry

    led = fresh(nodes, strategy)
    canonical = registry.canonical_name(strategy)
    original = registry._INSTANCES.get(canonical) or registry.get_strategy(canonical)
    registry._INSTANCES[canonical] = _NoIndex(original)  # type: ignore[assignment]
    try:
        return rates(led, count, strategy, "naive-")
    finally:
        registry._INSTANCES[canonical] = original


def _denied(led: Ledger, rid: str) -> None:
    d = led.reserve(Request(id=rid, gpus=1, cpu_milli=1000, memory_mib=4096), 0.0)
    assert isinstance(d, Denial), d


def denial_rates(nodes: list[NodeInfo], count: int, full_count: int) -> dict[str, float]:
    """Denials/s of a 1-GPU pod on a full cluster: repeated with nothing changed in between, and with one
    release + one placement (the freed GPU taken again) before each; the same with the full walk; and the
    first denial of a shape (the one full classification it costs)."""
    led = fresh(nodes)
    total = sum(len(n.devices) for n in nodes)
    for i in range(total):
        r = led.reserve(Request(id=f"f{i}", gpus=1, cpu_milli=1000, memory_mib=4096), 0.0)
        assert isinstance(r, Placement), r
    out: dict[str, float] = {}
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    _denied(led, "cold")
    out["first"] = time.perf_counter() - t0
    out["first_cpu"] = time.process_time() - c0

    def timed(n: int, prefix: str, churn: bool) -> float:
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            if churn:  # the GPU a pod frees is taken by the next placement; then one more pod is denied
                led.release(f"f{i}")
                r = led.reserve(Request(id=f"f{i}", gpus=1, cpu_milli=1000, memory_mib=4096), 0.0)
                assert isinstance(r, Placement), r
            _denied(led, f"{prefix}{i}")
        out[f"{prefix}cpu"] = n / (time.process_time() - c0)
        return n / (time.perf_counter() - t0)

    def churn_only(n: int) -> float:
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            led.release(f"f{i}")
            led.reserve(Request(id=f"f{i}", gpus=1, cpu_milli=1000, memory_mib=4096), 0.0)
        out["churn_cost_cpu"] = n / (time.process_time() - c0)
        return n / (time.perf_counter() - t0)

    out["repeat"] = timed(count, "d-", churn=False)
    out["churn"] = timed(count, "c-", churn=True)
    out["churn_cost"] = churn_only(count)
    gc.collect()  # a shape not asked before, after the churn: counted by node class, not node by node
    t0 = time.perf_counter()
    d = led.reserve(Request(id="new-shape", gpus=2, cpu_milli=2000, memory_mib=8192), 0.0)
    out["new_shape"] = time.perf_counter() - t0
    assert isinstance(d, Denial), d
    gc.collect()
    t0 = time.perf_counter()
    d = led.reserve(Request(id="new-shape-2", gpus=3, cpu_milli=1000, memory_mib=4096), 0.0)
    out["new_shape"] = min(out["new_shape"], time.perf_counter() - t0)
    led._diagnoser.diagnose = led._diagnoser.diagnose_full  # type: ignore[method-assign]  # the baseline: every node classified
    out["full"] = timed(full_count, "full-", churn=False)
    out["first_full"] = 1 / out["full"]  # the per-node walk a first denial cost before node classes
    return out


def report_denials(
    sizes: list[int], gpus: int, leaves_per_spine: int, count: int, full_count: int, placements: int
) -> None:
    for size in sizes:
        nodes = cluster(size, gpus, leaves_per_spine)
        place, place_cpu = rates(fresh(nodes), min(placements, size * gpus), "best_fit", "p-")
        d = denial_rates(nodes, count, full_count)
        print(
            f"denials, {size} nodes x {gpus} GPUs (cluster full, 1-GPU pod, best_fit): "
            f"{d['repeat']:>7.0f}/s repeated, full walk {d['full']:>5.0f}/s "
            f"(ratio {d['repeat'] / d['full']:.0f}x), "
            f"placements {place:.0f}/s (denial/placement {d['repeat'] / place:.2f}); "
            f"release + placement + denial loop {d['churn']:.0f}/s vs release + placement alone "
            f"{d['churn_cost']:.0f}/s; CPU time: denials {d['d-cpu']:.0f}/s, placements {place_cpu:.0f}/s, "
            f"loops {d['c-cpu']:.0f}/s vs {d['churn_cost_cpu']:.0f}/s; "
            f"first denial on the ledger {d['first'] * 1000:.2f} ms "
            f"({d['first_cpu'] * 1000:.2f} ms CPU), first denial of a further new shape "
            f"{d['new_shape'] * 1000:.2f} ms (node-by-node walk, same run: {d['first_full'] * 1000:.1f} ms)"
        )


def classes_cost(nodes: list[NodeInfo], placements: int, churn: int) -> tuple[float, float, float, float]:
    """What keeping the node classes current costs: a ledger with the classes kept (the default) and one
    without (`ClusterIndex.dirty` off), one at a time in this process (each alone in the heap, so the cyclic
    collector's share is its own), alternating over 4 rounds; CPU time, garbage collection included.
    (placements/s kept, not kept, release + placement of random pods/s kept, not kept)."""
    import random

    req = {"gpus": 1, "cpu_milli": 1000, "memory_mib": 4096}
    spent = {("place", True): 0.0, ("place", False): 0.0, ("churn", True): 0.0, ("churn", False): 0.0}
    for k in range(4):
        for kept in (True, False) if k % 2 else (False, True):
            led = fresh(nodes)
            if not kept:
                led.index.dirty = None  # nothing queued for the classes: what placements cost without them
            gc.collect()
            c0 = time.process_time()
            for i in range(placements):
                led.reserve(Request(id=f"r{i}", **req), 0.0)
            spent["place", kept] += time.process_time() - c0
            rnd = random.Random(k)
            ids = [f"r{rnd.randrange(placements)}" for _ in range(churn)]
            c0 = time.process_time()
            for rid in ids:
                led.release(rid)
                led.reserve(Request(id=rid, **req), 0.0)
            spent["churn", kept] += time.process_time() - c0
            del led
            gc.collect()
    return (
        4 * placements / spent["place", True],
        4 * placements / spent["place", False],
        4 * churn / spent["churn", True],
        4 * churn / spent["churn", False],
    )


def gang_latency(nodes, repeats: int = 20) -> tuple[float, float, float, float]:
    led = fresh(nodes)
    # some background load so leaves differ
    for i in range(0, len(nodes) * 2, 1):
        led.reserve(Request(id=f"bg{i}", gpus=1), 0.0)
    times = []
    for g in range(repeats):
        req = Request(id=f"gang{g}-0", gpus=8, group=GroupSpec(key=f"job/bench/g{g}", size=16))
        t0 = time.perf_counter()
        r = led.reserve(req, 0.0)
        times.append(time.perf_counter() - t0)
        assert isinstance(r, Placement), r
        assert len(r.group_plan) == 16
    first, rest = times[0], times[1:]
    times.sort()
    return (
        sum(times) / len(times) * 1000,
        times[-1] * 1000,
        first * 1000,
        sum(rest) / max(1, len(rest)) * 1000,
    )


def make_pods(nodes: list[NodeInfo], count: int, all_signed: bool = False):
    """`count` pods: 50% signed whole-GPU placements, 25% signed 250m shares, 25% plain cpu pods; with
    `all_signed` (--scale) 75% whole-GPU and 25% shares, every pod carrying a signed placement."""
    led = fresh(nodes)
    whole, shares = (count - count // 4 if all_signed else count // 2), count // 4
    plain = count - whole - shares
    # shares first: a share placed after the whole GPUs walks every full node (best_fit's bucket of nodes
    # with no whole GPU free comes first in its order), which at 65,000 nodes takes an hour to set up
    for i in range(shares):
        p = led.reserve(Request(id=f"s{i}", gpu_milli=250, gpu_memory_mib=8192, cpu_milli=250), 0.0)
        yield _pod(f"s{i}", p)
    for i in range(whole):
        p = led.reserve(Request(id=f"w{i}", gpus=1, cpu_milli=500, memory_mib=1024), 0.0)
        yield _pod(f"w{i}", p)
    for i in range(plain):
        yield {
            "kind": "Pod",
            "metadata": {"name": f"c{i}", "namespace": "bench", "uid": f"u-c{i}"},
            "spec": {
                "nodeName": nodes[i % len(nodes)].name,
                "containers": [{"name": "m", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
            },
            "status": {"phase": "Running"},
        }


def _pod(name: str, p: Placement) -> dict:
    """A stored pod as the webhook leaves it: its placement signed with where it was issued (version 2).
    Half are named pods (bound by name), half a ReplicaSet's (bound by generateName and owner uid)."""
    meta: dict = {"name": name, "namespace": "bench", "uid": f"u-{name}"}
    if int(name[1:]) % 2:
        owner = f"rs-{int(name[1:]) % 97}"
        meta["generateName"] = name[0]  # (the name is it and a suffix)
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": owner,
                "uid": f"u-{owner}",
                "controller": True,
            }
        ]
        binding = placement_codec.Binding("bench", generate_name=name[0], owner_uid=f"u-{owner}")
    else:
        binding = placement_codec.Binding("bench", name)
    meta["annotations"] = {kube.PLACEMENT_ANNOTATION: placement_codec.encode_placement(p, KEY, binding)}
    return {
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": p.node,
            "containers": [
                {
                    "name": "m",
                    "resources": {
                        "requests": {"cpu": f"{p.cpu_milli}m", "memory": f"{p.memory_mib}Mi"},
                        "limits": {"nvidia.com/gpu": str(len(p.devices))} if p.devices else {},
                    },
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def node_objects(nodes: list[NodeInfo]):
    for n in nodes:
        yield {
            "kind": "Node",
            "metadata": {
                "name": n.name,
                "labels": {
                    "topology.scheduler/spine": n.spine,
                    "topology.scheduler/leaf": n.leaf,
                    "nvidia.com/gpu.product": n.product,
                    "nvidia.com/gpu.memory": "81920",
                },
            },
            "status": {
                "allocatable": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": str(len(n.devices))},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }


def _status_mib(field: str) -> float:
    """VmRSS / VmHWM of this process in MiB (VmHWM, unlike ru_maxrss, is not inherited across fork+exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def memory_child(args) -> None:
    """Runs in a fresh process: stream nodes + pods (JSON lines written by the parent) into rebuild."""
    base = _status_mib("VmRSS")

    def objects():
        with open(args.memory_child) as lines:
            for line in lines:
                yield json.loads(line)

    led = Ledger.rebuild(objects(), LedgerConfig(placement_key=KEY), now=0.0)
    gc.collect()
    print(
        json.dumps(
            {
                "peak_mib": _status_mib("VmHWM"),
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rss_mib": _status_mib("VmRSS"),
                "baseline_mib": base,
                "reservations": len(led.reservations()),
                "nodes": len(led.index.nodes),
            }
        )
    )


def rebuild_child(path: str, via: str) -> None:
    """Runs in a fresh process, as a restarted ledger does: read the objects (JSON lines written by the
    parent) into a list, then time their rebuild alone: `Ledger.rebuild` (via "core"), or the restarted
    ledger actor's first resync (via "actor": `LedgerActor` driven directly, no Ray; its steps and the heap's
    freezing included, what production runs after a crash)."""
    with open(path) as lines:
        objects = [json.loads(line) for line in lines]
    if via == "actor":
        import asyncio

        from gpuledger.ray.actor import LedgerActor

        actor = LedgerActor(LedgerConfig(placement_key=KEY), {"kind": "kubernetes"})
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    if via == "core":
        led = Ledger.rebuild(objects, LedgerConfig(placement_key=KEY), now=0.0)
    else:
        asyncio.run(actor.resync(objects))
        led = actor.service.ledger
    took, took_cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"seconds": took, "cpu_seconds": took_cpu, "placements": len(led.reservations())}))


def rebuilds_in_fresh_processes(path: str, runs: int, via: str) -> list[dict]:
    """`rebuild_child`'s figures from `runs` fresh processes, one after another."""
    out = []
    for _ in range(runs):
        run = subprocess.run(
            [sys.executable, __file__, "--rebuild-child", path, "--via", via],
            capture_output=True,
            text=True,
            check=True,
        )
        out.append(json.loads(run.stdout.strip().splitlines()[-1]))
    return out


def _fresh_line(what: str, runs: list[dict]) -> str:
    walls = ", ".join(f"{r['seconds']:.2f}" for r in runs)
    cpus = ", ".join(f"{r['cpu_seconds']:.2f}" for r in runs)
    median = statistics.median(r["seconds"] for r in runs)
    return (
        f"{what}: median {median:.2f} s of {walls} s ({cpus} s CPU; {runs[0]['placements']} placements "
        "restored)"
    )


def _stream(nodes, count, all_signed: bool = False):
    yield from node_objects(nodes)
    yield from make_pods(nodes, count, all_signed)


def write_objects(args) -> None:
    """Runs in a fresh process: write the nodes and pods as JSON lines (the parent stays small, so the
    memory child it starts next inherits no large peak: ru_maxrss survives fork and exec)."""
    nodes = cluster(args.nodes, args.gpus, args.leaves_per_spine)
    with open(args.write_objects, "w") as out:
        for obj in _stream(nodes, args.pods, args.scale):
            out.write(json.dumps(obj) + "\n")


def objects_and_memory(args) -> tuple[str, dict]:
    """(the JSON-lines file of nodes + pods, the memory child's figures), both from fresh processes."""
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    flags = ["--nodes", str(args.nodes), "--gpus", str(args.gpus), "--pods", str(args.pods)]
    flags += ["--leaves-per-spine", str(args.leaves_per_spine)] + (["--scale"] if args.scale else [])
    subprocess.run([sys.executable, __file__, *flags, "--write-objects", path], check=True)
    run = subprocess.run(
        [sys.executable, __file__, "--memory-child", path], capture_output=True, text=True, check=True
    )
    return path, json.loads(run.stdout.strip().splitlines()[-1])


def actor_calls(objects: list[dict], count: int = 200) -> tuple[float, float, dict]:
    """Median ms of an admit + claim through the actor's methods on a ledger rebuilt from `objects` by the
    cluster sync's path (`resync`), ms of one `status` report beside it, and admissions during a second
    resync of the same objects (a relist): one every 5 ms, each timed from when it was due to its answer."""
    import asyncio

    from gpuledger.ray.actor import LedgerActor

    async def during_resync(actor: LedgerActor) -> dict:
        waits: list[float] = []
        resyncing = True

        async def admissions() -> None:
            i = 0
            while resyncing:
                due = time.perf_counter() + 0.005
                await asyncio.sleep(0.005)
                await actor.admit([AdmitCall(Request(id=f"during-{i}", gpus=1))])
                waits.append(max(0.0, time.perf_counter() - due))
                i += 1

        task = asyncio.create_task(admissions())
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        report = await actor.resync(objects)
        took = time.perf_counter() - t0
        resyncing = False
        await task
        waits.sort()
        return {
            "seconds": took,
            "answered": len(waits),
            "kept": report["kept"],
            "median_ms": statistics.median(waits) * 1000 if waits else float("nan"),
            "max_ms": waits[-1] * 1000 if waits else float("nan"),
        }

    async def run() -> tuple[float, float, dict]:
        actor = LedgerActor(LedgerConfig(placement_key=KEY), {"kind": "kubernetes"})
        t0 = time.perf_counter()
        await actor.resync(objects)  # a restarted actor's first list (admissions: Unavailable until it ends)
        first = time.perf_counter() - t0
        took = []
        for i in range(count):
            t0 = time.perf_counter()
            await actor.admit([AdmitCall(Request(id=f"actor-{i}", gpus=1))])
            await actor.claim([(f"actor-{i}", f"uid-{i}")])
            took.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await actor.status()
        status_ms = (time.perf_counter() - t0) * 1000
        return statistics.median(took) * 1000, status_ms, {**await during_resync(actor), "first_s": first}

    try:
        return asyncio.run(run())
    finally:
        gc.unfreeze()  # the actor froze its ledger: let the caller's collections see it again


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--leaves-per-spine", type=int, default=16)
    ap.add_argument("--placements", type=int, default=40_000)
    ap.add_argument("--naive-placements", type=int, default=200)
    ap.add_argument("--pods", type=int, default=100_000)
    ap.add_argument("--denial-nodes", type=int, nargs="+", default=[1_000, 10_000])
    ap.add_argument("--denials", type=int, default=5_000)
    ap.add_argument("--full-denials", type=int, default=50)
    ap.add_argument("--denials-only", action="store_true", help="only the denial benchmark")
    ap.add_argument(
        "--scale",
        action="store_true",
        help="65,000 nodes and 500,000 pods (the largest clusters): inventory load, best_fit and "
        "fgd_host placements, 16-node gang, rebuild and peak memory against the targets",
    )
    ap.add_argument(
        "--strategies", help="comma-separated placement strategies to measure (default: all rows)"
    )
    ap.add_argument("--placements-only", action="store_true", help="only the placement rows")
    ap.add_argument(
        "--classes-cost",
        action="store_true",
        help="only what keeping the node classes current costs placements (two ledgers, one process)",
    )
    ap.add_argument("--memory-child", metavar="JSONL", help=argparse.SUPPRESS)
    ap.add_argument("--rebuild-child", metavar="JSONL", help=argparse.SUPPRESS)
    ap.add_argument("--via", choices=["core", "actor"], default="core", help=argparse.SUPPRESS)
    ap.add_argument(
        "--fresh-rebuilds",
        type=int,
        default=3,
        help="rebuilds timed in fresh processes each way, as a restarted ledger's (medians printed)",
    )
    ap.add_argument("--write-objects", metavar="JSONL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.scale:
        args.nodes, args.pods = 65_000, 500_000
    if args.write_objects:
        write_objects(args)
        return 0
    if args.memory_child:
        memory_child(args)
        return 0
    if args.rebuild_child:
        rebuild_child(args.rebuild_child, args.via)
        return 0
    if args.classes_cost:
        kept, bare, churn_kept, churn_bare = classes_cost(
            cluster(args.nodes, args.gpus, args.leaves_per_spine), args.placements, args.placements
        )
        print(
            f"node classes kept current, {args.nodes} nodes x {args.gpus} GPUs, CPU time: 1-GPU placements "
            f"{kept:.0f}/s vs {bare:.0f}/s without ({(bare / kept - 1) * 100:+.1f}% time), "
            f"release + placement of random pods {churn_kept:.0f}/s vs {churn_bare:.0f}/s "
            f"({(churn_bare / churn_kept - 1) * 100:+.1f}% time)"
        )
        return 0
    if args.denials_only:
        report_denials(
            args.denial_nodes,
            args.gpus,
            args.leaves_per_spine,
            args.denials,
            args.full_denials,
            args.placements,
        )
        return 0

    path, mem = ("", {}) if args.placements_only else objects_and_memory(args)
    nodes = cluster(args.nodes, args.gpus, args.leaves_per_spine)
    leaves = len({(n.spine, n.leaf) for n in nodes})
    spines = len({n.spine for n in nodes})
    print(f"cluster: {len(nodes)} nodes x {args.gpus} GPUs, {spines} spines, {leaves} leaves")
    t0, c0 = time.perf_counter(), time.process_time()
    fresh(nodes)
    print(
        f"inventory: {len(nodes)} upsert_node in {(time.perf_counter() - t0) * 1000:.0f} ms "
        f"({(time.process_time() - c0) * 1000:.0f} ms CPU)"
    )
    if args.scale:
        led = fresh(nodes)
        t0 = time.perf_counter()
        d = led.reserve(Request(id="first-denial", gpus=9), 0.0)
        assert isinstance(d, Denial), d
        print(f"first denial on the empty ledger: {(time.perf_counter() - t0) * 1000:.2f} ms")
        t0 = time.perf_counter()
        d = led.reserve(Request(id="new-shape", gpus=10, cpu_milli=1000), 0.0)
        assert isinstance(d, Denial), d
        print(f"first denial of a further new shape: {(time.perf_counter() - t0) * 1000:.2f} ms")
        del led

    results = {}
    strategies = (
        ("best_fit", "fgd_host")
        if args.scale
        else ("best_fit", "least_utilized", "consolidated", "distributed", "fgd_host")
    )
    if args.strategies:
        strategies = tuple(args.strategies.split(","))
    for strategy in strategies:
        led = fresh(nodes, strategy)
        indexed, indexed_cpu = rates(led, args.placements, strategy, "r-")
        del led
        if args.scale:  # a full scan of 65,000 nodes per placement is not worth the minutes
            results[strategy] = (indexed, indexed_cpu)
            print(
                f"single-GPU placements, {strategy:<15}: {indexed:>9.0f}/s "
                f"({indexed_cpu:.0f}/s of CPU time), "
                f"{args.placements} placements"
            )
            continue
        # fgd_host's full scan evaluates every node per placement: fewer placements keep it to seconds
        naive_count = args.naive_placements if strategy != "fgd_host" else max(10, args.naive_placements // 8)
        naive, naive_cpu = naive_rates(nodes, naive_count, strategy)
        results[strategy] = (indexed, naive)
        print(
            f"single-GPU placements, {strategy:<15}: {indexed:>9.0f}/s indexed, {naive:>7.0f}/s naive scan, "
            f"ratio {indexed / naive:6.1f}x  ({args.placements} vs {naive_count} placements; CPU time: "
            f"{indexed_cpu:.0f}/s vs {naive_cpu:.0f}/s)"
        )

    if args.placements_only:
        return 0
    if not args.scale:
        report_denials(
            args.denial_nodes,
            args.gpus,
            args.leaves_per_spine,
            args.denials,
            args.full_denials,
            args.placements,
        )

    mean_ms, worst_ms, first_ms, rest_ms = gang_latency(nodes)
    print(
        f"16-node gang (8 GPUs per pod): mean {mean_ms:.2f} ms, worst {worst_ms:.2f} ms over 20 gangs "
        f"(the first, which counts every leaf's bound for the shape, {first_ms:.2f} ms; mean of the other 19 "
        f"{rest_ms:.2f} ms)"
    )

    try:
        restarted = rebuilds_in_fresh_processes(path, args.fresh_rebuilds, "core")
        restarted_actor = rebuilds_in_fresh_processes(path, args.fresh_rebuilds, "actor")
        with open(path) as lines:
            objects = [json.loads(line) for line in lines]
    finally:
        os.unlink(path)
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    led = Ledger.rebuild(objects, LedgerConfig(placement_key=KEY), now=0.0)
    took_here, took_here_cpu = time.perf_counter() - t0, time.process_time() - c0
    took = statistics.median(r["seconds"] for r in restarted) if restarted else took_here
    took_actor = statistics.median(r["seconds"] for r in restarted_actor) if restarted_actor else float("nan")
    if restarted:
        print(
            _fresh_line(
                f"rebuild: {len(nodes)} nodes + {args.pods} pods, `Ledger.rebuild` in fresh processes",
                restarted,
            )
        )
        print(
            _fresh_line(
                "rebuild: the same objects as a restarted ledger actor's first resync (what a crash costs; "
                "fresh processes, no Ray)",
                restarted_actor,
            )
        )
    print(
        f"rebuild: the same in this process, after its placement runs: {took_here:.2f} s "
        f"({took_here_cpu:.2f} s CPU; {len(led.reservations())} placements restored)"
    )
    t0 = time.perf_counter()
    d = led.reserve(Request(id="after-rebuild", gpus=9), 0.0)
    assert isinstance(d, Denial), d
    print(f"first denial on the rebuilt ledger: {(time.perf_counter() - t0) * 1000:.2f} ms")
    del led
    gc.collect()
    call_ms, status_ms, during = actor_calls(objects)
    print(
        f"ledger actor with the shipped source (kubernetes; LedgerActor driven directly, no Ray), "
        f"{len(nodes)} nodes + {args.pods} pods: admit + claim median {call_ms:.3f} ms; one status report "
        f"{status_ms:.1f} ms"
    )
    print(
        f"the actor's first resync of these objects (after a restart: admissions answer Unavailable until it "
        f"ends; its steps and the heap's freezing included): {during['first_s']:.2f} s"
    )
    print(
        f"admissions during a resync of the same objects ({during['seconds']:.2f} s, built in steps): "
        f"{during['answered']} answered (one due every 5 ms; {during['kept']} kept at the swap), wait from "
        f"due to answer median {during['median_ms']:.1f} ms, max {during['max_ms']:.0f} ms"
    )
    del objects
    gc.collect()
    print(
        f"resident memory: peak {mem['peak_mib']:.0f} MiB VmHWM, ru_maxrss {mem['maxrss_mib']:.0f} MiB "
        f"(after rebuild {mem['rss_mib']:.0f} MiB) "
        f"for a process "
        f"holding a ledger of {mem['nodes']} nodes and {args.pods} pods, objects streamed from a file; "
        f"interpreter + imports alone {mem['baseline_mib']:.0f} MiB"
    )
    if args.scale:
        best = results["best_fit"]
        print(
            "scale targets: placements >= 20,000/s: best_fit "
            f"{best[0]:.0f}/s wall, {best[1]:.0f}/s CPU time; gang <= 5 ms: mean {mean_ms:.2f} ms; "
            f"rebuild <= 15 s: {took:.2f} s (`Ledger.rebuild`), {took_actor:.2f} s (the actor's first "
            f"resync; medians of {len(restarted) or 1} fresh processes each); "
            f"peak memory <= 1 GB: {mem['maxrss_mib']:.0f} MiB ru_maxrss"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
