"""The controller's questions to the GPU ledger: would this Job's pods be placed whole now, and what is held.

It asks through `gpuledger.service.ledger_service`'s public names only (the Ray actor's methods are the
service's), with the
same pod parser the webhook runs, so a dry run answers as the webhook's admission would. It reserves nothing:
the webhook stays the only writer of placements.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from gpuledger.controller.mapping import sample_pod
from gpuledger.controller.queue import Verdict
from gpuledger.core.model import Denial, Placement
from gpuledger.core.pods.annotation_values import AnnotationError
from gpuledger.core.pods.pod_spec import PodRequestConfig
from gpuledger.core.pods.request import request_from_pod
from gpuledger.service.ledger_service import AdmitCall, Held

INVALID = "InvalidSpec"
UNAVAILABLE = "LedgerUnavailable"


class LedgerView(Protocol):
    def dry_run(self, jobs: Sequence[Mapping[str, Any]]) -> list[Verdict]: ...

    def snapshot(self) -> dict: ...

    def stats(self) -> dict: ...

    def held(self, ids: Sequence[str]) -> list[bool]: ...


# reasons that name a resource a node ran short of: what the workload waits for, not where it may not go
_RESOURCE_REASONS = (
    "NOT_ENOUGH_GPUS",
    "NOT_ENOUGH_GPU_SHARE",
    "NOT_ENOUGH_CPU",
    "NOT_ENOUGH_MEMORY",
    "GPU_MEMORY_TOO_SMALL",
    "PRIORITY_HEADROOM",
    "LEAF_CONSTRAINT",
    "UNHEALTHY_DEVICE",
)


def _reason_word(denial: Any) -> str:
    """`NOT_ENOUGH_GPUS` -> `NotEnoughGpus`: the blocking resource most eligible nodes lacked, else the reason
    most nodes gave (a nodeSelector rules most nodes out; the one it allows is what the workload awaits)."""
    by_reason = [(getattr(r, "name", str(r)), n) for r, n in getattr(denial, "by_reason", ()) or ()]
    if not by_reason:
        return "Unschedulable"
    short = [pair for pair in by_reason if pair[0] in _RESOURCE_REASONS]
    name = max(short or by_reason, key=lambda pair: pair[1])[0]
    return "".join(part.capitalize() for part in name.split("_"))


def requests_for(jobs: Sequence[Mapping[str, Any]], config: PodRequestConfig) -> list[Any]:
    """Per Job: the ledger request of its first pod (a gang's request covers every pod), or a Verdict when
    the pod cannot be parsed (its message names the annotation and the value, as a webhook denial does)."""
    out: list[Any] = []
    for job in jobs:
        pod = sample_pod(job)
        try:
            request = request_from_pod(pod, dict(job), config, f"dryrun-{job['metadata']['name']}")
        except AnnotationError as err:
            out.append(Verdict(False, INVALID, str(err)))
            continue
        out.append(request if request is not None else Verdict(True, "NoGPU", "needs no GPU"))
    return out


def verdicts(answers: Sequence[Any]) -> list[Verdict]:
    out = []
    for answer in answers:
        if isinstance(answer, Placement):
            out.append(Verdict(True, "Fits", f"fits on {answer.node}"))
        elif isinstance(answer, Denial):
            out.append(Verdict(False, _reason_word(answer), answer.message))
        else:  # Unavailable: the ledger restarted and has not resynced
            out.append(Verdict(False, UNAVAILABLE, getattr(answer, "message", str(answer))))
    return out


class _Asking:
    config: PodRequestConfig = PodRequestConfig()

    def _admit(self, calls: list[AdmitCall]) -> list[Any]:
        raise NotImplementedError

    def dry_run(self, jobs: Sequence[Mapping[str, Any]]) -> list[Verdict]:
        parsed = requests_for(jobs, self.config)
        asks = [(i, r) for i, r in enumerate(parsed) if not isinstance(r, Verdict)]
        answers = verdicts(self._admit([AdmitCall(r, dry_run=True) for _, r in asks])) if asks else []
        out: list[Verdict] = [r if isinstance(r, Verdict) else Verdict(False) for r in parsed]
        for (i, _), verdict in zip(asks, answers, strict=True):
            out[i] = verdict
        return out


class RayLedger(_Asking):
    """The shared ledger actor (gpuledger.ray.actor): one actor call per queue pass."""

    def __init__(self, handle: Any, config: PodRequestConfig | None = None, timeout_s: float = 10.0):
        self.handle, self.timeout_s = handle, timeout_s
        self.config = config or PodRequestConfig()

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=self.timeout_s)

    def _admit(self, calls: list[AdmitCall]) -> list[Any]:
        return self._get(self.handle.admit.remote(calls))

    def snapshot(self) -> dict:
        return self._get(self.handle.snapshot.remote())

    def held(self, ids: Sequence[str]) -> list[bool]:
        return [isinstance(h, Held) for h in self._get(self.handle.lookup.remote(list(ids)))]

    def stats(self) -> dict:
        return self._get(self.handle.stats.remote()).as_dict()


class ServiceLedger(_Asking):
    """A `LedgerService` in this process (tests, and `explain`-like offline use)."""

    def __init__(self, service: Any, clock: Any, config: PodRequestConfig | None = None):
        self.service, self.clock = service, clock
        self.config = config or PodRequestConfig()

    def _admit(self, calls: list[AdmitCall]) -> list[Any]:
        return self.service.admit(calls, self.clock())

    def snapshot(self) -> dict:
        return self.service.snapshot()

    def held(self, ids: Sequence[str]) -> list[bool]:
        return [isinstance(h, Held) for h in self.service.lookup(list(ids))]

    def stats(self) -> dict:
        return self.service.stats().as_dict()
