"""What a pod's spec and its owner's spec ask for, field by field: GPU limits, CPU and memory, node affinity,
tolerations, and the size of the group a Job, StatefulSet or Kubeflow job makes. Pure; a bad field is an
`AnnotationError` naming it. It never reads an annotation (annotation_values) nor combines them (request).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuledger.core.model import SelectorRequirement, Toleration
from gpuledger.core.pods import objects as kube
from gpuledger.core.pods.annotation_values import (
    MAX_GPUS_PER_POD,
    MAX_GROUP_SIZE,
    AnnotationError,
    as_list,
    mapping,
    parse_quantity,
    read_int,
)
from gpuledger.names import GPU_RESOURCE, HOSTNAME_LABEL


@dataclass(frozen=True)
class PodRequestConfig:
    gpu_resource: str = GPU_RESOURCE


# the owners whose pods may form a gang, and the spec field holding each Kubeflow job's replica specs
GROUP_OWNER_KINDS = ("Job", "StatefulSet", "PyTorchJob", "MPIJob", "TFJob", "PodGroup")
KUBEFLOW_REPLICA_SPECS = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
}


def group_size(owner: Mapping, resource: str = PodRequestConfig.gpu_resource) -> int:
    spec = mapping(owner.get("spec"))
    kind = owner.get("kind")
    if kind == "Job":
        parallelism = spec.get("parallelism", 1)
        completions = spec.get("completions")
        size = read_int("Job spec.parallelism", parallelism, 0, MAX_GROUP_SIZE)
        if completions is not None:
            size = min(size, read_int("Job spec.completions", completions, 0, MAX_GROUP_SIZE))
        return size
    if kind == "StatefulSet":
        return read_int("StatefulSet spec.replicas", spec.get("replicas", 1), 0, MAX_GROUP_SIZE)
    if kind in KUBEFLOW_REPLICA_SPECS:
        return kubeflow_size(kind, spec, resource)
    if kind == "PodGroup":  # scheduling.k8s.io: a gang policy's minCount, as kube-scheduler counts the gang
        gang = mapping(mapping(spec.get("schedulingPolicy")).get("gang"))
        if not gang:
            return 1
        return read_int(
            "PodGroup spec.schedulingPolicy.gang.minCount", gang.get("minCount"), 1, MAX_GROUP_SIZE
        )
    return 1


def kubeflow_size(kind: str, spec: Mapping, resource: str) -> int:
    """The pods of a Kubeflow job that take GPUs: the sum of its replica specs' `replicas` (1 when unset),
    counting only the specs whose pod template asks for GPUs when any does (an MPIJob's launcher does not)."""
    field = KUBEFLOW_REPLICA_SPECS[kind]
    specs = mapping(spec.get(field))
    sizes: list[tuple[int, bool]] = []
    for role, replica_spec in sorted(specs.items()):
        replica_spec = mapping(replica_spec)
        replicas = read_int(
            f"{kind} spec.{field}.{role}.replicas", replica_spec.get("replicas", 1), 0, MAX_GROUP_SIZE
        )
        template = mapping(replica_spec.get("template"))
        try:
            gpus, _ = container_gpus(template, resource)
        except AnnotationError:
            gpus = 0
        sizes.append((replicas, gpus > 0))
    if any(has_gpus for _, has_gpus in sizes):
        sizes = [(n, True) for n, has_gpus in sizes if has_gpus]
    return min(sum(n for n, _ in sizes), MAX_GROUP_SIZE)


def container_gpus(pod: Mapping, resource: str) -> tuple[int, list[str]]:
    """Whole GPUs the containers ask for through limits (containers add up, init containers overlap)."""
    spec = mapping(pod.get("spec"))
    total, init_max, gpu_containers = 0, 0, []
    for kind in ("containers", "initContainers"):
        if spec.get(kind) is not None and not isinstance(spec.get(kind), list):
            raise AnnotationError(f"spec.{kind}", spec.get(kind), "a list of containers")
        for i, container in enumerate(as_list(spec.get(kind))):
            resources = mapping(mapping(container).get("resources"))
            limits, requests = mapping(resources.get("limits")), mapping(resources.get("requests"))
            raw = limits.get(resource, requests.get(resource))
            if raw is None:
                continue
            field = f"spec.{kind}[{i}].resources.limits[{resource}]"
            value = parse_quantity(field, raw)
            if value != int(value) or value > MAX_GPUS_PER_POD:
                raise AnnotationError(field, raw, f"a whole number of GPUs from 0 to {MAX_GPUS_PER_POD}")
            if kind == "containers":
                total += int(value)
            else:
                init_max = max(init_max, int(value))
            if value > 0:
                gpu_containers.append(str(mapping(container).get("name", "")))
    return max(total, init_max), gpu_containers


def container_resources(pod: Mapping) -> tuple[int, int]:
    """(cpu milli, memory MiB) the pod requests, counted exactly as the ledger counts the stored pod
    (`kube.pod_requests`: requests default to limits, restartable init sidecars, init peaks, pod-level
    resources, overhead), so a reservation and a rebuild from the pod agree. Every quantity is checked first:
    a bad one is a denial naming its field, not a silently ignored value."""
    spec = mapping(pod.get("spec"))
    for kind in ("containers", "initContainers"):
        if spec.get(kind) is not None and not isinstance(spec.get(kind), list):
            raise AnnotationError(f"spec.{kind}", spec.get(kind), "a list of containers")
        for i, container in enumerate(as_list(spec.get(kind))):
            if not isinstance(container, dict):
                raise AnnotationError(f"spec.{kind}[{i}]", container, "a container object")
            resources = mapping(container.get("resources"))
            for section in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    raw = mapping(resources.get(section)).get(resource)
                    if raw is not None:
                        parse_quantity(f"spec.{kind}[{i}].resources.{section}.{resource}", raw)
    for resource in ("cpu", "memory"):
        raw = mapping(spec.get("overhead")).get(resource)
        if raw is not None:
            parse_quantity(f"spec.overhead.{resource}", raw)
        for section in ("requests", "limits"):  # pod-level resources
            raw = mapping(mapping(spec.get("resources")).get(section)).get(resource)
            if raw is not None:
                parse_quantity(f"spec.resources.{section}.{resource}", raw)

    def plain(value: Any) -> bool:  # what pod_requests reads as it stands: a map, or nothing
        return type(value) is dict or not value

    def all_plain() -> bool:
        for kind in ("containers", "initContainers"):
            for container in spec.get(kind) or ():
                resources = container.get("resources")
                if not plain(resources) or (
                    resources and not (plain(resources.get("requests")) and plain(resources.get("limits")))
                ):
                    return False
        level = spec.get("resources")
        if not plain(level) or (level and not (plain(level.get("requests")) and plain(level.get("limits")))):
            return False
        return plain(spec.get("overhead"))

    if all_plain():  # the common pod: counted where it lies, without the copy below
        problems: list[str] = []
        counted = kube.pod_requests(
            {"metadata": {"name": str(mapping(pod.get("metadata")).get("name", ""))}, "spec": spec}, problems
        )
        return _counted(counted, problems)

    def sane(container: dict) -> dict:  # only the fields pod_requests reads, each of the type it expects
        resources = mapping(container.get("resources"))
        return {
            "name": str(container.get("name", "")),
            "restartPolicy": container.get("restartPolicy"),
            "resources": {
                "requests": mapping(resources.get("requests")),
                "limits": mapping(resources.get("limits")),
            },
        }

    shaped: dict[str, Any] = {
        kind: [sane(c) for c in as_list(spec.get(kind))] for kind in ("containers", "initContainers")
    }
    shaped["overhead"] = mapping(spec.get("overhead"))
    level = mapping(spec.get("resources"))
    shaped["resources"] = {"requests": mapping(level.get("requests")), "limits": mapping(level.get("limits"))}
    problems = []
    counted = kube.pod_requests(
        {"metadata": {"name": str(mapping(pod.get("metadata")).get("name", ""))}, "spec": shaped}, problems
    )
    return _counted(counted, problems)


def _counted(counted: kube.PodRequests, problems: list[str]) -> tuple[int, int]:
    if problems:  # a quantity this parser takes but the ledger's does not: refuse rather than disagree
        raise AnnotationError(
            "spec.containers[*].resources", problems[0], 'quantities such as "500m", "2", "512Mi"'
        )
    return counted.cpu_milli, counted.memory_mib


def affinity_terms(pod: Mapping) -> tuple[tuple[SelectorRequirement, ...], ...]:
    node_affinity = mapping(mapping(mapping(pod.get("spec")).get("affinity")).get("nodeAffinity"))
    required = mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = []
    for term in as_list(required.get("nodeSelectorTerms")):
        term = mapping(term)
        reqs = []
        for expr in as_list(term.get("matchExpressions")):
            expr = mapping(expr)
            reqs.append(
                SelectorRequirement(
                    str(expr.get("key", "")),
                    str(expr.get("operator", "")),
                    tuple(str(v) for v in as_list(expr.get("values"))),
                )
            )
        for expr in as_list(term.get("matchFields")):
            expr = mapping(expr)
            # the only field selector Kubernetes supports is metadata.name; nodes carry it as their hostname
            # label
            key = HOSTNAME_LABEL if expr.get("key") == "metadata.name" else str(expr.get("key", ""))
            reqs.append(
                SelectorRequirement(
                    key, str(expr.get("operator", "")), tuple(str(v) for v in as_list(expr.get("values")))
                )
            )
        terms.append(tuple(reqs))
    return tuple(terms)


def tolerations(pod: Mapping) -> tuple[Toleration, ...]:
    out = []
    for t in as_list(mapping(pod.get("spec")).get("tolerations")):
        t = mapping(t)
        out.append(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
        )
    return tuple(out)
