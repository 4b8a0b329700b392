"""Helpers the strategy tests share: ledgers built from node objects or NodeInfos, GPUs taken without a
strategy, and a strategy with its candidate walk switched off. Test support: product code never imports it.
"""

from __future__ import annotations

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Device, NodeInfo, PinnedDevices, Placement, Request
from gpuledger.strategies.fragmentation import WORKLOAD_KEY, TargetWorkload


def make(*nodes, **config) -> Ledger:
    led = Ledger(LedgerConfig(**config))
    for n in nodes:
        led.apply_object(n, 0.0)
    return led


def take(led: Ledger, node_name: str, gpus: int, rid: str) -> None:
    """Occupy GPUs on a node through an explicit map (so the set-up does not depend on a strategy)."""
    n = led.index.nodes[node_name]
    free = n.whole_free_devices()[:gpus]
    p = led.reserve(Request(id=rid, gpus=gpus, pinned=PinnedDevices(node_name, tuple(free))), 0.0)
    assert isinstance(p, Placement), p


def node_info(
    name: str, gpus: int, cpu: int = 64_000, memory: int = 256_000, product: str = "G2"
) -> NodeInfo:
    devices = tuple(Device(i, product=product) for i in range(gpus))
    return NodeInfo(name, cpu, memory, devices, product=product)


def ledger(strategy: str, nodes, workload: TargetWorkload | None = None) -> Ledger:
    led = Ledger(LedgerConfig(default_strategy=strategy))
    if workload is not None:
        led.context_extra[WORKLOAD_KEY] = workload
    for n in nodes:
        led.upsert_node(n)
    return led


class FullScan:
    """The same strategy with its candidate walk switched off: the ledger scores every node."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def candidates(self, request, ctx, leaves):
        return None
