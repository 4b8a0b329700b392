"""`gpuledger serve`: the admission webhook over TLS, backed by the shared Ray ledger actor.

Joins the Ray cluster at --ray-address (or starts a local Ray), gets or creates the ledger actor, pushes the
config's ledger settings to it (and again whenever the --config file changes), and, with the Kubernetes API
as the source, runs the cluster sync (gpuledger.sync.cluster_sync) that keeps the ledger true.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping
from typing import Any

from gpuledger.webhook.config import VISIBILITY_MODES, WebhookConfig
from gpuledger.webhook.logs import LOG_FORMAT_ENV, LOG_FORMATS, choose_format, configure

log = logging.getLogger("gpuledger.serve")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuledger serve", description=__doc__.splitlines()[0])
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address (default 127.0.0.1 for development; the Deployment passes 0.0.0.0)",
    )
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--tls-cert", required=True, help="serving certificate (PEM); reloaded when it changes")
    p.add_argument("--tls-key", required=True, help="its private key (PEM)")
    p.add_argument("--client-ca", help="require client certificates signed by this CA (PEM)")
    p.add_argument(
        "--tls-poll-interval",
        type=float,
        default=1.0,
        help="seconds between checks of the certificate files for a change",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--cluster", help="YAML of Nodes and Pods: an offline ledger source (no Kubernetes API)")
    src.add_argument("--kubeconfig", help="kubeconfig for the API (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--ray-address", help="join this Ray cluster (default: start a local Ray in this process)")
    p.add_argument("--ray-num-cpus", type=int, default=1, help="CPUs of the local Ray (no --ray-address)")
    p.add_argument(
        "--config",
        help="webhook config YAML: gpuledger's keys, or the topology scheduler's "
        "SchedulerConfig (see docs/webhook.md); followed while serving",
    )
    p.add_argument(
        "--config-poll-interval",
        type=float,
        default=1.0,
        help="seconds between checks of the --config file for a change",
    )
    p.add_argument("--binding-mode", choices=("nodeName", "affinity", "both"))
    p.add_argument("--visibility-mode", choices=VISIBILITY_MODES)
    p.add_argument(
        "--fail-open", action="store_true", default=None, help="admit unplaced when the ledger is down"
    )
    p.add_argument("--deadline", type=float, help="seconds: internal admission deadline")
    p.add_argument("--hmac-key-file", help="placement signing key (a mounted Secret)")
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="do not run the cluster sync here (another process feeds the ledger)",
    )
    p.add_argument("--log-level", default=os.environ.get("GPULEDGER_LOG_LEVEL", "INFO"))
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help=f"json lines or key=value text (default: ${LOG_FORMAT_ENV}, else text on a terminal, "
        "json otherwise)",
    )
    p.add_argument(
        "--no-events", action="store_true", help="do not post Kubernetes Events for placements and denials"
    )
    return p


def load_config(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> WebhookConfig:
    """The file (or the defaults), then the flags, then SCHEDULING_STRATEGY; also what each reload runs."""
    config = WebhookConfig.from_file(args.config) if args.config else WebhookConfig()
    overrides = {
        "binding_mode": args.binding_mode,
        "visibility_mode": args.visibility_mode,
        "fail_open": args.fail_open,
        "deadline_s": args.deadline,
        "hmac_key_file": args.hmac_key_file,
    }
    values = {**config.__dict__, **{k: v for k, v in overrides.items() if v is not None}}
    return WebhookConfig(**values).with_environment(environ)


def who_pushes() -> str:
    """This replica, as the ledger records who changed its settings (in a pod, the hostname is its name)."""
    return f"gpuledger serve {socket.gethostname()}"


def _kube_client(kubeconfig: str | None):
    from kubernetes import client
    from kubernetes import config as kconfig

    if kubeconfig:
        return kconfig.new_client_from_config(config_file=kubeconfig)
    try:
        kconfig.load_incluster_config()
        return client.ApiClient()
    except kconfig.ConfigException:
        return kconfig.new_client_from_config()


async def _run(
    args: argparse.Namespace,
    config: WebhookConfig,
    handle,
    owners,
    stop: asyncio.Event,
    event_writer=None,
    sync=None,
) -> None:
    from gpuledger.webhook.config_watch import ConfigWatcher, ray_push
    from gpuledger.webhook.ledger.client import RayLedgerClient
    from gpuledger.webhook.transport.app import EVENTS_KEY, METRICS_KEY, create_app
    from gpuledger.webhook.transport.server import start_server, tune_gc
    from gpuledger.webhook.transport.tls import ReloadingTLS

    tls = ReloadingTLS(args.tls_cert, args.tls_key, args.client_ca, poll_interval_s=args.tls_poll_interval)
    ledger = RayLedgerClient(handle, channel=config.ledger_channel)
    app = create_app(config, ledger, owners, event_writer=event_writer)
    poster = app[EVENTS_KEY]
    if sync is not None:
        app[METRICS_KEY].watch_sync(sync.stats)
        sync.placer.on_placed = app[METRICS_KEY].placed_after_waiting  # the wait of each pod it places
    if poster is not None and sync is not None:  # placed pods found by the sync's watch, not a LIST each
        sync.on_pod_added.append(poster.watch_reports())
    server = await start_server(app, args.host, args.port, tls)
    watcher = None
    if args.config:
        watcher = ConfigWatcher(
            args.config,
            lambda: load_config(args),
            ray_push(handle),
            source=who_pushes(),
            current=config,
            poll_interval_s=args.config_poll_interval,
        )
        watcher.start()
    tune_gc()
    log.info("gpuledger webhook listening on %s", server.url)
    print(f"gpuledger webhook listening on {server.url}", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if watcher is not None:
        await watcher.stop()
    await server.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        configure(choose_format(args.log_format), args.log_level)
    except ValueError as exc:  # a bad $GPULEDGER_LOG_FORMAT or level
        print(f"gpuledger serve: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_config(args)
        config.placement_key()  # a missing key file fails now, not at the first admission
    except (OSError, ValueError, TypeError) as exc:
        print(f"gpuledger serve: {exc}", file=sys.stderr)
        return 2
    if not config.placement_key():
        log.warning("no HMAC key configured: placement annotations are unsigned (development only)")

    import ray

    from gpuledger.ray.actor import RAY_NAMESPACE, get_or_create_ledger, wait_ready
    from gpuledger.service.sources import load_objects
    from gpuledger.webhook.admission.owners import KubeOwners, OwnerLookup, StaticOwners

    if args.ray_address:
        ray.init(address=args.ray_address, namespace=RAY_NAMESPACE, log_to_driver=False)
    else:
        # "local": a Ray of our own, even if RAY_ADDRESS or a `ray start` cluster is around
        ray.init(
            address="local",
            namespace=RAY_NAMESPACE,
            include_dashboard=False,
            num_cpus=args.ray_num_cpus,
            log_to_driver=False,
        )
    api_client = None
    if args.cluster:
        source = {"kind": "file", "path": os.path.abspath(args.cluster)}
        owners: OwnerLookup = StaticOwners(load_objects(args.cluster))
    else:
        source = {"kind": "kubernetes"}
        api_client = _kube_client(args.kubeconfig)
        owners = KubeOwners(api_client, ttl_s=config.owner_cache_ttl_s, timeout_s=config.deadline_s)
    handle = get_or_create_ledger(config.ledger_config(), source, settings=config.ledger_settings())
    status = wait_ready(handle)
    log.info("ledger actor ready: %s", status)
    # an actor created by another replica (or before the config changed) takes this replica's settings now,
    # unless they are the config it applied last (then a runtime change made since is kept)
    answer = ray.get(handle.apply_config.remote(config.ledger_settings(), who_pushes()), timeout=60)
    log.info(
        "ledger settings %s: %s",
        "applied from this config" if answer["applied"] else "kept",
        {k: v for k, v in answer["settings"].items() if k != "history"},
    )
    from gpuledger.sync.channel import ChannelLedgerTarget, ray_channel_opener

    sync = None
    if api_client is not None and not args.no_sync:
        from gpuledger.sync.cluster_sync import ClusterSync
        from gpuledger.sync.targets import RayLedgerTarget

        target: Any = RayLedgerTarget(handle)
        if config.ledger_channel != "off":  # the sync's per-pod calls off Ray too (gpuledger.sync.channel)
            target = ChannelLedgerTarget(target, ray_channel_opener(handle, config.ledger_channel))
        sync = ClusterSync(api_client, target, config.sync_config()).start()
    event_writer = None
    if api_client is not None and not args.no_events:
        from gpuledger.webhook.kube.event_writer import ApiEventWriter

        event_writer = ApiEventWriter(api_client)
    stop = asyncio.Event()
    try:
        asyncio.run(_run(args, config, handle, owners, stop, event_writer, sync))
    finally:
        if sync is not None:
            sync.stop()
            if isinstance(sync.target, ChannelLedgerTarget):
                sync.target.close()
    return 0
