"""The controller chain above a pod and the GPU annotations it hands down.

Pod -> ReplicaSet -> Deployment, Pod -> Job, Pod -> StatefulSet, Pod -> PyTorchJob/MPIJob/TFJob: every GPU
annotation on a workload object applies to its pods, and the nearest object wins (pod, then its controller,
then that one's controller). Reads owners only through an `OwnerLookup`; never writes on the pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuledger.names import SCHEDULING_MAP, USER_ANNOTATION_PREFIXES
from gpuledger.webhook.admission.owners import OWNER_KINDS, WORKLOAD_KINDS, OwnerLookup

# the annotation families the earlier tools defined (docs/annotations.md) and their one unprefixed key;
# gpuledger.io/* is never inherited
GPU_ANNOTATION_KEYS = (SCHEDULING_MAP,)
# the pod's own controller kinds whose pods may form a gang (request_from_pod sizes each; Kubeflow jobs by
# the sum of their replica specs), so their own annotations stay theirs: gpu-count there is the group's total
GROUP_KINDS = (*OWNER_KINDS, "PyTorchJob", "MPIJob", "TFJob", "PodGroup")
# kinds found through a pod's spec.schedulingGroup, not its owner references: never walked up from a pod
SCHEDULING_GROUP_KINDS = ("PodGroup", "Workload")
MAX_DEPTH = 4  # Pod -> ReplicaSet -> Deployment is 2; a cycle or a runaway chain stops here


def is_gpu_annotation(key: Any) -> bool:
    key = str(key)
    return key in GPU_ANNOTATION_KEYS or key.startswith(USER_ANNOTATION_PREFIXES)


def _meta(obj: dict) -> dict:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _annotations(obj: dict) -> dict:
    value = _meta(obj).get("annotations")
    return value if isinstance(value, dict) else {}


def controller_ref(obj: dict) -> tuple[str, str] | None:
    """(kind, name) of the object's controller when it is a workload kind we read (and of the right API group
    when the reference names one); a reference without `controller` counts, as the ledger's parser has it."""
    refs = _meta(obj).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        if not isinstance(ref, dict) or ref.get("controller", True) is False:
            continue
        kind, name = ref.get("kind"), ref.get("name")
        if kind not in WORKLOAD_KINDS or not isinstance(name, str) or not name:
            continue
        api_version = ref.get("apiVersion")
        group = api_version.rsplit("/", 1)[0] if isinstance(api_version, str) and "/" in api_version else ""
        if api_version and group != WORKLOAD_KINDS[kind].group:
            continue  # another API's kind of the same name
        return kind, name
    return None


class MissingPodGroup(ValueError):
    """The pod names a PodGroup that does not exist: placing it alone would split the gang kube-scheduler
    keeps whole, so the admission is denied (a Job's controller creates the pod again once the group
    exists)."""


def pod_group_name(pod: dict) -> str | None:
    """`spec.schedulingGroup.podGroupName`, or None when the pod belongs to no PodGroup."""
    return _name_at(pod, "spec", "schedulingGroup", "podGroupName")


def is_gang_pod_group(group: dict) -> bool:
    """A PodGroup whose scheduling policy is `gang` (all-or-nothing); a `basic` one groups nothing here."""
    spec = group.get("spec")
    policy = spec.get("schedulingPolicy") if isinstance(spec, dict) else None
    return isinstance(policy, dict) and isinstance(policy.get("gang"), dict)


def _name_at(obj: dict, *path: str) -> str | None:
    """The non-empty string at `path` in `obj`, or None where any step is missing or of another type."""
    value: object = obj
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None


def describe(obj: dict) -> str:
    meta = _meta(obj)
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('kind', '?')} {where}{meta.get('name') or ''}"


@dataclass(frozen=True)
class Inputs:
    """What `request_from_pod` reads: the pod and its group owner, each with the annotations inherited from
    the objects above it; `inherited` says which object each inherited annotation came from."""

    pod: dict
    owner: dict | None
    inherited: dict[str, str]


@dataclass(frozen=True)
class OwnerChain:
    owners: tuple[dict, ...] = ()  # nearest first: the pod's controller, its controller, ...

    @property
    def group_owner(self) -> dict | None:
        """The pod's own controller when it is a Job, StatefulSet or Kubeflow job: its size makes the gang."""
        return self.owners[0] if self.owners and self.owners[0].get("kind") in GROUP_KINDS else None

    @property
    def top(self) -> dict | None:
        """The outermost controller found (a Deployment rather than its ReplicaSet)."""
        return self.owners[-1] if self.owners else None

    def inputs(self, pod: dict) -> Inputs:
        """Hand the chain's GPU annotations down. A group owner keeps its own (its gpu-count is the gang's
        total) and receives those above it; otherwise the pod receives them, per pod."""
        group = self.group_owner
        above = self.owners[1:] if group is not None else self.owners
        found: dict[str, tuple[Any, str]] = {}
        for owner in above:  # nearest first: the first value seen wins
            for key, value in _annotations(owner).items():
                if is_gpu_annotation(key) and key not in found:
                    found[key] = (value, describe(owner))
        target = group if group is not None else pod
        own = _annotations(target)
        inherited = {k: v for k, v in found.items() if k not in own}
        if not inherited:
            return Inputs(pod, group, {})
        view = dict(target)
        view["metadata"] = {
            **_meta(target),
            "annotations": {**{k: v for k, (v, _) in inherited.items()}, **own},
        }
        sources = {k: source for k, (_, source) in inherited.items()}
        return Inputs(pod, view, sources) if group is not None else Inputs(view, None, sources)


async def walk(pod: dict, namespace: str, lookup: OwnerLookup) -> OwnerChain:
    """The pod's gang PodGroup and its Workload first, when it names one (spec.schedulingGroup), then its
    controller references followed up while they name a workload kind that exists."""
    owners: list[dict] = await _scheduling_group(pod, namespace, lookup)
    groups = len(owners)
    seen: set[tuple[str, str]] = set()
    obj = pod
    while len(owners) - groups < MAX_DEPTH:
        ref = controller_ref(obj)
        if ref is None or ref in seen or ref[0] in SCHEDULING_GROUP_KINDS:
            break
        seen.add(ref)
        owner = await lookup.get(ref[0], namespace, ref[1])
        if not isinstance(owner, dict):
            break
        if owner.get("kind") != ref[0]:
            owner = {**owner, "kind": ref[0]}
        owners.append(owner)
        obj = owner
    return OwnerChain(tuple(owners))


async def _scheduling_group(pod: dict, namespace: str, lookup: OwnerLookup) -> list[dict]:
    """[PodGroup, its Workload if any] for a pod of a gang PodGroup; [] for none or a `basic` one. A named
    PodGroup that does not exist is `MissingPodGroup`."""
    name = pod_group_name(pod)
    if name is None:
        return []
    group = await lookup.get("PodGroup", namespace, name)
    if not isinstance(group, dict):
        raise MissingPodGroup(
            f'spec.schedulingGroup.podGroupName "{name}": no PodGroup "{name}" in namespace "{namespace}" '
            "(scheduling.k8s.io/v1beta1); accepted: the name of an existing PodGroup (create the PodGroup "
            "before its pods)"
        )
    if not is_gang_pod_group(group):
        return []
    found = [{**group, "kind": "PodGroup"}]
    workload = _name_at(group, "spec", "workloadRef", "workloadName")
    if workload is not None and isinstance(obj := await lookup.get("Workload", namespace, workload), dict):
        found.append({**obj, "kind": "Workload"})
    return found
