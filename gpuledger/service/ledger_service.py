"""One ledger and the source it is rebuilt from, behind batched methods: what the Ray actor holds.

The Ray actor (gpuledger.ray.actor) and the in-process client (gpuledger.webhook.ledger.client) both wrap
this class, so
the webhook's tests, `explain` and production run the same admission code. Pure: time comes in as `now`
(and the clock that times rebuilds is an argument). The live settings (gpuledger.service.settings: default
strategy,
scoring weights, gang limits, label keys) change here, through `apply_config` or `set_default_strategy`, and
every change is recorded (who, when, what): the service's `LiveSettings` (gpuledger.service.live_settings)
holds them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from gpuledger import strategies  # noqa: F401  (registers the built-in strategies with the core's registry)
from gpuledger.core.ledger import Ledger, LedgerConfig, LedgerStats, LineEntry, Waiting
from gpuledger.core.model import (
    Denial,
    Explanation,
    PinnedDevices,
    Placement,
    Request,
    ReservationState,
    Taint,
)
from gpuledger.core.pods.placement_codec import Binding, encode_placement
from gpuledger.core.queues.queue_rule import DEFAULT_BACKFILL_WINDOW_S
from gpuledger.core.queues.waiting import device_annotations, wants
from gpuledger.core.steps import Steps, drain
from gpuledger.names import PLACEMENT_ANNOTATION, RESERVATION_ID_KEY
from gpuledger.service.live_settings import LiveSettings
from gpuledger.service.preemption_orders import Eviction, EvictionRefused, PreemptionOrder
from gpuledger.service.queue_standing import standing_of, status_body
from gpuledger.service.settings import (
    LedgerSettings,
)
from gpuledger.service.sources import ExternalSource, reservation_ids, source_from_spec
from gpuledger.service.sync_writer import DEFAULT_TERM_S, SyncLeaseAnswer, SyncWriter

__all__ = [
    "RESYNC_STEP",
    "AdmitCall",
    "Held",
    "LedgerService",
    "PlacedPod",
    "Recoveries",
    "ServedCalls",
    "ServiceStats",
    "Unavailable",
]

log = logging.getLogger("gpuledger.service")

MAX_CONFLICTS_REPORTED = 500  # placement conflicts listed in status() (all are counted in stats())
RECENT_RECOVERIES = 64  # rebuild durations kept for the webhook's histogram
# objects a stepped resync applies between pauses: ~10-15 ms of building on a 2-core host (65,000 nodes,
# 500,000 pods), so an admission arriving during a resync waits about that long for its turn
RESYNC_STEP = 500


@dataclass(frozen=True)
class AdmitCall:
    """One admission. `prior_id`: the id of a validly signed placement the pod already carries. `may_wait`:
    a pod that does not fit now but could fit an empty cluster is answered `Waiting` (admitted gated, in
    line) instead of a denial."""

    request: Request
    dry_run: bool = False
    prior_id: str | None = None
    may_wait: bool = False


@dataclass(frozen=True)
class PlacedPod:
    """A waiting pod the ledger has just placed and reserved for: what the placement adapter
    (gpuledger.sync.placer) writes on it, through what a gated pod may still change, before removing its
    gate. `annotations` and `labels` are the placement's, signed for this pod."""

    namespace: str
    name: str
    uid: str
    reservation_id: str
    node: str
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    waited_s: float
    tolerated_taints: tuple[Taint, ...] = ()


@dataclass(frozen=True)
class Unavailable:
    """The ledger cannot decide yet (restarted, inventory not synced): the webhook's fail-open/closed rule
    applies. Deciding on a half-known cluster could hand out GPUs that stored pods hold."""

    message: str


@dataclass(frozen=True)
class Held:
    """A live reservation as the validating webhook checks it. `claimed`: a pod's CREATE already passed
    validation with it (a second pod carrying the same placement is a copy)."""

    placement: Placement
    confirmed: bool
    claimed: bool = False


@dataclass(frozen=True)
class Recoveries:
    """The ledger's rebuilds (a resync, or the rebuild from its source at start): how many this incarnation
    made and how long the last few took (seconds, oldest first), for the webhook's recovery histogram."""

    incarnation: str
    count: int
    recent: tuple[float, ...]


@dataclass(frozen=True)
class ServedCalls:
    """The calls the process holding the ledger served over the ledger channel since it started, by method,
    and the seconds it spent on them (each from its frame read to its answer encoded): what the ledger's own
    side of a round trip costs, told apart from the wait a caller sees, and how busy one ledger is."""

    incarnation: str
    calls: Mapping[str, int]
    seconds: Mapping[str, float]


@dataclass(frozen=True)
class ServiceStats(LedgerStats):
    """The ledger's totals plus what the service adds: its live settings and its rebuild times, and what the
    actor adds (`served`; None where no channel serves the ledger)."""

    settings: Mapping[str, Any] = field(default_factory=dict)
    recoveries: Recoveries | None = None
    served: ServedCalls | None = None
    # pods waiting in line for GPUs (gpuledger.core.queues.waiting), those placing left out: by priority, and
    # how long the first to arrive has waited
    waiting: int = 0
    waiting_by_priority: Mapping[int, int] = field(default_factory=dict)
    waiting_oldest_s: float = 0.0

    def as_dict(self) -> dict:
        d = super().as_dict()
        for name in ("recoveries", "served"):
            value = getattr(self, name)
            d[name] = asdict(value) if value is not None else None
        return d


class LedgerService:
    """The ledger behind the service's batched calls, and the two tables the service keeps beside it.

    Of what concerns reservations it keeps only these two, and reads the rest from the ledger; they hold what
    the ledger's books do not:

    - `_pending`: reservation id -> the `Request` this service reserved it for (an admission, or a pod placed
      from the line) until a stored pod is seen carrying it. The books keep each reservation's placement and
      whether a pod confirmed it, not the request; a resync rebuilds the ledger from API objects, where a
      pod not stored yet is absent, so the request is replayed onto the rebuilt ledger, pinned to the same
      devices. Its members are the service's own, not the books' unconfirmed reservations: what this service
      handed out and has not seen settled (a re-admission answered with a reservation a pod already
      confirmed is entered again; an entry leaves when this service confirms, releases or expires it, or
      applies an event of a pod labelled with its id that settles it, whatever the books did meanwhile),
      and `status()["pending"]` counts them.
    - `_claimed`: reservation id -> who claimed it at validation (the admission request's uid; "" when the
      caller named none). The validating webhook claims a reservation before its pod is stored, while the
      books' claims (gpuledger.core.books.claims) are those of stored pods; the claimer is what gives a
      retried validation its first answer instead of "already admitted". Kept until this service confirms,
      releases or expires the reservation, and across a resync only for those replayed (in `_pending`).
    """

    def __init__(
        self,
        config: LedgerConfig,
        source_spec: dict | None = None,
        now: float = 0.0,
        *,
        settings: LedgerSettings | None = None,
        timer: Callable[[], float] = time.perf_counter,
        incarnation: str = "",
    ):
        # `settings` (when given) win over the config's default strategy, weights and label keys
        self.live = LiveSettings(settings or LedgerSettings.from_config(config), config, now, self)
        self.source = source_from_spec(source_spec)
        self.ledger = Ledger(self.config)
        self.synced = False
        self.rebuilds = 0
        self.timer, self.incarnation = timer, incarnation
        self._recent_recoveries: deque[float] = deque(maxlen=RECENT_RECOVERIES)
        # requests of reservations not yet seen on a stored pod: replayed when a resync rebuilds the ledger
        # (the service's own: the books keep no request; the class's docstring says why)
        self._pending: dict[str, Request] = {}
        # reservations whose pod passed validation (at most one pod may: later ones carry a copy)
        # reservation id -> who claimed it (the admission request's uid; "" when the caller named none;
        # the service's own: the books' claims are of stored pods)
        self._claimed: dict[str, str] = {}
        # which cluster sync may write the ledger (one at a time; gpuledger.service.sync_writer)
        self.sync_writer = SyncWriter(incarnation=incarnation)
        # how long a waiting pod may be passed over by smaller ones behind it
        # (gpuledger.core.queues.queue_rule)
        self.backfill_window_s = DEFAULT_BACKFILL_WINDOW_S
        self.rebuild_from_source(now)

    # ---------------------------------------------------------------- live settings
    @property
    def settings(self) -> LedgerSettings:
        return self.live.settings

    @property
    def config(self) -> LedgerConfig:
        """The ledger config in force: the one given at the start with the live settings applied."""
        return self.live.config

    @property
    def changed_by(self) -> str:
        return self.live.changed_by

    @property
    def changed_at(self) -> float:
        return self.live.changed_at

    def apply_config(self, settings: LedgerSettings, who: str, now: float) -> dict:
        """A replica's config (gpuledger.service.live_settings.LiveSettings.apply_config)."""
        return self.live.apply_config(settings, who, now)

    def set_default_strategy(self, name: str, who: str, now: float) -> dict:
        """The runtime switch (gpuledger.service.live_settings.LiveSettings.set_default_strategy)."""
        return self.live.set_default_strategy(name, who, now)

    def get_settings(self) -> dict[str, Any]:
        return self.live.get_settings()

    def settings_applied(
        self, config: LedgerConfig, relabel: bool, external_changed: bool, now: float
    ) -> None:
        """New settings are live: new label keys file every node anew (a rebuild now from a readable source;
        a ledger fed from the API turns unsynced, so the cluster sync resyncs it, admissions answering
        Unavailable until then); anything else the ledger reads at its next decision."""
        if relabel:
            if not self.rebuild_from_source(now):
                self.synced = False
                log.warning(
                    "leaf/spine label keys changed: the ledger waits for a full resync from the cluster sync"
                )
            return
        self.ledger.config = config
        if external_changed:
            self.ledger.renew_external()

    # ---------------------------------------------------------------- sources
    def rebuild_from_source(self, now: float) -> bool:
        """Rebuild from the source's current objects; False for a source fed from outside (the API)."""
        objects = self.source.objects()
        if objects is None:
            return False
        self._rebuild(objects, now)
        return True

    def resync(self, objects: list[dict], now: float, holder: str | None = None) -> dict:
        """A full list replaces the ledger; reservations whose pod is not stored yet are kept. `holder`: the
        sync sending it (gpuledger.service.sync_writer), which may then stream events."""
        return drain(self.resync_in_steps(objects, now, holder, step=0))

    def resync_in_steps(
        self, objects: list[dict], now: float, holder: str | None = None, step: int = RESYNC_STEP
    ) -> Steps[dict]:
        """`resync`, pausing after every `step` objects of the new ledger's build (0: never) so the caller can
        serve admissions meanwhile, from the ledger being replaced: what they reserve is pending, and replayed
        onto the new ledger with the swap, as any reservation whose pod the list does not hold yet. The swap
        is one step, done at once; the replaced ledger is freed in steps after it (`Ledger.discard_in_steps`).
        The caller runs one of these at a time, and no other write of the cluster's (apply_events, the sync's
        confirm and release, a new config) until it ends: the actor holds its write lock for it. The answer's
        `seconds` is the whole build's, pauses included."""
        self.sync_writer.check(holder, now, "resync", listing=True)
        result = yield from self._rebuild_in_steps(objects, now, step)
        # a holder that lost the lease meanwhile is not marked listed: its successor's own list follows
        self.sync_writer.listed_by(holder, now + result["seconds"])
        return result

    def _rebuild(self, objects: list[dict], now: float) -> dict:
        return drain(self._rebuild_in_steps(objects, now, 0))

    def _rebuild_in_steps(self, objects: list[dict], now: float, step: int) -> Steps[dict]:
        started = self.timer()
        objects = list(objects)
        fresh = yield from Ledger.rebuild_in_steps(objects, self.config, now, step)
        # which pending reservations the list holds a pod of: only worth a walk over every pod when there are
        # any (none after a restart, the rebuild that matters most), and read once the admissions served
        # during the build have added theirs
        stored: set[str] = set()
        if self._pending and step:
            for start in range(0, len(objects), step):
                stored |= reservation_ids(objects[start : start + step])
                yield
        elif self._pending:
            stored = reservation_ids(objects)
        kept = lost = 0
        for rid, request in list(self._pending.items()):
            if rid in stored:
                del self._pending[rid]
                continue
            old = self.ledger.get(rid)
            if old is None:
                del self._pending[rid]
                continue
            if request.group is not None:
                # a gang member is restored from its pod's annotation when the pod is stored (the plan travels
                # on it); replaying the request would draw a new plan that disagrees with the annotation
                del self._pending[rid]
                continue
            # the same devices again, if they are still free in the rebuilt ledger
            result = fresh.reserve(replace(request, pinned=_pin(old)), now)
            if isinstance(result, Placement):
                kept += 1
            else:
                lost += 1
                del self._pending[rid]
        replaced, self.ledger = self.ledger, fresh
        self._claimed = {rid: who for rid, who in self._claimed.items() if rid in self._pending}
        self.synced = True
        self.rebuilds += 1
        seconds = max(0.0, self.timer() - started)
        self._recent_recoveries.append(seconds)
        # freed now, by refcounting (in steps too, after the swap): no collector pass over the heap for it
        yield from replaced.discard_in_steps(step)
        return {"kept": kept, "lost": lost, "objects": len(objects), "seconds": seconds}

    # ---------------------------------------------------------------- admission
    def _unsynced(self) -> Unavailable:
        return Unavailable(
            f"the GPU ledger has not synced its inventory from {self.source!r} yet "
            "(it just started or restarted)"
        )

    def admit(
        self, calls: Iterable[AdmitCall | tuple], now: float
    ) -> list[Placement | Denial | Waiting | Unavailable]:
        if not self.synced:
            return [self._unsynced() for _ in calls]
        out: list[Placement | Denial | Waiting | Unavailable] = []
        for call in calls:
            if not isinstance(call, AdmitCall):
                call = AdmitCall(*call)
            out.append(self._admit_one(call, now))
        return out

    def _with_leaf_limits(self, request: Request) -> Request:
        """A gang whose request sets no per-leaf limit gets the configured ones (topologyConstraints)."""
        group, s = request.group, self.settings
        if group is None or group.size <= 1 or not (s.max_nodes_per_leaf or s.max_gpus_per_leaf):
            return request
        limited = replace(
            group,
            max_nodes_per_leaf=group.max_nodes_per_leaf or s.max_nodes_per_leaf,
            max_gpus_per_leaf=group.max_gpus_per_leaf or s.max_gpus_per_leaf,
        )
        return request if limited == group else replace(request, group=limited)

    def _admit_one(self, call: AdmitCall, now: float) -> Placement | Denial | Waiting:
        request = self._with_leaf_limits(call.request)
        if call.prior_id and call.prior_id != request.id:
            held = self._held(call.prior_id)
            if held is not None and not held.confirmed and not held.claimed:
                # a reinvocation or retry of the same admission: the same answer, nothing new reserved
                return held.placement
        if call.dry_run:
            dry = self.ledger.explain(request).result
            if isinstance(dry, Denial) and call.may_wait and dry.by_reason and self.ledger.could_fit(request):
                return self.ledger.waiting_answer(request, now, dry)
            refusal = self.ledger.quota_refusal(request) if isinstance(dry, Placement) else None
            if refusal is not None:  # its queue is at its limit: it would wait, or be denied
                if not call.may_wait:
                    return Denial(request.id, refusal, strategy=request.strategy or "")
                waiting = self.ledger.waiting_answer(request, now, Denial(request.id, refusal))
                return replace(waiting, message=f"{waiting.message}; {refusal}", reason=refusal)
            return dry
        result = self.ledger.reserve_or_wait(request, now, call.may_wait, self.backfill_window_s)
        if isinstance(result, Placement):
            self._pending[request.id] = request
        return result

    def _held(self, rid: str) -> Held | None:
        placement = self.ledger.issued(rid)  # what the pod carries, checked by the validating webhook
        if placement is None:
            return None
        return Held(placement, self.ledger.state_of(rid) == ReservationState.CONFIRMED, rid in self._claimed)

    def lookup(self, ids: Iterable[str]) -> list[Held | Unavailable | None]:
        if not self.synced:
            return [self._unsynced() for _ in ids]
        return [self._held(i) for i in ids]

    def claim(self, items: Iterable[str | tuple[str, str]]) -> list[Held | Unavailable | None]:
        """The validating webhook's check: each reservation as it was, then marked claimed by this pod.

        An item is a reservation id or (id, claimer): the same claimer asking again (a retried call whose
        answer was lost) gets the answer the first call got, not "already admitted".
        """
        if not self.synced:
            return [self._unsynced() for _ in items]
        out: list[Held | Unavailable | None] = []
        for item in items:
            rid, who = (item, "") if isinstance(item, str) else item
            held = self._held(rid)
            if held is not None and not held.confirmed:
                if held.claimed and who and self._claimed.get(rid) == who:
                    held = replace(held, claimed=False)
                elif not held.claimed:
                    self._claimed[rid] = who
            out.append(held)
        return out

    def explain(self, request: Request, now: float | None = None) -> Explanation:
        """The decision the ledger would make now; with `now` and GPU queues, for a request that would wait,
        the preemption it could make or why none (`Explanation.preemption`)."""
        return self.ledger.explain(self._with_leaf_limits(request), now=now)

    # ---------------------------------------------------------------- lifecycle
    def _forget(self, rid: str) -> None:
        self._pending.pop(rid, None)
        self._claimed.pop(rid, None)

    def confirm(self, ids: Iterable[str], now: float, holder: str | None = None) -> list[bool]:
        """Reservations whose pod is stored. `holder`: the sync asking (its expiry check), fenced by the
        sync lease; the webhook's own calls name none."""
        if holder is not None:
            self.sync_writer.check(holder, now, "confirm")
        ids = list(ids)
        for i in ids:
            self._forget(i)
        return [self.ledger.confirm(i, now) for i in ids]

    def release(self, ids: Iterable[str], now: float = 0.0, holder: str | None = None) -> list[bool]:
        """Reservations no pod will hold. `holder` as for `confirm` (then `now` is the lease's clock)."""
        if holder is not None:
            self.sync_writer.check(holder, now, "release")
        ids = list(ids)
        for i in ids:
            self._forget(i)
        return [self.ledger.release(i) for i in ids]

    def apply_events(self, events: Iterable[tuple[str, dict]], now: float, holder: str | None = None) -> int:
        """Watch events, in the order one sync saw them. `holder`: that sync, which must hold the sync lease
        and have listed (gpuledger.service.sync_writer): two syncs' streams interleaved would free a device
        twice."""
        self.sync_writer.check(holder, now, "apply_events")
        n = 0
        touched: list[str] = []
        for event_type, obj in events:
            if event_type == "DELETED":
                self.ledger.delete_object(obj)
            else:
                self.ledger.apply_object(obj, now)
            rid = ((obj.get("metadata") or {}).get("labels") or {}).get(RESERVATION_ID_KEY)
            if rid is not None:
                touched.append(str(rid))
            n += 1
        # a reservation confirmed (or released) by its stored pod needs no replay on resync
        for rid in touched:
            if rid in self._pending and self.ledger.state_of(rid) != ReservationState.RESERVED:
                self._forget(rid)
        return n

    def expiry_candidates(self, now: float) -> list[str]:
        return self.ledger.expiry_candidates(now)

    # ---------------------------------------------------------------- the line of waiting pods
    def place_waiting(self, now: float, holder: str | None = None) -> list[PlacedPod]:
        """Place the waiting pods that fit now, in line order (gpuledger.core.queues.waiting), each reserved
        at once (RESERVED, and replayed by a resync like an admission's until its pod comes back placed). Only
        the sync holding the ledger's sync lease asks: its placement adapter writes them, and two writing the
        same pods would race."""
        if not self.synced:
            return []
        self.sync_writer.check(holder, now, "place_waiting")
        out: list[PlacedPod] = []
        key = self.config.placement_key
        for placed in self.ledger.place_waiting(now, self.backfill_window_s):
            p = placed.placement
            self._pending[p.id] = placed.request
            annotations = {
                PLACEMENT_ANNOTATION: encode_placement(p, key, Binding(placed.namespace, placed.name)),
                **device_annotations(p),
            }
            out.append(
                PlacedPod(
                    placed.namespace,
                    placed.name,
                    placed.uid,
                    p.id,
                    p.node,
                    annotations,
                    {RESERVATION_ID_KEY: p.id},
                    max(0.0, now - placed.arrival),
                    p.tolerated_taints,
                )
            )
        return out

    # ---------------------------------------------------------------- GPU queues and preemption
    def preemptions_due(self, now: float, holder: str | None = None) -> list[PreemptionOrder]:
        """Every preemption the ledger holds whose victims are not all gone: what the eviction adapter
        (gpuledger.sync.evictor) carries out (record, evict, Events; each step harmless twice). Fenced like
        `place_waiting`."""
        if not self.synced:
            return []
        self.sync_writer.check(holder, now, "preemptions_due")
        out: list[PreemptionOrder] = []
        for plan in self.ledger.preemptions():
            victims = self.ledger.preemption_victims(plan)
            if not victims:
                continue
            out.append(
                PreemptionOrder(
                    id=plan.id,
                    namespace=plan.namespace,
                    name=plan.name,
                    uid=plan.uid,
                    victims=tuple(Eviction(*v) for v in victims),
                    nodes=plan.nodes,
                    record=plan.record,
                    recorded=plan.recorded,
                    message=plan.message,
                )
            )
        return out

    def eviction_refused(
        self, refusals: Iterable[EvictionRefused], now: float, holder: str | None = None
    ) -> None:
        """The API server would not evict these victims: each one's plan is dropped (its nodes freed), the
        victim left out of plans for a while, and the next pass plans again."""
        self.sync_writer.check(holder, now, "eviction_refused")
        for refused in refusals:
            self.ledger.eviction_refused(refused.order_id, refused.namespace, refused.name, now)

    def queue_status(self, now: float, holder: str | None = None) -> dict[str, dict]:
        """GPUQueue name -> the body of its `.status` (quota, used, borrowed, waiting, share, products) from
        the ledger's own books, as `gpuledger queues` computes it from API objects; {} when no GPUQueue
        exists. Fenced like `place_waiting` (the sync writes it)."""
        if not self.synced:
            return {}
        self.sync_writer.check(holder, now, "queue_status")
        accounts = self.ledger.queue_accounts()
        if accounts is None:
            return {}
        found = standing_of(accounts.queues, accounts.declared, accounts.usage, accounts.capacity)
        out: dict[str, dict] = {}
        for q in found.queues:
            if q.name in accounts.declared:
                waiting = sum(accounts.waiting.get(name, 0) for name in (q.name, *q.children))
                out[q.name] = status_body(q, waiting)
        return out

    def waiting_line(self, limit: int | None = 100) -> list[dict[str, Any]]:
        """The waiting pods, first to last: position (0 while placing), pod, priority, arrival, wants."""
        return [line_row(entry) for entry in self.ledger.waiting_line(limit)]

    def sync_lease(
        self, holder: str, now: float, term_s: float = DEFAULT_TERM_S, hand_back: bool = False
    ) -> SyncLeaseAnswer:
        """Take or renew the right to write the ledger from the cluster (or hand it back when stopping)."""
        if hand_back:
            return self.sync_writer.hand_back(holder, now)
        return self.sync_writer.acquire(holder, now, term_s)

    def sweep(self, now: float) -> list[str]:
        """For a source we can read: confirm what is stored, expire the rest. The API's sweep is the
        sync's."""
        candidates = self.ledger.expiry_candidates(now)
        if not candidates:
            return []
        objects = self.source.objects()
        if objects is None:
            return []
        stored = reservation_ids(objects)
        self.confirm([c for c in candidates if c in stored], now)
        expired = self.ledger.expire(now)
        for rid in expired:
            self._forget(rid)
        return expired

    # ---------------------------------------------------------------- reading
    def status(self) -> dict[str, Any]:
        return {
            "ready": True,
            "synced": self.synced,
            "nodes": len(self.ledger.index.nodes),
            "source": repr(self.source),
            "external_source": self.external_source,
            "rebuilds": self.rebuilds,
            "pending": len(self._pending),
            # pods admitted gated, in line for GPUs (gpuledger.core.queues.waiting), by priority
            "waiting": self.ledger.waiting_count(),
            "waiting_by_priority": self.ledger.waiting_by_priority(),
            "default_strategy": self.settings.default_strategy,
            "settings_changed_by": self.changed_by,
            "settings_changed_at": self.changed_at,
            # stored pods holding a placement they do not own: the sync counts new ones and posts an Event
            "conflicts": self.ledger.conflicts()[:MAX_CONFLICTS_REPORTED],
            # what the nodes' kubelets said against the ledger (gpuledger.core.books.truth): pods recorded on
            # the devices the kubelet gave them, and pods whose devices the kubelet says another pod holds;
            # the sync counts new ones and posts an Event on each pod
            "device_corrections": self.ledger.device_corrections()[:MAX_CONFLICTS_REPORTED],
            "device_conflicts": self.ledger.device_conflicts()[:MAX_CONFLICTS_REPORTED],
            # the cluster sync writing the ledger now (gpuledger.service.sync_writer); its term ends at
            # sync_expires
            "sync_holder": self.sync_writer.holder,
            "sync_epoch": self.sync_writer.epoch,
            "sync_listed": self.sync_writer.listed,
            "sync_expires": self.sync_writer.expires,
        }

    @property
    def external_source(self) -> bool:
        """Whether someone else (gpuledger.sync.cluster_sync) keeps the inventory and expires reservations."""
        return isinstance(self.source, ExternalSource)

    def stats(self, now: float | None = None) -> ServiceStats:
        """The ledger's totals; with `now`, also how long the oldest waiting pod has waited."""
        totals = self.ledger.stats()
        settings = self.get_settings()
        del settings["history"]
        recoveries = Recoveries(self.incarnation, self.rebuilds, tuple(self._recent_recoveries))
        by_priority = self.ledger.waiting_by_priority()
        oldest = self.ledger.oldest_arrival()
        return ServiceStats(
            **{f.name: getattr(totals, f.name) for f in fields(LedgerStats)},
            settings=settings,
            recoveries=recoveries,
            waiting=sum(by_priority.values()),
            waiting_by_priority=by_priority,
            waiting_oldest_s=max(0.0, now - oldest) if now is not None and oldest is not None else 0.0,
        )

    def snapshot(self) -> dict:
        return self.ledger.snapshot()


def line_row(entry: LineEntry) -> dict[str, Any]:
    w = entry.waiter
    return {
        "position": entry.position,
        "pod": w.key,
        "priority": w.request.priority,
        "arrival": w.arrival,
        "gpus": w.request.gpus,
        "gang": w.request.group.key if w.request.group is not None else "",
        "placing": entry.placing,
        "wants": wants(w.request),
    }


def _pin(placement: Placement) -> PinnedDevices:
    devices = placement.devices or tuple(s.device for s in placement.shares)
    return PinnedDevices(node=placement.node, devices=devices)
