"""Simulator benchmark: one openb run (one seed) per strategy through `Ledger.reserve`, timed in the same
process, with ratios to `best_fit` measured in the same run.

    .venv/bin/python tests/benchmarks/bench_simulator.py [--workload default] [--limit-nodes N] [--seed 42]
        [--strategies best_fit,fgd,fgd_host,fgd_naive] [--kinds quick|all|none|W1,W2] [--kind-seeds 1]

Then, per workload kind (`--kinds`), the best strategy (`--kind-strategy`, default fgd_host) replayed in the
same run and set against the paper's published FGD and BestFit for that kind (gpuledger/sim/published.py):
the difference in points and the ratio. The quick default replays one seed of six kinds (a few minutes);
`--kinds all --kind-seeds 10` is every workload kind with a published figure, over the paper's ten seeds
(hours on 2 cores).

`--workload` also takes the generated variants (gpuspec33, cpu100, ...; docs/simulator.md).
`fgd_naive` is FGD without its fast path (no candidate walk, no per-node memo: the ledger filters and
scores every node and every evaluation recomputes the node's fragmentation from the memoised meter), to show
what the walk and the memo buy. Wall time includes the ledger's denial diagnosis of the pods that do not fit;
"in denials" is the part of it spent in reserve calls that ended in a denial.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from gpuledger import strategies  # noqa: E402
from gpuledger.core.ledger import Ledger, LedgerConfig  # noqa: E402
from gpuledger.core.model import Denial  # noqa: E402
from gpuledger.sim.simulator import DEFAULT_TRACE, build_arrivals, gpu_capacity_milli, replay  # noqa: E402
from gpuledger.strategies.fgd import FragmentationGradientDescent  # noqa: E402
from gpuledger.strategies.fragmentation import WORKLOAD_KEY, TargetWorkload  # noqa: E402


class TimedLedger(Ledger):
    """The real ledger, with the time spent in reserve calls that end in a denial (diagnosis included)."""

    denied_seconds = 0.0

    def reserve(self, request, now):
        started = time.perf_counter()
        result = super().reserve(request, now)
        if isinstance(result, Denial):
            self.denied_seconds += time.perf_counter() - started
        return result


from gpuledger.sim.published import ALL_KINDS, QUICK_KINDS, published_for  # noqa: E402
from gpuledger.sim.simulator import simulate  # noqa: E402
from gpuledger.sim.traces import limit_nodes  # noqa: E402
from gpuledger.sim.variants import load_variant  # noqa: E402


class NaiveFGD(FragmentationGradientDescent):
    """FGD scored node by node by the ledger, recomputed every time (the meter's memo stays)."""

    name = "fgd_naive"

    def candidates(self, request, ctx, leaves):
        return None

    def _evaluate(self, node, request, cache):
        return self._compute(node, request, cache.meter)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--workload", default="default")
    parser.add_argument("--node-list", default="gpu")
    parser.add_argument("--limit-nodes", type=int, default=0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--strategies", default="best_fit,fgd,fgd_host,fgd_naive")
    parser.add_argument("--kinds", default="quick", help="quick, all, none, or comma-separated workloads")
    parser.add_argument("--kind-seeds", type=int, default=1, help="seeds per kind, from --seed")
    parser.add_argument("--kind-strategy", default="fgd_host")
    args = parser.parse_args()

    strategies.register("fgd_naive", NaiveFGD)
    nodes, trace_pods = load_variant(args.trace, args.workload, args.node_list)
    if args.limit_nodes:
        nodes = limit_nodes(nodes, args.limit_nodes)
    pods = [p.to_request() for p in trace_pods]
    arrivals = build_arrivals(pods, gpu_capacity_milli(nodes), 1.3, args.seed)
    workload = TargetWorkload.from_requests(pods)
    print(
        f"openb {args.workload} ({args.node_list} nodes): {len(nodes)} nodes, {len(arrivals)} arrivals, "
        f"seed {args.seed}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'strategy':<12} {'seconds':>8} {'pods/s':>8} {'x best_fit':>10} {'failed':>7} {'in denials':>11} "
        f"{'unalloc@100':>12}"
    )
    baseline = None
    for name in args.strategies.split(","):
        ledgers: list[TimedLedger] = []

        def factory(strategy, target, ledgers=ledgers):
            ledger = TimedLedger(LedgerConfig(default_strategy=strategy))
            ledger.context_extra[WORKLOAD_KEY] = target
            ledgers.append(ledger)
            return ledger

        started = time.perf_counter()
        run = replay(nodes, arrivals, name, args.seed, workload, factory)
        seconds = time.perf_counter() - started
        if baseline is None:
            baseline = seconds
        print(
            f"{name:<12} {seconds:>8.1f} {len(arrivals) / seconds:>8.0f} {seconds / baseline:>10.2f} "
            f"{run.failed:>7} {ledgers[0].denied_seconds:>10.1f}s {run.unallocated_at_100:>11.2f}%",
            flush=True,
        )
    kinds = {"quick": QUICK_KINDS, "all": ALL_KINDS, "none": ()}.get(args.kinds) or args.kinds.split(",")
    if kinds:
        kind_table(args, kinds)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {rss:.0f} MiB")
    return 0


def kind_table(args, kinds) -> None:
    """Per workload kind: the best strategy's unallocated % (median of the seeds, this run) against the
    published FGD and BestFit of that kind."""
    seeds = list(range(args.seed, args.seed + args.kind_seeds))
    scale = f"{args.limit_nodes} nodes (not the published scale)" if args.limit_nodes else "1,213 GPU nodes"
    print(
        f"\nper workload kind: {args.kind_strategy}, unallocated GPU % at 100% arrived, median of seed(s) "
        f"{seeds[0]}..{seeds[-1]}, {scale}; published = the paper's median or its artifact's (10 seeds)"
    )
    header = (
        f"{'workload':<15} {args.kind_strategy:>9} {'pub. FGD':>9} {'diff':>7} {'ratio':>6} {'pub. BF':>8} "
        f"{'vs FGD':>7} {'s/run':>6}  published trace"
    )
    print(header)
    print("-" * len(header))
    for workload in kinds:
        nodes, trace_pods = load_variant(args.trace, workload, args.node_list)
        if args.limit_nodes:
            nodes = limit_nodes(nodes, args.limit_nodes)
        result = simulate(nodes, [p.to_request() for p in trace_pods], [args.kind_strategy], seeds)[0]
        ours = result.unallocated_at_100
        seconds = sum(r.seconds for r in result.runs) / len(result.runs)
        published = published_for(workload)
        if published is None:
            blank = f"{'-':>9} {'-':>7} {'-':>6} {'-':>8} {'-':>7}"
            print(f"{workload:<15} {ours:>8.2f}% {blank} {seconds:>6.1f}  (nothing published for this kind)")
            continue
        best_fit = f"{published.best_fit:.2f}%" if published.best_fit is not None else "-"
        verdict = "below" if ours < published.fgd else "ABOVE"
        print(
            f"{workload:<15} {ours:>8.2f}% {published.fgd:>8.2f}% {ours - published.fgd:>+7.2f} "
            f"{ours / published.fgd:>6.2f} {best_fit:>8} {verdict:>7} {seconds:>6.1f}  "
            f"{published.trace} ({published.source})",
            flush=True,
        )


if __name__ == "__main__":
    raise SystemExit(main())
