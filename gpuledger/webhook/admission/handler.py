"""AdmissionHandler, the admission decisions: decode -> ask the ledger -> encode the patch (the mutating side
here, the validating side in validation.py). No HTTP here, so tests and `gpuledger explain` drive exactly
the code the server runs; never answers without a Decision (a bug is a 500 denial, never a dropped request).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable

from gpuledger.core.model import Denial, Placement, Request
from gpuledger.core.pods.annotation_values import AnnotationError
from gpuledger.core.pods.placement_codec import binding_mismatch, binding_of, decode_bound, encode_placement
from gpuledger.core.pods.pod_spec import PodRequestConfig
from gpuledger.core.pods.request import pod_name, request_from_pod
from gpuledger.core.pods.waiting_codec import WaitTicket, encode_waiting, ticket_for
from gpuledger.core.queues.waiting import Waiting
from gpuledger.names import (
    LEDGER_PREFIX,
    PLACEMENT_ANNOTATION,
    SCHEDULING_GATE,
    WAITING_ANNOTATION,
    WHEN_FULL,
    WHEN_FULL_REFUSE,
    WHEN_FULL_WAIT,
)
from gpuledger.service.ledger_service import AdmitCall, Unavailable
from gpuledger.webhook.admission import chain, env_guard, scheduler_name
from gpuledger.webhook.admission.common import (
    MISSING_OBJECT,
    _annotations,
    _bad_request,
    _forbidden,
    _invalid,
    _pod_name,
    describe_event,
    describe_placement,
)
from gpuledger.webhook.admission.owners import WORKLOAD_KINDS, NoOwners, OwnerLookup, OwnerLookupError
from gpuledger.webhook.admission.patch import (
    apply_placement,
    apply_waiting,
    patch_of,
    shallow_pod,
    strip_ledger_keys,
)
from gpuledger.webhook.admission.review import Decision, Review
from gpuledger.webhook.admission.shapes import PodShapes
from gpuledger.webhook.admission.validation import Validator
from gpuledger.webhook.config import WebhookConfig
from gpuledger.webhook.kube import events
from gpuledger.webhook.ledger import batcher
from gpuledger.webhook.ledger.client import LedgerClient, LedgerUnavailable
from gpuledger.webhook.ledger.prefetch import PlacementPrefetch
from gpuledger.webhook.metrics import WebhookMetrics

log = logging.getLogger("gpuledger.webhook")


class _Seen:
    """What one admission learned on its way, for the Event posted after it."""

    def __init__(self) -> None:
        self.chain = chain.OwnerChain()
        self.placement: Placement | None = None
        self.waiting: Waiting | None = None


def reservation_ids() -> Callable[[], str]:
    """Fresh reservation ids: a random per-process prefix and a counter (unique across replicas, and
    cheaper than a uuid4 per admission). Valid label values (hex, 28 characters)."""
    prefix = uuid.uuid4().hex[:12]
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter):016x}"


class AdmissionHandler:
    def __init__(
        self,
        config: WebhookConfig,
        ledger: LedgerClient,
        owners: OwnerLookup | None = None,
        metrics: WebhookMetrics | None = None,
        key: bytes | None = None,
        id_factory: Callable[[], str] | None = None,
        event_sink: events.EventSink | None = None,
    ):
        self.config = config
        self.ledger = ledger
        self.owners = owners or NoOwners()
        self.events = event_sink or events.NoEvents()
        self.metrics = metrics or WebhookMetrics()
        self.key = config.placement_key() if key is None else key
        self.new_id = id_factory or reservation_ids()
        self.validator = Validator(config, ledger, self.key, self.metrics, self._unavailable)
        self.parse_config = PodRequestConfig(gpu_resource=config.gpu_resource)
        self.shapes = PodShapes()
        self.prefetch: PlacementPrefetch | None = None
        if config.prefetch_depth:
            self.prefetch = PlacementPrefetch(
                ledger,
                config.prefetch_settings(),
                self.new_id,
                on_outcome=self.metrics.prefetched,
            )
            prefetch = self.prefetch
            self.metrics.prefetch_held.set_function(lambda: prefetch.held)

    async def validate(self, review: Review) -> Decision:
        """The validating webhook's answer (gpuledger.webhook.admission.validation)."""
        return await self.validator.validate(review)

    # ------------------------------------------------------------------ mutate
    async def mutate(self, review: Review) -> Decision:
        seen = _Seen()
        try:
            decision = await self._mutate(review, seen)
        except Exception as exc:  # a bug must still answer: a denial with code 500, never a dropped request
            log.exception("mutating admission %s failed", review.uid)
            self.metrics.handler_failures.labels("mutate").inc()
            decision = Decision(
                False,
                code=500,
                reason="InternalError",
                outcome="error",
                message=f"gpuledger webhook internal error ({type(exc).__name__}: {exc}); "
                "the pod was not placed, retry or report this",
            )
        self._report(review, decision, seen)
        return decision

    def _report(self, review: Review, decision: Decision, seen: _Seen) -> None:
        """Queue the decision's Event (never waits: events.EventPoster posts it off the request path)."""
        try:
            meta = (review.object or {}).get("metadata") or {}
            namespace = review.namespace or str(meta.get("namespace") or "")
            if decision.outcome == "placed" and seen.placement is not None:
                self.events.emit(events.placed(namespace, seen.placement.id, describe_event(seen.placement)))
            elif decision.outcome == "waiting" and seen.waiting is not None:
                self.events.emit(events.waiting(namespace, seen.waiting.id, seen.waiting.message))
            elif not decision.allowed and review.operation == "CREATE":
                target = _event_target(review, seen.chain, namespace)
                if target is not None:
                    self.events.emit(events.denied(target, decision.message))
        except Exception:
            log.exception("could not queue the event of admission %s", review.uid)

    async def _mutate(self, review: Review, seen: _Seen) -> Decision:
        """Pod CREATE -> its placement: each step below, in order, may answer instead (allowed untouched, a
        denial, no GPU needed); `seen` keeps what the Event needs."""
        if review.operation != "CREATE" or review.sub_resource or review.kind not in ("Pod", ""):
            return Decision(True, outcome="allowed")
        pod = review.object
        if pod is None:
            return _bad_request(MISSING_OBJECT)
        if not isinstance(pod.get("metadata", {}), dict):
            return _bad_request("pod metadata is not an object")
        who = _pod_name(review, pod)
        work = shallow_pod(pod)
        removed = strip_ledger_keys(work)
        namespace = review.namespace or str((pod.get("metadata") or {}).get("namespace") or "")
        prior = _prior_placement(pod, namespace, self.key)
        if prior is None and (ticket := _prior_ticket(pod, namespace, self.key)) is not None:
            return self._still_waiting(pod, work, ticket)
        # pods of one shape share what is read below before the ledger (gpuledger.webhook.admission.shapes)
        shape = self.shapes.key(pod, namespace) if prior is None and not removed else None
        warnings = []
        if removed and prior is None:
            warnings.append(
                f"gpuledger removed {', '.join(removed)}: only the gpuledger webhook writes {LEDGER_PREFIX}*"
            )
        if (not_ours := self._scheduler_choice(pod, work, shape, who, warnings)) is not None:
            return not_ours
        started = time.perf_counter()
        # the deadline bounds every wait below; it is armed only around the waits themselves: a pod without a
        # controller, placed from what the replica holds ahead, never waits, and an armed timer is ~3% of the
        # webhook's CPU per admission at 100 in flight (between waits nothing can be cancelled anyway)
        deadline = asyncio.get_running_loop().time() + self.config.deadline_s
        strategy = "none"
        batch = 0
        try:
            if chain.controller_ref(pod) is None and chain.pod_group_name(pod) is None:
                seen.chain = chain.OwnerChain()
            else:
                async with asyncio.timeout_at(deadline):
                    seen.chain = await chain.walk(pod, namespace, self.owners)
            request = self._request(pod, work, namespace, shape, seen.chain, who, warnings)
            if isinstance(request, Decision):  # an invalid annotation, or no GPU asked for
                return request
            strategy = request.strategy or "default"
            if self.config.visibility_mode == "device-plugin" and request.is_shared:
                return self._shared_refused(strategy, who)
            may_wait = _may_wait(pod, seen.chain, self.config.when_full == WHEN_FULL_WAIT)
            if isinstance(may_wait, str):
                self.metrics.decided(strategy, "invalid")
                return _invalid(f"{who}: {may_wait}")
            # reinvocations keep their own placement and dry runs reserve nothing: both ask the ledger
            prefetch = self.prefetch if prior is None and not review.dry_run else None
            taken = prefetch.take(request) if prefetch is not None else None
            result: Placement | Denial | Waiting | Unavailable
            if taken is not None:  # admitted ahead for this shape: no round trip (ledger.prefetch)
                result, batch = taken, 0
            else:
                result, batch = await self._admit(request, review.dry_run, prior, deadline, may_wait)
        except chain.MissingPodGroup as exc:
            self.metrics.decided("none", "invalid")
            return _invalid(f"{who}: {exc}")
        except TimeoutError:
            return self._unavailable(
                pod, work, warnings, f"the GPU ledger did not answer within {self.config.deadline_s:g}s"
            )
        except (LedgerUnavailable, OwnerLookupError) as exc:
            return self._unavailable(pod, work, warnings, f"the GPU ledger is unavailable ({exc})")
        finally:
            self.metrics.observe_decision(strategy, time.perf_counter() - started)
        if isinstance(result, Placement):
            return self._placed(review, pod, work, namespace, prior, result, strategy, batch, warnings, seen)
        if isinstance(result, Waiting):
            return self._waiting(review, pod, work, namespace, result, strategy, batch, warnings, seen)
        return self._not_placed(pod, work, warnings, who, request, result, strategy, batch)

    def _scheduler_choice(
        self, pod: dict, work: dict, shape: bytes | None, who: str, warnings: list[str]
    ) -> Decision | None:
        """None when the pod is ours to place (one named for a scheduler gpuledger takes over is renamed in
        `work`, with a warning); else the answer: the node's environment refused (env_guard), or another
        scheduler's pod, allowed untouched (gpuledger.webhook.admission.scheduler_name)."""
        choice = self.shapes.choice(shape) if shape is not None else None
        if choice is None:
            if refused := env_guard.refusal(pod, self.key, self.config):  # before anything: one clear denial
                return _forbidden(f"{who}: {refused}")
            choice = scheduler_name.choose(pod, self.config.takeover_scheduler_names)
            if shape is not None:
                self.shapes.remember_choice(shape, choice)
        if choice.verdict == scheduler_name.OTHER:  # another scheduler's pod: not ours to place
            self.metrics.decided("none", "other_scheduler")
            return Decision(
                True,
                patch=patch_of(pod, work),
                warnings=[*warnings, choice.warning],
                outcome="other_scheduler",
                message=choice.warning,
            )
        if choice.verdict == scheduler_name.TAKEOVER:
            scheduler_name.take_over(work)
            warnings.append(choice.warning)
        return None

    def _request(
        self,
        pod: dict,
        work: dict,
        namespace: str,
        shape: bytes | None,
        owners: chain.OwnerChain,
        who: str,
        warnings: list[str],
    ) -> Request | Decision:
        """The pod's request under a new reservation id: the one of its shape parsed before, else parsed from
        its and its owners' annotations. Else the answer: an invalid annotation, or no GPU asked for."""
        rid = self.new_id()
        kept = self.shapes.request_key(shape, owners.owners) if shape is not None else None
        known, request = self.shapes.request(kept, rid, pod_name(pod)) if kept else (False, None)
        self.metrics.shaped("hit" if known else "miss" if kept else "apart")
        if not known:
            inputs = owners.inputs(pod)
            try:
                request = request_from_pod(
                    inputs.pod, inputs.owner, self.parse_config, rid, namespace=namespace
                )
            except AnnotationError as exc:
                self.metrics.decided("none", "invalid")
                return _invalid(f"{who}: {exc}{_inherited_from(exc, inputs)}")
            if kept:
                self.shapes.remember_request(kept, request)
        if request is None:
            return Decision(True, patch=patch_of(pod, work), warnings=warnings, outcome="no_gpu", message="")
        return request

    def _shared_refused(self, strategy: str, who: str) -> Decision:
        """A shared GPU cannot be served in device-plugin visibility mode."""
        self.metrics.decided(strategy, "invalid")
        return _invalid(
            f"{who}: a shared GPU (agentaflow.gpu/milli, agentaflow.gpu/memory with "
            'exclusive-access "false") is not available in device-plugin visibility mode; accepted: '
            "whole GPUs, or ask the operator for host-indices or runtime-uuids mode"
        )

    def _placed(
        self,
        review: Review,
        pod: dict,
        work: dict,
        namespace: str,
        prior: Placement | None,
        result: Placement,
        strategy: str,
        batch: int,
        warnings: list[str],
        seen: _Seen,
    ) -> Decision:
        """The placement written on the pod, signed for it, and the patch that writes it."""
        apply_placement(
            work,
            result,
            encode_placement(result, self.key, binding_of(pod, namespace, review.name)),
            binding_mode=self.config.binding_mode,
            visibility_mode=self.config.visibility_mode,
            affinity_key=self.config.affinity_key,
            gpu_resource=self.config.gpu_resource,
        )
        warnings += result.warnings  # what the ledger could not check (a bandwidth no node states)
        warnings += env_guard.replacements(pod, work, self.config.visibility_mode)
        reused = prior is not None and result.id == prior.id
        outcome = "reused" if reused else ("dry_run" if review.dry_run else "placed")
        self.metrics.decided(strategy, outcome)
        seen.placement = result
        return Decision(
            True,
            patch=patch_of(pod, work),
            warnings=warnings,
            node=result.node,
            devices=tuple(result.devices) + tuple(s.device for s in result.shares),
            reservation_id=result.id,
            outcome=outcome,
            strategy=result.strategy or strategy,
            ledger_batch=batch,
            message=("dry run: nothing reserved; " if review.dry_run else "")
            + ("reinvocation: same placement; " if reused else "")
            + describe_placement(result),
        )

    def _waiting(
        self,
        review: Review,
        pod: dict,
        work: dict,
        namespace: str,
        answer: Waiting,
        strategy: str,
        batch: int,
        warnings: list[str],
        seen: _Seen,
    ) -> Decision:
        """The pod does not fit now but could: admitted gated, holding nothing, with its signed ticket (its
        request and the arrival the ledger stamped) and the device variables its placement will fill."""
        ticket = WaitTicket(answer.request, answer.arrival, binding_of(pod, namespace, review.name))
        apply_waiting(
            work,
            answer.request,
            encode_waiting(ticket, self.key),
            visibility_mode=self.config.visibility_mode,
            gpu_resource=self.config.gpu_resource,
        )
        warnings += env_guard.replacements(pod, work, self.config.visibility_mode)
        outcome = "dry_run" if review.dry_run else "waiting"
        self.metrics.decided(strategy, outcome)
        seen.waiting = answer
        told = (
            f"gpuledger: {answer.message}; admitted with scheduling gate {SCHEDULING_GATE}: it starts when "
            f"GPUs free and its turn comes ({WHEN_FULL}: {WHEN_FULL_REFUSE} refuses it instead)"
        )
        return Decision(
            True,
            patch=patch_of(pod, work),
            warnings=[*warnings, told],
            reservation_id=answer.id,
            outcome=outcome,
            strategy=strategy,
            ledger_batch=batch,
            message=("dry run: " if review.dry_run else "") + answer.message,
        )

    def _still_waiting(self, pod: dict, work: dict, ticket: tuple[WaitTicket, str]) -> Decision:
        """A reinvocation of a waiting pod's admission: the same ticket, gate and variables again (an empty
        patch when nothing else changed them), no ledger call."""
        answer, text = ticket
        apply_waiting(
            work,
            answer.request,
            text,
            visibility_mode=self.config.visibility_mode,
            gpu_resource=self.config.gpu_resource,
        )
        self.metrics.decided(answer.request.strategy or "default", "reused")
        return Decision(
            True,
            patch=patch_of(pod, work),
            reservation_id=answer.request.id,
            outcome="reused",
            message="reinvocation: still waiting",
        )

    def _not_placed(
        self,
        pod: dict,
        work: dict,
        warnings: list[str],
        who: str,
        request: Request,
        result: Denial | Unavailable,
        strategy: str,
        batch: int,
    ) -> Decision:
        """The ledger's refusal as the answer: unavailable (fail open or closed), or no room for the pod."""
        if isinstance(result, Unavailable):
            return self._unavailable(pod, work, warnings, result.message)
        if isinstance(result, Denial):
            self.metrics.decided(strategy, "denied")
            return _forbidden(
                f"no placement for {who} ({_summary(request)}): {result.message}",
                strategy=strategy,
                ledger_batch=batch,
            )
        raise TypeError(f"ledger answered {type(result).__name__}, expected Placement or Denial")

    async def _admit(
        self,
        request: Request,
        dry_run: bool,
        prior: Placement | None,
        deadline: float,
        may_wait: bool = False,
    ) -> tuple[Placement | Denial | Waiting | Unavailable, int]:
        """The ledger's answer, by `deadline`, and the batch it came in. A denial (or a wait) while this
        replica holds placements admitted ahead gives them back and asks once more: they must never be why a
        pod the ledger has room for is denied or made to wait."""
        call = AdmitCall(request, dry_run, prior.id if prior else None, may_wait)
        prefetch = self.prefetch
        asked = time.perf_counter()
        async with asyncio.timeout_at(deadline):
            batcher.batch_size.set(0)
            try:
                result = await self.ledger.admit(call)
            except LedgerUnavailable:
                if prefetch is not None:
                    prefetch.forget()
                raise
            if isinstance(result, Unavailable) and prefetch is not None:
                prefetch.forget()
            elif (
                isinstance(result, (Denial, Waiting))
                and prefetch is not None
                and (prefetch.held or prefetch.filling)
                and await prefetch.release_all()
            ):
                result = await self.ledger.admit(call)
        self.metrics.scheduling_duration.observe(time.perf_counter() - asked)
        return result, batcher.batch_size.get() or 1  # an unbatched client answers one admission per call

    def _unavailable(self, pod: dict, work: dict, warnings: list[str], why: str) -> Decision:
        self.metrics.decided("none", "unavailable")
        if self.config.fail_open:
            return Decision(
                True,
                patch=patch_of(pod, work),
                outcome="unavailable",
                warnings=[*warnings, f"gpuledger: {why}; admitted WITHOUT a GPU placement (fail_open)"],
            )
        return Decision(
            False,
            code=503,
            reason="ServiceUnavailable",
            outcome="unavailable",
            message=f"gpuledger: {why}; the pod is denied because the webhook fails closed "
            "(fail_open: false). Retry in a moment.",
        )


def _prior_placement(pod: dict, namespace: str, key: bytes) -> Placement | None:
    """The validly signed placement a pod already carries for itself (a reinvocation), else None."""
    text = _annotations(pod).get(PLACEMENT_ANNOTATION)
    if text is None or not key:
        return None
    decoded = decode_bound(str(text), key)
    if decoded is None or binding_mismatch(decoded[1], pod, namespace):
        return None
    return decoded[0]


def _prior_ticket(pod: dict, namespace: str, key: bytes) -> tuple[WaitTicket, str] | None:
    """The validly signed waiting ticket a gated pod already carries for itself (a reinvocation) and its
    text, else None."""
    text = _annotations(pod).get(WAITING_ANNOTATION)
    if text is None or not key:
        return None
    ticket = ticket_for(str(text), key, pod, namespace)
    return None if ticket is None else (ticket, str(text))


def _may_wait(pod: dict, owners: chain.OwnerChain, default: bool) -> bool | str:
    """Whether a pod that does not fit now may wait (annotation topology.scheduler/when-full on the pod, else
    on its nearest workload that sets it, else the webhook's `when_full`); a message naming the value when it
    is neither word."""
    where, value = "the pod", _annotations(pod).get(WHEN_FULL)
    if value is None:
        for owner in owners.owners:
            value = _annotations(owner).get(WHEN_FULL)
            if value is not None:
                where = chain.describe(owner)
                break
    if value is None:
        return default
    word = str(value).strip().lower()
    if word in (WHEN_FULL_WAIT, WHEN_FULL_REFUSE):
        return word == WHEN_FULL_WAIT
    return (
        f"annotation {WHEN_FULL}={value!r} (on {where}) is not accepted; accepted: {WHEN_FULL_WAIT!r} "
        f"(the default: a pod that does not fit now waits gated, in line) or {WHEN_FULL_REFUSE!r} (denied at "
        "once, as before)"
    )


def _inherited_from(exc: AnnotationError, inputs: chain.Inputs) -> str:
    source = inputs.inherited.get(exc.annotation)
    return f" (set on {source}, inherited by its pods)" if source else ""


def _event_target(review: Review, owners: chain.OwnerChain, namespace: str) -> events.ObjectRef | None:
    """Where a denial is reported: the outermost controller found (the pod was never stored), else the pod by
    name (a bare pod: `kubectl get events` still shows it); None for a bare pod with no name yet."""
    top = owners.top
    if top is not None:
        meta = top.get("metadata") or {}
        kind = str(top.get("kind") or "")
        known = WORKLOAD_KINDS[kind].api_version if kind in WORKLOAD_KINDS else ""
        api_version = str(top.get("apiVersion") or known)
        return events.ObjectRef(
            api_version, kind, namespace, str(meta.get("name") or ""), str(meta.get("uid") or "")
        )
    meta = (review.object or {}).get("metadata") or {}
    name = review.name or meta.get("name")
    if not name:
        return None
    return events.ObjectRef("v1", "Pod", namespace, str(name), str(meta.get("uid") or ""))


def _summary(request) -> str:
    if request.is_shared:
        what = f"shared GPU {request.gpu_milli}m" + (
            f" {request.gpu_memory_mib}MiB" if request.gpu_memory_mib else ""
        )
    else:
        what = f"{request.gpus} GPU" + ("s" if request.gpus != 1 else "")
    if request.group:
        what += f" in group {request.group.key} of {request.group.size}"
    if request.pinned:
        what += (
            f" pinned to {request.pinned.node}:{','.join(map(str, request.pinned.devices))} "
            "(annotation gpu-scheduling-map)"
        )
    return f"{what}, strategy {request.strategy or 'default'}"
