"""The CustomResourceDefinitions (GPUWorkload in both API groups, GPUNode, GPUQueue) from one description.

`python -m gpuledger.controller.crds DIR` writes manifests/crds/; tests/controller/test_crds.py checks the
files are
what this builds, so a field is added here once and both groups get it. Pure data: no I/O but `main`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from gpuledger.controller.crd_fields import (
    AGENTAFLOW_STRATEGIES,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS_PER_POD,
    WARP_STRATEGIES,
    S,
    foreign,
    gpunode_status,
    int_field,
    obj_field,
    opaque,
    queue_columns,
    queue_spec,
    queue_status,
    refuse,
    shared_spec,
    str_field,
    workload_columns,
    workload_status,
)
from gpuledger.controller.crd_fields import PHASES as PHASES  # re-exported: the vocabulary the CRDs publish
from gpuledger.controller.crd_fields import PRIORITY_WORDS as PRIORITY_WORDS
from gpuledger.controller.crd_fields import TOPOLOGY_STRATEGIES as TOPOLOGY_STRATEGIES
from gpuledger.names import (
    AGENTAFLOW_API_VERSION,
    AGENTAFLOW_GROUP,
    AGENTAFLOW_VERSION,
    GPUNODE_PLURAL,
    GPUQUEUE_KIND,
    GPUQUEUE_PLURAL,
    GPUWORKLOAD_PLURAL,
    QUEUE_GROUP,
    QUEUE_VERSION,
    WARP_API_VERSION,
    WARP_GROUP,
    WARP_VERSION,
)

_BOTH_STRATEGIES = {
    "rule": "!(has(self.schedulingStrategy) && has(self.topology) && has(self.topology.placementStrategy))",
    "fieldPath": ".topology.placementStrategy",
    "reason": "FieldValueForbidden",
    "message": "set spec.schedulingStrategy or spec.topology.placementStrategy, not both",
}


def _agentaflow_spec() -> S:
    props: S = {
        "priority": int_field(-(2**31), 2**31 - 1, "Higher runs first. Default 0.", default=0),
        "gpuMemoryRequired": int_field(
            0,
            MAX_GPU_MEMORY_MIB,
            "MiB each GPU must have free (with exclusiveAccess false: the memory share).",
        ),
        "schedulingStrategy": str_field(
            "Device strategy (docs/annotations.md).", enum=list(AGENTAFLOW_STRATEGIES)
        ),
        "gpuRequirements": obj_field(
            {
                "minGPUMemory": int_field(0, MAX_GPU_MEMORY_MIB, "MiB each GPU must have."),
                "gpuCount": int_field(
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
        "podTemplate": opaque("The pod template (a core/v1 PodTemplateSpec) each pod is made from."),
        **shared_spec(),
        "modelName": foreign(f"{WARP_API_VERSION} only."),
        "gpuCount": foreign(f"{WARP_API_VERSION} only."),
        "image": foreign(f"{WARP_API_VERSION} only."),
        "jobTemplate": foreign(f"{WARP_API_VERSION} only.", scalar=False),
    }
    rules = [
        refuse("modelName", WARP_API_VERSION, "name the workload in metadata.name"),
        refuse("gpuCount", WARP_API_VERSION, "use spec.gpuRequirements.gpuCount"),
        refuse("image", WARP_API_VERSION, "give the image in spec.podTemplate"),
        refuse("jobTemplate", WARP_API_VERSION, "use spec.podTemplate"),
        _BOTH_STRATEGIES,
    ]
    return obj_field(
        props, "An AgentaFlow GPUWorkload.", required=["podTemplate"], **{"x-kubernetes-validations": rules}
    )


def _warp_spec() -> S:
    props: S = {
        "modelName": str_field("The model served or trained; labels the pods.", maxLength=63),
        "gpuCount": int_field(1, MAX_GPUS_PER_POD, "GPUs per pod."),
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
        "schedulingStrategy": str_field("Device strategy.", enum=list(WARP_STRATEGIES)),
        "image": str_field("The container image (or give spec.jobTemplate).", minLength=1),
        "command": {"type": "array", "items": str_field()},
        "args": {"type": "array", "items": str_field()},
        "env": {
            "type": "array",
            "items": obj_field({"name": str_field(minLength=1), "value": str_field()}, required=["name"]),
        },
        "jobTemplate": opaque("A batch/v1 JobTemplateSpec (metadata, spec) instead of spec.image."),
        **shared_spec(),
        "gpuMemoryRequired": foreign(f"{AGENTAFLOW_API_VERSION} only."),
        "gpuRequirements": foreign(f"{AGENTAFLOW_API_VERSION} only.", scalar=False),
        "podTemplate": foreign(f"{AGENTAFLOW_API_VERSION} only.", scalar=False),
    }
    rules = [
        refuse(
            "gpuMemoryRequired",
            AGENTAFLOW_API_VERSION,
            f"this group has no memory field; use {AGENTAFLOW_API_VERSION}",
        ),
        refuse("gpuRequirements", AGENTAFLOW_API_VERSION, "use spec.gpuCount"),
        refuse("podTemplate", AGENTAFLOW_API_VERSION, "use spec.image or spec.jobTemplate"),
        {
            "rule": "has(self.image) != has(self.jobTemplate)",
            "fieldPath": ".image",
            "reason": "FieldValueRequired",
            "message": "set exactly one of spec.image or spec.jobTemplate",
        },
        _BOTH_STRATEGIES,
    ]
    return obj_field(
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
    props: S = {
        "apiVersion": str_field(),
        "kind": str_field(),
        "metadata": {"type": "object"},
        "status": status,
    }
    if spec is not None:
        props["spec"] = spec
    schema = obj_field(props, required=["spec"] if spec is not None else [])
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
        AGENTAFLOW_VERSION,
        GPUNODE_PLURAL,
        "GPUNode",
        "Cluster",
        None,
        gpunode_status(),
        columns,
        [],
        ["gpuledger"],
    )


def agentaflow_workload_crd() -> S:
    return _crd(
        AGENTAFLOW_GROUP,
        AGENTAFLOW_VERSION,
        GPUWORKLOAD_PLURAL,
        "GPUWorkload",
        "Namespaced",
        _agentaflow_spec(),
        workload_status(),
        workload_columns(".spec.gpuRequirements.gpuCount"),
        ["gw"],
        ["gpuledger"],
    )


def warp_workload_crd() -> S:
    return _crd(
        WARP_GROUP,
        WARP_VERSION,
        GPUWORKLOAD_PLURAL,
        "GPUWorkload",
        "Namespaced",
        _warp_spec(),
        workload_status(),
        workload_columns(".spec.gpuCount"),
        [],
        ["gpuledger"],
    )


def gpuqueue_crd() -> S:
    """Cluster-scoped: a queue spans namespaces (its namespaceSelector picks them)."""
    return _crd(
        QUEUE_GROUP,
        QUEUE_VERSION,
        GPUQUEUE_PLURAL,
        GPUQUEUE_KIND,
        "Cluster",
        queue_spec(),
        queue_status(),
        queue_columns(),
        ["gq"],
        ["gpuledger"],
    )


# file name -> CRD; manifests/crds/kustomization.yaml lists the same files
CRD_FILES: dict[str, Any] = {
    f"{GPUWORKLOAD_PLURAL}.{AGENTAFLOW_GROUP}.yaml": agentaflow_workload_crd,
    f"{GPUWORKLOAD_PLURAL}.{WARP_GROUP}.yaml": warp_workload_crd,
    f"{GPUNODE_PLURAL}.{AGENTAFLOW_GROUP}.yaml": gpunode_crd,
    f"{GPUQUEUE_PLURAL}.{QUEUE_GROUP}.yaml": gpuqueue_crd,
}
HEADER = (
    "# Generated by `python -m gpuledger.controller.crds manifests/crds`; "
    "edit gpuledger/controller/crds.py, crd_fields.py.\n"
)


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
