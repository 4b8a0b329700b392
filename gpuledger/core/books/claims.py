"""Who holds a reservation id. Every stored pod carrying a validly signed placement claims its id; one rule
picks the owner among the claims whose binding matches their pod, and every other holder is a conflict,
counted as foreign use on its node. Owners and foreign use are pure functions of the set of holders (never of
the order they arrived in), so a live ledger and its rebuild agree; nothing here places a pod.

The rule: the owner of a reservation id is its bound holder with the earliest creationTimestamp, ties broken
by the smallest uid, then by namespace/name. A foreign holder (a copy issued for another pod, or a bound
holder that is not the owner) holds the devices its placement names by identity where no other holding on
the node has them, in the same order, and counts as GPUs of unknown identity where they are held already.
Owners of different ids naming one device contend in the same order (`contend`): the earlier holds it, the
later is counted instead until it frees.

`Claims` alone keeps the tables of who claims what (the claim of each pod, the holders and the owner of each
id, the foreign holders on each node); every other part reads them through its methods. What the parts above
must do as claims change (adopt an owner's placement, keep a node's device truth) they are asked through
`ClaimEvents`, given at construction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from gpuledger.core.books.books import TRUTH, Books
from gpuledger.core.books.leases import Leases
from gpuledger.core.model import DeviceShare, Placement, ReservationState
from gpuledger.core.nodes.node_state import Holding
from gpuledger.core.pods import objects as kube
from gpuledger.core.pods import placement_codec
from gpuledger.core.pods.allocated import resized
from gpuledger.core.slots_init import slots_init

FOREIGN = "foreign:"  # holder id prefix of a foreign holder's use: "foreign:<namespace>/<name>"
_NO_TIME = "~"  # sorts after every RFC 3339 timestamp: a pod without creationTimestamp comes last


@slots_init
@dataclass(frozen=True, slots=True)
class Claim:
    """One stored pod's claim on the reservation id its placement carries."""

    key: str  # the pod's namespace/name
    placement: Placement
    bound: bool  # the placement was issued for this pod (or is a legacy one, bound to nothing)
    why: str  # why it was not issued for this pod ("" when bound)
    node: str  # where its use counts: spec.nodeName, else the placement's node
    order: tuple[str, str, str]  # (creationTimestamp, uid, key): the smallest bound claim owns the id
    # set by gpuledger.core.books.truth from the node's agentaflow.gpu/device-holders: the placement the pod
    # carries when `placement` is the kubelet's devices instead, and why its devices are another pod's (then
    # counted as GPUs of unknown identity)
    recorded: Placement | None = None
    displaced: str = ""

    @property
    def rid(self) -> str:
        return self.placement.id


def claim_of(
    key: str,
    placement: Placement | None,
    unbound: Placement | None,
    problem: str,
    node: str,
    created: str,
    uid: str,
) -> Claim | None:
    """The claim of a pod (its PodUsage's fields), or None when it carries no valid placement."""
    p = placement or unbound
    if p is None:
        return None
    return Claim(
        key,
        p,
        placement is not None,
        "" if placement is not None else problem,
        node or p.node,
        (created or _NO_TIME, uid, key),
    )


def bound_claim_of_pod(pod: dict, key: bytes | str) -> Claim | None:
    """The claim of a stored pod that is not terminal and carries a placement validly signed with `key` and
    issued for it, read straight from the object: `claim_of` of its `kube.pod_usage`, without the usage (a
    rebuild's pods are nearly all such). None for every other pod, a malformed one or one resized in place
    included: the general path reads those (the integrity property tests compare both)."""
    meta = pod.get("metadata")
    if type(meta) is not dict:
        return None
    annotations = meta.get("annotations")
    if type(annotations) is not dict:
        return None
    text = annotations.get(kube.PLACEMENT_ANNOTATION)
    if type(text) is not str:
        return None
    status = pod.get("status")
    if status and (type(status) is not dict or status.get("phase") in kube.TERMINAL_PHASES):
        return None
    if resized(pod):  # resized in place: the general path reads its kubelet's size
        return None
    spec = pod.get("spec")
    if spec:
        if type(spec) is not dict:
            return None
        node = spec.get("nodeName") or ""
    else:
        node = ""
    created = meta.get("creationTimestamp") or ""
    uid = meta.get("uid") or ""
    if type(node) is not str or type(created) is not str or type(uid) is not str:
        return None
    placement = placement_codec.decode_issued_for(text, key, pod)
    if placement is None:
        return None
    pod_key = kube.pod_key_of(meta)
    return Claim(pod_key, placement, True, "", node or placement.node, (created or _NO_TIME, uid, pod_key))


def same_place(a: Placement, b: Placement) -> bool:
    """Whether two placements hold the same things on the same node."""
    return (a.node, a.devices, a.shares) == (b.node, b.devices, b.shares)


class ClaimEvents(Protocol):
    """What the claims ask of the parts above them (gpuledger.core.books.adoption, and through it
    gpuledger.core.books.truth) as the claims change."""

    def adopt(
        self, key: str, placement: Placement, now: float, displaced: str, recorded: Placement | None
    ) -> None:
        """Hold `placement` for the owner `key` of its id (or count it instead: `displaced` says why)."""

    def claim_changed(self, key: str, old: Claim | None, new: Claim | None) -> None:
        """The pod `key` carried `old` and now carries `new`; told before its id is settled."""

    def listing_changed(self, key: str, nodes: set[str]) -> None:
        """The claim of `key` (on `nodes`, where it was and is) is settled: recount what the kubelets say."""

    def quiet(self, key: str, node: str) -> bool:
        """Whether a claim of `key` on `node` leaves what the nodes' kubelets say as it is."""

    def contended(self, node: str) -> None:
        """Owners on `node` changed places in a contest for its devices (`Claims.contend`)."""


class Claims:
    """Keeps who claims each reservation id, who owns it, and the foreign holdings true after every change.

    `put` is the one way a pod's claim changes; the owner's placement is adopted through
    `ClaimEvents.adopt`, and a colliding owner is counted instead (dropped when it stops being the owner)."""

    def __init__(self, books: Books, leases: Leases, events: ClaimEvents):
        self.books = books
        self.leases = leases
        self._events = events
        # pods carrying a validly signed placement: pod key -> its claim, the holders of each reservation id,
        # the owner chosen among them, the other holders by the node where their use counts, and every holder
        # by that node
        self._claim_of: dict[str, Claim] = {}
        self._holders_of: dict[str, tuple[str, ...]] = {}
        self._owner_of: dict[str, Claim] = {}
        self._foreign_on: dict[str, set[str]] = {}
        self._keys_on: dict[str, set[str]] = {}
        self._settling = False
        self._freed: set[str] = set()
        # node -> owners counted instead because another holding had their devices (`contend` revisits them)
        self._bumped: dict[str, set[str]] = {}
        self._deferred: set[str] | None = None  # nodes to `contend` on once a batch of changes is done
        self._contending = False

    # ------------------------------------------------------------------------------------------ reading
    def claim_of(self, key: str) -> Claim | None:
        """The claim the pod `key` carries, if any."""
        return self._claim_of.get(key)

    def owner_of(self, rid: str) -> Claim | None:
        """The claim that owns the reservation id `rid` (its first holder), if a stored pod carries it."""
        return self._owner_of.get(rid)

    def keys_on(self, node: str) -> frozenset[str]:
        """The pods on `node` that carry a claim."""
        return frozenset(self._keys_on.get(node, ()))

    def conflict_count(self) -> int:
        """How many claims do not own their id (`conflicts`, without the walk)."""
        return len(self._claim_of) - len(self._owner_of)

    # ------------------------------------------------------------------------------------------ changes
    def freed(self, node: str, hid: str) -> None:
        """The holding `hid` on `node` went (`BookEvents.freed`): the foreign use there is recounted."""
        if node not in self._foreign_on or hid.startswith(FOREIGN):
            return
        if self._settling:
            self._freed.add(node)
        else:
            self.refresh(node)

    def put(self, key: str, claim: Claim | None, now: float) -> None:
        """The pod `key` now carries `claim` (None: it carries none, or is gone)."""
        books = self.books
        if claim is not None and self._first_holder(key, claim):
            self._own(key, claim, now)
            return
        old = self._claim_of.pop(key, None)
        if old is None and claim is not None:
            counted = books.forget_counted_pod(key)  # it was counted by its requests until now
            if counted is not None:
                self.leases.release(counted)
        nodes: set[str] = set()
        rids: list[str] = []
        if old is not None:
            holders = tuple(k for k in self._holders_of.get(old.rid, ()) if k != key)
            if holders:
                self._holders_of[old.rid] = holders
            else:
                self._holders_of.pop(old.rid, None)
            self._unforeign(old)
            on = self._keys_on.get(old.node)
            if on is not None:
                on.discard(key)
                if not on:
                    del self._keys_on[old.node]
            nodes |= {old.node, old.placement.node}
            rids.append(old.rid)
        if claim is not None:
            self._claim_of[key] = claim
            self._keys_on.setdefault(claim.node, set()).add(key)
            holders = self._holders_of.get(claim.rid, ())
            if key not in holders:  # a tuple, not a set: most ids have one holder (48 bytes, not 216)
                self._holders_of[claim.rid] = (*holders, key)
            if claim.rid not in rids:
                rids.append(claim.rid)
        # a pod the kubelet lists: its devices leave (or join) the node's truth
        self._events.claim_changed(key, old, claim)
        for rid in rids:
            self.settle(rid, now, nodes)
        self._events.listing_changed(key, {c.node for c in (old, claim) if c is not None})
        if self._deferred is None and not self._bumped:  # (nothing to defer, nothing to contend)
            return
        for node in sorted({c.placement.node for c in (old, claim) if c is not None}):
            self.revisit(node, now)

    def _first_holder(self, key: str, claim: Claim) -> bool:
        """Whether `put` is the common case of a rebuild: a pod that held nothing, bound to an id nobody holds
        or has reserved, on nodes without foreign holders or a kubelet's truth. `settle` would then make it
        the owner and adopt its placement, touching nothing else; `_own` does just that, without the walks
        (a third of a 500,000-pod rebuild's time). The integrity property tests compare both paths."""
        books = self.books
        rid = claim.placement.id
        return (
            claim.bound
            and not claim.displaced
            and claim.recorded is None
            and key not in self._claim_of
            and key not in books.pods
            and rid not in self._holders_of
            and rid not in self._owner_of
            and rid not in books.reservations
            and claim.node not in self._foreign_on
            and claim.placement.node not in self._foreign_on
            and self._events.quiet(key, claim.node)
        )

    def _own(self, key: str, claim: Claim, now: float) -> None:
        """`put` of a first holder (`_first_holder`): what `settle` does for it, in the same order."""
        rid = claim.placement.id
        self._claim_of[key] = claim
        self._holders_of[rid] = (key,)
        self._keys_on.setdefault(claim.node, set()).add(key)
        self._events.claim_changed(key, None, claim)
        self._owner_of[rid] = claim
        self._settling = True
        try:
            self._events.adopt(key, claim.placement, now, "", None)
        finally:
            self._settling = False
        freed = self._freed
        if freed:
            self._freed = set()
        foreign_on = self._foreign_on
        if foreign_on:  # (a node without foreign holders has nothing to refresh: every rebuild's pod)
            for node in sorted({claim.node, claim.placement.node} | freed):
                if node in foreign_on:
                    self.refresh(node)
        self.revisit(claim.placement.node, now)

    def own_at_once(self, claim: Claim) -> bool:
        """Record `claim` as the one holder and the owner of its id, when its pod claims nothing, nobody holds
        or owns the id, neither node it names has foreign holders and no owner waits to contend on its
        placement's node (`bump`); False, changing nothing, otherwise (`put` then takes it). For the rebuild's
        shortcut (`Adoption._adopt_at_once`), which holds the placement itself: what `_own` does for a claim
        that `ClaimEvents.quiet` says leaves the kubelets' word alone (then `claim_changed` and
        `listing_changed` change nothing), less the adoption."""
        key, rid, where = claim.key, claim.placement.id, claim.placement.node
        foreign = self._foreign_on
        if (
            key in self._claim_of
            or rid in self._holders_of
            or rid in self._owner_of
            or where in self._bumped
            or (foreign and (claim.node in foreign or where in foreign))
        ):
            return False
        self._claim_of[key] = claim
        self._holders_of[rid] = (key,)
        on = self._keys_on.get(claim.node)
        if on is None:
            self._keys_on[claim.node] = {key}
        else:
            on.add(key)
        self._owner_of[rid] = claim
        if self._deferred is not None:  # (contended on once the batch is done: the placement is held by then)
            self._deferred.add(where)
        return True

    def settle(self, rid: str, now: float, nodes: Iterable[str] = ()) -> None:
        """Choose `rid`'s owner from its holders, hand the reservation over, and recount foreign use."""
        books = self.books
        keys = self._holders_of.get(rid, ())
        if len(keys) == 1:  # almost always (a rebuild: every id): no sort
            holders = [self._claim_of[keys[0]]]
        else:
            holders = sorted((self._claim_of[k] for k in keys), key=lambda c: c.order)
        owner = next((c for c in holders if c.bound), None)
        nodes = set(nodes)
        for c in holders:
            nodes.add(c.node)
            nodes.add(c.placement.node)
        old = self._owner_of.get(rid)
        if old is not None:
            nodes.add(old.placement.node)
        foreign_on = self._foreign_on
        self._settling = True
        try:
            for node in sorted(nodes):
                if node in foreign_on:  # (clearing a node without foreign holders does nothing)
                    self._clear(node)
            if old is not None and (
                owner is None
                or owner.key != old.key
                or owner.placement != old.placement
                or owner.displaced != old.displaced
            ):
                del self._owner_of[rid]
                counted = books.forget_counted_pod(old.key)
                if counted is not None:
                    self.leases.release(counted)
                if owner is None or owner.placement != old.placement:
                    self.leases.release(rid)
            if owner is not None:
                self._owner_of[rid] = owner
                res = books.reservations.get(rid)
                if res is not None and not owner.displaced and same_place(res.placement, owner.placement):
                    self.leases.confirm(rid, now)
                elif owner.key not in books.pods:
                    if res is not None:  # held elsewhere than the pod is (a pending one moved): the pod wins
                        self.leases.release(rid)
                    self._events.adopt(owner.key, owner.placement, now, owner.displaced, owner.recorded)
            for c in holders:
                if owner is not None and c.key == owner.key:
                    self._unforeign(c)
                else:
                    foreign_on.setdefault(c.node, set()).add(c.key)
        finally:
            self._settling = False
        nodes |= self._freed
        self._freed = set()
        for node in sorted(nodes):
            if node in foreign_on:  # (refreshing a node without foreign holders does nothing)
                self.refresh(node)

    # ------------------------------------------------------------------------------------------ contention
    def bump(self, key: str, node: str) -> None:
        """The owner `key` is counted instead: another holding has devices its placement names on `node`."""
        self._bumped.setdefault(node, set()).add(key)

    def revisit(self, node: str, now: float) -> None:
        """An owner was settled on `node`: the owners counted instead there (`bump`) contend again, now or,
        within a batch of changes (`defer`), once it is done."""
        if self._deferred is not None:
            self._deferred.add(node)
        elif node in self._bumped:
            self.contend(now, node)

    def defer(self, node: str) -> set[str] | None:
        """Begin a batch of changes: `revisit` gathers its nodes, `node` first, until `resume`. The batch it
        nests in (None: none), for `resume`."""
        outer, self._deferred = self._deferred, {node}
        return outer

    def resume(self, outer: set[str] | None) -> set[str]:
        """End the batch `defer` began (back in `outer`): the nodes to `revisit` once it is done."""
        gathered, self._deferred = self._deferred, outer
        return gathered or set()

    def overlapped(self, node: str, hids: set[str]) -> None:
        """A node (re)appeared with holdings that overlap (held while the ledger did not know the node)."""
        keys = {self._owner_of[h].key for h in hids if h in self._owner_of}
        self.contend(self.books.last_now if self.books.last_now > float("-inf") else 0.0, node, keys)

    def contend(self, now: float, node: str, extra: Iterable[str] = ()) -> None:
        """Give the devices of `node` that owners of different ids contend for canonically: in claim order
        (creation time, uid, key), each owner holds its devices where no earlier one (and no confirmed holding
        outside the contest) has them, and the others are counted instead, whatever order the changes came in.
        Only the bumped owners and the owners holding what they want take part: a rebuild stays linear."""
        books = self.books
        state = books.index.nodes.get(node)
        if self._contending or state is None:
            return
        members = {k: c for k in self._bumped.pop(node, set()) | set(extra) if (c := self._member(k, node))}
        for c in list(members.values()):
            for d in c.placement.devices:
                pos = state.pos.get(d)
                hid = state.dev_owner[pos] if pos is not None else None
                owner = self._owner_of.get(hid) if hid is not None else None
                if owner is not None and owner.key not in members and self._member(owner.key, node):
                    members[owner.key] = owner
        if not members:
            return
        contest = sorted(members.values(), key=lambda c: c.order)
        rids = {c.rid for c in contest}
        taken: set[int] = set()
        for hid in books.node_holders.get(node, ()):
            if hid not in rids and not self._gives_way(hid):
                h = books.holdings[hid]
                taken.update(h.devices)
                taken.update(s.device for s in h.shares)
        changed = False
        for c in contest:
            wins = not taken.intersection(c.placement.devices)
            taken.update(c.placement.devices)
            changed |= wins != (c.key not in books.pods and c.rid in books.holdings)
            if not wins:
                self.bump(c.key, node)
        if not changed:
            return
        self._contending = True
        try:
            self._bumped.pop(node, None)
            for c in contest:  # all out, then back in claim order (adopting counts a loser instead again)
                counted = books.forget_counted_pod(c.key)
                if counted is not None:
                    self.leases.release(counted)
                self.leases.release(c.rid)
            for c in contest:
                self.settle(c.rid, now)
        finally:
            self._contending = False
        self._events.contended(node)

    def _member(self, key: str, node: str) -> Claim | None:
        """The claim of `key` when it owns its id and holds (or would hold) whole devices of `node` alone."""
        c = self._claim_of.get(key)
        if c is None or c.displaced or c.placement.node != node or c.placement.shares or c.placement.group:
            return None
        owner = self._owner_of.get(c.rid)
        return c if owner is not None and owner.key == key else None

    def _gives_way(self, hid: str) -> bool:
        """Whether an owner's adoption moves the holding `hid` aside (or, foreign use, recounts it after)."""
        books = self.books
        if hid.startswith((TRUTH, FOREIGN)) or (hid in books.slot_of and hid not in books.reservations):
            return True
        res = books.reservations.get(hid)
        return res is not None and res.state == ReservationState.RESERVED

    def _unforeign(self, c: Claim) -> None:
        keys = self._foreign_on.get(c.node)
        if keys is not None and c.key in keys:
            self.books.unhold(FOREIGN + c.key)
            keys.discard(c.key)
            if not keys:
                del self._foreign_on[c.node]

    def _clear(self, node: str) -> None:
        for key in sorted(self._foreign_on.get(node, ())):
            self.books.unhold(FOREIGN + key)

    def refresh(self, node: str) -> None:
        """Recount the foreign holders on `node` from scratch, in claim order, around what else is held."""
        books = self.books
        self._clear(node)
        keys = self._foreign_on.get(node)
        if not keys:
            self._foreign_on.pop(node, None)
            return
        taken: set[int] = set()
        for hid in books.node_holders.get(node, ()):
            h = books.holdings[hid]
            taken.update(h.devices)
            taken.update(s.device for s in h.shares)
        for c in sorted((self._claim_of[k] for k in keys), key=lambda c: c.order):
            p = c.placement
            devices: list[int] = []
            shares: tuple[DeviceShare, ...] = ()
            unknown = 0
            if c.displaced:  # the node's kubelet says another pod holds its devices
                unknown = len(p.devices) + (1 if p.shares else 0)
            elif c.node == p.node:
                for d in p.devices:
                    if d in taken:
                        unknown += 1
                    else:
                        devices.append(d)
                        taken.add(d)
                if p.shares:
                    if any(s.device in taken for s in p.shares):
                        unknown += 1
                    else:
                        shares = p.shares
                        taken.update(s.device for s in p.shares)
            else:  # running somewhere its placement does not name: which GPUs it uses is unknown
                unknown = len(p.devices) + (1 if p.shares else 0)
            books.hold(
                Holding(FOREIGN + c.key, node, tuple(devices), shares, p.cpu_milli, p.memory_mib, unknown)
            )

    # ------------------------------------------------------------------------------------------ views
    def conflicts(self) -> list[list[str]]:
        """[pod, reservation id, why] for every holder that is not its id's owner, sorted."""
        if not self.conflict_count():  # every holder owns its id
            return []  # the common case, without a walk over every reservation (status reports it often)
        out = []
        for rid, keys in self._holders_of.items():
            owner = self._owner_of.get(rid)
            for key in keys:
                if owner is not None and owner.key == key:
                    continue
                c = self._claim_of[key]
                why = c.why or (
                    f"reservation {rid} belongs to pod {owner.key}, its earliest created holder"
                    if owner is not None
                    else "no holder was issued this placement"
                )
                out.append([key, rid, why])
        return sorted(out)
