"""Every annotation key the webhook reads, and the reader of each value: text -> typed value or a denial.

Readers are pure and total: they return a value or raise `AnnotationError`, whose message names the
annotation (or field), the value and what is accepted. Numbers are ASCII digits only, never `٢` or `２`.
"""  # noqa: RUF002 (the look-alike digits are the point)

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from gpuledger.core.model import PinnedDevices
from gpuledger.core.pods.quantity import MIB, QuantityError
from gpuledger.core.pods.quantity import parse_quantity as _quantity
from gpuledger.names import (
    EXCLUSIVE_ACCESS,
    GANG,
    GPU_COUNT,
    GPU_MEMORY,
    GPU_MILLI,
    GPU_PRODUCT,
    JOB_COMPLETION_INDEX,
    LATENCY_SENSITIVE,
    NETWORK_BANDWIDTH,
    PLACEMENT_STRATEGY,
    POD_INDEX_LABEL,
    PREFERRED_DOMAIN,
    PRIORITY,
    SCHEDULING_MAP,
    SCHEDULING_MAP_ALIAS,
    SCHEDULING_STRATEGY,
)

# every annotation the request parser reads; the docs and the fuzz tests iterate over it
ANNOTATIONS: tuple[str, ...] = (
    GPU_COUNT,
    PREFERRED_DOMAIN,
    PLACEMENT_STRATEGY,
    LATENCY_SENSITIVE,
    NETWORK_BANDWIDTH,
    SCHEDULING_STRATEGY,
    PRIORITY,
    GPU_MEMORY,
    EXCLUSIVE_ACCESS,
    GPU_MILLI,
    GPU_PRODUCT,
    SCHEDULING_MAP,
    SCHEDULING_MAP_ALIAS,
    GANG,
)

TOPOLOGY_STRATEGIES = ("consolidated", "distributed", "balanced")
NETWORK_BANDWIDTHS = ("high", "medium", "low")
# GPU_Orchestrator's priority words, as integers. The `priority` strategy lets priority >= 1 use the GPU
# capacity it keeps as headroom: `high` and `critical` may, `medium` (the default: no annotation is 0) and
# `low` may not. The gaps leave room for the integers AgentaFlow users write ("5", "10").
PRIORITY_WORDS: dict[str, int] = {"low": -100, "medium": 0, "high": 100, "critical": 1000}
# bandwidth prefixes -> Gbit/s, for topology.scheduler/network-bandwidth ("100Gb", "400Gbps", "25G")
BANDWIDTH_PREFIXES: dict[str, Fraction] = {
    "k": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "g": Fraction(1),
    "t": Fraction(1000),
}
TRUE_WORDS, FALSE_WORDS = ("true", "yes", "1", "on"), ("false", "no", "0", "off")

MAX_GPUS_PER_POD = 1024
MAX_GROUP_SIZE = 100_000
MAX_GPU_MEMORY_MIB = 10**7
DNS_LABELISH = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?", re.ASCII)  # use fullmatch
_INTEGER = re.compile(r"[+-]?[0-9]{1,12}", re.ASCII)
_ORDINAL_SUFFIX = re.compile(r"-([0-9]+)\Z", re.ASCII)
_BYTES = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,9})?(?:Ki|Mi|Gi|Ti|Pi|Ei|[kMGTPE])", re.ASCII)
_BANDWIDTH = re.compile(
    r"([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*([kKmMgGtT])(?:b|bps|b/s|bit|bits|bit/s)?", re.ASCII
)
_MAP_LINE = re.compile(r"([0-9]{1,6})\s*=\s*([^:\s]+)\s*:\s*([0-9]{1,4}(?:\s*,\s*[0-9]{1,4})*)", re.ASCII)


class AnnotationError(ValueError):
    """A value the webhook cannot honour; `str()` names the annotation (or field), the value and the fix."""

    def __init__(self, annotation: str, value: Any, accepted: str):
        self.annotation, self.value, self.accepted = annotation, value, accepted
        shown = value if isinstance(value, str) else repr(value)
        if len(shown) > 200:
            shown = shown[:200] + "..."
        super().__init__(f"{annotation}={shown!r} is not accepted: expected {accepted}")


# --- values ----------------------------------------------------------------------------------------------


def read_int(annotation: str, raw: Any, lo: int, hi: int, accepted: str | None = None) -> int:
    """An integer from lo to hi: a JSON integer, or text of ASCII digits with an optional sign."""
    text = raw.strip() if isinstance(raw, str) else raw
    accepted = accepted or f"an integer from {lo} to {hi}"
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise AnnotationError(annotation, raw, accepted)
    if isinstance(text, str) and not _INTEGER.fullmatch(text):
        raise AnnotationError(annotation, raw, accepted)
    value = int(text)
    if not lo <= value <= hi:
        raise AnnotationError(annotation, raw, accepted)
    return value


def read_bool(annotation: str, raw: Any) -> bool:
    text = str(raw).strip().lower() if isinstance(raw, (str, bool)) else None
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise AnnotationError(annotation, raw, '"true" or "false"')


def parse_quantity(field: str, raw: Any) -> Fraction:
    """A non-negative Kubernetes resource.Quantity ("500m", "2Gi", "1e3", "4") in base units, exactly."""
    try:
        value = _quantity(raw)
    except QuantityError:
        raise AnnotationError(
            field, raw, 'a Kubernetes quantity such as "500m", "2", "512Mi" or "1Gi" (ASCII digits)'
        ) from None
    if value < 0:
        raise AnnotationError(field, raw, "a non-negative quantity")
    return value


def read_priority(annotation: str, raw: Any) -> int:
    """An integer (higher is more important) or one of `PRIORITY_WORDS` (any case)."""
    words = " | ".join(PRIORITY_WORDS)
    word = raw.strip().lower() if isinstance(raw, str) else None
    if word in PRIORITY_WORDS:
        return PRIORITY_WORDS[word]
    return read_int(
        annotation,
        raw,
        -(2**31),
        2**31 - 1,
        f"an integer from {-(2**31)} to {2**31 - 1} (higher is more important) or {words}",
    )


def read_gpu_memory_mib(annotation: str, raw: Any) -> int:
    """GPU memory in MiB: a plain integer is MiB (as always); a Kubernetes quantity of bytes ("16Gi",
    "16384Mi", "40G") is converted, rounded up to a whole MiB. Exponents and milli are refused: "1e3" could
    be read as MiB or as bytes."""
    accepted = (
        f"GPU memory in MiB, an integer from 1 to {MAX_GPU_MEMORY_MIB}, or a quantity of bytes such "
        'as "16Gi", "16384Mi" or "40G" (ASCII digits)'
    )
    text = raw.strip() if isinstance(raw, str) else raw
    if not (isinstance(text, str) and _BYTES.fullmatch(text)):
        return read_int(annotation, raw, 1, MAX_GPU_MEMORY_MIB, accepted)
    mib = -(-_quantity(text) // MIB)  # exact ceiling of a Fraction
    if not 1 <= mib <= MAX_GPU_MEMORY_MIB:
        raise AnnotationError(annotation, raw, accepted)
    return int(mib)


def read_network_bandwidth(annotation: str, raw: Any) -> tuple[str | None, float | None]:
    """(word, None) for `high | medium | low` (any case), or (None, Gbit/s) for a bandwidth in bits per
    second: "100Gb", "200Gb", "400Gbps", "25G", "1.6Tbps", "800Mbps". A capital B (bytes) is refused."""
    accepted = (
        " | ".join(NETWORK_BANDWIDTHS) + ', or a positive bandwidth in bits per second such as "100Gb", '
        '"400Gbps", "25G" or "800Mbps" (ASCII digits)'
    )
    if not isinstance(raw, str):
        raise AnnotationError(annotation, raw, accepted)
    text = raw.strip()
    if text.lower() in NETWORK_BANDWIDTHS:
        return text.lower(), None
    m = _BANDWIDTH.fullmatch(text)
    if not m:
        raise AnnotationError(annotation, raw, accepted)
    gbps = Fraction(m.group(1)) * BANDWIDTH_PREFIXES[m.group(2).lower()]
    if gbps <= 0:
        raise AnnotationError(annotation, raw, accepted)
    return None, float(gbps)


def node_bandwidth_gbps(value: Any) -> float | None:
    """A node's `NETWORK_BANDWIDTH_LABEL` in Gbit/s: a plain number ("200", "12.5") or a bandwidth such as
    "400Gbps"; None when missing or unreadable (such a node meets no bandwidth request)."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if re.fullmatch(r"[0-9]{1,9}(?:\.[0-9]{1,6})?", text, re.ASCII):
        return float(Fraction(text))
    m = _BANDWIDTH.fullmatch(text)
    return float(Fraction(m.group(1)) * BANDWIDTH_PREFIXES[m.group(2).lower()]) if m else None


def parse_scheduling_map(annotation: str, raw: Any) -> dict[int, PinnedDevices]:
    """`index=node:dev,dev` lines (blank lines and `#` comments ignored) -> pod index -> pin."""
    accepted = 'lines "INDEX=NODE:DEV[,DEV...]" such as "0=node1:0,1", one per pod index (ASCII digits)'
    if not isinstance(raw, str):
        raise AnnotationError(annotation, raw, accepted)
    pins: dict[int, PinnedDevices] = {}
    for line in raw.replace(";", "\n").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _MAP_LINE.fullmatch(line)
        if not m:
            raise AnnotationError(annotation, raw, f"{accepted} (cannot read line {line!r})")
        index, node, devs = int(m.group(1)), m.group(2), m.group(3)
        if not DNS_LABELISH.fullmatch(node):
            raise AnnotationError(annotation, raw, f"{accepted} (bad node name {node!r})")
        devices = tuple(int(d) for d in devs.split(","))
        if len(set(devices)) != len(devices):
            raise AnnotationError(annotation, raw, f"{accepted} (device listed twice in line {line!r})")
        if index in pins:
            raise AnnotationError(annotation, raw, f"{accepted} (index {index} listed twice)")
        pins[index] = PinnedDevices(node=node, devices=devices)
    if not pins:
        raise AnnotationError(annotation, raw, accepted)
    return pins


# --- pod fields ------------------------------------------------------------------------------------------


def mapping(value: Any) -> Mapping:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


def string_map(field: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AnnotationError(field, value, "a map of strings")
    return {str(k): v if isinstance(v, str) else str(v) for k, v in value.items()}


def controller_owner(pod: Mapping) -> tuple[str, str] | None:
    """(kind, name) of the pod's controlling Job or StatefulSet, if any."""
    for ref in as_list(mapping(pod.get("metadata")).get("ownerReferences")):
        ref = mapping(ref)
        if ref.get("kind") in ("Job", "StatefulSet") and ref.get("name") and ref.get("controller", True):
            return str(ref["kind"]), str(ref["name"])
    return None


def pod_index(pod: Mapping, owner_kind: str | None = None) -> int | None:
    """The pod's index in its workload: pod-index label, Job completion index, or StatefulSet ordinal."""
    meta = mapping(pod.get("metadata"))
    labels, annotations = mapping(meta.get("labels")), mapping(meta.get("annotations"))
    for source, key in (
        (labels, POD_INDEX_LABEL),
        (annotations, JOB_COMPLETION_INDEX),
        (labels, JOB_COMPLETION_INDEX),
    ):
        if key in source:
            return read_int(key, source[key], 0, 10**9, "a non-negative integer pod index")
    if owner_kind == "StatefulSet":
        m = _ORDINAL_SUFFIX.search(str(meta.get("name") or ""))
        if m:
            return int(m.group(1)[-9:])
    return None


def scheduling_map_index(pod: Mapping, owner_kind: str | None = None) -> int:
    """The pod's entry in a `gpu-scheduling-map`. Sources, tried in this order:

    1. the `apps.kubernetes.io/pod-index` label;
    2. the `batch.kubernetes.io/job-completion-index` annotation, then the label of that name (Indexed Jobs);
    3. the trailing `-N` of the pod's name, whatever owns the pod: a StatefulSet ordinal (`db-2` -> 2) and
       the gpu-scheduling-map scheduler's rule for any pod (`gpu-test-1` -> 1, `name-abc123-0` -> 0);
    4. entry 0 (a pod without such a name, e.g. one named by generateName, which admission sees nameless).

    A malformed source from 1-2 is an `AnnotationError`, not a fall through: a wrong index must not pin the
    pod somewhere else."""
    index = pod_index(pod, owner_kind)
    if index is not None:
        return index
    m = _ORDINAL_SUFFIX.search(str(mapping(pod.get("metadata")).get("name") or ""))
    return int(m.group(1)[-9:]) if m else 0
