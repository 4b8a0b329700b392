"""Admission with the line in mind: reserve now, or take a place in the ledger's line of waiting pods.

A request is placed when it fits now, no one waits ahead of it for what it would take (the line's rule,
gpuledger.core.queues.waiting) and its GPU queue may take what it would get (the queues' gate,
gpuledger.core.queues.queue_gate). Otherwise, when it could fit the cluster were every GPU free, it is told
to wait (`Waiting`: nothing reserved), or denied where the caller may not wait; a request that could never
fit gets the denial it would get with no one in line. A known id returns its placement.

The rule decides only: reserving is the ledger's (`reserve`); the gate is read as of the books' latest
change (gpuledger.core.queues.current_gate) and told when the rule's own placement kept it good.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpuledger.core.books.books import Books
from gpuledger.core.model import Denial, Placement, Request
from gpuledger.core.placing.decisions import Decider
from gpuledger.core.placing.diagnosis import describe
from gpuledger.core.placing.filters import bandwidth_unchecked, with_warning
from gpuledger.core.queues.current_gate import CurrentGate
from gpuledger.core.queues.queue_rule import DEFAULT_BACKFILL_WINDOW_S
from gpuledger.core.queues.waiting import Waiting, WaitingLine, rank_of, waiting_answer
from gpuledger.names import WHEN_FULL, WHEN_FULL_REFUSE


class AdmissionRule:
    """Reserve, or wait in line, or be denied: the ledger's `reserve_or_wait`."""

    def __init__(
        self,
        books: Books,
        line: WaitingLine,
        decider: Decider,
        reserve: Callable[[Request, float], Placement | Denial],
        gate: CurrentGate,
    ):
        self._books = books
        self._line = line
        self._decider = decider
        self._reserve = reserve  # reserve a request whose bandwidth was checked against the index
        self._gate = gate  # the queues' gate as of the books' latest change

    def reserve_or_wait(
        self,
        request: Request,
        now: float,
        may_wait: bool = True,
        backfill_window_s: float = DEFAULT_BACKFILL_WINDOW_S,
    ) -> Placement | Denial | Waiting:
        """A placement when the request fits now and no one waits ahead of it for what it would take;
        else, when it could fit the cluster were every GPU free, `Waiting` (nothing reserved;
        `may_wait=False` turns that into a denial); else the denial it would get with no one in line."""
        existing = self._books.reservations.get(request.id)
        if existing is not None:
            return existing.placement
        request, warning = bandwidth_unchecked(request, self._books.index)
        line = self._line
        gate = self._gate.get()
        behind = line.must_wait(request, now, backfill_window_s, gate)
        if not behind:
            refusal = gate.refusal(request) if gate is not None else None
            if refusal is not None:
                if not may_wait:
                    return Denial(
                        id=request.id,
                        message=f"{describe(request)} fits now, but {refusal}",
                        strategy=request.strategy or "",
                    )
                answer = waiting_answer(request, now, line.position(rank_of(request, now)), None, "")
                return replace(answer, message=f"{answer.message}; {refusal}", reason=refusal)
            result = self._reserve(request, now)
            if isinstance(result, Placement):
                if gate is not None:
                    gate.placed(request, result)
                    self._gate.kept(gate)
                return with_warning(result, warning)
            # a denial naming no reason is about the request itself (a bad strategy, a gang of another shape)
            if not result.by_reason or not line.could_fit(request):
                return result
            if not may_wait:
                return result
            line.failed_at_admission(request)
            return waiting_answer(request, now, line.position(rank_of(request, now)), result, "")
        dry = self._decider.explain(request, with_scores=False).result
        if isinstance(dry, Denial) and (not dry.by_reason or not line.could_fit(request)):
            return dry  # it could not wait for anything: denied as it would be with no one in line
        if not may_wait:
            return Denial(
                id=request.id,
                message=f"{describe(request)} fits now, but {behind}; it would wait in line "
                f"(annotation {WHEN_FULL}={WHEN_FULL_REFUSE} refuses instead)",
                strategy=request.strategy or "",
            )
        return waiting_answer(request, now, line.position(rank_of(request, now)), None, behind)
