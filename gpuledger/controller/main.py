"""`gpuledger controller`: the GPUWorkload/GPUNode controller, one leader among its replicas.

Joins the Ray cluster that holds the ledger actor (created by `gpuledger serve`), waits to hold the Lease,
then runs the kopf watches and the reconcile engine until stopped or until the Lease is lost (then it exits
non-zero, as controller-runtime's managers do, and its Deployment restarts it as a standby).
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
from typing import Any

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


def _ledger_handle(args: argparse.Namespace, timeout_s: float = 120.0) -> Any:
    """The ledger actor `gpuledger serve` created: waited for, never created here."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:  # beside the webhook, its Ray may still be starting
        try:
            ray.init(
                address=args.ray_address or os.environ.get("RAY_ADDRESS") or "auto",
                namespace=args.ray_namespace,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
            break
        except ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2.0)
    while True:
        try:
            return ray.get_actor(args.actor_name, namespace=args.ray_namespace)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


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


async def run(args: argparse.Namespace, api_client: Any, ledger_view: Any, stop: asyncio.Event) -> int:
    import kopf

    from gpuledger.controller.controller import Engine
    from gpuledger.controller.handlers import make_registry
    from gpuledger.controller.kube import KubeWriter
    from gpuledger.controller.metrics import ControllerMetrics

    metrics = ControllerMetrics()
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, args.metrics_host, registry=metrics.registry)
    elector = leader.LeaseElector(
        api_client,
        args.lease_namespace,
        args.lease_name,
        args.identity,
        args.lease_duration,
        args.renew_deadline,
        args.retry_period,
    )
    log.info("%s: waiting for lease %s/%s", args.identity, args.lease_namespace, args.lease_name)
    if not await asyncio.to_thread(elector.acquire, stop.is_set):
        return 0
    log.info("%s: leader", args.identity)
    print(f"gpuledger controller {args.identity}: leader", flush=True)
    metrics.leader.set(1)
    lost = threading.Event()
    loop = asyncio.get_running_loop()

    def renew() -> None:
        """In a thread of its own: a busy event loop must not keep the Lease from being renewed."""
        while not stop.is_set() and not lost.wait(args.retry_period):
            if not elector.try_once() and not elector.valid():
                log.error(
                    "%s: lost lease %s/%s; stopping", args.identity, args.lease_namespace, args.lease_name
                )
                lost.set()
                loop.call_soon_threadsafe(stop.set)

    writer = KubeWriter(api_client)
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
    await asyncio.to_thread(_seed, engine, writer)
    renewer = threading.Thread(target=renew, name="lease-renewal", daemon=True)
    renewer.start()
    tasks = [asyncio.create_task(engine.run(stop))]
    try:
        await kopf.operator(
            registry=make_registry(engine, args.kubeconfig), clusterwide=True, standalone=True, stop_flag=stop
        )
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        metrics.leader.set(0)
        await asyncio.to_thread(renewer.join, args.retry_period + 10)  # no renewal after the release below
        if not lost.is_set():
            await asyncio.to_thread(elector.release)
    return EXIT_LEASE_LOST if lost.is_set() else 0


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

    api_client = _kube_client(args.kubeconfig)
    ledger_view = RayLedger(_ledger_handle(args))
    stop = asyncio.Event()

    async def main_async() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await run(args, api_client, ledger_view, stop)

    return asyncio.run(main_async())


if __name__ == "__main__":
    raise SystemExit(main())
