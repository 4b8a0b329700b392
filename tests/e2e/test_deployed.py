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
import contextlib
import json
import os
import signal
import subprocess
import sys
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
from gpuledger.core.pods.placement_codec import decode_placement
from gpuledger.names import ADMISSION_LABEL, HOLDERS_ANNOTATION, PLACEMENT_ANNOTATION, WORKLOAD_UID_LABEL
from tests.conftest import require_binaries, require_real_node
from tests.deploy.test_helm import helm_binary
from tests.e2e.conftest import busybox_pod
from tests.e2e.deployed_load import LoadReport, PodLoad
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
    "daemonset-controller",  # the node agent's DaemonSet
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
    for container in statuses:  # tini reaps Ray's processes though not PID 1 (one process namespace)
        logs = cp.kubectl("-n", SYSTEM, "logs", pod["metadata"]["name"], "-c", container).stdout
        assert "Tini is not running as PID 1" not in logs, logs[:2000]
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


def test_a_gpuworkload_is_run_by_the_deployed_controller(deployed):
    """A GPUWorkload (agentaflow.io/v1) applied in an opted-in namespace: the deployed controller makes its
    Job, the deployed webhook places its pod, the kubelet runs it, and the workload ends Succeeded."""
    cp = deployed.cp
    namespace = opted_in_namespace(cp, "workload")
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(gpu_workload("finetune", PRINT_ENV)))
    workload = wait_workload_phase(cp, namespace, "finetune", "Succeeded")
    (job,) = workload_jobs(cp, namespace, workload)
    (pod,) = cp.pods(namespace, f"{WORKLOAD_UID_LABEL}={workload['metadata']['uid']}")
    assert job["metadata"]["ownerReferences"][0]["uid"] == workload["metadata"]["uid"]
    assert PLACEMENT_ANNOTATION in pod["metadata"]["annotations"], pod["metadata"]
    assert pod["spec"]["nodeName"] == NODE and pod["status"]["phase"] == "Succeeded"
    printed = cp.kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout.strip()
    assert printed.removeprefix("NV=") in deployed.plugin.health


def gpu_workload(name: str, command: str, gpus: int = 1) -> dict:
    """A GPUWorkload as a user writes it, its pod running `sh -c command` on the locally built test image."""
    container = {
        "name": "main",
        "image": images.TEST_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
    }
    return {
        "apiVersion": "agentaflow.io/v1",
        "kind": "GPUWorkload",
        "metadata": {"name": name},
        "spec": {
            "gpuRequirements": {"gpuCount": gpus},
            "podTemplate": {"spec": {"terminationGracePeriodSeconds": 1, "containers": [container]}},
        },
    }


def workload(cp, namespace: str, name: str) -> dict:
    return cp.get_json("gpuworkloads.agentaflow.io", name, "-n", namespace)


def wait_workload_phase(cp, namespace: str, name: str, phase: str, timeout: float = 120) -> dict:
    def reached():
        obj = workload(cp, namespace, name)
        return obj if (obj.get("status") or {}).get("phase") == phase else None

    try:
        return cp.wait_for(reached, timeout=timeout, interval=0.5, what=f"GPUWorkload {name} {phase}")
    except TimeoutError:
        print(workload(cp, namespace, name).get("status"))
        print(
            cp.kubectl("-n", SYSTEM, "logs", "deploy/gpuledger", "-c", "controller", check=False).stdout[
                -4000:
            ]
        )
        raise


def workload_jobs(cp, namespace: str, obj: dict) -> list[dict]:
    selector = f"{WORKLOAD_UID_LABEL}={obj['metadata']['uid']}"
    return cp.get_json("jobs", "-n", namespace, "-l", selector)["items"]


def gpuledger_cli(cp, *args: str) -> subprocess.CompletedProcess:
    """The `gpuledger` CLI run on the test's host, as an operator runs it, against the API server."""
    argv = [str(Path(sys.executable).parent / "gpuledger"), *args, "--kubeconfig", cp.kubeconfig]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_gpuledger_strategy_changes_the_live_ledger_through_the_deployed_configmap(deployed):
    """`gpuledger strategy best_fit` from the operator's host patches the deployed ConfigMap; the kubelet
    updates the webhook pod's mounted file, the webhook pushes it to the live ledger, and the next placement
    is best_fit's. No pod restarts. Server-side dry runs (placed, nothing reserved, nothing run) watch for
    the change; a pod created then shows it."""
    cp = deployed.cp
    (webhook_pod,) = wait_ready_pods(cp, SYSTEM, "app.kubernetes.io/component=webhook", 1)
    namespace = opted_in_namespace(cp, "strategy")
    key = placement_key(cp)

    def strategy_of(name: str, *dry_run: str) -> str:
        pod = yaml.safe_dump(busybox_pod(name, "true", gpus=1))
        made = cp.kubectl(
            "create", *dry_run, "-n", namespace, "-f", "-", "-o", "json", input=pod, as_user=ALICE
        )
        text = json.loads(made.stdout)["metadata"].get("annotations", {}).get(PLACEMENT_ANNOTATION)
        placement = decode_placement(text, key) if text else None
        return placement.strategy if placement else "waiting"

    assert strategy_of("before", "--dry-run=server") == "fgd_host"  # the install's default
    changed = gpuledger_cli(cp, "strategy", "best_fit")
    assert changed.returncode == 0, changed.stderr
    shown = gpuledger_cli(cp, "strategy", "-o", "json")
    assert json.loads(shown.stdout)["effective"] == "best_fit", shown.stdout + shown.stderr
    try:
        # the kubelet refreshes a mounted ConfigMap at the pod's next sync (up to its syncFrequency, 1 min)
        cp.wait_for(
            lambda: strategy_of("probe", "--dry-run=server") == "best_fit",
            timeout=150,
            interval=2,
            what="a dry-run placement by best_fit",
        )
        assert strategy_of("after") == "best_fit"
    finally:
        gpuledger_cli(cp, "strategy", "fgd_host")  # the install's default again, for the tests after
    (still,) = wait_ready_pods(cp, SYSTEM, "app.kubernetes.io/component=webhook", 1)
    assert still["metadata"]["uid"] == webhook_pod["metadata"]["uid"]  # nothing restarted


NODE_AGENT_NAMESPACE = "gpuledger-node-agent"
GPU_NODE_LABEL = "nvidia.com/gpu.present=true"  # GPU feature discovery's, the DaemonSet's nodeSelector


@pytest.fixture(scope="module")
def node_agent(deployed, tmp_path_factory):
    """The node agent component as the prod overlay ships it, on a node labelled as GPU feature discovery
    labels GPU nodes. Patched only for what this GPU-less harness lacks: NVML (the agent's fake probe,
    reporting the fake device plugin's GPUs) and the kubelet's default root (the harness's kubelet keeps its
    PodResources socket in a temporary folder)."""
    cp, node = deployed.cp, deployed.node
    cp.kubectl("label", "node", NODE, GPU_NODE_LABEL)
    fake = {
        "gpus": [
            {
                "index": i,
                "uuid": device_uuid(NODE, i),
                "product": "NVIDIA-H100",
                "memory_mib": 81559,
                "healthy": True,
            }
            for i in range(GPUS)
        ],
        "processes": [],
    }
    harness = [
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--fake"},
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": json.dumps(fake)},
        {
            "op": "replace",
            "path": "/spec/template/spec/volumes/1/hostPath/path",
            "value": str(node.pod_resources_socket.parent),
        },
    ]
    folder = tmp_path_factory.mktemp("node-agent")
    component = REPO / "kustomize" / "components" / "node-agent"
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "components": [os.path.relpath(component, folder)],
        "patches": [
            {"target": {"kind": "DaemonSet", "name": "gpuledger-node-agent"}, "patch": json.dumps(harness)}
        ],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    cp.kubectl("apply", "-k", str(folder))
    daemonset = ("-n", NODE_AGENT_NAMESPACE, "rollout", "status", "ds/gpuledger-node-agent", "--timeout=120s")
    try:
        cp.kubectl(*daemonset, timeout=130)
    except Exception:
        print(cp.kubectl("-n", NODE_AGENT_NAMESPACE, "describe", "pods", check=False).stdout[-5000:])
        print(
            cp.kubectl("-n", NODE_AGENT_NAMESPACE, "logs", "ds/gpuledger-node-agent", check=False).stdout[
                -5000:
            ]
        )
        raise
    return folder


def device_holders(cp) -> dict:
    text = cp.get_json("node", NODE)["metadata"].get("annotations", {}).get(HOLDERS_ANNOTATION)
    return json.loads(text) if text else {}


def wait_holder(cp, namespace: str, pod: str, timeout: float = 60) -> list[str]:
    """The device indices the node agent's holders annotation names `pod` on, once it names it."""

    def named():
        holders = device_holders(cp).get("holders", {})
        found = [
            i
            for i, who in holders.items()
            if any((h["namespace"], h["pod"]) == (namespace, pod) for h in who)
        ]
        return found or None

    return cp.wait_for(
        named, timeout=timeout, interval=0.5, what=f"{HOLDERS_ANNOTATION} naming {namespace}/{pod}"
    )


HOLD = "echo NV=$NVIDIA_VISIBLE_DEVICES; trap 'exit 0' TERM; sleep 3600 & wait"


def start_holder(cp, namespace: str, name: str) -> dict:
    """A 1-GPU pod holding its GPU until deleted, Running."""
    cp.kubectl(
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(busybox_pod(name, HOLD, gpus=1)),
        as_user=ALICE,
    )
    cp.kubectl(
        "wait",
        "-n",
        namespace,
        "--for=jsonpath={.status.phase}=Running",
        f"pod/{name}",
        "--timeout=90s",
        timeout=100,
    )
    return cp.get_json("pod", name, "-n", namespace)


def test_the_node_agent_names_the_placed_pod_on_its_device(deployed, node_agent):
    """The node agent DaemonSet, running on the node, publishes on the Node which pod holds which GPU: the
    pod the deployed webhook placed, on the device the kubelet gave it."""
    cp = deployed.cp
    namespace = opted_in_namespace(cp, "held")
    pod = start_holder(cp, namespace, "held")
    assert PLACEMENT_ANNOTATION in pod["metadata"]["annotations"]
    printed = cp.wait_for(
        lambda: cp.kubectl("logs", "-n", namespace, "held").stdout.strip(), what="held's output"
    )
    given = printed.removeprefix("NV=")
    uuids = [device_uuid(NODE, i) for i in range(GPUS)]
    assert wait_holder(cp, namespace, "held") == [str(uuids.index(given))]
    cp.kubectl("delete", "pod", "held", "-n", namespace, "--wait=false")


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
    namespace = opted_in_namespace(cp, "roll")
    with PodLoad(cp, namespace, "roll") as load:
        load.wait_admitted(3, "pods admitted before the restart")
        cp.kubectl("-n", SYSTEM, "rollout", "restart", "deploy/gpuledger")
        cp.kubectl("-n", SYSTEM, "rollout", "status", "deploy/gpuledger", "--timeout=300s", timeout=310)
        load.disruption_over()
        load.wait_admitted(3, "pods admitted after the restart", since=load.over_at or 0.0)
    report = load.settle()
    print(f"\nrolling restart: {report.counts()}, refusals over {report.refusal_window_s:.1f}s")
    assert_nothing_lost_or_double_booked(cp, load, report)


def opted_in_namespace(cp, prefix: str) -> str:
    namespace = user_namespace(cp, prefix)
    cp.kubectl("label", "namespace", namespace, f"{ADMISSION_LABEL}=enabled")
    return namespace


def assert_nothing_lost_or_double_booked(cp, load: PodLoad, report: LoadReport) -> None:
    """Every admitted pod ran on a GPU of its own with a placement signed by the deployed key; every other
    create was refused or denied for want of a GPU, never admitted unplaced."""
    key = placement_key(cp)
    created = {
        p["metadata"]["name"]
        for p in cp.pods(load.namespace)
        if p["metadata"]["name"].startswith(load.prefix + "-")
    }
    assert created == load.admitted_names()
    assert not report.double_booked, [
        p["status"] for p in report.pods if p["metadata"]["name"] in report.double_booked
    ]
    assert report.admitted_after > 0, report.counts()
    for pod in report.pods:
        placement = decode_placement(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION], key)
        assert placement is not None and placement.node == NODE, pod["metadata"]
    assert all("GPU" in message or "gpu" in message for message in report.denials), report.denials


WEBHOOK_PODS = "app.kubernetes.io/component=webhook"


def replacement_ready(cp, old_name: str, timeout: float = 300) -> dict:
    """The webhook pod that replaced `old_name`, once it is Ready and `old_name` is gone."""

    def ready():
        pods = cp.pods(SYSTEM, WEBHOOK_PODS)
        if any(p["metadata"]["name"] == old_name for p in pods):
            return None
        good = [
            p
            for p in pods
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]
        return good[0] if good else None

    return cp.wait_for(ready, timeout=timeout, interval=0.5, what=f"a Ready webhook pod replacing {old_name}")


def placed_devices(cp, pod: dict) -> set[int]:
    placement = decode_placement(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION], placement_key(cp))
    assert placement is not None, pod["metadata"]
    return set(placement.devices)


def test_the_ray_head_pod_deleted_while_pods_are_created(deployed, node_agent):
    """Day two: the pod that holds the Ray head deleted as a crash would take it (`--grace-period=0
    --force`: no preStop, nothing handed over) while alice keeps creating 1-GPU pods. In the dev overlay the
    Ray head is embedded in the webhook pod. Creates fail closed (refused) until the replacement's ledger,
    rebuilt from the API server, is synced and Ready, then are admitted again; the rebuilt ledger counts the
    GPU a pod placed before the crash still holds, and nothing is double-booked."""
    cp = deployed.cp
    namespace = opted_in_namespace(cp, "head")
    start_holder(cp, namespace, "holder")
    # the overlay's device-plugin mode lets the kubelet pick the device; the ledger takes the kubelet's word
    # from the node agent's holders annotation, so that device, not the placement's guess, is the one held
    held = {int(i) for i in wait_holder(cp, namespace, "holder")}
    (old,) = wait_ready_pods(cp, SYSTEM, WEBHOOK_PODS, 1)
    with PodLoad(cp, namespace, "head") as load:
        load.wait_admitted(3, "pods admitted before the Ray head was deleted")
        cp.kubectl("-n", SYSTEM, "delete", "pod", old["metadata"]["name"], "--grace-period=0", "--force")
        replacement_ready(cp, old["metadata"]["name"])
        over = load.disruption_over()
        load.wait_admitted(3, "pods admitted after the Ray head came back", since=over)
    report = load.settle()
    cp.kubectl("delete", "pod", "holder", "-n", namespace, "--wait=false")
    print(f"\nRay head deleted: {report.counts()}, refusals over {report.refusal_window_s:.1f}s")
    assert_nothing_lost_or_double_booked(cp, load, report)
    assert report.refused > 0, report.counts()  # failed closed while no ledger answered
    rebuilt = {c.name for c in load.creates if c.outcome == "admitted" and c.at >= over}
    clashes = [
        p["metadata"]["name"]
        for p in report.pods
        if p["metadata"]["name"] in rebuilt and placed_devices(cp, p) & held
    ]
    assert not clashes, f"the rebuilt ledger placed on device {held} that holder kept throughout: {clashes}"


CONTROLLER_LEASE = "gpuledger-controller"


def lease_holder(cp) -> str:
    return cp.get_json("lease", CONTROLLER_LEASE, "-n", SYSTEM)["spec"].get("holderIdentity") or ""


def test_the_controllers_leader_pod_deleted_while_pods_are_created(deployed):
    """Day two: the pod of the controller holding the Lease deleted (`kubectl delete pod`) while alice keeps
    creating 1-GPU pods. The dev overlay runs one replica, so the Deployment replaces it: the replacement's
    controller takes the Lease over and runs a GPUWorkload applied while no controller led; the workload
    running before keeps its one Job and its one pod (never started twice)."""
    cp = deployed.cp
    namespace = opted_in_namespace(cp, "leader")
    apply = ("apply", "-n", namespace, "-f", "-")
    cp.kubectl(*apply, input=yaml.safe_dump(gpu_workload("before", HOLD)))
    before = wait_workload_phase(cp, namespace, "before", "Running")
    uid_selector = f"{WORKLOAD_UID_LABEL}={before['metadata']['uid']}"
    cp.wait_for(
        lambda: [p for p in cp.pods(namespace, uid_selector) if p["status"].get("phase") == "Running"],
        timeout=90,
        what="the pod of GPUWorkload before Running",
    )
    jobs_before = {j["metadata"]["uid"] for j in workload_jobs(cp, namespace, before)}
    pods_before = {p["metadata"]["uid"] for p in cp.pods(namespace, uid_selector)}
    (old,) = wait_ready_pods(cp, SYSTEM, WEBHOOK_PODS, 1)
    assert lease_holder(cp) == old["metadata"]["name"]
    with PodLoad(cp, namespace, "leader") as load:
        load.wait_admitted(3, "pods admitted before the leader was deleted")
        cp.kubectl("-n", SYSTEM, "delete", "pod", old["metadata"]["name"], "--wait=false")
        cp.kubectl(*apply, input=yaml.safe_dump(gpu_workload("meanwhile", "sleep 1")))
        new = replacement_ready(cp, old["metadata"]["name"])
        cp.wait_for(
            lambda: lease_holder(cp) == new["metadata"]["name"],
            timeout=60,
            what=f"the Lease {CONTROLLER_LEASE} held by {new['metadata']['name']}",
        )
        over = load.disruption_over()
        load.wait_admitted(3, "pods admitted after the new leader took over", since=over)
    wait_workload_phase(cp, namespace, "meanwhile", "Succeeded")
    report = load.settle()
    print(f"\ncontroller leader deleted: {report.counts()}, refusals over {report.refusal_window_s:.1f}s")
    assert_nothing_lost_or_double_booked(cp, load, report)
    after = workload(cp, namespace, "before")
    assert after["status"]["phase"] == "Running", after["status"]
    assert {j["metadata"]["uid"] for j in workload_jobs(cp, namespace, after)} == jobs_before
    assert {p["metadata"]["uid"] for p in cp.pods(namespace, uid_selector)} == pods_before
    (meanwhile_job,) = workload_jobs(cp, namespace, workload(cp, namespace, "meanwhile"))
    assert meanwhile_job["status"].get("succeeded") == 1
    cp.kubectl("delete", "gpuworkloads.agentaflow.io", "before", "-n", namespace, "--wait=false")


def controller_pid(pod: dict) -> int:
    """The host pid of the `gpuledger controller` process of `pod` (the real node runs on this host): the
    Python process whose command line names the Lease and whose cgroup names the pod's uid (not tini, the
    image's entrypoint, whose command line is the same after `--`)."""
    uid = pod["metadata"]["uid"]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cgroup = (proc / "cgroup").read_text()
            exe = os.readlink(proc / "exe")
        except OSError:
            continue
        ours = uid in cgroup or uid.replace("-", "_") in cgroup
        if ours and "python" in Path(exe).name and b"controller" in argv and b"--lease-name" in argv:
            return int(proc.name)
    raise AssertionError(f"no controller process of pod {pod['metadata']['name']} ({uid}) on this host")


def container_status(pod: dict, name: str) -> dict:
    return next(s for s in pod["status"].get("containerStatuses") or [] if s["name"] == name)


def test_a_frozen_controller_is_restarted_by_its_liveness_probe(deployed):
    """The controller's process stopped (SIGSTOP): its event loop answers nothing, so its liveness probe
    (`/healthz` on its own loop) fails and the kubelet restarts the container, in the same pod; the
    restarted controller takes the Lease again and becomes ready. The webhook container is not restarted."""
    cp = deployed.cp
    (pod,) = wait_ready_pods(cp, SYSTEM, WEBHOOK_PODS, 1)
    name = pod["metadata"]["name"]
    before = container_status(pod, "controller")["restartCount"]
    webhook_before = container_status(pod, "webhook")["restartCount"]
    pid = controller_pid(pod)
    os.kill(pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        restarted = cp.wait_for(
            lambda: (lambda p: p if container_status(p, "controller")["restartCount"] > before else None)(
                cp.get_json("pod", name, "-n", SYSTEM)
            ),
            timeout=240,
            interval=1.0,
            what=f"the kubelet restarting the frozen controller of {name}",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # a stopped process the kubelet could not kill yet
    print(f"\nfrozen controller restarted by its liveness probe after {time.monotonic() - frozen:.1f}s")
    assert container_status(restarted, "webhook")["restartCount"] == webhook_before
    (ready,) = wait_ready_pods(cp, SYSTEM, WEBHOOK_PODS, 1, timeout=240)
    assert ready["metadata"]["name"] == name  # the same pod: only the container was restarted
    cp.wait_for(lambda: lease_holder(cp) == name, timeout=60, what=f"the Lease held by {name} again")
    assert controller_pid(ready) != pid


def test_the_node_agent_daemonset_restarted_while_pods_are_created(deployed, node_agent):
    """Day two: `kubectl rollout restart ds` of the node agent while alice keeps creating 1-GPU pods. The
    webhook does not depend on the agent being up: nothing is refused; and the new agent pod publishes the
    holders again, naming a pod started after it."""
    cp = deployed.cp
    namespace = opted_in_namespace(cp, "agent")
    daemonset = ("-n", NODE_AGENT_NAMESPACE)
    (old,) = cp.pods(NODE_AGENT_NAMESPACE, "app.kubernetes.io/name=gpuledger-node-agent")
    with PodLoad(cp, namespace, "agent") as load:
        load.wait_admitted(3, "pods admitted before the node agent restarted")
        cp.kubectl(*daemonset, "rollout", "restart", "ds/gpuledger-node-agent")
        cp.kubectl(*daemonset, "rollout", "status", "ds/gpuledger-node-agent", "--timeout=120s", timeout=130)
        over = load.disruption_over()
        (new,) = cp.pods(NODE_AGENT_NAMESPACE, "app.kubernetes.io/name=gpuledger-node-agent")
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        start_holder(cp, namespace, "after-restart")
        devices = wait_holder(cp, namespace, "after-restart")
        load.wait_admitted(3, "pods admitted after the node agent restarted", since=over)
    report = load.settle()
    cp.kubectl("delete", "pod", "after-restart", "-n", namespace, "--wait=false")
    print(f"\nnode agent restarted: {report.counts()}, holders published again on device {devices}")
    assert_nothing_lost_or_double_booked(cp, load, report)
    assert report.refused == 0, report.counts()


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
