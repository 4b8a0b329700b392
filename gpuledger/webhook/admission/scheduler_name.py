"""Whose pod is it: the pod's `spec.schedulerName` says whether gpuledger places it.

The earlier tools were schedulers, so their manifests name them (`schedulerName: gpu-scheduler`); with those
schedulers gone such a pod would stay Pending for ever. Names gpuledger takes over are rewritten to the
default scheduler; any other scheduler keeps its pod, unplaced. Pure: decides and words the warning, writes
nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_SCHEDULER = "default-scheduler"

OURS, TAKEOVER, OTHER = "ours", "takeover", "other"


@dataclass(frozen=True)
class SchedulerChoice:
    verdict: str  # ours (default scheduler or none named) | takeover | other
    name: str  # the pod's schedulerName as written ("" when absent)
    warning: str = ""  # what the admission answer tells the user; empty for OURS


def scheduler_name(pod: dict) -> str:
    spec = pod.get("spec")
    value = spec.get("schedulerName") if isinstance(spec, dict) else None
    return value if isinstance(value, str) else ""


def choose(pod: dict, takeover_names: Iterable[str]) -> SchedulerChoice:
    """OURS for the default scheduler, TAKEOVER for a name gpuledger replaces, OTHER for anyone else's."""
    name = scheduler_name(pod)
    if name in ("", DEFAULT_SCHEDULER):
        return SchedulerChoice(OURS, name)
    if name in set(takeover_names):
        return SchedulerChoice(
            TAKEOVER,
            name,
            f"gpuledger: spec.schedulerName {name!r} was replaced by {DEFAULT_SCHEDULER!r}: gpuledger takes "
            f"over from {name} (takeover_scheduler_names) and places the pod's GPUs at admission",
        )
    return SchedulerChoice(
        OTHER,
        name,
        f"gpuledger: spec.schedulerName {name!r} is another scheduler's: gpuledger left the pod unchanged "
        "and reserved no GPU for it (takeover_scheduler_names lists the schedulers gpuledger replaces)",
    )


def take_over(work: dict) -> None:
    """Point the pod (a `shallow_pod` copy whose spec may be written) at the default scheduler."""
    spec = work.get("spec")
    if isinstance(spec, dict):
        spec["schedulerName"] = DEFAULT_SCHEDULER
