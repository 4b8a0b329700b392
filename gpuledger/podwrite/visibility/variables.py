"""The variables through which a container's runtime and CUDA learn which GPUs it may use."""

from __future__ import annotations

# the NVIDIA runtime mounts the GPUs named here into the container (`all`: the node's every GPU, `void`: none)
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# CUDA numbers, among the GPUs the container sees, those a program may use
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
VISIBILITY_VARS = (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES)


def annotation_ref(annotation: str) -> dict:
    """A `valueFrom` the kubelet fills from the pod's annotation when the container starts: how a pod admitted
    to wait reads the devices its placement writes later (apiVersion written as the API server defaults it,
    so the stored pod reads back as written)."""
    return {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{annotation}']"}}
