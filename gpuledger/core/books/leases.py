"""Reservations' life cycle: held when reserved, kept once a stored pod confirms them, freed on release, and
expired when unconfirmed past the TTL (or, for a gang's unclaimed slots, past its deadline).
Time is always an argument; leases never decide where anything goes.
"""

from __future__ import annotations

from gpuledger.core.books.books import TRUTH, Books, slot_hid
from gpuledger.core.books.group_slots import ClaimTable
from gpuledger.core.model import GroupSlot, Placement
from gpuledger.core.nodes.node_state import Holding


class Leases:
    """Reservations from hold to release: confirm, release (a gang slot goes back to its gang), expire."""

    def __init__(self, books: Books):
        self.books = books
        self._sweeping = False  # a gang's last pod is going and its unclaimed slots go with it

    def hold_reserved(self, placement: Placement, now: float) -> Placement:
        """Hold a single pod's placement, unconfirmed, from `now`."""
        books = self.books
        books.hold(
            Holding(
                placement.id,
                placement.node,
                placement.devices,
                placement.shares,
                placement.cpu_milli,
                placement.memory_mib,
            )
        )
        books.record_reserved(placement, now)
        if placement.strategy == "round_robin":
            books.record_round_robin(placement.node)
        return placement

    def in_the_way(self, s: GroupSlot) -> bool:
        """Whether a holding other than the node's "truth:" one holds a device of slot `s` (as planned: a
        kubelet may have given another of the gang's pods that device)."""
        node = self.books.index.nodes.get(s.node)
        return node is not None and bool(node.conflicts(s.devices, s.shares) - {TRUTH + s.node})

    def confirm(self, id: str, now: float) -> bool:
        """A stored pod carrying `id` was seen: the reservation no longer expires."""
        books = self.books
        books.note_time(now)
        return books.confirm(id)

    def release(self, id: str) -> bool:
        """Free what `id` holds (a reservation, an unclaimed group slot id, or a counted pod). Idempotent.

        A group pod's slot returns to the group, unclaimed, while the group's deadline has not passed and
        another pod of the group still holds a slot (so a replacement pod finds it); otherwise its devices
        are freed. When the last pod of a group goes, its unclaimed slots go too: only pods carry the plan, so
        this is what a rebuild would see."""
        books = self.books
        res = books.forget_reservation(id)
        slot = books.forget_slot_holder(id)
        held = books.unhold(id)
        if slot is not None:
            key, n = slot
            group = books.groups.get(key)
            if group is not None:
                claims: ClaimTable = group.claims  # type: ignore[assignment]  # (GroupState keeps its claims so)
                # whether a pod other than this one holds a slot of the gang
                others = claims.claimed() - (claims.get(n) is not None) > 0
                if (
                    res is not None
                    and others
                    and group.deadline > books.last_now
                    and n in group.slots
                    and not self.in_the_way(group.slots[n])
                ):
                    s = group.slots[n]
                    books.record_slot_claim(group, n, None)
                    hid = slot_hid(key, n)
                    books.record_slot_holder(hid, key, n)
                    books.hold(Holding(hid, s.node, s.devices, s.shares, group.cpu_milli, group.memory_mib))
                else:
                    books.drop_slot(group, n)
                    if key in books.groups and not claims.claimed() and not self._sweeping:
                        # one sweep, here: the slots' own releases find no pod either and would each sweep
                        # again, one call deeper per slot (past Python's recursion limit for a large gang)
                        self._sweeping = True
                        try:
                            for other in sorted(group.slots):
                                self.release(slot_hid(key, other))
                        finally:
                            self._sweeping = False
        return res is not None or held is not None or slot is not None

    def expiry_candidates(self, now: float) -> list[str]:
        """Ids of unconfirmed reservations older than the TTL, and unclaimed group slots past the deadline."""
        books = self.books
        ttl = books.config.reservation_ttl_s
        out = [rid for rid, created in books.pending.items() if created + ttl <= now]
        for group in books.groups.values():
            if group.deadline <= now:
                out += [slot_hid(group.key, s) for s, who in group.claims.items() if who is None]
        return sorted(out)

    def expire(self, now: float) -> list[str]:
        books = self.books
        books.note_time(now)
        ids = self.expiry_candidates(now)
        for rid in ids:
            self.release(rid)
        # claimed slots released above may have returned to their group past its deadline
        for rid in self.expiry_candidates(now):
            if rid not in books.reservations:
                self.release(rid)
        return ids
