"""Preemption plan benchmark: the time of one plan at 65,000 nodes (the largest clusters), the core only.

    .venv/bin/python tests/benchmarks/bench_preemption.py [--nodes 65000] [--gpus 8] [--repeats 5]

The cluster is bench_allocator's `--scale` one (65,000 nodes x 8 GPUs, leaves of ~25 nodes, 16 leaves a
spine). Queue team-a has no quota and borrows every GPU with single 8-GPU pods (65,000 of them, started one
second apart); team-b has half the cluster as its quota and asks, each in turn: one 8-GPU pod, and a gang of
16 pods x 8 GPUs that must stay within one leaf window. Each row is the median of `--repeats` plans of the
same ask (the ledger and the queues do not change between them), in wall-clock and CPU time, with the
victims it names and the number of questions it asked the ledger (`LedgerView.decide_without`). What the
plan reads is built once beforehand, as the ledger actor keeps it: the running workloads, the queues'
usage, the capacity by product.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from gpuledger.core.model import GroupSpec, Placement, Request  # noqa: E402
from gpuledger.core.queues.gpu_queues import ANY_PRODUCT, GPUQueue, ProductQuota, QueueSet  # noqa: E402
from gpuledger.core.queues.ledger_view import LedgerView  # noqa: E402
from gpuledger.core.queues.preemption import Plan, Planner, Preemptor, Running  # noqa: E402
from gpuledger.core.queues.quotas import Usage  # noqa: E402
from tests.benchmarks.bench_allocator import cluster, fresh  # noqa: E402


class CountingView(LedgerView):
    """The ledger view, counting the planner's questions."""

    asked = 0

    def decide_without(self, request, holdings):
        self.asked += 1
        return super().decide_without(request, holdings)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=65_000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--leaves-per-spine", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    nodes = cluster(args.nodes, args.gpus, args.leaves_per_spine)
    led = fresh(nodes)
    view = CountingView(led)
    running = []
    for i in range(args.nodes):
        rid = f"a{i}"
        placed = led.reserve(Request(id=rid, gpus=args.gpus), float(i))
        assert isinstance(placed, Placement), placed
        running.append(Running(f"pod/team-a/p{i}", "team-a", 0, float(i), (rid,), view.use_of([rid])))
    total = args.nodes * args.gpus
    queues = QueueSet([GPUQueue("team-a"), GPUQueue("team-b", (ProductQuota(ANY_PRODUCT, total // 2),))])
    usage = Usage.of(queues, [(r.queue, r.use) for r in running])
    t1 = time.perf_counter()
    capacity = view.capacity()
    capacity_ms = (time.perf_counter() - t1) * 1000
    print(
        f"cluster: {args.nodes} nodes x {args.gpus} GPUs, full: team-a borrows all {total} GPUs with "
        f"{len(running)} pods; built in {time.perf_counter() - t0:.1f} s (capacity by product: "
        f"{capacity_ms:.0f} ms, read once per cycle)"
    )
    now = float(args.nodes) + 3600.0
    asks = [
        ("one 8-GPU pod", Request(id="b-pod", gpus=args.gpus)),
        (
            "a 16-pod x 8-GPU gang in one leaf window",
            Request(
                id="b-gang", gpus=args.gpus, group=GroupSpec("job/team-b/gang", 16, max_nodes_per_leaf=16)
            ),
        ),
    ]
    for what, request in asks:
        times, cpu_times, asked = [], [], 0
        plan = None
        for _ in range(args.repeats):
            view.asked = 0
            planner = Planner(queues, usage, capacity, view)
            t0, c0 = time.perf_counter(), time.process_time()
            plan = planner.plan(Preemptor(request.id, "team-b", request), running, {}, now)
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
            asked = view.asked
        assert isinstance(plan, Plan) and plan.victims, plan
        median_ms, cpu_ms = statistics.median(times) * 1000, statistics.median(cpu_times) * 1000
        print(
            f"one preemption plan at {args.nodes} nodes, {what}: median {median_ms:.0f} ms "
            f"({cpu_ms:.0f} ms CPU), min {min(times) * 1000:.0f} ms over {args.repeats}; "
            f"{len(plan.victims)} victim(s) ({plan.freed_milli // 1000} GPUs), {asked} question(s) to the "
            "ledger"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
