"""gpuledger deployed as a cluster operator deploys it: the product image, `gpuledger certs generate` and
`kubectl apply -k` of the dev overlay (docs/deployment.md), running as pods on a real kubelet.

A control plane of this module's own, with what a Service and a pod's API access need: the ServiceAccount
admission plugin (tokens from the TokenRequest API through the kubelet), the root CA publisher, the endpoint
controllers, kube-scheduler, kube-proxy, CoreDNS (devcluster/services.py). Its only node is real, with fake
GPUs from the fake device plugin. Every pod runs under the manifests' own securityContext, Pod Security
`restricted`, RBAC, webhook configurations (failurePolicy Fail, reached through the Service) and
NetworkPolicy, exactly as shipped.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from devcluster import images, product_image, services
from devcluster.cluster import ALICE, CONTROLLERS, ControlPlane
from devcluster.device_plugin import FakeGPUPlugin
from devcluster.kubelet import NODE_IP_NET, RealNode
from devcluster.nodes import device_uuid
from devcluster.services import ClusterServices
from gpuledger.names import ADMISSION_LABEL, PLACEMENT_ANNOTATION
from tests.conftest import require_binaries, require_real_node
from tests.e2e.conftest import busybox_pod
from tests.e2e.test_product_image import require_image_builder
from tests.parts import missing_part

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.slow]

NODE = "deployed-node"
NODE_INDEX = 2
GPUS = 4
SYSTEM = "gpuledger-system"
# what pods of a deployed product need beyond the workload controllers: the CA in every namespace (their
# API access), and a Service's endpoints (kube-proxy reads EndpointSlices)
SERVICE_CONTROLLERS = (
    "root-ca-certificate-publisher-controller",
    "endpoints-controller",
    "endpointslice-controller",
)
PRINT_ENV = "echo NV=$NVIDIA_VISIBLE_DEVICES"


def require_services() -> None:
    lacking = services.missing_parts()
    if lacking:
        missing_part("deploying the product needs: " + "; ".join(lacking))


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """The dev overlay applied with certificates from `gpuledger certs generate`, every pod Ready."""
    require_binaries()
    require_real_node()
    require_image_builder()
    require_services()
    started = time.monotonic()
    archive = product_image.build()
    workdir = tmp_path_factory.mktemp("deployed-cp")
    node_ip = str(NODE_IP_NET[10 + NODE_INDEX])
    cp = ControlPlane(
        workdir=workdir,
        disabled_admission_plugins=("TaintNodesByCondition",),
        controllers=(*CONTROLLERS, *SERVICE_CONTROLLERS),
        extra_controller_args=(f"--root-ca-file={workdir / 'pki' / 'ca.crt'}",),
    )
    with (
        cp,
        RealNode(cp, name=NODE, index=NODE_INDEX, pod_gateway=True, cluster_dns=node_ip) as node,
        FakeGPUPlugin([device_uuid(NODE, i) for i in range(GPUS)]) as plugin,
        ClusterServices(cp, NODE, node.node_ip) as cluster_services,
    ):
        product_image.import_into(node.containerd.socket, archive)  # named as the manifests name it
        tls = tmp_path_factory.mktemp("gpuledger-tls")
        subprocess.run(
            [str(Path(sys.executable).parent / "gpuledger"), "certs", "generate", "--out", str(tls)],
            check=True,
            capture_output=True,
        )
        cp.kubectl("apply", "-k", str(tls))
        try:
            cp.kubectl("-n", SYSTEM, "rollout", "status", "deploy/gpuledger", "--timeout=300s", timeout=310)
        except Exception:
            print(diagnose(cp, node, cluster_services))
            raise
        print(f"\ndeployed module: up in {time.monotonic() - started:.1f}s (kubelet log {node.kubelet_log})")
        yield cp, node, plugin, cluster_services


def diagnose(cp, node, cluster_services) -> str:
    """What an operator would look at when the install does not come up."""
    out = [
        cp.kubectl("-n", SYSTEM, "get", "pods,events", "-o", "wide", check=False).stdout,
        cp.kubectl("-n", SYSTEM, "get", "pods,events", "-o", "wide", check=False).stderr,
        cp.kubectl("-n", SYSTEM, "logs", "deploy/gpuledger", "--all-containers", check=False).stdout[-6000:],
        cp.kubectl("-n", SYSTEM, "describe", "pods", check=False).stdout[-6000:],
    ]
    return "\n".join(out)


def wait_ready_pods(cp, namespace: str, selector: str, count: int, timeout: float = 60) -> list[dict]:
    def ready():
        pods = cp.pods(namespace, selector)
        good = [
            p
            for p in pods
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]
        return good if len(good) >= count else None

    return cp.wait_for(ready, timeout=timeout, what=f"{count} Ready pods {selector} in {namespace}")


def test_every_pod_of_the_install_is_ready_under_its_own_security_context(deployed):
    cp, _, _, _ = deployed
    (pod,) = wait_ready_pods(cp, SYSTEM, "app.kubernetes.io/component=webhook", 1)
    assert pod["spec"]["nodeName"] == NODE  # placed by kube-scheduler
    assert (
        pod["spec"]["securityContext"]["runAsNonRoot"]
        and pod["spec"]["securityContext"]["runAsUser"] == 65532
    )
    for container in pod["spec"]["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] and context["capabilities"]["drop"] == ["ALL"]
    statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
    assert set(statuses) == {"webhook", "controller"} and all(s["ready"] for s in statuses.values())
    (endpoints,) = cp.get_json("endpointslices", "-n", SYSTEM, "-l", "kubernetes.io/service-name=gpuledger")[
        "items"
    ]
    ready = [e for e in endpoints["endpoints"] if e["conditions"].get("ready")]
    assert [e["addresses"] for e in ready] == [[pod["status"]["podIP"]]]


def test_a_users_gpu_job_is_placed_by_the_deployed_webhook_and_run_by_the_kubelet(deployed):
    cp, node, plugin, _ = deployed
    namespace = cp.create_namespace(f"team-{uuid.uuid4().hex[:6]}", admission=False)
    cp.wait_for(
        lambda: cp.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
        timeout=30,
        what=f"the default ServiceAccount of {namespace}",
    )
    cp.kubectl("label", "namespace", namespace, f"{ADMISSION_LABEL}=enabled")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": images.TEST_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", PRINT_ENV],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                }
            },
        },
    }
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job), as_user=ALICE)
    cp.kubectl("wait", "-n", namespace, "--for=condition=Complete", "job/train", "--timeout=120s")
    pods = cp.pods(namespace, "job-name=train")
    assert len(pods) == 2
    seen = []
    for pod in pods:
        assert PLACEMENT_ANNOTATION in pod["metadata"]["annotations"], pod["metadata"]
        assert pod["spec"]["nodeName"] == NODE and pod["status"]["phase"] == "Succeeded"
        printed = cp.kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout.strip()
        seen.append(printed.removeprefix("NV="))
    assert all(devices in plugin.health for devices in seen) and len(set(seen)) == 2


def test_service_names_resolve_inside_pods(deployed):
    cp = deployed[0]
    service_ip = cp.get_json("service", "gpuledger", "-n", SYSTEM)["spec"]["clusterIP"]
    namespace = cp.create_namespace(f"dns-{uuid.uuid4().hex[:6]}", admission=False)
    cp.wait_for(
        lambda: cp.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
        timeout=30,
        what=f"the default ServiceAccount of {namespace}",
    )
    pod = busybox_pod("lookup", f"nslookup gpuledger.{SYSTEM}.svc.{services.CLUSTER_DOMAIN}", node=NODE)
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    cp.kubectl(
        "wait", "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded", "pod/lookup", "--timeout=60s"
    )
    assert service_ip in cp.kubectl("logs", "-n", namespace, "lookup").stdout
