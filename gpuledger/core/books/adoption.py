"""Following the cluster: Node and Pod objects applied or deleted, the placements stored on pods adopted (a
gang's unclaimed slots restored from the plan a pod carries), and the bulk load that rebuilds a ledger.
One malformed object is recorded as a problem, never fatal; adoption never places a pod of its own.

`Adoption` builds the books and the parts that keep them true to the cluster (leases, claims, the nodes'
device truth), and hears what the books (`BookEvents`) and the claims (`ClaimEvents`) report, passing each on
to the part it concerns: the books and the claims import none of the parts above them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable

from gpuledger.core.books.books import TRUTH, Books, GroupState, LedgerConfig, slot_hid
from gpuledger.core.books.claims import Claim, Claims, bound_claim_of_pod, claim_of
from gpuledger.core.books.leases import Leases
from gpuledger.core.books.truth import Truth
from gpuledger.core.model import DeviceTruth, GroupSlot, Placement, ReservationState
from gpuledger.core.nodes.node_state import Holding
from gpuledger.core.nodes.published_gpus import PublishedSlices
from gpuledger.core.pods import objects as kube
from gpuledger.core.pods.resource_slices import read_slice
from gpuledger.core.steps import Steps, drain
from gpuledger.names import RESOURCE_SLICE_KIND


def _settle_young() -> None:
    """Move every object the collector tracks into its oldest generation, in O(1) (`gc.freeze` splices the
    generations' lists onto the permanent one, `gc.unfreeze` that onto the oldest): a bulk load leaves
    millions of young objects that live as long as the ledger, and the first collection after the collector
    is resumed would walk all of them (~1.1 s at 500,000 pods), then a middle-generation one once more, only
    to promote them where they are put here. Done only while nothing is frozen (unfreezing would thaw what a
    caller froze), and only after a plain load: the count of what is frozen walks it (~0.7 s with a
    500,000-pod ledger frozen, as the ledger actor's is), and a stepped load's caller can freeze at its last
    pause."""
    if not gc.get_freeze_count():
        gc.freeze()
        gc.unfreeze()


class Adoption:
    """Keeps the books equal to what the cluster's Node and Pod objects say."""

    def __init__(self, config: LedgerConfig):
        self.books = Books(config, self)
        self.leases = Leases(self.books)
        self.claims = Claims(self.books, self.leases, self)
        self.truth = Truth(self.books, self.leases, self.claims)
        # the GPUs DRA drivers publish in ResourceSlices (gpuledger.core.nodes.published_gpus): not placed on
        self.published = PublishedSlices()

    # ----------------------------------------------------------------------------- what the books report
    def freed(self, node: str, hid: str) -> None:
        self.claims.freed(node, hid)

    def overlapped(self, node: str, hids: set[str]) -> None:
        self.claims.overlapped(node, hids)

    def truth_changed(self, node: str, old: DeviceTruth | None, new: DeviceTruth | None) -> None:
        self.truth.node_changed(node, old, new)

    def truth_yielded(self, node: str) -> None:
        self.truth.refresh(node)

    # ---------------------------------------------------------------------------- what the claims report
    # (and `adopt`, below)
    def claim_changed(self, key: str, old: Claim | None, new: Claim | None) -> None:
        self.truth.claim_changed(key, old, new)

    def listing_changed(self, key: str, nodes: set[str]) -> None:
        self.truth.refresh_listing(key, nodes)

    def quiet(self, key: str, node: str) -> bool:
        return self.truth.quiet(key, node)

    def contended(self, node: str) -> None:
        self.truth.refresh(node)

    # ---------------------------------------------------------------------------------- cluster objects

    def apply_object(self, obj: dict, now: float) -> None:
        """An ADDED/MODIFIED Node or Pod (or a List of them)."""
        books = self.books
        books.note_time(now)
        for item in kube.iter_objects(obj):
            self.apply_one(item, now)

    def load(self, objects: Iterable[dict], now: float) -> None:
        """Apply every object of a fresh ledger's rebuild."""
        drain(self.load_in_steps(objects, now, 0))

    def load_in_steps(self, objects: Iterable[dict], now: float, step: int) -> Steps[None]:
        """`load`, pausing after every `step` objects (0: never), so that a caller can serve other work
        between the steps (the actor answers admissions from the ledger this one replaces), and once more
        when the load is done but the collector not yet resumed (where a caller that keeps the ledger for
        long freezes it out of the collector's sight: `gc.freeze`). Nothing else may touch this ledger until
        the generator is exhausted."""
        # A rebuild allocates ~10 objects per pod and frees none: the cyclic collector would rescan the
        # growing heap over and over (3x slower at 100k pods), so it is paused for the bulk load (between
        # steps too: closing the generator early restores it).
        was_enabled = gc.isenabled()
        gc.disable()
        index = self.books.index
        index.begin_bulk()
        left = step
        try:
            # streamed: what a pod holds on a node not seen yet is applied when the node arrives
            for obj in kube.iter_objects(objects):
                self.apply_one(obj, now)
                left -= 1
                if not left:
                    yield
                    left = step
            yield from index.end_bulk_in_steps(step)
            if step:
                yield
        finally:
            if index.bulk:  # abandoned mid-load
                index.end_bulk()
            if was_enabled:
                if not step:  # (a stepped load's caller freezes, or not, at its last pause: its choice)
                    _settle_young()
                gc.enable()

    def apply_one(self, item: dict, now: float) -> None:
        books = self.books
        try:
            kind = kube.kind_of(item)
            if kind == "Pod":
                self.apply_pod(item, now)
            elif kind == "Node":
                problems: list[str] = []
                info = kube.node_from_object(item, books.config, problems)
                if not info.name:
                    raise ValueError("metadata.name is missing")
                books.upsert_node(info)
                books.record_problems(problems)
            elif kind == RESOURCE_SLICE_KIND:
                read = read_slice(item)
                self.published.apply(read)
                books.record_problems(read.problems)
        except (TypeError, AttributeError, ValueError, KeyError, IndexError) as err:
            # one malformed object must not stop the ledger from following the cluster
            books.record_problem(
                f"ignored a malformed {type(item).__name__} object: {type(err).__name__}: {err}"
            )

    def delete_object(self, obj: dict) -> None:
        books = self.books
        for item in kube.iter_objects(obj):
            try:
                kind = kube.kind_of(item)
                if kind == "Node":
                    books.remove_node(str((item.get("metadata") or {}).get("name", "")))
                elif kind == "Pod":
                    self.forget_pod(kube.pod_key(item))
                elif kind == RESOURCE_SLICE_KIND:
                    self.published.delete(str((item.get("metadata") or {}).get("name", "")))
            except (TypeError, AttributeError, ValueError, KeyError, IndexError) as err:
                books.record_problem(f"ignored a malformed deleted object: {type(err).__name__}: {err}")

    def forget_pod(self, key: str) -> None:
        self.books.forget_pod_gpus(key)
        hid = self.books.forget_counted_pod(key)
        if hid is not None:
            self.leases.release(hid)
        if self.claims.claim_of(key) is not None:
            self.claims.put(key, None, self.books.last_now)

    def apply_pod(self, obj: dict, now: float) -> None:
        books = self.books
        claim = bound_claim_of_pod(obj, books.config.placement_key)
        if claim is not None:  # the common stored pod, read without its usage
            if not self._adopt_at_once(claim, now):
                self.claims.put(claim.key, self.truth.effective(claim), now)
            return
        problems: list[str] = []
        usage = kube.pod_usage(obj, books.config.placement_key, problems, lazy=True)
        if problems:
            books.record_problems(problems)
        if usage.terminal:
            self.forget_pod(usage.key)
            return
        claim = claim_of(
            usage.key,
            usage.placement,
            usage.unbound,
            usage.placement_problem,
            usage.node,
            usage.created,
            usage.uid,
        )
        if claim is not None:
            self.claims.put(usage.key, self.truth.effective(claim), now)
            return
        if self.claims.claim_of(usage.key) is not None:
            self.claims.put(usage.key, None, now)
        prev = books.pods.get(usage.key)
        hid = "pod:" + usage.key
        if not usage.node or not (usage.cpu_milli or usage.memory_mib or usage.gpus):
            if prev is not None:
                self.forget_pod(usage.key)
            return
        # GPUs the node's kubelet names by identity are held there (gpuledger.core.books.truth), not counted
        # again
        unknown = self.truth.unlisted_gpus(usage.key, usage.node, usage.gpus)
        h = Holding(
            hid, usage.node, cpu_milli=usage.cpu_milli, memory_mib=usage.memory_mib, unknown_gpus=unknown
        )
        if prev == hid and books.holdings.get(hid) == h:
            books.record_pod_gpus(usage.key, usage.gpus)
            return
        if prev is not None:
            self.forget_pod(usage.key)
        books.record_counted_pod(usage.key, hid)
        books.record_pod_gpus(usage.key, usage.gpus)
        books.hold(h)

    def _adopt_at_once(self, claim: Claim, now: float) -> bool:
        """The common pod of a rebuild, in one function: a first holder (`Claims._first_holder`) of a
        placement outside a gang, on devices nobody holds, on nodes without a kubelet's truth or foreign
        holders. Does what `claims.put` (`_own`), `adopt` and `books.hold` do for it, in their order, without
        their walks and checks (~10% of a 500,000-pod rebuild), through the owners' methods for it
        (`Claims.own_at_once`, `Books.hold_unopposed`); False, having changed nothing, for any other pod.
        The integrity property tests' long way (`rebuilt_the_long_way`) never comes here."""
        p = claim.placement
        if p.group is not None and p.slot is not None:
            return False
        books = self.books
        key, rid, where = claim.key, p.id, p.node
        if (
            key in books.pods
            or rid in books.reservations
            or not self.truth.quiet(key, claim.node)  # (so `truth.effective(claim)` is the claim itself)
            or TRUTH + where in books.holdings
        ):
            return False
        state = books.index.nodes.get(where)
        if state is not None and state.conflicts(p.devices, p.shares):
            return False
        if not self.claims.own_at_once(claim):
            return False
        books.hold_unopposed(Holding(rid, where, p.devices, p.shares, p.cpu_milli, p.memory_mib), state)
        books.record_confirmed(p, now)
        return True

    def adopt(
        self, key: str, p: Placement, now: float, displaced: str = "", recorded: Placement | None = None
    ) -> None:
        """Take over the placement of a reservation's owner (rebuild, or a pod whose reservation is gone).
        `displaced`: why the node's kubelet says another pod holds its devices (it is counted instead);
        `recorded`: the placement the pod carries where `p` is its kubelet's devices instead (a gang's slot is
        recorded as planned, as every pod of the gang carries it)."""
        books = self.books
        if p.group is not None and p.slot is not None and not displaced:
            group = books.groups.get(p.group)
            if group is None:
                group = self.restore_group(p, now)
            who = group.claims.get(p.slot)
            if who is not None and who != p.id:
                self.count_instead(key, p)
                return
            if p.slot in group.slots and who is None and slot_hid(p.group, p.slot) in books.holdings:
                books.unhold(slot_hid(p.group, p.slot))
                books.forget_slot_holder(slot_hid(p.group, p.slot))
            if not self.make_room(p):
                self.count_instead(key, p)
                if p.slot in group.slots and group.claims.get(p.slot) is None:
                    books.drop_slot(group, p.slot)
                return
            # the gang's own unclaimed slots that gave way may have taken it with them (the kubelet gave this
            # pod a device another slot was planned on): the pod's gang lives on with this slot
            books.keep_group(group)
            planned = recorded or p
            books.record_group_slot(
                group, GroupSlot(p.slot, planned.node, planned.devices, planned.uuids, planned.shares)
            )
            books.record_slot_claim(group, p.slot, p.id)
            books.record_slot_holder(p.id, p.group, p.slot)
        elif displaced or not self.make_room(p):
            self.count_instead(key, p, displaced)
            if not displaced:  # another holding has its devices: revisited in claim order (claims.contend)
                self.claims.bump(key, p.node)
            return
        books.hold(Holding(p.id, p.node, p.devices, p.shares, p.cpu_milli, p.memory_mib))
        books.record_confirmed(p, now)

    def restore_group(self, p: Placement, now: float) -> GroupState:
        books = self.books
        deadline = p.group_deadline if p.group_deadline is not None else now
        group = GroupState(
            key=p.group or "",
            slots={},
            claims={},
            deadline=deadline,
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
            strategy=p.strategy,
        )
        books.record_group(group)
        if deadline > now:
            for s in p.group_plan:
                if s.slot == p.slot:
                    continue
                node = books.index.nodes.get(s.node)
                if node is not None and node.conflicts(s.devices, s.shares) - {TRUTH + s.node}:
                    continue  # (the node's "truth:" holding gives way to the plan: books.hold)
                books.record_group_slot(group, s)
                books.record_slot_claim(group, s.slot, None)
                hid = slot_hid(group.key, s.slot)
                books.record_slot_holder(hid, group.key, s.slot)
                books.hold(Holding(hid, s.node, s.devices, s.shares, p.cpu_milli, p.memory_mib))
        return group

    def make_room(self, p: Placement) -> bool:
        """Whether a pod's placement can be held: unconfirmed holders in its way give way to the pod."""
        books = self.books
        node = books.index.nodes.get(p.node)
        if node is None:
            return True
        blockers = node.conflicts(p.devices, p.shares)
        if not blockers:
            return True
        for hid in blockers:
            res = books.reservations.get(hid)
            unclaimed = hid in books.slot_of and hid not in books.reservations
            if not unclaimed and (res is None or res.state != ReservationState.RESERVED):
                return False
        for hid in sorted(blockers):
            self.leases.release(hid)
        # a released claimed slot may have returned to its group, unclaimed, on the same devices
        for hid in sorted(node.conflicts(p.devices, p.shares)):
            if hid in books.slot_of and hid not in books.reservations:
                self.leases.release(hid)
        return not node.conflicts(p.devices, p.shares)

    def count_instead(self, key: str, p: Placement, why: str = "") -> None:
        """A placement that collides with a confirmed one (or, `why`, with what the node's kubelet says
        another pod holds): count the pod as GPUs of unknown identity."""
        books = self.books
        books.record_problem(
            f"pod {key}: placement {p.id} on {p.node} collides with another pod{f' ({why})' if why else ''}; "
            f"counted as {len(p.devices)} GPU(s) of unknown identity"
        )
        hid = "pod:" + key
        books.record_counted_pod(key, hid)
        books.hold(
            Holding(
                hid,
                p.node,
                cpu_milli=p.cpu_milli,
                memory_mib=p.memory_mib,
                unknown_gpus=len(p.devices) or (1 if p.shares else 0),
            )
        )
