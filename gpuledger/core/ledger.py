"""The GPU ledger: one consistent view of every node's free GPUs, and the reservations that use them.

Admission asks `reserve`; the cluster's own objects (`apply_object`/`delete_object`) confirm, count and
release; unconfirmed reservations `expire` after a TTL. Everything is keyed by the caller's id, `now` is an
argument, and `rebuild(objects)` reproduces the live state from nodes and pods alone (`snapshot()`
equality), because every placement is also written, signed, on its pod.

This module is the facade only: it wires the parts over one set of books and keeps no logic of its own.
The books (`books`), per-node filters (`filters`), candidate selection (`selection`), denials (`diagnosis`),
decisions (`decisions`), gangs (`gangs`), leases (`leases`), following the cluster (`adoption`) and
totals (`stats`) each live in their own module; so do the GPU queues: what the ledger knows of them
(`queue_book`), their quotas and fair order at admission and in the line's passes (`queue_gate`, kept
across decisions by `current_gate`), the admission rule that reserves or gives a place in the line
(`admission_rule`), and the preemptions it holds (`held_plans`, planned by `preemption` in the preemption
pass, `preemption_pass`). With no GPUQueue object the queues' parts stand aside and the ledger decides as it
did without them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, is_dataclass, replace
from typing import Any

from gpuledger.core.books.adoption import Adoption
from gpuledger.core.books.books import GroupState, LedgerConfig, Reservation, slot_hid
from gpuledger.core.books.topology import Topology
from gpuledger.core.model import Denial, Explanation, NodeInfo, Placement, Request, ReservationState
from gpuledger.core.nodes.published_gpus import PublishedGpus
from gpuledger.core.passes.held_plans import HeldPlan, HeldPlans
from gpuledger.core.passes.preemption_pass import PreemptionPass
from gpuledger.core.placing.decisions import Decider
from gpuledger.core.placing.diagnosis import Diagnoser
from gpuledger.core.placing.filters import Filters, bandwidth_unchecked, with_warning
from gpuledger.core.placing.gangs import Gangs, GroupPlan, SlotClaim
from gpuledger.core.placing.selection import Selector
from gpuledger.core.queues.admission_rule import AdmissionRule
from gpuledger.core.queues.current_gate import CurrentGate
from gpuledger.core.queues.gpu_queues import QueueSet
from gpuledger.core.queues.ledger_view import LedgerView
from gpuledger.core.queues.queue_book import QueueBook
from gpuledger.core.queues.queue_rule import DEFAULT_BACKFILL_WINDOW_S
from gpuledger.core.queues.quotas import Capacity, Usage
from gpuledger.core.queues.waiting import (
    LineEntry,
    Placed,
    Waiting,
    WaitingLine,
    rank_of,
    waiting_answer,
)
from gpuledger.core.stats import DomainStats, LedgerStats, ledger_stats
from gpuledger.core.steps import Steps, drain

__all__ = [
    "DomainStats",
    "GroupState",
    "HeldPlan",
    "Ledger",
    "LedgerConfig",
    "LedgerStats",
    "LineEntry",
    "Placed",
    "QueueAccounts",
    "Reservation",
    "Waiting",
    "slot_hid",
]


@dataclass(frozen=True)
class QueueAccounts:
    queues: QueueSet
    declared: frozenset[str]
    usage: Usage
    capacity: Capacity
    waiting: dict[str, int]  # leaf queue -> pods waiting in it


def _shared(name: str, doc: str) -> property:
    """A ledger attribute that is the books' own (read and replaced there, where every part reads it)."""

    def get(self: Ledger) -> Any:
        return getattr(self._books, name)

    def set(self: Ledger, value: Any) -> None:
        setattr(self._books, name, value)

    return property(get, set, doc=doc)


def _parts(ledger: Ledger) -> list[object]:
    """The ledger's parts: the objects of gpuledger.core's classes (not values: dataclasses) reachable from it
    through attributes and callbacks (a bound method's object)."""
    found: dict[int, object] = {}
    todo: list[object] = [ledger]
    while todo:
        obj = todo.pop()
        obj = getattr(obj, "__self__", obj)
        if id(obj) in found or is_dataclass(obj) or not type(obj).__module__.startswith("gpuledger.core."):
            continue
        attributes = getattr(obj, "__dict__", None)
        if attributes is None:
            continue
        found[id(obj)] = obj
        todo.extend(attributes.values())
    return list(found.values())


class Ledger:
    config = _shared("config", "the LedgerConfig")
    index = _shared("index", "every node's free state (ClusterIndex)")
    performance = _shared("performance", "node -> historical performance in [0, 1] (strategy balanced)")
    context_extra = _shared("context_extra", "inputs for plug-in strategies (ScoreContext.extra)")
    problems = _shared("problems", "malformed cluster data seen, newest last")

    def __init__(self, config: LedgerConfig | None = None):
        # the books are built by the part that follows the cluster: it hears what changes them (adoption.py)
        adoption = self._adoption = Adoption(config or LedgerConfig())
        books = self._books = adoption.books
        self._leases = adoption.leases
        filters = self._filters = Filters(books)
        selector = self._selector = Selector(books, filters)
        diagnoser = self._diagnoser = Diagnoser(books, filters, adoption.published)
        gangs = self._gangs = Gangs(books, selector, diagnoser)
        self._decider = Decider(books, filters, selector, diagnoser, gangs)
        self._waiting = WaitingLine(books, filters, selector, self.reserve, self._leases.release)
        # GPU queues, namespaces, PodDisruptionBudgets and what queue decisions read of pods (queue_book.py)
        self._queues = QueueBook(books, adoption.claims)
        # the queues' quotas and fair order over the decisions since the books last changed otherwise
        # (current_gate.py)
        gate = self._gate = CurrentGate(
            books, self._queues, lambda r: self.explain(r, with_scores=False).result
        )
        # the preemptions it holds: their nodes kept for their preemptors (held_plans.py)
        self._plans = HeldPlans(books, self._queues, lambda: books.config.placement_key)
        # reserve, or take a place in the line, with the queues' quotas (admission_rule.py)
        self._admission = AdmissionRule(books, self._waiting, self._decider, self._reserve, gate)
        # plans preemptions for the heads of the line and holds them (preemption_pass.py)
        self._preemption = PreemptionPass(
            books, adoption.claims, self._queues, self._plans, self._waiting, LedgerView(self), gate
        )

    # ------------------------------------------------------------------------------------------ inventory
    def upsert_node(self, node: NodeInfo) -> None:
        self._books.upsert_node(node)
        self._settle_plans()

    def remove_node(self, name: str) -> None:
        """Forget a node's capacity; what is held on it stays recorded and returns if the node does."""
        self._books.remove_node(name)
        self._settle_plans()

    def topology(self) -> Topology:
        return self._books.topology()

    # ------------------------------------------------------------------------------------------ admission
    def reserve(self, request: Request, now: float) -> Placement | Denial:
        """Reserve for `request.id` (idempotent: a known id returns its placement). A bandwidth no node can
        be checked against is left out, and the placement warns of it (`bandwidth_unchecked`)."""
        request, warning = bandwidth_unchecked(request, self._books.index)
        return with_warning(self._reserve(request, now), warning)

    def _reserve(self, request: Request, now: float) -> Placement | Denial:
        books = self._books
        books.note_time(now)
        existing = books.reservations.get(request.id)
        if existing is not None:
            return existing.placement
        decision = self._decider.decide(request, now)
        if isinstance(decision, Denial):
            return decision
        if isinstance(decision, GroupPlan):
            placed = self._gangs.commit_group(decision, request, now)
        elif isinstance(decision, SlotClaim):
            placed = self._gangs.commit_claim(decision, request, now)
        else:
            placed = self._leases.hold_reserved(decision, now)
        if isinstance(placed, Placement):
            self._queues.reserved(request, placed)
        return placed

    def reserve_or_wait(
        self,
        request: Request,
        now: float,
        may_wait: bool = True,
        backfill_window_s: float = DEFAULT_BACKFILL_WINDOW_S,
    ) -> Placement | Denial | Waiting:
        """Admission with the line in mind (gpuledger.core.queues.admission_rule): a placement when the
        request fits now and no one waits ahead of it for what it would take; else, when it could fit the
        cluster were every GPU free, `Waiting` (nothing reserved; `may_wait=False` turns that into a denial);
        else today's denial."""
        return self._admission.reserve_or_wait(request, now, may_wait, backfill_window_s)

    def place_waiting(self, now: float, backfill_window_s: float = DEFAULT_BACKFILL_WINDOW_S) -> list[Placed]:
        """Place the waiting pods that fit now, in line order (each reserved, RESERVED, under its ticket
        id)."""
        books = self._books
        books.note_time(now)
        self._settle_plans()
        placed: list[Placed] = []
        for wid in self._plans.ready():  # every victim gone: the preemptor takes the nodes kept for it
            self._plans.drop(wid, void=False)
            placed += self._waiting.place_now(wid, now)
        gate = self._gate.get()
        placed += self._waiting.place(now, backfill_window_s, gate)
        self._gate.kept(gate)
        if gate is not None:
            self.plan_preemptions(now)
        self._settle_plans()
        return placed

    # ------------------------------------------------------------------------------------------ preemption
    def plan_preemptions(self, now: float, most: int = 8) -> list[HeldPlan]:
        """Plan preemptions for waiting workloads that do not fit now (the heads of the line, in the fair
        order; at most `most` tried a pass, and one that found no plan is not tried again until something
        changed): each plan found is held, its nodes kept for its preemptor
        (gpuledger.core.passes.preemption_pass). The new plans; none while no GPUQueue exists."""
        return self._preemption.plan(now, most)

    def preemptions(self) -> list[HeldPlan]:
        """Every preemption held, by its preemptor's ticket id."""
        return [p for _, p in sorted(self._plans.plans.items())]

    def preemption_victims(self, plan: HeldPlan) -> list[tuple[str, str, str, str, str]]:
        """(namespace, name, uid, rule, why) of each of the plan's victim pods still stored."""
        return [(*pod, v.rule, v.why) for v, pod in plan.present(self._queues.pods)]

    def eviction_refused(self, plan_id: str, namespace: str, name: str, now: float) -> None:
        """The API server refused to evict a victim of plan `plan_id`: the plan is dropped (its nodes free),
        and the victim's workload is left out of plans for `refused_victim_s`; the next pass plans again."""
        self._preemption.eviction_refused(plan_id, namespace, name, now)

    @property
    def refused_victim_s(self) -> float:
        """How long a victim whose eviction was refused is left out of plans (seconds)."""
        return self._plans.refused_victim_s

    @refused_victim_s.setter
    def refused_victim_s(self, seconds: float) -> None:
        self._plans.refused_victim_s = seconds

    @property
    def replan_s(self) -> float:
        """How long a waiting workload that found no preemption plan waits at the least before it is tried
        again (seconds)."""
        return self._preemption.replan_s

    @replan_s.setter
    def replan_s(self, seconds: float) -> None:
        self._preemption.replan_s = seconds

    def _settle_plans(self, adopt: Iterable[str] = ()) -> None:
        self._preemption.changed()
        plans = self._plans
        if plans.plans or adopt:
            plans.settle(self._waiting.key_of, adopt, self._waiting.request_of)

    def waiting_line(self, limit: int | None = None) -> list[LineEntry]:
        """The waiting pods, first to last."""
        return self._waiting.in_order(limit)

    def waiting_count(self) -> int:
        return len(self._waiting.queued)

    def waiting_by_priority(self) -> dict[int, int]:
        """Waiting pods (those placing left out) per priority."""
        out: dict[int, int] = {}
        reserved = self._books.reservations
        for wid, w in self._waiting.queued.items():
            if wid not in reserved:
                out[w.request.priority] = out.get(w.request.priority, 0) + 1
        return out

    def oldest_arrival(self) -> float | None:
        """The arrival of the first waiting pod to arrive (those placing left out), None when none waits."""
        reserved, queued = self._books.reservations, self._waiting.queued
        return min((w.arrival for wid, w in queued.items() if wid not in reserved), default=None)

    def could_fit(self, request: Request) -> bool:
        """Whether the request would fit the cluster were every GPU free
        (gpuledger.core.placing.ever_fits)."""
        return self._waiting.could_fit(bandwidth_unchecked(request, self._books.index)[0])

    def waiting_answer(self, request: Request, now: float, denial: Denial) -> Waiting:
        """The `Waiting` answer `reserve_or_wait` would give a request denied for now (a dry run's)."""
        return waiting_answer(request, now, self._waiting.position(rank_of(request, now)), denial, "")

    def explain(self, request: Request, with_scores: bool = True, now: float | None = None) -> Explanation:
        """The decision `reserve` would make now, with every node's score or reasons; reserves nothing.
        `with_scores=False` skips the per-node table (a dry run needs only the decision). With `now` and GPU
        queues: for a request that would wait, its queue's refusal and the preemption it could make (or
        why none), in `preemption`."""
        request, warning = bandwidth_unchecked(request, self._books.index)
        explanation = self._decider.explain(request, with_scores)
        if warning:
            explanation = replace(explanation, result=with_warning(explanation.result, warning))
        if now is not None and self._queues.active:
            words = self._preemption.words(request, explanation.result, now)
            if words:
                explanation = replace(explanation, preemption=words)
        return explanation

    # ------------------------------------------------------------------------------------------ lifecycle
    def get(self, id: str) -> Placement | None:
        res = self._books.reservations.get(id)
        return None if res is None else res.placement

    def issued(self, id: str) -> Placement | None:
        """The placement as admission issued it (what its pod carries), even where the ledger has since moved
        a pending reservation off a device the node's kubelet gives another pod."""
        res = self._books.reservations.get(id)
        return None if res is None else res.issued or res.placement

    def state_of(self, id: str) -> ReservationState | None:
        res = self._books.reservations.get(id)
        return None if res is None else res.state

    def confirm(self, id: str, now: float) -> bool:
        """A stored pod carrying `id` was seen: the reservation no longer expires."""
        return self._leases.confirm(id, now)

    def release(self, id: str) -> bool:
        """Free what `id` holds (a reservation, an unclaimed group slot id, or a counted pod). Idempotent."""
        self._queues.released(id)
        freed = self._leases.release(id)
        self._settle_plans()
        return freed

    def expiry_candidates(self, now: float) -> list[str]:
        """Ids of unconfirmed reservations older than the TTL, and unclaimed group slots past the deadline."""
        return self._leases.expiry_candidates(now)

    def expire(self, now: float) -> list[str]:
        expired = self._leases.expire(now)
        for rid in expired:
            self._queues.released(rid)
        if expired:
            self._settle_plans()
        return expired

    # ---------------------------------------------------------------------------------------- cluster objects
    def apply_object(self, obj: dict, now: float) -> None:
        """An ADDED/MODIFIED Node, Pod, GPUQueue, Namespace or PodDisruptionBudget (or a List of them)."""
        plans = self._plans
        if plans.plans:
            plans.lift()
        self._adoption.apply_object(obj, now)
        self._waiting.observe(obj)
        book = self._queues
        book.observe(obj)
        self._settle_plans(book.recording if book.recording and book.active else ())

    def delete_object(self, obj: dict) -> None:
        plans = self._plans
        if plans.plans:
            plans.lift()
        self._adoption.delete_object(obj)
        self._waiting.observe_deleted(obj)
        self._queues.observe_deleted(obj)
        self._settle_plans()

    @classmethod
    def rebuild(cls, objects: Iterable[dict], config: LedgerConfig | None = None, now: float = 0.0) -> Ledger:
        """A ledger holding exactly what the given objects (nodes, pods, GPU queues, namespaces,
        PodDisruptionBudgets) say is held."""
        return drain(cls.rebuild_in_steps(objects, config, now, 0))

    @classmethod
    def rebuild_in_steps(
        cls, objects: Iterable[dict], config: LedgerConfig | None = None, now: float = 0.0, step: int = 1000
    ) -> Steps[Ledger]:
        """`rebuild`, pausing after every `step` objects; the ledger is the generator's return value. Lets a
        caller keep serving from the ledger this one replaces while it is built."""
        ledger = cls(config)
        ledger._books.note_time(now)
        passing = ledger._queues.passing(ledger._waiting.passing(objects))
        yield from ledger._adoption.load_in_steps(passing, now, step)
        book = ledger._queues
        if book.recording and book.active:  # the preemptions the stored preemptors record, held again
            ledger._settle_plans(book.recording)
        return ledger

    def discard(self) -> None:
        """Break the references among this ledger's parts (each holds the books, the books call back into the
        claims, ...), so that refcounting frees all of it once its holder lets go: otherwise only the cyclic
        collector's full pass frees it, and that pass walks the whole heap (seconds at 500,000 pods, every
        admission waiting). The ledger is unusable afterwards; values shared with another ledger (its
        config, the strategies) are left as they are."""
        drain(self.discard_in_steps(0))

    def discard_in_steps(self, step: int) -> Steps[None]:
        """`discard`, pausing after freeing every `step` entries of one of its large tables (0: never): a
        500,000-pod ledger takes ~0.7 s to free."""
        parts = _parts(self)
        if step:
            for part in parts:
                for table in list(vars(part).values()):
                    if type(table) is dict:
                        while len(table) > step:
                            for _ in range(step):
                                table.popitem()
                            yield
        for part in parts:
            vars(part).clear()

    # ------------------------------------------------------------------------------------------ queues
    def queue_of(self, namespace: str) -> str | None:
        """The leaf GPU queue a namespace's workloads belong to; None while no GPUQueue exists."""
        return self._queues.queue_of(namespace)

    def quota_refusal(self, request: Request) -> str | None:
        """Why the request's GPU queue may not take what the ledger would give it now (None: it may, or no
        GPUQueue exists): what `reserve_or_wait` makes it wait for."""
        gate = self._gate.get()
        if gate is None:
            return None
        return gate.refusal(bandwidth_unchecked(request, self._books.index)[0])

    def queue_accounts(self) -> QueueAccounts | None:
        """What the queues' standing is computed from, from the ledger's own books: the queues, those a
        GPUQueue object declares, what each uses, the capacity, and the pods waiting in each (those placing
        left out); None while no GPUQueue exists."""
        book = self._queues
        queues = book.queues
        if queues is None:
            return None
        waiting: dict[str, int] = {}
        reserved = self._books.reservations
        for wid, w in self._waiting.queued.items():
            if wid not in reserved:
                queue = book.queue_of(w.namespace) or queues.default
                waiting[queue] = waiting.get(queue, 0) + 1
        return QueueAccounts(queues, book.declared, book.usage(), book.capacity(), waiting)

    def disruption_allowances(self) -> dict[str, int]:
        """PodDisruptionBudget "namespace/name" -> the disruptions it allows now (its status)."""
        return self._queues.allowances()

    # ------------------------------------------------------------------------------------------ views
    def snapshot(self) -> dict:
        """Canonical state (no timestamps, no rotation cursor): equal for a live ledger and its rebuild."""
        snap = self._books.snapshot()
        snap["conflicts"] = self.conflicts()
        snap["waiting"] = self._waiting.snapshot()
        if self._plans.plans:
            snap["preemptions"] = self._plans.snapshot()
        if self._adoption.published:
            snap["resource_slices"] = self._adoption.published.snapshot()
        return snap

    def dra_nodes(self) -> list[PublishedGpus]:
        """The nodes whose GPUs a DRA driver publishes in ResourceSlices and that have none gpuledger places
        (no nvidia.com/gpu in status.allocatable): GPUs this ledger knows of and does not place on."""
        return self._diagnoser.dra_nodes()

    def conflicts(self) -> list[list[str]]:
        """[pod, reservation id, why] for every stored pod holding a placement it does not own (a copy, or a
        second holder of one id): counted as foreign use on its node (gpuledger.core.books.claims)."""
        return self._adoption.claims.conflicts()

    def reservations(self) -> dict[str, Reservation]:
        return dict(self._books.reservations)

    def groups(self) -> dict[str, GroupState]:
        return dict(self._books.groups)

    def device_corrections(self) -> list[list]:
        """[pod, reservation id, node, devices its placement names, devices its node's kubelet says it holds]
        for every stored pod the ledger records on the kubelet's devices (gpuledger.core.books.truth)."""
        return self._adoption.truth.corrections()

    def device_conflicts(self) -> list[list[str]]:
        """[pod, reservation id, why] for every stored pod whose devices its node's kubelet says another pod
        holds: counted as GPUs of unknown identity."""
        return self._adoption.truth.conflicts()

    def renew_external(self) -> None:
        """Apply a changed `config.external_memory_threshold_mib` to every node."""
        self._books.renew_external()

    def stats(self) -> LedgerStats:
        truth = self._adoption.truth
        return replace(
            ledger_stats(self._books),
            conflicts=self._adoption.claims.conflict_count(),
            device_corrections=len(truth.corrected),
            device_conflicts=len(truth.displaced),
        )
