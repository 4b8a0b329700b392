"""Serving TLS that follows its certificate files without a restart.

Mounted Secrets change by an atomic symlink swap that sends no inotify event on the files we hold, so the
files' content is hashed on a timer. Each change builds a fresh SSLContext; the listening context's SNI
callback (OpenSSL calls it on every ClientHello, with or without SNI) moves each new handshake onto the
newest context, so connections in flight keep theirs and nothing is dropped. A pair that fails to load (a
poll that saw the new key with the old certificate) keeps the previous context until the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import ssl
from pathlib import Path

log = logging.getLogger(__name__)


def _build_context(cert_file: str, key_file: str, client_ca_file: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class ReloadingTLS:
    def __init__(
        self, cert_file: str, key_file: str, client_ca_file: str | None = None, poll_interval_s: float = 1.0
    ):
        self.cert_file, self.key_file, self.client_ca_file = str(cert_file), str(key_file), client_ca_file
        self.poll_interval_s = poll_interval_s
        self._digest = self._files_digest()
        self._current = _build_context(self.cert_file, self.key_file, client_ca_file)
        self.reloads = 0
        self.failed_reloads = 0
        # the listening context: it never changes, it only hands each handshake to the current one
        self.context = _build_context(self.cert_file, self.key_file, client_ca_file)
        self.context.sni_callback = self._pick_context
        self._task: asyncio.Task | None = None

    def _pick_context(self, ssl_obj, server_name, _listening_ctx):  # the ssl callback's signature
        ssl_obj.context = self._current
        return None

    def _files_digest(self) -> bytes:
        h = hashlib.sha256()
        for path in (self.cert_file, self.key_file, self.client_ca_file):
            if path:
                h.update(Path(path).read_bytes())
                h.update(b"\0")
        return h.digest()

    def check(self) -> bool:
        """Reload if the files changed; True when a new context is now in use."""
        try:
            digest = self._files_digest()
        except OSError as exc:  # a file missing mid-swap: try again next poll
            log.warning("TLS files unreadable, keeping the current certificate: %s", exc)
            return False
        if digest == self._digest:
            return False
        try:
            ctx = _build_context(self.cert_file, self.key_file, self.client_ca_file)
        except (ssl.SSLError, OSError, ValueError) as exc:
            self.failed_reloads += 1
            log.warning("new TLS files do not load yet, keeping the current certificate: %s", exc)
            return False
        self._current, self._digest = ctx, digest
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.cert_file)
        return True

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            self.check()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
