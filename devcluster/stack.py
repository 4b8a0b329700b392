"""The whole product against a control plane: a local Ray ledger actor, the cluster sync and the TLS webhook.

This is what `gpuledger serve --kubeconfig` runs, assembled in-process so tests and the demo can stop the
webhook, kill the actor or read the ledger while kube-apiserver keeps calling the webhook over real TLS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devcluster import webhooks
from devcluster.binaries import free_port
from devcluster.kubeclient import KubeClient
from devcluster.users import WEBHOOK_USER
from gpuledger.certs import pki
from gpuledger.core.pods.placement_codec import decode_placement
from gpuledger.names import PLACEMENT_ANNOTATION, RESERVATION_ID_KEY
from gpuledger.sync.cluster_sync import ClusterSync
from gpuledger.sync.config import SyncConfig
from gpuledger.sync.targets import RayLedgerTarget
from gpuledger.webhook.config import WebhookConfig

if TYPE_CHECKING:
    from gpuledger.webhook.transport.server import ServerThread

log = logging.getLogger("gpuledger.e2e")

HMAC_KEY = "gpuledger-e2e-placement-key"


def e2e_webhook_config(**overrides) -> WebhookConfig:
    """The webhook's defaults, with a signing key and the identity this harness gives the webhook."""
    values: dict[str, Any] = {
        "hmac_key": HMAC_KEY,
        "privileged_usernames": (WEBHOOK_USER,),
        "deadline_s": 4.0,
    }
    values.update(overrides)
    return WebhookConfig(**values)


@dataclass
class Stack:
    cp: KubeClient  # a ControlPlane of ours, or the demo's ExistingCluster
    config: WebhookConfig = field(default_factory=e2e_webhook_config)
    failure_policy: str = "Fail"
    timeout_s: int = 10
    sync_config: SyncConfig = field(
        default_factory=lambda: SyncConfig(expiry_interval_s=2.0, status_interval_s=0.5)
    )
    actor_name: str = field(default_factory=lambda: f"gpu-ledger-{uuid.uuid4().hex[:6]}")
    ray_namespace: str = "gpuledger-e2e"
    webhook_host: str = "127.0.0.1"  # where the API server reaches the webhook (it listens there too)

    def start(self) -> Stack:
        import ray

        from gpuledger.ray.actor import get_or_create_ledger, wait_ready

        self.workdir = Path(tempfile.mkdtemp(prefix="gpuledger-webhook-"))
        self.ca = pki.make_ca("gpuledger-e2e-webhook-ca")
        self.tls_paths = pki.write_bundle(
            self.workdir, self.ca, pki.make_serving_cert(self.ca, *_sans(self.webhook_host))
        )
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            ray.init(
                address="local",
                namespace=self.ray_namespace,
                include_dashboard=False,
                num_cpus=1,
                log_to_driver=False,
                logging_level=logging.ERROR,
            )
        self.handle = get_or_create_ledger(
            self.config.ledger_config(),
            {"kind": "kubernetes"},
            name=self.actor_name,
            namespace=self.ray_namespace,
        )
        wait_ready(self.handle)
        self.api_client = self.cp.api_client(WEBHOOK_USER)  # the webhook's own identity and RBAC
        self.sync = ClusterSync(self.api_client, RayLedgerTarget(self.handle), self.sync_config).start()
        if not self.sync.wait_synced(60):
            raise RuntimeError(f"cluster sync did not finish its first list: {self.sync.stats}")
        self.port = free_port(self.webhook_host)
        self.server: ServerThread | None = None
        self._pod_listeners: list = []
        self.start_webhook()
        self.register()
        return self

    # ------------------------------------------------------------------ webhook process
    def start_webhook(self) -> None:
        from gpuledger.webhook.admission.owners import KubeOwners
        from gpuledger.webhook.kube.event_writer import ApiEventWriter
        from gpuledger.webhook.ledger.client import RayLedgerClient
        from gpuledger.webhook.transport.app import EVENTS_KEY, create_app
        from gpuledger.webhook.transport.server import ServerThread
        from gpuledger.webhook.transport.tls import ReloadingTLS

        config, handle, api_client = self.config, self.handle, self.api_client
        paths = self.tls_paths

        def app():
            served = create_app(
                config,
                RayLedgerClient(handle, channel=config.ledger_channel),
                KubeOwners(api_client, ttl_s=config.owner_cache_ttl_s, timeout_s=config.deadline_s),
                event_writer=ApiEventWriter(api_client),  # Events as the webhook's identity, under its RBAC
            )
            served.middlewares.append(_log_transport_errors())
            poster = served[EVENTS_KEY]
            if poster is not None:  # placed pods found by the sync's watch, as `gpuledger serve` wires it
                listener = poster.watch_reports()
                self.sync.on_pod_added.append(listener)
                self._pod_listeners.append(listener)
            return served

        self.server = ServerThread(
            app,
            host=self.webhook_host,
            port=self.port,
            tls_factory=lambda: ReloadingTLS(str(paths["tls.crt"]), str(paths["tls.key"])),
        ).start()

    def stop_webhook(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        for listener in self._pod_listeners:
            self.sync.on_pod_added.remove(listener)
        self._pod_listeners = []

    def reconfigure(self, **overrides) -> WebhookConfig:
        """Restart the webhook (same port, certificate and registration) with `overrides` on its config, e.g.
        `visibility_mode` or `binding_mode`, which a deployment changes by a rollout; returns the config it
        replaced, to put back. The ledger and the sync keep running."""
        before = self.config
        self.stop_webhook()
        self.config = dataclasses.replace(before, **overrides)
        self.start_webhook()
        return before

    @property
    def url(self) -> str:
        host = f"[{self.webhook_host}]" if ":" in self.webhook_host else self.webhook_host
        return f"https://{host}:{self.port}"

    def register(self, failure_policy: str | None = None) -> None:
        if failure_policy:
            self.failure_policy = failure_policy
        webhooks.register(self.cp, self.url, self.ca.cert_pem, self.failure_policy, self.timeout_s)

    # ------------------------------------------------------------------ ledger
    def call(self, method: str, *args, timeout: float = 30.0):
        import ray

        return ray.get(getattr(self.handle, method).remote(*args), timeout=timeout)

    def kill_ledger(self) -> str:
        """Kill the actor process; Ray restarts it (max_restarts=-1) empty, and the sync refills it."""
        import ray

        before = self.call("ping")
        ray.kill(self.handle, no_restart=False)
        return before

    def wait_ledger_synced(self, timeout: float = 60.0, after_incarnation: str | None = None) -> dict:
        def synced():
            try:
                status = self.call("status", timeout=5)
            except Exception:  # noqa: BLE001 - restarting: any failure means not synced yet
                return None
            if after_incarnation and status.get("incarnation") == after_incarnation:
                return None
            return status if status.get("synced") else None

        return self.cp.wait_for(synced, timeout=timeout, what="ledger synced")

    # ------------------------------------------------------------------ reading placements
    def placement(self, pod: dict):
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        return decode_placement(text, self.config.placement_key()) if text else None

    def stop(self) -> None:
        import ray

        webhooks.unregister(self.cp)
        self.stop_webhook()
        self.sync.stop()
        with contextlib.suppress(Exception):  # already gone
            ray.kill(self.handle, no_restart=True)
        if self._own_ray:
            ray.shutdown()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _log_transport_errors():
    """A middleware logging answers that are not AdmissionReviews (HTTP 4xx/5xx): the API server reports them
    only as "the server rejected our request for an unknown reason"."""
    from aiohttp import web

    @web.middleware
    async def middleware(request, handler):
        response = await handler(request)
        if response.status >= 400:
            body = getattr(response, "text", "") or ""
            log.warning(
                "webhook answered %s %s with HTTP %d: %s (content-type %r, length %r)",
                request.method,
                request.path,
                response.status,
                body[:300],
                request.content_type,
                request.content_length,
            )
        return response

    return middleware


def _sans(host: str) -> tuple[list[str], list[str]]:
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return ["localhost"], [host]
    except ValueError:
        return [host], []


def placements_by_device(stack: Stack, pods: list[dict]) -> dict[tuple[str, int], list[str]]:
    """(node, device) -> the stored, non-terminal pods whose placement holds it: more than one is a double
    booking."""
    held: dict[tuple[str, int], list[str]] = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        placement = stack.placement(pod)
        if placement is None:
            continue
        name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        for device in placement.devices:
            held.setdefault((placement.node, device), []).append(name)
    return held


def describe(pod: dict) -> str:
    return json.dumps(
        {
            "name": pod["metadata"].get("name"),
            "labels": pod["metadata"].get("labels"),
            "reservation": (pod["metadata"].get("labels") or {}).get(RESERVATION_ID_KEY),
        }
    )
