"""The node's word on who holds each device (annotation agentaflow.gpu/device-holders, from the kubelet's
PodResources), made the ledger's. Where the visibility mode lets the kubelet pick the devices, the ledger's
device identities are guesses; this corrects them.

Every correction is a pure function of the Node and Pod objects, never of the order they arrived in, so a live
ledger and its rebuild agree:
- a claim (a stored pod carrying a signed placement) that the kubelet lists on its node holds the listed
  devices instead of the ones its placement names (`Claim.recorded` keeps those): a correction;
- a claim the kubelet does not list, whose devices it lists for another pod, is displaced: counted as GPUs of
  unknown identity (a device conflict);
- every other listed pod (a pod counted by its requests, one in a namespace not opted in, one the ledger has
  not seen) holds its devices by identity under "truth:<node>", and a counted pod's unknown GPUs drop by as
  many. Pending reservations in the way move to a free device of the node where one exists.
"""

from __future__ import annotations

import math
from dataclasses import replace

from gpuledger.core.books.books import TRUTH, Books
from gpuledger.core.books.claims import Claim, Claims
from gpuledger.core.books.leases import Leases
from gpuledger.core.model import DeviceTruth, Placement, ReservationState
from gpuledger.core.nodes.node_state import Holding, NodeState
from gpuledger.names import HOLDERS_ANNOTATION


class Truth:
    """Keeps claims, counted pods and the "truth:<node>" holdings equal to what each node's agent says."""

    def __init__(self, books: Books, leases: Leases, claims: Claims):
        self.books = books
        self.leases = leases
        self.claims = claims
        self.listed_on: dict[str, set[str]] = {}  # pod key -> nodes whose truth lists it
        self.corrected: set[str] = set()  # claims holding the kubelet's devices instead of their placement's
        self.displaced: set[str] = set()  # claims whose devices the kubelet says another pod holds

    # ------------------------------------------------------------------------------------------ reading
    def truth_of(self, node: str) -> tuple[NodeState, DeviceTruth] | None:
        """The node and its truth, when its agent read the kubelet (holders are known)."""
        state = self.books.index.nodes.get(node)
        if state is None or state.info.truth is None or not state.info.truth.known:
            return None
        return state, state.info.truth

    def quiet(self, key: str, node: str) -> bool:
        """Whether a claim of `key` on `node` leaves every "truth:" holding as it is: no node's kubelet lists
        the pod and its node's is not known (`Claims._first_holder`, and the rebuild's shortcut: asked for
        nearly every pod, so `truth_of`'s test is written out here)."""
        if self.listed_on.get(key):
            return False
        state = self.books.index.nodes.get(node)
        return state is None or state.info.truth is None or not state.info.truth.known

    def unlisted_gpus(self, key: str, node: str, gpus: int) -> int:
        """A counted pod's GPUs of unknown identity: those its node's kubelet does not name."""
        found = self.truth_of(node)
        if found is None:
            return gpus
        return max(0, gpus - len(found[1].devices_of(key)))

    def effective(self, c: Claim) -> Claim:
        """`c` as its node's truth makes it: the kubelet's devices, displaced, or as its placement says."""
        if c.recorded is not None or c.displaced:
            c = replace(c, placement=c.recorded or c.placement, recorded=None, displaced="")
        found = self.truth_of(c.node)
        if found is None:
            return c
        state, truth = found
        p = c.placement
        held = truth.holder_of()
        mine = tuple(d for d in sorted(held) if held[d] == c.key)
        if mine and not p.shares:
            devices = list(mine)
            for d in p.devices:  # fewer listed than placed: keep placed devices nobody else is listed on
                if len(devices) >= len(p.devices):
                    break
                if d not in held and d not in devices and d in state.pos:
                    devices.append(d)
            fixed = tuple(sorted(devices))
            if fixed == p.devices and p.node == c.node:
                return c
            uuid = {d.index: d.uuid for d in state.info.devices}
            moved = replace(p, node=c.node, devices=fixed, uuids=tuple(uuid.get(d, "") for d in fixed))
            return replace(c, placement=moved, recorded=p)
        if p.node != c.node:
            return c
        named = list(p.devices) + [s.device for s in p.shares]
        others = [d for d in named if d in held and held[d] != c.key]
        if not others:
            return c
        who = ", ".join(f"device {d} by pod {held[d]}" for d in others)
        return replace(c, displaced=f"the kubelet of {c.node} says {who} (annotation {HOLDERS_ANNOTATION})")

    # ------------------------------------------------------------------------------------------ changes
    def node_changed(self, name: str, old: DeviceTruth | None, new: DeviceTruth | None) -> None:
        """A node's truth changed (or the node came or went): recompute every claim and pod it touches."""
        books = self.books
        old_keys = {k for _, k, _ in old.holders} if old is not None else set()
        new_keys = {k for _, k, _ in new.holders} if new is not None else set()
        for k in old_keys - new_keys:
            nodes = self.listed_on.get(k)
            if nodes is not None:
                nodes.discard(name)
                if not nodes:
                    del self.listed_on[k]
        for k in new_keys:
            self.listed_on.setdefault(k, set()).add(name)
        self.refresh(name)  # the "truth:" holding as the new truth says, before claims are adopted around it
        changes = []
        for k in sorted(old_keys | new_keys | self.claims.keys_on(name)):
            c = self.claims.claim_of(k)
            if c is not None:
                fresh = self.effective(c)
                if fresh != c:
                    changes.append((k, fresh))
        now = books.last_now if math.isfinite(books.last_now) else 0.0
        # all out, then all in: two claims swapping devices never meet half-moved; contention for a device
        # between owners of different ids is settled once all are in, in claim order (Claims.contend)
        outer = self.claims.defer(name)
        try:
            for k, _ in changes:
                self.claims.put(k, None, now)
            for k, fresh in changes:
                self.claims.put(k, fresh, now)
        finally:
            deferred = self.claims.resume(outer)
        for k in sorted(old_keys | new_keys):
            self._recount(k)
        self.refresh(name)
        for node in sorted(deferred):
            self.claims.revisit(node, now)

    def claim_changed(self, key: str, old: Claim | None, new: Claim | None) -> None:
        """Called by Claims.put before it settles: keep the indexes, and let a newly listed claim's devices
        leave the node's "truth:" holding before the claim is adopted on them."""
        if old is not None:
            self.corrected.discard(key)
            self.displaced.discard(key)
        if new is not None:
            if new.recorded is not None:
                self.corrected.add(key)
            if new.displaced:
                self.displaced.add(key)
        self.refresh_listing(key)

    def refresh_listing(self, key: str, nodes: set[str] | frozenset[str] = frozenset()) -> None:
        """Recount the "truth:" holdings of the nodes listing `key` (and of `nodes`, where a claim was)."""
        listed = self.listed_on.get(key)
        found = [n for n in nodes if self.truth_of(n) is not None]
        if not listed and not found:  # (nodes without an agent's truth: nothing to recount)
            return
        for node in sorted((listed or set()).union(found)):
            self.refresh(node)

    def _recount(self, key: str) -> None:
        """A pod counted by its requests: its unknown GPUs as its node's truth now says."""
        books = self.books
        if key not in books.pod_gpus or self.claims.claim_of(key) is not None:
            return
        h = books.holdings.get("pod:" + key)
        if h is None:
            return
        unknown = self.unlisted_gpus(key, h.node, books.pod_gpus[key])
        if unknown != h.unknown_gpus:
            books.unhold(h.id)
            books.hold(replace(h, unknown_gpus=unknown))

    def refresh(self, name: str) -> None:
        """Hold, under "truth:<name>", the devices the kubelet lists for pods with no claim on the node."""
        books = self.books
        hid = TRUTH + name
        if hid in books.holdings:
            books.unhold(hid)
        found = self.truth_of(name)
        if found is None:
            return
        state, truth = found
        wanted = []
        for d, key, _ in truth.holders:
            c = self.claims.claim_of(key)
            if c is None or c.node != name:
                wanted.append(d)
        if not wanted:
            return
        self._clear_way(state, truth, wanted)
        devices, unknown = [], 0
        for d in wanted:
            p = state.pos[d]
            if state.dev_owner[p] is None and not state.dev_nshares[p]:
                devices.append(d)
            else:  # held by what could not move: the pod still uses a GPU
                unknown += 1
        books.hold(Holding(hid, name, tuple(devices), unknown_gpus=unknown))

    def _clear_way(self, state: NodeState, truth: DeviceTruth, wanted: list[int]) -> None:
        """Pending reservations on wanted devices move to free devices the kubelet names for nobody, where
        there are enough (an unclaimed gang slot stays: a rebuild restores it from its gang's plan too)."""
        books = self.books
        listed = truth.holder_of()
        for d in wanted:
            owner = state.dev_owner[state.pos[d]]
            if owner is None:
                continue
            res = books.reservations.get(owner)
            if res is None or res.state != ReservationState.RESERVED or res.placement.group is not None:
                continue
            p = res.placement
            bad = [x for x in p.devices if x in listed]
            free = [
                state.dev_index[q]
                for q in range(len(state.dev_index))
                if state.is_fully_free(q) and state.dev_index[q] not in listed
            ]
            if len(free) < len(bad):
                continue
            devices = tuple(sorted([x for x in p.devices if x not in listed] + free[: len(bad)]))
            uuid = {dev.index: dev.uuid for dev in state.info.devices}
            moved = replace(
                p,
                devices=devices,
                uuids=tuple(uuid.get(x, "") for x in devices) + p.uuids[len(p.devices) :],
            )
            books.unhold(owner)
            books.hold(Holding(owner, p.node, devices, p.shares, p.cpu_milli, p.memory_mib))
            books.record_move(res, p, moved)

    # ------------------------------------------------------------------------------------------ views
    def corrections(self) -> list[list]:
        """[pod, reservation id, node, devices its placement names, devices the kubelet says it holds]."""
        out = []
        for key in sorted(self.corrected):
            c = self.claims.claim_of(key)
            if c is not None:  # (always: a claim leaves this index as it goes)
                recorded: Placement = c.recorded or c.placement
                out.append([key, c.rid, c.node, list(recorded.devices), list(c.placement.devices)])
        return out

    def conflicts(self) -> list[list[str]]:
        """[pod, reservation id, why] for every claim whose devices the kubelet says another pod holds."""
        return [
            [key, c.rid, c.displaced]
            for key in sorted(self.displaced)
            if (c := self.claims.claim_of(key)) is not None  # (always: a claim leaves this index as it goes)
        ]
