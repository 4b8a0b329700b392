"""The kopf adapter: watch events in, `Engine.observe_*` calls out. No decision is made here.

kopf (the Kubernetes Operator Pythonic Framework) keeps the watches: the initial list, re-connections,
resource-version bookkeeping and per-object ordering, for every resource the controller follows. Only event
handlers are used, so kopf writes no progress annotations onto the objects: all state lives in the
GPUWorkloads' status, which is what lets a restarted (or newly elected) controller carry on where the last
one stopped.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from gpuledger.controller.controller import Engine
from gpuledger.names import (
    AGENTAFLOW_GROUP,
    AGENTAFLOW_VERSION,
    GPUWORKLOAD_PLURAL,
    WARP_GROUP,
    WARP_VERSION,
    WORKLOAD_UID_LABEL,
)


def make_registry(engine: Engine, kubeconfig: str | None = None) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.peering.standalone = True  # leader election is gpuledger.controller.leader's Lease
        settings.posting.enabled = False  # no kopf Events: the GPUWorkload status says what happened
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        settings.watching.reconnect_backoff = 1.0

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        if kubeconfig:
            return kopf.login_with_kubeconfig(**kwargs)
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    for group, version in ((AGENTAFLOW_GROUP, AGENTAFLOW_VERSION), (WARP_GROUP, WARP_VERSION)):

        @kopf.on.event(group, version, GPUWORKLOAD_PLURAL, registry=registry)
        def workload(event: kopf.RawEvent, **_: Any) -> None:
            engine.observe_workload(event.get("type"), dict(event["object"]))

    @kopf.on.event("batch", "v1", "jobs", labels={WORKLOAD_UID_LABEL: kopf.PRESENT}, registry=registry)
    def job(event: kopf.RawEvent, **_: Any) -> None:
        engine.observe_job(event.get("type"), dict(event["object"]))

    @kopf.on.event("", "v1", "pods", registry=registry)
    def pod(event: kopf.RawEvent, **_: Any) -> None:
        engine.observe_pod(event.get("type"), dict(event["object"]))

    @kopf.on.event("", "v1", "nodes", registry=registry)
    def node(event: kopf.RawEvent, **_: Any) -> None:
        engine.observe_node(event.get("type"), dict(event["object"]))

    @kopf.on.event("", "v1", "namespaces", registry=registry)
    def namespace(event: kopf.RawEvent, **_: Any) -> None:
        engine.observe_namespace(event.get("type"), dict(event["object"]))

    return registry
