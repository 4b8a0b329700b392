"""Every overlay's controller container runs `gpuledger controller` with flags its parser accepts."""

from __future__ import annotations

import shutil

import pytest

from gpuledger.controller.main import build_parser
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
