"""How the service's live settings change: a replica's pushed config or the runtime strategy switch, each
change recorded (who, when, what) and read by the ledger at its next decision.

The service holds one `LiveSettings` and is told through `SettingsUser` when a change must reach its
ledger; it never decides an admission and never imports an I/O package.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace
from typing import Any, Protocol

from gpuledger.core.ledger import LedgerConfig
from gpuledger.service.settings import LedgerSettings, check_strategy

log = logging.getLogger("gpuledger.service")

SETTINGS_HISTORY = 20  # settings changes kept (who, when, what) for get_settings()


class SettingsUser(Protocol):
    """What `LiveSettings` asks of the service that holds it when settings change."""

    def settings_applied(
        self, config: LedgerConfig, relabel: bool, external_changed: bool, now: float
    ) -> None:
        """`config` is live: the ledger reads it from its next decision on (`relabel`: new leaf/spine label
        keys, which file every node anew; `external_changed`: the external memory threshold changed)."""


def _record(now: float, who: str, changes: dict) -> dict:
    return {"at": now, "by": who, "changes": changes}


class LiveSettings:
    """The live settings and the config they make, who changed them last and when, and the recent changes.
    `config` is the ledger config given at the start with the settings applied."""

    def __init__(self, settings: LedgerSettings, config: LedgerConfig, now: float, user: SettingsUser):
        self.settings = settings
        self.config = settings.applied_to(config)
        self._user = user
        # the config last pushed (apply_config): a replica pushing the same config again changes nothing, so a
        # runtime change (set_default_strategy) lasts until the config itself changes
        self._config_fingerprint = settings.fingerprint()
        self.changed_by, self.changed_at = "config (ledger start)", now
        self._history: deque[dict] = deque([_record(now, self.changed_by, {})], maxlen=SETTINGS_HISTORY)

    def _use(self, settings: LedgerSettings, who: str, now: float) -> dict:
        """Make `settings` live (the ledger reads them at its next decision) and record who and when."""
        old, new = self.settings.as_dict(), settings.as_dict()
        changes = {k: [old[k], new[k]] for k in new if old[k] != new[k]}
        relabel = settings.labels != self.settings.labels
        self.settings = settings
        self.config = settings.applied_to(self.config)
        self._user.settings_applied(self.config, relabel, "external_memory_threshold_mib" in changes, now)
        if changes:
            self.changed_by, self.changed_at = who, now
            self._history.append(_record(now, who, changes))
            log.info(
                "ledger settings changed by %s: %s",
                who,
                ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items()),
            )
        return changes

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
