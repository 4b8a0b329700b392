"""`gpuledger` command line: one dispatcher; each subcommand's parser lives with the code it drives."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# subcommand -> (module, one-line help); each module exposes `main(argv: list[str]) -> int`
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gpuledger.webhook.serve", "run the admission webhook backed by the Ray-held GPU ledger"),
    "explain": (
        "gpuledger.webhook.explain",
        "run the real mutating path for pods against a cluster file, offline",
    ),
    "simulate": ("gpuledger.sim.simulator", "replay a GPU-cluster trace through the allocator core"),
    "node-agent": (
        "gpuledger.node_agent.agent",
        "publish this node's GPUs (NVML) as agentaflow.gpu/* labels and annotations",
    ),
    "certs": ("gpuledger.certs.cli", "generate or rotate the webhook's CA and serving certificate"),
    "demo": ("devcluster.demo", "start a local control plane + webhook and place sample workloads"),
    "status": (
        "gpuledger.cli.status",
        "cluster GPU totals, allocation and fragmentation per leaf, the queue",
    ),
    "queues": (
        "gpuledger.cli.queues",
        "GPU queues: quota, used, borrowed, lendable, fair share, waiting pods",
    ),
    "nodes": ("gpuledger.cli.nodes", "per node and device: health, utilization, who holds what"),
    "workloads": ("gpuledger.cli.workloads", "GPUWorkloads and gpuledger-placed pods: phase, node, devices"),
    "submit": (
        "gpuledger.cli.submit",
        "create GPUWorkloads, or apply Job/Pod manifests into an opted-in namespace",
    ),
    "strategy": ("gpuledger.cli.strategy", "show or change the live default strategy"),
    "watch": ("gpuledger.cli.watch", "a refreshing view of status, queue and workloads until Ctrl-C"),
    "health": ("gpuledger.cli.health", "unhealthy or stale devices, nodes whose agent went quiet (exit 5)"),
    "generate-template": ("gpuledger.cli.template", "write a commented GPUWorkload, Job or Pod manifest"),
    "controller": (
        "gpuledger.controller.main",
        "run the GPUWorkload/GPUNode controller (queue, retries, leader election)",
    ),
}


def usage() -> str:
    lines = ["usage: gpuledger <command> [options]", "", "commands:"]
    lines += [f"  {name:<18} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def _harness_on_path() -> bool:
    """An editable install maps only the `gpuledger` package: when this package sits in a source checkout,
    the checkout (which holds devcluster/) goes on the path, however the command was started."""
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "devcluster" / "__init__.py").is_file():
        return False
    sys.path.insert(0, str(checkout))
    return True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"gpuledger: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    target = SUBCOMMANDS[name][0]
    try:
        module = importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name != "devcluster":
            raise
        if not _harness_on_path():
            # the development harness lives in the source tree only, never in the wheel or the image
            print(
                f"gpuledger {name}: runs from a source checkout of gpuledger, which this installation is "
                f"not: clone the repository and run `make {name}` in it",
                file=sys.stderr,
            )
            return 2
        module = importlib.import_module(target)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
