"""host-indices: the runtime exposes every GPU of the node and CUDA_VISIBLE_DEVICES names the placement's by
their physical indices, which are only true if the container sees every GPU of the node."""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger.names import DEVICE_INDICES_ANNOTATION
from gpuledger.podwrite.visibility.mode import Env, PlacedEnv, VisibilityMode
from gpuledger.podwrite.visibility.variables import (
    CUDA_VISIBLE_DEVICES,
    NVIDIA_VISIBLE_DEVICES,
    annotation_ref,
)

# a waiting pod's indices: the annotation the placement adapter writes with its placement
DEVICE_INDICES_FROM = annotation_ref(DEVICE_INDICES_ANNOTATION)


def placed(indices: Sequence[int], uuids: Sequence[str]) -> PlacedEnv:
    return {NVIDIA_VISIBLE_DEVICES: "all", CUDA_VISIBLE_DEVICES: ",".join(map(str, indices))}


def waiting(count: int) -> Env:
    return {NVIDIA_VISIBLE_DEVICES: "all", CUDA_VISIBLE_DEVICES: DEVICE_INDICES_FROM}


MODE = VisibilityMode("host-indices", placed, waiting)
