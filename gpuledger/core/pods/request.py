"""Pod (and its owning Job/StatefulSet) -> the ledger's `Request`: how the annotations combine.

Pure and total: any input either yields a `Request`, `None` (the pod needs no GPU) or an `AnnotationError`
whose message names the annotation (or field), the value and what would be accepted, so the webhook can deny
with a message a user can act on. Each annotation value is read by `annotation_values`, each spec field by
`pod_spec`; the rules are documented in docs/annotations.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from gpuledger.core.model import GroupSpec, PinnedDevices, Request
from gpuledger.core.plugins import registry as strategies
from gpuledger.core.pods import pod_spec
from gpuledger.core.pods.annotation_values import (
    DNS_LABELISH,
    MAX_GPUS_PER_POD,
    TOPOLOGY_STRATEGIES,
    AnnotationError,
    controller_owner,
    mapping,
    parse_scheduling_map,
    read_bool,
    read_gpu_memory_mib,
    read_int,
    read_network_bandwidth,
    read_priority,
    scheduling_map_index,
    string_map,
)
from gpuledger.core.pods.pod_spec import GROUP_OWNER_KINDS, PodRequestConfig
from gpuledger.names import (
    EXCLUSIVE_ACCESS,
    GANG,
    GPU_COUNT,
    GPU_MEMORY,
    GPU_MILLI,
    GPU_PRODUCT,
    HOSTNAME_LABEL,
    LATENCY_SENSITIVE,
    NETWORK_BANDWIDTH,
    PLACEMENT_STRATEGY,
    PODGROUP_GANG_PREFIX,
    PREFERRED_DOMAIN,
    PRIORITY,
    SCHEDULING_MAP,
    SCHEDULING_MAP_ALIAS,
    SCHEDULING_STRATEGY,
)

LATENCY_STRATEGY = "least_utilized"  # what a latency-sensitive pod gets when it names no strategy


def seed_for(reservation_id: str) -> int:
    """A stable seed per reservation, so a `random` strategy answers a retry the same way."""
    return int.from_bytes(hashlib.sha256(reservation_id.encode()).digest()[:4], "big")


# --- the parser ------------------------------------------------------------------------------------------


def request_from_pod(
    pod: Mapping,
    owner: Mapping | None,
    config: PodRequestConfig | Any = None,
    reservation_id: str = "",
    *,
    namespace: str = "",
) -> Request | None:
    """The ledger request for `pod`; None when it needs no GPU.

    Annotations come from the pod and, for the ones the pod leaves unset, from its owning Job, StatefulSet or
    Kubeflow job. `topology.scheduler/gpu-count` written on a group owner is the group's total (split evenly
    over its pods); written on the pod (or its template) it is that pod's own count. The owner's pods form a
    gang only when asked (see `_gang`). Each step below raises on its own annotations, in this order.
    """
    gpu_resource = _gpu_resource(config)
    if not isinstance(pod, dict):
        raise AnnotationError("object", type(pod).__name__, "a Pod object")
    meta = mapping(pod.get("metadata"))
    owner = owner if isinstance(owner, dict) and owner.get("kind") in GROUP_OWNER_KINDS else None
    owner_meta = mapping(owner.get("metadata")) if owner else {}
    ann = _Annotations(meta, owner, owner_meta)
    namespace = namespace or str(meta.get("namespace") or owner_meta.get("namespace") or "")
    group_size = pod_spec.group_size(owner, gpu_resource) if owner is not None else 1
    group = _gang(ann, owner, owner_meta, group_size, namespace)
    gpus, count = _gpu_count(pod, ann, owner, group_size, gpu_resource)
    gpus, gpu_milli, memory, shared, latency = _sharing(ann, gpus, count, gpu_resource)
    pinned, gpus = _pinned(pod, owner, ann, gpus, shared)
    if pinned is not None:
        group = None  # the map fixes every pod's place and device count: no gang to plan, each takes its pin
    if not (gpus > 0 or gpu_milli > 0 or (shared and memory > 0)):
        return None  # needs no GPU
    strategy = _strategy(ann, latency)
    priority = _priority(pod, ann)
    domain = _preferred_domain(ann)
    bandwidth, bandwidth_gbps = _network_bandwidth(ann)
    product = _product(ann)
    cpu_milli, memory_mib = pod_spec.container_resources(pod)
    return Request(
        id=reservation_id,
        gpus=gpus,
        gpu_milli=gpu_milli,
        gpu_memory_mib=memory,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        product=product or None,
        node_selector=_node_selector(pod),
        affinity_terms=pod_spec.affinity_terms(pod),
        tolerations=pod_spec.tolerations(pod),
        preferred_domain=domain or None,
        strategy=strategy,
        priority=priority,
        pinned=pinned,
        group=group,
        latency_sensitive=latency,
        network_bandwidth=bandwidth,
        network_bandwidth_gbps=bandwidth_gbps,
        seed=seed_for(reservation_id),
        namespace=namespace,
        name=pod_name(pod),
    )


# --- its steps -------------------------------------------------------------------------------------------


def _gpu_resource(config: PodRequestConfig | Any) -> str:
    """The extended resource counted as GPUs: a `PodRequestConfig`'s, or any config's `gpu_resource`."""
    if isinstance(config, PodRequestConfig):
        return config.gpu_resource
    return getattr(config, "gpu_resource", PodRequestConfig.gpu_resource)


class _Annotations:
    """The pod's annotations, and its group owner's for the keys the pod leaves unset."""

    __slots__ = ("owner", "pod")

    def __init__(self, meta: Mapping, owner: Mapping | None, owner_meta: Mapping) -> None:
        self.pod = string_map("metadata.annotations", meta.get("annotations"))
        self.owner = (
            string_map(f"{owner.get('kind')} metadata.annotations", owner_meta.get("annotations"))
            if owner
            else {}
        )

    def get(self, key: str) -> str | None:
        pod = self.pod
        return pod[key] if key in pod else self.owner.get(key)


def _gang(
    ann: _Annotations, owner: Mapping | None, owner_meta: Mapping, group_size: int, namespace: str
) -> GroupSpec | None:
    """The owner's pods as one gang, placed all-or-nothing, only when asked: gpu-count on the group owner (the
    group's total), the gang annotation, or a topology placement strategy; `gang: "false"` declines.
    Otherwise each pod is placed on its own. A gang PodGroup is asked by its kind: kube-scheduler keeps it
    whole, so the ledger places it whole too, with `minCount` pods."""
    if owner is not None and owner.get("kind") == "PodGroup":
        if group_size <= 1:
            return None
        name = owner_meta.get("name", "")
        return GroupSpec(key=f"{PODGROUP_GANG_PREFIX}{namespace}/{name}", size=group_size)
    gang_raw = ann.get(GANG)
    gang = (
        read_bool(GANG, gang_raw)
        if gang_raw is not None
        else (GPU_COUNT in ann.owner or ann.get(PLACEMENT_STRATEGY) is not None)
    )
    if owner is None or group_size <= 1 or not gang:
        return None
    prefix = {"Job": "job", "StatefulSet": "sts"}.get(owner["kind"], str(owner["kind"]).lower())
    return GroupSpec(key=f"{prefix}/{namespace}/{owner_meta.get('name', '')}", size=group_size)


def _gpu_count(
    pod: dict, ann: _Annotations, owner: Mapping | None, group_size: int, gpu_resource: str
) -> tuple[int, int | None]:
    """(whole GPUs per pod, the count gpu-count gave or None): gpu-count, or the containers' limits, which
    must agree when both are given."""
    limit_gpus, _ = pod_spec.container_gpus(pod, gpu_resource)
    count = _annotated_count(ann, owner, group_size)
    if count is not None and limit_gpus and count != limit_gpus:
        raise AnnotationError(
            GPU_COUNT,
            ann.get(GPU_COUNT),
            f"{limit_gpus} per pod, the total of the containers' {gpu_resource} limits "
            "(or leave one of them out)",
        )
    return (count if count is not None else limit_gpus), count


def _annotated_count(ann: _Annotations, owner: Mapping | None, group_size: int) -> int | None:
    """The pod's GPU count as gpu-count says it: the pod's own, or its share of the group owner's total."""
    if GPU_COUNT in ann.pod:
        return read_int(GPU_COUNT, ann.pod[GPU_COUNT], 0, MAX_GPUS_PER_POD)
    if GPU_COUNT not in ann.owner:
        return None
    text = ann.owner[GPU_COUNT]
    total = read_int(GPU_COUNT, text, 0, MAX_GPUS_PER_POD * max(group_size, 1))
    if group_size > 1 and total % group_size:
        kind = (owner or {}).get("kind", "owner")
        raise AnnotationError(
            GPU_COUNT,
            text,
            f"a multiple of the {kind}'s {group_size} pods when set on the {kind} "
            f"(it is the group's total, split evenly), or set it per pod in the pod template",
        )
    return total // max(group_size, 1)


def _sharing(
    ann: _Annotations, gpus: int, count: int | None, gpu_resource: str
) -> tuple[int, int, int, bool, bool]:
    """(whole GPUs, thousandths of one shared GPU, MiB of GPU memory, shared, latency-sensitive): a shared
    GPU (exclusive-access "false" or a milli share) takes no whole GPU and says how much of one it needs."""
    memory_raw, exclusive_raw, milli_raw = ann.get(GPU_MEMORY), ann.get(EXCLUSIVE_ACCESS), ann.get(GPU_MILLI)
    memory = read_gpu_memory_mib(GPU_MEMORY, memory_raw) if memory_raw is not None else 0
    exclusive = read_bool(EXCLUSIVE_ACCESS, exclusive_raw) if exclusive_raw is not None else None
    milli = (
        read_int(GPU_MILLI, milli_raw, 1, 999, "a share of one GPU in thousandths, 1 to 999")
        if milli_raw is not None
        else 0
    )
    if milli and exclusive is True:
        raise AnnotationError(
            EXCLUSIVE_ACCESS,
            exclusive_raw,
            f'"false" when {GPU_MILLI} asks for a share of a GPU (or drop {GPU_MILLI})',
        )
    shared = exclusive is False or milli > 0
    latency = _latency_sensitive(ann, shared, milli)
    if shared:
        _check_share(gpus, count, milli, memory, exclusive_raw, gpu_resource)
        return 0, milli, memory, True, latency
    if memory and not gpus:
        raise AnnotationError(
            GPU_MEMORY,
            memory_raw,
            f"{GPU_MEMORY} together with a GPU count ({GPU_COUNT} or {gpu_resource} "
            f'limits), or with {EXCLUSIVE_ACCESS}: "false" to share a GPU',
        )
    return gpus, 0, memory, False, latency


def _latency_sensitive(ann: _Annotations, shared: bool, milli: int) -> bool:
    """A latency-sensitive pod gets whole GPUs that no other pod shares, so it may not ask to share one."""
    text = ann.get(LATENCY_SENSITIVE)
    latency = read_bool(LATENCY_SENSITIVE, text) if text is not None else False
    if shared and latency:
        share_key = GPU_MILLI if milli else EXCLUSIVE_ACCESS
        raise AnnotationError(
            LATENCY_SENSITIVE,
            text,
            f'"false" when the pod shares a GPU ({share_key}={ann.get(share_key)!r}): a '
            "latency-sensitive pod gets whole GPUs that no other pod shares; drop "
            f"{EXCLUSIVE_ACCESS}/{GPU_MILLI} to take a whole GPU, or drop {LATENCY_SENSITIVE}",
        )
    return latency


def _check_share(
    gpus: int, count: int | None, milli: int, memory: int, exclusive_raw: str | None, gpu_resource: str
) -> None:
    """A shared pod shares at most one GPU, and says how much of it (a milli share, GPU memory or both)."""
    if gpus > 1:
        raise AnnotationError(
            GPU_COUNT if count is not None else gpu_resource,
            gpus,
            f'0 or 1 when the GPU is shared ({EXCLUSIVE_ACCESS}: "false" '
            f"or {GPU_MILLI}); a pod shares at most one GPU",
        )
    if not milli and not memory:
        raise AnnotationError(
            EXCLUSIVE_ACCESS,
            exclusive_raw,
            f'"true", or "false" together with {GPU_MILLI} and/or {GPU_MEMORY} '
            "saying how much of the GPU the pod needs",
        )


def _pinned(
    pod: dict, owner: Mapping | None, ann: _Annotations, gpus: int, shared: bool
) -> tuple[PinnedDevices | None, int]:
    """(the devices gpu-scheduling-map pins this pod's index to, or None; the pod's whole GPUs, as the pin
    gives them when no count was)."""
    map_key = SCHEDULING_MAP if ann.get(SCHEDULING_MAP) is not None else SCHEDULING_MAP_ALIAS
    text = ann.get(map_key)
    if text is None:
        return None, gpus
    pins = parse_scheduling_map(map_key, text)
    index = scheduling_map_index(pod, owner.get("kind") if owner else (controller_owner(pod) or (None,))[0])
    if index not in pins:
        raise AnnotationError(
            map_key,
            text,
            f"an entry for this pod's index {index} (entries: {', '.join(str(i) for i in sorted(pins))})",
        )
    pinned = pins[index]
    if shared:
        if len(pinned.devices) != 1:
            raise AnnotationError(map_key, text, "exactly one device for a shared-GPU pod")
        return pinned, gpus
    if gpus and gpus != len(pinned.devices):
        raise AnnotationError(map_key, text, f"{gpus} devices for pod index {index}, matching its GPU count")
    return pinned, len(pinned.devices)


def _strategy(ann: _Annotations, latency: bool) -> str | None:
    """The strategy the pod names, in either family's annotation (not both); a latency-sensitive pod naming
    none gets LATENCY_STRATEGY (the configured default does not win over it)."""
    topo, sched = ann.get(PLACEMENT_STRATEGY), ann.get(SCHEDULING_STRATEGY)
    if topo is not None and sched is not None:
        raise AnnotationError(
            SCHEDULING_STRATEGY,
            sched,
            f"no {SCHEDULING_STRATEGY} when {PLACEMENT_STRATEGY} is also set (set only one)",
        )
    if topo is not None:
        strategy = topo.strip().lower()
        if strategy not in TOPOLOGY_STRATEGIES:
            raise AnnotationError(PLACEMENT_STRATEGY, topo, " | ".join(TOPOLOGY_STRATEGIES))
        return strategy
    if sched is not None:
        # every registered strategy (plug-ins such as fgd included), under any of its spellings
        try:
            return strategies.canonical_name(sched.strip())
        except ValueError:
            raise AnnotationError(
                SCHEDULING_STRATEGY,
                sched,
                " | ".join(strategies.strategy_names())
                + " (also least-loaded, best-fit, cost-optimized, round-robin)",
            ) from None
    return LATENCY_STRATEGY if latency else None


def _priority(pod: dict, ann: _Annotations) -> int:
    """The priority annotation, else the pod's spec.priority (what its PriorityClass gave it), else 0."""
    text = ann.get(PRIORITY)
    if text is not None:
        return read_priority(PRIORITY, text)
    spec_priority = mapping(pod.get("spec")).get("priority")
    return spec_priority if isinstance(spec_priority, int) and not isinstance(spec_priority, bool) else 0


def _preferred_domain(ann: _Annotations) -> str | None:
    text = ann.get(PREFERRED_DOMAIN)
    if text is None:
        return None
    domain = text.strip()
    if not DNS_LABELISH.fullmatch(domain):
        raise AnnotationError(
            PREFERRED_DOMAIN, text, 'a leaf or spine name (a label value), or "leaf" / "spine"'
        )
    return domain


def _network_bandwidth(ann: _Annotations) -> tuple[str | None, float | None]:
    text = ann.get(NETWORK_BANDWIDTH)
    return read_network_bandwidth(NETWORK_BANDWIDTH, text) if text is not None else (None, None)


def _product(ann: _Annotations) -> str | None:
    text = ann.get(GPU_PRODUCT)
    if text is None:
        return None
    product = text.strip()
    if not product or len(product) > 128:
        raise AnnotationError(GPU_PRODUCT, text, 'a GPU product name or part of one, e.g. "A100"')
    return product


def _node_selector(pod: dict) -> tuple[tuple[str, str], ...]:
    """spec.nodeSelector, with spec.nodeName as a hostname requirement: a pod the user bound to a node
    already may hold GPUs only there."""
    spec = mapping(pod.get("spec"))
    selector = string_map("spec.nodeSelector", spec.get("nodeSelector"))
    if isinstance(spec.get("nodeName"), str) and spec["nodeName"]:
        selector.setdefault(HOSTNAME_LABEL, spec["nodeName"])
    return tuple(sorted(selector.items()))


def pod_name(pod: Mapping) -> str:
    """The name a request carries: the pod's own (empty for a pod named later by generateName)."""
    return str(mapping(pod.get("metadata")).get("name") or "")


def for_another_pod(template: Request, reservation_id: str, name: str) -> Request:
    """`template`, request_from_pod's answer for one pod, as it answers for another pod of the same shape
    (everything but its identity equal): the fields that differ pod to pod (`Request.shape` leaves out id,
    seed and name) set exactly as request_from_pod sets them. Never for a pinned request: a
    gpu-scheduling-map entry is chosen by the pod's name or index, so pods of one shape are pinned apart."""
    if template.pinned is not None:
        raise ValueError(f"request {template.id!r} is pinned by gpu-scheduling-map: parse each pod")
    # (not dataclasses.replace: on the admission path it costs 4.7 us a pod against 2.5 us for this)
    return Request(**{**vars(template), "id": reservation_id, "seed": seed_for(reservation_id), "name": name})
