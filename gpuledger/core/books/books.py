"""The ledger's books: the nodes, and every record of what is held on them (holdings, reservations, gangs,
counted pods), changed only through `hold`/`unhold` so a node's free state equals what its holders use.
Shared by every part of the ledger, which reads the tables and writes them only through `Books`' methods
(one writer: a test reads the core's source for any other); the books never decide a placement, read a
clock or parse an object.
What the parts above must hear of (a holding gone, a node's device truth changed) they are told through
`BookEvents`, given at construction: the books import none of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuledger.core.books.group_slots import ClaimTable, SlotTable
from gpuledger.core.books.topology import Topology
from gpuledger.core.model import DeviceTruth, GroupSlot, NodeInfo, Placement, Reason, ReservationState, Taint
from gpuledger.core.nodes.inventory import ClusterIndex
from gpuledger.core.nodes.node_state import Holding, NodeState
from gpuledger.core.plugins.plugin import DEFAULT_BALANCED_WEIGHTS
from gpuledger.core.pods import placement_codec


@dataclass
class LedgerConfig:
    default_strategy: str = "best_fit"
    reservation_ttl_s: float = 30.0  # unconfirmed reservations expire after this
    tolerated_gpu_taint_keys: tuple[str, ...] = ("nvidia.com/gpu",)  # tolerated on the pod's behalf
    spine_label: str = "topology.scheduler/spine"
    leaf_label: str = "topology.scheduler/leaf"
    leaf_order: tuple[str, ...] = ()  # empty = natural sort of label values
    priority_headroom: float = 0.1  # share of GPU capacity kept for priority >= 1 (strategy `priority`)
    balanced_weights: dict = field(default_factory=lambda: dict(DEFAULT_BALANCED_WEIGHTS))
    placement_key: bytes = b""  # HMAC key for placement annotations (empty = unsigned, dev only)
    utilization_max_age_s: float = 120.0  # node agent utilization older than this is stale (least_utilized)
    # a device whose GPU memory processes outside Kubernetes use at or above this is not placed on (0 = off)
    external_memory_threshold_mib: int = 1024


@dataclass(slots=True)  # no per-object __dict__: one per placement held (500,000 at --scale)
class Reservation:
    placement: Placement
    state: ReservationState
    created: float
    # the placement as admission issued it, when the node's truth moved it since (gpuledger.core.books.truth):
    # the pod carries this one, so the validating webhook checks the pod against it
    issued: Placement | None = None


@dataclass
class GroupState:
    """A gang: its slots (slot -> GroupSlot) and who claimed each (None = unclaimed, held for the group)."""

    key: str
    slots: dict[int, GroupSlot]
    claims: dict[int, str | None]
    deadline: float
    cpu_milli: int = 0
    memory_mib: int = 0
    strategy: str = ""
    slot_taints: dict[int, tuple[Taint, ...]] = field(default_factory=dict)  # taints tolerated per slot

    def __post_init__(self) -> None:
        # tables that keep the plan and the smallest unclaimed slot (a pod's claim costs no scan of the gang)
        if type(self.slots) is not SlotTable:
            self.slots = SlotTable(self.slots)
        if type(self.claims) is not ClaimTable:
            self.claims = ClaimTable(self.claims)

    def plan(self) -> tuple[GroupSlot, ...]:
        return self.slots.plan()  # type: ignore[attr-defined]


TRUTH = "truth:"  # holder id prefix of the devices a node's kubelet says pods the ledger does not own hold


def truth_view(truth: DeviceTruth, blocked: dict[int, int]) -> dict:
    """What a node's agent says of its devices, as the snapshot and `explain` show it."""
    return {
        "source": truth.source,
        "holders": {str(d): [key, list(containers)] for d, key, containers in truth.holders},
        "external": {str(d): [mib, list(pids), d in blocked] for d, mib, pids in truth.external},
        "unmapped": list(truth.unmapped),
    }


def slot_hid(group: str, slot: int) -> str:
    """Holder id of an unclaimed group slot (also what `expiry_candidates` lists for it)."""
    return f"{group}#slot{slot}"


# static filter verdicts for one request shape: node -> (reason or None, taints tolerated for the pod)
StaticVerdicts = dict[str, tuple[Reason | None, tuple[Taint, ...]]]


class BookEvents(Protocol):
    """What the books tell, as each change happens, the parts that keep the claims and the nodes' device truth
    true (gpuledger.core.books.claims and gpuledger.core.books.truth, through
    gpuledger.core.books.adoption)."""

    def freed(self, node: str, hid: str) -> None:
        """The holding `hid` on `node` went: foreign use counted around it there may take its devices."""

    def overlapped(self, node: str, hids: set[str]) -> None:
        """`node` (re)appeared with holdings `hids`, recorded while it was unknown, that share a device."""

    def truth_changed(self, node: str, old: DeviceTruth | None, new: DeviceTruth | None) -> None:
        """What the agent of `node` says of its devices changed (or the node came or went)."""

    def truth_yielded(self, node: str) -> None:
        """The "truth:" holding of `node` gave way to another holding: recount it around that one."""


class Books:
    """The state every part of the ledger shares, and its one writer. Holders are keyed by the caller's id."""

    def __init__(self, config: LedgerConfig, events: BookEvents):
        self.config = config
        self._events = events
        self.index = ClusterIndex()
        self.performance: dict[str, float] = {}  # node -> historical performance in [0, 1] (balanced)
        self.context_extra: dict[str, Any] = {}  # inputs for plug-in strategies
        self.problems: deque[str] = deque(maxlen=200)  # malformed cluster data seen, newest last
        self.holdings: dict[str, Holding] = {}
        self.node_holders: dict[str, set[str]] = {}
        self.reservations: dict[str, Reservation] = {}
        # the RESERVED ones (no stored pod seen yet) -> created: what expiry scans, without walking every
        # confirmed reservation (the sync asks every few seconds; 76,000 pods took ~11 ms a walk)
        self.pending: dict[str, float] = {}
        self.groups: dict[str, GroupState] = {}
        self.slot_of: dict[
            str, tuple[str, int]
        ] = {}  # holder id (claimer or unclaimed slot) -> (group, slot)
        self.pods: dict[str, str] = {}  # pod key -> holder id of a pod counted by its requests ("pod:<key>")
        self.pod_gpus: dict[str, int] = {}  # pod key -> GPUs a pod counted by its requests asks for
        self.pending_moved = 0  # pending reservations moved off a device the node says another pod holds
        self.rr_cursor = ""
        self.last_now = float("-inf")
        # caches of what only node changes invalidate: kept here, where nodes change
        self.filter_cache: dict[tuple, StaticVerdicts] = {}  # static filter signature -> verdicts
        self.topology_cache: Topology | None = None

    # ------------------------------------------------------------------------------------------ inventory
    def upsert_node(self, node: NodeInfo) -> None:
        old = self.index.nodes.get(node.name)
        if old is not None and old.info == node:
            return
        # the topology is the set of leaves: it is rebuilt only when a leaf appears or empties, not for every
        # node that joins or leaves one (at 65,000 nodes a rebuild of it, and of every gang shape's leaf
        # bounds, costs the next gang ~40 ms)
        members, leaf = self.index.leaf_members, (node.spine, node.leaf)
        if leaf not in members or (
            old is not None and old.leaf_key != leaf and members.get(old.leaf_key, 0) <= 1
        ):
            self.topology_cache = None
        if old is not None:
            self.index.remove(node.name)
        state = NodeState(node, self.config.external_memory_threshold_mib)
        overlap: set[str] = set()  # holdings recorded while the node was unknown may name one device twice
        for hid in sorted(self.node_holders.get(node.name, ())):
            h = self.holdings[hid]
            for d in h.devices:
                p = state.pos.get(d)
                if p is not None and state.dev_owner[p] is not None:
                    overlap |= {hid, state.dev_owner[p] or ""}
            state.apply(h)
        self.index.add(state)
        for cache in self.filter_cache.values():
            cache.pop(node.name, None)
        if overlap:
            self._events.overlapped(node.name, overlap)
        was = old.info.truth if old is not None else None
        if was != node.truth:
            self._events.truth_changed(node.name, was, node.truth)

    def remove_node(self, name: str) -> None:
        """Forget a node's capacity; what is held on it stays recorded and returns if the node does."""
        old = self.index.remove(name)
        if old is not None:
            if old.leaf_key not in self.index.leaf_members:  # its leaf emptied (see upsert_node)
                self.topology_cache = None
            for cache in self.filter_cache.values():
                cache.pop(name, None)
            if old.info.truth is not None:
                self._events.truth_changed(name, old.info.truth, None)

    def renew_external(self) -> None:
        """Re-read every node's outside-Kubernetes GPU use against the (changed) threshold."""
        for name in sorted(self.index.nodes):
            state = self.index.nodes[name]
            if state.info.truth is not None and state.info.truth.external:
                info = state.info
                self.index.remove(name)
                fresh = NodeState(info, self.config.external_memory_threshold_mib)
                for hid in sorted(self.node_holders.get(name, ())):
                    fresh.apply(self.holdings[hid])
                self.index.add(fresh)
                for cache in self.filter_cache.values():
                    cache.pop(name, None)

    def topology(self) -> Topology:
        if self.topology_cache is None:
            leaves = list(self.index.leaf_members)
            self.topology_cache = Topology.build(leaves, self.config.leaf_order)
        return self.topology_cache

    # ------------------------------------------------------------------------------------------ holdings
    def hold(self, h: Holding) -> None:
        truth = TRUTH + h.node
        node = self.index.nodes.get(h.node)
        yielded = (
            truth in self.holdings
            and h.id != truth
            and node is not None
            and truth in node.conflicts(h.devices, h.shares)
        )
        if yielded:  # what the node's kubelet lists for others is recounted around what the ledger holds
            self.unhold(truth)
        self.holdings[h.id] = h
        holders = self.node_holders.get(h.node)
        if holders is None:
            self.node_holders[h.node] = {h.id}
        else:
            holders.add(h.id)
        if node is not None:
            self.index.change(node, node.apply, h)
        if yielded:
            self._events.truth_yielded(h.node)

    def hold_unopposed(self, h: Holding, node: NodeState | None) -> None:
        """`hold` of a holding nothing on its node is in the way of, its "truth:" holding included (the caller
        checked: `node` is its node's state, or None while the node is unknown), without the checks: the
        rebuild's shortcut (`Adoption._adopt_at_once`) holds nearly every pod so."""
        self.holdings[h.id] = h
        holders = self.node_holders.get(h.node)
        if holders is None:
            self.node_holders[h.node] = {h.id}
        else:
            holders.add(h.id)
        if node is not None:
            self.index.change(node, node.apply, h)

    def unhold(self, hid: str) -> Holding | None:
        h = self.holdings.pop(hid, None)
        if h is None:
            return None
        holders = self.node_holders.get(h.node)
        if holders is not None:
            holders.discard(hid)
            if not holders:
                del self.node_holders[h.node]
        node = self.index.nodes.get(h.node)
        if node is not None:
            self.index.change(node, node.remove, hid)
        self._events.freed(h.node, hid)
        return h

    # ------------------------------------------------------------------------------------------ reservations
    def record_reserved(self, placement: Placement, now: float) -> None:
        """Record `placement` reserved at `now`, unconfirmed: it expires unless a stored pod confirms it."""
        self.reservations[placement.id] = Reservation(placement, ReservationState.RESERVED, now)
        self.pending[placement.id] = now

    def record_confirmed(self, placement: Placement, now: float) -> None:
        """Record `placement` as a stored pod's, confirmed at `now` (adopted: it never expires)."""
        self.reservations[placement.id] = Reservation(placement, ReservationState.CONFIRMED, now)
        self.pending.pop(placement.id, None)

    def confirm(self, rid: str) -> bool:
        """A stored pod carrying `rid` was seen: its reservation no longer expires. False if there is none."""
        res = self.reservations.get(rid)
        if res is None:
            return False
        res.state = ReservationState.CONFIRMED
        self.pending.pop(rid, None)
        return True

    def forget_reservation(self, rid: str) -> Reservation | None:
        """Forget the reservation `rid` (what it holds stays held: `unhold`); the one forgotten, if any."""
        res = self.reservations.pop(rid, None)
        self.pending.pop(rid, None)
        return res

    def record_move(self, res: Reservation, was: Placement, moved: Placement) -> None:
        """`res`, still pending, moved from `was` to `moved` off a device its node's agent says another pod
        holds; it keeps the placement admission first issued (`issued`), which the pod carries."""
        res.issued = res.issued or was
        res.placement = moved
        self.pending_moved += 1

    def record_round_robin(self, node: str) -> None:
        """The strategy `round_robin` placed its latest pod on `node`: its next turn starts after it."""
        self.rr_cursor = node

    # ------------------------------------------------------------------------------------------ gangs
    def record_group(self, group: GroupState) -> None:
        """Record a gang (replacing any of its key)."""
        self.groups[group.key] = group

    def keep_group(self, group: GroupState) -> None:
        """Record `group` unless a gang of its key is recorded (its own slots that gave way may have dropped
        it)."""
        self.groups.setdefault(group.key, group)

    def record_group_slot(self, group: GroupState, slot: GroupSlot) -> None:
        """Record (or replace) one slot of `group`'s plan."""
        group.slots[slot.slot] = slot

    def record_slot_claim(self, group: GroupState, slot: int, rid: str | None) -> None:
        """Record who claims a slot of `group`: the reservation id `rid`, or None (unclaimed, held for it)."""
        group.claims[slot] = rid

    def record_slot_holder(self, hid: str, group: str, slot: int) -> None:
        """Record that the holder `hid` (a claimer's reservation id, or an unclaimed slot's `slot_hid`) holds
        `slot` of the gang `group`."""
        self.slot_of[hid] = (group, slot)

    def forget_slot_holder(self, hid: str) -> tuple[str, int] | None:
        """Forget which gang slot `hid` holds; (group, slot) it held, if any."""
        return self.slot_of.pop(hid, None)

    def drop_slot(self, group: GroupState, slot: int) -> None:
        """Forget a slot of a gang; a gang left without slots is forgotten."""
        group.slots.pop(slot, None)
        group.claims.pop(slot, None)
        if not group.slots:
            del self.groups[group.key]

    # ------------------------------------------------------------------------------------------ counted pods
    def record_counted_pod(self, key: str, hid: str) -> None:
        """Record that the pod `key` is counted by its requests (or as GPUs of unknown identity) under the
        holder id `hid`."""
        self.pods[key] = hid

    def forget_counted_pod(self, key: str) -> str | None:
        """Forget that the pod `key` is counted (what it holds stays held: `unhold`); its holder id if any."""
        return self.pods.pop(key, None)

    def record_pod_gpus(self, key: str, gpus: int) -> None:
        """Record the GPUs the pod `key`, counted by its requests, asks for."""
        self.pod_gpus[key] = gpus

    def forget_pod_gpus(self, key: str) -> None:
        """Forget the GPUs the pod `key` asks for (it is no longer counted by its requests)."""
        self.pod_gpus.pop(key, None)

    # ---------------------------------------------------------------------------------------- time, problems
    def note_time(self, now: float) -> None:
        """The latest time a caller gave (it never goes back): what the books' parts take for now between
        calls that give none."""
        self.last_now = max(self.last_now, now)

    def record_problem(self, problem: str) -> None:
        """Record malformed cluster data seen (the oldest forgotten past `problems`' length)."""
        self.problems.append(problem)

    def record_problems(self, problems: Iterable[str]) -> None:
        """`record_problem` of each of `problems`, in order."""
        self.problems.extend(problems)

    def filter_verdicts(self, signature: tuple, limit: int) -> StaticVerdicts:
        """The cached static filter verdicts for one request shape (`signature`), for the filters to fill; an
        empty table for a shape not cached, every shape's dropped first when `limit` are."""
        cache = self.filter_cache.get(signature)
        if cache is None:
            if len(self.filter_cache) >= limit:
                self.filter_cache.clear()
            cache = self.filter_cache[signature] = {}
        return cache

    # ------------------------------------------------------------------------------------------ views
    def snapshot(self) -> dict:
        """Canonical state (no timestamps, no rotation cursor): equal for a live ledger and its rebuild."""
        nodes = {}
        for name in sorted(self.index.nodes):
            n = self.index.nodes[name]
            nodes[name] = node_view = {
                "cpu_free": n.cpu_free,
                "mem_free": n.mem_free,
                "unknown_gpus": n.unknown_gpus,
                "devices": [
                    [
                        n.dev_index[p],
                        n.dev_free_milli[p],
                        n.dev_free_mem[p],
                        n.dev_owner[p],
                        sorted([hid, s.milli, s.memory_mib] for hid, s in (n.dev_shares[p] or {}).items()),
                    ]
                    for p in range(len(n.dev_index))
                ],
            }
            if n.info.truth is not None:
                node_view["truth"] = truth_view(n.info.truth, n.external)
        reservations = {
            rid: [res.state.value, placement_codec.placement_to_dict(res.placement)]
            for rid, res in sorted(self.reservations.items())
        }
        groups = {
            key: {
                "deadline": g.deadline,
                "slots": {
                    s: [
                        g.slots[s].node,
                        list(g.slots[s].devices),
                        [[x.device, x.milli] for x in g.slots[s].shares],
                        g.claims.get(s),
                    ]
                    for s in sorted(g.slots)
                },
            }
            for key, g in sorted(self.groups.items())
        }
        holdings = {
            hid: [
                h.node,
                list(h.devices),
                [[s.device, s.milli, s.memory_mib] for s in h.shares],
                h.cpu_milli,
                h.memory_mib,
                h.unknown_gpus,
            ]
            for hid, h in sorted(self.holdings.items())
        }
        return {"nodes": nodes, "reservations": reservations, "groups": groups, "holdings": holdings}
