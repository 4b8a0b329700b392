"""One read of the cluster for the views: nodes, pods, GPUNodes and GPUWorkloads, fetched together.

`status`, `nodes`, `workloads`, `health` and `watch` all build on this, so a `watch` frame is one
consistent-enough read. Fetches only; the views (gpuledger.views.inventory, .freshness, .workloads, .health)
interpret.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuledger.cli.kube import Kube
from gpuledger.views import freshness, inventory
from gpuledger.views.workloads import WorkloadRow, workload_rows


def gpunode_interval_s() -> float:
    """The controller's default --gpunode-interval: how long a GPUNode may lag what the API holds."""
    from gpuledger.controller.controller import EngineSettings

    return EngineSettings.gpunode_interval_s


@dataclass
class Snapshot:
    nodes: list[inventory.NodeView]
    workloads: list[WorkloadRow]  # GPUWorkloads and placed pods in the namespace scope
    notice: str = ""  # why the GPUNode objects were set aside (gpuledger.views.freshness); "" when not

    @classmethod
    def read(
        cls,
        kube: Kube,
        namespace: str | None,
        *,
        now: datetime,
        workloads: bool = True,
        source: str = "auto",
    ) -> Snapshot:
        """Every pod is read (holders on every node), workloads only in `namespace` (None: all). `source`:
        auto (GPUNode objects when there are any, unless they are stale at `now`: then Nodes), gpunodes (as
        the controller wrote them, however old), or nodes."""
        pods = kube.pods()
        gpu_nodes = kube.gpu_nodes() if source in ("auto", "gpunodes") else []
        notice = ""
        if source == "gpunodes":
            views = inventory.views_from_gpu_nodes(gpu_nodes)
        elif gpu_nodes:
            choice = freshness.choose(gpu_nodes, kube.nodes(), pods, now, gpunode_interval_s())
            views, notice = choice.nodes, choice.notice
        else:
            views = inventory.views_from_nodes(kube.nodes(), pods)
        rows: list[WorkloadRow] = []
        if workloads:
            scoped = (
                pods
                if namespace is None
                else [p for p in pods if p["metadata"].get("namespace") == namespace]
            )
            rows = workload_rows(kube.gpu_workloads(namespace), scoped, pods)  # (pods: the whole line)
        return cls(views, rows, notice)
