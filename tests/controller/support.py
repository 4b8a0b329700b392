"""GPUWorkload objects of both groups for the controller's unit tests."""

from __future__ import annotations

import copy

T0 = 1_800_000_000.0  # an injected clock's start (epoch seconds)


def agentaflow(
    name: str = "train", gpus: int = 2, priority: int = 0, created: str = "2027-01-15T08:00:00Z", **spec
) -> dict:
    body = {
        "priority": priority,
        "gpuRequirements": {"gpuCount": gpus, "exclusiveAccess": True},
        "podTemplate": {"spec": {"containers": [{"name": "main", "image": "pytorch"}]}},
    }
    body.update(spec)
    return {
        "apiVersion": "agentaflow.io/v1",
        "kind": "GPUWorkload",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": created,
        },
        "spec": body,
    }


def warp(
    name: str = "llama", gpus: int = 2, priority="medium", created: str = "2027-01-15T08:00:00Z", **spec
) -> dict:
    body = {"modelName": "llama2", "gpuCount": gpus, "priority": priority, "image": "vllm"}
    body.update(spec)
    return {
        "apiVersion": "gpu.warp.dev/v1alpha1",
        "kind": "GPUWorkload",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-w-{name}",
            "generation": 1,
            "creationTimestamp": created,
        },
        "spec": copy.deepcopy(body),
    }
