"""GPU queues in the ledger: the time to reclaim GPUs for a waiting pod in a full cluster, the ledger's part.

    .venv/bin/python tests/benchmarks/bench_queue_ledger.py [--nodes 500] [--gpus 8] [--repeats 5]

A full cluster of `--nodes` x `--gpus` GPUs, followed as the ledger follows the API (Node, GPUQueue,
Namespace and Pod objects through `apply_object`): queue team-a has no quota and borrows every GPU with
single pods of all of a node's GPUs; team-b has half the cluster as its quota. A pod of team-b asks for one
node's GPUs: admitted waiting, then a place pass plans the preemption (the pass reads every running
workload, plans, keeps the victim's node); the victim's pod is deleted; the next place pass places the pod
on the kept node. Each row is the median of `--repeats` rounds, wall-clock. What the API server and the
evictor add (the peers' published figures are end to end) is measured by tests/benchmarks/bench_cluster.py.
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

from gpuledger import strategies  # noqa: E402, F401  (registers the built-in strategies)
from gpuledger.core.ledger import Ledger, LedgerConfig, Waiting  # noqa: E402
from gpuledger.core.model import Placement, Request  # noqa: E402
from gpuledger.names import QUEUE_LABEL  # noqa: E402
from tests.core.core_factory import node, pod  # noqa: E402
from tests.core.waiting_factory import gated_pod  # noqa: E402

KEY = b"bench-queues"


def build(nodes: int, gpus: int) -> tuple[Ledger, dict[str, dict]]:
    led = Ledger(LedgerConfig(placement_key=KEY, default_strategy="best_fit"))
    for i in range(nodes):
        led.apply_object(node(f"n{i:05d}", gpus, leaf=f"l{i // 25}"), 0.0)
    half = nodes * gpus // 2
    for name, quota in (("team-a", 0), ("team-b", half)):
        led.apply_object(
            {
                "kind": "GPUQueue",
                "metadata": {"name": name},
                "spec": {"quotas": [{"product": "any", "gpus": quota}]},
            },
            0.0,
        )
    for ns, queue in (("ns-a", "team-a"), ("ns-b", "team-b")):
        led.apply_object({"kind": "Namespace", "metadata": {"name": ns, "labels": {QUEUE_LABEL: queue}}}, 0.0)
    pods: dict[str, dict] = {}
    for i in range(nodes):
        name = f"a{i:05d}"
        req = Request(id=f"r-{name}", gpus=gpus, namespace="ns-a", name=name)
        placed = led.reserve_or_wait(req, float(i))
        assert isinstance(placed, Placement), placed
        stored = pod(name, namespace="ns-a", placement=placed, key=KEY)
        stored["metadata"]["uid"] = f"uid-{name}"
        led.apply_object(stored, float(i))
        pods[name] = stored
    return led, pods


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    led, pods = build(args.nodes, args.gpus)
    built = time.perf_counter() - t0
    now = 1e6
    plan_s, place_s = [], []
    for r in range(args.repeats):
        name = f"b{r}"
        req = Request(id=f"r-{name}", gpus=args.gpus, namespace="ns-b", name=name)
        answer = led.reserve_or_wait(req, now)
        assert isinstance(answer, Waiting), answer
        led.apply_object(gated_pod(name, answer, KEY, namespace="ns-b"), now)
        t0 = time.perf_counter()
        assert led.place_waiting(now) == []
        plan_s.append(time.perf_counter() - t0)
        (plan,) = [p for p in led.preemptions() if p.name == name]
        (victim,) = plan.victims
        led.delete_object(pods.pop(victim.pods[0][1]))
        now += 10.0
        t0 = time.perf_counter()
        placed = led.place_waiting(now)
        place_s.append(time.perf_counter() - t0)
        assert [(p.name, p.placement.node) for p in placed] == [(name, plan.nodes[0])]
        now += 10.0
    print(
        f"queues in the ledger, {args.nodes} nodes x {args.gpus} GPUs (full, team-a borrowing all): "
        f"a place pass that plans one preemption median {statistics.median(plan_s) * 1000:.1f} ms; "
        f"the pass that places the preemptor once its victim is gone median "
        f"{statistics.median(place_s) * 1000:.2f} ms (setup {built:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
