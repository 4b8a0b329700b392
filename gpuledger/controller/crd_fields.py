"""The schema pieces the CRDs are built from: typed fields, the fields both GPUWorkload groups share, status.

Pure data (dicts in the OpenAPI v3 shape the API server wants); gpuledger.controller.crds assembles the CRDs.
"""

from __future__ import annotations

from typing import Any

PHASES = ("Pending", "Queued", "Placing", "Running", "Succeeded", "Failed", "Retrying")
# Strategy names each group's users already write; gpuledger.controller.mapping turns them into registered
# names.
AGENTAFLOW_STRATEGIES = (
    "least_utilized",
    "best_fit",
    "priority",
    "round_robin",
    "random",
    "cost_optimized",
    "consolidated",
    "distributed",
    "balanced",
    "fgd",
    "fgd_host",
)
WARP_STRATEGIES = (
    "leastLoaded",
    "random",
    "costOptimized",
    "bestFit",
    "leastUtilized",
    "priority",
    "roundRobin",
    "consolidated",
    "distributed",
    "balanced",
    "fgd",
    "fgdHost",
)
PRIORITY_WORDS = ("low", "medium", "high", "critical")
TOPOLOGY_STRATEGIES = ("consolidated", "distributed", "balanced")
MAX_GPUS_PER_POD = 1024
MAX_PODS = 1024
MAX_GPU_MEMORY_MIB = 10**7

S = dict[str, Any]


def int_field(lo: int | None = None, hi: int | None = None, description: str = "", **extra: Any) -> S:
    out: S = {"type": "integer", "format": "int64"}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    if description:
        out["description"] = description
    return out | extra


def str_field(description: str = "", **extra: Any) -> S:
    return {"type": "string", **({"description": description} if description else {}), **extra}


def obj_field(properties: S, description: str = "", **extra: Any) -> S:
    return {
        "type": "object",
        **({"description": description} if description else {}),
        "properties": properties,
        **extra,
    }


def opaque(description: str) -> S:
    """A Kubernetes object the API server already validates when the controller creates it."""
    return {"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": True}


def foreign(description: str, scalar: bool = True) -> S:
    """A field of the other group's GPUWorkload, typed loosely and kept (not pruned) only so that a rule can
    refuse it by name: an undeclared field would be dropped without a word."""
    if scalar:
        return {"x-kubernetes-int-or-string": True, "description": description}
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": description}


def refuse(field: str, other: str, hint: str) -> S:
    return {
        "rule": f"!has(self.{field})",
        "fieldPath": f".{field}",
        "reason": "FieldValueForbidden",
        "message": f"spec.{field} is a field of {other} GPUWorkloads, not of this group: {hint}",
    }


# --- fields both groups share (what a production queue needs and neither earlier tool had) ------------------


def shared_spec() -> S:
    return {
        "parallelism": int_field(
            1,
            MAX_PODS,
            "Pods run at once, each with the per-pod GPUs; more than 1 is a gang: "
            "all pods are placed or none (the Job's parallelism and completions). Default 1.",
            default=1,
        ),
        "topology": obj_field(
            {
                "placementStrategy": str_field(
                    "Topology strategy: pack into few leaves, spread over leaves, or weigh "
                    "both (topology.scheduler/placement-strategy).",
                    enum=list(TOPOLOGY_STRATEGIES),
                ),
                "preferredDomain": str_field(
                    "A leaf or spine name to try first, or `leaf` / `spine`.",
                    maxLength=253,
                    pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$",
                ),
                "latencySensitive": {"type": "boolean", "description": "Hint for the topology strategies."},
                "networkBandwidth": str_field(
                    "high | medium | low, or bits per second such as 100Gb, 400Gbps.", maxLength=32
                ),
            },
            "Gang and leaf rules for multi-pod workloads (the webhook's topology annotations).",
        ),
        "activeDeadlineSeconds": int_field(
            1,
            31_536_000,
            "The workload must finish within this many seconds of its "
            "creation, queue time included; past it the Job is deleted and the "
            "workload Failed with reason DeadlineExceeded.",
        ),
        "suspend": {
            "type": "boolean",
            "default": False,
            "description": "True: leave the queue (or stop: the Job is deleted, its GPUs freed) and stay "
            "Pending with reason Suspended until set back to false.",
        },
        "retryPolicy": obj_field(
            {
                "maxRetries": int_field(
                    0,
                    100,
                    "Attempts after the first (pod failed, node lost, transient denial). Default 3.",
                    default=3,
                ),
                "backoffSeconds": int_field(
                    1, 86_400, "First delay; doubles each retry, with jitter. Default 10.", default=10
                ),
                "maxBackoffSeconds": int_field(1, 86_400, "Cap on one delay. Default 300.", default=300),
            },
            "Retries with exponential backoff and jitter (docs/operator.md).",
        ),
    }


def conditions() -> S:
    return {
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": obj_field(
            {
                "type": str_field(),
                "status": str_field(enum=["True", "False", "Unknown"]),
                "reason": str_field(),
                "message": str_field(),
                "lastTransitionTime": str_field(format="date-time"),
                "observedGeneration": int_field(0),
            },
            required=["type", "status"],
        ),
    }


def workload_status() -> S:
    return obj_field(
        {
            "phase": str_field(
                "Pending, Queued, Placing, Running, Succeeded, Failed or Retrying.", enum=list(PHASES)
            ),
            "assignedNodes": {
                "type": "array",
                "items": str_field(),
                "description": "Nodes the pods were placed on.",
            },
            "devices": {
                "type": "array",
                "description": "Per pod: node and GPU indices the webhook placed it on.",
                "items": obj_field(
                    {
                        "pod": str_field(),
                        "node": str_field(),
                        "indices": {"type": "array", "items": int_field(0)},
                        "uuids": {"type": "array", "items": str_field()},
                        "milli": int_field(0),
                        "memoryMiB": int_field(0),
                    }
                ),
            },
            "attempts": int_field(0, description="Attempts started (Jobs created)."),
            "nextRetryTime": str_field("When a Retrying workload re-enters the queue.", format="date-time"),
            "queuePosition": int_field(1, description="1-based position in the queue while Queued."),
            "reason": str_field(
                "Why the workload is in its phase (e.g. Insufficient, Suspended, PodFailed)."
            ),
            "message": str_field("The blocking resource or the failure, in words."),
            "conditions": conditions(),
            "jobName": str_field("The Job of the current attempt."),
            "queuedTime": str_field(
                "When the workload entered the queue (its age in the queue).", format="date-time"
            ),
            "startTime": str_field(format="date-time"),
            "completionTime": str_field(format="date-time"),
            "observedGeneration": int_field(0),
        }
    )


def workload_columns(gpus_path: str) -> list[S]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Priority", "type": "string", "jsonPath": ".spec.priority"},
        {"name": "GPUs", "type": "integer", "jsonPath": gpus_path, "description": "GPUs per pod"},
        {"name": "Pods", "type": "integer", "jsonPath": ".spec.parallelism", "priority": 1},
        {"name": "Position", "type": "integer", "jsonPath": ".status.queuePosition"},
        {"name": "Nodes", "type": "string", "jsonPath": ".status.assignedNodes"},
        {"name": "Attempts", "type": "integer", "jsonPath": ".status.attempts"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
        {"name": "Next-Retry", "type": "date", "jsonPath": ".status.nextRetryTime", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def gpunode_status() -> S:
    holder = obj_field(
        {
            "pod": str_field("namespace/name"),
            "reservationId": str_field(),
            "milli": int_field(0),
            "memoryMiB": int_field(0),
            "confirmed": {"type": "boolean"},
        }
    )
    device = obj_field(
        {
            "index": int_field(0),
            "uuid": str_field(),
            "product": str_field(),
            "memoryMiB": int_field(0),
            "health": str_field("Healthy or Unhealthy, as the node agent reported."),
            "utilization": {"type": "number", "description": "Percent busy, as the node agent reported."},
            "allocatedMilli": int_field(0, 1000),
            "allocatedMemoryMiB": int_field(0),
            "holders": {
                "type": "array",
                "items": holder,
                "description": "Pods holding the device or a share.",
            },
        }
    )
    return obj_field(
        {
            "leaf": str_field(),
            "spine": str_field(),
            "schedulable": {"type": "boolean"},
            "devices": {"type": "array", "items": device},
            "allocation": obj_field(
                {
                    "totalGPUs": int_field(0),
                    "allocatedGPUs": int_field(0),
                    "sharedGPUs": int_field(0),
                    "freeGPUs": int_field(0),
                    "allocatedMilli": int_field(0),
                    "percent": {"type": "number"},
                }
            ),
            "fragmentation": {
                "type": "number",
                "description": "Free GPUs no whole-GPU request of the node's "
                "common sizes can use, as a share of its free GPUs.",
            },
            "agentHeartbeatTime": str_field("The node agent's last report.", format="date-time"),
            "updatedTime": str_field(
                "When the controller last wrote this from the ledger.", format="date-time"
            ),
            "conditions": conditions(),
        }
    )


# --- GPUQueue (parsed by gpuledger.core.queues.gpu_queues, which names the same fields) -----------------

MAX_QUEUE_GPUS = 10_000_000
MAX_QUEUE_WEIGHT = 1_000_000
MAX_MIN_RUN_SECONDS = 31_536_000
QUEUE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"


def bool_field(default: bool, description: str) -> S:
    return {"type": "boolean", "default": default, "description": description}


# a quota entry lends no more than it has
_LENDING_RULE: S = {
    "x-kubernetes-validations": [
        {
            "rule": "!has(self.lendingLimit) || self.lendingLimit <= self.gpus",
            "fieldPath": ".lendingLimit",
            "message": "lendingLimit must not exceed gpus",
        }
    ]
}


def queue_quota() -> S:
    """One entry of `spec.quotas`: a product's guaranteed GPUs, and how far it borrows and lends."""
    return obj_field(
        {
            "product": str_field(
                "A GPU product as the nodes' nvidia.com/gpu.product label names it (any case), or `any` for "
                "every product the queue names no entry for. Default any.",
                minLength=1,
                maxLength=253,
                default="any",
            ),
            "gpus": int_field(0, MAX_QUEUE_GPUS, "GPUs of the product the queue is guaranteed."),
            "borrowingLimit": int_field(
                0,
                MAX_QUEUE_GPUS,
                "GPUs it may use above `gpus` when other queues do not use theirs. Absent: no limit.",
            ),
            "lendingLimit": int_field(
                0,
                MAX_QUEUE_GPUS,
                "GPUs of its unused quota other queues may borrow; the rest stays free for it. Absent: all.",
            ),
        },
        required=["gpus"],
        **_LENDING_RULE,
    )


def namespace_selector() -> S:
    """`spec.namespaceSelector`: a label selector over namespaces, as Kubernetes writes one."""
    expression = obj_field(
        {
            "key": str_field(minLength=1),
            "operator": str_field(enum=["In", "NotIn", "Exists", "DoesNotExist"]),
            "values": {"type": "array", "items": str_field()},
        },
        required=["key", "operator"],
    )
    return obj_field(
        {
            "matchLabels": {"type": "object", "additionalProperties": str_field()},
            "matchExpressions": {"type": "array", "items": expression},
        },
        "The namespaces whose GPU workloads belong to this queue; {} selects every namespace.",
        **{"x-kubernetes-map-type": "atomic"},
    )


def queue_preemption() -> S:
    """`spec.preemption`: what the queue's waiting workloads may take back, and when its running ones are
    safe."""
    return obj_field(
        {
            "reclaim": bool_field(
                True, "Take back GPUs it lent from queues above their quota. Default true."
            ),
            "withinQueue": bool_field(True, "Preempt lower-priority workloads of this queue. Default true."),
            "criticalAcrossQueues": bool_field(
                False, "Let its critical workloads preempt lower priority in other queues. Default false."
            ),
            "minRunSeconds": int_field(
                0,
                MAX_MIN_RUN_SECONDS,
                "A workload of this queue that has run for less is never preempted. Default 0.",
                default=0,
            ),
        },
        "What its waiting workloads may take back, and how long its running ones are safe.",
    )


def queue_spec() -> S:
    return obj_field(
        {
            "quotas": {
                "type": "array",
                "maxItems": 64,
                "description": "GPU quota per product; a GPU counts against its product's entry, else `any`.",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["product"],
                "items": queue_quota(),
            },
            "weight": {
                "type": "number",
                "minimum": 0,
                "exclusiveMinimum": True,
                "maximum": MAX_QUEUE_WEIGHT,
                "default": 1,
                "description": "Fair-share weight: among queues borrowing, the one furthest below its "
                "weighted share goes next. Default 1.",
            },
            "parent": str_field(
                "The organisation's GPUQueue this team's queue belongs to (two levels at most).",
                maxLength=253,
                pattern=QUEUE_NAME_PATTERN,
            ),
            "default": bool_field(
                False, "The queue of namespaces no queue's namespaceSelector selects (one at most)."
            ),
            "namespaceSelector": namespace_selector(),
            "preemption": queue_preemption(),
        },
        "A GPU queue: quota, borrowing and lending, fair-share weight, namespaces.",
    )


def queue_status() -> S:
    product = obj_field(
        {
            "product": str_field(),
            "quota": int_field(0),
            "used": {"type": "number"},
            "borrowed": {"type": "number"},
        }
    )
    return obj_field(
        {
            "quota": int_field(0, description="GPUs guaranteed (every quota entry)."),
            "used": {
                "type": "number",
                "description": "GPUs its running workloads hold (shares in fractions).",
            },
            "borrowed": {"type": "number", "description": "GPUs used above its quota."},
            "waiting": int_field(0, description="Pods waiting in it (each pod of a waiting gang counts)."),
            "share": {
                "type": "number",
                "description": "Its dominant share of what it borrows, over its weight (0 within quota).",
            },
            "products": {"type": "array", "items": product, "description": "The same per quota entry."},
            "conditions": conditions(),
            "updatedTime": str_field("When this was last written from the ledger.", format="date-time"),
        }
    )


def queue_columns() -> list[S]:
    return [
        {"name": "Parent", "type": "string", "jsonPath": ".spec.parent"},
        {"name": "Quota", "type": "integer", "jsonPath": ".status.quota"},
        {"name": "Used", "type": "number", "jsonPath": ".status.used"},
        {"name": "Borrowed", "type": "number", "jsonPath": ".status.borrowed"},
        {"name": "Waiting", "type": "integer", "jsonPath": ".status.waiting"},
        {"name": "Weight", "type": "number", "jsonPath": ".spec.weight", "priority": 1},
        {"name": "Share", "type": "number", "jsonPath": ".status.share", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
