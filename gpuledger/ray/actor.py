"""The ledger held by a Ray actor: named and detached in its own namespace, shared by every webhook replica.

A thin shell around `LedgerService`: every method takes a batch, so one actor call (~1.2 ms of Ray overhead
here) carries many admissions. It is an async actor whose methods never await, so each call runs to the end
before the next starts (the ledger needs no lock), while the sweeper runs between calls on the same loop.
One exception: `resync` builds the new ledger in steps and awaits between them, so admissions go on being
answered, from the ledger it replaces, during a rebuild that takes ~20 s at 65,000 nodes and 500,000 pods.
The cluster's other writes (events, the sync's confirm and release, a new config) wait for it behind a lock;
admissions, the webhook's own releases and the sync lease's renewals do not.
On a restart Ray calls `__init__` again with the same arguments: the ledger is rebuilt from its source (the
cluster file, or an empty ledger marked unsynced that gpuledger.sync.cluster_sync refills with `resync`), and
its
settings are the creator's again until a replica re-pushes its config (`apply_config`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

import ray

from gpuledger.core.ledger import LedgerConfig
from gpuledger.ray.channel import ChannelInfo, ChannelServer, channel_host
from gpuledger.service.ledger_service import RESYNC_STEP, AdmitCall, LedgerService, ServedCalls, ServiceStats
from gpuledger.service.settings import LedgerSettings
from gpuledger.service.sync_writer import DEFAULT_TERM_S, SyncLeaseAnswer

ACTOR_NAME = "gpu-ledger"
RAY_NAMESPACE = "gpuledger"
MAX_TASK_RETRIES = 3  # calls in flight when the actor dies are re-run on its successor (keyed by id: safe)

log = logging.getLogger("gpuledger.actor")


class LedgerActor:
    def __init__(
        self,
        config: LedgerConfig,
        source_spec: dict | None = None,
        sweep_interval_s: float = 1.0,
        settings: LedgerSettings | None = None,
        resync_step: int = RESYNC_STEP,
    ):
        self.resync_step = resync_step  # objects built between two pauses of a resync (0: none)
        # the cluster's writes, one at a time (made on the actor's loop, at first use)
        self._writes: asyncio.Lock | None = None
        self.resyncing = False  # a resync's build under way (status reports it)
        self.incarnation = uuid.uuid4().hex[:12]
        self.started_at = time.time()
        self.sweep_interval_s = sweep_interval_s
        self.service = LedgerService(
            config, source_spec, now=self.started_at, settings=settings, incarnation=self.incarnation
        )
        # the inventory lives for the actor's life: keep full collections from walking it (latency spikes)
        gc.collect()
        gc.freeze()
        self.calls = 0
        self.items = 0
        self._sweeper: asyncio.Task | None = None
        self.channel = ChannelServer(lambda method, args: getattr(self, method)(*args))

    def _tick(self, n: int = 1) -> None:
        self.calls += 1
        self.items += n
        # on every call, so only cheap checks here (status() walks every reservation for conflicts)
        if self._sweeper is None and self.sweep_interval_s > 0 and not self.service.external_source:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                expired = self.service.sweep(time.time())
                if expired:
                    log.info("expired %d unconfirmed reservation(s)", len(expired))
            except Exception:
                log.exception("sweep failed")

    def _write_lock(self) -> asyncio.Lock:
        if self._writes is None:
            self._writes = asyncio.Lock()
        return self._writes

    # ------------------------------------------------------------ admission (the webhook)
    async def admit(self, calls: list[AdmitCall | tuple]) -> list:
        self._tick(len(calls))
        return self.service.admit(calls, time.time())

    async def lookup(self, ids: list[str]) -> list:
        self._tick(len(ids))
        return self.service.lookup(ids)

    async def claim(self, ids: list[str | tuple[str, str]]) -> list:
        self._tick(len(ids))
        return self.service.claim(ids)

    async def open_channel(self, mode: str = "auto", caller_node: str = "") -> ChannelInfo:
        """Where a replica reaches the direct channel (gpuledger.ray.channel)."""
        node_id = ray.get_runtime_context().get_node_id()
        host = channel_host(mode, caller_node, node_id, ray.util.get_node_ip_address)
        port = await self.channel.listen(host)
        token = self.channel.token.hex()
        return ChannelInfo(host=host, port=port, token=token, node_id=node_id, incarnation=self.incarnation)

    # ------------------------------------------------------------ cluster (gpuledger.sync.cluster_sync)
    # `holder`: the sync making the call, which must hold the ledger's sync lease
    # (gpuledger.service.sync_writer)
    async def apply_events(self, events: list[tuple[str, dict]], holder: str | None = None) -> int:
        self._tick(len(events))
        async with self._write_lock():
            return self.service.apply_events(events, time.time(), holder)

    async def place_waiting(self, holder: str | None = None) -> list:
        """The next placements of waiting pods (the sync's placement adapter writes them)."""
        self._tick()
        async with self._write_lock():
            return self.service.place_waiting(time.time(), holder)

    async def preemptions_due(self, holder: str | None = None) -> list:
        """The preemptions the ledger holds whose victims are not all gone (the sync's evictor carries them
        out)."""
        self._tick()
        async with self._write_lock():
            return self.service.preemptions_due(time.time(), holder)

    async def eviction_refused(self, refusals: list, holder: str | None = None) -> None:
        """Victims the API server would not evict: their plans are dropped and planned again."""
        self._tick(len(refusals))
        async with self._write_lock():
            self.service.eviction_refused(refusals, time.time(), holder)

    async def queue_status(self, holder: str | None = None) -> dict[str, dict]:
        """GPUQueue name -> the body of its `.status`, from the ledger's books."""
        self._tick()
        async with self._write_lock():
            return self.service.queue_status(time.time(), holder)

    async def waiting_line(self, limit: int | None = 100) -> list:
        self._tick()
        return self.service.waiting_line(limit)

    async def resync(self, objects: list[dict], holder: str | None = None) -> dict:
        """The new ledger is built in steps, answering the calls that arrive between them (see the module)."""
        self._tick(len(objects))
        async with self._write_lock():
            before = self.service.rebuilds
            steps = self.service.resync_in_steps(objects, time.time(), holder, self.resync_step)
            self.resyncing = True
            try:
                while True:
                    try:
                        next(steps)
                    except StopIteration as done:
                        result = done.value
                        break
                    # what the step built lives until the next rebuild: out of the collector's sight (O(1);
                    # a collection of the young generation would otherwise walk the whole new ledger)
                    gc.freeze()
                    await asyncio.sleep(0)  # one turn of the loop: the admissions that arrived meanwhile
            finally:
                self.resyncing = False
            self._settle_heap(before)
        return result

    def _settle_heap(self, rebuilds_before: int) -> None:
        """After a rebuild: the new ledger lives until the next one, so move it out of the collector's sight
        (the core pauses the collector while it loads; otherwise the first collection of the oldest generation
        after it walks all of it: ~1.2 s at 65,000 nodes and 500,000 pods, against a 2 s admission deadline).
        The replaced ledger needs no collection: the service discards it, and refcounting frees it."""
        if self.service.rebuilds == rebuilds_before:
            return
        gc.freeze()  # (O(1): the generations' lists are moved, not walked)

    async def confirm(self, ids: list[str], holder: str | None = None) -> list[bool]:
        self._tick(len(ids))
        if holder is None:  # the webhook's: served during a resync, as admissions are
            return self.service.confirm(ids, time.time())
        async with self._write_lock():
            return self.service.confirm(ids, time.time(), holder)

    async def release(self, ids: list[str], holder: str | None = None) -> list[bool]:
        self._tick(len(ids))
        if holder is None:
            return self.service.release(ids, time.time())
        async with self._write_lock():
            return self.service.release(ids, time.time(), holder)

    async def sync_lease(
        self, holder: str, term_s: float = DEFAULT_TERM_S, hand_back: bool = False
    ) -> SyncLeaseAnswer:
        """Take, renew or hand back the right to write the ledger from the cluster, on the actor's clock."""
        self._tick()
        return self.service.sync_lease(holder, time.time(), term_s, hand_back)

    async def expiry_candidates(self, now: float | None = None) -> list[str]:
        self._tick()
        return self.service.expiry_candidates(time.time() if now is None else now)

    async def sweep(self, now: float | None = None) -> list[str]:
        self._tick()
        return self.service.sweep(time.time() if now is None else now)

    # ----------------------------------------------- settings (webhook replicas, `gpuledger strategy`)
    async def apply_config(self, settings: LedgerSettings, who: str, now: float | None = None) -> dict:
        self._tick()
        async with self._write_lock():  # (a config read by a resync's build must not change under it)
            before = self.service.rebuilds  # new leaf or spine labels rebuild the ledger
            result = self.service.apply_config(settings, who, time.time() if now is None else now)
            self._settle_heap(before)
            return result

    async def set_default_strategy(self, name: str, who: str, now: float | None = None) -> dict:
        self._tick()
        async with self._write_lock():
            return self.service.set_default_strategy(name, who, time.time() if now is None else now)

    async def get_settings(self) -> dict:
        self._tick()
        return self.service.get_settings()

    # ------------------------------------------------------------ reading
    async def status(self) -> dict[str, Any]:
        self._tick()
        return {
            **self.service.status(),
            "incarnation": self.incarnation,
            "started_at": self.started_at,
            "calls": self.calls,
            "items": self.items,
            "channel_connections": self.channel.connections,
            "resyncing": self.resyncing,
        }

    async def stats(self) -> ServiceStats:
        self._tick()
        served = ServedCalls(self.incarnation, dict(self.channel.calls), dict(self.channel.seconds))
        return replace(self.service.stats(time.time()), served=served)

    async def explain(self, request: Any, now: float | None = None) -> Any:
        """The decision the ledger would make now (with GPU queues: the preemption it could make, or why
        none); reserves nothing."""
        self._tick()
        return self.service.explain(request, time.time() if now is None else now)

    async def snapshot(self) -> dict:
        self._tick()
        return self.service.snapshot()

    async def ping(self) -> str:
        return self.incarnation


def get_or_create_ledger(
    config: LedgerConfig,
    source_spec: dict | None = None,
    *,
    settings: LedgerSettings | None = None,
    name: str = ACTOR_NAME,
    namespace: str = RAY_NAMESPACE,
    sweep_interval_s: float = 1.0,
    resync_step: int = RESYNC_STEP,
) -> Any:
    """The shared ledger actor's handle; created by whichever replica gets there first.

    `get_if_exists` makes get-or-create atomic in Ray's GCS, so replicas starting together race safely; the
    arguments of the replica that created it win; a later replica's config reaches the live ledger through
    `apply_config` (gpuledger serve pushes it at start and whenever the config file changes).
    """
    if not ray.is_initialized():
        raise RuntimeError("ray.init() first (gpuledger serve does it from --ray-address)")
    cls = ray.remote(LedgerActor)
    return cls.options(
        name=name,
        namespace=namespace,
        get_if_exists=True,
        lifetime="detached",
        max_restarts=-1,
        max_task_retries=MAX_TASK_RETRIES,
        num_cpus=0,
        max_concurrency=64,
    ).remote(config, source_spec, sweep_interval_s, settings, resync_step)


def wait_ready(handle: Any, timeout_s: float = 60.0) -> dict:
    """Block until the actor answers `status` (its __init__ has run)."""
    return ray.get(handle.status.remote(), timeout=timeout_s)
