"""The nodes whose GPUs a DRA driver publishes in ResourceSlices and gpuledger does not place, from API
objects, by the ledger's own rule.

`gpuledger nodes` shows them as "GPUs published through DRA" and may not reach into gpuledger.core: this
module hands it the core's answer. Slices are read by gpuledger.core.pods.resource_slices and held per node by
gpuledger.core.nodes.published_gpus; a node counts when it has none of the GPUs gpuledger places (no
nvidia.com/gpu in `status.allocatable`, no devices in the node agent's annotation), as the ledger's denials
say.

Pure: plain dicts in, `PublishedGpus` out.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuledger.core.nodes.published_gpus import PublishedGpus, PublishedSlices
from gpuledger.core.pods.objects import node_from_object
from gpuledger.core.pods.resource_slices import read_slice

__all__ = ["PublishedGpus", "dra_nodes"]


def dra_nodes(nodes: Iterable[dict], slices: Iterable[dict]) -> list[PublishedGpus]:
    """Of `nodes`, by name, those whose GPUs only a DRA driver's node-local slices publish."""
    published = PublishedSlices()
    for obj in slices:
        published.apply(read_slice(obj))
    if not published:
        return []
    by_node = published.by_node()
    out = []
    for obj in nodes:
        info = node_from_object(obj)
        if info.name in by_node and not info.devices:
            out.append(by_node[info.name])
    return sorted(out, key=lambda gpus: gpus.node)
