"""The three CustomResourceDefinitions (GPUWorkload in both API groups, GPUNode) built from one description.

`python -m gpucontroller.crds DIR` writes manifests/crds/; tests/controller/test_crds.py checks the files are
what this builds, so a field is added here once and both groups get it. Pure data: no I/O but `main`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

AGENTAFLOW_GROUP, AGENTAFLOW_VERSION = "agentaflow.io", "v1"
WARP_GROUP, WARP_VERSION = "gpu.warp.dev", "v1alpha1"
PLURAL, NODE_PLURAL = "gpuworkloads", "gpunodes"

PHASES = ("Pending", "Queued", "Placing", "Running", "Succeeded", "Failed", "Retrying")
# Strategy names each group's users already write; gpucontroller.mapping turns them into registered names.
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


def _int(lo: int | None = None, hi: int | None = None, description: str = "", **extra: Any) -> S:
    out: S = {"type": "integer", "format": "int64"}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    if description:
        out["description"] = description
    return out | extra


def _str(description: str = "", **extra: Any) -> S:
    return {"type": "string", **({"description": description} if description else {}), **extra}


def _obj(properties: S, description: str = "", **extra: Any) -> S:
    return {
        "type": "object",
        **({"description": description} if description else {}),
        "properties": properties,
        **extra,
    }


def _opaque(description: str) -> S:
    """A Kubernetes object the API server already validates when the controller creates it."""
    return {"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": True}


def _foreign(description: str, scalar: bool = True) -> S:
    """A field of the other group's GPUWorkload, typed loosely and kept (not pruned) only so that a rule can
    refuse it by name: an undeclared field would be dropped without a word."""
    if scalar:
        return {"x-kubernetes-int-or-string": True, "description": description}
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "description": description}


def _refuse(field: str, other: str, hint: str) -> S:
    return {
        "rule": f"!has(self.{field})",
        "fieldPath": f".{field}",
        "reason": "FieldValueForbidden",
        "message": f"spec.{field} is a field of {other} GPUWorkloads, not of this group: {hint}",
    }


# --- fields both groups share (what a production queue needs and neither earlier tool had) ------------------


def _shared_spec() -> S:
    return {
        "parallelism": _int(
            1,
            MAX_PODS,
            "Pods run at once, each with the per-pod GPUs; more than 1 is a gang: "
            "all pods are placed or none (the Job's parallelism and completions). Default 1.",
            default=1,
        ),
        "topology": _obj(
            {
                "placementStrategy": _str(
                    "Topology strategy: pack into few leaves, spread over leaves, or weigh "
                    "both (topology.scheduler/placement-strategy).",
                    enum=list(TOPOLOGY_STRATEGIES),
                ),
                "preferredDomain": _str(
                    "A leaf or spine name to try first, or `leaf` / `spine`.",
                    maxLength=253,
                    pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$",
                ),
                "latencySensitive": {"type": "boolean", "description": "Hint for the topology strategies."},
                "networkBandwidth": _str(
                    "high | medium | low, or bits per second such as 100Gb, 400Gbps.", maxLength=32
                ),
            },
            "Gang and leaf rules for multi-pod workloads (the webhook's topology annotations).",
        ),
        "activeDeadlineSeconds": _int(
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
        "retryPolicy": _obj(
            {
                "maxRetries": _int(
                    0,
                    100,
                    "Attempts after the first (pod failed, node lost, transient denial). Default 3.",
                    default=3,
                ),
                "backoffSeconds": _int(
                    1, 86_400, "First delay; doubles each retry, with jitter. Default 10.", default=10
                ),
                "maxBackoffSeconds": _int(1, 86_400, "Cap on one delay. Default 300.", default=300),
            },
            "Retries with exponential backoff and jitter (docs/operator.md).",
        ),
    }


def _conditions() -> S:
    return {
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": _obj(
            {
                "type": _str(),
                "status": _str(enum=["True", "False", "Unknown"]),
                "reason": _str(),
                "message": _str(),
                "lastTransitionTime": _str(format="date-time"),
                "observedGeneration": _int(0),
            },
            required=["type", "status"],
        ),
    }


def _workload_status() -> S:
    return _obj(
        {
            "phase": _str(
                "Pending, Queued, Placing, Running, Succeeded, Failed or Retrying.", enum=list(PHASES)
            ),
            "assignedNodes": {
                "type": "array",
                "items": _str(),
                "description": "Nodes the pods were placed on.",
            },
            "devices": {
                "type": "array",
                "description": "Per pod: node and GPU indices the webhook placed it on.",
                "items": _obj(
                    {
                        "pod": _str(),
                        "node": _str(),
                        "indices": {"type": "array", "items": _int(0)},
                        "uuids": {"type": "array", "items": _str()},
                        "milli": _int(0),
                        "memoryMiB": _int(0),
                    }
                ),
            },
            "attempts": _int(0, description="Attempts started (Jobs created)."),
            "nextRetryTime": _str("When a Retrying workload re-enters the queue.", format="date-time"),
            "queuePosition": _int(1, description="1-based position in the queue while Queued."),
            "reason": _str("Why the workload is in its phase (e.g. Insufficient, Suspended, PodFailed)."),
            "message": _str("The blocking resource or the failure, in words."),
            "conditions": _conditions(),
            "jobName": _str("The Job of the current attempt."),
            "queuedTime": _str(
                "When the workload entered the queue (its age in the queue).", format="date-time"
            ),
            "startTime": _str(format="date-time"),
            "completionTime": _str(format="date-time"),
            "observedGeneration": _int(0),
        }
    )


def _workload_columns(gpus_path: str) -> list[S]:
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


_BOTH_STRATEGIES = {
    "rule": "!(has(self.schedulingStrategy) && has(self.topology) && has(self.topology.placementStrategy))",
    "fieldPath": ".topology.placementStrategy",
    "reason": "FieldValueForbidden",
    "message": "set spec.schedulingStrategy or spec.topology.placementStrategy, not both",
}


def _agentaflow_spec() -> S:
    props: S = {
        "priority": _int(-(2**31), 2**31 - 1, "Higher runs first. Default 0.", default=0),
        "gpuMemoryRequired": _int(
            0,
            MAX_GPU_MEMORY_MIB,
            "MiB each GPU must have free (with exclusiveAccess false: the memory share).",
        ),
        "schedulingStrategy": _str(
            "Device strategy (docs/annotations.md).", enum=list(AGENTAFLOW_STRATEGIES)
        ),
        "gpuRequirements": _obj(
            {
                "minGPUMemory": _int(0, MAX_GPU_MEMORY_MIB, "MiB each GPU must have."),
                "gpuCount": _int(
                    0, MAX_GPUS_PER_POD, "GPUs per pod (0 or 1 when sharing). Default 1.", default=1
                ),
                "exclusiveAccess": {
                    "type": "boolean",
                    "default": True,
                    "description": "False: share one GPU by memory (gpuMemoryRequired).",
                },
            },
            "What each pod needs.",
            **{
                "x-kubernetes-validations": [
                    {
                        "rule": "!has(self.exclusiveAccess) || self.exclusiveAccess || "
                        "!has(self.gpuCount) || "
                        "self.gpuCount <= 1",
                        "fieldPath": ".gpuCount",
                        "message": "spec.gpuRequirements.gpuCount must be 0 or 1 when exclusiveAccess is "
                        "false",
                    },
                    {
                        "rule": "(has(self.exclusiveAccess) && !self.exclusiveAccess) || "
                        "!has(self.gpuCount) || "
                        "self.gpuCount >= 1",
                        "fieldPath": ".gpuCount",
                        "message": "spec.gpuRequirements.gpuCount must be at least 1 for exclusive GPUs",
                    },
                ]
            },
        ),
        "podTemplate": _opaque("The pod template (a core/v1 PodTemplateSpec) each pod is made from."),
        **_shared_spec(),
        "modelName": _foreign("gpu.warp.dev/v1alpha1 only."),
        "gpuCount": _foreign("gpu.warp.dev/v1alpha1 only."),
        "image": _foreign("gpu.warp.dev/v1alpha1 only."),
        "jobTemplate": _foreign("gpu.warp.dev/v1alpha1 only.", scalar=False),
    }
    rules = [
        _refuse("modelName", "gpu.warp.dev/v1alpha1", "name the workload in metadata.name"),
        _refuse("gpuCount", "gpu.warp.dev/v1alpha1", "use spec.gpuRequirements.gpuCount"),
        _refuse("image", "gpu.warp.dev/v1alpha1", "give the image in spec.podTemplate"),
        _refuse("jobTemplate", "gpu.warp.dev/v1alpha1", "use spec.podTemplate"),
        _BOTH_STRATEGIES,
    ]
    return _obj(
        props, "An AgentaFlow GPUWorkload.", required=["podTemplate"], **{"x-kubernetes-validations": rules}
    )


def _warp_spec() -> S:
    props: S = {
        "modelName": _str("The model served or trained; labels the pods.", maxLength=63),
        "gpuCount": _int(1, MAX_GPUS_PER_POD, "GPUs per pod."),
        "priority": {
            "x-kubernetes-int-or-string": True,
            "description": "low (-100) | medium (0) | high (100) | critical (1000), or an integer. "
            "Default medium.",
            "x-kubernetes-validations": [
                {
                    "rule": "type(self) == int ? (self >= -2147483648 && self <= 2147483647) : "
                    "self.lowerAscii() in ['low', 'medium', 'high', 'critical']",
                    "message": "spec.priority must be low, medium, high, critical or an integer",
                    "messageExpression": "'spec.priority=' + string(self) + ' is not accepted: expected "
                    "low, medium, high, critical or an integer'",
                }
            ],
        },
        "schedulingStrategy": _str("Device strategy.", enum=list(WARP_STRATEGIES)),
        "image": _str("The container image (or give spec.jobTemplate).", minLength=1),
        "command": {"type": "array", "items": _str()},
        "args": {"type": "array", "items": _str()},
        "env": {
            "type": "array",
            "items": _obj({"name": _str(minLength=1), "value": _str()}, required=["name"]),
        },
        "jobTemplate": _opaque("A batch/v1 JobTemplateSpec (metadata, spec) instead of spec.image."),
        **_shared_spec(),
        "gpuMemoryRequired": _foreign("agentaflow.io/v1 only."),
        "gpuRequirements": _foreign("agentaflow.io/v1 only.", scalar=False),
        "podTemplate": _foreign("agentaflow.io/v1 only.", scalar=False),
    }
    rules = [
        _refuse(
            "gpuMemoryRequired", "agentaflow.io/v1", "this group has no memory field; use agentaflow.io/v1"
        ),
        _refuse("gpuRequirements", "agentaflow.io/v1", "use spec.gpuCount"),
        _refuse("podTemplate", "agentaflow.io/v1", "use spec.image or spec.jobTemplate"),
        {
            "rule": "has(self.image) != has(self.jobTemplate)",
            "fieldPath": ".image",
            "reason": "FieldValueRequired",
            "message": "set exactly one of spec.image or spec.jobTemplate",
        },
        _BOTH_STRATEGIES,
    ]
    return _obj(
        props, "A GPU_Orchestrator GPUWorkload.", required=["gpuCount"], **{"x-kubernetes-validations": rules}
    )


def _crd(
    group: str,
    version: str,
    plural: str,
    kind: str,
    scope: str,
    spec: S | None,
    status: S,
    columns: list[S],
    short_names: list[str],
    categories: list[str],
) -> S:
    props: S = {"apiVersion": _str(), "kind": _str(), "metadata": {"type": "object"}, "status": status}
    if spec is not None:
        props["spec"] = spec
    schema = _obj(props, required=["spec"] if spec is not None else [])
    if not schema["required"]:
        del schema["required"]
    names: S = {
        "plural": plural,
        "singular": kind.lower(),
        "kind": kind,
        "listKind": f"{kind}List",
        "categories": categories,
    }
    if short_names:
        names["shortNames"] = short_names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{group}",
            "labels": {"app.kubernetes.io/name": "gpuledger", "app.kubernetes.io/component": "controller"},
        },
        "spec": {
            "group": group,
            "scope": scope,
            "names": names,
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def _gpunode_status() -> S:
    holder = _obj(
        {
            "pod": _str("namespace/name"),
            "reservationId": _str(),
            "milli": _int(0),
            "memoryMiB": _int(0),
            "confirmed": {"type": "boolean"},
        }
    )
    device = _obj(
        {
            "index": _int(0),
            "uuid": _str(),
            "product": _str(),
            "memoryMiB": _int(0),
            "health": _str("Healthy or Unhealthy, as the node agent reported."),
            "utilization": {"type": "number", "description": "Percent busy, as the node agent reported."},
            "allocatedMilli": _int(0, 1000),
            "allocatedMemoryMiB": _int(0),
            "holders": {
                "type": "array",
                "items": holder,
                "description": "Pods holding the device or a share.",
            },
        }
    )
    return _obj(
        {
            "leaf": _str(),
            "spine": _str(),
            "schedulable": {"type": "boolean"},
            "devices": {"type": "array", "items": device},
            "allocation": _obj(
                {
                    "totalGPUs": _int(0),
                    "allocatedGPUs": _int(0),
                    "sharedGPUs": _int(0),
                    "freeGPUs": _int(0),
                    "allocatedMilli": _int(0),
                    "percent": {"type": "number"},
                }
            ),
            "fragmentation": {
                "type": "number",
                "description": "Free GPUs no whole-GPU request of the node's "
                "common sizes can use, as a share of its free GPUs.",
            },
            "agentHeartbeatTime": _str("The node agent's last report.", format="date-time"),
            "updatedTime": _str("When the controller last wrote this from the ledger.", format="date-time"),
            "conditions": _conditions(),
        }
    )


def gpunode_crd() -> S:
    columns = [
        {"name": "Leaf", "type": "string", "jsonPath": ".status.leaf"},
        {"name": "Spine", "type": "string", "jsonPath": ".status.spine"},
        {"name": "GPUs", "type": "integer", "jsonPath": ".status.allocation.totalGPUs"},
        {"name": "Allocated", "type": "integer", "jsonPath": ".status.allocation.allocatedGPUs"},
        {"name": "Free", "type": "integer", "jsonPath": ".status.allocation.freeGPUs"},
        {"name": "Fragmentation", "type": "number", "jsonPath": ".status.fragmentation"},
        {"name": "Updated", "type": "date", "jsonPath": ".status.updatedTime"},
    ]
    return _crd(
        AGENTAFLOW_GROUP,
        "v1",
        NODE_PLURAL,
        "GPUNode",
        "Cluster",
        None,
        _gpunode_status(),
        columns,
        [],
        ["gpuledger"],
    )


def agentaflow_workload_crd() -> S:
    return _crd(
        AGENTAFLOW_GROUP,
        AGENTAFLOW_VERSION,
        PLURAL,
        "GPUWorkload",
        "Namespaced",
        _agentaflow_spec(),
        _workload_status(),
        _workload_columns(".spec.gpuRequirements.gpuCount"),
        ["gw"],
        ["gpuledger"],
    )


def warp_workload_crd() -> S:
    return _crd(
        WARP_GROUP,
        WARP_VERSION,
        PLURAL,
        "GPUWorkload",
        "Namespaced",
        _warp_spec(),
        _workload_status(),
        _workload_columns(".spec.gpuCount"),
        [],
        ["gpuledger"],
    )


# file name -> CRD; manifests/crds/kustomization.yaml lists the same files
CRD_FILES: dict[str, Any] = {
    "gpuworkloads.agentaflow.io.yaml": agentaflow_workload_crd,
    "gpuworkloads.gpu.warp.dev.yaml": warp_workload_crd,
    "gpunodes.agentaflow.io.yaml": gpunode_crd,
}
HEADER = "# Generated by `python -m gpucontroller.crds manifests/crds`; edit gpucontroller/crds.py instead.\n"


def render(name: str) -> str:
    return HEADER + yaml.safe_dump(CRD_FILES[name](), sort_keys=False, width=120)


def kustomization() -> str:
    return HEADER + yaml.safe_dump(
        {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": list(CRD_FILES),
        },
        sort_keys=False,
    )


def main(argv: list[str] | None = None) -> int:
    out = Path((argv if argv is not None else sys.argv[1:] or ["manifests/crds"])[0])
    out.mkdir(parents=True, exist_ok=True)
    for name in CRD_FILES:
        (out / name).write_text(render(name))
    (out / "kustomization.yaml").write_text(kustomization())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
