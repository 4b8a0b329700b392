"""The validating side: a pod may carry only a placement the ledger holds for it, signed, unclaimed and
on its node, and no one but the webhook may change gpuledger.io/* keys afterwards.
Only checks and claims the reservation a placement names; never places a pod, never writes a patch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gpuledger.core.model import Placement
from gpuledger.core.pods.placement_codec import binding_mismatch, decode_bound
from gpuledger.core.pods.waiting_codec import ticket_for
from gpuledger.names import (
    LEDGER_PREFIX,
    PLACEMENT_ANNOTATION,
    RESERVATION_ID_KEY,
    SCHEDULING_GATE,
    WAITING_ANNOTATION,
)
from gpuledger.service.ledger_service import Unavailable
from gpuledger.webhook.admission import env_guard
from gpuledger.webhook.admission.common import (
    MISSING_OBJECT,
    _annotations,
    _bad_request,
    _forbidden,
    _labels,
    _ledger_keys,
    _pod_name,
    describe_placement,
)
from gpuledger.webhook.admission.patch import _dict_at, gated
from gpuledger.webhook.admission.review import Decision, Review
from gpuledger.webhook.config import WebhookConfig
from gpuledger.webhook.ledger.client import LedgerClient, LedgerUnavailable
from gpuledger.webhook.metrics import WebhookMetrics

log = logging.getLogger("gpuledger.webhook")


# the answer when the ledger cannot be asked (fail open or closed): the handler's, as on the mutating side
UnavailableAnswer = Callable[[dict, dict, list[str], str], Decision]


class Validator:
    """The validating admission of pods: a placed pod's placement claimed from the ledger, updates that
    would change what the ledger placed refused. The handler makes one with its config, ledger client,
    placement key and metrics, and the answer it gives when the ledger cannot be asked."""

    def __init__(
        self,
        config: WebhookConfig,
        ledger: LedgerClient,
        key: bytes,
        metrics: WebhookMetrics,
        unavailable: UnavailableAnswer,
    ):
        self.config = config
        self.ledger = ledger
        self.key = key
        self.metrics = metrics
        self._unavailable = unavailable

    async def validate(self, review: Review) -> Decision:
        try:
            if review.kind not in ("Pod", "") or review.sub_resource not in ("", "ephemeralcontainers"):
                return Decision(True, outcome="allowed")
            if review.operation == "CREATE":
                return await self._validate_create(review)
            if review.operation == "UPDATE":
                decision = self._validate_update(review)  # a changed placement is named as such first
                if not decision.allowed:
                    return decision
                pod = review.object or {}
                if refused := env_guard.refusal(pod, self.key, self.config, before=review.old_object or {}):
                    return _forbidden(f"{_pod_name(review, pod)}: {refused}")  # e.g. `kubectl debug --env`
                return decision
            return Decision(True, outcome="allowed")
        except Exception as exc:
            log.exception("validating admission %s failed", review.uid)
            self.metrics.handler_failures.labels("validate").inc()
            return Decision(
                False,
                code=500,
                reason="InternalError",
                outcome="error",
                message=f"gpuledger webhook internal error ({type(exc).__name__}: {exc})",
            )

    async def _validate_create(self, review: Review) -> Decision:
        pod = review.object
        if pod is None:
            return _bad_request(MISSING_OBJECT)
        who = _pod_name(review, pod)
        annotations, labels = _annotations(pod), _labels(pod)
        text = annotations.get(PLACEMENT_ANNOTATION)
        label = labels.get(RESERVATION_ID_KEY)
        if WAITING_ANNOTATION in annotations or gated(pod):
            return self._validate_waiting(review, pod, who, text, label)
        if text is None:
            if label is not None:
                return _forbidden(
                    f"{who}: label {RESERVATION_ID_KEY}={label!r} without a placement annotation; "
                    "only the gpuledger webhook writes gpuledger.io/* (remove it)"
                )
            return self._env_refusal(review, pod, None) or Decision(True, outcome="allowed")
        decoded = decode_bound(str(text), self.key)
        if decoded is None:
            return _forbidden(
                f"{who}: annotation {PLACEMENT_ANNOTATION} has a bad signature or is malformed; "
                "accepted: only a placement written by the gpuledger webhook (remove it)"
            )
        placement, binding = decoded
        mismatch = binding_mismatch(binding, _named(pod, review.name), review.namespace)
        if mismatch:  # checked before the claim below, which a copy must not take from its original
            return _forbidden(
                f"{who}: annotation {PLACEMENT_ANNOTATION} was issued for another pod: {mismatch}"
                f"{await self._whose(placement.id)}; a copied placement annotation cannot be reused "
                "(remove it)"
            )
        if label != placement.id:
            return _forbidden(
                f"{who}: label {RESERVATION_ID_KEY}={label!r} does not match the placement's "
                f"reservation id {placement.id!r}"
            )
        spec = _dict_at(pod, "spec")
        if spec.get("nodeName") and spec.get("nodeName") != placement.node:
            return _forbidden(
                f"{who}: spec.nodeName={spec.get('nodeName')!r} differs from the placement's "
                f"node {placement.node!r}"
            )
        if review.dry_run:  # dry runs reserve nothing: the signature is the check
            return self._env_refusal(review, pod, placement) or Decision(True, outcome="allowed")
        asked = time.perf_counter()
        try:
            async with asyncio.timeout(self.config.deadline_s):
                held = await self.ledger.claim(placement.id, review.uid)
        except TimeoutError:
            return self._unavailable(
                pod, pod, [], f"the GPU ledger did not answer within {self.config.deadline_s:g}s"
            )
        except LedgerUnavailable as exc:
            return self._unavailable(pod, pod, [], f"the GPU ledger is unavailable ({exc})")
        finally:
            self.metrics.claim_duration.observe(time.perf_counter() - asked)
        if isinstance(held, Unavailable):
            return self._unavailable(pod, pod, [], held.message)
        if held is None:
            return _forbidden(
                f"{who}: placement {placement.id!r} matches no live reservation "
                "(expired, released or never made)"
            )
        if (held.placement.node, held.placement.devices, held.placement.shares) != (
            placement.node,
            placement.devices,
            placement.shares,
        ):
            return _forbidden(
                f"{who}: placement {placement.id!r} differs from the ledger's reservation "
                f"({describe_placement(held.placement)})"
            )
        if held.confirmed or held.claimed:
            return _forbidden(
                f"{who}: placement {placement.id!r} belongs to another pod "
                f"({'stored' if held.confirmed else 'already admitted'}); "
                "a copied placement annotation cannot be reused"
            )
        return self._env_refusal(review, pod, placement) or Decision(True, outcome="allowed")

    def _validate_waiting(
        self, review: Review, pod: dict, who: str, placement: object, label: object
    ) -> Decision:
        """A pod admitted to wait for GPUs: gated by gpuledger, with a ticket signed for it and nothing placed
        yet (the placement adapter writes that later, on the stored pod)."""
        text = _annotations(pod).get(WAITING_ANNOTATION)
        if text is None:
            return _forbidden(
                f"{who}: scheduling gate {SCHEDULING_GATE} without annotation {WAITING_ANNOTATION}; only "
                "gpuledger gates a pod (remove the gate)"
            )
        ticket = ticket_for(text, self.key, _named(pod, review.name), review.namespace)
        if ticket is None:
            return _forbidden(
                f"{who}: annotation {WAITING_ANNOTATION} has a bad signature, is malformed or was issued for "
                "another pod; accepted: only the ticket the gpuledger webhook wrote for this pod (remove it)"
            )
        if not gated(pod):
            return _forbidden(
                f"{who}: annotation {WAITING_ANNOTATION} without scheduling gate {SCHEDULING_GATE}: a "
                "waiting pod must stay gated until gpuledger places it"
            )
        if placement is not None or label is not None or _dict_at(pod, "spec").get("nodeName"):
            return _forbidden(
                f"{who}: a pod waiting for GPUs (annotation {WAITING_ANNOTATION}) carries a placement "
                f"({PLACEMENT_ANNOTATION}, label {RESERVATION_ID_KEY} or spec.nodeName); accepted: none "
                "until gpuledger places it"
            )
        return self._env_refusal(review, pod, None) or Decision(True, outcome="allowed")

    def _env_refusal(self, review: Review, pod: dict, placement: Placement | None) -> Decision | None:
        """A device variable or mount the pod may not set (env_guard), once the placement's own checks have
        spoken; `placement` is the pod's own, already verified (not decoded again)."""
        refused = env_guard.refusal(pod, self.key, self.config, placement=placement)
        return _forbidden(f"{_pod_name(review, pod)}: {refused}") if refused else None

    async def _whose(self, rid: str) -> str:
        """Words on who holds `rid` for a copy's denial (best effort: "" when the ledger cannot say)."""
        try:
            async with asyncio.timeout(self.config.deadline_s):
                held = await self.ledger.lookup(rid)
        except (TimeoutError, LedgerUnavailable):
            return ""
        if held is None or isinstance(held, Unavailable):
            return ""
        state = "stored" if held.confirmed else "already admitted" if held.claimed else "reserved"
        return f"; placement {rid!r} belongs to another pod ({state})"

    def _validate_update(self, review: Review) -> Decision:
        before, after = _ledger_keys(review.old_object), _ledger_keys(review.object)
        if before == after or review.username in self.config.privileged_usernames:
            return Decision(True, outcome="allowed")
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        who = _pod_name(review, review.object or review.old_object or {})
        return _forbidden(
            f"{who}: {review.username or 'this user'} may not change {', '.join(changed)}; "
            f"{LEDGER_PREFIX}* annotations and labels, gpuledger's scheduling gate and where a waiting pod "
            "will be placed are written only by gpuledger "
            f"({', '.join(self.config.privileged_usernames) or 'no user configured'})"
        )


def _named(pod: dict, name: str) -> dict:
    """The pod with the AdmissionReview's name filled in where its metadata has none yet."""
    meta = _dict_at(pod, "metadata")
    if not name or meta.get("name"):
        return pod
    return {**pod, "metadata": {**meta, "name": name}}
