"""The product image on a real node: built here from the Dockerfile's recipe (devcluster/product_image.py),
imported into the node's containerd, and run as a pod under the webhook Deployment's own securityContext
(non-root, read-only root filesystem, no capabilities, /tmp an emptyDir) as manifests/deployment.yaml sets it.

The first build takes minutes (a Debian root filesystem and Ray from PyPI); after that the base layer comes
from the cache and a code change costs seconds (`make image` builds it ahead).
"""

from __future__ import annotations

import uuid

import pytest
import yaml

from devcluster import product_image
from devcluster.binaries import REPO
from devcluster.kubelet import RealNode
from tests.conftest import require_real_node
from tests.parts import missing_part

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.slow]

NODE = "real-node-image"
COMPONENTS = (
    "gpuledger.ray.actor",
    "gpuledger.webhook.serve",
    "gpuledger.controller.main",
    "gpuledger.node_agent.agent",
)
IMPORTS = "import " + ", ".join(COMPONENTS)
VERSIONS = "import sys, importlib.metadata as m; print('%d.%d' % sys.version_info[:2], m.version('ray'))"
# what the pod's own user, groups, capabilities, root filesystem and environment are, one per line
IDENTITY = (
    "id -u; id -g; grep CapEff /proc/self/status; "
    "touch /opt/gpuledger/probe 2>/dev/null && echo root-writable || echo root-read-only; "
    "touch /tmp/probe && echo tmp-writable; env"
)


def require_image_builder() -> None:
    """As require_real_node: what building the image lacks skips by hand, fails in CI and `make test`."""
    lacking = product_image.missing_parts()
    if lacking:
        missing_part("building the product image needs: " + "; ".join(lacking))


def webhook_pod_template() -> dict:
    (deployment,) = [
        d
        for d in yaml.safe_load_all((REPO / "manifests" / "deployment.yaml").read_text())
        if d and d["kind"] == "Deployment"
    ]
    return deployment["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def image_node(apiserver):
    """A real node whose containerd holds the product image (built, or found in the cache)."""
    require_real_node()
    require_image_builder()
    archive = product_image.build()
    with RealNode(apiserver, name=NODE) as node:
        image = product_image.import_into(node.containerd.socket, archive)
        yield node, image


@pytest.fixture
def plain_namespace(apiserver):
    name = apiserver.create_namespace(f"image-{uuid.uuid4().hex[:6]}", admission=False)
    yield name
    apiserver.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def image_pod(image: str, containers: dict[str, list[str] | None]) -> dict:
    """One container per entry (None: the image's own CMD), each with the webhook container's
    securityContext and /tmp mount, in a pod with the webhook pod's securityContext."""
    template = webhook_pod_template()
    (webhook,) = [c for c in template["containers"] if c["name"] == "webhook"]
    (tmp_mount,) = [m for m in webhook["volumeMounts"] if m["mountPath"] == "/tmp"]
    (tmp_volume,) = [v for v in template["volumes"] if v["name"] == tmp_mount["name"]]
    specs = []
    for name, args in containers.items():
        spec = {
            "name": name,
            "image": image,
            "imagePullPolicy": "Never",
            "securityContext": webhook["securityContext"],
            "volumeMounts": [tmp_mount],
        }
        if args is not None:
            spec["args"] = args  # as the manifests do: the image's ENTRYPOINT (tini) runs them
        specs.append(spec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"image-{uuid.uuid4().hex[:6]}"},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": template["securityContext"],
            "containers": specs,
            "volumes": [tmp_volume],
        },
    }


# the first build of the base layer (Debian and Ray from the network) runs in this test's setup
@pytest.mark.timeout(3600)
def test_the_image_runs_the_cli_and_imports_every_component_non_root_on_a_read_only_root(
    apiserver, image_node, plain_namespace
):
    node, image = image_node
    recipe = product_image.read_recipe()
    template = webhook_pod_template()
    (webhook,) = [c for c in template["containers"] if c["name"] == "webhook"]
    context = webhook["securityContext"]
    assert context["readOnlyRootFilesystem"] and context["runAsNonRoot"]
    assert context["capabilities"]["drop"] == ["ALL"] and not context["allowPrivilegeEscalation"]

    pod = image_pod(
        image,
        {
            "cmd": None,
            "status-help": ["gpuledger", "status", "--help"],
            "imports": ["python", "-c", IMPORTS],
            "versions": ["python", "-c", VERSIONS],
            "identity": ["sh", "-c", IDENTITY],
        },
    )
    pod["metadata"]["namespace"] = plain_namespace
    apiserver.apply(pod)
    name = pod["metadata"]["name"]

    def finished():
        obj = apiserver.get_json("pod", name, "-n", plain_namespace)
        return obj if obj["status"].get("phase") in ("Succeeded", "Failed") else None

    done = apiserver.wait_for(finished, timeout=300, interval=1, what=f"pod {name} finished")
    exits = {s["name"]: s["state"]["terminated"]["exitCode"] for s in done["status"]["containerStatuses"]}
    logs = {
        c: apiserver.kubectl("logs", "-n", plain_namespace, name, "-c", c, check=False).stdout for c in exits
    }
    failed = {c: f"exit {code}:\n{logs[c]}" for c, code in exits.items() if code != 0}
    assert not failed, f"containers of the image failed (kubelet log {node.kubelet_log}): {failed}"

    assert logs["cmd"].startswith("usage: gpuledger <command>")  # the image's CMD: gpuledger --help
    assert logs["status-help"].startswith("usage: gpuledger status")
    python, ray = logs["versions"].split()
    assert (python, f"ray[default]=={ray}") == (recipe.python_version, recipe.pip_install_args[0])
    lines = logs["identity"].splitlines()
    uid, gid = recipe.config["User"].split(":")
    assert lines[:5] == [uid, gid, "CapEff:\t0000000000000000", "root-read-only", "tmp-writable"]
    env = dict(line.split("=", 1) for line in lines[5:] if "=" in line)
    for key, value in (e.split("=", 1) for e in recipe.config["Env"]):
        assert env.get(key) == value, key
