"""`gpuledger controller`: the GPUWorkload/GPUNode controller, one leader among its replicas.

Joins the Ray cluster that holds the ledger actor (created by `gpuledger serve`), waits to hold the Lease,
then runs the kopf watches and the reconcile engine until stopped or until the Lease is lost (then it exits
non-zero, as controller-runtime's managers do, and its Deployment restarts it as a standby).

SIGTERM or SIGINT stops it at once in every phase: the ledger wait, the Lease wait, kopf's start-up and its
run all wait on one stop (a `threading.Event` for the threads, an `asyncio.Event` for the loop), never on a
sleep of their own. `/healthz` and `/readyz` are gpuledger.controller.health's.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, NoReturn

from gpuledger.controller import leader
from gpuledger.controller.controller import EngineSettings
from gpuledger.controller.queue import DEFAULT_BACKFILL_WINDOW_S
from gpuledger.names import (
    AGENTAFLOW_GROUP,
    AGENTAFLOW_VERSION,
    GPUNODE_PLURAL,
    GPUWORKLOAD_PLURAL,
    SYSTEM_NAMESPACE,
    WARP_GROUP,
    WARP_VERSION,
    WHEN_FULL_REFUSE,
    WHEN_FULL_WAIT,
)

log = logging.getLogger("gpuledger.controller")

EXIT_LEASE_LOST = 3
KOPF_GRACE_S = 0.5  # after a stop, for kopf's tasks to end on their own before they are cancelled
LEDGER_WAIT_S = 120.0  # for Ray and the ledger actor, before the event loop and its probe server run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuledger controller", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", help="kubeconfig for the API (default: in-cluster, then ~/.kube/config)")
    p.add_argument(
        "--ray-address", help="the Ray cluster holding the ledger actor (default: RAY_ADDRESS or auto)"
    )
    p.add_argument("--ray-namespace", default="gpuledger", help="the ledger actor's Ray namespace")
    p.add_argument("--actor-name", default="gpu-ledger", help="the ledger actor's name")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", SYSTEM_NAMESPACE))
    p.add_argument("--lease-name", default="gpuledger-controller")
    p.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
        help="this replica's name in the Lease (default: $POD_NAME, else host-pid)",
    )
    p.add_argument("--lease-duration", type=float, default=leader.DEFAULT_LEASE_S)
    p.add_argument("--renew-deadline", type=float, default=leader.DEFAULT_RENEW_DEADLINE_S)
    p.add_argument("--retry-period", type=float, default=leader.DEFAULT_RETRY_S)
    p.add_argument(
        "--backfill-window",
        type=float,
        default=DEFAULT_BACKFILL_WINDOW_S,
        help="seconds a blocked workload may be passed by smaller ones before it blocks them",
    )
    p.add_argument(
        "--placing-timeout",
        type=float,
        default=EngineSettings.placing_timeout_s,
        help="seconds for a started workload's pods to be placed before the attempt is retried",
    )
    p.add_argument(
        "--gpunode-interval",
        type=float,
        default=EngineSettings.gpunode_interval_s,
        help="at most one GPUNode refresh per this many seconds",
    )
    p.add_argument(
        "--requeue-interval",
        type=float,
        default=EngineSettings.requeue_interval_s,
        help="while workloads wait, look again this often for capacity freed without an API event "
        "(an expired reservation); freed pods wake the queue at once regardless (0: never)",
    )
    p.add_argument(
        "--when-full",
        choices=(WHEN_FULL_WAIT, WHEN_FULL_REFUSE),
        default=WHEN_FULL_WAIT,
        help="for a GPUWorkload without the annotation topology.scheduler/when-full: wait (its Job is "
        "created at once; its pods wait in the ledger's one line with every other pod) or refuse (it waits "
        "in this controller's queue until the ledger can place it whole); set it as the webhook's when_full",
    )
    p.add_argument("--no-gpunodes", action="store_true", help="do not write GPUNode objects")
    p.add_argument("--metrics-host", default="0.0.0.0")
    p.add_argument("--metrics-port", type=int, default=8080, help="/metrics (0: no metrics server)")
    p.add_argument(
        "--liveness-port",
        type=int,
        default=8081,
        help="/healthz (the controller's event loop answers) and /readyz (leader, or a standby that reaches "
        "the API server and the ledger), on --metrics-host (0: no probe server)",
    )
    p.add_argument("--log-level", default=os.environ.get("GPULEDGER_LOG_LEVEL", "INFO"))
    return p


def _kube_client(kubeconfig: str | None) -> Any:
    from kubernetes import client
    from kubernetes import config as kconfig

    if kubeconfig:
        return kconfig.new_client_from_config(config_file=kubeconfig)
    try:
        kconfig.load_incluster_config()
        return client.ApiClient()
    except kconfig.ConfigException:
        return kconfig.new_client_from_config()


def _on_stop_signals(halt: threading.Event) -> None:
    """Until the event loop runs: SIGINT and SIGTERM set `halt`, which every wait before the loop waits on."""

    def handler(signum: int, _frame: Any) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        halt.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def _ledger_handle(args: argparse.Namespace, halt: threading.Event, timeout_s: float = LEDGER_WAIT_S) -> Any:
    """The ledger actor `gpuledger serve` created: waited for, never created here. None: stopped first."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:  # beside the webhook, its Ray may still be starting
        if halt.is_set():
            return None
        try:
            ray.init(
                address=args.ray_address or os.environ.get("RAY_ADDRESS") or "auto",
                namespace=args.ray_namespace,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
            break
        except ConnectionError as err:
            if time.monotonic() > deadline:
                raise
            log.info("waiting for Ray: %s", err)
        except SystemExit as exit_:  # ray.init's own SIGTERM handler exits with the signal's number
            if exit_.code != signal.SIGTERM:
                raise
            return None
        finally:
            _on_stop_signals(halt)  # ray.init replaced ours for SIGTERM
        if halt.wait(2.0):
            return None
    waiting = False
    while not halt.is_set():
        try:
            return ray.get_actor(args.actor_name, namespace=args.ray_namespace)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            if not waiting:
                log.info("waiting for the ledger actor %s/%s", args.ray_namespace, args.actor_name)
                waiting = True
        halt.wait(1.0)
    return None


def _seed(engine: Any, writer: Any) -> None:
    """Every GPUWorkload of both groups (and the GPUNodes) before the first pass: the queue starts whole."""
    for group, version in ((AGENTAFLOW_GROUP, AGENTAFLOW_VERSION), (WARP_GROUP, WARP_VERSION)):
        listed = writer.custom.list_cluster_custom_object(group, version, GPUWORKLOAD_PLURAL)
        for obj in listed.get("items") or []:
            obj.setdefault("apiVersion", f"{group}/{version}")
            engine.observe_workload(None, obj)
    # GPUNodes written before (a previous leader): known, so that those of nodes now gone are deleted
    for obj in (
        writer.custom.list_cluster_custom_object(AGENTAFLOW_GROUP, AGENTAFLOW_VERSION, GPUNODE_PLURAL).get(
            "items"
        )
        or []
    ):
        engine.gpunode_status[obj["metadata"]["name"]] = obj.get("status") or {}


def _writer(api_client: Any) -> Any:
    import kopf  # noqa: F401 - imported here, in a thread

    import gpuledger.controller.handlers  # noqa: F401
    from gpuledger.controller.kube import KubeWriter

    return KubeWriter(api_client)


async def _run_kopf(running: Any, stopped: asyncio.Task, grace_s: float = KOPF_GRACE_S) -> None:
    """kopf's `run_tasks` until it ends; once `stopped`, `grace_s` more at most, then it is cancelled.

    Stopped on the stop flag, kopf cancels its root tasks and then waits up to a hard-coded 5 s for the tasks
    they spawned; stopped during its start-up (the login cancelled), its watch requests wait for credentials
    that never come for all of that time. Cancelled, kopf cancels those tasks at once (its own path when
    the operator itself is cancelled)."""
    runner = asyncio.ensure_future(running)
    await asyncio.wait({runner, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not runner.done():
        await asyncio.wait({runner}, timeout=grace_s)
    if not runner.done():
        log.info("kopf did not stop within %.1fs: cancelling its tasks", grace_s)
        runner.cancel()
        await asyncio.wait({runner})
    if not runner.cancelled():
        runner.result()  # kopf's own failure, if it ended on one


def _stop_signals(loop: asyncio.AbstractEventLoop, request_stop: Any) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, request_stop)


async def _close_when_stopped(stop: asyncio.Event, health: Any) -> None:
    """Created before kopf's tasks (so kopf leaves it alone): the probe server closes its connections as
    soon as the stop comes, so that none is left for kopf's shutdown to wait for."""
    await stop.wait()
    await health.close()


async def run(
    args: argparse.Namespace,
    api_client: Any,
    ledger_view: Any,
    stop: asyncio.Event,
    halt: threading.Event | None = None,
    ledger_check: Any = None,
) -> int:
    """The controller on a running loop until `stop` (and `halt`, the same request for the threads).
    `ledger_check`: the standby's readiness question to the ledger (default: `ledger_view.stats`)."""
    halt = halt if halt is not None else threading.Event()
    loop = asyncio.get_running_loop()

    def request_stop() -> None:
        if not stop.is_set():
            log.info("stop requested")
        halt.set()
        stop.set()

    elector = leader.LeaseElector(
        api_client,
        args.lease_namespace,
        args.lease_name,
        args.identity,
        args.lease_duration,
        args.renew_deadline,
        args.retry_period,
    )
    health = None
    if args.liveness_port:
        from gpuledger.controller.health import Health

        health = Health(
            api_fresh=lambda: elector.in_contact(max(args.lease_duration, 3 * args.retry_period)),
            ledger_check=ledger_check or ledger_view.stats,
            stale_s=max(20.0, args.lease_duration),
        )
        try:
            await health.start(args.metrics_host, args.liveness_port)
        except OSError as err:  # the controller works without: the kubelet's probes say the port is wrong
            log.error("no /healthz, /readyz on %s:%s: %s", args.metrics_host, args.liveness_port, err)
            await health.close()
            health = None
    try:
        return await _run(args, api_client, ledger_view, stop, halt, elector, health, request_stop, loop)
    finally:
        request_stop()
        if health is not None:
            await health.close()


async def _run(
    args: argparse.Namespace,
    api_client: Any,
    ledger_view: Any,
    stop: asyncio.Event,
    halt: threading.Event,
    elector: leader.LeaseElector,
    health: Any,
    request_stop: Any,
    loop: asyncio.AbstractEventLoop,
) -> int:
    # kopf, and the Kubernetes client's API classes KubeWriter builds, take a second to import: in a thread,
    # before the Lease wait, so that neither the loop (a stop request, the probes) nor a new leader waits
    writer = await asyncio.to_thread(_writer, api_client)
    import kopf

    from gpuledger.controller.controller import Engine
    from gpuledger.controller.handlers import make_registry
    from gpuledger.controller.metrics import ControllerMetrics

    metrics = ControllerMetrics()
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, args.metrics_host, registry=metrics.registry)
    log.info("%s: waiting for lease %s/%s", args.identity, args.lease_namespace, args.lease_name)
    if not await asyncio.to_thread(elector.acquire, halt):
        return 0
    log.info("%s: leader", args.identity)
    print(f"gpuledger controller {args.identity}: leader", flush=True)
    if health is not None:
        health.leading()
    metrics.leader.set(1)
    lost = threading.Event()

    def renew() -> None:
        """In a thread of its own: a busy event loop must not keep the Lease from being renewed."""
        while not halt.wait(args.retry_period):
            if not elector.try_once() and not elector.valid():
                log.error(
                    "%s: lost lease %s/%s; stopping", args.identity, args.lease_namespace, args.lease_name
                )
                lost.set()
                halt.set()
                loop.call_soon_threadsafe(stop.set)

    settings = EngineSettings(
        backfill_window_s=args.backfill_window,
        placing_timeout_s=args.placing_timeout,
        gpunode_interval_s=args.gpunode_interval,
        gpunodes=not args.no_gpunodes,
        requeue_interval_s=args.requeue_interval,
        when_full=args.when_full,
    )
    engine = Engine(
        writer, ledger_view, metrics, settings, may_act=lambda: elector.valid() and not lost.is_set()
    )
    renewer = threading.Thread(target=renew, name="lease-renewal", daemon=True)
    renewer.start()
    tasks: list[asyncio.Task] = []
    closer: asyncio.Task | None = None
    try:
        await asyncio.to_thread(_seed, engine, writer)
        if stop.is_set():
            return 0
        tasks.append(asyncio.create_task(engine.run(stop), name="reconcile engine"))
        if health is not None:
            closer = asyncio.create_task(_close_when_stopped(stop, health), name="probe closer")
        kopf_ready = asyncio.Event()

        async def kopf_started() -> None:
            await kopf_ready.wait()
            if health is not None:
                health.kopf_running = True
            log.info("%s: kopf running", args.identity)

        tasks.append(asyncio.create_task(kopf_started(), name="kopf started"))
        stopped = asyncio.create_task(stop.wait(), name="stop waiter")
        tasks.append(stopped)
        # kopf.operator() is spawn_tasks() + run_tasks(): spawn_tasks ends by installing SIGINT/SIGTERM
        # handlers of its own (a stop that leaves `stop` unset, so that kopf then waits 5 s for the tasks of
        # its stop-flag waiter); ours go back in their place. Tasks that existed before kopf's are not kopf's
        # to wait for or cancel.
        before = set(asyncio.all_tasks())
        log.debug("%s: starting kopf", args.identity)
        kopf_tasks = await kopf.spawn_tasks(
            registry=make_registry(engine, args.kubeconfig),
            clusterwide=True,
            standalone=True,
            stop_flag=stop,
            ready_flag=kopf_ready,
        )
        _stop_signals(loop, request_stop)
        await _run_kopf(kopf.run_tasks(kopf_tasks, ignored=before), stopped)
    finally:
        request_stop()
        for task in tasks:
            task.cancel()
        if closer is not None:
            await closer  # the stop is set: it closes the probe server's connections, and ends
        metrics.leader.set(0)
        await asyncio.to_thread(renewer.join, args.retry_period + 10)  # no renewal after the release below
        if not lost.is_set():
            await asyncio.to_thread(elector.release)
    return EXIT_LEASE_LOST if lost.is_set() else 0


def _exit_at_once(code: int) -> NoReturn:
    """Exit once everything is stopped, without the interpreter's finalization: tearing down Ray's, kopf's and
    the Kubernetes client's modules takes a second or more on a busy node, and nothing is left to finalize
    (the Lease is handed back, the Ray connection is shut down here, the logs are flushed)."""
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    for noisy in ("kopf", "urllib3", "kubernetes", "aiohttp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = os.path.abspath(args.kubeconfig)  # what kopf's login reads
    from gpuledger.controller.ledger import RayLedger

    halt = threading.Event()  # the stop, for the threads and the waits before the loop runs
    _on_stop_signals(halt)
    api_client = _kube_client(args.kubeconfig)
    handle = _ledger_handle(args, halt)
    if handle is None:
        _exit_at_once(0)
    ledger_view = RayLedger(handle)
    stop = asyncio.Event()

    async def main_async() -> int:
        def request_stop() -> None:
            if not stop.is_set():
                log.info("stop requested")
            halt.set()
            stop.set()

        _stop_signals(asyncio.get_running_loop(), request_stop)
        if halt.is_set():  # a signal came between the ledger wait and the loop
            stop.set()
        # the probe's question waits 2 s at most: a stuck ledger must not keep a thread busy at the exit
        return await run(args, api_client, ledger_view, stop, halt, RayLedger(handle, timeout_s=2.0).stats)

    code = asyncio.run(main_async())
    log.info("stopped: exit code %s", code)
    _exit_at_once(code)


if __name__ == "__main__":
    raise SystemExit(main())
