"""Every overlay's controller container runs `gpuledger controller` with flags its parser accepts."""

from __future__ import annotations

import shutil

import pytest

from gpuledger.controller.main import LEDGER_WAIT_S, build_parser
from tests.deploy.test_manifests import ALL, IDS, container_argv, render, webhook_deployment

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with kustomize) not on PATH"
)


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_controller_container_argv_parses(path):
    pod = webhook_deployment(render(path))["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "controller")
    argv = container_argv(container)
    assert argv[:2] == ["gpuledger", "controller"]
    args = build_parser().parse_args(argv[2:])
    assert args.ray_address == "auto" and args.lease_name == "gpuledger-controller"
    # it finds the webhook's Ray through the shared /tmp, and names itself after its pod
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/tmp"}
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    metrics = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert metrics["ctl-metrics"] == args.metrics_port


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_controller_probes_ask_its_probe_server(path):
    """Liveness and start-up read /healthz, readiness /readyz, on the port --liveness-port names; the start-up
    probe outlasts the ledger wait before the probe server runs, and readiness never goes by the metrics."""
    pod = webhook_deployment(render(path))["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "controller")
    args = build_parser().parse_args(container_argv(container)[2:])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert args.liveness_port and args.liveness_port != args.metrics_port
    for probe, path_ in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path_, probe
        assert ports.get(get["port"], get["port"]) == args.liveness_port, probe
        assert get.get("scheme", "HTTP") == "HTTP"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= LEDGER_WAIT_S + 20
    # a stuck loop is restarted within a minute; the probes do not wait for a loop that answers at once
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] <= 60 and live["timeoutSeconds"] >= 2
    assert "initialDelaySeconds" not in live  # the start-up probe holds it back
