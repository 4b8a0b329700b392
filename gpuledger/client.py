"""The Python helper: create GPU Jobs and GPUWorkloads, wait for them, read where a pod was placed.

`from gpuledger.client import create_gpu_job` is the worker-pool tool's `create_gpu_job`, on gpuledger: the
Job lands in a namespace opted in to admission, so the webhook places its pods like any other's. Only creates
objects and reads them back through the API; time (clock, sleep) is an argument of `wait`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuledger.cli.kube import GPUWORKLOAD_VERSIONS, Kube, KubeError
from gpuledger.names import ADMISSION_ENABLED, ADMISSION_LABEL, AGENTAFLOW_API_VERSION, GPU_RESOURCE
from gpuledger.views.placement import PodPlacement, placement_of_pod

DEFAULT_WORKLOAD_VERSION = AGENTAFLOW_API_VERSION
TERMINAL = ("Succeeded", "Failed")

__all__ = [
    "NamespaceNotOptedIn",
    "PodPlacement",
    "WorkloadFailed",
    "create_gpu_job",
    "gpu_workload",
    "job_phase",
    "phase_of",
    "placement_of",
    "submit_workload",
    "wait",
]


class NamespaceNotOptedIn(ValueError):
    """The namespace lacks gpuledger.io/admission=enabled: its pods would get no GPU placement."""


class WorkloadFailed(RuntimeError):
    """`wait` saw the object reach Failed while waiting for another phase."""


def _kube(kube: Kube | Any | None) -> Kube:
    """A Kube from a Kube, a kubernetes ApiClient, or the current kubeconfig (None)."""
    if kube is None:
        return Kube.connect()
    if isinstance(kube, Kube):
        return kube
    return Kube(kube)


def _require_opted_in(kube: Kube, namespace: str) -> None:
    opted = kube.namespace_opted_in(namespace)
    if opted is None:
        raise NamespaceNotOptedIn(f"namespace {namespace} does not exist")
    if not opted:
        raise NamespaceNotOptedIn(
            f"namespace {namespace} is not opted in to gpuledger admission (label "
            f"{ADMISSION_LABEL}={ADMISSION_ENABLED} missing): its pods would get no GPU "
            "placement"
        )


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} is not accepted: expected an integer >= 1")
    return value


def create_gpu_job(
    name: str,
    image: str,
    gpus: int = 1,
    *,
    command: Sequence[str] | None = None,
    args: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] | None = None,
    namespace: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    requests: Mapping[str, str] | None = None,
    parallelism: int = 1,
    backoff_limit: int = 0,
    ttl_seconds_after_finished: int | None = None,
    kube: Kube | Any | None = None,
) -> str:
    """Create a Job whose pods each ask for `gpus` GPUs; return its name.

    `annotations` go on the pod template (e.g. agentaflow.gpu/scheduling-strategy); `requests` adds cpu/memory
    requests; `parallelism` > 1 makes a gang placed all-or-nothing. The namespace (default: the kubeconfig
    context's) must be opted in to admission, else NamespaceNotOptedIn; an API refusal raises KubeError.
    """
    _positive_int(gpus, "gpus")
    _positive_int(parallelism, "parallelism")
    if not image:
        raise ValueError("image='' is not accepted: expected a container image")
    k = _kube(kube)
    namespace = namespace or k.namespace
    _require_opted_in(k, namespace)
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
    }
    if requests:
        container["resources"]["requests"] = dict(requests)
    if command:
        container["command"] = list(command)
    if args:
        container["args"] = list(args)
    if env:
        container["env"] = [{"name": k_, "value": str(v)} for k_, v in env.items()]
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tolerations]
    template_meta: dict[str, Any] = {"labels": dict(labels or {})}
    if annotations:
        template_meta["annotations"] = dict(annotations)
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "backoffLimit": backoff_limit,
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }
    if ttl_seconds_after_finished is not None:
        job["spec"]["ttlSecondsAfterFinished"] = ttl_seconds_after_finished
    return str(k.create(job, namespace)["metadata"]["name"])


def gpu_workload(
    name: str,
    image: str,
    gpus: int = 1,
    *,
    priority: int | str = 0,
    strategy: str | None = None,
    command: Sequence[str] | None = None,
    namespace: str | None = None,
    api_version: str = DEFAULT_WORKLOAD_VERSION,
    max_retries: int | None = None,
    backoff_seconds: int | None = None,
) -> dict[str, Any]:
    """A GPUWorkload manifest in either group (agentaflow.io/v1 with a podTemplate, gpu.warp.dev/v1alpha1 with
    gpuCount and an image), for `submit_workload`."""
    _positive_int(gpus, "gpus")
    if api_version not in GPUWORKLOAD_VERSIONS:
        raise ValueError(
            f"api_version={api_version!r} is not accepted: expected one of {', '.join(GPUWORKLOAD_VERSIONS)}"
        )
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    spec: dict[str, Any] = {"priority": priority}
    if strategy:
        spec["schedulingStrategy"] = strategy
    if api_version == AGENTAFLOW_API_VERSION:
        container: dict[str, Any] = {
            "name": "worker",
            "image": image,
            "resources": {"limits": {GPU_RESOURCE: gpus}},
        }
        if command:
            container["command"] = list(command)
        spec["gpuRequirements"] = {"gpuCount": gpus}
        spec["podTemplate"] = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    else:
        spec.update(modelName=name, gpuCount=gpus, image=image)
        if max_retries is not None or backoff_seconds is not None:
            spec["retryPolicy"] = {
                k: v
                for k, v in (("maxRetries", max_retries), ("backoffSeconds", backoff_seconds))
                if v is not None
            }
    return {"apiVersion": api_version, "kind": "GPUWorkload", "metadata": meta, "spec": spec}


def submit_workload(
    workload: Mapping[str, Any] | str | Path, namespace: str | None = None, kube: Kube | Any | None = None
) -> str:
    """Create a GPUWorkload from a manifest (a dict, or a YAML file's path); return its name."""
    if isinstance(workload, (str, Path)):
        workload = yaml.safe_load(Path(workload).read_text())
    if (
        not isinstance(workload, Mapping)
        or workload.get("kind") != "GPUWorkload"
        or workload.get("apiVersion") not in GPUWORKLOAD_VERSIONS
    ):
        raise ValueError(
            f"kind/apiVersion not accepted: expected a GPUWorkload of {', '.join(GPUWORKLOAD_VERSIONS)}"
        )
    k = _kube(kube)
    obj = dict(workload)
    namespace = namespace or (obj.get("metadata") or {}).get("namespace") or k.namespace
    obj["metadata"] = {**(obj.get("metadata") or {}), "namespace": namespace}
    return str(k.create(obj, namespace)["metadata"]["name"])


def job_phase(job: Mapping[str, Any]) -> str:
    """A Job's phase in the GPUWorkload's words: Succeeded/Failed by its conditions, Running while it has
    active pods (created and placed, whether or not a kubelet started them), else Pending."""
    status = job.get("status") or {}
    for c in status.get("conditions") or ():
        if c.get("status") == "True" and c.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Succeeded"
        if c.get("status") == "True" and c.get("type") in ("Failed", "FailureTarget"):
            return "Failed"
    return "Running" if status.get("active") else "Pending"


def phase_of(obj: Mapping[str, Any]) -> str:
    if obj.get("kind") == "Job":
        return job_phase(obj)
    return str((obj.get("status") or {}).get("phase") or "Pending")


def _target(ref: str) -> tuple[str, str, str]:
    """(apiVersion, kind, name) of `job/NAME`, `pod/NAME`, `gpuworkload/NAME` (agentaflow.io) or
    `gpuworkload.gpu.warp.dev/NAME`."""
    kind, _, name = ref.partition("/")
    if not name:
        raise ValueError(f"{ref!r} is not accepted: expected job/NAME, pod/NAME or gpuworkload[.GROUP]/NAME")
    kind, _, group = kind.lower().partition(".")
    if kind == "job":
        return "batch/v1", "Job", name
    if kind == "pod":
        return "v1", "Pod", name
    if kind == "gpuworkload":
        version = next((v for v in GPUWORKLOAD_VERSIONS if not group or v.startswith(group + "/")), None)
        if version is None:
            raise ValueError(
                f"{ref!r}: group {group!r} is not accepted: expected agentaflow.io or gpu.warp.dev"
            )
        return version, "GPUWorkload", name
    raise ValueError(f"{ref!r}: kind {kind!r} is not accepted: expected job, pod or gpuworkload")


def wait(
    ref: str,
    phases: Sequence[str] = ("Running", "Succeeded"),
    *,
    namespace: str | None = None,
    timeout_s: float = 300.0,
    poll_s: float = 1.0,
    kube: Kube | Any | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Poll `ref` (e.g. `job/train`) until its phase is one of `phases`; return the object.

    Raises WorkloadFailed when it fails while Failed is not awaited, TimeoutError (naming the last phase)
    after `timeout_s` by `clock`, KubeError if it does not exist."""
    k = _kube(kube)
    api_version, kind, name = _target(ref)
    deadline = clock() + timeout_s
    while True:
        obj = k.read(api_version, kind, name, namespace or k.namespace)
        if obj is None:
            raise KubeError(404, f"{ref} not found in namespace {namespace or k.namespace}")
        obj.setdefault("kind", kind)
        phase = phase_of(obj)
        if phase in phases:
            return obj
        if phase == "Failed":
            reason = (obj.get("status") or {}).get("reason") or (obj.get("status") or {}).get("message") or ""
            raise WorkloadFailed(f"{ref} failed{': ' + str(reason) if reason else ''}")
        if clock() >= deadline:
            raise TimeoutError(f"{ref} still {phase} after {timeout_s:g}s (waiting for {', '.join(phases)})")
        sleep(poll_s)


def placement_of(pod: Mapping[str, Any] | Any) -> PodPlacement | None:
    """Where admission placed a pod (node, devices, shares, UUIDs), from its gpuledger.io/placement
    annotation; None for a pod gpuledger did not place. Takes the API's dict or a kubernetes V1Pod."""
    if not isinstance(pod, Mapping):
        annotations = getattr(getattr(pod, "metadata", None), "annotations", None) or {}
        pod = {"metadata": {"annotations": annotations}}
    return placement_of_pod(dict(pod))
