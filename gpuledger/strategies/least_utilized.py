"""least_utilized: spread load; the GPUs with the lowest utilization the node agent measured, while that
measurement is fresh, else (and to break ties) the node with the most free whole GPUs (for a share, the
most free milli-GPU). It must never look beyond the node's own devices and free capacity (no leaf or
cluster terms).
"""

from __future__ import annotations

from gpuledger.core.model import DeviceShare
from gpuledger.core.plugins.plugin import Fit, Strategy, default_choose_devices, device_ok
from gpuledger.strategies.walks import bucket_walk

# a score is -(load %) * LOAD_WEIGHT + free capacity: load decides, free capacity (< LOAD_WEIGHT) breaks ties
LOAD_WEIGHT = 10_000_000


def fresh_utilization(node, ctx) -> list[int | None] | None:
    """Per device position, the published NVML utilization %, when the node's report is fresh
    (`|ctx.now - utilization_at| <= ctx.utilization_max_age_s`); None when stale or never published."""
    at = getattr(node.info, "utilization_at", None)
    if (
        at is None or not abs(ctx.now - at) <= ctx.utilization_max_age_s
    ):  # also: no time yet, a clock far ahead
        return None
    by_index = {d.index: getattr(d, "utilization_pct", None) for d in node.info.devices}
    util = [by_index.get(i) for i in node.dev_index]
    return util if any(u is not None for u in util) else None


def allocation_load(node) -> float:
    """The node's allocated share of its healthy GPU capacity, in %: the load when no fresh utilization."""
    return 100.0 * node.utilization()


class LeastUtilized(Strategy):
    """Lowest measured GPU utilization while fresh, else most free capacity — spreads load."""

    name = "least_utilized"

    def choose_devices(self, node, request, ctx):
        util = fresh_utilization(node, ctx)
        if util is None:
            return default_choose_devices(node, request)
        if request.gpus > 0:
            if node.whole_free < request.gpus:
                return None
            free = [
                p for p in range(len(node.dev_index)) if node.is_fully_free(p) and device_ok(node, p, request)
            ]
            if len(free) < request.gpus:
                return None
            if len({util[p] for p in free}) <= 1:  # nothing to tell them apart: the NVLink-friendly default
                return default_choose_devices(node, request)
            chosen = sorted(free, key=lambda p: (100 if util[p] is None else util[p], p))[: request.gpus]
            return Fit(devices=tuple(sorted(node.dev_index[p] for p in chosen)))
        if request.is_shared:
            best = None
            for p in range(len(node.dev_index)):
                if node.dev_owner[p] is not None or not device_ok(node, p, request):
                    continue
                if node.dev_free_milli[p] < request.gpu_milli:
                    continue
                if (
                    request.gpu_memory_mib
                    and node.dev_mem_total[p]
                    and node.dev_free_mem[p] < request.gpu_memory_mib
                ):
                    continue
                if node.dev_nshares[p] == 0 and node.whole_free <= 0:
                    continue
                rank = (100 if util[p] is None else util[p], -node.dev_free_milli[p], p)
                if best is None or rank < best:
                    best = rank
            if best is None:
                return None
            share = DeviceShare(
                device=node.dev_index[best[2]], milli=request.gpu_milli, memory_mib=request.gpu_memory_mib
            )
            return Fit(shares=(share,))
        return Fit()

    def score(self, node, request, fit, ctx):
        free = float(node.whole_free) if request.gpus > 0 else float(node.free_milli)
        if not getattr(ctx.index, "utilization_nodes", 0):
            return free  # no node publishes utilization: allocation alone, as the bucket walk orders it
        util = fresh_utilization(node, ctx)
        if util is None:
            load = allocation_load(node)
        else:
            taken = [node.pos[d] for d in (*fit.devices, *(s.device for s in fit.shares)) if d in node.pos]
            measured = [util[p] for p in taken if util[p] is not None]
            load = sum(measured) / len(measured) if measured else allocation_load(node)
        return -load * LOAD_WEIGHT + free

    def candidates(self, request, ctx, leaves):
        if request.gpus > 0 and not getattr(ctx.index, "utilization_nodes", 0):
            return bucket_walk(ctx.index, leaves, request.gpus, descending=True)
        return None  # utilization published somewhere: every node is scored
