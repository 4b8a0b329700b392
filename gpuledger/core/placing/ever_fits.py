"""Could a request fit the cluster were every GPU free? The line between "wait" and "deny".

A pod that does not fit now waits for GPUs to free (gpuledger.core.queues.waiting) only if it could fit the
cluster when nothing is held: some node passes its fixed filters (product, GPU memory, selectors, taints,
bandwidth) and is large enough (devices, cpu, memory), and for a gang the leaves hold every pod within its
leaf limits. Readiness, cordons and device health are left out: they come back. Anything else (larger than any
node or than any allowed leaf window, a product the cluster lacks) can never be placed and is denied at once.

Verdicts are kept per request shape and kept honest by the index's log of touched nodes: a node's fixed
facts change only when the node is upserted, which touches it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from gpuledger.core.books.books import Books
from gpuledger.core.model import Device, NodeInfo, Request
from gpuledger.core.nodes.node_state import LeafKey
from gpuledger.core.placing.filters import Filters
from gpuledger.core.plugins.plugin import product_matches

SHAPES_KEPT = 256


class _Ready:
    """A node's facts as if it were ready, uncordoned and GPU-schedulable: what the fixed filters read."""

    __slots__ = ("info",)

    def __init__(self, info: NodeInfo) -> None:
        self.info = _ReadyInfo(info)


class _ReadyInfo:
    __slots__ = ("_info",)
    ready = True
    unschedulable = False
    gpu_schedulable = True

    def __init__(self, info: NodeInfo) -> None:
        self._info = info

    def __getattr__(self, name: str) -> Any:
        return getattr(self._info, name)


class _Verdict:
    __slots__ = ("fits", "seq", "witness", "witness_info")

    def __init__(self, fits: bool, seq: int, witness: str = "", witness_info: NodeInfo | None = None):
        self.fits, self.seq, self.witness, self.witness_info = fits, seq, witness, witness_info


class EverFits:
    """`could_fit(request)`: whether the request fits the cluster with nothing held."""

    def __init__(self, books: Books, filters: Filters):
        self.books = books
        self.filters = filters
        self.kept: OrderedDict[tuple, _Verdict] = OrderedDict()

    def could_fit(self, req: Request) -> bool:
        if not req.needs_gpu:
            return True
        index = self.books.index
        seq = index.touched_base + len(index.touched)
        shape = _shape(req)
        kept = self.kept.get(shape)
        if kept is not None and kept.seq >= index.touched_base:
            self.kept.move_to_end(shape)
            if kept.fits and req.group is None:
                node = index.nodes.get(kept.witness)
                if node is not None and node.info is kept.witness_info:
                    kept.seq = seq
                    return True
            elif not kept.fits and req.group is None:
                # only a node touched since can have changed: look at those alone
                nodes = index.nodes
                for name in set(index.touched[kept.seq - index.touched_base :]):
                    node = nodes.get(name)
                    if node is not None and self._node_fits(node.info, req):
                        self.kept[shape] = _Verdict(True, seq, name, node.info)
                        return True
                kept.seq = seq
                return False
            elif kept.seq == seq:
                return kept.fits
        verdict = self._judge(req, seq)
        self.kept[shape] = verdict
        if len(self.kept) > SHAPES_KEPT:
            self.kept.popitem(last=False)
        return verdict.fits

    # ------------------------------------------------------------------ the judgement
    def _judge(self, req: Request, seq: int) -> _Verdict:
        nodes = self.books.index.nodes
        if req.pinned is not None:
            node = nodes.get(req.pinned.node)
            fits = node is not None and self._node_fits(node.info, req)
            return _Verdict(fits, seq, req.pinned.node, node.info if node is not None else None)
        if req.group is None or req.group.size <= 1:
            for name, node in nodes.items():
                if self._node_fits(node.info, req):
                    return _Verdict(True, seq, name, node.info)
            return _Verdict(False, seq)
        return _Verdict(self._gang_fits(req), seq)

    def _fixed_ok(self, info: NodeInfo, req: Request) -> bool:
        reason, _ = self.filters.static_uncached(_Ready(info), req)  # type: ignore[arg-type]
        return reason is None

    def _pods_on(self, info: NodeInfo, req: Request) -> int:
        """How many pods of the request's shape the node holds with nothing else on it."""
        if req.pinned is not None:
            indices = {d.index for d in info.devices}
            if not all(d in indices for d in req.pinned.devices):
                return 0
        if req.gpus > 0:
            usable = sum(1 for d in info.devices if _device_ok(d, req))
            pods = usable // req.gpus
        else:  # a share of one GPU: one pod per node, as gangs place them
            pods = 1 if any(_device_ok(d, req) for d in info.devices) else 0
        if req.cpu_milli:
            pods = min(pods, info.cpu_milli // req.cpu_milli)
        if req.memory_mib:
            pods = min(pods, info.memory_mib // req.memory_mib)
        return pods

    def _node_fits(self, info: NodeInfo, req: Request) -> bool:
        return self._pods_on(info, req) >= 1 and self._fixed_ok(info, req)

    def _gang_fits(self, req: Request) -> bool:
        """Whether the gang's pods fit the leaves, each within the gang's leaf limits (nodes and GPUs per
        leaf), with every node empty (the rule of gpuledger.core.placing.gangs, counted on empty nodes)."""
        spec = req.group
        assert spec is not None
        node_limit = spec.max_nodes_per_leaf or spec.size
        pod_limit = spec.size
        if spec.max_gpus_per_leaf and req.gpus:
            pod_limit = min(pod_limit, spec.max_gpus_per_leaf // req.gpus)
        if pod_limit <= 0:
            return False
        per_leaf: dict[LeafKey, list[int]] = {}
        for node in self.books.index.nodes.values():
            pods = self._pods_on(node.info, req)
            if pods and self._fixed_ok(node.info, req):
                per_leaf.setdefault(node.leaf_key, []).append(min(pods, pod_limit))
        total = 0
        for counts in per_leaf.values():
            counts.sort(reverse=True)
            total += min(sum(counts[:node_limit]), pod_limit)
            if total >= spec.size:
                return True
        return False


def _device_ok(device: Device, req: Request) -> bool:
    """A device of the right product and GPU memory (health left out: it comes back)."""
    if req.product and device.product and not product_matches(req.product, device.product):
        return False
    return not (req.gpu_memory_mib and device.memory_mib and device.memory_mib < req.gpu_memory_mib)


def _shape(req: Request) -> tuple:
    shape = req.shape()
    if shape is not None:
        return shape
    return (
        req.pinned,
        req.group,
        req.gpus,
        req.gpu_milli,
        req.gpu_memory_mib,
        req.cpu_milli,
        req.memory_mib,
        req.product,
        req.node_selector,
        req.affinity_terms,
        req.tolerations,
        req.network_bandwidth_gbps,
    )
