"""One node's mutable free state: counters (free cpu, memory, per-device free milli-GPU and memory,
whole-free devices) that change in O(devices) per placement, and the `Holding`s that use them.

Strategies read `NodeState` as a view; only the ledger mutates it. It never knows about other nodes (the
cluster-wide index is `inventory`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger.core.model import MILLI_PER_GPU, DeviceShare, NodeInfo
from gpuledger.core.slots_init import slots_init

LeafKey = tuple[str, str]  # (spine, leaf)


@slots_init
@dataclass(frozen=True, slots=True)
class Holding:
    """What one holder (a reservation, an unclaimed group slot, a pod gpuledger did not place) uses on a
    node."""

    id: str
    node: str
    devices: tuple[int, ...] = ()  # exclusive
    shares: tuple[DeviceShare, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    unknown_gpus: int = 0  # whole GPUs of unknown identity (pods that never went through gpuledger)


class NodeState:
    """Free state of one node. Read-only for strategies:

    `info` (NodeInfo), `name`, `leaf_key` (spine, leaf), `placeable`, `cpu_free`, `mem_free`,
    `dev_index[p]` (physical index of device position p), `dev_healthy[p]`, `dev_free_milli[p]`,
    `dev_free_mem[p]`, `dev_mem_total[p]`, `dev_owner[p]` (exclusive holder id or None), `owned` (bit p set
    where dev_owner[p] is not None), `dev_nshares[p]`, `unknown_gpus`, `whole_free` (devices a whole-GPU
    request may take), `free_milli` (free milli-GPU over healthy devices, unknown whole GPUs deducted),
    `total_milli`, `external` (device -> MiB used outside Kubernetes at or above the threshold: such a device
    counts as not healthy).
    """

    __slots__ = (
        "info",
        "name",
        "leaf_key",
        "placeable",
        "cpu_free",
        "mem_free",
        "dev_index",
        "pos",
        "dev_healthy",
        "dev_free_milli",
        "dev_free_mem",
        "dev_mem_total",
        "dev_owner",
        "owned",
        "dev_nshares",
        "dev_shares",
        "unknown_gpus",
        "fully_free",
        "free_milli_raw",
        "total_milli",
        "holders",
        "external",
    )

    def __init__(self, info: NodeInfo, external_threshold_mib: int = 0):
        self.info = info
        self.name = info.name
        self.leaf_key: LeafKey = (info.spine, info.leaf)
        self.placeable = info.ready and not info.unschedulable and info.gpu_schedulable
        self.cpu_free = info.cpu_milli
        self.mem_free = info.memory_mib
        devs = sorted(info.devices, key=lambda d: d.index)
        self.dev_index = [d.index for d in devs]
        self.pos = {d.index: p for p, d in enumerate(devs)}
        # devices whose GPU memory processes outside Kubernetes use at or above the threshold: not placed on
        self.external: dict[int, int] = {}
        if info.truth is not None and external_threshold_mib > 0:
            self.external = {d: mib for d, mib, _ in info.truth.external if mib >= external_threshold_mib}
        self.dev_healthy = [d.healthy and d.index not in self.external for d in devs]
        self.dev_mem_total = [d.memory_mib for d in devs]
        self.dev_free_milli = [MILLI_PER_GPU] * len(devs)
        self.dev_free_mem = list(self.dev_mem_total)
        self.dev_owner: list[str | None] = [None] * len(devs)
        self.owned = 0  # bit p set when dev_owner[p] is not None (node classes key on it)
        self.dev_nshares = [0] * len(devs)
        self.dev_shares: list[dict[str, DeviceShare] | None] = [None] * len(devs)
        self.unknown_gpus = 0
        self.fully_free = sum(self.dev_healthy)
        self.total_milli = self.fully_free * MILLI_PER_GPU
        self.free_milli_raw = self.total_milli
        self.holders: dict[str, Holding] = {}

    # ------------------------------------------------------------------ views
    @property
    def whole_free(self) -> int:
        free = self.fully_free - self.unknown_gpus
        return free if free > 0 else 0

    @property
    def free_milli(self) -> int:
        free = self.free_milli_raw - self.unknown_gpus * MILLI_PER_GPU
        return free if free > 0 else 0

    def is_fully_free(self, p: int) -> bool:
        return self.dev_healthy[p] and self.dev_owner[p] is None and self.dev_nshares[p] == 0

    def whole_free_devices(self) -> list[int]:
        """Physical indices of healthy devices nobody holds (unknown-identity GPUs not deducted)."""
        return [self.dev_index[p] for p in range(len(self.dev_index)) if self.is_fully_free(p)]

    def utilization(self) -> float:
        if not self.total_milli:
            return 1.0
        return 1.0 - self.free_milli / self.total_milli

    # ------------------------------------------------------------------ mutation (ledger only)
    def _device_changed(self, p: int, was_free: bool) -> None:
        now_free = self.is_fully_free(p)
        if was_free != now_free:
            self.fully_free += 1 if now_free else -1

    def apply(self, h: Holding) -> None:
        # `_shift` and `is_fully_free` inlined (every placement and every rebuilt pod comes here): a device
        # taken or shared is not fully free after, so one that was fully free leaves the count
        self.holders[h.id] = h
        self.cpu_free -= h.cpu_milli
        self.mem_free -= h.memory_mib
        self.unknown_gpus += h.unknown_gpus
        pos, healthy, owner, nshares = self.pos, self.dev_healthy, self.dev_owner, self.dev_nshares
        free_milli, free_mem = self.dev_free_milli, self.dev_free_mem
        for d in h.devices:
            p = pos.get(d)
            if p is None:
                continue
            if healthy[p]:
                if owner[p] is None and nshares[p] == 0:
                    self.fully_free -= 1
                self.free_milli_raw -= MILLI_PER_GPU
            owner[p] = h.id
            self.owned |= 1 << p
            free_milli[p] -= MILLI_PER_GPU
            free_mem[p] -= self.dev_mem_total[p]
        for s in h.shares:
            p = pos.get(s.device)
            if p is None:
                continue
            if healthy[p]:
                if owner[p] is None and nshares[p] == 0:
                    self.fully_free -= 1
                self.free_milli_raw -= s.milli
            shares = self.dev_shares[p]
            if shares is None:
                shares = self.dev_shares[p] = {}
            shares[h.id] = s
            nshares[p] += 1
            free_milli[p] -= s.milli
            free_mem[p] -= s.memory_mib

    def remove(self, hid: str) -> Holding | None:
        h = self.holders.pop(hid, None)
        if h is None:
            return None
        self.cpu_free += h.cpu_milli
        self.mem_free += h.memory_mib
        self.unknown_gpus -= h.unknown_gpus
        for d in h.devices:
            p = self.pos.get(d)
            if p is None:
                continue
            was = self.is_fully_free(p)
            if self.dev_owner[p] == hid:
                self.dev_owner[p] = None
                self.owned &= ~(1 << p)
            self._shift(p, was, MILLI_PER_GPU, self.dev_mem_total[p])
        for s in h.shares:
            p = self.pos.get(s.device)
            if p is None:
                continue
            was = self.is_fully_free(p)
            shares = self.dev_shares[p]
            if shares is not None:
                shares.pop(hid, None)
            self.dev_nshares[p] -= 1
            self._shift(p, was, s.milli, s.memory_mib)
        return h

    def _shift(self, p: int, was_fully_free: bool, milli: int, memory_mib: int) -> None:
        """Move device `p`'s free counters by a holding's amounts (negative: taken), after its owner or shares
        changed; `was_fully_free` is what `is_fully_free(p)` said before that change."""
        self.dev_free_milli[p] += milli
        self.dev_free_mem[p] += memory_mib
        if self.dev_healthy[p]:
            self.free_milli_raw += milli
        self._device_changed(p, was_fully_free)

    def conflicts(self, devices: tuple[int, ...], shares: tuple[DeviceShare, ...]) -> set[str]:
        """Holders that stand in the way of holding these devices/shares (empty = it fits on the devices)."""
        out: set[str] = set()
        for d in devices:
            p = self.pos.get(d)
            if p is None:
                continue
            owner = self.dev_owner[p]
            if owner is not None:
                out.add(owner)
            shared = self.dev_shares[p]
            if shared:
                out.update(shared)
        for s in shares:
            p = self.pos.get(s.device)
            if p is None:
                continue
            owner = self.dev_owner[p]
            if owner is not None:
                out.add(owner)
            elif self.dev_free_milli[p] < s.milli or (
                self.dev_mem_total[p] and self.dev_free_mem[p] < s.memory_mib
            ):
                out.update(self.dev_shares[p] or ())
        return out
