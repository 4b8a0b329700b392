"""`gpuledger simulate`: replay a GPU-cluster workload through the ledger core and measure fragmentation.

The protocol is the one of Weng et al., "Beware of Fragmentation" (ATC'23): every pod of the trace, plus pods
drawn at random (seeded) from it until the requested GPU reaches `ratio` x the cluster's GPU capacity,
shuffled, placed one by one and never leaving. After each pod we record the arrived GPU request and the
allocated GPU (both milli-GPU); the result is the allocation ratio along the arrived-workload axis and the
unallocated share at 100% arrived, the median over seeds.

Placement is `Ledger.reserve` with the chosen strategy, the same call the webhook makes; nothing here places
a pod itself. Time (`now`) is a constant and randomness comes from the seed, so a run is reproducible.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gpuledger.core.model import MILLI_PER_GPU, NodeInfo, Placement, Request
from gpuledger.sim.ahead import AheadPools
from gpuledger.sim.traces import WORKLOADS, TraceError, limit_nodes, load_yaml
from gpuledger.sim.variants import VARIANT_SEED, load_variant
from gpuledger.strategies.fragmentation import WORKLOAD_KEY, TargetWorkload

if TYPE_CHECKING:
    from gpuledger.core.ledger import Ledger

DEFAULT_TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "openb"
DEFAULT_STRATEGIES = ("best_fit", "fgd", "fgd_host")
DEFAULT_SEED = 42  # the paper's artifact runs seeds 42..51
CURVE_STEP_PCT = 1


def requested_milli(request: Request) -> int:
    """GPU milli a request asks for (whole GPUs count 1000 each)."""
    return request.gpus * MILLI_PER_GPU + (request.gpu_milli if request.gpus == 0 else 0)


def gpu_capacity_milli(nodes: Iterable[NodeInfo]) -> int:
    return sum(MILLI_PER_GPU for node in nodes for device in node.devices if device.healthy)


# --- the protocol -----------------------------------------------------------------------------------------


def build_arrivals(
    pods: Sequence[Request],
    capacity_milli: int,
    ratio: float = 1.3,
    seed: int = DEFAULT_SEED,
    shuffle: bool = True,
    artifact_order: bool = False,
) -> list[Request]:
    """The arrival sequence: all pods, topped up by seeded sampling to `ratio` x capacity, then shuffled.

    `artifact_order`: shuffle the trace's pods and append the sampled ones after them, in the order drawn,
    as the paper's artifact does (`SortClusterPods`, then `tuneUpPods`), instead of shuffling everything.

    Sampling draws with replacement and stops at the first draw that would pass the target (as the paper's
    simulator does). A trace already above the target is thinned at random instead, so that a small
    cluster (`--limit-nodes`) still sees `ratio` x its own capacity. Copies get ids `name#k`.
    """
    rng = random.Random(seed)
    target = ratio * capacity_milli
    arrivals = list(pods)
    if artifact_order and shuffle:
        rng.shuffle(arrivals)
    total = sum(requested_milli(p) for p in arrivals)
    if total > target:
        while arrivals and total > target:
            total -= requested_milli(arrivals.pop(rng.randrange(len(arrivals))))
    elif any(requested_milli(p) for p in pods):
        copy = 0
        while True:
            pod = pods[rng.randrange(len(pods))]
            if total + requested_milli(pod) > target:
                break
            arrivals.append(replace(pod, id=f"{pod.id}#{copy}"))
            total += requested_milli(pod)
            copy += 1
    if shuffle and not artifact_order:
        rng.shuffle(arrivals)
    return arrivals


@dataclass
class Run:
    """One replay: the cumulative arrived and allocated GPU milli after each pod."""

    strategy: str
    seed: int
    capacity_milli: int
    arrived: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    placed: int = 0
    failed: int = 0
    seconds: float = 0.0
    free_at_100: dict[str, float] = field(default_factory=dict)  # where the free GPU is, % of capacity

    def allocation_pct_at(self, arrived_pct: float) -> float:
        """Allocation ratio (%) once the arrived GPU request reaches `arrived_pct`% of capacity (a step
        curve: the state after the last pod whose arrival keeps arrived at or below that point)."""
        i = bisect_right(self.arrived, arrived_pct / 100 * self.capacity_milli + 1e-9) - 1
        return 100.0 * self.allocated[i] / self.capacity_milli if i >= 0 else 0.0

    @property
    def unallocated_at_100(self) -> float:
        return 100.0 - self.allocation_pct_at(100.0)

    @property
    def unallocated_at_100_artifact(self) -> float:
        """100 - the mean allocation % over the pods whose arrival rounds to 100% of capacity (arrived in
        [99.5%, 100.5%)): how the artifact's `merge_alloc_discrete.py` reads its logs."""
        cap = self.capacity_milli
        pairs = zip(self.arrived, self.allocated, strict=True)
        values = [a for x, a in pairs if 995 * cap <= 1000 * x < 1005 * cap]
        if not values:
            return self.unallocated_at_100
        return 100.0 - 100.0 * sum(values) / len(values) / self.capacity_milli

    @property
    def max_arrived_pct(self) -> float:
        return 100.0 * self.arrived[-1] / self.capacity_milli if self.arrived else 0.0

    def curve(self, step: float = CURVE_STEP_PCT) -> tuple[list[float], list[float]]:
        points = [i * step for i in range(int(self.max_arrived_pct // step) + 1)]
        return points, [self.allocation_pct_at(x) for x in points]


LedgerFactory = Callable[[str, TargetWorkload], "Ledger"]


def default_ledger(strategy: str, workload: TargetWorkload) -> Ledger:
    """A fresh Ledger whose default strategy is `strategy`; the target workload reaches strategies that want
    one (FGD) through the ledger's plug-in inputs, not through a global."""
    from gpuledger.core.ledger import Ledger, LedgerConfig

    ledger = Ledger(LedgerConfig(default_strategy=strategy))
    ledger.context_extra[WORKLOAD_KEY] = workload
    return ledger


def replay(
    nodes: Sequence[NodeInfo],
    arrivals: Sequence[Request],
    strategy: str,
    seed: int,
    workload: TargetWorkload | None = None,
    ledger_factory: LedgerFactory = default_ledger,
    progress=None,
    prefetch_depth: int = 0,
) -> Run:
    """Place `arrivals` one by one through `Ledger.reserve`; pods never leave. `prefetch_depth`: as the
    webhook with that many placements admitted ahead per pod shape (gpuledger.sim.ahead)."""
    if workload is None:
        workload = TargetWorkload.from_requests(arrivals)
    ledger = ledger_factory(strategy, workload)
    for node in nodes:
        ledger.upsert_node(node)
    place = AheadPools(ledger, prefetch_depth).place if prefetch_depth else (lambda r: ledger.reserve(r, 0.0))
    run = Run(strategy, seed, gpu_capacity_milli(nodes))
    arrived = allocated = 0
    started = time.perf_counter()
    for request in arrivals:
        milli = requested_milli(request)
        if not run.free_at_100 and arrived + milli > run.capacity_milli:
            run.free_at_100 = free_breakdown(ledger, workload, run.capacity_milli)
        arrived += milli
        result = place(replace(request, strategy=strategy, seed=seed))
        if isinstance(result, Placement):
            allocated += milli
            run.placed += 1
        else:
            run.failed += 1
        run.arrived.append(arrived)
        run.allocated.append(allocated)
        if progress is not None:
            progress.update(1)
    run.seconds = time.perf_counter() - started
    if not run.free_at_100:
        run.free_at_100 = free_breakdown(ledger, workload, run.capacity_milli)
    return run


def free_breakdown(ledger: Ledger, workload: TargetWorkload | None, capacity_milli: int) -> dict[str, float]:
    """Where the free GPU capacity is (% of capacity): idle GPUs on nodes whose free CPU or memory is below
    what the workload's GPU pods bring per GPU ("idle_without_host"), other idle GPUs, partly used GPUs."""
    cpu_need = (workload.cpu_per_gpu_milli if workload else 0.0) * MILLI_PER_GPU
    mem_need = (workload.memory_per_gpu_milli if workload else 0.0) * MILLI_PER_GPU
    starved = idle = partial = 0
    for node in ledger.index.nodes.values():
        short = node.cpu_free < cpu_need or node.mem_free < mem_need
        for p, free in enumerate(node.dev_free_milli):
            if not node.dev_healthy[p] or node.dev_owner[p] is not None or free <= 0:
                continue
            if free >= MILLI_PER_GPU:
                if short:
                    starved += free
                else:
                    idle += free
            else:
                partial += free
    scale = 100.0 / capacity_milli if capacity_milli else 0.0
    return {"idle_without_host": starved * scale, "idle": idle * scale, "partial": partial * scale}


# --- several seeds and strategies ------------------------------------------------------------------------


@dataclass
class StrategyResult:
    strategy: str
    runs: list[Run]

    @property
    def unallocated_at_100(self) -> float:
        return statistics.median(r.unallocated_at_100 for r in self.runs)

    def median_curve(self, step: float = CURVE_STEP_PCT) -> tuple[list[float], list[float]]:
        top = min(r.max_arrived_pct for r in self.runs)
        points = [i * step for i in range(int(top // step) + 1)]
        return points, [statistics.median(r.allocation_pct_at(x) for r in self.runs) for x in points]

    def as_json(self, step: float = CURVE_STEP_PCT) -> dict:
        arrived, allocation = self.median_curve(step)
        return {
            "unallocated_at_100": round(self.unallocated_at_100, 4),
            "unallocated_at_100_by_seed": {str(r.seed): round(r.unallocated_at_100, 4) for r in self.runs},
            # the artifact's reading: mean allocation over the pods arriving in [99.5%, 100.5%)
            "unallocated_at_100_artifact": round(
                statistics.median(r.unallocated_at_100_artifact for r in self.runs), 4
            ),
            "failed_pods_median": statistics.median(r.failed for r in self.runs),
            "seconds_per_run": round(statistics.mean(r.seconds for r in self.runs), 3),
            "free_at_100_pct": {
                key: round(statistics.median(r.free_at_100.get(key, 0.0) for r in self.runs), 4)
                for key in ("idle_without_host", "idle", "partial")
            },
            "curve": {"arrived_pct": arrived, "allocation_pct": [round(a, 4) for a in allocation]},
        }


def simulate(
    nodes: Sequence[NodeInfo],
    pods: Sequence[Request],
    strategies: Sequence[str],
    seeds: Sequence[int],
    ratio: float = 1.3,
    shuffle: bool = True,
    ledger_factory: LedgerFactory = default_ledger,
    progress_factory=None,
    artifact_order: bool = False,
    prefetch_depth: int = 0,
) -> list[StrategyResult]:
    capacity = gpu_capacity_milli(nodes)
    if capacity <= 0:
        raise TraceError("the cluster has no GPU; expected nodes with at least one GPU device")
    arrivals = {seed: build_arrivals(pods, capacity, ratio, seed, shuffle, artifact_order) for seed in seeds}
    workload = TargetWorkload.from_requests(pods)  # the trace's own pods, as the paper's "typical pods"
    total = sum(len(a) for a in arrivals.values()) * len(strategies)
    progress = progress_factory(total) if progress_factory else None
    results = []
    for strategy in strategies:
        runs = [
            replay(nodes, arrivals[seed], strategy, seed, workload, ledger_factory, progress, prefetch_depth)
            for seed in seeds
        ]
        results.append(StrategyResult(strategy, runs))
    if progress is not None:
        progress.close()
    return results


# --- output ----------------------------------------------------------------------------------------------


def table(results: Sequence[StrategyResult], title: str = "") -> str:
    header = (
        f"{'strategy':<16} {'unallocated@100%':>17} {'min':>7} {'max':>7} {'idle, no host':>14} "
        f"{'partial GPUs':>13} {'failed pods':>12} {'s/run':>7}"
    )
    lines = [title] if title else []
    lines += [header, "-" * len(header)]
    for result in sorted(results, key=lambda r: r.unallocated_at_100):
        values = [r.unallocated_at_100 for r in result.runs]
        starved = statistics.median(r.free_at_100.get("idle_without_host", 0.0) for r in result.runs)
        partial = statistics.median(r.free_at_100.get("partial", 0.0) for r in result.runs)
        lines.append(
            f"{result.strategy:<16} {result.unallocated_at_100:>16.2f}% {min(values):>6.2f}% "
            f"{max(values):>6.2f}% {starved:>13.2f}% {partial:>12.2f}% "
            f"{statistics.median(r.failed for r in result.runs):>12} "
            f"{statistics.mean(r.seconds for r in result.runs):>7.1f}"
        )
    return "\n".join(lines)


def plot(results: Sequence[StrategyResult], path: str | Path, title: str = "") -> None:
    """Allocation ratio against arrived workload, one line per strategy (PNG, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    top = 0.0
    for result in results:
        arrived, allocation = result.median_curve()
        top = max(top, arrived[-1] if arrived else 0)
        ax.plot(
            arrived,
            allocation,
            label=f"{result.strategy} ({result.unallocated_at_100:.2f}% unalloc.)",
            linewidth=1.4,
        )
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1, label="ideal")
    ax.axvline(100, color="grey", linewidth=0.6)
    ax.set_xlabel("arrived workload (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation ratio (%)")
    ax.set_xlim(0, max(top, 100))
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


# --- command line ----------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuledger simulate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_argument_group("workload (an openb trace, or Node/Pod YAML)")
    src.add_argument("--trace", metavar="DIR", help=f"openb trace directory (default {DEFAULT_TRACE})")
    src.add_argument(
        "--workload",
        default="default",
        help=f"openb pod list: {' | '.join(WORKLOADS)} (any openb_pod_list_NAME.csv in DIR), or a variant "
        "generated from the default trace: gpuspecN (N%% of GPU pods pinned to a GPU model), cpuN (CPU-only "
        "pods ask N%% more CPU), shareN (shares hold N%% of the GPU request), multigpuN (multi-GPU pods hold "
        "N%%); see docs/simulator.md",
    )
    src.add_argument(
        "--variant-seed",
        type=int,
        default=VARIANT_SEED,
        help=f"seed of a generated variant (default {VARIANT_SEED}: one trace per variant, as the paper's)",
    )
    src.add_argument(
        "--node-list",
        choices=("gpu", "all"),
        default="gpu",
        help="openb node list: the 1,213 GPU nodes (default, as the paper's artifact) or all 1,523",
    )
    src.add_argument("--cluster", metavar="FILE", help="Node objects (YAML, e.g. kubectl get nodes -o yaml)")
    src.add_argument("--pods", metavar="FILE", help="Pod objects (YAML), the workload to replay")
    src.add_argument(
        "--limit-nodes",
        type=int,
        default=0,
        metavar="N",
        help="use N nodes spread over the list (the workload is scaled to their capacity)",
    )
    run = p.add_argument_group("protocol")
    run.add_argument(
        "--strategy",
        "-s",
        action="append",
        metavar="NAME",
        help=f"strategy to run (repeat or comma-separate; 'all' = every registered one; "
        f"default {','.join(DEFAULT_STRATEGIES)})",
    )
    run.add_argument("--seeds", type=int, default=10, help="number of seeds (default 10; the paper's median)")
    run.add_argument("--seed", type=int, default=DEFAULT_SEED, help="first seed (default 42)")
    run.add_argument(
        "--ratio", type=float, default=1.3, help="workload as a multiple of GPU capacity (default 1.3)"
    )
    run.add_argument(
        "--no-shuffle", action="store_true", help="keep the file order (then the sampled top-up)"
    )
    run.add_argument(
        "--artifact-order",
        action="store_true",
        help="shuffle the trace's pods and append the sampled top-up after them, as the paper's artifact "
        "does (default: shuffle everything)",
    )
    run.add_argument(
        "--prefetch-depth",
        type=int,
        default=0,
        metavar="N",
        help="place as the webhook does with N placements admitted ahead per pod shape (never aged out "
        "here: the pessimistic end; default 0, off)",
    )
    out = p.add_argument_group("output")
    out.add_argument("-o", "--output", choices=("table", "json"), default="table")
    out.add_argument("--plot", metavar="FILE.png", help="write the allocation curves as a PNG")
    out.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    return p


def strategy_names(requested: Sequence[str] | None) -> list[str]:
    from gpuledger import strategies as registry
    from gpuledger.strategies.fgd_artifact import VARIANTS, register_variants

    register_variants()  # the artifact-fidelity variants of fgd: simulation only, not in 'all'
    known = [n for n in registry.strategy_names() if n not in VARIANTS]
    names: list[str] = []
    for item in requested or [",".join(DEFAULT_STRATEGIES)]:
        for name in (n.strip() for n in item.split(",")):
            if not name:
                continue
            if name == "all":
                names.extend(n for n in known if n not in names)
                continue
            try:
                name = registry.canonical_name(name)
            except ValueError:
                raise TraceError(
                    f"--strategy {name!r} is not a registered strategy; accepted: {', '.join(known)}, all"
                ) from None
            if name not in names:
                names.append(name)
    return names


def load_workload(args) -> tuple[list[NodeInfo], list[Request], str]:
    if args.cluster or args.pods:
        if not (args.cluster and args.pods):
            raise TraceError(
                "--cluster and --pods go together; give both YAML files (or --trace DIR instead)"
            )
        nodes, pods = load_yaml(args.cluster, args.pods)
        label = f"{Path(args.pods).name} on {Path(args.cluster).name}"
    else:
        trace_dir = Path(args.trace) if args.trace else DEFAULT_TRACE
        nodes, trace_pods = load_variant(trace_dir, args.workload, args.node_list, args.variant_seed)
        pods = [p.to_request() for p in trace_pods]
        label = f"openb {args.workload} ({args.node_list} nodes)"
    if args.limit_nodes:
        nodes = limit_nodes(nodes, args.limit_nodes)
        label += f", {len(nodes)} nodes"
    return nodes, pods, label


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(argv) if argv is not None else None)
    if args.seeds < 1:
        print("gpuledger simulate: --seeds must be at least 1", file=sys.stderr)
        return 2
    try:
        names = strategy_names(args.strategy)
        nodes, pods, label = load_workload(args)
        progress_factory = None
        if not args.quiet and sys.stderr.isatty():
            from tqdm import tqdm

            def progress_factory(total: int):
                return tqdm(total=total, unit="pod", file=sys.stderr, desc="simulate", smoothing=0.05)

        seeds = list(range(args.seed, args.seed + args.seeds))
        results = simulate(
            nodes,
            pods,
            names,
            seeds,
            args.ratio,
            not args.no_shuffle,
            progress_factory=progress_factory,
            artifact_order=args.artifact_order,
            prefetch_depth=args.prefetch_depth,
        )
    except TraceError as exc:
        print(f"gpuledger simulate: {exc}", file=sys.stderr)
        return 2
    title = (
        f"{label}: {len(pods)} pods, {gpu_capacity_milli(nodes) // MILLI_PER_GPU} GPUs, "
        f"{args.ratio:g}x capacity, {len(seeds)} seed(s) from {args.seed}"
        + (f", {args.prefetch_depth} ahead per shape" if args.prefetch_depth else "")
    )
    if args.plot:
        plot(results, args.plot, title)
    if args.output == "json":
        document = {
            "workload": label,
            "nodes": len(nodes),
            "gpu_capacity_milli": gpu_capacity_milli(nodes),
            "pods": len(pods),
            "ratio": args.ratio,
            "seeds": seeds,
            "strategies": {r.strategy: r.as_json() for r in results},
        }
        print(json.dumps(document, indent=2))
    else:
        print(table(results, title))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
