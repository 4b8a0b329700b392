"""runtime-uuids: the runtime mounts exactly the placement's GPUs (by uuid where every one is known, else by
index) and CUDA numbers them from 0 inside; the pod's other containers get none, whatever their image sets."""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger.names import VISIBLE_DEVICES_ANNOTATION
from gpuledger.podwrite.visibility.mode import Env, PlacedEnv, VisibilityMode
from gpuledger.podwrite.visibility.variables import (
    CUDA_VISIBLE_DEVICES,
    NVIDIA_VISIBLE_DEVICES,
    annotation_ref,
)

# a waiting pod's devices: the annotation the placement adapter writes with its placement
VISIBLE_DEVICES_FROM = annotation_ref(VISIBLE_DEVICES_ANNOTATION)


def placed(indices: Sequence[int], uuids: Sequence[str]) -> PlacedEnv:
    known = uuids if len(uuids) == len(indices) and all(uuids) else None
    runtime = ",".join(known) if known else ",".join(map(str, indices))
    return {
        NVIDIA_VISIBLE_DEVICES: runtime,
        CUDA_VISIBLE_DEVICES: ",".join(str(i) for i in range(len(indices))),
    }


def waiting(count: int) -> Env:
    return {
        NVIDIA_VISIBLE_DEVICES: VISIBLE_DEVICES_FROM,
        CUDA_VISIBLE_DEVICES: ",".join(str(i) for i in range(count)),
    }


# other containers must not inherit an image default such as NVIDIA_VISIBLE_DEVICES=all
MODE = VisibilityMode(
    "runtime-uuids",
    placed,
    waiting,
    others={NVIDIA_VISIBLE_DEVICES: "void", CUDA_VISIBLE_DEVICES: None},
)
