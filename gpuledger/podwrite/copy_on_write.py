"""Copy-on-write access to a pod read as JSON: a writer copies only the members on the way to what it
changes, so the rest stays shared with the pod as read and a diff (gpuledger.podwrite.diff) can skip it by
identity. A pod from the API may hold anything anywhere: a member of the wrong type reads as empty."""

from __future__ import annotations

from typing import Any


def dict_at(parent: dict, key: str) -> dict:
    """parent[key] if it is a mapping, else an empty one."""
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def list_at(parent: dict, key: str) -> list:
    """parent[key] if it is a list, else an empty one."""
    value = parent.get(key)
    return value if isinstance(value, list) else []


def copied(parent: dict, key: str) -> dict:
    """A copy of parent[key] (an empty one if it is no mapping), put in its place to be written."""
    value = parent.get(key)
    out = dict(value) if isinstance(value, dict) else {}
    parent[key] = out
    return out


def shallow_pod(pod: dict) -> dict:
    """A copy whose metadata and spec may be written without touching `pod`."""
    out = dict(pod)
    copied(out, "metadata")
    if isinstance(pod.get("spec"), dict):
        copied(out, "spec")
    return out


def container(spec: dict, kind: str, index: int) -> dict:
    """A copy of spec[kind][index] (the list copied too), put in its place to be written."""
    containers = list(spec[kind])
    spec[kind] = containers
    out: dict[str, Any] = dict(containers[index])
    containers[index] = out
    return out
