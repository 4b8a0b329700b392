"""Both API groups' GPUWorkloads -> one internal `WorkloadRequest`, and that request -> the Job that runs it.

Pure: dicts in, frozen values and dicts out. The Job carries the webhook's own annotations on its pod
template, so its pods are placed exactly as any user's pods would be; this module never talks to the API.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

# the webhook's annotations (docs/annotations.md) are written on the pod template; the WORKLOAD_* labels go on
# Jobs and their pods
from gpuledger.names import (
    AGENTAFLOW_API_VERSION,
    AGENTAFLOW_GROUP,
    EXCLUSIVE_ACCESS,
    GPU_COUNT,
    GPU_MEMORY,
    JOB_COMPLETION_INDEX,
    LATENCY_SENSITIVE,
    NETWORK_BANDWIDTH,
    PLACEMENT_STRATEGY,
    PREFERRED_DOMAIN,
    PRIORITY,
    SCHEDULING_STRATEGY,
    WARP_API_VERSION,
    WARP_GROUP,
    WHEN_FULL,
    WHEN_FULL_REFUSE,
    WHEN_FULL_WAIT,
    WORKLOAD_ATTEMPT_ANNOTATION,
    WORKLOAD_GROUP_LABEL,
    WORKLOAD_NAME_LABEL,
    WORKLOAD_UID_LABEL,
)

PRIORITY_WORDS = {"low": -100, "medium": 0, "high": 100, "critical": 1000}
TOPOLOGY_STRATEGIES = ("consolidated", "distributed", "balanced")
# each group's strategy words -> the ledger's registered names
# (gpuledger.service.ledger_service.strategy_names())
STRATEGIES = {
    AGENTAFLOW_GROUP: {
        "least_utilized": "least_utilized",
        "best_fit": "best_fit",
        "priority": "priority",
        "round_robin": "round_robin",
        "random": "random",
        "cost_optimized": "cost_optimized",
        "fgd": "fgd",
        "fgd_host": "fgd_host",
    },
    WARP_GROUP: {
        "leastLoaded": "least_utilized",
        "leastUtilized": "least_utilized",
        "bestFit": "best_fit",
        "costOptimized": "cost_optimized",
        "roundRobin": "round_robin",
        "random": "random",
        "priority": "priority",
        "fgd": "fgd",
        "fgdHost": "fgd_host",
    },
}
# the other group's fields: refused here too, for an API server that runs without the CRDs' CEL rules
FOREIGN_FIELDS = {
    AGENTAFLOW_GROUP: ("modelName", "gpuCount", "image", "jobTemplate"),
    WARP_GROUP: ("gpuMemoryRequired", "gpuRequirements", "podTemplate"),
}


class SpecError(ValueError):
    """A GPUWorkload the controller cannot run; the message names the field, the value and what is allowed."""

    def __init__(self, field_: str, value: Any, accepted: str):
        self.field = field_
        super().__init__(f"spec.{field_}={value!r} is not accepted: expected {accepted}")


class WhenFullError(SpecError):
    """The GPUWorkload's topology.scheduler/when-full annotation is neither word."""

    def __init__(self, value: Any):
        self.field = f"metadata.annotations[{WHEN_FULL}]"
        ValueError.__init__(
            self,
            f"annotation {WHEN_FULL}={value!r} is not accepted: expected {WHEN_FULL_WAIT!r} (its pods wait "
            f"in the ledger's line when the GPUs are taken) or {WHEN_FULL_REFUSE!r} (the controller holds it "
            "in its own queue until the ledger can place it whole)",
        )


def when_full(obj: Mapping[str, Any], default: str) -> str:
    """What a workload does when the GPUs are taken: its annotation topology.scheduler/when-full, else the
    controller's default. `wait`: its Job is created at once and its pods wait in the ledger's one line with
    every other pod; `refuse`: it waits in the controller's queue and its Job is created once a dry run says
    the ledger can place it whole."""
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(WHEN_FULL)
    if value is None:
        return default
    word = str(value).strip().lower()
    if word not in (WHEN_FULL_WAIT, WHEN_FULL_REFUSE):
        raise WhenFullError(value)
    return word


@dataclass(frozen=True)
class RetryPolicy:
    """Defaults are documented in docs/operator.md (3 retries, 10 s doubling, 300 s cap)."""

    max_retries: int = 3
    backoff_s: float = 10.0
    max_backoff_s: float = 300.0


@dataclass(frozen=True, order=True)
class WorkloadKey:
    group: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.group})"


@dataclass(frozen=True)
class WorkloadRequest:
    """What either group's GPUWorkload asks for, in one shape; `gpus` is per pod."""

    key: WorkloadKey
    version: str
    uid: str
    generation: int
    created: float  # creationTimestamp, epoch seconds: the queue's age
    priority: int
    gpus: int
    parallelism: int = 1
    exclusive: bool = True
    memory_mib: int | None = None
    strategy: str | None = None  # a registered device strategy
    topology_strategy: str | None = None
    preferred_domain: str | None = None
    latency_sensitive: bool | None = None
    network_bandwidth: str | None = None
    retry: RetryPolicy = RetryPolicy()
    deadline_s: int | None = None
    suspend: bool = False
    model_name: str | None = None
    template: Mapping[str, Any] = field(default_factory=dict, compare=False)  # a PodTemplateSpec
    job_spec: Mapping[str, Any] = field(default_factory=dict, compare=False)  # extra Job spec fields (warp)

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.parallelism

    @property
    def strategy_label(self) -> str:
        return self.strategy or self.topology_strategy or "default"


def parse_time(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int(spec: Mapping, name: str, lo: int, hi: int, default: int | None = None) -> int | None:
    value = _get(spec, name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SpecError(name, value, f"an integer from {lo} to {hi}")
    return value


def _get(spec: Mapping, dotted: str) -> Any:
    cur: Any = spec
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _priority(group: str, raw: Any) -> int:
    if raw is None:
        return 0
    if isinstance(raw, int) and not isinstance(raw, bool) and -(2**31) <= raw < 2**31:
        return raw
    if group == WARP_GROUP and isinstance(raw, str):
        if raw.lower() in PRIORITY_WORDS:
            return PRIORITY_WORDS[raw.lower()]
        if raw.lstrip("+-").isdigit() and raw.isascii():
            return _priority(group, int(raw))
    words = "low, medium, high, critical or an integer" if group == WARP_GROUP else "an integer"
    raise SpecError("priority", raw, words)


def _strategy(group: str, spec: Mapping) -> tuple[str | None, str | None]:
    raw = spec.get("schedulingStrategy")
    topo = _get(spec, "topology.placementStrategy")
    if topo is not None and topo not in TOPOLOGY_STRATEGIES:
        raise SpecError("topology.placementStrategy", topo, " | ".join(TOPOLOGY_STRATEGIES))
    if raw is None:
        return None, topo
    if topo is not None:
        raise SpecError(
            "schedulingStrategy", raw, "no schedulingStrategy when topology.placementStrategy is set"
        )
    if raw in TOPOLOGY_STRATEGIES:
        return None, raw
    if raw in STRATEGIES[group]:
        return STRATEGIES[group][raw], None
    raise SpecError("schedulingStrategy", raw, " | ".join([*STRATEGIES[group], *TOPOLOGY_STRATEGIES]))


def _retry(spec: Mapping) -> RetryPolicy:
    d = RetryPolicy()
    base = _int(spec, "retryPolicy.backoffSeconds", 1, 86_400, int(d.backoff_s))
    cap = _int(spec, "retryPolicy.maxBackoffSeconds", 1, 86_400, int(d.max_backoff_s))
    return RetryPolicy(
        max_retries=_int(spec, "retryPolicy.maxRetries", 0, 100, d.max_retries) or 0,
        backoff_s=float(base or d.backoff_s),
        max_backoff_s=float(max(cap or 0, base or 0)),
    )


def _warp_template(spec: Mapping, gpus: int) -> tuple[dict, dict]:
    if spec.get("jobTemplate") is not None:
        job = spec["jobTemplate"]
        if not isinstance(job, Mapping) or not isinstance(_get(job, "spec.template"), Mapping):
            raise SpecError("jobTemplate", "...", "a JobTemplateSpec with spec.template")
        extra = {
            k: v
            for k, v in job["spec"].items()
            if k
            not in (
                "template",
                "parallelism",
                "completions",
                "completionMode",
                "backoffLimit",
                "activeDeadlineSeconds",
                "suspend",
                "selector",
                "manualSelector",
            )
        }
        return copy.deepcopy(dict(job["spec"]["template"])), copy.deepcopy(extra)
    image = spec.get("image")
    if not isinstance(image, str) or not image:
        raise SpecError("image", image, "a container image, or spec.jobTemplate")
    container: dict[str, Any] = {"name": "main", "image": image}
    for name in ("command", "args", "env"):
        if spec.get(name):
            container[name] = copy.deepcopy(spec[name])
    return {"spec": {"containers": [container]}}, {}


def from_object(obj: Mapping[str, Any]) -> WorkloadRequest:
    """The internal request for a GPUWorkload of either group; SpecError names the first bad field."""
    group, _, version = str(obj.get("apiVersion", "")).partition("/")
    if group not in (AGENTAFLOW_GROUP, WARP_GROUP):
        raise SpecError(
            "apiVersion", obj.get("apiVersion"), f"{AGENTAFLOW_API_VERSION} or {WARP_API_VERSION}"
        )
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    for name in FOREIGN_FIELDS[group]:
        if name in spec:
            other = WARP_GROUP if group == AGENTAFLOW_GROUP else AGENTAFLOW_GROUP
            raise SpecError(name, spec[name], f"no {other} field in a {group} GPUWorkload")
    strategy, topology_strategy = _strategy(group, spec)
    memory: int | None
    if group == AGENTAFLOW_GROUP:
        exclusive = _get(spec, "gpuRequirements.exclusiveAccess")
        exclusive = True if exclusive is None else bool(exclusive)
        gpus = _int(spec, "gpuRequirements.gpuCount", 0, 1024, 1)
        mems = [
            m
            for m in (
                _int(spec, "gpuMemoryRequired", 0, 10**7),
                _int(spec, "gpuRequirements.minGPUMemory", 0, 10**7),
            )
            if m
        ]
        memory = max(mems) if mems else None
        if not exclusive and (gpus or 0) > 1:
            raise SpecError("gpuRequirements.gpuCount", gpus, "0 or 1 when exclusiveAccess is false")
        if not exclusive and memory is None:
            raise SpecError(
                "gpuMemoryRequired", None, "the memory share in MiB when exclusiveAccess is false"
            )
        if exclusive and not gpus:
            raise SpecError("gpuRequirements.gpuCount", gpus, "at least 1 for exclusive GPUs")
        template = spec.get("podTemplate")
        if not isinstance(template, Mapping):
            raise SpecError("podTemplate", template, "a pod template (metadata, spec)")
        template, job_spec = copy.deepcopy(dict(template)), dict[str, Any]()
    else:
        exclusive, memory = True, None
        gpus = _int(spec, "gpuCount", 1, 1024)
        if gpus is None:
            raise SpecError("gpuCount", None, "an integer from 1 to 1024")
        template, job_spec = _warp_template(spec, gpus)
    latency = _get(spec, "topology.latencySensitive")
    return WorkloadRequest(
        key=WorkloadKey(group, str(meta.get("namespace", "")), str(meta.get("name", ""))),
        version=version,
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
        created=parse_time(meta.get("creationTimestamp")),
        priority=_priority(group, spec.get("priority")),
        gpus=gpus or 0,
        parallelism=_int(spec, "parallelism", 1, 1024, 1) or 1,
        exclusive=exclusive,
        memory_mib=memory,
        strategy=strategy,
        topology_strategy=topology_strategy,
        preferred_domain=_get(spec, "topology.preferredDomain"),
        latency_sensitive=None if latency is None else bool(latency),
        network_bandwidth=_get(spec, "topology.networkBandwidth"),
        retry=_retry(spec),
        deadline_s=_int(spec, "activeDeadlineSeconds", 1, 31_536_000),
        suspend=bool(spec.get("suspend", False)),
        model_name=spec.get("modelName"),
        template=template,
        job_spec=job_spec,
    )


# --- the Job ---------------------------------------------------------------------------------------------


def job_name(req: WorkloadRequest, attempt: int) -> str:
    """`<name>-<uid hash>-<attempt>`: deterministic, so a restarted controller finds (or re-creates) the
    same Job instead of starting a second one; the hash keeps the two groups' same-named workloads apart."""
    tag = hashlib.sha256(req.uid.encode()).hexdigest()[:5]
    return f"{req.key.name[:48].rstrip('-.')}-{tag}-{attempt}"


def webhook_annotations(req: WorkloadRequest) -> dict[str, str]:
    """The annotations the webhook reads (docs/annotations.md), per pod; the Job's parallelism: a gang."""
    out = {PRIORITY: str(req.priority)}
    if req.exclusive:
        out[GPU_COUNT] = str(req.gpus)
    else:
        out[EXCLUSIVE_ACCESS] = "false"
    if req.memory_mib:
        out[GPU_MEMORY] = str(req.memory_mib)
    if req.strategy:
        out[SCHEDULING_STRATEGY] = req.strategy
    if req.topology_strategy:
        out[PLACEMENT_STRATEGY] = req.topology_strategy
    if req.preferred_domain:
        out[PREFERRED_DOMAIN] = req.preferred_domain
    if req.latency_sensitive is not None:
        out[LATENCY_SENSITIVE] = "true" if req.latency_sensitive else "false"
    if req.network_bandwidth:
        out[NETWORK_BANDWIDTH] = req.network_bandwidth
    return out


def owner_reference(req: WorkloadRequest) -> dict[str, Any]:
    return {
        "apiVersion": f"{req.key.group}/{req.version}",
        "kind": "GPUWorkload",
        "name": req.key.name,
        "uid": req.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_manifest(
    req: WorkloadRequest, attempt: int, deadline_left_s: int | None = None, when_full_word: str | None = None
) -> dict[str, Any]:
    """The Job of one attempt: owned by the GPUWorkload (deleting it deletes the Job and frees the GPUs), no
    retries of its own (backoffLimit 0: the controller retries, with backoff, and counts the attempts).
    `when_full_word` is written on its pods, so the webhook treats them as the controller does, whatever its
    own default."""
    labels = {
        WORKLOAD_NAME_LABEL: req.key.name[:63],
        WORKLOAD_UID_LABEL: req.uid,
        WORKLOAD_GROUP_LABEL: req.key.group,
    }
    template = copy.deepcopy(dict(req.template))
    tmeta = template.setdefault("metadata", {}) or {}
    template["metadata"] = tmeta
    tmeta["labels"] = {**(tmeta.get("labels") or {}), **labels}
    tmeta["annotations"] = {**(tmeta.get("annotations") or {}), **webhook_annotations(req)}
    if when_full_word is not None:
        tmeta["annotations"][WHEN_FULL] = when_full_word
    tspec = template.setdefault("spec", {}) or {}
    template["spec"] = tspec
    if tspec.get("restartPolicy") not in ("Never", "OnFailure"):
        tspec["restartPolicy"] = "Never"
    spec: dict[str, Any] = {
        **copy.deepcopy(dict(req.job_spec)),
        "parallelism": req.parallelism,
        "completions": req.parallelism,
        "backoffLimit": 0,
        "template": template,
    }
    if req.parallelism > 1:
        spec["completionMode"] = "Indexed"
    if deadline_left_s is not None:
        spec["activeDeadlineSeconds"] = max(1, int(deadline_left_s))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(req, attempt),
            "namespace": req.key.namespace,
            "labels": labels,
            "annotations": {WORKLOAD_ATTEMPT_ANNOTATION: str(attempt)},
            "ownerReferences": [owner_reference(req)],
        },
        "spec": spec,
    }


def sample_pod(job: Mapping[str, Any]) -> dict[str, Any]:
    """The pod the Job controller would make first: what the ledger is asked about in a dry run."""
    template = copy.deepcopy(dict(job["spec"]["template"]))
    meta = dict(template.get("metadata") or {})
    meta.update(
        namespace=job["metadata"]["namespace"],
        name=f"{job['metadata']['name']}-0",
        ownerReferences=[
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job["metadata"]["name"],
                "uid": "",
                "controller": True,
            }
        ],
    )
    if job["spec"].get("completionMode") == "Indexed":
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            JOB_COMPLETION_INDEX: "0",
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template.get("spec") or {}}
