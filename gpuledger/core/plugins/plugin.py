"""The strategy interface the ledger calls: what a strategy sees (ScoreContext), what it returns (Fit), the
base class, and the device checks every strategy shares. Pure: the strategies themselves live in
gpuledger.strategies and register with gpuledger.core.plugins.registry; nothing here knows any strategy by
name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuledger.core.model import MILLI_PER_GPU, DeviceShare, Reason, Request

if TYPE_CHECKING:
    from gpuledger.core.nodes.inventory import ClusterIndex
    from gpuledger.core.nodes.node_state import LeafKey, NodeState

DEFAULT_BALANCED_WEIGHTS = {
    "resourceAvailability": 0.4,
    "topologyAlignment": 0.3,
    "domainUtilization": 0.2,
    "historicalPerformance": 0.1,
}


@dataclass(frozen=True)
class Fit:
    """Devices a request would take on one node: exclusive indices, or shares of devices."""

    devices: tuple[int, ...] = ()
    shares: tuple[DeviceShare, ...] = ()


@dataclass
class ScoreContext:
    """What a strategy may know beyond one node. Read-only for strategies."""

    index: ClusterIndex  # every node's NodeState (index.nodes), buckets and per-leaf totals
    seed: int = 0
    request_id: str = ""
    rr_cursor: str = ""  # round_robin: the node the previous round-robin placement went to
    priority_headroom: float = 0.1
    balanced_weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_BALANCED_WEIGHTS))
    performance: Mapping[str, float] = field(default_factory=dict)  # node -> historical score in [0, 1]
    extra: Mapping[str, Any] = field(default_factory=dict)  # free-form inputs for plug-in strategies
    now: float = float("-inf")  # the latest time the ledger was given (epoch seconds in production)
    utilization_max_age_s: float = 120.0  # published utilization older than this is stale (least_utilized)

    def leaf_utilization(self, leaf: LeafKey) -> float:
        b = self.index.leaves.get(leaf)
        if b is None or not b.total_milli:
            return 1.0
        return 1.0 - b.free_milli / b.total_milli

    @property
    def cluster_total_milli(self) -> int:
        return self.index.all.total_milli

    @property
    def cluster_free_milli(self) -> int:
        return self.index.all.free_milli


# ---------------------------------------------------------------------------------------------- devices


def product_matches(wanted: str | None, *offered: str) -> bool:
    """Case-insensitive substring match of the wanted product (or any of its `A|B` alternatives) against any
    offered name."""
    if not wanted:
        return True
    w = wanted.lower()
    return any(o and p in o.lower() for p in map(str.strip, w.split("|")) if p for o in offered)


def device_ok(node: NodeState, p: int, request: Request) -> bool:
    """Static suitability of device position p for the request (health, product, memory size)."""
    if not node.dev_healthy[p]:
        return False
    if request.product:
        dev_product = node.info.devices[p].product if p < len(node.info.devices) else ""
        if dev_product and not product_matches(request.product, dev_product):
            return False
    return not (
        request.gpu_memory_mib and node.dev_mem_total[p] and node.dev_mem_total[p] < request.gpu_memory_mib
    )


def choose_whole_devices(node: NodeState, request: Request) -> tuple[int, ...] | None:
    """`request.gpus` free devices: the shortest contiguous run of free indices that holds them (fewest
    NVLink neighbours broken), else the lowest free indices."""
    n = request.gpus
    if node.whole_free < n:
        return None
    free = [
        node.dev_index[p]
        for p in range(len(node.dev_index))
        if node.is_fully_free(p) and device_ok(node, p, request)
    ]
    if len(free) < n:
        return None
    if n == 1:
        return (free[0],)
    best: list[int] | None = None
    run: list[int] = []
    for idx in [*free, None]:
        if run and idx is not None and idx == run[-1] + 1:
            run.append(idx)
            continue
        if len(run) >= n and (best is None or len(run) < len(best)):
            best = run
        run = [idx] if idx is not None else []
    return tuple((best or free)[:n])


def choose_share_device(node: NodeState, request: Request) -> DeviceShare | None:
    """The device with the least free milli-GPU that still holds the share (best fit); a device nobody
    uses is taken only when the node has a whole GPU to spare; ties go to the lowest index."""
    milli = request.gpu_milli
    mem = request.gpu_memory_mib
    best_p = -1
    best_free = MILLI_PER_GPU + 1
    can_open = node.whole_free > 0
    for p in range(len(node.dev_index)):
        if node.dev_owner[p] is not None or not node.dev_healthy[p]:
            continue
        free = node.dev_free_milli[p]
        if free < milli or free >= best_free:
            continue
        if mem and node.dev_mem_total[p] and node.dev_free_mem[p] < mem:
            continue
        if node.dev_nshares[p] == 0 and not can_open:
            continue
        if not device_ok(node, p, request):
            continue
        best_p, best_free = p, free
    if best_p < 0:
        return None
    return DeviceShare(device=node.dev_index[best_p], milli=milli, memory_mib=mem)


def default_choose_devices(node: NodeState, request: Request) -> Fit | None:
    if request.gpus > 0:
        devices = choose_whole_devices(node, request)
        return None if devices is None else Fit(devices=devices)
    if request.is_shared:
        share = choose_share_device(node, request)
        return None if share is None else Fit(shares=(share,))
    return Fit()


def _chosen_free(node: NodeState, fit: Fit) -> int:
    if not fit.shares:
        return 0
    return node.dev_free_milli[node.pos[fit.shares[0].device]]


# ---------------------------------------------------------------------------------------------- strategies


class Strategy:
    """Base strategy. Subclasses override `score` (higher wins; ties go to the lowest node name) and may
    override `choose_devices`, `admit` (a request-level gate) and `candidates` (best-first walk)."""

    name = "base"

    def choose_devices(self, node: NodeState, request: Request, ctx: ScoreContext) -> Fit | None:
        return default_choose_devices(node, request)

    def score(self, node: NodeState, request: Request, fit: Fit, ctx: ScoreContext) -> float:
        return 0.0

    def admit(self, request: Request, ctx: ScoreContext) -> Reason | None:
        return None

    def candidates(
        self, request: Request, ctx: ScoreContext, leaves: list[LeafKey] | None
    ) -> Iterable[NodeState] | None:
        """Nodes in non-increasing score order, ties by name, covering every node that could fit; or None
        to let the ledger scan every node."""
        return None
