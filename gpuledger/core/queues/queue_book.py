"""What the ledger knows of GPU queues: the GPUQueue objects (validated as a whole), every namespace's labels,
the PodDisruptionBudgets, and the few facts of each gpuledger pod a queue decision needs (namespace, labels,
priority, start, termination grace, preemption policy, the preemption record it carries).

The one owner of that state: the ledger delegates every GPUQueue, Namespace and PodDisruptionBudget object to
it, and every Pod as well (it keeps only pods carrying a gpuledger placement or a waiting ticket). From it
come each pod's queue, what each queue uses (from the ledger's own books: reservations and the unclaimed
slots of gangs), the cluster's capacity by product, the running workloads a preemption plan may take GPUs
back from, and the PodDisruptionBudgets' allowances.

With no GPUQueue object the book is inactive (`queues` is None): the ledger decides as it did before queues.
A set of GPUQueues that cannot be honoured as a whole (gpuledger.core.queues.gpu_queues.QueueError: a missing
parent, two default queues, a malformed field) is recorded as a problem, and the last good set stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from gpuledger.core.books.books import Books
from gpuledger.core.books.claims import Claims
from gpuledger.core.model import MILLI_PER_GPU, Placement, Request
from gpuledger.core.nodes.node_state import Holding
from gpuledger.core.pods.annotation_values import AnnotationError, read_priority
from gpuledger.core.pods.objects import TERMINAL_PHASES, iter_objects, kind_of, pod_key_of
from gpuledger.core.queues.gpu_queues import (
    LabelSelector,
    QueueError,
    QueueSet,
    label_selector,
    queue_from_object,
)
from gpuledger.core.queues.preemption import Running
from gpuledger.core.queues.quotas import Capacity, ProductCapacity, Usage, Use
from gpuledger.names import (
    GPUQUEUE_KIND,
    PLACEMENT_ANNOTATION,
    PREEMPTING_ANNOTATION,
    PRIORITY,
    QUEUE_LABEL,
    WAITING_ANNOTATION,
)

_TIMES: dict[str, float] = {}  # RFC 3339 text -> seconds (pods started together share theirs)
QUEUE_KINDS = frozenset({GPUQUEUE_KIND, "Namespace", "PodDisruptionBudget"})
DEFAULT_GRACE_S = 30.0  # a pod's terminationGracePeriodSeconds when it sets none (Kubernetes' default)


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What a queue decision reads of one stored gpuledger pod (placed, or waiting in line)."""

    key: str  # namespace/name
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    priority: int
    started: str  # status.startTime, else metadata.creationTimestamp (RFC 3339; "" when neither)
    grace_s: float  # spec.terminationGracePeriodSeconds
    never: bool  # spec.preemptionPolicy: Never
    preempting: str  # its gpuledger.io/preempting record ("" when none)

    @property
    def started_at(self) -> float:
        """`started` in seconds since the epoch (0 when unknown: it has run for ever)."""
        known = _TIMES.get(self.started)
        if known is None:
            if len(_TIMES) > 65536:
                _TIMES.clear()
            known = _TIMES[self.started] = timestamp(self.started)
        return known


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget: the pods it covers and the disruptions it allows now."""

    key: str  # namespace/name
    namespace: str
    selector: LabelSelector | None  # None: it selects no pod
    allowed: int

    def covers(self, pod: PodFacts) -> bool:
        selector = self.selector
        return selector is not None and pod.namespace == self.namespace and selector.matches(pod.labels)


def timestamp(text: str) -> float:
    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).astimezone(UTC).timestamp()
    except ValueError:
        return 0.0


def namespace_queue(queues: QueueSet, namespace: str, labels: Mapping[str, str]) -> tuple[str, str]:
    """The leaf queue a namespace's workloads belong to, and why not the one its labels ask for ("" when
    they ask for it): its `gpuledger.io/queue` label when that names an existing leaf queue, else the queue
    whose namespaceSelector selects it, else the default queue (also when two selectors select it)."""
    named = labels.get(QUEUE_LABEL)
    if named and named in queues and named not in queues.children:
        return named, ""
    try:
        return queues.queue_of(namespace, labels), ""
    except QueueError as exc:
        return queues.default, str(exc)


def holding_milli(h: Holding) -> int:
    return (len(h.devices) + h.unknown_gpus) * MILLI_PER_GPU + sum(s.milli for s in h.shares)


class QueueBook:
    """GPUQueues, namespaces, PodDisruptionBudgets and gpuledger pods, as the cluster's objects say."""

    def __init__(self, books: Books, claims: Claims):
        self.books = books
        self.claims = claims
        self.queue_objects: dict[str, dict] = {}  # GPUQueue name -> its object
        self.queues: QueueSet | None = None  # the last good set; None while no GPUQueue exists
        self.declared: frozenset[str] = frozenset()  # the queues a GPUQueue object declares
        self.namespaces: dict[str, Mapping[str, str]] = {}  # namespace -> its labels
        self.budgets: dict[str, Budget] = {}
        self.pods: dict[str, PodFacts] = {}  # pod key -> facts of a pod with a placement or a ticket
        self.recording: set[str] = set()  # pods carrying a gpuledger.io/preempting record
        # reservation id -> namespace of the request reserved under it (admission's, before its pod is stored)
        self.reserved_in: dict[str, str] = {}
        self.gang_namespace: dict[str, str] = {}  # gang key -> its namespace (for its unclaimed slots)
        self._of: dict[str, str] = {}  # namespace -> its queue (cleared when queues or namespaces change)
        self._deferred = False  # a rebuild under way: the queue set is made once, at its end
        self.version = 0  # moves whenever a namespace's queue may have changed
        # what each node adds to the queues' use and to the capacity, kept up to date from the nodes the
        # index says changed since (`ClusterIndex.touched`): a pass or an admission reads them in O(change)
        self._node_use: dict[str, list[tuple[str, str, int, int, int]]] = {}
        self._node_cap: dict[str, tuple[str, tuple[int, int, int, int]]] = {}
        self._use_sum: dict[tuple[str, str], list[int]] = {}
        self._cap_sum: dict[str, list[int]] = {}
        self._totals_at: tuple[int, int] | None = None  # (index position, version) they were read at
        self._stale: set[str] = set()  # nodes whose pods' namespaces became known since

    # ------------------------------------------------------------------ following the cluster
    def observe(self, obj: object) -> None:
        for item in iter_objects(obj):
            self.observe_one(item)

    def observe_deleted(self, obj: object) -> None:
        for item in iter_objects(obj):
            try:
                kind = kind_of(item)
                meta = item.get("metadata")
                if type(meta) is not dict:
                    continue
                if kind == "Pod":
                    self.pods.pop(pod_key_of(meta), None)
                    self.recording.discard(pod_key_of(meta))
                elif kind == GPUQUEUE_KIND:
                    if self.queue_objects.pop(str(meta.get("name") or ""), None) is not None:
                        self._renew_queues()
                elif kind == "Namespace":
                    self.namespaces.pop(str(meta.get("name") or ""), None)
                    self._of.clear()
                    self.version += 1
                elif kind == "PodDisruptionBudget":
                    self.budgets.pop(f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}", None)
            except (TypeError, AttributeError, ValueError, KeyError) as err:
                self.books.record_problem(f"ignored a malformed deleted object: {type(err).__name__}: {err}")

    def passing(self, objects: Iterable[dict]) -> Iterator[dict]:
        """The objects of a rebuild, each observed on its way through; the queue set is made at the end."""
        self._deferred = True
        try:
            for obj in iter_objects(objects):
                self.observe_one(obj)
                yield obj
        finally:
            self._deferred = False
        self._renew_queues()

    def observe_one(self, item: dict) -> None:
        try:
            kind = kind_of(item)
            if kind == "Pod":
                self._observe_pod(item)
            elif kind in QUEUE_KINDS:
                meta = item.get("metadata")
                if type(meta) is not dict:
                    raise ValueError("metadata is missing")
                if kind == GPUQUEUE_KIND:
                    self.queue_objects[str(meta.get("name") or "")] = item
                    self._renew_queues()
                elif kind == "Namespace":
                    labels = meta.get("labels")
                    self.namespaces[str(meta.get("name") or "")] = (
                        {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
                    )
                    self._of.clear()
                    self.version += 1
                else:
                    self._observe_budget(item, meta)
        except (TypeError, AttributeError, ValueError, KeyError, QueueError) as err:
            self.books.record_problem(f"ignored a malformed {kind_of(item) or 'object'}: {err}")

    def _renew_queues(self) -> None:
        if self._deferred:
            return
        self._of.clear()
        self.version += 1
        if not self.queue_objects:
            self.queues, self.declared = None, frozenset()
            return
        try:
            parsed = [queue_from_object(o) for _, o in sorted(self.queue_objects.items())]
            self.queues = QueueSet(parsed)
            self.declared = frozenset(q.name for q in parsed)
        except QueueError as exc:
            kept = "none is honoured" if self.queues is None else "the last good set stays"
            self.books.record_problem(f"GPUQueues cannot be honoured as a whole ({kept}): {exc}")

    def _observe_budget(self, item: dict, meta: dict) -> None:
        namespace = str(meta.get("namespace") or "default")
        key = f"{namespace}/{meta.get('name') or ''}"
        spec = item.get("spec")
        raw = spec.get("selector") if isinstance(spec, dict) else None
        selector = None if raw is None else label_selector(f"PodDisruptionBudget {key}: spec.selector", raw)
        status = item.get("status")
        allowed = status.get("disruptionsAllowed", 0) if isinstance(status, dict) else 0
        if isinstance(allowed, bool) or not isinstance(allowed, int):
            allowed = 0
        self.budgets[key] = Budget(key, namespace, selector, max(0, allowed))

    def _observe_pod(self, pod: dict) -> None:
        meta = pod.get("metadata")
        if type(meta) is not dict:
            return
        key = pod_key_of(meta)
        annotations = meta.get("annotations")
        status = pod.get("status")
        if (
            type(annotations) is not dict
            or (PLACEMENT_ANNOTATION not in annotations and WAITING_ANNOTATION not in annotations)
            or (isinstance(status, dict) and status.get("phase") in TERMINAL_PHASES)
        ):
            if self.pods:
                self.pods.pop(key, None)
                self.recording.discard(key)
            return
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            spec = {}
        labels = meta.get("labels")
        started = (status.get("startTime") if isinstance(status, dict) else None) or meta.get(
            "creationTimestamp"
        )
        grace = spec.get("terminationGracePeriodSeconds")
        self.pods[key] = PodFacts(
            key=key,
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            labels=labels if isinstance(labels, dict) else {},
            priority=_priority(spec, annotations),
            started=started if isinstance(started, str) else "",
            grace_s=_seconds(grace, DEFAULT_GRACE_S),
            never=spec.get("preemptionPolicy") == "Never",
            preempting=str(annotations.get(PREEMPTING_ANNOTATION) or ""),
        )
        claim = self.claims.claim_of(key)
        if claim is not None:  # its reservation's use counts in its pod's namespace now
            self._stale.add(claim.placement.node)
            if self.reserved_in:
                self.reserved_in.pop(claim.placement.id, None)
        if PREEMPTING_ANNOTATION in annotations:
            self.recording.add(key)
        elif self.recording:
            self.recording.discard(key)

    # ------------------------------------------------------------------ admission's notes
    def reserved(self, request: Request, placement: Placement) -> None:
        """A reservation was made for `request`: its namespace counts its use until its pod is stored."""
        if request.namespace:
            self.reserved_in[placement.id] = request.namespace
            if placement.group is not None:
                gangs = self.gang_namespace
                gangs[placement.group] = request.namespace
                if len(gangs) > 2 * len(self.books.groups) + 1024:  # forget the gangs gone
                    live = self.books.groups
                    self.gang_namespace = {g: ns for g, ns in gangs.items() if g in live}

    def released(self, rid: str) -> None:
        self.reserved_in.pop(rid, None)

    # ------------------------------------------------------------------ reading
    @property
    def active(self) -> bool:
        return self.queues is not None

    def queue_of(self, namespace: str) -> str | None:
        """The leaf queue of a namespace's workloads; None while no GPUQueue exists."""
        queues = self.queues
        if queues is None:
            return None
        known = self._of.get(namespace)
        if known is None:
            labels = self.namespaces.get(namespace, {})
            known = self._of[namespace] = namespace_queue(queues, namespace, labels)[0]
        return known

    def namespace_of(self, rid: str) -> str:
        """The namespace a reservation's use counts in: its stored pod's, else its request's ("" unknown)."""
        claim_holder = self._holder_key(rid)
        if claim_holder is not None:
            return claim_holder.split("/", 1)[0]
        return self.reserved_in.get(rid, "")

    def _holder_key(self, rid: str) -> str | None:
        owner = self.claims.owner_of(rid)
        return owner.key if owner is not None else None

    def product(self, node: str) -> str:
        state = self.books.index.nodes.get(node)
        return state.info.product if state is not None else ""

    def use_of(self, holdings: Iterable[Holding]) -> Use:
        return Use.of((self.product(h.node), holding_milli(h), h.cpu_milli, h.memory_mib) for h in holdings)

    def usage(self) -> Usage:
        """What each queue uses now: every reservation and every gang's unclaimed slot, in the queue of its
        namespace."""
        queues = self.queues
        assert queues is not None
        self._refresh()
        usage = Usage(queues)
        for (queue, product), (milli, cpu, memory) in sorted(self._use_sum.items()):
            if milli or cpu or memory:
                usage.add(queue, Use(((product, milli, cpu, memory),)))
        return usage

    def capacity(self) -> Capacity:
        """Every node with GPUs, summed by product (as gpuledger.core.queues.ledger_view counts it)."""
        self._refresh()
        return Capacity({p: ProductCapacity(*v) for p, v in sorted(self._cap_sum.items()) if any(v)})

    def _refresh(self) -> None:
        """Bring the per-node totals up to date: the nodes touched since they were read, or all of them
        (the first time, after the queues or a namespace changed, or when the index's log moved on)."""
        books = self.books
        index = books.index
        now_at = index.touched_base + len(index.touched)
        at = self._totals_at
        if at is not None and at == (now_at, self.version) and not self._stale:
            return
        if at is None or at[1] != self.version or at[0] < index.touched_base or now_at - at[0] > 4096:
            self._node_use.clear()
            self._node_cap.clear()
            self._use_sum.clear()
            self._cap_sum.clear()
            names: Iterable[str] = {*index.nodes, *books.node_holders}
            self._stale.clear()
        else:
            names = {*index.touched[at[0] - index.touched_base :], *self._stale}
        self._stale.clear()
        for name in names:
            self._renode(name)
        self._totals_at = (now_at, self.version)

    def _renode(self, name: str) -> None:
        books = self.books
        queues = self.queues
        assert queues is not None
        for queue, product, milli, cpu, memory in self._node_use.pop(name, ()):
            v = self._use_sum[(queue, product)]
            v[0] -= milli
            v[1] -= cpu
            v[2] -= memory
        old = self._node_cap.pop(name, None)
        if old is not None:
            c = self._cap_sum[old[0]]
            for i in range(4):
                c[i] -= old[1][i]
        state = books.index.nodes.get(name)
        product = state.info.product if state is not None else ""
        if state is not None and state.dev_index:
            cap = (
                state.total_milli,
                state.free_milli if state.placeable else 0,
                state.info.cpu_milli,
                state.info.memory_mib,
            )
            self._node_cap[name] = (product, cap)
            c = self._cap_sum.setdefault(product, [0, 0, 0, 0])
            for i in range(4):
                c[i] += cap[i]
        uses = []
        reservations, slot_of, holdings = books.reservations, books.slot_of, books.holdings
        for hid in books.node_holders.get(name, ()):
            h = holdings.get(hid)
            if h is None:
                continue
            if hid in reservations:
                namespace = self.namespace_of(hid)
            elif hid in slot_of:
                namespace = self.gang_namespace.get(slot_of[hid][0], "")
            else:
                continue  # a pod gpuledger did not place, a node's own truth, a plan's keep
            queue = (self.queue_of(namespace) if namespace else None) or queues.default
            use = (queue, product, holding_milli(h), h.cpu_milli, h.memory_mib)
            uses.append(use)
            v = self._use_sum.setdefault((queue, product), [0, 0, 0])
            v[0] += use[2]
            v[1] += use[3]
            v[2] += use[4]
        if uses:
            self._node_use[name] = uses

    def allowances(self) -> dict[str, int]:
        """PodDisruptionBudget "ns/name" -> the disruptions it allows now."""
        return {key: b.allowed for key, b in self.budgets.items()}

    def running(self, exclude: set[str] = frozenset()) -> list[Running]:  # type: ignore[assignment]
        """Every workload running on GPUs the ledger placed whose pods are stored: a pod, or a gang's pods
        together (one victim), with its queue, priority (the highest of its pods), start (the latest),
        PodDisruptionBudgets and termination grace. Workloads named in `exclude` are left out."""
        budgets = [b for b in self.budgets.values() if b.selector is not None]
        out: list[Running] = []
        for workload, members in self._running_members(exclude).items():
            if len(members) == 1 and workload == members[0][0].key:  # one pod, not a gang's: the short way
                out.append(self._running_pod(workload, *members[0], budgets))
            else:
                out.append(self._running_gang(workload, members, budgets))
        return out

    def _running_members(self, exclude: set[str]) -> dict[str, list[tuple[PodFacts, str]]]:
        """Workload (a gang's key, else the pod's) -> its stored pods that own their placement's reservation,
        with the reservation id."""
        books = self.books
        claims = self.claims
        by_workload: dict[str, list[tuple[PodFacts, str]]] = {}
        for key, facts in self.pods.items():
            claim = claims.claim_of(key)
            if claim is None:
                continue
            rid = claim.placement.id
            owner = claims.owner_of(rid)
            if owner is None or owner.key != key or rid not in books.reservations:
                continue
            group = claim.placement.group
            workload = group if group is not None else key
            if workload in exclude:
                continue
            by_workload.setdefault(workload, []).append((facts, rid))
        return by_workload

    def _running_pod(self, workload: str, facts: PodFacts, rid: str, budgets: list) -> Running:
        queues = self.queues
        assert queues is not None
        h = self.books.holdings.get(rid)
        covered_by = tuple((b.key, 1) for b in budgets if b.covers(facts)) if budgets else ()
        return Running(
            workload,
            self.queue_of(facts.namespace) or queues.default,
            facts.priority,
            facts.started_at,
            (rid,),
            Use(((self.product(h.node), holding_milli(h), h.cpu_milli, h.memory_mib),))
            if h is not None
            else Use(),
            1,
            covered_by,
            facts.grace_s,
        )

    def _running_gang(self, workload: str, members: list[tuple[PodFacts, str]], budgets: list) -> Running:
        """A gang's stored pods as one workload: what its pods hold and its unclaimed slots keep."""
        queues = self.queues
        assert queues is not None
        books = self.books
        rids = tuple(sorted(rid for _, rid in members))
        holdings: dict[str, Holding] = {}
        for rid in rids:
            h = books.holdings.get(rid)
            if h is not None:
                holdings[rid] = h
            placement = books.reservations[rid].placement
            gang = books.groups.get(placement.group) if placement.group is not None else None
            if gang is not None:
                for slot, who in gang.claims.items():
                    hid = f"{placement.group}#slot{slot}"
                    if who is None and hid in books.holdings:
                        holdings[hid] = books.holdings[hid]
        covered: dict[str, int] = {}
        for facts, _ in members:
            for b in budgets:
                if b.covers(facts):
                    covered[b.key] = covered.get(b.key, 0) + 1
        first = members[0][0]
        return Running(
            key=workload,
            queue=self.queue_of(first.namespace) or queues.default,
            priority=max(f.priority for f, _ in members),
            started=max(f.started_at for f, _ in members),
            holders=rids,
            use=self.use_of(holdings[k] for k in sorted(holdings)),
            pods=len(members),
            budgets=tuple(sorted(covered.items())),
            grace_s=max(f.grace_s for f, _ in members),
        )

    def pods_of(self, workload: Running) -> list[PodFacts]:
        """The stored pods of a running workload (its holders' owners)."""
        out = []
        for rid in workload.holders:
            key = self._holder_key(rid)
            facts = self.pods.get(key) if key is not None else None
            if facts is not None:
                out.append(facts)
        return out


def _priority(spec: Mapping, annotations: Mapping) -> int:
    """The priority annotation, else spec.priority (as gpuledger.core.pods.request reads a pod's), else 0."""
    text = annotations.get(PRIORITY)
    if text is not None:
        try:
            return read_priority(PRIORITY, text)
        except AnnotationError:
            pass
    value = spec.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _seconds(raw: object, default: float) -> float:
    return float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else default
