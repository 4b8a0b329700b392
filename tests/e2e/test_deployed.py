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

import base64
import json
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from devcluster import images, product_image, services
from devcluster.binaries import REPO
from devcluster.cluster import ALICE, CONTROLLERS, ControlPlane
from devcluster.device_plugin import FakeGPUPlugin
from devcluster.kubelet import NODE_IP_NET, RealNode
from devcluster.nodes import device_uuid
from devcluster.services import ClusterServices
from gpuledger.core.placement_codec import decode_placement
from gpuledger.names import ADMISSION_LABEL, PLACEMENT_ANNOTATION
from tests.conftest import require_binaries, require_real_node
from tests.deploy.test_helm import helm_binary
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


@dataclass
class Deployed:
    cp: ControlPlane
    node: RealNode
    plugin: FakeGPUPlugin
    services: ClusterServices
    tls: Path  # the directory `gpuledger certs generate` wrote, applied with `kubectl apply -k`


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
        assert node.containerd is not None
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
        yield Deployed(cp, node, plugin, cluster_services, tls)


def diagnose(cp, node, cluster_services) -> str:
    """What an operator would look at when the install does not come up."""
    out = [
        cp.kubectl("-n", SYSTEM, "get", "pods,events", "-o", "wide", check=False).stdout,
        cp.kubectl("-n", SYSTEM, "get", "pods,events", "-o", "wide", check=False).stderr,
        cp.kubectl("-n", SYSTEM, "logs", "deploy/gpuledger", "--all-containers", check=False).stdout[-6000:],
        cp.kubectl("-n", SYSTEM, "describe", "pods", check=False).stdout[-6000:],
    ]
    return "\n".join(out)


def user_namespace(cp, prefix: str) -> str:
    """A namespace not yet opted in, where alice may work, once its default ServiceAccount exists (the
    ServiceAccount admission plugin refuses pods before that)."""
    namespace = cp.create_namespace(f"{prefix}-{uuid.uuid4().hex[:6]}", admission=False)
    cp.wait_for(
        lambda: cp.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
        timeout=30,
        what=f"the default ServiceAccount of {namespace}",
    )
    return namespace


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


# the first build of the image's base layer (Debian and Ray from the network) can run in this test's setup
@pytest.mark.timeout(3600)
def test_every_pod_of_the_install_is_ready_under_its_own_security_context(deployed):
    cp = deployed.cp
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
    cp, plugin = deployed.cp, deployed.plugin
    namespace = user_namespace(cp, "team")
    cp.kubectl("label", "namespace", namespace, f"{ADMISSION_LABEL}=enabled")  # as docs/deployment.md says
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(gpu_job("train")), as_user=ALICE)
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


def gpu_job(name: str, pods: int = 2) -> dict:
    """A Job as a user writes it: `pods` pods of one GPU each, printing the devices they were given."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": pods,
            "completions": pods,
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


def test_service_names_resolve_inside_pods(deployed):
    cp = deployed.cp
    service_ip = cp.get_json("service", "gpuledger", "-n", SYSTEM)["spec"]["clusterIP"]
    namespace = user_namespace(cp, "dns")
    pod = busybox_pod("lookup", f"nslookup gpuledger.{SYSTEM}.svc.{services.CLUSTER_DOMAIN}", node=NODE)
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))
    cp.kubectl(
        "wait", "-n", namespace, "--for=jsonpath={.status.phase}=Succeeded", "pod/lookup", "--timeout=60s"
    )
    assert service_ip in cp.kubectl("logs", "-n", namespace, "lookup").stdout


def test_gpuledger_status_runs_inside_the_image_as_the_webhooks_service_account(deployed):
    cp = deployed.cp
    status = ["gpuledger", "status", "-A", "-o", "json"]
    shown = cp.kubectl("exec", "-n", SYSTEM, "deploy/gpuledger", "-c", "webhook", "--", *status, check=False)
    assert shown.returncode == 0, shown.stderr
    cluster = json.loads(shown.stdout)["cluster"]
    assert (cluster["nodes"], cluster["gpus"]) == (1, GPUS)


def placement_key(cp) -> bytes:
    """The key the deployed webhook signs placements with, from its Secret."""
    secret = cp.get_json("secret", "gpuledger-placement-key", "-n", SYSTEM)
    return base64.b64decode(secret["data"]["key"]).rstrip(b"\r\n")


def test_a_rolling_restart_of_the_webhook_while_pods_are_created(deployed):
    """Day two: `kubectl rollout restart` of the webhook Deployment while alice keeps creating 1-GPU pods.
    The dev overlay's single replica is replaced, not surged (a second embedded Ray would be a second
    ledger): creates are refused (failurePolicy Fail) until the new replica is Ready, none is admitted
    unplaced, and the new replica's ledger, rebuilt from the API server, double-books nothing."""
    cp = deployed.cp
    key = placement_key(cp)
    namespace = user_namespace(cp, "roll")
    cp.kubectl("label", "namespace", namespace, f"{ADMISSION_LABEL}=enabled")
    outcomes: dict[str, list[str]] = {"admitted": [], "refused": [], "denied": []}
    refused_at: list[float] = []
    stop = threading.Event()

    def create_pods() -> None:
        index = 0
        while not stop.is_set():
            name = f"roll-{index}"
            pod = yaml.safe_dump(busybox_pod(name, "sleep 1", gpus=1))
            made = cp.kubectl("create", "-n", namespace, "-f", "-", input=pod, as_user=ALICE, check=False)
            if made.returncode == 0:
                outcomes["admitted"].append(name)
            elif "failed calling webhook" in made.stderr:
                outcomes["refused"].append(name)  # the API server could not reach a ready replica
                refused_at.append(time.monotonic())
            else:
                outcomes["denied"].append(made.stderr.strip())  # the ledger's answer: no GPU free
            index += 1
            stop.wait(0.3)

    creator = threading.Thread(target=create_pods, daemon=True)
    creator.start()
    try:
        cp.wait_for(
            lambda: len(outcomes["admitted"]) >= 3, timeout=60, what="pods admitted before the restart"
        )
        before = len(outcomes["admitted"])
        cp.kubectl("-n", SYSTEM, "rollout", "restart", "deploy/gpuledger")
        cp.kubectl("-n", SYSTEM, "rollout", "status", "deploy/gpuledger", "--timeout=300s", timeout=310)
        cp.wait_for(
            lambda: len(outcomes["admitted"]) >= before + 3,
            timeout=60,
            what="pods admitted after the restart",
        )
    finally:
        stop.set()
        creator.join(30)

    def finished():
        pods = cp.pods(namespace)
        done = [p for p in pods if p["status"].get("phase") in ("Succeeded", "Failed")]
        return pods if len(done) == len(pods) else None

    pods = cp.wait_for(finished, timeout=180, interval=1, what=f"every pod of {namespace} finished")
    counts = {outcome: len(names) for outcome, names in outcomes.items()}
    # the kubelet refuses a pod the ledger placed where no GPU was free (UnexpectedAdmissionError)
    double_booked = [p["metadata"]["name"] for p in pods if p["status"]["phase"] != "Succeeded"]
    window = refused_at[-1] - refused_at[0] if refused_at else 0.0
    print(f"\nrolling restart: {counts}, double-booked {len(double_booked)}, refusals over {window:.1f}s")
    assert {p["metadata"]["name"] for p in pods} == set(outcomes["admitted"])
    assert not double_booked, [p["status"] for p in pods if p["metadata"]["name"] in double_booked]
    for pod in pods:
        placement = decode_placement(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION], key)
        assert placement is not None and placement.node == NODE, pod["metadata"]
    assert all("GPU" in message or "gpu" in message for message in outcomes["denied"]), outcomes["denied"]


# what a cluster without KubeRay, the Prometheus operator or the GPU operator's node layout installs: the dev
# overlay's shape (one replica, embedded Ray), certificates and placement key made by Helm
HELM_VALUES = (
    "kuberay.enabled=false",
    "webhook.replicas=1",
    "monitoring.serviceMonitor=false",
    "monitoring.dashboard=false",
    "nodeAgent.enabled=false",
    "createNamespace=false",  # docs/deployment.md: helm install needs its release namespace made first
    "tls.mode=generate",
    "placementKey.create=true",
)


def test_helm_install_of_the_chart_places_a_users_gpu_job(deployed):
    """Last in the module: the kustomize install removed as docs/deployment.md's Uninstall says, then
    `helm install` of the chart as its Helm section says."""
    cp = deployed.cp
    helm = helm_binary()
    if helm is None:
        missing_part("helm not built: run `make helm` (charts/build_helm.sh)")
        return
    cp.kubectl("delete", "mutatingwebhookconfiguration", "gpuledger-mutating")
    cp.kubectl("delete", "validatingwebhookconfiguration", "gpuledger-validating")
    # the webhook configurations are gone already: without --ignore-not-found kubectl exits 1 on them
    cp.kubectl("delete", "-k", str(deployed.tls), "--ignore-not-found", "--timeout=120s", timeout=130)
    cp.kubectl("create", "namespace", SYSTEM)
    restricted = (
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    cp.kubectl("label", "namespace", SYSTEM, *restricted)
    sets = [arg for value in HELM_VALUES for arg in ("--set", value)]
    installed = subprocess.run(
        [helm, "install", "gpuledger", str(REPO / "charts" / "gpuledger"), "--namespace", SYSTEM, *sets,
         "--kubeconfig", cp.kubeconfig, "--wait", "--timeout", "300s"],
        capture_output=True, text=True, timeout=320,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr + diagnose(cp, deployed.node, deployed.services)
    (pod,) = wait_ready_pods(cp, SYSTEM, "app.kubernetes.io/component=webhook", 1)
    deployment = cp.get_json("deployment", "gpuledger", "-n", SYSTEM)
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert pod["spec"]["nodeName"] == NODE

    namespace = user_namespace(cp, "helm")
    cp.kubectl("label", "namespace", namespace, f"{ADMISSION_LABEL}=enabled")
    job = yaml.safe_dump(gpu_job("after-helm", 1))
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=job, as_user=ALICE)
    cp.kubectl("wait", "-n", namespace, "--for=condition=Complete", "job/after-helm", "--timeout=120s")
    (placed,) = cp.pods(namespace, "job-name=after-helm")
    assert PLACEMENT_ANNOTATION in placed["metadata"]["annotations"] and placed["spec"]["nodeName"] == NODE
