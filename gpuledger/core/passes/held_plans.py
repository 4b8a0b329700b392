"""Preemptions the ledger holds: a plan made (gpuledger.core.queues.preemption) is kept until its preemptor
runs, and while it stands nothing else takes the GPUs of its nodes.

A held plan names its preemptor (the waiting pod's ticket id and pod), its victims (whole workloads, each pod
by namespace, name and uid), and the nodes it keeps: every GPU of those nodes that is free, and every GPU a
victim frees there, is held under a `keep:` holder, so no other pod (waiting or new) is placed on them. Once
every victim pod is gone the keep is lifted and the preemptor is placed at once, through the line's normal
RESERVED path under its ticket id. No victim is planned twice; a victim whose eviction was refused stays out
of plans for a while (time is an input).

Durable: the plan's `record` (JSON, signed with the placement key) is what the sync writes on the preemptor
pod as `gpuledger.io/preempting` before any eviction. A ledger rebuilt from API objects adopts the record of
every waiting pod that carries one: the same kept nodes, the victims still present, so `Ledger.snapshot()`
of the live ledger and of its rebuild agree mid-preemption.

A plan is dropped when its preemptor is placed or leaves the line, when an eviction of its victims is
refused, or when a node it keeps is gone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpuledger.core.books.books import Books
from gpuledger.core.model import Request
from gpuledger.core.nodes.node_state import Holding
from gpuledger.core.queues.preemption import Plan, Running
from gpuledger.core.queues.queue_book import PodFacts, QueueBook
from gpuledger.core.queues.quotas import gpus_text

KEEP = "keep:"  # holder id prefix of the GPUs a plan keeps on a node: keep:<ticket id>@<node>
REFUSED_VICTIM_S = 60.0  # a victim whose eviction was refused is left out of plans this long


@dataclass(frozen=True)
class PlannedVictim:
    """A victim workload (a pod, or a gang's pods) and the rule that allows taking it."""

    workload: str
    rule: str  # gpuledger.core.queues.preemption.Rule's value
    why: str
    pods: tuple[tuple[str, str, str], ...]  # (namespace, name, uid) of each of its pods


@dataclass
class HeldPlan:
    id: str  # the preemptor's ticket id (the reservation id it is placed under)
    preemptor: str  # the pod carrying the record (namespace/name): a gang's first waiting pod
    namespace: str
    name: str
    uid: str
    victims: tuple[PlannedVictim, ...]
    nodes: tuple[str, ...]
    record: str
    message: str
    recorded: bool = False  # the stored preemptor carries `record`

    def present(self, pods: dict[str, PodFacts]) -> list[tuple[PlannedVictim, tuple[str, str, str]]]:
        """Every victim pod still stored (by name and uid), with its workload."""
        out = []
        for v in self.victims:
            for pod in v.pods:
                facts = pods.get(f"{pod[0]}/{pod[1]}")
                if facts is not None and facts.uid == pod[2]:
                    out.append((v, pod))
        return out


def encode_record(plan_id: str, nodes: Iterable[str], victims: Iterable[PlannedVictim], key: bytes) -> str:
    body = {
        "id": plan_id,
        "nodes": sorted(nodes),
        "victims": [
            {"workload": v.workload, "rule": v.rule, "why": v.why, "pods": [list(p) for p in v.pods]}
            for v in victims
        ],
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"plan": body, "sig": _sign(text, key)}, sort_keys=True, separators=(",", ":"))


def decode_record(text: str, key: bytes) -> tuple[str, tuple[str, ...], tuple[PlannedVictim, ...]] | None:
    """(ticket id, nodes, victims) of a record signed with `key`; None for anything else."""
    try:
        outer = json.loads(text)
        body: Any = outer["plan"]
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if not hmac.compare_digest(str(outer.get("sig", "")), _sign(canonical, key)):
            return None
        victims = tuple(
            PlannedVictim(
                str(v["workload"]),
                str(v["rule"]),
                str(v["why"]),
                tuple((str(p[0]), str(p[1]), str(p[2])) for p in v["pods"]),
            )
            for v in body["victims"]
        )
        return str(body["id"]), tuple(str(n) for n in body["nodes"]), victims
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def _sign(text: str, key: bytes) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest() if key else ""


def plan_message(victims: Iterable[PlannedVictim], freed_milli: int) -> str:
    """One line for the preemptor's Event, e.g. "evicting 2 pod(s) (16 GPUs): job/a/x (reclaim: ...)"."""
    victims = list(victims)
    pods = sum(len(v.pods) for v in victims)
    parts = "; ".join(f"{v.workload} ({v.rule}: {v.why})" for v in victims)
    return f"evicting {pods} pod(s) ({gpus_text(freed_milli)} GPUs): {parts}"


class HeldPlans:
    """The plans the ledger holds, the GPUs they keep, and the victims refused for a while."""

    def __init__(self, books: Books, book: QueueBook, key: Callable[[], bytes]):
        self.books = books
        self.book = book
        self.key = key
        self.plans: dict[str, HeldPlan] = {}
        self.refused: dict[str, float] = {}  # workload -> until when it is no victim
        self.voided: set[str] = set()  # records of plans dropped: not adopted again from their pod
        self.refused_victim_s = REFUSED_VICTIM_S

    # ------------------------------------------------------------------ what stands
    def victims(self) -> set[str]:
        return {v.workload for plan in self.plans.values() for v in plan.victims}

    def excluded(self, now: float) -> set[str]:
        """Workloads no new plan may take: those planned already, and those refused for a while."""
        for workload, until in list(self.refused.items()):
            if until <= now:
                del self.refused[workload]
        return self.victims() | set(self.refused)

    def kept_nodes(self) -> dict[str, str]:
        return {node: plan.id for plan in self.plans.values() for node in plan.nodes}

    # ------------------------------------------------------------------ holding
    def hold(self, plan: Plan, preemptor: PodFacts, wid: str, running: dict[str, Running]) -> HeldPlan:
        """Hold a new plan for the waiting pod `preemptor` (ticket `wid`)."""
        victims = []
        for v in plan.victims:
            pods = tuple(
                (f.namespace, f.name, f.uid)
                for f in sorted(self.book.pods_of(running[v.workload.key]), key=_key)
            )
            victims.append(PlannedVictim(v.workload.key, v.rule.value, v.why, pods))
        placement = plan.placement
        nodes = tuple(sorted({placement.node, *(s.node for s in placement.group_plan)}))
        record = encode_record(wid, nodes, victims, self.key())
        held = HeldPlan(
            wid,
            preemptor.key,
            preemptor.namespace,
            preemptor.name,
            preemptor.uid,
            tuple(victims),
            nodes,
            record,
            plan_message(victims, plan.freed_milli),
        )
        self.plans[wid] = held
        self.keep(held)
        return held

    def keep(self, plan: HeldPlan) -> None:
        """Hold every fully free GPU of the plan's nodes under its keep holders."""
        books = self.books
        for node in plan.nodes:
            state = books.index.nodes.get(node)
            if state is None:
                continue
            hid = f"{KEEP}{plan.id}@{node}"
            free = tuple(state.whole_free_devices())
            old = books.holdings.get(hid)
            if old is not None:
                if not free:
                    continue
                books.unhold(hid)
                free = (*old.devices, *free)
            if free:
                books.hold(Holding(hid, node, tuple(sorted(free))))

    def lift(self) -> None:
        """Free every keep (before the ledger follows a change of the cluster: a stored pod's placement is
        adopted as it would be with no plan; `settle` keeps again after)."""
        books = self.books
        for plan in self.plans.values():
            for node in plan.nodes:
                books.unhold(f"{KEEP}{plan.id}@{node}")

    def drop(self, wid: str, void: bool = True) -> HeldPlan | None:
        plan = self.plans.pop(wid, None)
        if plan is None:
            return None
        for node in plan.nodes:
            self.books.unhold(f"{KEEP}{plan.id}@{node}")
        if void:
            self.voided.add(plan.record)
        return plan

    # ------------------------------------------------------------------ following the cluster
    def settle(
        self,
        queued: Callable[[str], str | None],
        adopt: Iterable[str] = (),
        request_of: Callable[[str], Request | None] = lambda wid: None,
    ) -> None:
        """After any change: drop plans whose preemptor left the line or was placed, or whose nodes are
        gone; adopt the records the stored pods `adopt` carry (where the kept nodes still have room for the
        preemptor: `request_of(wid)` is its request); keep again what each plan keeps. `queued(wid)`: the
        pod key of the waiting pod holding ticket `wid`, None when none waits."""
        books, pods = self.books, self.book.pods
        for wid, plan in list(self.plans.items()):
            if (
                queued(wid) is None
                or wid in books.reservations
                or any(n not in books.index.nodes for n in plan.nodes)
            ):
                self.drop(wid, void=False)
                continue
            facts = pods.get(plan.preemptor)
            plan.recorded = facts is not None and facts.preempting == plan.record
        self._adopt(queued, adopt, request_of)
        for plan in self.plans.values():
            self.keep(plan)

    def _room_for(
        self, request: Request | None, nodes: tuple[str, ...], victims: Iterable[PlannedVictim]
    ) -> bool:
        """Whether the kept nodes' free GPUs and those the victims still present hold there are enough for
        the preemptor's whole GPUs (every pod of a gang)."""
        if request is None or request.gpus <= 0:
            return request is not None
        books, pods = self.books, self.book.pods
        room = {}
        for n in nodes:
            state = books.index.nodes.get(n)
            room[n] = state.whole_free if state is not None and state.placeable else 0
        for v in victims:
            for ns, name, uid in v.pods:
                facts = pods.get(f"{ns}/{name}")
                claim = self.book.claims.claim_of(f"{ns}/{name}")
                if (
                    facts is not None
                    and facts.uid == uid
                    and claim is not None
                    and claim.placement.node in room
                ):
                    room[claim.placement.node] += len(claim.placement.devices)
        group = request.group
        wanted = group.size if group is not None and group.size > 1 else 1
        return sum(r // request.gpus for r in room.values()) >= wanted

    def _adopt(
        self,
        queued: Callable[[str], str | None],
        adopt: Iterable[str],
        request_of: Callable[[str], Request | None],
    ) -> None:
        key = self.key()
        kept = self.kept_nodes()
        for pod_key in sorted(adopt):
            facts = self.book.pods.get(pod_key)
            text = facts.preempting if facts is not None else ""
            if facts is None or not text or text in self.voided:
                continue
            decoded = decode_record(text, key)
            if decoded is None:
                continue
            wid, nodes, victims = decoded
            if wid in self.plans or queued(wid) != facts.key or wid in self.books.reservations:
                continue
            if any(n in kept or n not in self.books.index.nodes for n in nodes):
                continue
            if not self._room_for(request_of(wid), nodes, victims):
                continue  # a plan dropped live (its record left on the pod), overtaken since: not kept
            plan = HeldPlan(
                wid,
                facts.key,
                facts.namespace,
                facts.name,
                facts.uid,
                victims,
                nodes,
                text,
                plan_message(victims, 0).replace(" (0 GPUs)", ""),
                recorded=True,
            )
            self.plans[wid] = plan
            kept.update(dict.fromkeys(nodes, wid))

    def ready(self) -> list[str]:
        """Plans every victim of which is gone: their preemptors may be placed now."""
        pods = self.book.pods
        return sorted(wid for wid, plan in self.plans.items() if not plan.present(pods))

    def refused_eviction(self, wid: str, namespace: str, name: str, now: float) -> None:
        """The API server refused to evict a victim of plan `wid`: the plan goes, the victim's workload is
        left out of plans for `refused_victim_s`."""
        plan = self.plans.get(wid)
        if plan is None:
            return
        for v in plan.victims:
            if any(p[0] == namespace and p[1] == name for p in v.pods):
                self.refused[v.workload] = now + self.refused_victim_s
        self.drop(wid)

    # ------------------------------------------------------------------ views
    def snapshot(self) -> list:
        pods = self.book.pods
        return [
            [wid, plan.preemptor, list(plan.nodes), sorted({v.workload for v, _ in plan.present(pods)})]
            for wid, plan in sorted(self.plans.items())
        ]


def _key(f: PodFacts) -> str:
    return f.key
