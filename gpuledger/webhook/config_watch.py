"""Follows the config file and keeps the live ledger's settings on it: a changed file reaches the ledger.

The file's content is hashed on a timer (a mounted ConfigMap changes by symlink swap, as the TLS Secret does);
a change is loaded and validated and its ledger settings pushed. The same settings are re-pushed now and then,
so a ledger actor that restarted with its creator's settings gets the current ones back (the ledger ignores a
config it applied last, so a runtime `set_default_strategy` survives). Never decides anything itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gpuledger.service.settings import LedgerSettings
from gpuledger.webhook.config import LIVE_KEYS, WebhookConfig

log = logging.getLogger("gpuledger.config")

Push = Callable[[LedgerSettings, str], Awaitable[dict]]


class ConfigWatcher:
    """`check(now)` is one poll (tests call it with their own clock); `start()` polls every interval."""

    def __init__(
        self,
        path: str | Path,
        load: Callable[[], WebhookConfig],
        push: Push,
        *,
        source: str = "",
        current: WebhookConfig | None = None,
        poll_interval_s: float = 1.0,
        repush_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.path, self.load, self.push = Path(path), load, push
        self.source = source  # who pushes, as recorded by the ledger (e.g. the pod's name)
        self.poll_interval_s, self.repush_interval_s, self.clock = poll_interval_s, repush_interval_s, clock
        self.config = current
        self._digest: str | None = None  # nothing loaded yet: the first check loads and pushes
        self._bad_digest: str | None = None  # a file that did not load (reported once)
        self._next_push = float("-inf")
        self.reloads = self.failed_reloads = self.failed_pushes = 0
        self.last_answer: dict | None = None
        self._task: asyncio.Task | None = None

    def _read_digest(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    async def check(self, now: float) -> bool:
        """Load the file if it changed and push its settings (or re-push when due); True when the ledger
        applied a change. A file that does not load keeps the current settings, and says why in the log."""
        try:
            digest = self._read_digest()
        except OSError as exc:  # mid-swap, or the mount is gone: try again next poll
            log.warning("config file %s unreadable, keeping the current settings: %s", self.path, exc)
            return False
        if digest not in (self._digest, self._bad_digest):
            try:
                config = self.load()
            except (OSError, ValueError, TypeError) as exc:
                self.failed_reloads += 1
                self._bad_digest = digest
                log.error("config file %s not applied, keeping the current settings: %s", self.path, exc)
            else:
                if self._digest is not None:
                    self.reloads += 1
                    self._log_restart_keys(config)
                self.config, self._digest, self._next_push = config, digest, float("-inf")
        if self.config is None or self._digest is None or now < self._next_push:
            return False
        who = f"config file {self.path} (sha256 {self._digest[:12]})"
        if self.source:
            who += f" via {self.source}"
        try:
            answer = await self.push(self.config.ledger_settings(), who)
        except Exception as exc:  # noqa: BLE001 - the ledger down or restarting: push again next poll
            self.failed_pushes += 1
            log.warning("could not push the config's settings to the ledger (next poll retries): %s", exc)
            return False
        self._next_push = now + self.repush_interval_s
        self.last_answer = answer
        return bool(answer.get("applied"))

    def _log_restart_keys(self, new: WebhookConfig) -> None:
        old = self.config
        if old is None:
            return
        later = [k for k, v in new.__dict__.items() if k not in LIVE_KEYS and old.__dict__.get(k) != v]
        if later:
            log.warning(
                "config keys %s changed in %s: they take effect when the webhook restarts (only %s "
                "apply live)",
                ", ".join(sorted(later)),
                self.path,
                ", ".join(LIVE_KEYS),
            )

    async def _poll(self) -> None:
        while True:
            await self.check(self.clock())
            await asyncio.sleep(self.poll_interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def ray_push(handle: Any) -> Push:
    """Push through the shared ledger actor (its `apply_config`)."""

    async def push(settings: LedgerSettings, who: str) -> dict:
        return await handle.apply_config.remote(settings, who)

    return push
