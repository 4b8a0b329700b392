"""The node-agent DaemonSet as rendered in the prod overlay: runs the real CLI,
may patch nodes and nothing more."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuledger.node_agent.agent import build_parser
from gpuledger.node_agent.xids import APPLICATION_XIDS, parse_ignored

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with kustomize) not on PATH"
)


def rendered(overlay: str) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "kustomize" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_prod_runs_the_node_agent_with_arguments_the_cli_accepts():
    docs = rendered("prod")
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"][:2] == ["gpuledger", "node-agent"]
    args = build_parser().parse_args(container["args"][2:])
    env = {e["name"]: e for e in container["env"]}
    assert (
        args.node == "$(NODE_NAME)"
        and env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    )
    assert (
        env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    )  # NVML sees every GPU; the device plugin allocates none
    assert not args.fake  # real NVML in the cluster
    assert parse_ignored(args.ignore_xids) == APPLICATION_XIDS  # the agent's own default, spelled out
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in spec["tolerations"])
    # the image the agent runs is the webhook's image
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpuledger"
    ] or [
        next(d for d in docs if d["kind"] == "Deployment" and "webhook" in str(d["spec"]["template"]["spec"]))
    ]
    assert container["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]


def test_node_agent_may_only_read_and_patch_nodes():
    docs = rendered("prod")
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
    bindings = [
        b
        for b in docs
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and any(s["name"] == sa for s in b["subjects"])
    ]
    assert len(bindings) == 1 and bindings[0]["kind"] == "ClusterRoleBinding"
    (role,) = [
        r
        for r in docs
        if r["kind"] == "ClusterRole" and r["metadata"]["name"] == bindings[0]["roleRef"]["name"]
    ]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},  # --advertise-capacity
    ]


def test_dev_overlay_has_no_node_agent():
    assert not [d for d in rendered("dev") if d["kind"] == "DaemonSet"]
