"""device-plugin: the kubelet's device plugin picks the devices and sets the runtime's variable itself, so the
pod asks it for them by a GPU limit and keeps no NVIDIA_VISIBLE_DEVICES of its own; a user's
CUDA_VISIBLE_DEVICES indexes what the plugin exposes, so it stays (gpuledger.webhook.admission.env_guard)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger.podwrite.visibility.mode import Env, PlacedEnv, VisibilityMode
from gpuledger.podwrite.visibility.variables import NVIDIA_VISIBLE_DEVICES


def placed(indices: Sequence[int], uuids: Sequence[str]) -> PlacedEnv:
    return {NVIDIA_VISIBLE_DEVICES: None}


def waiting(count: int) -> Env:
    return {NVIDIA_VISIBLE_DEVICES: None}


MODE = VisibilityMode("device-plugin", placed, waiting, kubelet_picks=True)
