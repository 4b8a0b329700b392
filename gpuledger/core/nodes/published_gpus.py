"""The GPUs a DRA driver publishes for each node in ResourceSlices, as opposed to the device plugin's
`nvidia.com/gpu` in a Node's `status.allocatable`.

A driver publishes its devices per pool, in one or more slices: a pool's slices all carry its generation and
`resourceSliceCount`, and a slice of an older generation than the newest one seen is stale (the driver is
replacing it). Only node-local slices (`spec.nodeName`) say what a node has; a slice for a node selector or
for all nodes is kept, and counted for no node. The slices are read from their objects by
gpuledger.core.pods.resource_slices; this module only holds them and answers per node.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gpuledger.names import GPU_DRA_DRIVERS

GPU_TYPE = "gpu"  # the NVIDIA driver's `type` attribute of a whole GPU (a MIG device is "mig")


@dataclass(frozen=True)
class SliceDevice:
    """One device of a slice, with what the driver says of it (attributes as text, by their short name)."""

    name: str
    type: str = ""  # the driver's `type` attribute: "gpu", "mig", ...
    product: str = ""  # `productName`
    uuid: str = ""
    memory_mib: int = 0  # capacity `memory`
    attributes: tuple[tuple[str, str], ...] = ()

    @property
    def is_gpu(self) -> bool:
        return self.type == GPU_TYPE


@dataclass(frozen=True)
class SliceRead:
    """One ResourceSlice as read: `node` is "" for a slice that is not node-local; `problems` say what of it
    was malformed and left out (a slice without a name, driver or pool counts for nothing)."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node: str
    devices: tuple[SliceDevice, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return bool(self.name and self.driver and self.pool)


@dataclass(frozen=True)
class PublishedGpus:
    """One node's GPUs as its DRA drivers publish them: the newest generation of each of its pools."""

    node: str
    drivers: tuple[str, ...]
    devices: tuple[SliceDevice, ...]  # the GPUs (type "gpu"), in slice and device order
    incomplete: tuple[str, ...] = ()  # "driver/pool: 1 of 2 slices": pools whose newest generation is partial

    @property
    def gpus(self) -> int:
        return len(self.devices)

    @property
    def products(self) -> tuple[tuple[str, int], ...]:
        """(product, GPUs of it), most first; a device without `productName` is "unknown product"."""
        counts = Counter(d.product or "unknown product" for d in self.devices)
        return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def describe(self) -> str:
        """`8x NVIDIA H100 80GB HBM3 (driver gpu.nvidia.com)`, as a denial and `gpuledger nodes` say it."""
        products = ", ".join(f"{n}x {p}" for p, n in self.products)
        drivers = ", ".join(self.drivers)
        partial = f"; incomplete pool {', '.join(self.incomplete)}" if self.incomplete else ""
        return f"{products} (driver {drivers}{partial})"


class PublishedSlices:
    """Every ResourceSlice of a GPU driver seen, by name, and what they publish per node."""

    def __init__(self) -> None:
        self.slices: dict[str, SliceRead] = {}

    def __bool__(self) -> bool:
        return bool(self.slices)

    def apply(self, read: SliceRead) -> None:
        """A slice added or changed (one that is not usable replaces nothing: its name may be all it has); a
        slice of a driver that is not a GPU driver is not kept."""
        if not read.usable:
            return
        if read.driver in GPU_DRA_DRIVERS:
            self.slices[read.name] = read
        else:
            self.slices.pop(read.name, None)

    def delete(self, name: str) -> None:
        self.slices.pop(name, None)

    def _newest(self) -> dict[tuple[str, str], list[SliceRead]]:
        """(driver, pool) -> the slices of its newest generation."""
        pools: dict[tuple[str, str], list[SliceRead]] = {}
        for read in self.slices.values():
            key = (read.driver, read.pool)
            have = pools.get(key)
            if have is None or read.generation > have[0].generation:
                pools[key] = [read]
            elif read.generation == have[0].generation:
                have.append(read)
        return pools

    def by_node(self) -> dict[str, PublishedGpus]:
        """Node -> the GPUs its node-local slices of each pool's newest generation publish (nodes whose slices
        list no GPU are left out)."""
        devices: dict[str, list[SliceDevice]] = {}
        drivers: dict[str, set[str]] = {}
        partial: dict[str, list[str]] = {}
        for (driver, pool), reads in sorted(self._newest().items()):
            count = max(read.slice_count for read in reads)
            for read in sorted(reads, key=lambda r: r.name):
                if not read.node:
                    continue
                gpus = [d for d in read.devices if d.is_gpu]
                if gpus:
                    devices.setdefault(read.node, []).extend(gpus)
                    drivers.setdefault(read.node, set()).add(driver)
                    if len(reads) < count:
                        note = f"{driver}/{pool}: {len(reads)} of {count} slices"
                        if note not in partial.setdefault(read.node, []):
                            partial[read.node].append(note)
        return {
            node: PublishedGpus(
                node, tuple(sorted(drivers[node])), tuple(found), tuple(partial.get(node, ()))
            )
            for node, found in sorted(devices.items())
        }

    def snapshot(self) -> list[list]:
        """[name, driver, pool, generation, slice count, node, devices] of every slice, by name."""
        return [
            [r.name, r.driver, r.pool, r.generation, r.slice_count, r.node, [_row(d) for d in r.devices]]
            for _, r in sorted(self.slices.items())
        ]


def _row(device: SliceDevice) -> list:
    return [
        device.name,
        device.type,
        device.product,
        device.uuid,
        device.memory_mib,
        [list(a) for a in device.attributes],
    ]
