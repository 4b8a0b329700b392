"""Reading the node agent's `agentaflow.gpu/device-holders` annotation: who holds each device, as the kubelet
(PodResources) says, and GPU memory used by processes in no pod (NVML). Lenient like every Node read: a bad
annotation or entry is recorded as a problem and ignored, never raised.

Wire format (version 1):
    {"v": 1, "source": "podresources" | "unavailable",
     "holders": {"<device index>": [{"namespace": ns, "pod": name, "container": c}, ...]},
     "external": {"<device index>": {"memoryMiB": 512, "pids": [1234]}},
     "unmapped": ["<device id>"]}
"""

from __future__ import annotations

import json
from typing import Any

from gpuledger.core.model import DeviceTruth
from gpuledger.core.pods.quantity import ascii_int
from gpuledger.names import HOLDERS_ANNOTATION

SOURCES = ("podresources", "unavailable")
MAX_TEXT = 256 * 1024
_ACCEPTED = (
    '{"v": 1, "source": "podresources"|"unavailable", "holders": {"<device index>": [{"namespace": str, '
    '"pod": str, "container": str}]}, "external": {"<device index>": {"memoryMiB": int, "pids": [int]}}, '
    '"unmapped": [str]}'
)


def parse_device_holders(
    text: str, node: str, indices: set[int], problems: list[str] | None = None
) -> DeviceTruth | None:
    """The annotation as `DeviceTruth`; None when it is unreadable as a whole. Entries naming a device index
    the node does not have (`indices`, from agentaflow.gpu/devices) are dropped; a device listed for several
    pods keeps the first by namespace/name (the kubelet never shares a whole GPU)."""

    def problem(why: str) -> None:
        if problems is not None:
            problems.append(
                f"node {node} annotation {HOLDERS_ANNOTATION}={text[:200]!r}: {why}; accepted: {_ACCEPTED}"
            )

    try:
        if len(text) > MAX_TEXT:
            raise ValueError(f"longer than {MAX_TEXT} characters")
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        if raw.get("v") != 1:
            raise ValueError(f"version v={raw.get('v')!r}, expected 1")
        source = raw.get("source")
        if source not in SOURCES:
            raise ValueError(f"source={source!r}, expected one of {', '.join(SOURCES)}")
    except (ValueError, TypeError, RecursionError) as err:
        problem(f"ignored ({err})")
        return None
    holders: dict[int, list[tuple[str, str]]] = {}
    for device, pods in _entries(raw.get("holders"), "holders", indices, problem):
        if not isinstance(pods, list):
            problem(f"holders[{device}]={pods!r} ignored (expected a list of pods)")
            continue
        for pod in pods:
            if not isinstance(pod, dict) or not pod.get("pod") or not isinstance(pod.get("pod"), str):
                problem(f"holders[{device}] entry {pod!r} ignored (expected namespace, pod, container)")
                continue
            key = f"{pod.get('namespace') or 'default'}/{pod['pod']}"
            holders.setdefault(device, []).append((key, str(pod.get("container") or "")))
    rows = []
    for device in sorted(holders):
        keys = sorted({k for k, _ in holders[device]})
        if len(keys) > 1:
            problem(f"device {device} listed for pods {', '.join(keys)}; {keys[0]} kept")
        containers = tuple(sorted({c for k, c in holders[device] if k == keys[0] and c}))
        rows.append((device, keys[0], containers))
    external = []
    for device, use in _entries(raw.get("external"), "external", indices, problem):
        try:
            if not isinstance(use, dict):
                raise ValueError("not an object")
            mib = ascii_int(use.get("memoryMiB", 0))
            pids = tuple(sorted(ascii_int(p) for p in use.get("pids") or ()))
        except (ValueError, TypeError) as err:
            problem(f"external[{device}]={use!r} ignored ({err})")
            continue
        external.append((device, max(0, mib), pids))
    unmapped = raw.get("unmapped") or []
    if not isinstance(unmapped, list):
        problem(f"unmapped={unmapped!r} ignored (expected a list of device ids)")
        unmapped = []
    elif unmapped:  # the kubelet and the probe disagree: devices the ledger cannot place or check
        problem(f"the kubelet names device(s) {', '.join(map(str, unmapped[:8]))} that no probed device has")
    return DeviceTruth(
        source=str(source),
        holders=tuple(rows) if source == "podresources" else (),
        external=tuple(sorted(external)),
        unmapped=tuple(sorted(str(u) for u in unmapped)),
    )


def _entries(value: Any, what: str, indices: set[int], problem) -> list[tuple[int, Any]]:
    """(device index, value) of a {"<index>": value} map, bad and unknown indices reported and dropped."""
    if value is None:
        return []
    if not isinstance(value, dict):
        problem(f"{what}={value!r} ignored (expected an object keyed by device index)")
        return []
    out = []
    for raw, item in value.items():
        try:
            device = ascii_int(raw)
        except (ValueError, TypeError):
            problem(f"{what} key {raw!r} ignored (expected a device index)")
            continue
        if device not in indices:
            problem(f"{what}[{device}] ignored (no device {device} in the node's devices)")
            continue
        out.append((device, item))
    return sorted(out, key=lambda e: e[0])
