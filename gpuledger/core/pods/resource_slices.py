"""A ResourceSlice (`resource.k8s.io/v1`) as the GPUs it publishes: plain dicts in, `SliceRead` out.

Only GPU drivers' slices are read (gpuledger.names.GPU_DRA_DRIVERS); another driver's slice is read as one of
no devices. The attribute and capacity names are those of NVIDIA's GPU DRA driver, which publishes each GPU
as a device `gpu-<index>` with the attributes `type` ("gpu", or "mig" for a MIG device), `uuid`, `minor`,
`index`, `productName`, `brand`, `architecture`, `cudaComputeCapability`, `driverVersion`,
`cudaDriverVersion`, `pcieBusID` and the standard `resource.kubernetes.io/pcieRoot`, and the capacity
`memory` in bytes (NVIDIA/k8s-dra-driver-gpu, now kubernetes-sigs/dra-driver-nvidia-gpu:
cmd/gpu-kubelet-plugin/deviceinfo.go, `GpuInfo.GetDevice`). A qualified name in the driver's own domain
(`gpu.nvidia.com/productName`) is the same attribute. Total: a malformed field is left out and named in
`SliceRead.problems`, never raised.
"""

from __future__ import annotations

from typing import Any

from gpuledger.core.nodes.published_gpus import SliceDevice, SliceRead
from gpuledger.core.pods.quantity import QuantityError, memory_mib
from gpuledger.names import GPU_DRA_DRIVERS

# what each attribute value is written as (resource.k8s.io/v1 DeviceAttribute: exactly one of them is set)
_VALUE_KEYS = ("string", "int", "bool", "version")


def _attribute(value: Any) -> str | None:
    """A DeviceAttribute's value as text; None when it holds none of the accepted forms."""
    if not isinstance(value, dict):
        return None
    for key in _VALUE_KEYS:
        if key in value and value[key] is not None:
            found = value[key]
            if key == "bool":
                return "true" if found is True else "false" if found is False else None
            return str(found) if isinstance(found, str | int) and not isinstance(found, bool) else None
    return None


def _map(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _short(name: str, driver: str) -> str:
    prefix = f"{driver}/"
    return name[len(prefix) :] if name.startswith(prefix) else name


def _device(dev: Any, driver: str, where: str, problems: list[str]) -> SliceDevice | None:
    if not isinstance(dev, dict):
        problems.append(f"{where}: a device must be an object, got {dev!r}; left out")
        return None
    name = dev.get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"{where}.name: {name!r} is not a device name (a non-empty string); left out")
        return None
    where = f"{where} ({name})"
    body = _map(dev.get("basic")) or dev  # v1beta1 nested them in `basic`
    attributes: dict[str, str] = {}
    raw = body.get("attributes") or {}
    if not isinstance(raw, dict):
        problems.append(f"{where}.attributes: {raw!r} is not a map of attributes; left out")
        raw = {}
    for key, value in raw.items():
        text = _attribute(value)
        if text is None:
            problems.append(
                f"{where}.attributes[{key}]: {value!r} holds none of {', '.join(_VALUE_KEYS)}; left out"
            )
            continue
        attributes[_short(str(key), driver)] = text
    memory = 0
    capacity = body.get("capacity") or {}
    if not isinstance(capacity, dict):
        problems.append(f"{where}.capacity: {capacity!r} is not a map of capacities; left out")
        capacity = {}
    entry = capacity.get("memory", capacity.get(f"{driver}/memory"))
    if entry is not None:
        value = entry.get("value") if isinstance(entry, dict) else None
        try:
            memory = max(0, memory_mib(value, round_up=False))
        except (QuantityError, TypeError, ValueError):
            problems.append(f"{where}.capacity[memory]: {entry!r} is not a quantity (e.g. 80Gi); left out")
    return SliceDevice(
        name=name,
        type=attributes.get("type", ""),
        product=attributes.get("productName", ""),
        uuid=attributes.get("uuid", ""),
        memory_mib=memory,
        attributes=tuple(sorted(attributes.items())),
    )


def _int_field(value: Any, where: str, problems: list[str]) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    problems.append(f"{where}: {value!r} is not a non-negative integer; taken as 0")
    return 0


def read_slice(obj: Any) -> SliceRead:
    """What one ResourceSlice object publishes. A slice whose name, driver or pool is missing is read as
    unusable (`SliceRead.usable`), with the reason in `problems`; one of a driver that is not a GPU driver
    has no devices and no problems; one that is not node-local has `node` "" (its devices count for no
    node)."""
    problems: list[str] = []
    obj = obj if isinstance(obj, dict) else {}
    meta = _map(obj.get("metadata"))
    name = _text(meta.get("name"))
    where = f"ResourceSlice {name or '(no name)'}"
    if not name:
        problems.append(
            f"{where}: metadata.name {meta.get('name')!r} is not a name (a non-empty string); "
            "the slice is ignored"
        )
    spec = _map(obj.get("spec"))
    driver = _text(spec.get("driver"))
    if not driver:
        problems.append(
            f"{where}: spec.driver {spec.get('driver')!r} is not a driver name (e.g. gpu.nvidia.com); "
            "the slice is ignored"
        )
    pool = _map(spec.get("pool"))
    pool_name = _text(pool.get("name"))
    if not isinstance(spec.get("pool"), dict):
        problems.append(
            f"{where}: spec.pool {spec.get('pool')!r} is not an object of name, generation and "
            "resourceSliceCount (spec.pool.name missing); the slice is ignored"
        )
    elif not pool_name:
        problems.append(
            f"{where}: spec.pool.name {pool.get('name')!r} is not a pool name (a non-empty string); "
            "the slice is ignored"
        )
    if problems or driver not in GPU_DRA_DRIVERS:
        return SliceRead(name, driver, pool_name, 0, 0, "", (), tuple(problems))
    generation = _int_field(pool.get("generation"), f"{where}: spec.pool.generation", problems)
    count = _int_field(pool.get("resourceSliceCount"), f"{where}: spec.pool.resourceSliceCount", problems)
    node = spec.get("nodeName")
    if node is not None and (not isinstance(node, str) or not node):
        problems.append(
            f"{where}: spec.nodeName {node!r} is not a node name (a non-empty string); counted for no node"
        )
        node = None
    if node is None or spec.get("perDeviceNodeSelection") is True:
        node = ""  # a node selector, all nodes, or per device: not one node's own
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        problems.append(f"{where}: spec.devices {devices!r} is not a list of devices; none read")
        devices = []
    read = tuple(
        d
        for i, dev in enumerate(devices)
        if (d := _device(dev, driver, f"{where}: spec.devices[{i}]", problems)) is not None
    )
    return SliceRead(name, driver, pool_name, generation, count, node, read, tuple(problems))
