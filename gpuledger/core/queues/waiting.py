"""The ledger's line of waiting pods: GPU pods that could fit the cluster but not now, admitted gated and
holding nothing, placed in order the moment GPUs free.

The line is a function of the cluster's objects alone: every stored pod that carries gpuledger's scheduling
gate and a validly signed `gpuledger.io/waiting` ticket issued for it (gpuledger.core.pods.waiting_codec)
waits, in the order of gpuledger.core.queues.queue_rule (priority, then the arrival the ledger stamped, with
the bounded backfill window). So a ledger rebuilt from nodes and pods holds the same line as the live one. A
gang waits whole: its pods form one entry, placed together once every slot of its plan can be placed.

Indexed by pod shape: pods of one shape (`Request.shape()`: everything but their identity, priority
included) get the same answer in the same state, so when the first of a shape does not fit, none of it does,
and it is not asked again until a node it could use changes. A pass on a freeing event asks only the lines
whose head might fit a node touched since they last failed (`ClusterIndex.touched`), in line order, instead
of every waiting pod. What a pass places is reserved at once (RESERVED, under the ticket's id): nothing is
promised twice between the decision and the gate's removal, and the reservation is confirmed when the pod
comes back placed.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import islice
from typing import Protocol

from gpuledger.core.books.books import Books
from gpuledger.core.model import Denial, Placement, Reason, Request, ReservationState
from gpuledger.core.nodes.node_state import NodeState
from gpuledger.core.placing.ever_fits import EverFits
from gpuledger.core.placing.filters import Filters
from gpuledger.core.placing.selection import Selector
from gpuledger.core.plugins.registry import canonical_name, get_strategy
from gpuledger.core.pods.objects import TERMINAL_PHASES, iter_objects, kind_of, pod_key_of
from gpuledger.core.pods.waiting_codec import WaitTicket, ticket_for
from gpuledger.core.queues.queue_rule import DEFAULT_BACKFILL_WINDOW_S, is_barrier, order_key
from gpuledger.names import (
    DEVICE_INDICES_ANNOTATION,
    SCHEDULING_GATE,
    VISIBLE_DEVICES_ANNOTATION,
    WAITING_ANNOTATION,
)

# a line whose failure had a cause beyond single nodes is asked again whenever any node changed
_WIDE_REASONS = frozenset({Reason.PRIORITY_HEADROOM, Reason.LEAF_CONSTRAINT})
# more nodes than this touched since a line last failed: ask it again rather than try each node
_TOUCHED_CHECKED = 64
HINTS_KEPT = 4096
_NO_TIME = "~"  # sorts after every RFC 3339 timestamp: a pod without creationTimestamp comes last


@dataclass(frozen=True)
class Waiter:
    """One waiting pod: the stored pod and the ticket it carries."""

    key: str  # namespace/name
    namespace: str
    name: str
    uid: str
    request: Request  # as admission parsed it; its id is the reservation id it is placed under
    arrival: float  # stamped by the ledger at admission
    claim_order: tuple[str, str, str]  # (creationTimestamp, uid, key): who keeps an id two pods carry

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def rank(self) -> tuple[int, float, str]:
        return order_key(self.request.priority, self.arrival, self.request.id)


@dataclass(frozen=True)
class Waiting:
    """The ledger's answer to a pod that does not fit now but could fit the cluster were it empty: admit it
    gated, holding nothing. `position` is 1-based; `message` says what it waits for, e.g. "waiting for 8 GPUs
    on one node; 3rd in line; nearest: leaf-2-node-1 has 5 free"."""

    id: str
    request: Request
    arrival: float
    position: int
    message: str
    reason: str = ""  # why not now: the ledger's denial for this moment, or what it waits behind


@dataclass(frozen=True)
class Placed:
    """A waiting pod the ledger has just placed (and reserved for): what the placement adapter writes."""

    key: str
    namespace: str
    name: str
    uid: str
    placement: Placement
    arrival: float
    request: Request


@dataclass(frozen=True)
class LineEntry:
    """One waiting pod as the line shows it."""

    position: int
    waiter: Waiter
    placing: bool  # placed, its gate not yet removed


class LineGate(Protocol):
    """The GPU queues' say in a pass (gpuledger.core.queues.queue_gate): the fair order among queues, and
    quotas. Without one (no GPUQueue exists) the line is in rank order alone and no quota applies."""

    def key(self, request: Request) -> tuple:
        """The fair-order key of the request's queue (smaller first); it only grows as the pass places."""

    def refusal(self, request: Request) -> str | None:
        """Why the request's queue may not take what the ledger would give it now (None: it may)."""

    def placed(self, request: Request, placement: Placement) -> None:
        """A placement was made for the request."""


def line_key(req: Request) -> Hashable:
    """The line a request waits in: its gang, its own (pinned), or its shape."""
    if req.group is not None and req.group.size > 1:
        return ("gang", req.group.key)
    shape = req.shape()
    if shape is None:
        return ("one", req.id)
    return ("shape", shape)


class _Line:
    """The waiters of one line, in rank order, and what is known of why its head did not fit."""

    __slots__ = ("any_touch", "blocked_at", "entries", "members", "over_quota", "strategy")

    def __init__(self) -> None:
        self.entries: list[tuple[tuple[int, float, str], str]] = []  # (rank, id), sorted
        self.members: dict[str, Waiter] = {}  # id -> waiter
        self.blocked_at: int | None = None  # index position at which the head last failed (None: unknown)
        self.strategy = ""  # the strategy it failed under
        self.any_touch = False  # the failure was not node by node: ask again on any change
        self.over_quota = ""  # its head fits but its queue may not take it (asked again every pass)

    def add(self, w: Waiter) -> None:
        self.members[w.id] = w
        insort(self.entries, (w.rank, w.id))

    def remove(self, w: Waiter) -> None:
        del self.members[w.id]
        del self.entries[bisect_left(self.entries, (w.rank, w.id))]

    def undecided(self, reserved: Mapping[str, object]) -> Iterator[Waiter]:
        for _, wid in self.entries:
            if wid not in reserved:
                yield self.members[wid]

    def head(self, reserved: Mapping[str, object]) -> Waiter | None:
        """The first waiter not placing (what `undecided` yields first, without a generator: every pass asks
        it of every line)."""
        for _, wid in self.entries:
            if wid not in reserved:
                return self.members[wid]
        return None


def gated(pod: Mapping) -> bool:
    spec = pod.get("spec")
    gates = spec.get("schedulingGates") if isinstance(spec, dict) else None
    return isinstance(gates, list) and any(
        isinstance(g, dict) and g.get("name") == SCHEDULING_GATE for g in gates
    )


def waiter_of(pod: dict, key: bytes | str) -> Waiter | None:
    """The waiter a stored pod is, or None: not gated by gpuledger, terminal, or without a valid ticket
    issued for it."""
    meta = pod.get("metadata")
    if type(meta) is not dict:
        return None
    annotations = meta.get("annotations")
    text = annotations.get(WAITING_ANNOTATION) if type(annotations) is dict else None
    if text is None or not gated(pod):
        return None
    status = pod.get("status")
    if isinstance(status, dict) and status.get("phase") in TERMINAL_PHASES:
        return None
    ticket: WaitTicket | None = ticket_for(text, key, pod)
    if ticket is None:
        return None
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    pod_key = pod_key_of(meta)
    request = ticket.request
    if request.name != name or request.namespace != namespace:
        request = replace(request, name=name, namespace=namespace)
    created = meta.get("creationTimestamp")
    return Waiter(
        pod_key,
        namespace,
        name,
        uid,
        request,
        ticket.arrival,
        (created if type(created) is str and created else _NO_TIME, uid, pod_key),
    )


def device_annotations(placement: Placement) -> dict[str, str]:
    """What a placed pod that waited carries for its containers' device variables, which read them through
    the downward API as they start (their env was written at admission, before the placement): the GPUs'
    UUIDs for NVIDIA_VISIBLE_DEVICES (their physical indices where the node published no UUIDs), and the
    physical indices for CUDA_VISIBLE_DEVICES where the runtime exposes every GPU (host-indices)."""
    indices = [*placement.devices, *(s.device for s in placement.shares)]
    known = placement.uuids if len(placement.uuids) == len(indices) and all(placement.uuids) else None
    listed = ",".join(map(str, indices))
    return {
        VISIBLE_DEVICES_ANNOTATION: ",".join(known) if known else listed,
        DEVICE_INDICES_ANNOTATION: listed,
    }


def rank_of(req: Request, arrival: float) -> tuple[int, float, str]:
    return order_key(req.priority, arrival, req.id)


def ordinal(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def wants(req: Request) -> str:
    """What a waiting request waits for, in a few words."""
    if req.is_shared:
        what = f"a share of one GPU ({req.gpu_milli} milli-GPU, {req.gpu_memory_mib} MiB)"
    else:
        what = f"{req.gpus} GPU{'s' if req.gpus != 1 else ''}"
    if req.pinned is not None:
        return f"GPU(s) {list(req.pinned.devices)} on {req.pinned.node} (gpu-scheduling-map)"
    if req.group is not None and req.group.size > 1:
        return f"{req.group.size} pods x {what} (gang {req.group.key})"
    return f"{what} on one node"


def waiting_answer(
    req: Request, arrival: float, position: int, denial: Denial | None, behind: str
) -> Waiting:
    """The `Waiting` answer and its message, e.g. "waiting for 8 GPUs on one node; 3rd in line; nearest:
    leaf-2-node-1 has 5 free"."""
    parts = [f"waiting for {wants(req)}", f"{ordinal(position)} in line"]
    if behind:
        parts.append(f"it fits now, but {behind}")
    elif denial is not None and denial.near_misses:
        best = denial.near_misses[0]
        parts.append(f"nearest: {best.node} has {best.free_gpus} free")
    return Waiting(
        req.id, req, arrival, position, "; ".join(parts), behind or (denial.message if denial else "")
    )


class WaitingLine:
    """Every waiting pod of the cluster, in line, and the passes that place them.

    `reserve(request, now)` is the ledger's own (a Placement or a Denial). What the line holds changes only
    through `observe_pod` and `forget_pod` (the cluster's objects); `place(now)` reserves for the pods it
    places but changes no waiter: each leaves the line when its pod comes back placed (or is deleted)."""

    def __init__(
        self,
        books: Books,
        filters: Filters,
        selector: Selector,
        reserve: Callable[[Request, float], Placement | Denial],
        release: Callable[[str], bool],
    ):
        self.books = books
        self.filters = filters
        self.selector = selector
        self.reserve = reserve
        self.release = release
        self.ever = EverFits(books, filters)
        self.waiters: dict[str, Waiter] = {}  # pod key -> every gated pod carrying a valid ticket
        self.carriers: dict[str, set[str]] = {}  # ticket id -> pod keys carrying it
        self.queued: dict[str, Waiter] = {}  # ticket id -> the waiter holding its place (the first carrier)
        self.lines: dict[Hashable, _Line] = {}
        self.placing: set[str] = set()  # ticket ids a pass placed whose pods have not come back placed
        # ticket id -> (index position, strategy) at which admission found it did not fit: a new line starts
        # from there (its pod is stored after that), not from "unknown"
        self.hints: dict[str, tuple[int, str]] = {}

    # ------------------------------------------------------------------ following the cluster
    def observe(self, obj: object) -> None:
        """ADDED/MODIFIED objects (or a List of them): each pod joins or leaves the line."""
        for item in iter_objects(obj):
            if kind_of(item) == "Pod":
                self.observe_pod(item)

    def observe_deleted(self, obj: object) -> None:
        for item in iter_objects(obj):
            meta = item.get("metadata")
            if kind_of(item) == "Pod" and type(meta) is dict:
                self.forget_pod(pod_key_of(meta))

    def passing(self, objects: Iterable[dict]) -> Iterator[dict]:
        """The objects of a rebuild, each pod observed on its way through."""
        for obj in iter_objects(objects):
            if obj.get("kind") == "Pod" or kind_of(obj) == "Pod":
                self.observe_pod(obj)
            yield obj

    def observe_pod(self, pod: dict) -> None:
        """A pod added or modified: in line while it is gated with a valid ticket, out of it otherwise (a pod
        that ended leaves as a deleted one does). Never raises on a malformed pod."""
        try:
            w = waiter_of(pod, self.books.config.placement_key)
            if w is None:
                if self.waiters:
                    meta = pod.get("metadata")
                    if type(meta) is dict:
                        status = pod.get("status")
                        ended = isinstance(status, dict) and status.get("phase") in TERMINAL_PHASES
                        (self.forget_pod if ended else self._drop)(pod_key_of(meta))
                return
        except (TypeError, AttributeError, ValueError, KeyError) as err:
            self.books.record_problem(f"ignored a malformed waiting pod: {type(err).__name__}: {err}")
            return
        old = self.waiters.get(w.key)
        if old == w:
            return
        if old is not None:
            self._drop(w.key)
        self.waiters[w.key] = w
        self.carriers.setdefault(w.id, set()).add(w.key)
        self._elect(w.id)

    def forget_pod(self, pod_key: str) -> None:
        """A pod deleted: it leaves the line, and what a pass had reserved for it is freed (no trace)."""
        w = self.waiters.get(pod_key)
        if w is None:
            return
        was_queued = self.queued.get(w.id) is w
        self._drop(pod_key)
        if was_queued and w.id not in self.queued:
            res = self.books.reservations.get(w.id)
            if res is not None and res.state == ReservationState.RESERVED:
                self.release(w.id)

    def _drop(self, pod_key: str) -> None:
        w = self.waiters.pop(pod_key, None)
        if w is None:
            return
        keys = self.carriers.get(w.id)
        if keys is not None:
            keys.discard(pod_key)
            if not keys:
                del self.carriers[w.id]
        self._elect(w.id)

    def _elect(self, wid: str) -> None:
        """The carrier of `wid` that holds its place: the first by claim order (as for placements)."""
        keys = self.carriers.get(wid)
        best = min((self.waiters[k] for k in keys), key=lambda w: w.claim_order) if keys else None
        current = self.queued.get(wid)
        if current is best:
            return
        if current is not None:
            lk = line_key(current.request)
            old = self.lines[lk]
            old.remove(current)
            if not old.members:
                del self.lines[lk]
            del self.queued[wid]
            self.placing.discard(wid)
        if best is not None:
            lk = line_key(best.request)
            new = self.lines.get(lk)
            if new is None:
                new = self.lines[lk] = _Line()
                hint = self.hints.pop(wid, None)
                if hint is not None:
                    new.blocked_at, new.strategy = hint
                    new.any_touch = best.request.group is not None or best.request.pinned is not None
            new.add(best)
            self.queued[wid] = best

    # ------------------------------------------------------------------ admission
    def could_fit(self, req: Request) -> bool:
        return self.ever.could_fit(req)

    def must_wait(
        self, req: Request, now: float, backfill_window_s: float, gate: LineGate | None = None
    ) -> str:
        """Why a newcomer must wait although it may fit now ("" when it need not): a pod ahead of it in line
        has waited past the backfill window (a barrier: nothing behind it starts), or may fit now on what
        freed since it last failed (its turn comes first, at the next pass). With GPU queues (`gate`), ahead
        means first in the fair order, then in rank; a head its queue's quota holds back is ahead of no
        one."""
        if not self.queued:
            return ""
        rank = order_key(req.priority, now, req.id)
        own_key = gate.key(req) if gate is not None else ()
        reserved = self.books.reservations
        own = line_key(req) if req.group is not None and req.group.key in self.books.groups else None
        for lk, line in self.lines.items():
            if lk == own:  # its gang is placed: it takes one of the gang's slots
                continue
            head = line.head(reserved)
            if head is None:
                continue
            if gate is None:
                if head.rank >= rank:
                    continue
            elif line.over_quota or (gate.key(head.request), head.rank) >= (own_key, rank):
                continue
            if is_barrier(head.arrival, now, backfill_window_s):
                return (
                    f"pod {head.key} waits ahead of it past the {backfill_window_s:g}s backfill window "
                    "(nothing behind it starts first)"
                )
            if not self._still_blocked(line, head.request):
                return f"pod {head.key}, ahead of it in line, may fit on the GPUs freed since it last tried"
        return ""

    def failed_at_admission(self, req: Request) -> None:
        """`req` was just denied for now and will wait: what its line knows when its pod joins it."""
        index = self.books.index
        self.hints[req.id] = (index.touched_base + len(index.touched), self._strategy_name(req))
        while len(self.hints) > HINTS_KEPT:
            del self.hints[next(iter(self.hints))]

    def position(self, rank: tuple[int, float, str]) -> int:
        """1-based place in line of an entry of this rank (those placing are no longer counted)."""
        ahead = 0
        for line in self.lines.values():
            ahead += bisect_left(line.entries, (rank, ""))
        reserved = self.books.reservations
        ahead -= sum(1 for wid in self.placing if wid in reserved and self.queued[wid].rank < rank)
        return ahead + 1

    # ------------------------------------------------------------------ passes
    def place(
        self,
        now: float,
        backfill_window_s: float = DEFAULT_BACKFILL_WINDOW_S,
        gate: LineGate | None = None,
    ) -> list[Placed]:
        """Place every waiting pod that fits now, in line order, until the line ends or a barrier stops it.
        Reserves each placement (RESERVED, under the pod's ticket id). With GPU queues (`gate`), the order is
        the fair order among queues, then rank, and a head its queue's quota holds back waits without
        stopping the others."""
        if not self.queued:
            return []
        books = self.books
        reserved = books.reservations
        heap: list[tuple[tuple, tuple[int, float, str], int, Hashable]] = []
        for n, (lk, line) in enumerate(self.lines.items()):
            head = line.head(reserved)
            if head is not None:
                heap.append((gate.key(head.request) if gate is not None else (), head.rank, n, lk))
        heapq.heapify(heap)
        placed: list[Placed] = []
        touched: dict[tuple[int, int], tuple[list[NodeState], int]] = {}  # this pass's, per slice of the log
        while heap:
            key, _, n, lk = heapq.heappop(heap)
            line = self.lines[lk]
            head = line.head(reserved)
            if head is None:
                continue
            if gate is not None:
                fresh = gate.key(head.request)
                if fresh != key:  # its queue placed since: its turn comes by its key now
                    heapq.heappush(heap, (fresh, head.rank, n, lk))
                    continue
            if self._still_blocked(line, head.request, touched):
                if is_barrier(head.arrival, now, backfill_window_s):
                    break
                continue
            got = self._place_line(line, now, gate)
            placed += got
            head = line.head(reserved)
            if head is None:
                continue
            if got and line.blocked_at is None:  # placed some, more behind: their turn in line order
                heapq.heappush(heap, (gate.key(head.request) if gate is not None else (), head.rank, n, lk))
            elif line.over_quota:
                continue  # its queue holds it back: others go on
            elif is_barrier(head.arrival, now, backfill_window_s):
                break
        return placed

    def place_now(self, wid: str, now: float) -> list[Placed]:
        """Place the waiter holding ticket `wid` (a gang: its every waiting member) at once, ahead of the
        line: what a preemption's plan kept nodes for."""
        w = self.queued.get(wid)
        if w is None or wid in self.books.reservations:
            return []
        line = self.lines[line_key(w.request)]
        if line.head(self.books.reservations) is not w and w.request.group is None:
            return self._place_members(line, [w], now, None)
        return self._place_line(line, now, None)

    def _place_line(self, line: _Line, now: float, gate: LineGate | None = None) -> list[Placed]:
        """Place the line's head (a gang: every waiting member); on a denial, mark the line blocked."""
        reserved = self.books.reservations
        head = line.head(reserved)
        assert head is not None
        members = list(line.undecided(reserved)) if head.request.group is not None else [head]
        return self._place_members(line, members, now, gate)

    def _place_members(
        self, line: _Line, members: list[Waiter], now: float, gate: LineGate | None
    ) -> list[Placed]:
        out: list[Placed] = []
        line.over_quota = ""
        probe = self._probe(members[0].request)
        for w in members:
            if probe is None and gate is not None and not out:
                refusal = gate.refusal(w.request)
                if refusal is not None:
                    line.over_quota = refusal
                    line.blocked_at = None  # (asked again every pass: a queue's use changes anywhere)
                    break
            result = self.reserve(w.request, now) if probe is None else Denial(w.id, "", by_reason=probe)
            if isinstance(result, Placement):
                out.append(Placed(w.key, w.namespace, w.name, w.uid, result, w.arrival, w.request))
                self.placing.add(w.id)
                if gate is not None:
                    gate.placed(w.request, result)
                continue
            if not out:  # the head itself: the line waits
                index = self.books.index
                line.blocked_at = index.touched_base + len(index.touched)
                line.strategy = self._strategy_name(w.request)
                line.any_touch = (
                    w.request.group is not None
                    or w.request.pinned is not None
                    or any(reason in _WIDE_REASONS for reason, _ in result.by_reason)
                )
            break
        if out:
            line.blocked_at = None
        return out

    def _probe(self, req: Request) -> tuple[tuple[Reason, int], ...] | None:
        """None when `reserve` may place the request; else the reason it cannot, found without the denial
        `reserve` would build (the diagnosis and its message cost more than the search): the strategy's gate
        or no node found, as `Decider.decide` decides a single pod; a gang's bound."""
        if req.group is not None and req.group.size > 1:
            return None if self._gang_may_fit(req) else ((Reason.NOT_ENOUGH_GPUS, 0),)
        if req.pinned is not None:
            return None
        try:
            strategy = get_strategy(canonical_name(self._strategy_name(req)))
        except ValueError:
            return None  # `reserve` denies it, naming the strategy
        ctx = self.filters.context(req)
        gate = strategy.admit(req, ctx)
        if gate is not None:
            return ((gate, 0),)
        if self.selector.select_soft_domain(req, strategy, ctx) is None:
            return ((Reason.NOT_ENOUGH_GPUS, 0),)
        return None

    def _strategy_name(self, req: Request) -> str:
        """The strategy the request is decided under, as it names it (the default's name when it names
        none): a line that failed under one is asked again under another."""
        return req.strategy or self.books.config.default_strategy

    def _gang_may_fit(self, req: Request) -> bool:
        """A bound from the whole-free buckets alone: could the cluster's free GPUs hold the gang's pods at
        all? (False: no node change since it failed can have helped enough.)"""
        group = req.group
        if group is None or req.gpus <= 0 or group.key in self.books.groups:
            return True  # (a gang already placed: its next pod takes a slot, held already, or one re-placed)
        pods = 0
        for k, names in self.books.index.all.by_free.items():
            if k >= req.gpus:
                pods += len(names) * (k // req.gpus)
        return pods >= group.size

    def _still_blocked(
        self,
        line: _Line,
        req: Request,
        touched: dict[tuple[int, int], tuple[list[NodeState], int]] | None = None,
    ) -> bool:
        """Whether the line's head, which failed at `blocked_at`, still cannot fit: true when no node touched
        since could now take it (the others did not change). `touched` keeps, for one pass, the placeable
        nodes of each slice of the index's log and their most whole-free GPUs: lines that failed together
        read it once."""
        if line.blocked_at is None:
            return False
        index = self.books.index
        if line.blocked_at < index.touched_base or line.strategy != self._strategy_name(req):
            return False
        now_at = index.touched_base + len(index.touched)
        if line.blocked_at == now_at:
            return True
        if line.any_touch:
            if self._gang_may_fit(req):
                return False
            line.blocked_at = now_at
            return True
        key = (line.blocked_at, now_at)
        seen = touched.get(key) if touched is not None else None
        if seen is None:
            names = set(index.touched[line.blocked_at - index.touched_base :])
            if len(names) > _TOUCHED_CHECKED:
                return False
            nodes = index.nodes
            candidates = [n for n in map(nodes.get, names) if n is not None and n.placeable]
            seen = (candidates, max((n.whole_free for n in candidates), default=-1))
            if touched is not None:
                touched[key] = seen
        candidates, most_free = seen
        if candidates and most_free >= req.gpus:
            try:
                strategy = get_strategy(canonical_name(line.strategy))
            except ValueError:
                return False
            ctx, try_node = self.filters.context(req), self.selector.try_node
            for node in candidates:
                if node.whole_free >= req.gpus and try_node(node, req, strategy, ctx) is not None:
                    return False
        line.blocked_at = now_at
        return True

    # ------------------------------------------------------------------ views
    def heads(self) -> list[Waiter]:
        """The first waiter of every line not placing."""
        reserved = self.books.reservations
        return [h for h in (line.head(reserved) for line in self.lines.values()) if h is not None]

    def undecided_by_line(self) -> list[Iterator[Waiter]]:
        """Every line's waiters not placing, in line order, each read only as far as its caller asks: a
        preemption is planned for the first that may preempt, so a head that may not (`preemptionPolicy:
        Never`, or no plan found) does not hold back the pods behind it. Read them before the line changes."""
        reserved = self.books.reservations
        return [line.undecided(reserved) for line in self.lines.values()]

    def key_of(self, wid: str) -> str | None:
        """The pod key of the waiter holding ticket `wid`; None when none waits under it."""
        w = self.queued.get(wid)
        return None if w is None else w.key

    def request_of(self, wid: str) -> Request | None:
        """The request of the waiter holding ticket `wid`; None when none waits under it."""
        w = self.queued.get(wid)
        return None if w is None else w.request

    def in_order(self, limit: int | None = None) -> list[LineEntry]:
        """The line, first to last (placing ones included, not counted in positions)."""
        reserved = self.books.reservations
        merged = heapq.merge(*(line.entries for line in self.lines.values()))
        out: list[LineEntry] = []
        position = 0
        for _, wid in islice(merged, limit):
            placing = wid in reserved
            if not placing:
                position += 1
            out.append(LineEntry(position if not placing else 0, self.queued[wid], placing))
        return out

    def snapshot(self) -> dict:
        """Canonical: equal for a live ledger and its rebuild."""
        line = [
            [w.key, w.id, w.arrival, w.request.priority]
            for w in sorted(self.queued.values(), key=lambda w: w.rank)
        ]
        shadowed = sorted(k for k, w in self.waiters.items() if self.queued.get(w.id) is not w)
        return {"line": line, "shadowed": shadowed}
