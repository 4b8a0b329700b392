"""How the service's live settings change: a replica's pushed config or the runtime strategy switch, each
change recorded (who, when, what) and read by the ledger at its next decision.

A mixin of gpuledger.service.ledger_service.LedgerService (moved out of it verbatim); it never decides an
admission and
never imports an I/O package.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.service.settings import LedgerSettings, check_strategy

log = logging.getLogger("gpuledger.service")

SETTINGS_HISTORY = 20  # settings changes kept (who, when, what) for get_settings()


class LiveSettings:
    """The settings half of `LedgerService`: the attributes below are the service's (set in its __init__)."""

    settings: LedgerSettings
    config: LedgerConfig
    ledger: Ledger
    synced: bool
    changed_by: str
    changed_at: float
    _config_fingerprint: str
    _history: deque[dict]
    rebuild_from_source: Callable[[float], bool]

    def _record(self, now: float, who: str, changes: dict) -> dict:
        return {"at": now, "by": who, "changes": changes}

    def _use(self, settings: LedgerSettings, who: str, now: float) -> dict:
        """Make `settings` live (the ledger reads them at its next decision) and record who and when."""
        old, new = self.settings.as_dict(), settings.as_dict()
        changes = {k: [old[k], new[k]] for k in new if old[k] != new[k]}
        relabel = settings.labels != self.settings.labels
        self.settings = settings
        self.config = settings.applied_to(self.config)
        if relabel:
            self._rebuild_for_labels(now)
        else:
            self.ledger.config = self.config  # read at each decision: live from the next admission
            if "external_memory_threshold_mib" in changes:
                self.ledger.renew_external()
        if changes:
            self.changed_by, self.changed_at = who, now
            self._history.append(self._record(now, who, changes))
            log.info(
                "ledger settings changed by %s: %s",
                who,
                ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()),
            )
        return changes

    def _rebuild_for_labels(self, now: float) -> None:
        """New label keys file every node anew: rebuild now from a readable source; a ledger fed from the API
        turns unsynced, so the cluster sync resyncs it (admissions answer Unavailable until then)."""
        if not self.rebuild_from_source(now):
            self.synced = False
            log.warning(
                "leaf/spine label keys changed: the ledger waits for a full resync from the cluster sync"
            )

    def apply_config(self, settings: LedgerSettings, who: str, now: float) -> dict:
        """A replica's config (at its start, or reloaded): applied unless it is the config applied last, so a
        runtime change survives replicas re-pushing an unchanged config. The answer says which."""
        fingerprint = settings.fingerprint()
        if fingerprint == self._config_fingerprint:
            return {"applied": False, "changes": {}, "settings": self.get_settings()}
        self._config_fingerprint = fingerprint
        changes = self._use(settings, who, now)
        return {"applied": True, "changes": changes, "settings": self.get_settings()}

    def set_default_strategy(self, name: str, who: str, now: float) -> dict:
        """The runtime switch (`gpuledger strategy NAME`): ValueError listing the accepted names if
        unknown."""
        if not str(who or "").strip():
            raise ValueError(
                f"who={who!r} is not accepted: expected who asks for the change (a user or component)"
            )
        settings = replace(self.settings, default_strategy=check_strategy(name, "strategy"))
        self._use(settings, str(who), now)
        return self.get_settings()

    def get_settings(self) -> dict[str, Any]:
        """The live settings, who changed them last and when, and the recent changes (newest last)."""
        return {
            **self.settings.as_dict(),
            "changed_by": self.changed_by,
            "changed_at": self.changed_at,
            "config_fingerprint": self._config_fingerprint,
            "history": list(self._history),
        }
