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

from gpuledger.core import pod_spec
from gpuledger.core import registry as strategies

# The value readers live in annotation_values (the keys in gpuledger.names); each is re-exported here
# because callers (gpuledger.service.ledger_service, the tests) import them from gpuledger.core.request.
from gpuledger.core.annotation_values import (  # noqa: F401
    ANNOTATIONS,
    DNS_LABELISH,
    FALSE_WORDS,
    MAX_GPUS_PER_POD,
    MAX_GROUP_SIZE,
    NETWORK_BANDWIDTHS,
    TOPOLOGY_STRATEGIES,
    TRUE_WORDS,
    AnnotationError,
    as_list,
    controller_owner,
    mapping,
    node_bandwidth_gbps,
    parse_quantity,
    parse_scheduling_map,
    pod_index,
    read_bool,
    read_gpu_memory_mib,
    read_int,
    read_network_bandwidth,
    read_priority,
    scheduling_map_index,
    string_map,
)
from gpuledger.core.model import GroupSpec, PinnedDevices, Request
from gpuledger.core.pod_spec import GROUP_OWNER_KINDS, PodRequestConfig
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
    gang only when asked (see the comment at `gang` below).
    """
    config = (
        config
        if isinstance(config, PodRequestConfig)
        else PodRequestConfig(gpu_resource=getattr(config, "gpu_resource", PodRequestConfig.gpu_resource))
    )
    if not isinstance(pod, dict):
        raise AnnotationError("object", type(pod).__name__, "a Pod object")
    meta = mapping(pod.get("metadata"))
    pod_ann = string_map("metadata.annotations", meta.get("annotations"))
    owner = owner if isinstance(owner, dict) and owner.get("kind") in GROUP_OWNER_KINDS else None
    owner_meta = mapping(owner.get("metadata")) if owner else {}
    owner_ann = (
        string_map(f"{owner.get('kind')} metadata.annotations", owner_meta.get("annotations"))
        if owner
        else {}
    )
    namespace = namespace or str(meta.get("namespace") or owner_meta.get("namespace") or "")

    def get(key: str) -> str | None:
        return pod_ann[key] if key in pod_ann else owner_ann.get(key)

    # a gang only when asked: gpu-count on the group owner (the group's total), the gang annotation, or a
    # topology placement strategy; `gang: "false"` declines. Otherwise each pod is placed on its own.
    group: GroupSpec | None = None
    group_size = pod_spec.group_size(owner, config.gpu_resource) if owner is not None else 1
    gang_raw = get(GANG)
    gang = (
        read_bool(GANG, gang_raw)
        if gang_raw is not None
        else (GPU_COUNT in owner_ann or get(PLACEMENT_STRATEGY) is not None)
    )
    if owner is not None and group_size > 1 and gang:
        prefix = {"Job": "job", "StatefulSet": "sts"}.get(owner["kind"], str(owner["kind"]).lower())
        group = GroupSpec(key=f"{prefix}/{namespace}/{owner_meta.get('name', '')}", size=group_size)

    # --- how many GPUs ---
    limit_gpus, _ = pod_spec.container_gpus(pod, config.gpu_resource)
    count: int | None = None
    if GPU_COUNT in pod_ann:
        count = read_int(GPU_COUNT, pod_ann[GPU_COUNT], 0, MAX_GPUS_PER_POD)
    elif GPU_COUNT in owner_ann:
        total = read_int(GPU_COUNT, owner_ann[GPU_COUNT], 0, MAX_GPUS_PER_POD * max(group_size, 1))
        if group_size > 1 and total % group_size:
            kind = (owner or {}).get("kind", "owner")
            raise AnnotationError(
                GPU_COUNT,
                owner_ann[GPU_COUNT],
                f"a multiple of the {kind}'s {group_size} pods when set on the {kind} "
                f"(it is the group's total, split evenly), or set it per pod in the pod template",
            )
        count = total // max(group_size, 1)
    if count is not None and limit_gpus and count != limit_gpus:
        raise AnnotationError(
            GPU_COUNT,
            get(GPU_COUNT),
            f"{limit_gpus} per pod, the total of the containers' {config.gpu_resource} limits "
            "(or leave one of them out)",
        )
    gpus = count if count is not None else limit_gpus

    # --- sharing ---
    memory = read_gpu_memory_mib(GPU_MEMORY, get(GPU_MEMORY)) if get(GPU_MEMORY) is not None else 0
    exclusive_raw = get(EXCLUSIVE_ACCESS)
    exclusive = read_bool(EXCLUSIVE_ACCESS, exclusive_raw) if exclusive_raw is not None else None
    milli = (
        read_int(GPU_MILLI, get(GPU_MILLI), 1, 999, "a share of one GPU in thousandths, 1 to 999")
        if get(GPU_MILLI) is not None
        else 0
    )
    gpu_milli = 0
    if milli and exclusive is True:
        raise AnnotationError(
            EXCLUSIVE_ACCESS,
            exclusive_raw,
            f'"false" when {GPU_MILLI} asks for a share of a GPU (or drop {GPU_MILLI})',
        )
    shared = exclusive is False or milli > 0
    latency = (
        read_bool(LATENCY_SENSITIVE, get(LATENCY_SENSITIVE)) if get(LATENCY_SENSITIVE) is not None else False
    )
    if shared and latency:
        share_key = GPU_MILLI if milli else EXCLUSIVE_ACCESS
        raise AnnotationError(
            LATENCY_SENSITIVE,
            get(LATENCY_SENSITIVE),
            f'"false" when the pod shares a GPU ({share_key}={get(share_key)!r}): a '
            "latency-sensitive pod gets whole GPUs that no other pod shares; drop "
            f"{EXCLUSIVE_ACCESS}/{GPU_MILLI} to take a whole GPU, or drop {LATENCY_SENSITIVE}",
        )
    if shared:
        if gpus > 1:
            raise AnnotationError(
                GPU_COUNT if count is not None else config.gpu_resource,
                gpus,
                '0 or 1 when the GPU is shared (agentaflow.gpu/exclusive-access: "false" '
                f"or {GPU_MILLI}); a pod shares at most one GPU",
            )
        if not milli and not memory:
            raise AnnotationError(
                EXCLUSIVE_ACCESS,
                exclusive_raw,
                f'"true", or "false" together with {GPU_MILLI} and/or {GPU_MEMORY} '
                "saying how much of the GPU the pod needs",
            )
        gpus, gpu_milli = 0, milli
    elif memory and not gpus:
        raise AnnotationError(
            GPU_MEMORY,
            get(GPU_MEMORY),
            f"{GPU_MEMORY} together with a GPU count ({GPU_COUNT} or {config.gpu_resource} "
            f'limits), or with {EXCLUSIVE_ACCESS}: "false" to share a GPU',
        )

    # --- explicit map ---
    map_key = SCHEDULING_MAP if get(SCHEDULING_MAP) is not None else SCHEDULING_MAP_ALIAS
    pinned: PinnedDevices | None = None
    if get(map_key) is not None:
        pins = parse_scheduling_map(map_key, get(map_key))
        index = scheduling_map_index(
            pod, owner.get("kind") if owner else (controller_owner(pod) or (None,))[0]
        )
        if index not in pins:
            raise AnnotationError(
                map_key,
                get(map_key),
                f"an entry for this pod's index {index} (entries: {', '.join(str(i) for i in sorted(pins))})",
            )
        pinned = pins[index]
        if shared:
            if len(pinned.devices) != 1:
                raise AnnotationError(map_key, get(map_key), "exactly one device for a shared-GPU pod")
        elif gpus and gpus != len(pinned.devices):
            raise AnnotationError(
                map_key, get(map_key), f"{gpus} devices for pod index {index}, matching its GPU count"
            )
        else:
            gpus = len(pinned.devices)
        # the map fixes every pod's place and device count, so there is no gang to plan: each pod takes its
        # pin
        group = None

    needs_gpu = gpus > 0 or gpu_milli > 0 or (shared and memory > 0)
    if not needs_gpu:
        return None

    # --- strategy and hints ---
    topo = get(PLACEMENT_STRATEGY)
    sched = get(SCHEDULING_STRATEGY)
    strategy: str | None = None
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
    elif sched is not None:
        # every registered strategy (plug-ins such as fgd included), under any of its spellings
        try:
            strategy = strategies.canonical_name(sched.strip())
        except ValueError:
            raise AnnotationError(
                SCHEDULING_STRATEGY,
                sched,
                " | ".join(strategies.strategy_names())
                + " (also least-loaded, best-fit, cost-optimized, round-robin)",
            ) from None

    if get(PRIORITY) is not None:
        priority = read_priority(PRIORITY, get(PRIORITY))
    else:
        spec_priority = mapping(pod.get("spec")).get("priority")
        priority = (
            spec_priority if isinstance(spec_priority, int) and not isinstance(spec_priority, bool) else 0
        )

    domain = get(PREFERRED_DOMAIN)
    if domain is not None:
        domain = domain.strip()
        if not DNS_LABELISH.fullmatch(domain):
            raise AnnotationError(
                PREFERRED_DOMAIN,
                get(PREFERRED_DOMAIN),
                'a leaf or spine name (a label value), or "leaf" / "spine"',
            )
    if latency and strategy is None:
        strategy = LATENCY_STRATEGY  # an explicit strategy annotation wins; the configured default does not
    bandwidth, bandwidth_gbps = None, None
    if get(NETWORK_BANDWIDTH) is not None:
        bandwidth, bandwidth_gbps = read_network_bandwidth(NETWORK_BANDWIDTH, get(NETWORK_BANDWIDTH))
    product = get(GPU_PRODUCT)
    if product is not None:
        product = product.strip()
        if not product or len(product) > 128:
            raise AnnotationError(
                GPU_PRODUCT, get(GPU_PRODUCT), 'a GPU product name or part of one, e.g. "A100"'
            )

    spec = mapping(pod.get("spec"))
    cpu_milli, memory_mib = pod_spec.container_resources(pod)
    selector = string_map("spec.nodeSelector", spec.get("nodeSelector"))
    if isinstance(spec.get("nodeName"), str) and spec["nodeName"]:
        # the user bound the pod to a node already: only that node may hold its GPUs
        selector.setdefault(HOSTNAME_LABEL, spec["nodeName"])
    node_selector = tuple(sorted(selector.items()))
    return Request(
        id=reservation_id,
        gpus=gpus,
        gpu_milli=gpu_milli,
        gpu_memory_mib=memory,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        product=product or None,
        node_selector=node_selector,
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
