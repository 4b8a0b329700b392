"""One read of the cluster for the views: nodes, pods, GPUNodes and GPUWorkloads, fetched together.

`status`, `nodes`, `workloads`, `health` and `watch` all build on this, so a `watch` frame is one
consistent-enough read. Fetches only; the views (gpuledger.views.inventory, .workloads, .health) interpret.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger.cli.kube import Kube
from gpuledger.views import inventory
from gpuledger.views.workloads import WorkloadRow, workload_rows


@dataclass
class Snapshot:
    nodes: list[inventory.NodeView]
    workloads: list[WorkloadRow]  # GPUWorkloads and placed pods in the namespace scope

    @classmethod
    def read(
        cls, kube: Kube, namespace: str | None, *, workloads: bool = True, source: str = "auto"
    ) -> Snapshot:
        """Every pod is read (holders on every node), workloads only in `namespace` (None: all). `source`:
        auto (GPUNode objects when there are any, else Nodes), gpunodes, or nodes."""
        pods = kube.pods()
        gpu_nodes = kube.gpu_nodes() if source in ("auto", "gpunodes") else []
        if source == "gpunodes" or gpu_nodes:
            views = inventory.views_from_gpu_nodes(gpu_nodes)
        else:
            views = inventory.views_from_nodes(kube.nodes(), pods)
        rows: list[WorkloadRow] = []
        if workloads:
            scoped = (
                pods
                if namespace is None
                else [p for p in pods if p["metadata"].get("namespace") == namespace]
            )
            rows = workload_rows(kube.gpu_workloads(namespace), scoped)
        return cls(views, rows)
