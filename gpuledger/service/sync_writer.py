"""Which cluster sync may write the ledger: one at a time, fenced.

Every webhook replica runs a cluster sync, and each watch stream is ordered only within itself. Two syncs
feeding one ledger interleave: a replica that lags delivers "pod default/p deleted" after a new pod of the
same name was placed on the freed GPU, and the ledger frees that GPU a second time (a third pod is then
admitted on it). So the ledger grants the right to write (apply_events, resync, the expiry's confirm and
release) to one sync at a time, as a lease it renews, and refuses those calls from anyone else. A new holder
starts with a full list: its writes are refused until its `resync` arrives, because nothing says where the
stream of the previous holder stopped. The other replicas keep watching (their webhooks' Events read the pod
stream) and ask again each renewal; the first to ask after the holder stops (it hands the lease back) or
goes silent for the lease's term takes over.

Pure: time comes in as `now` (the actor's clock, never a replica's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

DEFAULT_TERM_S = 30.0
MAX_TERM_S = 600.0


class SyncFenced(RuntimeError):
    """A sync call from a caller that does not hold the ledger's sync lease (or has not listed yet)."""


class SyncLeaseAnswer(TypedDict):
    held: bool  # whether the caller holds the lease now
    holder: str  # who holds it ("" for nobody)
    # a term: (the ledger's incarnation, its epoch), the epoch bumped each time the lease passes to a holder
    # that did not hold it the moment before. A sync whose term changed sends a full list first.
    incarnation: str
    epoch: int
    listed: bool  # whether the holder's full list (resync) has reached the ledger since it took the lease
    expires_in: float  # seconds of the term left (0 when nobody holds it)


def check_term(term_s: object, what: str = "sync lease term") -> float:
    """The term a sync asked for, in seconds (it crosses Ray from a replica's config, `what` names it)."""
    if isinstance(term_s, bool) or not isinstance(term_s, (int, float)) or not 0 < term_s <= MAX_TERM_S:
        raise ValueError(f"{what} {term_s!r}: expected seconds, more than 0 and at most {MAX_TERM_S:g}")
    return float(term_s)


@dataclass
class SyncWriter:
    """The ledger's sync lease: who holds it, until when, and whether its full list has arrived."""

    incarnation: str = ""  # the ledger's (a restarted actor starts its epochs again)
    holder: str = ""
    epoch: int = 0
    expires: float = 0.0
    term_s: float = DEFAULT_TERM_S
    listed: bool = False

    def live(self, now: float) -> bool:
        return bool(self.holder) and now < self.expires

    def answer(self, who: str, now: float) -> SyncLeaseAnswer:
        live = self.live(now)
        return SyncLeaseAnswer(
            held=live and who == self.holder,
            holder=self.holder if live else "",
            incarnation=self.incarnation,
            epoch=self.epoch,
            listed=live and self.listed,
            expires_in=max(0.0, self.expires - now) if live else 0.0,
        )

    def acquire(self, who: str, now: float, term_s: float = DEFAULT_TERM_S) -> SyncLeaseAnswer:
        """Take the lease if it is free or lapsed, renew it if `who` holds it; otherwise leave it be."""
        if not who:
            raise ValueError("sync lease holder '': expected the sync's identity (host/pid/random)")
        term_s = check_term(term_s)
        if self.live(now) and self.holder != who:
            return self.answer(who, now)
        if not self.live(now):  # a new term: whatever this caller streamed before is not known to be whole
            self.holder, self.epoch, self.listed = who, self.epoch + 1, False
        self.term_s, self.expires = term_s, now + term_s
        return self.answer(who, now)

    def hand_back(self, who: str, now: float) -> SyncLeaseAnswer:
        """The holder stops: the lease is free at once (the next replica to ask takes it)."""
        if self.holder == who:
            self.holder, self.expires, self.listed = "", 0.0, False
        return self.answer(who, now)

    def check(self, who: str | None, now: float, method: str, listing: bool = False) -> None:
        """Raise SyncFenced unless `who` may make this sync call now.

        `who` None is a caller with no sync identity (the in-process sync, a test): allowed only while no
        sync holds the lease, so it can never interleave with one that does."""
        live = self.live(now)
        if who is None:
            if live:
                raise SyncFenced(
                    f"{method} without a sync identity while {self.holder!r} holds the ledger's sync lease"
                )
            return
        if not live or self.holder != who:
            held = f"{self.holder!r} holds it" if live else "nobody holds it"
            raise SyncFenced(
                f"{method} from {who!r}, which does not hold the ledger's sync lease ({held}); "
                "ask for the lease (sync_lease) and send a full list first"
            )
        if not listing and not self.listed:
            raise SyncFenced(
                f"{method} from {who!r} before its full list: a new holder of the sync lease sends resync "
                "first"
            )

    def listed_by(self, who: str | None, now: float) -> None:
        """The holder's full list reached the ledger at `now` (after the rebuild): its stream continues from
        there, and its term starts again (a rebuild of 500,000 pods can outlast a term)."""
        if who is not None and who == self.holder:
            self.listed, self.expires = True, now + self.term_s


def is_fenced(error: BaseException) -> bool:
    """Whether a failed call was refused by the lease: a SyncFenced over the ledger channel (its client raises
    one) and over Ray (whose task error is an instance of its cause's class), or an error naming it (Ray's
    error when it cannot rebuild the cause's class)."""
    return isinstance(error, SyncFenced) or "SyncFenced" in str(error)
