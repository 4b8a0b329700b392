"""Per-pod admission cost of a gang's pods against the gang's size, in process: devcluster's sample cluster
(8 GPUs a node, 8 nodes a leaf, 8 leaves a spine, as bench_cluster.py), one Job's one-GPU pods as a gang
preferring spine-0, admitted one at a time through `LedgerService.admit` as the webhook's ledger call makes
them (the pods parsed by `request_from_pod` from the Job, as the webhook parses them).

    .venv/bin/python tests/benchmarks/bench_gang_scale.py                      # 5,000 nodes: 512 vs 5,120
    .venv/bin/python tests/benchmarks/bench_gang_scale.py --nodes 500 1000 2000 5000 --pods 512 5120
    .venv/bin/python tests/benchmarks/bench_gang_scale.py --profile            # and a cProfile of the claims

For each gang: the ledger's time for its first pod (the plan, over the leaves), then per later pod (a claim of
one of its slots): the mean, and the 100th, 1,000th and 5,000th pod; in this process's CPU time too (the
2-core machine is often shared). The ratio compares the per-claim cost of the largest gang with the smallest
in the same run: near 1 when a claim costs the same whatever the gang's size.

Then what every pod of the gang carries past the ledger, which grows with the gang (each placement carries
the gang's whole plan): the placement annotation's size and its encode and decode (the mutating webhook
signs it, the validating webhook and a rebuild read it), and the placement pickled and unpickled (the Ray
actor's answer to the webhook).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pickle
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gpuledger.strategies  # noqa: E402,F401  (the strategies register themselves)
from gpuledger.core.ledger import LedgerConfig  # noqa: E402
from gpuledger.core.model import Placement  # noqa: E402
from gpuledger.core.pods.placement_codec import Binding, decode_placement, encode_placement  # noqa: E402
from gpuledger.core.pods.request import request_from_pod  # noqa: E402
from gpuledger.service.ledger_service import AdmitCall, LedgerService  # noqa: E402
from tests.benchmarks.bench_cluster import GPUS_PER_NODE, cluster_nodes  # noqa: E402  (the same cluster)

KEY = b"bench-key"
ANNOTATIONS = {"topology.scheduler/gang": "true", "topology.scheduler/preferred-domain": "spine-0"}


def gang_job(pods: int) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "gang", "namespace": "gang", "annotations": dict(ANNOTATIONS)},
        "spec": {"parallelism": pods, "completions": pods},
    }


def gang_pod(i: int) -> dict:
    resources = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1", "memory": "4Gi"}}
    return {
        "metadata": {"name": f"gang-{i}", "namespace": "gang"},
        "spec": {"containers": [{"name": "main", "image": "train", "resources": resources}]},
    }


def service_with(nodes: list[dict]) -> LedgerService:
    service = LedgerService(LedgerConfig(placement_key=KEY))
    service.resync(nodes, 0.0)
    return service


def admit_gang(service: LedgerService, pods: int, profile: cProfile.Profile | None = None) -> dict:
    """Every pod of one gang admitted in turn: (wall, CPU) seconds per pod, and the last placement."""
    owner = gang_job(pods)
    requests = []
    for i in range(pods):
        req = request_from_pod(gang_pod(i), owner, reservation_id=f"gang-{i}", namespace="gang")
        assert req is not None
        requests.append(req)
    wall, cpu = [], []
    gc.collect()
    last = None
    for i, req in enumerate(requests):
        if profile is not None and i == 1:
            profile.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        (last,) = service.admit([AdmitCall(req, may_wait=True)], 0.0)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        assert isinstance(last, Placement), last
    if profile is not None:
        profile.disable()
    return {"wall": wall, "cpu": cpu, "last": last}


def carried(placement: Placement, repeats: int = 5) -> dict:
    """What one placement of the gang costs past the ledger (the best of `repeats`, milliseconds)."""
    binding = Binding("gang", "gang-x")

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1000

    text = encode_placement(placement, KEY, binding)
    pickled = pickle.dumps(placement)
    return {
        "slots": len(placement.group_plan),
        "annotation_bytes": len(text),
        "encode_ms": best(lambda: encode_placement(placement, KEY, binding)),
        "decode_ms": best(lambda: decode_placement(text, KEY)),
        "pickle_bytes": len(pickled),
        "pickle_ms": best(lambda: pickle.loads(pickle.dumps(placement))),
    }


def at(seq: list[float], n: int) -> str:
    return f"{seq[n - 1] * 1000:.3f}" if len(seq) >= n else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[5000])
    p.add_argument("--pods", type=int, nargs="+", default=[512, 5120], help="gang sizes (pods of 1 GPU)")
    p.add_argument("--profile", action="store_true", help="and a cProfile of the largest gang's claims")
    args = p.parse_args()
    for nodes in args.nodes:
        objects = cluster_nodes(nodes)
        claim_cpu: dict[int, float] = {}
        for pods in args.pods:
            if pods > nodes * GPUS_PER_NODE:
                continue
            got = admit_gang(service_with(objects), pods)
            wall, cpu = got["wall"], got["cpu"]
            claim_cpu[pods] = statistics.mean(cpu[1:])
            first_ms, claim_wall = wall[0] * 1000, statistics.mean(wall[1:]) * 1000
            print(
                f"gang of {pods} one-GPU pods on {nodes} nodes: first pod (the plan) {first_ms:.1f} ms; "
                f"a claim: mean {claim_wall:.3f} ms wall, {claim_cpu[pods] * 1000:.3f} ms CPU; "
                f"pod 100 / 1,000 / 5,000: {at(wall, 100)} / {at(wall, 1000)} / {at(wall, 5000)} ms; "
                f"whole gang {sum(wall):.2f} s"
            )
            c = carried(got["last"])
            print(
                f"  each pod carries the gang's plan ({c['slots']} slots): annotation "
                f"{c['annotation_bytes']:,} bytes, encode {c['encode_ms']:.2f} ms, "
                f"decode {c['decode_ms']:.2f} ms; pickled {c['pickle_bytes']:,} bytes, "
                f"pickle + unpickle {c['pickle_ms']:.2f} ms"
            )
            if args.profile and pods == max(args.pods):  # a run of its own: the timed one is not profiled
                profile = cProfile.Profile()
                admit_gang(service_with(objects), pods, profile)
                pstats.Stats(profile).sort_stats("cumulative").print_stats(20)
        if len(claim_cpu) > 1:
            small, large = min(claim_cpu), max(claim_cpu)
            print(
                f"  per-claim CPU, gang of {large} against {small} on {nodes} nodes: "
                f"{claim_cpu[large] / claim_cpu[small]:.2f}x (gang {large / small:.0f}x the size)"
            )


if __name__ == "__main__":
    main()
